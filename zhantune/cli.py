"""Command-line plumbing shared by zhantune's Hydra apps: one-line user errors with exit code 2.

Hydra reports its own composition errors (an unknown ``+op=``, a bad override) on several lines and
exits with 1. Group choices are therefore checked first, with Hydra's own override parser, so that the
user gets one line naming the value and what is allowed; and any Hydra failure before the task
function starts is a user error, mapped to exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from zhantune.config import CONF_DIR
from zhantune.errors import USER_ERROR_EXIT_CODE, UserError
from zhantune.quiet import quiet_known_warnings

__all__ = ["run_app", "user_error", "check_group_overrides"]

quiet_known_warnings()

_GROUPS = ("op", "search", "bench", "storage", "space")


def user_error(e: UserError | str) -> None:
    """Print ``zhantune: <message>`` on stderr and exit with code 2."""
    print(f"zhantune: {e}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def check_group_overrides(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The message for the first override choosing a config-group option that does not exist."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in args if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None  # Hydra reports syntax errors itself
    for o in parsed:
        group = o.key_or_group
        if group not in _GROUPS or o.is_delete():
            continue
        available = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        if o.is_sweep_override():
            values = list(o.sweep_string_iterator())
        elif isinstance(o.value(), list):
            values = [str(v) for v in o.value()]
        else:
            values = [o.get_value_element_as_str()]
        for v in values:
            if v not in available:
                return f"unknown {group} {v!r} (from override {o.input_line}); allowed: {', '.join(available)}"
    return None


class _State:
    task_started = False


def mark_task_started() -> None:
    _State.task_started = True


def run_app(hydra_main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function with zhantune's error conventions."""
    msg = check_group_overrides(sys.argv[1:])
    if msg:
        user_error(msg)
    try:
        hydra_main()
    except SystemExit as e:
        if e.code == 1 and not _State.task_started:
            sys.exit(USER_ERROR_EXIT_CODE)
        raise
