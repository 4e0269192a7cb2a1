"""What a Kernel Tuner cache file must hold before zhantune reads a measurement from it
(zhantune.bench.recorded.load_kerneltuner): parameters, entries and times, and names that fit the
database. Every check raises ConfigError with one line naming ``where`` (the option and the file,
e.g. ``bench.path=FILE``) and the bad value; nothing in the file is executed.
"""

from __future__ import annotations

import math
import unicodedata
from typing import TYPE_CHECKING, Any

from zhantune.errors import ConfigError, shown

if TYPE_CHECKING:
    from zhantune.bench.recorded import KernelTunerFile

__all__ = ["MAX_TIME_MS", "MAX_KERNEL_NAME", "MAX_DEVICE_NAME", "MAX_KEY", "printable_name", "shown_name", "check_params", "check_cache",
           "check_fits", "is_time"]


#: the longest time (milliseconds: 11.6 days) read as a measurement; a longer or non-finite number
#: is refused in ``time``/``times`` and ignored in the pace fields (``time.sleep`` cannot take it)
MAX_TIME_MS = 1e9


#: the fields of a cache entry that are not parameters (Kernel Tuner's recorded time and its runs)
_ENTRY_FIELDS = ("time", "times")


def _same(a: Any, b: Any) -> bool:
    """Two JSON scalars that would be one value of a parameter (1 and 1.0; never 1 and true)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _alike(a: Any, b: Any) -> bool:
    """One value written alike (4 and 4, never 4 and 4.0): a cache entry's value and the tune_params
    member a search samples for it (a helper's, session 48: an entry's 4 against tune_params' 4.0
    imported, and the replay never found it)."""
    return a == b and type(a) is type(b)


def _is_number(t: Any) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool)


def is_time(t: Any) -> bool:
    """A finite number of milliseconds of at most MAX_TIME_MS (sign not checked: _bad_time)."""
    if type(t) is float:  # most of a file's values (a recording holds ~600,000): NaN compares False
        return -MAX_TIME_MS <= t <= MAX_TIME_MS
    if not _is_number(t):
        return False
    try:
        return abs(float(t)) <= MAX_TIME_MS  # False for nan and inf; a huge int overflows float()
    except OverflowError:
        return False


def _short(v: Any) -> str:
    return shown(v, 40)


def _key(k: Any) -> str:
    """A cache key as written where it is short, printable text; else cut and escaped."""
    return k if isinstance(k, str) and len(k) <= 40 and k.isprintable() else _short(k)


def _is_scalar(v: Any) -> bool:
    """A JSON scalar: what an Optuna categorical choice and a config hash can hold (a float only when
    finite: Python's json reads NaN and Infinity, which standard JSON, and PostgreSQL's, has not)."""
    return v is None or isinstance(v, (str, int, bool)) or (isinstance(v, float) and math.isfinite(v))


def _bad_time(entry: dict[str, Any]) -> str | None:
    """``time=...`` / ``times[i]=...`` when an entry records a time that is not a positive number
    (``true``, ``null``, a list: not a failure name either, so neither a measurement nor a failure),
    else None (a string ``time`` is a failure, e.g. CompilationFailedConfig)."""
    t = entry["time"]
    if isinstance(t, str):
        return None
    if not is_time(t) or t <= 0:
        return f"time={_short(t)}"
    times = entry.get("times")
    if isinstance(times, list):
        for i, x in enumerate(times):
            if not is_time(x) or x <= 0:
                return f"times[{i}]={_short(x)}"
    return None


def check_params(names: Any, tune_params: Any, cache: Any, where: str) -> None:
    """``tune_params_keys`` (names, each once, none the entry's time), ``tune_params`` (each a
    non-empty list of distinct JSON scalars) and ``cache`` (an object)."""
    if not isinstance(tune_params, dict) or not isinstance(cache, dict) or not isinstance(names, list):
        raise ConfigError(f"{where}: tune_params and cache must be objects, tune_params_keys a list")
    clash = next((n for n in names if n in _ENTRY_FIELDS), None)
    twice = next((i for i, n in enumerate(names) if n in names[:i]), None)
    if clash is not None or twice is not None:
        raise ConfigError(f"{where}: tune_params_keys " + (
            f"names the parameter {_short(clash)}, which an entry uses for its recorded time; rename it"
            if clash is not None else f"lists {_short(names[twice])} twice; each parameter once"))
    for n in names:
        if isinstance(n, str) and (not printable_name(n) or len(n) > MAX_PARAM_NAME):
            raise ConfigError(f"{where}: tune_params_keys holds {shown_name(n)}; a parameter's name is plain text "
                              f"(no control or format character) of at most {MAX_PARAM_NAME} characters")
        values = tune_params.get(n) if isinstance(n, str) else None
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: tune_params.{n} must be a non-empty list")
        bad = next((v for v in values if not _is_scalar(v) or isinstance(v, str) and not printable_name(v)), None)
        if bad is not None:
            raise ConfigError(f"{where}: tune_params.{_key(n)} holds {_short(bad)}; a parameter's values are finite "
                              "numbers, strings of plain text (no control or format character), booleans or null")
        twice = next((i for i, v in enumerate(values) if any(_same(v, w) for w in values[:i])), None)
        if twice is not None:
            raise ConfigError(f"{where}: tune_params.{n} lists {_short(values[twice])} twice; a parameter's values "
                              "are distinct")


def check_cache(names: list[str], tune_params: dict[str, list[Any]], cache: dict[str, Any], where: str) -> None:
    """Every entry of ``cache``: not empty; keyed by its values joined by commas, each value one of
    tune_params, its time positive and finite (or a failure name)."""
    if not cache:
        raise ConfigError(f"{where}: cache is empty: no recorded configuration to import or replay")
    for key, entry in cache.items():
        if not isinstance(entry, dict) or "time" not in entry or any(n not in entry for n in names):
            raise ConfigError(f"{where}: cache.{_key(key)} lacks 'time' or a parameter of tune_params_keys")
        bad = next((n for n in names if not _is_scalar(entry[n])), None)
        if bad is not None:
            raise ConfigError(f"{where}: cache.{_key(key)}.{_key(bad)}={_short(entry[bad])}; a parameter's value is a "
                              "finite number, a string, a boolean or null")
        bad = next((n for n in names if not any(_alike(entry[n], v) for v in tune_params[n])), None)
        if bad is not None:  # 4 against 4.0: the replay samples tune_params' 4.0, and finds no entry "4.0,..."
            raise ConfigError(f"{where}: cache.{_short(key)}.{bad}={_short(entry[bad])} is not one of "
                              f"tune_params.{bad} {_short(tune_params[bad])}" + (
                                  " (written alike: 4 and 4.0 are two values)"
                                  if any(_same(entry[bad], v) for v in tune_params[bad]) else ""))
        own = ",".join(str(entry[n]) for n in names)  # Kernel Tuner's key: the values in tune_params_keys order
        if key != own:
            raise ConfigError(f"{where}: cache.{_short(key)} holds the configuration {_short(own)}; a cache "
                              "key is its entry's values of tune_params_keys, joined by commas")
        bad = _bad_time(entry)
        if bad:
            raise ConfigError(f"{where}: cache.{_key(key)}.{bad}; a recorded time is a positive, finite "
                              f"number of milliseconds up to {MAX_TIME_MS:g} (or a failure name such as "
                              "'CompilationFailedConfig')")


#: the longest kernel name and device name the database's columns hold (zhantune/storage/orm.py:
#: Problem.op 128 and MeasurementRow.template_id 128 with its "kerneltuner::" prefix, Device.key;
#: PostgreSQL enforces them, SQLite does not, so a merge would fail later), and the longest problem
#: key and study name (Problem.key, Study.name)
MAX_KERNEL_NAME, MAX_DEVICE_NAME, MAX_KEY = 100, 256, 512
#: the longest parameter name (tune_params_keys) an import takes: printed in every config line
MAX_PARAM_NAME = 100


def shown_name(value: str) -> str:
    """A name for an error message: its repr, cut to its first 30 characters and "..." when longer than 40."""
    return repr(value) if len(value) <= 40 else repr(value[:30]) + "..."


def printable_name(value: str) -> bool:
    """Whether a name can be stored and printed as it is: no control (Cc: NUL, newline, DEL, C1),
    format (Cf: a right-to-left override, a zero-width space) or surrogate (Cs: text that was not
    valid UTF-8, which neither the database nor a terminal encodes) character."""
    return not any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in value)


def check_fits(f: KernelTunerFile, where: str) -> None:
    """ConfigError when the file name, the kernel name or the device name is not plain text
    (:func:`printable_name`: a control character such as NUL, which PostgreSQL's text cannot hold, a
    format or a surrogate character), a name is longer than the database holds, or the problem key or a study name
    made of them (a replay's ``<problem key>@<device>``, an import's ``kerneltuner:<file name>[sha256:
    <12 hex>]@<device>``, zhantune.storage.ingest) would be longer than the database holds."""
    naming = "bench.device_name=NAME" if where.startswith("bench.") else "devices=[...]"  # replay or import
    named_by = naming.split("=")[0] if f.device_named_by == "devices" else f.device_named_by
    if not printable_name(f.path.name):
        raise ConfigError(f"{where}: the file name {f.path.name!r} holds a control, format or surrogate (not UTF-8) "
                          "character; rename the file")
    for what, value, limit in (("kernel_name", f.kernel_name, MAX_KERNEL_NAME),
                               (f"device name (from {named_by})", f.device_key, MAX_DEVICE_NAME)):
        if len(value) > limit or not printable_name(value):
            raise ConfigError(f"{where}: {what} {shown_name(value)} ({len(value)} characters); the database holds "
                              f"names of at most {limit} characters without control, format or surrogate "
                              "characters" + (f"; name the device with {naming}" if "device" in what else ""))
    key = f.problem().key
    names = [f"{key}@{f.device_key}"] if where.startswith("bench.") else [  # a replay's study, an import's
        f"kerneltuner:{f.path.name}[sha256:{'0' * 12}]@{f.device_key}"]
    for what, value in (("problem key", key), *(("study name", n) for n in names)):
        if len(value) > MAX_KEY:
            raise ConfigError(f"{where}: its {what} would be {_short(value)}; the database holds at most "
                              f"{MAX_KEY} characters (a shorter file name, device name or problem_size)")
