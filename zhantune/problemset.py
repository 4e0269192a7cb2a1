"""Problems files: a model's GEMMs written by ``python -m zhantune.collect`` (with each one's share
of the model's GEMM time), read back and tuned by ``python -m zhantune problems=problems.yaml``.

The file (YAML): ``format: zhantune-problems``, ``format_version: 1``, the model, its inputs, the
device and versions, ``problems`` (op, shape, dtype, weight_layout, lookup_key, count, inputs,
scalars, default_us: microseconds, share) and ``skipped`` (with the reason).

Tuning it: one resumable study per problem (the study name is the problem key and the device key,
as for a single tune), trials shared in proportion to each problem's share of the model's GEMM time
(``search.total_trials``, at least ``search.min_trials`` each; :func:`allocate_trials`),
tuned largest share first (so that, with ``search.transfer=auto``, the rest start from their
neighbouring shapes' winners),
overall progress on the terminal, one lookup table for all of them at the end.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from rich.console import Console
from rich.markup import escape

from zhantune.bench.conditions import ContentionCount
from zhantune.config import CONF_DIR, OpConfig
from zhantune.errors import ConfigError
from zhantune.problems.file import (
    PROBLEMS_FORMAT,
    read_problems,
    total_trials,
    write_problems,
)

__all__ = ["ProblemRun", "ProblemsResult", "resolve_problems", "tune_problems", "measure_defaults", "write_problems", "read_problems", "allocate_trials", "PROBLEMS_FORMAT"]

def measure_defaults(problems: list[Any], device: Any, bench: Any) -> ContentionCount:
    """Time each tunable problem's default compile (``problems``: zhantune.inductor.gemms.CollectedProblem)
    and set ``default_us`` (microseconds, the decision statistic: the fastest of its individually
    timed runs, zhantune.bench.decision.decision_us, which
    one-sided noise cannot inflate) and ``share``. Returns how many of the timed measurements were
    taken on a busy machine (zhantune.bench.conditions)."""
    from zhantune.bench.conditions import is_contended
    from zhantune.bench.inductor import InductorBenchmarker

    contention = ContentionCount()
    for p in problems:
        if p.problem is None:
            continue
        b = InductorBenchmarker(p.problem, device, bench)
        meas = b.inductor_default()
        if meas.timing is not None:
            contention = contention.add(meas.conditions, is_contended(meas.conditions or {}), meas.timing.method)
        if b.lookup_key != p.lookup_key:
            p.reason = f"the problem's own compile makes key {b.lookup_key!r}, not the model's"
            continue
        if meas.ok:
            p.default_us = meas.timing.min_us
    total = sum(p.count * p.default_us for p in problems if p.default_us)
    for p in problems:
        if p.default_us and total:
            p.share = p.count * p.default_us / total
    return contention


def _measured(store: Any, pr: Any) -> int:
    """Trials the study of ``pr`` (a ProblemRun) holds measured, at most its share."""
    row = store.study(pr.run.study_name)
    return min(store.trial_counts(row.id)[0], pr.n_trials) if row is not None else 0


def allocate_trials(rows: list[dict[str, Any]], total: int, min_trials: int) -> list[int]:
    """Trials per problem, ``total`` of them exactly (at least one per problem: the caller's check,
    zhantune.problems.file.total_trials): each problem ``min_trials`` where the total allows (else as
    many as it allows each, ``total // len(rows)``), the others the rest in proportion to ``share``
    (count x FLOPs where shares are missing; the largest remainders get the rounding). The floor was
    added on top of the total before: a helper's 12 trials over 10 problems ran 29."""
    import math

    weights = [r.get("share") for r in rows]
    if any(w is None for w in weights) or not sum(weights):
        weights = [r.get("count", 1) * math.prod(r["shape"]) for r in rows]
    floor = min(min_trials, total // len(rows))
    fixed: set[int] = set()  # the problems whose share is below the floor: they get the floor
    while True:
        free = [i for i in range(len(rows)) if i not in fixed]
        left, s = total - floor * len(fixed), sum(weights[i] for i in free)
        raw = {i: left * weights[i] / s if s else left / len(free) for i in free}
        low = {i for i in free if raw[i] < floor}
        if not low:
            break
        fixed |= low
    counts = [floor if i in fixed else math.floor(raw[i]) for i in range(len(rows))]
    left = total - sum(counts)
    for i in sorted(free, key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)[:left]:
        counts[i] += 1
    return counts


@dataclass
class ProblemRun:
    """One problem of a problems file: its row, its share of the trials, its RunSpec and result."""

    row: dict[str, Any]
    n_trials: int
    run: Any  # RunSpec
    result: Any = None


@dataclass
class ProblemsResult:
    """Every problem's run, whether the command was interrupted, and the one table written."""

    runs: list[ProblemRun] = field(default_factory=list)
    interrupted: bool = False
    table_path: Any = None
    table_keys: list[str] = field(default_factory=list)
    #: (problem key, the file's lookup_key, the key its own compile makes here) where the two differ
    other_keys: list[tuple[str, str, str]] = field(default_factory=list)


def _problem_cfg(cfg: DictConfig, row: dict[str, Any], n_trials: int) -> DictConfig:
    op_file = CONF_DIR / "op" / f"{row['op']}.yaml"
    op = OmegaConf.merge(OmegaConf.structured(OpConfig), OmegaConf.load(op_file))
    if row.get("activation") is not None:  # collect's linear_act: its model's activation
        op.activation = row["activation"]
    sub = copy.deepcopy(cfg)
    with open_dict(sub):
        sub.op = op
        sub.shape = list(row["shape"])
        sub.dtype = row.get("dtype", "float32")
        sub.weight_layout = row.get("weight_layout", "kn")
        sub.problems = None
        sub.search.n_trials = n_trials
        sub.search.total_trials = None  # shared out: each problem's run takes its n_trials
        sub.export.enabled = False
    return sub


def resolve_problems(cfg: DictConfig) -> list[ProblemRun]:
    """Read the problems file, share the trials, and validate every problem's run before any is
    measured (a bad problem stops the command before anything is stored)."""
    from zhantune.runspec import resolve_run

    rows = read_problems(cfg.problems)
    if not OmegaConf.is_missing(cfg, "shape") or not OmegaConf.is_missing(cfg, "op"):
        raise ConfigError(f"problems={cfg.problems} takes op and shape from the file; drop +op=... and shape=[...]")
    total = total_trials(cfg, rows)
    if cfg.search.min_trials < 1:
        raise ConfigError(f"search.min_trials={cfg.search.min_trials} must be at least 1")
    counts = allocate_trials(rows, total, cfg.search.min_trials)
    runs = []
    for i, (row, n) in enumerate(zip(rows, counts, strict=True)):
        try:
            runs.append(ProblemRun(row, n, resolve_run(_problem_cfg(cfg, row, n))))
        except ConfigError as e:
            if not str(e).startswith("shape="):
                raise
            # the row's shape reached resolve_run as a shape= override: name the file and row instead
            raise ConfigError(f"{cfg.problems}: problems[{i}].{e}") from None
    # the largest share first: with search.transfer=auto the later, smaller problems start from the
    # winners of their neighbouring shapes (zhantune.search.transfer); ties keep the file's order
    weights = _weights(rows)
    order = sorted(range(len(runs)), key=lambda i: -weights[i])
    return [runs[i] for i in order]


def _weights(rows: list[dict[str, Any]]) -> list[float]:
    """Each problem's share of the model's GEMM time, as :func:`allocate_trials` weighs
    them (count x FLOPs for every problem when a share is missing)."""
    import math

    shares = [r.get("share") for r in rows]
    if any(w is None for w in shares) or not sum(shares):
        return [float(r.get("count", 1) * math.prod(r["shape"])) for r in rows]
    return [float(w) for w in shares]


def tune_problems(cfg: DictConfig, runs: list[ProblemRun], store: Any, console: Console) -> ProblemsResult:
    """Tune each problem of ``runs`` (from :func:`resolve_problems`) in turn, each in its own study,
    then export one table of these problems (other problems the database holds stay out of it)."""
    from zhantune.report import TuneProgress
    from zhantune.tune import tune

    out = ProblemsResult(runs)
    total = sum(r.n_trials for r in runs)
    measured = [_measured(store, r) for r in runs]  # a resumed run's earlier trials too (it said 0/6)
    for i, pr in enumerate(runs, 1):
        done = sum(measured)
        share = pr.row.get("share")
        header = (f"[bold]problem {i}/{len(runs)}[/bold] {escape(pr.run.problem.key)} x{pr.row.get('count', 1)}"
                  + (f" ({share:.0%} of the model's GEMM time)" if share else "")
                  + f": {pr.n_trials} trials; {done}/{total} done overall")
        if console.is_terminal:
            console.rule(header)
        else:  # a log or a pipe: the line whole (a rule cuts its title to the width)
            console.print(header, soft_wrap=True)
        pr.result = tune(pr.run, store, TuneProgress(console, pr.run.space) if cfg.progress else None)
        measured[i - 1] = _measured(store, pr)  # one query per problem, not every problem's at every header
        if pr.result.already_finished:
            r = pr.result
            held = (f"{r.before} of {r.target} trials measured" if r.before <= r.target
                    else f"{r.before} trials measured, this share {r.target}")
            console.print(f"study {escape(repr(r.study_name))} is finished ({held}): nothing to measure"
                          + (f"; its settles are due again, not run: {escape(r.settle_deferred)}"
                             if r.settle_deferred else ""), highlight=False)
        if pr.result.transfer_text:
            console.print(pr.result.transfer_text, markup=False)
        if pr.result.interrupted:
            out.interrupted = True
            return out
    if cfg.export.enabled:
        from zhantune.inductor.exporter import export_table

        # the file's problems only: the model's table, whatever else this database holds
        by_key = store.problems_by_key()
        ids = {by_key[r.run.problem.key].id for r in runs if r.run.problem.key in by_key}
        shipped: dict = {}  # what each problem's key ships, for its row of the problems table
        out.table_path, table = export_table(store, cfg.export, runs[0].run.device.key, problem_ids=ids, shipped=shipped)
        out.table_keys = list(table)
        out.other_keys = [(r.run.problem.key, r.row["lookup_key"], by_key[r.run.problem.key].lookup_key) for r in runs
                          if r.row.get("lookup_key") and r.run.problem.key in by_key
                          and by_key[r.run.problem.key].lookup_key not in (None, r.row["lookup_key"])]
        for dev in store.devices_with_candidates(runs[0].run.device.key):
            for r in runs:
                if r.result is not None and r.run.problem.key in by_key:
                    r.result.shipped = shipped.get((dev.id, by_key[r.run.problem.key].id))
    return out
