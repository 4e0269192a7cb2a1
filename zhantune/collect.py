"""``python -m zhantune.collect``: every GEMM problem Inductor compiles for a model, as a problems file.

    python -m zhantune.collect model=zhantune.models:mlp input_shapes=[[64,256]] out=problems.yaml

The model is compiled once with Inductor's defaults under a recording choices handler
(:class:`zhantune.inductor.choices.RecordingChoices`): every GEMM lowering asks the handler for its
lookup-table entries, so the keys are Inductor's own. Each distinct key becomes a problem (op,
shape, dtype, weight layout, scalars, the kernel inputs' sizes and strides, how many times the model
compiles it). With ``measure=true`` (default) each problem is compiled and timed alone with
Inductor's default compile (its fastest timed run, as every decision in zhantune: a busy machine only
adds time), and its ``share`` is count x time over the model's total: the tune of the file
(``python -m zhantune problems=problems.yaml``) spends its trials in that proportion. A busy machine
is waited for and reported as in a tune (zhantune.bench.conditions).

On CPU the compile is the inference compile a user gets (``freezing=True``, oneDNN on; see
zhantune.bench.inductor): a GEMM that Inductor's freezing pass prepacks makes no lookup, and the CPU
lowering hook (zhantune.inductor.cpu_gemm) reports it with Inductor's own key, the one a CPU table
is looked up with.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune.bench.conditions import ContentionCount
from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, UserError

__all__ = ["main", "CollectedProblem", "collect", "problem_from_event", "write_problems", "read_problems"]

PROBLEMS_FORMAT = "zhantune-problems"

register()


@dataclass
class CollectedProblem:
    """One distinct GEMM lookup of a model: the problem to tune, or why it cannot be tuned."""

    lookup_key: str
    op_name: str
    inputs: list[list[Any]]
    scalars: dict[str, Any]
    count: int
    problem: Any = None  # GemmProblem, or None when not tunable
    reason: str | None = None
    default_us: float | None = None
    share: float | None = None


def problem_from_event(event: Any, dtype_names: dict[str, str]) -> tuple[Any, str | None]:
    """The GemmProblem whose own compile makes the same lookup key, or (None, why not).

    Tunable: mm / addmm with a contiguous [M, K] activation and a [K, N] weight stored row-major
    ("kn") or as nn.Linear's [N, K] transposed ("nk"), addmm with a [N] bias and alpha = beta = 1;
    bmm with contiguous [B, M, K] and [B, K, N].
    """
    from zhantune.problems import GemmProblem

    ins = event.inputs
    dtypes = {d for d, _, _ in ins}
    if len(dtypes) != 1 or next(iter(dtypes)) not in dtype_names:
        return None, f"input dtypes {sorted(dtypes)} (tunable: one of {sorted(dtype_names)})"
    dtype = dtype_names[next(iter(dtypes))]
    scalars = dict(event.scalars)
    op = event.op_name
    if op == "bmm" and len(ins) == 2:
        (_, (b, m, k), s1), (_, (b2, k2, n), s2) = ins
        if b == b2 and k == k2 and list(s1) == [m * k, k, 1] and list(s2) == [k * n, n, 1]:
            return GemmProblem("bmm", (b, m, n, k), dtype), None
        return None, "bmm operands are not contiguous [B, M, K] and [B, K, N]"
    if op == "mm" and len(ins) == 2:
        x, w = ins
        bias = None
    elif op == "addmm" and len(ins) == 3:
        bias, x, w = ins
        if scalars and (scalars.get("alpha", 1) != 1 or scalars.get("beta", 1) != 1):
            return None, f"addmm with alpha/beta {scalars} (tunable: 1 and 1)"
    else:
        return None, f"op {op} with {len(ins)} inputs is not a GEMM zhantune tunes"
    (_, (m, k), sx), (_, (k2, n), sw) = x, w
    if k != k2 or list(sx) != [k, 1]:
        return None, f"activation [M, K] with strides {list(sx)} (tunable: contiguous)"
    if list(sw) == [n, 1]:
        layout = "kn"
    elif list(sw) == [1, k]:
        layout = "nk"
    else:
        return None, f"weight [K, N] with strides {list(sw)} (tunable: [N, 1] or [1, K])"
    if bias is not None and (list(bias[1]) != [n] or list(bias[2]) != [1]):
        return None, f"addmm bias of size {list(bias[1])} (tunable: [N])"
    return GemmProblem(op, (m, n, k), dtype, weight_layout=layout), None


def collect(model: Any, inputs: tuple, device: Any) -> list[CollectedProblem]:
    """Compile ``model`` on ``device`` (a DeviceInfo) with Inductor's defaults and return its GEMM
    problems, one per distinct lookup key, in first-seen order."""
    import torch
    from torch._inductor import config as inductor_config

    from zhantune.bench.inductor import CPU_BASE_PATCH, CUDA_BASE_PATCH
    from zhantune.inductor.choices import recording
    from zhantune.problems import DTYPES

    dtype_names = {str(t).removeprefix("torch."): name for name, t in DTYPES.items()}
    patch = CPU_BASE_PATCH if device.kind == "cpu" else CUDA_BASE_PATCH
    torch._dynamo.reset()
    with torch.no_grad(), recording() as rec, inductor_config.patch(patch):
        torch.compile(model, fullgraph=False)(*inputs)
    found: dict[str, CollectedProblem] = {}
    for e in rec.events:
        if not e.offered:  # a pass with nothing to choose (addmm's expanded-bias pass)
            continue
        key = e.agnostic_key or e.device_key
        if key in found:
            found[key].count += 1
            continue
        problem, reason = problem_from_event(e, dtype_names)
        found[key] = CollectedProblem(key, e.op_name, [[d, list(s), list(st)] for d, s, st in e.inputs],
                                      dict(e.scalars), 1, problem, reason)
    return list(found.values())


def measure_defaults(problems: list[CollectedProblem], device: Any, bench: Any) -> ContentionCount:
    """Time each tunable problem's default compile and set ``default_us`` (microseconds, the decision
    statistic: the fastest of its individually timed runs, zhantune.storage.store.decision_us, which
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


def write_problems(path: str | Path, problems: list[CollectedProblem], header: dict[str, Any]) -> Path:
    """Write the problems file (YAML); ``header`` names the model, inputs, device and versions."""
    tunable, skipped = [], []
    for p in problems:
        row: dict[str, Any] = {"lookup_key": p.lookup_key, "count": p.count, "inputs": p.inputs}
        if p.scalars:
            row["scalars"] = p.scalars
        if p.problem is not None and p.reason is None:
            g = p.problem
            tunable.append({"op": g.op, "shape": list(g.shape), "dtype": g.dtype,
                            "weight_layout": g.weight_layout, **row, "default_us": p.default_us,
                            "share": p.share})
        else:
            skipped.append({"op": p.op_name, **row, "reason": p.reason})
    doc = {"format": PROBLEMS_FORMAT, "format_version": 1, **header, "problems": tunable, "skipped": skipped}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(doc)), encoding="utf-8")
    return path


def read_problems(path: str | Path) -> list[dict[str, Any]]:
    """The tunable problems of a problems file, checked; raises ConfigError naming the file and the
    key path (``problems.yaml: problems[1].shape: ...``)."""
    from zhantune.problems import OPS, GemmProblem

    try:
        doc = OmegaConf.to_container(OmegaConf.load(path))
    except FileNotFoundError:
        raise ConfigError(f"problems={path}: no such file") from None
    except Exception as e:
        raise ConfigError(f"problems={path}: not a YAML problems file: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != PROBLEMS_FORMAT:
        raise ConfigError(f"{path}: format: expected {PROBLEMS_FORMAT!r} (write the file with python -m zhantune.collect)")
    rows = doc.get("problems")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: problems: expected a non-empty list")
    out = []
    for i, row in enumerate(rows):
        at = f"{path}: problems[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(f"{at}: expected a mapping")
        if row.get("op") not in OPS:
            raise ConfigError(f"{at}.op: {row.get('op')!r}; allowed: {', '.join(sorted(OPS))}")
        GemmProblem.from_config(row["op"], row.get("shape"), row.get("dtype", "float32"),
                                source=f"{at}.shape", weight_layout=row.get("weight_layout", "kn"))
        for name in ("count",):
            if not isinstance(row.get(name, 1), int) or row.get(name, 1) < 1:
                raise ConfigError(f"{at}.{name}: {row.get(name)!r} must be a positive integer")
        share = row.get("share")
        if share is not None and (not isinstance(share, (int, float)) or not 0 <= share <= 1):
            raise ConfigError(f"{at}.share: {share!r} must be a number in [0, 1] or null")
        out.append(row)
    return out


def allocate_trials(rows: list[dict[str, Any]], total: int, min_trials: int) -> list[int]:
    """Trials per problem: ``total`` in proportion to ``share`` (count x FLOPs where shares are
    missing), at least ``min_trials`` each (largest remainders get the rounding)."""
    import math

    weights = [r.get("share") for r in rows]
    if any(w is None for w in weights) or not sum(weights):
        weights = [r.get("count", 1) * math.prod(r["shape"]) for r in rows]
    s = sum(weights)
    raw = [total * w / s for w in weights]
    counts = [max(min_trials, math.floor(x)) for x in raw]
    left = total - sum(counts)
    for i in sorted(range(len(rows)), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True):
        if left <= 0:
            break
        counts[i] += 1
        left -= 1
    return counts


@hydra.main(version_base="1.3", config_path="conf", config_name="collect")
def _collect_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.request import check_model_request

    try:  # before torch is imported (seconds)
        check_model_request(cfg)
    except UserError as e:
        user_error(e)
        return
    import torch
    from rich.table import Table

    from zhantune.config import check_bench
    from zhantune.models import from_config
    from zhantune.paths import check_output_path
    from zhantune.report.console import make_console, print_table
    from zhantune.tune import software_versions

    console = make_console()
    try:
        check_output_path(cfg.out, "out")
        if cfg.measure:
            check_bench(cfg.bench)
        req = from_config(cfg)
        model, inputs, device, dtype, shapes, kwargs = req.model, req.inputs, req.device, req.dtype, req.shapes, req.kwargs
        problems = collect(model, inputs, device)
        if not any(p.problem is not None for p in problems):
            raise UserError(f"model={cfg.model}: Inductor compiled no tunable GEMM "
                            f"({len(problems)} lookup(s): {[p.reason for p in problems]})")
        contention = measure_defaults(problems, device, cfg.bench) if cfg.measure else ContentionCount()
    except UserError as e:
        user_error(e)
        return
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - needs a GPU
        user_error(UserError(f"model={cfg.model}: out of memory: {str(e).splitlines()[0]}"))
        return
    header = {"model": cfg.model, "model_kwargs": kwargs, "input_shapes": shapes, "dtype": dtype,
              "device": {"key": device.key, "name": device.name, "kind": device.kind},
              **{k: None if v is None else str(v) for k, v in software_versions().items()}, "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    out = write_problems(cfg.out, problems, header)
    t = Table(title=f"GEMM problems of {cfg.model} on {device.name}")
    for col in ("op", "shape", "weight", "count", "default min us", "share", "note"):
        t.add_column(col, justify="right" if col in ("count", "default min us", "share") else "left")
    for p in problems:
        g = p.problem
        t.add_row(p.op_name, str(list(g.shape)) if g else "-", g.weight_layout if g else "-", str(p.count),
                  f"{p.default_us:.1f}" if p.default_us else "-", f"{p.share:.0%}" if p.share else "-",
                  p.reason or "")
    print_table(console, t)
    if contention.text():
        console.print(f"[yellow]warning: {contention.text()}[/yellow]")
    n = sum(1 for p in problems if p.problem is not None and p.reason is None)
    console.print(f"wrote {n} problem(s) to {out}; tune them with: python -m zhantune problems={out}")


def main() -> None:
    run_app(_collect_app)


if __name__ == "__main__":
    main()
