"""Ctrl-C and SIGTERM as a clean stop: a measurement in flight is abandoned at once, anything else
(asking the sampler, writing a row) finishes its step first, so no half-told trial is left behind.

:func:`install` (called by the tune app) routes SIGINT and SIGTERM here. Inside :func:`interruptible`
a signal raises KeyboardInterrupt immediately; elsewhere it is recorded and :func:`requested` turns
true, for the search loop to stop between steps. Without ``install`` Python's default applies.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

__all__ = ["install", "interruptible", "requested"]


class _State:
    installed = False
    depth = 0
    pending = False


def _handler(signum: int, frame: object) -> None:
    _State.pending = True
    if _State.depth:
        raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """Route SIGINT and SIGTERM through this module (main thread only)."""
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _State.installed = True


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A region a signal may abort at once (a compile or a timed run)."""
    if _State.pending:
        raise KeyboardInterrupt("interrupt requested")
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1


def requested() -> bool:
    """True once a signal arrived outside an interruptible region."""
    return _State.pending
