"""``python -m zhantune.export``: the best correct candidates per (device, problem) as a lookup table.

Options (conf/export.yaml, also ``export.*`` of the tune app): ``top_k``, ``min_speedup``,
``device_agnostic``, ``device``, ``torch_version``, ``format`` (zhantune: wrapped with provenance;
inductor: the bare dict), ``problems`` (a problems file: only its problems). Built by
:func:`zhantune.inductor.exporter.export_table`; table format: :mod:`zhantune.inductor.table`.
"""

from __future__ import annotations

from typing import Any

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import StorageError, UserError

__all__ = ["main"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    from zhantune.inductor.exporter import check_export_options, export_table, resolve_device_key
    from zhantune.redact import hide_password
    from zhantune.storage import Store, sqlite_path
    from zhantune.storage.engine import redact_url

    try:
        check_export_options(cfg, inputs={"problems": cfg.problems})
        if cfg.problems:
            from zhantune.request import check_file

            check_file(cfg.problems, "problems")
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={hide_password(cfg.storage.url)}: no database at {path} (a tune, "
                               "python -m zhantune ..., writes one; or give the storage.url of yours)")
        store = Store(cfg.storage.url, read_only=True)  # only read: a read-only file is fine
        store.check_readable()
        device = resolve_device_key(store, cfg.device)
        ids = _problem_ids(store, cfg.problems) if cfg.problems else None
        shared: list[str] = []
        out, table = export_table(store, cfg, device, shared, ids, option="path")
        problems = store.problems_by_key().values() if out is None and not device else None
        if problems is not None and not any(p.lookup_key for p in problems):
            raise UserError(f"nothing to export from {redact_url(cfg.storage.url)}: "
                            + ("none of its problems has an Inductor lookup key (Kernel Tuner imports and replays "
                               "have none; python -m zhantune.compare reads them)" if problems else
                               "it holds no problem yet"))
        if out is None:
            from zhantune.inductor.builder import table_torch
            from zhantune.provenance import torch_release

            releases = [r for r in store.candidate_torch_releases(device)  # measured with another torch: say which
                        if r != torch_release(table_torch(cfg.torch_version))]
            raise UserError(f"nothing to export from {redact_url(cfg.storage.url)}: no correct measured candidate"
                            + (f" for device {device!r}" if device else "")
                            + f" with torch {table_torch(cfg.torch_version)}"
                            + (f"; its candidates were measured with torch {', '.join(releases)}: export "
                               f"torch_version={releases[-1]} for that torch's table" if releases else ""))
    except UserError as e:
        user_error(e)
        return
    # Inductor's default choice alone ({"template_id": "aten::<op>"}, default_entry): no tuned entry made it
    defaults = sum(1 for entries in table.values() if len(entries) == 1 and list(entries[0]) == ["template_id"]
                   and entries[0]["template_id"].startswith("aten::"))
    unclaimed = defaults - len(shared)  # a shared key's default: its problems' entries differ (said below)
    why = ([("" if not shared else f"{unclaimed} with ") + "no tuned config confirmed faster in paired rounds by at least "
            f"min_speedup={cfg.min_speedup:g} (each tune's summary says why)"] if cfg.min_speedup is not None and unclaimed
           else []) + ([f"{len(shared)} shared by problems with different tuned entries (below)"] if shared else [])
    print(f"wrote {len(table)} key(s) to {out} (format {cfg.format}, top_k {cfg.top_k})"  # null: no claim needed
          + (f"; {defaults} of them Inductor's default choice" + (": " + ", ".join(why) if why else "") if defaults else ""))
    _notes(cfg, store, table, device, ids, shared)


def _notes(cfg: DictConfig, store: Any, table: dict, device: str | None, ids: set[int] | None, shared: list[str]) -> None:
    """The lines after an export's "wrote ..." line: what its options mean for the table written."""
    from zhantune.inductor.builder import NO_CLAIM_NOTE, claims_of_other_torch, table_torch

    if cfg.device_agnostic:
        print("note: device_agnostic=true: each key applies on every device that loads the table; its entry is "
              "the fastest device's, shipped only where its claim was confirmed on every device of that kind that "
              "measured the problem; python -m zhantune.compare table=... picks configs by their regret on every device")
    if cfg.min_speedup is None:
        print(f"note: {NO_CLAIM_NOTE}")
    if cfg.top_k > 1:
        print(f"note: top_k={cfg.top_k}: a key's entries after the first are the next fastest stored configs, never "
              "paired with Inductor's default; Inductor autotunes among them when it compiles (CUDA; a CPU GEMM "
              "compiles the first entry only)")
    others = claims_of_other_torch(store, cfg.torch_version, cfg.min_speedup, device, ids)
    for other, n in sorted(others.items(), key=lambda item: item[0] or ""):
        with_torch = f"with torch {other}" if other else "before zhantune recorded a claim's torch"
        print(f"note: {n} speedup claim(s) confirmed {with_torch} do not ship in this torch "
              f"{table_torch(cfg.torch_version)} table: a claim holds for the torch its paired rounds ran with "
              + (f"(export torch_version={other} for that torch's table, or " if other else "(")
              + "rerun the tunes with this torch: a finished study settles again)")
    for key in shared:
        print(f"{key}: Inductor's default choice: problems with different tuned entries share this lookup key "
              "(one's entry was never measured for the other)")
    if cfg.format == "inductor":
        from zhantune.inductor.stock import stock_inductor_notes

        print(f"note: format=inductor: the bare table names no torch release, device kind or CPU ISA: zhantune.use_table "
              f"cannot report its entries stale under a torch other than {table_torch(cfg.torch_version)} or on a CPU "
              "of another ISA or cpuid, and serves them as hits (format=zhantune keeps them)")
        kinds = {d.kind for d in store.devices() if device is None or d.key == device}
        for note in stock_inductor_notes(table, "cpu" if kinds == {"cpu"} else None):  # without zhantune.use_table
            print(f"note: {note}")


def _problem_ids(store: Any, path: str) -> set[int]:
    """The database's ids of the problems in the problems file ``path``; raises UserError when the
    database holds none of them, and prints each one it lacks (not tuned yet: no entry)."""
    from zhantune.problems.file import problem_keys
    from zhantune.storage.engine import redact_url

    by_key = store.problems_by_key()
    keys = problem_keys(path)
    missing = [k for k in keys if k not in by_key]
    if len(missing) == len(keys):
        raise UserError(f"problems={path}: none of its {len(keys)} problem(s) is in {redact_url(store.url)} "
                        f"(first: {keys[0]}); tune them first: python -m zhantune problems={path}")
    for key in missing:
        print(f"{key}: not in the database (not tuned yet): no entry for it")
    return {by_key[k].id for k in keys if k in by_key}


def main() -> None:
    run_app(_export_app)


if __name__ == "__main__":
    main()
