"""Database passwords out of what Hydra writes and prints.

zhantune shows and stores every database URL without its password (zhantune.storage.redact_url), but
Hydra itself saves each run's overrides and composed config to the run's output directory
(``outputs/<date>/<time>/.hydra/``: ``overrides.yaml``, ``config.yaml``, ``hydra.yaml``; a multirun's
``multirun.yaml`` in its sweep directory) before the job starts, and prints a failed job's overrides
("Error executing job with overrides: [...]"). :class:`HidePasswords`, a Hydra callback listed in
every app's config (``hydra.callbacks``), rewrites those files and that list with each URL's password
replaced by ``***``. What it cannot reach: a multirun launcher's own echo of each job's overrides on
the console (README: pass the password by ``PGPASSWORD`` or ``~/.pgpass``, not in the URL).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

__all__ = ["HidePasswords", "hide_passwords"]

#: ``scheme://user:password@``: the password runs to the last ``@`` before a ``/`` or a blank (an
#: unescaped ``@`` inside it stays hidden too); the user name is kept, as redact_url keeps it. A
#: multirun job's overrides escape the colons (``postgresql\://me\:pw@host``): that form too
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*\\?://[^\s/:@'\"\[\],\\]*)(?P<colon>\\?:)[^\s/'\"]*@")

#: the files Hydra saves in the run's ``hydra.output_subdir`` (hydra/core/utils.py: run_job)
_SAVED = ("overrides.yaml", "config.yaml", "hydra.yaml")


def hide_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``
    (``postgresql+psycopg://me:pw@host/db`` -> ``postgresql+psycopg://me:***@host/db``)."""
    return _USERINFO.sub(r"\g<head>\g<colon>***@", text)


def _rewrite(path: Path) -> None:
    """Replace the file with its text without passwords (atomically: jobs of one sweep may race)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    hidden = hide_passwords(text)
    if hidden == text:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(hidden)
    os.replace(tmp, path)


class HidePasswords(Callback):
    """Hydra callback: no database password in the run's saved config or a failed job's printed overrides."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.output_subdir is not None:
            for name in _SAVED:
                _rewrite(Path(str(hydra.runtime.output_dir), str(hydra.output_subdir), name))
        if hydra.mode == RunMode.MULTIRUN:  # the sweeper saved multirun.yaml before the first job
            _rewrite(Path(str(hydra.sweep.dir), "multirun.yaml"))

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        # Hydra prints job_return.overrides when the job failed (JobReturn.return_value); the
        # callbacks' on_job_end run in reverse order, so listed last this one runs before any reader
        job_return.overrides = [hide_passwords(str(o)) for o in job_return.overrides or []]
