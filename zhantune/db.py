"""``python -m zhantune.db COMMAND storage.url=...``: the results database.

Commands:
  current   print the schema revision of the database and the newest this zhantune knows
  upgrade   upgrade zhantune's tables to the newest revision (back the file up first)
  merge     copy sources=[URL,...] into storage.url without duplicates (see zhantune.storage.merge)
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, StorageError, UserError

__all__ = ["main", "COMMANDS"]

register()

#: command -> what it does (the usage line of ``python -m zhantune.db`` without a command lists them)
COMMANDS = {
    "current": "print the schema revision",
    "upgrade": "upgrade an older database",
    "merge": "copy sources=[URL,...] into storage.url",
}
_command: list[str] = []


@hydra.main(version_base="1.3", config_path="conf", config_name="db")
def _db_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    from sqlalchemy.exc import SQLAlchemyError

    from zhantune.storage import Store
    from zhantune.storage.engine import existing_revision, holds_zhantune_schema, open_existing, redact_url
    from zhantune.storage.merge import check_importable
    from zhantune.storage.migrate import head_revision, upgrade

    cmd = _command[0]
    url = cfg.storage.url
    try:
        if cmd == "current":
            # read only: an older file stays as it was, a read-only one is fine
            rev = existing_revision(url, allow_newer=True, writable=False)
            print(f"{redact_url(url)}: revision {rev or 'none (new database)'}; newest {head_revision()}")
        elif cmd == "upgrade":
            engine = open_existing(url)
            try:
                before, after = upgrade(engine)
            except SQLAlchemyError as e:
                raise StorageError(f"storage.url={redact_url(url)}: upgrade failed, nothing changed: {str(e).splitlines()[0]}") from None
            print(f"{redact_url(url)}: revision {before or 'none'} -> {after}")
        else:
            if not cfg.sources:
                raise ConfigError("merge needs sources=[URL,...] (databases to copy into storage.url)")
            if not OmegaConf.is_list(cfg.sources):
                raise ConfigError(f"sources={cfg.sources}: expected a list of database URLs, e.g. sources=[{cfg.sources}]")
            # every source checked before anything is written: it exists, is a sound zhantune
            # database, and its rows set only allow-listed knobs (zhantune.inductor.knobs)
            sources = []
            for i, u in enumerate(cfg.sources):
                existing_revision(str(u), f"sources[{i}]", writable=False)  # only read: a read-only file is fine
                if not holds_zhantune_schema(str(u), f"sources[{i}]", writable=False):
                    raise StorageError(f"sources[{i}]={redact_url(str(u))}: holds no zhantune tables, nothing to merge; "
                                       "nothing was merged")
                src = Store(str(u), f"sources[{i}]", read_only=True)
                check_importable(src, f"sources[{i}]")
                sources.append(src)
            from zhantune.storage.locks import database_lock

            holds_zhantune_schema(url)  # its one-line errors (no server, no such directory) before the lock's
            with database_lock(url):  # the target's checks and writes as one: a merge or import beside it waits
                _merge(url, sources)
    except UserError as e:
        user_error(e)
    except Exception as e:
        from zhantune.storage.rerun import locked_out

        if (msg := locked_out(e, url, concurrent=True)) is None:
            raise
        user_error(msg)


def _merge(url: str, sources: list) -> None:
    """Check the target ``url`` with the checked ``sources`` (Stores), then merge each into it."""
    from zhantune.storage import Store
    from zhantune.storage.engine import holds_zhantune_schema, redact_url
    from zhantune.storage.merge import check_device_kinds, check_recordings, merge_into

    # a target without zhantune's tables (a new file, an empty database) gets them after the checks
    target = Store(url) if holds_zhantune_schema(url) else None
    stores = (([("storage.url", target)] if target is not None else [])
              + [(f"sources[{i}]", src) for i, src in enumerate(sources)])
    check_device_kinds(stores)
    check_recordings(stores)
    target = target or Store(url)
    for src in sources:
        shown = redact_url(src.url)  # a renamed study's "[from ...]" and this line: no password
        stats = merge_into(target, src, label=shown)
        print(f"{shown}: +{stats.measurements_added} measurement(s), {stats.measurements_skipped} "
              f"already there; {stats.verdicts_added} verdict(s); {stats.studies_new} new stud(y/ies), "
              f"{stats.studies_renamed} renamed")


def usage() -> str:
    """One line: the commands and what each does."""
    listed = "; ".join(f"{name}: {what}" for name, what in COMMANDS.items())
    return f"usage: python -m zhantune.db {{{'|'.join(COMMANDS)}}} storage.url=... ({listed}; --help for more)"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--help", "-h"):
        run_app(_db_app)  # Hydra prints conf/db.yaml's help template
        return
    if len(sys.argv) < 2 or ("=" in sys.argv[1] and sys.argv[1] not in COMMANDS):  # only overrides
        user_error(f"no command given; {usage()}")
    if sys.argv[1] not in COMMANDS:
        user_error(f"unknown command {sys.argv[1]!r}; {usage()}")
    _command.append(sys.argv.pop(1))
    run_app(_db_app)


if __name__ == "__main__":
    main()
