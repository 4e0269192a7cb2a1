"""zhantune's errors: one base class; user errors exit with code 2 and a one-line message.

A *user error* is bad input (a shape, an override, a config file, a storage path): the message names
the bad value, where it came from and what is allowed. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "ZhantuneError",
    "UserError",
    "ConfigError",
    "SpaceError",
    "DeviceError",
    "StorageError",
    "TableError",
    "two_kinds",
    "StorageInternalError",
    "USER_ERROR_EXIT_CODE",
    "INTERRUPTED_EXIT_CODE",
    "shown",
    "shown_json",
    "SHOWN_KEY",
    "first_line",
]

USER_ERROR_EXIT_CODE = 2
#: exit code after Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)
INTERRUPTED_EXIT_CODE = 130


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters: a longer one is cut
    and its length given (``'aaaa... (1000002 characters)'``), so a megabyte string or a number of
    thousands of digits read from a file stays a one-line error; a value repr cannot write (an
    integer over Python's digit limit, a list nested past the recursion limit) by its type."""
    try:
        r = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"
    return r if len(r) <= limit else f"{r[:max(limit - 10, 10)]}... ({len(r)} characters)"


#: the longest key (a JSON string) an error shows whole: Inductor's lookup keys are 100-250 characters
SHOWN_KEY = 400


def shown_json(key: object) -> str:
    """A key as JSON writes it, one line, cut after SHOWN_KEY characters (its length given); one
    that is not a string (a dict passed from Python) as :func:`shown` shows it."""
    if not isinstance(key, str):
        return shown(key)
    import json

    text = json.dumps(key)
    return text if len(text) <= SHOWN_KEY else f"{text[:SHOWN_KEY - 20]}... ({len(key)} characters)"


class ZhantuneError(Exception):
    """Root of every error zhantune raises on purpose."""


class UserError(ZhantuneError):
    """Bad input from the user. The CLI prints ``zhantune: <message>`` and exits with code 2."""


class ConfigError(UserError):
    """A config value (CLI override or YAML key) is invalid."""


class SpaceError(ConfigError):
    """A search-space file is invalid (unknown key, empty choices, bad constraint, ...)."""


class DeviceError(UserError):
    """The requested device does not exist on this machine."""


class StorageError(UserError):
    """The storage URL cannot be opened or written, or holds something that is not zhantune's."""


class StorageInternalError(ZhantuneError):
    """A database statement failed on a database that was opened (a lost connection, a lock held past
    the busy timeout, a bug): not bad input, so it keeps its traceback and the exit code is not 2.
    Raised ``from`` SQLAlchemy's error, as Optuna's ``StorageInternalError``. A unique-constraint
    violation (a race another worker won) is not wrapped: it reaches the caller as SQLAlchemy's
    ``IntegrityError``."""


class TableError(UserError):
    """A lookup-table file is malformed."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an error's message, at most ``limit`` characters (its type's name when it
    has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


def two_kinds(head: str, how: str) -> str:
    """The one-line refusal of a device-agnostic table over CPU and GPU devices (the export's
    ``device_agnostic=true``, compare's ``table=``): ``head`` says where the two kinds are, ``how`` to
    pick one."""
    return (f"{head}, and a key without its device applies on both: a table that loads on one kind would fail "
            f"on the other; {how}")
