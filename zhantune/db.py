"""``python -m zhantune.db COMMAND storage.url=...``: the results database.

Commands:
  current   print the schema revision of the database and the newest this zhantune knows
  upgrade   upgrade zhantune's tables to the newest revision (back the file up first)
  merge     copy sources=[URL,...] into storage.url without duplicates (see zhantune.storage.merge)
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.errors import ConfigError, StorageError, UserError

__all__ = ["main", "COMMANDS"]

COMMANDS = ("current", "upgrade", "merge")
_command: list[str] = []


def _open_engine(url: str):
    from zhantune.storage import check_url, make_engine, sqlite_path

    check_url(url)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise StorageError(f"storage.url={url}: no database at {path}")
    return make_engine(url)


@hydra.main(version_base="1.3", config_path="conf", config_name="db")
def _db_app(cfg: DictConfig) -> None:
    mark_task_started()
    from sqlalchemy.exc import SQLAlchemyError

    from zhantune.storage import Store
    from zhantune.storage.merge import merge_into
    from zhantune.storage.migrate import current_revision, head_revision, upgrade

    cmd = _command[0]
    url = cfg.storage.url
    try:
        if cmd == "current":
            with _open_engine(url).connect() as conn:
                print(f"{url}: revision {current_revision(conn) or 'none (new database)'}; newest {head_revision()}")
        elif cmd == "upgrade":
            engine = _open_engine(url)
            try:
                before, after = upgrade(engine)
            except SQLAlchemyError as e:
                raise StorageError(f"storage.url={url}: upgrade failed, nothing changed: {str(e).splitlines()[0]}") from None
            print(f"{url}: revision {before or 'none'} -> {after}")
        else:
            if not cfg.sources:
                raise ConfigError("merge needs sources=[URL,...] (databases to copy into storage.url)")
            sources = [Store(str(u)) for u in cfg.sources]  # every source checked before writing
            target = Store(url)
            for src in sources:
                stats = merge_into(target, src, label=src.url)
                print(f"{src.url}: +{stats.measurements_added} measurement(s), {stats.measurements_skipped} "
                      f"already there; {stats.studies_new} new stud(y/ies), {stats.studies_renamed} renamed")
    except UserError as e:
        user_error(e)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        got = sys.argv[1] if len(sys.argv) > 1 else "nothing"
        user_error(f"unknown command {got!r}; usage: python -m zhantune.db {{{'|'.join(COMMANDS)}}} storage.url=...")
    _command.append(sys.argv.pop(1))
    run_app(_db_app)


if __name__ == "__main__":
    main()
