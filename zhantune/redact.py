"""Database passwords out of everything zhantune and Hydra show or write.

A password can reach zhantune inside a database URL (``postgresql+psycopg://me:pw@host/db``, or
libpq's ``?password=pw``), given on the command line or in a config. zhantune hides it by the value
itself: :func:`url_secrets` finds the passwords in the run's values, :func:`mask` replaces each where
it stands in a URL (after ``user:`` and before ``@``, or after ``password=``; URL-quoted or in
Hydra's escaped override form too) by ``***``. Other text is left as it is: a string that only looks
like ``a:b@c`` is never rewritten, and a password is hidden whatever characters it holds.

Where it applies: zhantune.storage.redact_url (every URL zhantune prints or stores), one-line user
errors (zhantune.cli.user_error, with the passwords of the command line's overrides), a multirun's
job records, and :class:`HidePasswords`, a Hydra callback listed in every app's config
(``hydra.callbacks``) for what Hydra itself writes and prints: the files it saves in each run's
output directory (``.hydra/``: ``overrides.yaml``, ``config.yaml``, ``hydra.yaml``; a multirun's
``multirun.yaml``, also when no job started), a failed job's overrides ("Error executing job with
overrides") and a multirun launcher's log line per job (every app's config also leaves
``storage.url`` and ``sources`` out of Hydra's ``override_dirname``). What it cannot reach: Hydra's
``--cfg``, ``--info`` and ``hydra.verbose`` print the config as given; the submitit launcher pickles
each job with its config; the file Hydra saved holds the password until the job starts (README: pass
it by ``PGPASSWORD`` or ``~/.pgpass``, not in the URL).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

__all__ = ["HidePasswords", "argv_secrets", "config_secrets", "known_secrets", "mask", "rewrite_saved", "url_secrets"]

#: ``scheme://user:password@host``, anywhere in a string (a list's element, a dict's value): the
#: password as SQLAlchemy reads it (to the first ``@``) and, anchored, to the last ``@`` (a raw ``@`` in it)
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"\[\]{},]*:(?P<pw>[^@]*)@")
_USERINFO_LAST = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:(?P<pw>.+)@[^@]*$")
#: libpq's password parameter in a URL's query
_QUERY = re.compile(r"[?&]password=(?P<pw>[^&#]*)")
#: where a password stands: (before, after)
_CONTEXTS = ((":", "@"), ("\\:", "@"), ("password=", ""), ("password\\=", ""))
#: the files Hydra saves in the run's ``hydra.output_subdir`` (hydra/core/utils.py: run_job)
_SAVED = ("overrides.yaml", "config.yaml", "hydra.yaml")


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def _readings(value: str) -> set[str]:
    """The ways a value may hold a URL: itself, unquoted and unescaped, and as Hydra's override
    grammar reads it (an override's value; each element of a list, a dict or a sweep)."""
    out = {value.strip()}
    out |= {_unescape(v.strip("'\"")) for v in list(out)}
    out |= set(_override_strings(value))
    return out


def _override_strings(arg: str) -> list[str]:
    """The strings an override ``key=value`` holds, read by Hydra's grammar (quotes, escapes, lists,
    dicts, sweeps such as ``a,b`` or ``choice(...)``); none if it is not one."""
    if "=" not in arg.split("://", 1)[0]:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        o = OverridesParser.create().parse_override(arg.lstrip("-"))
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
    except Exception:
        return []
    return list(_strings(values))


def url_secrets(values: Iterable[str]) -> set[str]:
    """The passwords in these strings (database URLs, overrides such as ``storage.url=URL``,
    ``sources=[URL,...]`` or a sweep over URLs, quoted or with Hydra's escapes): each as written and
    URL-decoded."""
    from sqlalchemy.engine import make_url

    found: set[str] = set()
    for value in values:
        if not isinstance(value, str) or ("@" not in value and "password" not in value):
            continue
        for s in _readings(value):
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
    found.discard("")
    return found


#: passwords of this process's configs (HidePasswords adds them; user errors are masked with them)
_KNOWN: set[str] = set()


def known_secrets() -> set[str]:
    """The passwords of the configs this process has run (Hydra's callbacks saw them)."""
    return set(_KNOWN)


def argv_secrets(args: Iterable[str]) -> set[str]:
    """:func:`url_secrets` of command-line arguments (``key=value`` overrides)."""
    return url_secrets(args)


def _variants(secret: str) -> set[str]:
    from hydra._internal.grammar.utils import escape_special_characters

    forms = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret)}
    return forms | {escape_special_characters(f) for f in forms}


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***`` where it stands as a URL's password
    (after ``user:`` and before ``@``, or after ``password=``), in any of its written forms."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        for v in sorted(_variants(secret), key=len, reverse=True):
            for before, after in _CONTEXTS:
                text = text.replace(f"{before}{v}{after}", f"{before}***{after}")
    return text


def _masked(node: Any, secrets: set[str]) -> Any:
    if isinstance(node, str):
        return mask(node, secrets)
    if isinstance(node, dict):
        return {k: _masked(v, secrets) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v, secrets) for v in node]
    return node


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def config_secrets(config: DictConfig) -> set[str]:
    """:func:`url_secrets` of every string in a composed config (Hydra's part included; as written
    and, where they resolve, with interpolations such as ``${oc.env:PW}`` resolved), remembered for
    :func:`known_secrets`."""
    found = url_secrets(_strings(OmegaConf.to_container(config, resolve=False)))
    for key in config:
        try:
            found |= url_secrets(_strings(OmegaConf.to_container(config[key], resolve=True)))
        except Exception:  # an interpolation that resolves only later (hydra:runtime...)
            continue
    _KNOWN.update(found)
    return found


def rewrite_saved(path: Path, secrets: set[str]) -> None:
    """Save a YAML file that Hydra wrote again without the passwords (as OmegaConf saved it: the same
    layout; atomically, keeping its mode, since the jobs of one sweep may race); unchanged if none is in it."""
    if not secrets:
        return
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:
        return
    hidden = _masked(data, secrets)
    if hidden == data:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    OmegaConf.save(OmegaConf.create(hidden), tmp)
    os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
    os.replace(tmp, path)


def _mask_log_records(secrets: set[str]) -> None:
    """Every log record of this process from now on without the passwords (a record factory: the
    launchers reconfigure logging, so a handler's filter would not last)."""
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # a bad format string: logging reports it as it would
            return record
        hidden = mask(text, secrets)
        if hidden != text:
            record.msg, record.args = hidden, ()
        return record

    logging.setLogRecordFactory(factory)


class HidePasswords(Callback):
    """Hydra callback: no database password in what Hydra saves for a run, logs for a multirun's jobs
    (the whole process's log records, from the multirun's start) or prints for a failed job."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        config_secrets(config)  # remembered: a user error of the job masks them too

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        secrets = config_secrets(config)
        if not secrets:
            return
        _mask_log_records(secrets)  # the launcher's "#0 : <overrides>" lines
        # the sweeper saves multirun.yaml after this call: rewritten by the jobs, and at exit in
        # case no job started (a sweep value that does not compose)
        atexit.register(rewrite_saved, Path(str(config.hydra.sweep.dir), "multirun.yaml"), secrets)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.types import RunMode

        secrets = config_secrets(config)
        hydra = config.hydra
        if hydra.output_subdir is not None:
            for name in _SAVED:
                rewrite_saved(Path(str(hydra.runtime.output_dir), str(hydra.output_subdir), name), secrets)
        if hydra.mode == RunMode.MULTIRUN:
            rewrite_saved(Path(str(hydra.sweep.dir), "multirun.yaml"), secrets)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        # Hydra prints job_return.overrides when the job failed (JobReturn.return_value); the
        # callbacks' on_job_end run in reverse order, so listed last this one runs before any reader
        overrides = [str(o) for o in job_return.overrides or []]
        secrets = url_secrets(overrides) | (config_secrets(config) if config is not None else set())
        job_return.overrides = [mask(o, secrets) for o in overrides]
