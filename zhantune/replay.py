"""``python -m zhantune.replay table=T.json``: measure a lookup table's entries on this device.

Configs tuned elsewhere (another GPU, a colleague's table) get measured here and stored like any
candidate, with the same config hashes, so ``python -m zhantune.compare`` can give their regret on
this device. Each key's problem is found in ``storage.url`` by Inductor's device-agnostic input key
(the database the table was exported from, or one merged with it); Inductor's default is measured
too, as the baseline. Results go to the study ``replay:<table file>@<device key>``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from zhantune import interrupt
from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.errors import StorageError, TableError, UserError

__all__ = ["main", "table_candidates"]


def table_candidates(table: dict, problems: dict[str, object], source: str,
                     device_kind: str = "cuda") -> list[tuple[object, list]]:
    """(problem row, [Candidate, ...]) for each key; raises TableError for a key with no problem.

    On CPU an ``aten::<op>`` entry (Inductor's default choice) is measured as the config candidate
    that selects ATen (``max_autotune_gemm_backends=ATEN``, the ``aten`` space's point, same config
    hash), since Inductor's CPU GEMM has no template lookup."""
    from zhantune.inductor.table import CONFIG_TEMPLATE_ID
    from zhantune.search.space import Candidate

    out = []
    for key, entries in table.items():
        row = next((p for agnostic, p in problems.items() if key == agnostic or key.endswith("+" + agnostic)), None)
        if row is None:
            raise TableError(f"{source}: [{key!r}]: no problem with this Inductor input key in the database; "
                             "use the database the table was exported from (or merge it: python -m zhantune.db merge)")
        cands = []
        for i, entry in enumerate(entries):
            entry = dict(entry)
            template_id = entry.pop("template_id")
            entry.pop("template_hash", None)
            if template_id == CONFIG_TEMPLATE_ID:
                patch = entry.get("config_patch")
                if not isinstance(patch, dict):
                    raise TableError(f"{source}: [{key!r}][{i}].config_patch: expected an object")
                cands.append(Candidate("table", "config", None, dict(patch)))
            elif device_kind == "cpu" and template_id.startswith("aten::"):
                cands.append(Candidate("table", "config", None, {"max_autotune_gemm_backends": "ATEN"}))
            else:
                cands.append(Candidate("table", "template", template_id, entry))
        out.append((row, cands))
    return out


@hydra.main(version_base="1.3", config_path="conf", config_name="replay")
def _replay_app(cfg: DictConfig) -> None:
    mark_task_started()
    interrupt.install()
    from zhantune.request import check_device_spec, check_file

    try:  # before the heavy imports
        check_file(cfg.table, "table")
        check_device_spec(cfg.device)
    except UserError as e:
        user_error(e)
        return
    from sqlalchemy import select

    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import check_bench
    from zhantune.device import resolve_device
    from zhantune.inductor.table import load_table
    from zhantune.problems import GemmProblem
    from zhantune.problems.gemm import OPS
    from zhantune.storage import Store, sqlite_path
    from zhantune.storage import models as m
    from zhantune.tune import Recorder

    try:
        check_bench(cfg.bench)
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={cfg.storage.url}: no database at {path}")
        device = resolve_device(cfg.device)
        table = load_table(cfg.table, device.kind)  # only allow-listed knobs (zhantune.inductor.knobs)
        store = Store(cfg.storage.url)
        with store.session() as s:
            problems = {p.lookup_key: p for p in s.scalars(select(m.Problem)) if p.lookup_key}
        work = table_candidates(table, problems, str(cfg.table), device.kind)
    except UserError as e:
        user_error(e)
        return
    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    study_id = store.study_id(f"replay:{Path(cfg.table).name}@{device.key}", {"table": str(cfg.table)})
    try:
        for row, cands in work:
            problem = GemmProblem.from_config(row.op, [row.shape[d] for d in OPS[row.op]], row.dtype, row.activation,
                                              weight_layout=row.weight_layout)
            bench = InductorBenchmarker(problem, device, cfg.bench, seed=cfg.seed)
            rec = Recorder(store, problem, study_id, device_id, row.id, device)
            with interrupt.interruptible():
                default = bench.inductor_default()
            rec.add(default, "default")
            print(f"{problem.key}: inductor default {default.status}"
                  + (f" {default.timing.median_us:,.1f} us" if default.timing else ""))
            for cand in cands:
                with interrupt.interruptible():
                    meas = bench.measure(cand)
                rec.add(meas, "candidate", cand)
                print(f"  {cand.describe()}: {meas.status}" + (f" {meas.timing.median_us:,.1f} us" if meas.timing else "")
                      + (f" ({meas.error_text})" if meas.error_text and not meas.ok else ""))
    except KeyboardInterrupt:
        store.finish_study(study_id, "interrupted")
        raise SystemExit(130) from None
    store.finish_study(study_id)


def main() -> None:
    run_app(_replay_app)


if __name__ == "__main__":
    main()
