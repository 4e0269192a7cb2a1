"""Command-line plumbing shared by zhantune's Hydra apps: one-line user errors with exit code 2.

Hydra reports its own composition errors (an unknown ``+op=``, a bad override) on several lines and
exits with 1. Group choices are therefore checked first, with Hydra's own override parser, so that the
user gets one line naming the value and what is allowed; any other Hydra failure before the task
function starts (a value of the wrong type, an unknown key) is a user error: Hydra's message, held
back until then, is joined into one line, and the exit code is 2.
"""

from __future__ import annotations

import io
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zhantune.config import CONF_DIR
from zhantune.errors import INTERRUPTED_EXIT_CODE, USER_ERROR_EXIT_CODE, UserError
from zhantune.overrides import hydra_instantiates, password_split
from zhantune.quiet import quiet_known_warnings

__all__ = ["run_app", "user_error", "check_group_overrides", "one_line", "quoting_hint"]

quiet_known_warnings()

_GROUPS = ("op", "search", "bench", "storage", "space")


def user_error(e: UserError | str) -> None:
    """Print ``zhantune: <message>`` on stderr, one line (a newline or other unprintable character
    from the input, e.g. in a file name or an override, is written as its escape; a database
    password from the command line as ``***``, zhantune.redact), and exit with code 2."""
    text = _hide(str(e))
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    print(f"zhantune: {text}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def check_group_overrides(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The message for the first override choosing a config-group option that does not exist, or
    naming code for Hydra to instantiate (``hydra.callbacks``, any ``_target_`` or ``()`` under ``hydra.``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # hydra/main.py: pickle.load of the file named, before any other check (argparse takes any
    # unambiguous prefix of the option, --exp FILE too)
    rerun = next((a for a in args if len(a.split("=", 1)[0]) > 2 and "--experimental-rerun".startswith(a.split("=", 1)[0])),
                 None)
    if rerun is not None:
        return ("--experimental-rerun: Hydra's rerun unpickles the file it names (a run's .hydra/config.pickle), "
                "and a pickle can run any code, outside zhantune's _target_ allowlist; not allowed: run the "
                "overrides in that run's .hydra/overrides.yaml again instead")
    overrides = [a for a in args if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None  # Hydra reports syntax errors itself
    for o in parsed:
        group = o.key_or_group
        if password_split(o):
            quoted = ("['postgresql+psycopg://user:PASSWORD@host/db']" if isinstance(o.value(), list)
                      else "'postgresql+psycopg://user:PASSWORD@host/db'")
            return (f"override {group}=...: a database URL's password holds a character that Hydra's override "
                    f"grammar splits (a comma, a space, a bracket), and the rest would be saved in clear: quote "
                    f"the URL ({group}={quoted}) or pass it as ${{oc.env:VAR}}")
        if group == "hydra.job.chdir" and not o.is_delete() and str(o.value()).lower() == "true":
            return (f"override {o.input_line}: zhantune reads and writes paths (storage.url's SQLite file, "
                    "problems=, table=, export.path) from the directory it starts in; with hydra.job.chdir=true "
                    "each run would get its own database in its run folder")
        if hydra_instantiates(o):
            return (f"override {o.input_line}: Hydra instantiates what it names (a callback, a launcher, a "
                    "logging factory), outside zhantune's _target_ allowlist; such overrides are not allowed")
        if group not in _GROUPS or o.is_delete():
            continue
        available = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        if group == "space" and not o.is_sweep_override() and o.value() == []:  # it meant the op's default spaces
            return (f"override {o.input_line}: no space named; give space=[name,...] (allowed: {', '.join(available)}), "
                    "or drop space= for the op's default spaces")
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


def _hide(text: str) -> str:
    """``text`` without the database passwords of this command line's overrides and of the configs
    this process ran (an interpolation such as ``${oc.env:PW}``)."""
    from zhantune.redact import known_secrets, mask, override_secrets

    return mask(text, override_secrets(sys.argv[1:]) | known_secrets())


class _State:
    task_started = False


def mark_task_started(cfg: Any = None) -> None:
    """Called first thing in a task function: what Hydra wrote to stderr until now goes out as is,
    and stdout is watched for a reader that goes away (:class:`_Stdout`). ``cfg``: the composed
    config, whose keys a ``+``/``++`` override added and whose interpolations are checked first
    (zhantune.composed.added_key_problem, unresolved_problem; exit code 2)."""
    import logging

    from zhantune.composed import added_key_problem, unresolved_problem

    msg = None if cfg is None else added_key_problem(cfg) or unresolved_problem(cfg)
    if msg:
        user_error(msg)
    _State.task_started = True
    _release_stderr()
    if not isinstance(sys.stdout, _Stdout):
        real, sys.stdout = sys.stdout, _Stdout(sys.stdout)
        for handler in logging.getLogger().handlers:  # Hydra's console handler writes to stdout too
            if isinstance(handler, logging.StreamHandler) and handler.stream is real:
                handler.setStream(sys.stdout)


class _PipeClosed(KeyboardInterrupt):
    """stdout's reader went away (``python -m zhantune.kerneltuner ... | head``): not an error of the
    command. A KeyboardInterrupt, so that it passes Hydra's handler (which prints a traceback for any
    Exception) and logging's (which prints one and goes on) to :func:`run_app`, and a tune stops as
    on Ctrl-C (its trial handed back, the study resumable)."""


class _Stdout:
    """sys.stdout, with a write or flush to a closed pipe raising :class:`_PipeClosed`."""

    def __init__(self, real: object) -> None:
        self._real = real

    def write(self, text: str) -> int:
        try:
            return self._real.write(text)
        except BrokenPipeError:
            raise _PipeClosed from None

    def flush(self) -> None:
        try:
            self._real.flush()
        except BrokenPipeError:
            raise _PipeClosed from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


class _HeldStderr(io.StringIO):
    real: object = None
    reword = False  # held after the task started (a submitit launcher's): returned for rewording too


def hold_stderr_for_launcher() -> None:
    """In a sweep's launcher whose jobs run in other processes (submitit): hold stderr again once the
    sweep has started, so that Hydra's traceback of a job that returned no result is reworded as the
    job's one line (zhantune.launcher.submitit_failure, in :func:`run_app`); anything else held is
    written out as it was when the launcher ends."""
    held = _HeldStderr()
    held.real, held.reword, sys.stderr = sys.stderr, True, held


def _release_stderr() -> str:
    """Put the real stderr back; write what was held to it unless it is returned for rewording."""
    held = sys.stderr
    if not isinstance(held, _HeldStderr):
        return ""
    sys.stderr = held.real
    text = held.getvalue()
    if _State.task_started and not held.reword:
        sys.stderr.write(_hide(text))
        return ""
    return text


def one_line(hydra_message: str) -> str:
    """Hydra's multi-line composition error as one line: its unindented lines joined, without the
    HYDRA_FULL_ERROR hint (e.g. "Error merging override bench.target_ms=abc; Value 'abc' of type
    'str' could not be converted to Float"). A Python traceback (Hydra's setup of its run directory
    or logging failed) is its first and last exception, with where the run directory goes for an
    OSError (a current directory in /proc, ``hydra.run.dir=`` naming a file)."""
    import re

    errors = [line.strip() for line in hydra_message.splitlines()
              if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Warning)\b", line)]
    if "Traceback (most recent call last)" in hydra_message and errors:
        text = errors[-1] if errors[0] == errors[-1] else f"{errors[-1]} ({errors[0]})"
        if re.match(r"(\w+\.)*(OSError|FileNotFoundError|FileExistsError|PermissionError|NotADirectoryError|"
                    r"IsADirectoryError|ReadOnlyFileSystemError)\b", errors[0]):
            text += ("; Hydra could not create the run's directory (hydra.run.dir, by default outputs/DATE/TIME "
                     "under the current directory): run from a directory you can write, or give hydra.run.dir=DIR")
        return "Hydra's setup failed: " + text
    lines, listing = [], False  # "Available options in 'GROUP':" then its options, indented (a newcomer's:
    # the list was dropped with the config search path's lines)
    for line in hydra_message.splitlines():
        if line[:1].isspace():
            if listing and line.strip():
                lines[-1] += ("" if lines[-1].endswith(":") else ",") + " " + line.strip()
            continue
        listing = line.startswith("Available options in")
        if line.strip() and "HYDRA_FULL_ERROR" not in line and not line.startswith("Config search path"):
            lines.append(line.strip())
    out = ""
    for line in lines:  # a line that ends its sentence is followed by a space, not "; " (".; To append")
        out += ("" if not out else " " if out.endswith((".", "?", "!")) else "; ") + line
    return out or "invalid command line"


def _unknown_key(hydra_message: str) -> str | None:
    """For Hydra's "Could not override 'serch.n_trials'. To append to your config use
    +serch.n_trials=4; Key 'serch' not in 'TuneConfig'": the key is not an option (a '+' would add
    one that nothing reads, and is refused), the closest option and the options there; None for
    any other message (a newcomer followed Hydra's advice into a second error)."""
    import dataclasses
    import difflib
    import re

    from zhantune import config

    m = re.search(r"Could not override '([^']+)'\. To append to your config use \+\S+\s+Key '([^']+)' not in "
                  r"'(\w+)'", " ".join(hydra_message.split()))
    schema = getattr(config, m.group(3), None) if m else None
    if m and schema is None and m.group(1).startswith("hydra."):  # Hydra's own, a launcher's, a sweeper's (a
        # newcomer's: Hydra's advice, '+', took submitit to a traceback; a review's: hydra.job.*, hydra.sweeper.*)
        import contextlib
        import importlib

        for module in ("hydra.conf", "hydra._internal.core_plugins.basic_launcher",
                       "hydra._internal.core_plugins.basic_sweeper", "hydra_plugins.hydra_submitit_launcher.config"):
            with contextlib.suppress(ImportError):
                schema = schema or getattr(importlib.import_module(module), m.group(3), None)
    if not (dataclasses.is_dataclass(schema) and m.group(2) in m.group(1).split(".")):
        return None
    key, part = m.group(1), m.group(2)
    where = ".".join(key.split(".")[:key.split(".").index(part)])
    names = [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]
    close = difflib.get_close_matches(part, names, n=1)
    of = f" of {where}" if where else ""
    return (f"override {key}=...: {'.'.join(filter(None, (where, part)))!r} is not an option{of}"
            + (f"; did you mean {'.'.join(filter(None, (where, close[0])))}?" if close else "")
            + (f" (options{of}: {', '.join(names)})" if names else f" ({where or 'it'} takes no option)"))


def _unparsable_override(args: list[str]) -> str | None:
    """The first argument Hydra's override grammar rejects (its own message does not name it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-"):
            continue
        try:
            parser.parse_overrides([arg])
        except Exception:
            return arg
    return None


def quoting_hint(override: str) -> str:
    """For an override whose value holds characters Hydra's grammar takes only inside quotes (a
    space, parentheses, a comma, ...), how to pass it: ``; quote the value inside the shell's quotes:
    'device="Intel(R) Xeon(R) Processor"'``. Empty for anything else."""
    key, sep, value = override.partition("=")
    if not sep or not value or value[0] in "'\"[{" or not any(c in value for c in " ()\\,:=[]{}'\""):
        return ""
    return f"; quote the value inside the shell's quotes: {override_arg(key, value)}"


def override_arg(key: str, value: str) -> str:
    """``key=value`` as one shell word that Hydra's override grammar reads back as ``value``: quoted
    for Hydra where the value holds a character its grammar takes only inside quotes (a space,
    parentheses, a comma, ``?``, ``&``, ...; a quote and the backslashes before a quote or the end
    escaped), then for the shell (shlex.quote). For the commands a hint prints."""
    import re
    import shlex

    if not re.fullmatch(r"[\w./+@:-]*", value):
        escaped = re.sub(r'(\\*)("|$)', lambda m: m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else ""), value)
        return shlex.quote(f'{key}="{escaped}"')
    return shlex.quote(f"{key}={value}")


def _drop_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered for the closed pipe is dropped
    at exit instead of failing again (the recipe of Python's signal module documentation)."""
    import os

    real = sys.stdout._real if isinstance(sys.stdout, _Stdout) else sys.stdout
    sys.stdout = real
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), real.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor (a captured stream): nothing to drop
        pass


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _sigterm_as_interrupt() -> None:
    """SIGTERM (``kill``, a batch scheduler's stop) as Ctrl-C in the apps without a handler of their own
    (merge, import, compare, export, check, collect): its default killed them without a word and
    without the cleanup a KeyboardInterrupt runs (a transaction rolled back, a half-written output's
    temporary file removed). The tune app installs zhantune.interrupt's handler over this one."""
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_interrupt)


def run_app(hydra_main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function with zhantune's error conventions."""
    msg = check_group_overrides(sys.argv[1:])
    if msg:
        user_error(msg)
    held = _HeldStderr()
    held.real = sys.stderr
    sys.stderr = held
    _sigterm_as_interrupt()
    try:
        hydra_main()
    except _PipeClosed:  # as a Unix tool whose reader stops (| head): no traceback, nothing more written
        _release_stderr()
        _drop_stdout()
        sys.exit(1)
    except BrokenPipeError:  # the same before the task started (--help | head); a task's own is its error
        if _State.task_started:
            raise
        _release_stderr()
        _drop_stdout()
        sys.exit(1)
    except KeyboardInterrupt as e:  # Ctrl-C where the app has no handler of its own (check, collect, db): one line
        sys.stderr.write(_hide(_release_stderr()))
        print("zhantune: interrupted (" + ("SIGTERM" if f"signal {signal.SIGTERM.value}" in str(e) else "Ctrl-C") + ")",
              file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)
    except SystemExit as e:
        text = _release_stderr()
        if e.code == 1 and not _State.task_started:
            bad = _unparsable_override(sys.argv[1:])
            from zhantune.launcher import launcher_hint
            from zhantune.redact import override_secrets

            # Hydra's parser message may quote any piece of the value: not shown for a database password
            why = "not valid in Hydra's override grammar" if bad and override_secrets([bad]) else one_line(text)
            user_error(_unknown_key(text) or (f"override {bad}: " if bad else "") + why
                       + (quoting_hint(bad) if bad else "") + launcher_hint(text))
        error = next((line.split(": error: ", 1)[1] for line in text.splitlines() if ": error: " in line), None)
        if e.code == 2 and not _State.task_started and text.lstrip().startswith("usage:") and error:
            # argparse's usage (8 lines) then its error: the error, and where the options are listed
            user_error(f"{error}; --help lists the options (Hydra's own: --cfg job|hydra|all, --info, -m, ...)")
        failed = None
        if "UncompletedJobError" in text or "for executor" in text:  # a submitit job's failure or a launcher
            # parameter submitit refuses: one line, not Hydra's traceback
            from zhantune.launcher import submitit_failure, submitit_parameter_error

            failed = submitit_failure(text) or submitit_parameter_error(text)
        # what was held before Hydra's traceback goes out as it was (a warning), then the job's line
        sys.stderr.write(_hide(text.split("Traceback (most recent call last)")[0] + f"{failed[0]}\n" if failed else text))
        if (multirun := sys.modules.get("zhantune.multirun")) is not None and e.code:
            multirun.summary_of_an_ended_sweep()
        if failed:
            sys.exit(failed[1])
        raise
    except Exception as e:  # raised through Hydra before the task (hydra.run.dir=${oc.env:UNSET}): its setup
        if _State.task_started:
            raise
        why = (str(getattr(e, "msg", None) or e).strip().splitlines() or [""])[0]
        _release_stderr()
        key = getattr(e, "full_key", None)  # an OmegaConf error's option
        user_error(f"Hydra's setup failed: {f'{key}: ' if key else ''}{type(e).__name__}: {why}")
    finally:  # any other way out before the task started: Hydra's text as it was
        sys.stderr.write(_hide(_release_stderr()))
