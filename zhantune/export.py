"""``python -m zhantune.export``: the best correct candidates per (device, problem) as a lookup table.

Options (conf/export.yaml, also ``export.*`` of the tune app): ``top_k``, ``min_speedup``,
``device_agnostic``, ``device``, ``torch_version``, ``format`` (zhantune: wrapped with provenance;
inductor: the bare dict). Table format: :mod:`zhantune.inductor.table`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, StorageError, UserError
from zhantune.paths import check_output_path

__all__ = ["main", "export_table", "check_export_options", "resolve_device_key"]

register()

FORMATS = ("zhantune", "inductor")


def check_export_options(opts: Any, prefix: str = "") -> None:
    """Raise ConfigError naming the option (``export.top_k=0``) when a value is out of range."""
    if opts.format not in FORMATS:
        raise ConfigError(f"{prefix}format={opts.format!r}; allowed: {', '.join(FORMATS)}")
    if opts.top_k < 1:
        raise ConfigError(f"{prefix}top_k={opts.top_k} must be at least 1")
    if opts.min_speedup is not None and opts.min_speedup < 1.0:
        raise ConfigError(f"{prefix}min_speedup={opts.min_speedup} must be at least 1.0 "
                          "(1.0: the tuned entry unless it is slower than the default; null: always the tuned entry)")
    if opts.get("enabled", True) and opts.path:
        check_output_path(opts.path, f"{prefix}path")


def export_table(store: Any, url: str, opts: Any, device_key: str | None = None) -> tuple[Path | None, dict]:
    """Build the table with ``opts`` (an ExportConfig) and write it to ``opts.path``; returns (path,
    table). An empty table is not written (path None), so an existing file is never replaced by it."""
    from zhantune.inductor.table import build_table, table_metadata, write_table

    table = build_table(store, device_key=device_key, device_agnostic=opts.device_agnostic, top_k=opts.top_k,
                        min_speedup=opts.min_speedup, torch_version=opts.torch_version)
    meta = None
    if opts.format == "zhantune":
        options = {"top_k": opts.top_k, "min_speedup": opts.min_speedup, "device_agnostic": opts.device_agnostic,
                   "device": device_key, "torch_version": opts.torch_version}
        from zhantune.storage.store import redact_url

        meta = table_metadata(store, table, options, redact_url(url))
    if not table:
        return None, table
    return write_table(opts.path, table, meta), table


def resolve_device_key(store: Any, spec: Any, option: str = "device") -> str | None:
    """The key of the database device that ``device=`` names: its key or name, its number in the
    list of the database's devices (sorted by key, from 0), or its kind (``cpu``, ``cuda``) when
    exactly one device has it. None for None. Raises ConfigError listing the devices otherwise."""
    if spec is None:
        return None
    want = str(spec).strip()
    devices = store.devices()
    for d in devices:
        if want in (d.key, d.name):
            return d.key
    if want.isdigit() and int(want) < len(devices):
        return devices[int(want)].key
    of_kind = [d for d in devices if d.kind == want.lower()]
    if len(of_kind) == 1:
        return of_kind[0].key
    listed = "; ".join(f"{i}: {d.key!r} ({d.kind})" for i, d in enumerate(devices)) or "none"
    raise ConfigError(f"{option}={want!r}: no such device in {store.url}; it has {listed}. Give the number "
                      f"({option}=0), or the key in quotes inside the shell's: '{option}=\"KEY\"'")


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.storage import Store, sqlite_path

    try:
        check_export_options(cfg)
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={cfg.storage.url}: no database at {path}")
        store = Store(cfg.storage.url)
        device = resolve_device_key(store, cfg.device)
        out, table = export_table(store, cfg.storage.url, cfg, device)
        if out is None:
            raise UserError(f"nothing to export from {cfg.storage.url}: no correct measured candidate"
                            + (f" for device {device!r}" if device else "")
                            + (f" with torch {cfg.torch_version}" if cfg.torch_version else ""))
    except UserError as e:
        user_error(e)
        return
    print(f"wrote {len(table)} key(s) to {out} (format {cfg.format}, top_k {cfg.top_k})")
    if cfg.format == "inductor":
        from zhantune.inductor.table import stock_inductor_notes

        for note in stock_inductor_notes(table):  # what differs without zhantune.use_table
            print(f"note: {note}")


def main() -> None:
    run_app(_export_app)


if __name__ == "__main__":
    main()
