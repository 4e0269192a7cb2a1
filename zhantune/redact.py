"""Database passwords out of everything zhantune and Hydra show or write.

A password can reach zhantune inside a database URL (``postgresql+psycopg://me:pw@host/db``, or
libpq's ``?password=pw``) in the options that hold one (``storage.url``, a merge's ``sources``), on
the command line or through an interpolation such as ``${oc.env:PW}``. zhantune hides it by the
value itself: :func:`override_secrets` and :func:`config_secrets` find the passwords in those options,
:func:`mask` replaces each by ``***`` where it stands as a URL's password (after ``scheme://user:``
and before ``@``, or after ``?password=`` / ``&password=``; URL-quoted or in Hydra's escaped override
form too). Other text is left as it is (a study name ``kerneltuner:pw@GPU`` is not a URL), and a
password is hidden whatever characters it holds.

Where it applies: zhantune.storage.redact_url (every URL zhantune prints or stores), one-line user
errors (zhantune.cli.user_error), a multirun's job records, and :class:`HidePasswords`, a Hydra
callback listed in every app's config (``hydra.callbacks``) for what Hydra itself writes and prints:
the files it saves in each run's output directory (``.hydra/``: ``overrides.yaml``, ``config.yaml``,
``hydra.yaml``; a multirun's ``multirun.yaml``, also when no job started), a failed job's overrides
("Error executing job with overrides") and a multirun launcher's log line per job. What it cannot
reach: Hydra's ``--cfg``, ``--info`` and ``hydra.verbose`` print the config as given; a directory
named after ``${hydra.job.override_dirname}`` holds the URL; the submitit launcher pickles each job
with its config; the files Hydra saved hold the password until the job starts (README: pass it by
``PGPASSWORD`` or ``~/.pgpass``, not in the URL).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = ["HidePasswords", "config_secrets", "hide_overrides", "hide_password", "known_secrets", "mask",
           "override_secrets", "stored_config", "url_secrets"]

#: the options that hold database URLs (every app's ``storage.url``, db merge's ``sources``); an
#: override whose key starts so counts (``storage=URL``, a misspelt ``storage.uri=URL`` echoed back)
URL_OPTIONS = ("storage", "sources")

#: ``scheme://user:password@`` anywhere in a string (an element of a list that does not parse): the
#: password as SQLAlchemy reads it, to the first ``@``; anchored on a whole URL, to the last ``@``
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"\[\]{},]*:(?P<pw>[^@\s'\",\]}]*)@")
_USERINFO_LAST = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:(?P<pw>.+)@[^@]*$")
#: libpq's password parameter in a URL's query
_QUERY = re.compile(r"[?&]password=(?P<pw>[^&#\s'\"]*)")
#: the files Hydra saves in the run's ``hydra.output_subdir`` (hydra/core/utils.py: run_job)
_SAVED = ("overrides.yaml", "config.yaml", "hydra.yaml")

#: the passwords of the configs this process ran (user errors and log records are masked with them)
_KNOWN: set[str] = set()


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def url_secrets(values: Iterable[str]) -> set[str]:
    """The passwords in these database URLs (each also read unquoted and without Hydra's escapes; a
    URL inside a malformed list too): each as written and URL-decoded."""
    from sqlalchemy.engine import make_url

    found: set[str] = set()
    for value in values:
        if not isinstance(value, str) or ("@" not in value and "password" not in value):
            continue
        for s in {value.strip(), _unescape(value.strip().strip("'\"")), value.strip().strip("[]'\" ")}:
            try:
                u = make_url(s)
            except Exception:
                u = None
            if u is not None:
                found.add(u.password or "")
                q = u.query.get("password")
                found |= set(q) if isinstance(q, tuple) else {q or ""}
            for m in (_USERINFO_LAST.match(s), *_USERINFO.finditer(s), *_QUERY.finditer(s)):
                if m:
                    found |= {m["pw"], unquote(m["pw"])}
                    # an unquoted comma: Hydra splits the value there, and each piece may be shown
                    found |= set(m["pw"].split(",")) if "," in m["pw"] else set()
    return {f for f in found if f and not re.fullmatch(r"\$\{[^}]*\}", f)}  # not an interpolation


def hide_password(url: str) -> str:
    """The URL as given, its password as ``***`` (for a message naming the user's value; a stored or
    printed database name goes through zhantune.storage.redact_url, SQLAlchemy's rendering)."""
    return mask(url, url_secrets([url]))


def _is_url_option(key: str) -> bool:
    return key.lstrip("+~").split(".", 1)[0].split("@", 1)[0] in URL_OPTIONS


def _override_strings(arg: str) -> list[str]:
    """The strings an override holds, read by Hydra's grammar (quotes, escapes, lists, dicts, sweeps
    such as ``a,b`` or ``choice(...)``); none if it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        o = OverridesParser.create().parse_override(arg)
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
    except Exception:
        return []
    return list(_strings(values))


#: a database URL's scheme (SQLAlchemy's dialects that take a password), as an override's value starts
_DB_SCHEME = re.compile(r"^[\s\['\"]*(postgres(ql)?|sqlite|mysql|mariadb|oracle|mssql|cockroachdb)(\+\w+)?\\?://")


def override_secrets(args: Iterable[str]) -> set[str]:
    """The passwords in command-line overrides of the URL options (:data:`URL_OPTIONS`), or of any
    other key whose value is a database URL (a misspelt option, echoed in its error): the value as
    written and as Hydra's grammar reads it."""
    found: set[str] = set()
    for arg in args:
        key, sep, value = str(arg).partition("=")
        if sep and (_is_url_option(key) or _DB_SCHEME.match(value)):
            found |= url_secrets([value, *_override_strings(str(arg))])
    return found


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def _option_strings(config: Any, key: str, resolve: bool) -> list[str]:
    try:
        node = config[key]
        if OmegaConf.is_config(node):
            return list(_strings(OmegaConf.to_container(node, resolve=resolve)))
        return [str(node)]
    except Exception:  # absent, or an interpolation that does not resolve (yet)
        return []


def config_secrets(config: Any) -> set[str]:
    """The passwords in a composed config's URL options (as written and, where they resolve, with
    interpolations such as ``${oc.env:PW}`` resolved) and in the overrides Hydra recorded;
    remembered for :func:`known_secrets`."""
    found: set[str] = set()
    if not OmegaConf.is_config(config):
        return found
    for key in URL_OPTIONS:
        if key in config:
            found |= url_secrets(_option_strings(config, key, False) + _option_strings(config, key, True))
    overrides = OmegaConf.select(config, "hydra.overrides.task", default=None)
    if overrides is not None:  # as typed: ``dtype=${nope}`` is a string here, not an interpolation to resolve
        found |= override_secrets(OmegaConf.to_container(overrides, resolve=False))
    _KNOWN.update(found)
    return found


def stored_config(cfg: DictConfig) -> dict[str, Any]:
    """A run's resolved config as stored with its study (and merged elsewhere): ``storage.url`` as
    zhantune.storage.redact_url shows it, no password anywhere (a misspelt ``+storage.uri=URL`` too)."""
    from zhantune.storage.engine import redact_url

    config = OmegaConf.to_container(cfg, resolve=True)
    config["storage"]["url"] = redact_url(config["storage"]["url"])
    return _masked(config, config_secrets(cfg))


def hide_overrides(overrides: Iterable[Any], config: Any) -> list[str]:
    """A job's overrides (as Hydra records and prints them) without the passwords they or the job's
    composed config hold."""
    overrides = [str(o) for o in overrides or []]
    secrets = override_secrets(overrides) | config_secrets(config)
    return [mask(o, secrets) for o in overrides]


def known_secrets() -> set[str]:
    """The passwords of the configs this process has run (:func:`config_secrets` saw them)."""
    return set(_KNOWN)


def _variants(secret: str) -> set[str]:
    """A password as it may be written: raw, URL-quoted, and each with Hydra's override escapes."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret)}
    forms |= {secret.replace(q, "\\" + q) for q in "'\""}  # inside a quoted override value
    try:
        from hydra._internal.grammar.utils import escape_special_characters
    except ImportError:  # Hydra moved it: the forms without escapes
        return forms
    return forms | {escape_special_characters(f) for f in forms}


@functools.lru_cache(maxsize=64)
def _pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    forms = sorted({v for s in secrets for v in _variants(s)}, key=len, reverse=True)
    if not forms:
        return None
    alt = "|".join(map(re.escape, forms))
    return re.compile(rf"(?P<user>\\?://[^:/\s]*\\?:)(?:{alt})(?=@|['\"\]\s]|$)"
                      rf"|(?P<param>[?&]password\\?=)(?:{alt})(?![A-Za-z0-9_%~.+\-@])")


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***`` where it stands as a URL's password (after
    ``scheme://user:`` and before ``@`` or the end of the URL, or as a whole ``password=`` query
    value), in any of its written forms; text elsewhere unchanged."""
    pattern = _pattern(frozenset(secrets))
    if pattern is None:
        return text
    return pattern.sub(lambda m: (m["user"] or m["param"]) + "***", text)


def _masked(node: Any, secrets: set[str]) -> Any:
    if isinstance(node, str):
        return mask(node, secrets)
    if isinstance(node, dict):
        return {k: _masked(v, secrets) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v, secrets) for v in node]
    return node


def _rewrite_saved(path: Path, secrets: set[str]) -> None:
    """Save a YAML file that Hydra wrote again without the passwords: these and any in the file's own
    URL options and overrides (so that jobs of one sweep, each rewriting the file, never put one
    back). As OmegaConf saved it (the same layout), atomically, keeping its mode; unchanged if none is
    in it; a file that cannot be read or replaced is left as it is."""
    tmp = None
    try:
        loaded = OmegaConf.load(path)
        data = OmegaConf.to_container(loaded, resolve=False)
        secrets = secrets | (override_secrets(data) if isinstance(data, list) else config_secrets(loaded))
        hidden = _masked(data, secrets) if secrets else data
        if hidden == data:
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        OmegaConf.save(OmegaConf.create(hidden), tmp)
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
        tmp = None
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):  # left as Hydra wrote it
        return
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _record_factory(make: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if _KNOWN:
            try:
                text = record.getMessage()
            except Exception:  # a bad format string: logging reports it as it would
                return record
            hidden = mask(text, _KNOWN)
            if hidden != text:
                record.msg, record.args = hidden, ()
        return record

    factory.zhantune_masks = True  # type: ignore[attr-defined]
    return factory


def _mask_log_records() -> None:
    """Every log record of this process without the known passwords, from now on (a record
    factory, installed once: the launchers reconfigure logging, so a handler's filter would not last)."""
    make = logging.getLogRecordFactory()
    if not getattr(make, "zhantune_masks", False):
        logging.setLogRecordFactory(_record_factory(make))


def _sweep_file(config: DictConfig) -> Path:
    """The sweep's multirun.yaml, absolute (a job may run in its own directory: hydra.job.chdir)."""
    sweep = Path(str(config.hydra.sweep.dir))
    return (sweep if sweep.is_absolute() else Path(str(config.hydra.runtime.cwd)) / sweep) / "multirun.yaml"


class HidePasswords(Callback):
    """Hydra callback: no database password in what Hydra saves for a run, logs for a multirun's jobs
    (the whole process's log records, from the multirun's start) or prints for a failed job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        secrets = config_secrets(config)
        if not secrets:
            return
        _mask_log_records()  # the launcher's "#0 : <overrides>" lines
        # the sweeper saves multirun.yaml after this call: rewritten by the jobs, and at exit in
        # case no job started (a sweep value that does not compose)
        atexit.register(_rewrite_saved, _sweep_file(config), secrets)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.types import RunMode

        secrets = config_secrets(config)
        if not secrets:
            return
        hydra = config.hydra
        if hydra.output_subdir is not None:
            for name in _SAVED:
                _rewrite_saved(Path(str(hydra.runtime.output_dir), str(hydra.output_subdir), name), secrets)
        if hydra.mode == RunMode.MULTIRUN:
            _rewrite_saved(_sweep_file(config), secrets)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        # Hydra prints job_return.overrides when the job failed (JobReturn.return_value); the
        # callbacks' on_job_end run in reverse order, so listed last this one runs before any reader.
        # submitit pickles the whole JobReturn to <job>_result.pkl: its configs too (a helper found
        # the password there)
        job_return.overrides = hide_overrides(job_return.overrides, config)
        secrets = config_secrets(config)
        for name in ("cfg", "hydra_cfg"):
            if secrets and OmegaConf.is_config(getattr(job_return, name, None)):
                setattr(job_return, name, OmegaConf.create(_masked(
                    OmegaConf.to_container(getattr(job_return, name), resolve=False), secrets)))


def _masked(value: Any, secrets: set[str]) -> Any:
    """``value`` (plain containers of a config) with every string masked (:func:`mask`)."""
    if isinstance(value, dict):
        return {k: _masked(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, secrets) for v in value]
    return mask(value, secrets) if isinstance(value, str) else value
