"""``python -m zhantune.replay table=T.json``: measure a lookup table's entries on this device.

Configs tuned elsewhere (another GPU, a colleague's table) get measured here and stored like any
candidate, with the same config hashes, so ``python -m zhantune.compare`` can give their regret on
this device. Each key's problem is found in ``storage.url`` by Inductor's device-agnostic input key
(the database the table was exported from, or one merged with it); Inductor's default is measured
too, as the baseline, and each entry's speedup over it settled in paired rounds (stored verdicts, so
that a portable table replayed on each device can ship what was confirmed everywhere). Results go
to the study ``replay:<table file>@<device key>`` (zhantune.table_replay.measure_table).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune import interrupt
from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, StorageError, TableError, UserError

__all__ = ["main"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="replay")
def _replay_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    interrupt.install()
    from zhantune.request import check_device_spec, check_file

    try:  # before the heavy imports
        if OmegaConf.is_missing(cfg, "table") or not cfg.table:  # ??? in replay.yaml: was Hydra's traceback; '': "a directory"
            raise ConfigError("no table given; use table=PATH (a lookup table JSON, e.g. python -m zhantune.export's)")
        check_file(cfg.table, "table")
        check_device_spec(cfg.device)
        if not 0 <= cfg.seed < 2**32:  # as search.seed: the seed of the inputs each entry is timed on
            raise ConfigError(f"seed={cfg.seed} must be in [0, {2**32 - 1}] (the random seed of the inputs)")
    except UserError as e:
        user_error(e)
        return
    from zhantune.config import check_bench
    from zhantune.device import resolve_device
    from zhantune.inductor.builder import table_candidates
    from zhantune.inductor.table import read_table_option
    from zhantune.redact import hide_password
    from zhantune.storage import Store, sqlite_path
    from zhantune.table_replay import measure_table
    from zhantune.torch_support import check_torch

    try:
        check_torch(what="zhantune.replay")  # it compiles each entry with Inductor
        check_bench(cfg.bench)
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={hide_password(cfg.storage.url)}: no database at {path} (a replay "
                               "measures the problems stored in the database the table was exported from: give "
                               "its storage.url, or copy it here)")
        device = resolve_device(cfg.device)
        tf = read_table_option(cfg.table, device.kind)  # only allow-listed knobs (zhantune.inductor.knobs)
        table = tf.table
        if not table:  # a replay of it would store an empty study and say nothing
            others = sorted(set(tf.other_kind.values()))
            raise TableError(f"table={cfg.table}: holds no lookup keys" + (
                f" for a {device.kind} device (its {len(tf.other_kind)} key(s) are of {', '.join(others)} devices: "
                "replay it on one)" if others else "") + ", nothing to measure")
        store = Store(cfg.storage.url)
        work = table_candidates(table, store.problems_by_lookup_key(), str(cfg.table), device.kind, tf.activations)
        work = [(row, _search_branches(store, row.id, cands)) for row, cands in work]
        if device.kind == "cpu":  # before anything is measured: warm- and cold-cache rows in one ranking
            from zhantune.tune_result import refuse_other_flushing

            refuse_other_flushing(store, device.key, [row.key for row, _ in work], bool(cfg.bench.flush_cache),
                                  "this replay's would join their rankings (compare's, the export's)", mixed_ok=True)
    except UserError as e:
        user_error(e)
        return
    try:  # the device's row first: one of another vector ISA under this key is refused (a helper's: a traceback)
        measure_table(store, device, work, OmegaConf.to_object(cfg.bench), cfg.seed,
                      f"replay:{Path(cfg.table).name}@{device.key}", {"table": str(cfg.table)}, _print)
    except UserError as e:
        user_error(e)


def _search_branches(store: Any, problem_id: int, cands: list[Any]) -> list[Any]:
    """The candidates with the branch name a search of this problem measured their config under
    (``aten`` for the CPU's ``aten::mm`` entry), else ``table``: a tune's summary names its best
    config by its branch, and a replayed row of the same config must not rename it."""
    known = store.branch_names(problem_id)
    return [dataclasses.replace(c, branch=known.get(c.config_hash, c.branch)) for c in cands]


def _print(problem_key: str, cand: Any, meas: Any) -> None:
    """One line per measurement: the problem's default, then each entry indented; the median of its
    timed runs and the fastest, the statistic every decision uses (zhantune.bench.decision.decision_us)."""
    t = meas.timing
    time = f" median {t.median_us:,.1f} us, fastest {t.min_us:,.1f} us" if t and t.min_us else (
        f" {t.median_us:,.1f} us" if t else "")
    if cand is None:
        print(f"{problem_key}: inductor default {meas.status}{time}")
    else:
        print(f"  {cand.describe()}: {meas.status}{time}"
              + (f" ({meas.error_text})" if meas.error_text and not meas.ok else ""))


def main() -> None:
    run_app(_replay_app)


if __name__ == "__main__":
    main()
