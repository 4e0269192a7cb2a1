"""``python -m zhantune.export``: the best correct candidate per (device, problem) as a lookup table.

The table is the bare dict ``torch._inductor.config.lookup_table.table`` takes; see
:mod:`zhantune.inductor.table` for the entry format.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.errors import StorageError, UserError

__all__ = ["main"]


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.inductor.table import build_table, write_table
    from zhantune.storage import Store, sqlite_path

    try:
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={cfg.storage.url}: no database at {path}")
        store = Store(cfg.storage.url)
        table = build_table(store, device_key=cfg.device, device_agnostic=cfg.device_agnostic)
        if not table:
            raise UserError(f"nothing to export from {cfg.storage.url}: no correct measured candidate"
                            + (f" for device {cfg.device!r}" if cfg.device else ""))
        out = write_table(cfg.path, table)
    except UserError as e:
        user_error(e)
        return
    print(f"wrote {len(table)} key(s) to {out}")


def main() -> None:
    run_app(_export_app)


if __name__ == "__main__":
    main()
