"""Ctrl-C and SIGTERM as a clean stop: a measurement in flight is abandoned at once, anything else
(asking the sampler, writing a row) finishes its step first, so no half-told trial is left behind.

:func:`install` (called by the tune app) routes SIGINT and SIGTERM here. Inside :func:`interruptible`
a signal raises KeyboardInterrupt immediately; elsewhere, and inside :func:`deferred` (a row being
stored, and what must follow it), it is recorded and :func:`requested` turns true, for the search
loop to stop between steps. Without ``install`` Python's default applies.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

__all__ = ["install", "interruptible", "deferred", "requested"]


class _State:
    installed = False
    depth = 0  # interruptible regions entered (deferred() sets it to 0 inside)
    pending = False
    held = 0  # the depth of the interruptible region whose rest no signal aborts (deferred(stop_after=False))


def _handler(signum: int, frame: object) -> None:
    _State.pending = True
    if _State.depth and not _State.held:  # held: cleared once the depth drops below it
        raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """Route SIGINT and SIGTERM through this module (main thread only); no signal is pending."""
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _State.installed, _State.pending = True, False


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
        if _State.held and _State.depth < _State.held:
            _State.held = 0


@contextlib.contextmanager
def deferred(stop_after: bool = True) -> Iterator[None]:
    """A region no signal aborts, even inside :func:`interruptible`: a measurement's row being stored
    (a KeyboardInterrupt in the middle of the write, or between the write and telling Optuna, left a
    stored row whose trial was marked interrupted and measured again on resume). A signal that came
    meanwhile is kept for :func:`requested`; ``stop_after``: then raise it on leaving the region when
    an enclosing region is interruptible (a settle's next round stops at once); else no signal aborts
    the rest of the enclosing interruptible region either (the search driver tells Optuna the stored
    result there) and the caller's next step stops (the search loop checks :func:`requested` before
    it asks again). A write waiting for a database lock is not aborted (SQLite gives up after its
    busy timeout)."""
    depth, _State.depth = _State.depth, 0
    try:
        yield
    finally:
        _State.depth = depth
        if not stop_after and depth:
            _State.held = _State.held or depth
    if stop_after and depth and _State.pending:
        raise KeyboardInterrupt("interrupt requested")


def requested() -> bool:
    """True once a signal arrived (since :func:`install`): the search stops at its next step."""
    return _State.pending
