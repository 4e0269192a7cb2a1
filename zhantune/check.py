"""``python -m zhantune.check``: prove a table works for a model, and what it buys.

    python -m zhantune.check model=zhantune.models:mlp input_shapes=[[64,256]] table=zhantune_table.json

Compiles the model with the table (zhantune.use_table) and reports every GEMM lookup Inductor made:
hits, misses (with their keys) and stale entries (template_hash or torch version mismatch). Then it
compiles the model three ways, each a cold compile (Inductor's caches off) of its own copy in this
process after one untimed warm-up compile: with the table, with Inductor's default compile, and with
max-autotune; and times the three in ``rounds`` interleaved rounds (zhantune's timing protocol,
``bench.*``, a busy machine waited for and reported as in a tune). For each: compile time (seconds,
the first call), run time (microseconds: the fastest run over the rounds, the statistic every
zhantune decision uses, and the median), the paired ratio to the default with its per-round range,
and the largest relative error against eager. On CPU all three are the inference compile a user gets
(``freezing=True`` under ``no_grad``, oneDNN on: "default" runs the prepacked oneDNN / MKL linear);
the table changes only the GEMMs it covers, max-autotune lets Inductor pick per GEMM.

Exit codes: 0 when the share of lookups that hit is at least ``min_coverage`` (default 1.0), 1 when
it is below (gate CI on it), 2 for bad input (a malformed table, an unknown model).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import check_bench, register
from zhantune.errors import ConfigError, UserError

__all__ = ["main", "check_model"]

register()

#: exit code when coverage is under min_coverage
COVERAGE_EXIT_CODE = 1


def _compile(model: Any, inputs: tuple, device: Any, patch: dict[str, Any], table: Any = None) -> dict[str, Any]:
    """Compile a copy of ``model`` under ``patch`` (Inductor's caches off; ``table`` served through
    use_table while it compiles) and run it once: {"fn", "compile_s", "out", "report"}. Each way
    compiles its own copy, so that Dynamo keeps one graph per way and calling one never recompiles
    another."""
    import copy

    import torch
    from torch._inductor import config as inductor_config

    from zhantune.inductor.runtime import use_table

    mine = copy.deepcopy(model)
    installed = use_table(table, device.kind) if table is not None else None
    try:
        with torch.no_grad(), inductor_config.patch({**patch, "force_disable_caches": True}):
            compiled = torch.compile(mine)
            t0 = time.perf_counter()
            out = compiled(*inputs)
            if device.kind == "cuda":  # pragma: no cover - needs a GPU
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
    finally:
        if installed is not None:
            installed.remove()

    def fn() -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    return {"fn": fn, "compile_s": compile_s, "out": out, "report": installed.report if installed is not None else None}


def _time_once(fn: Any, device: Any, bench: Any) -> tuple[Any, dict[str, Any]]:
    """One timed measurement of ``fn`` (zhantune's protocol, microseconds) after the busy-machine
    back-off; returns (Timing, the conditions it was taken in)."""
    from zhantune.bench.conditions import conditions, wait_until_idle
    from zhantune.bench.timing import time_cpu, time_cuda

    waited = wait_until_idle(getattr(bench, "busy_wait_s", 0.0) or 0.0, device.kind, device.index)
    if device.kind == "cuda":  # pragma: no cover - needs a GPU
        timing = time_cuda(fn, warmup_ms=bench.warmup_ms, target_ms=bench.target_ms, cuda_graph=bench.cuda_graph)
    else:
        timing = time_cpu(fn, warmup_ms=bench.warmup_ms, target_ms=bench.target_ms, min_reps=bench.min_reps,
                          max_reps=bench.max_reps, flush_cache=bench.flush_cache,
                          nice=getattr(bench, "nice", None), fifo=getattr(bench, "fifo", False))
    return timing, {**conditions(device.kind, device.index), **waited}


def time_interleaved(fns: dict[str, Any], device: Any, bench: Any, rounds: int) -> tuple[dict[str, dict[str, Any]], Any]:
    """Time every way in ``rounds`` interleaved rounds (round r starts at way r mod n, so no way is
    always first). Per way: ``run_us`` the fastest run over all rounds (the decision statistic, as
    in a tune: one-sided noise cannot make it smaller), ``median_us`` the median of the per-round
    medians, ``rounds_us`` each round's fastest run. Returns (per way, ContentionCount)."""
    import statistics

    from zhantune.bench.conditions import ContentionCount, is_contended

    names = list(fns)
    timings: dict[str, list[Any]] = {n: [] for n in names}
    contention = ContentionCount()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            timing, seen = _time_once(fns[name], device, bench)
            timings[name].append(timing)
            contention = contention.add(seen, is_contended(seen), timing.method)
    out = {}
    for name, ts in timings.items():
        out[name] = {"run_us": min(t.min_us for t in ts), "median_us": statistics.median(t.median_us for t in ts),
                     "rounds_us": [t.min_us for t in ts], "n": sum(t.n for t in ts), "method": ts[0].method}
    return out, contention


def versus(way: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The paired comparison of a way with the default: ``ratio`` = default / way (each side's
    fastest run over the rounds; > 1: the way is faster), the per-round ratios' range, and
    ``consistent``: every round agrees on which is faster (ratios all above or all below 1)."""
    per_round = [d / w for d, w in zip(default["rounds_us"], way["rounds_us"], strict=True)]
    consistent = all(x > 1 for x in per_round) or all(x < 1 for x in per_round)
    return {"ratio": default["run_us"] / way["run_us"], "ratio_low": min(per_round), "ratio_high": max(per_round),
            "consistent": consistent}


def check_model(model: Any, inputs: tuple, device: Any, table: Any, bench: Any,
                max_autotune: bool = True, rounds: int = 5) -> dict[str, Any]:
    """Compile ``model`` with ``table`` (a TableFile), by default, and with max-autotune, then time
    the compiled ways in ``rounds`` interleaved rounds (:func:`time_interleaved`).

    Returns {"report": TableReport, "ways": {name: {compile_s, run_us, median_us, rounds_us, error,
    vs_default}}, "contention": ContentionCount}; run times in microseconds (``run_us``: the fastest
    run), compile times in seconds; ``error`` is the max relative error vs eager.
    """
    import torch

    from zhantune.bench.inductor import relative_error
    from zhantune.quiet import NO_AUTOTUNE_REPORT

    torch._dynamo.reset()
    with torch.no_grad():
        reference = model(*inputs).double()
    # max-autotune's AUTOTUNE tables on stderr off (zhantune prints its own report)
    base = {"freezing": True, **NO_AUTOTUNE_REPORT} if device.kind == "cpu" else dict(NO_AUTOTUNE_REPORT)
    # an untimed compile first, so that the process's one-time costs (Dynamo, Inductor's imports,
    # the C++ toolchain's first run) do not land on whichever way compiles first
    _compile(model, inputs, device, base)
    compiled = {"table": _compile(model, inputs, device, base, table), "default": _compile(model, inputs, device, base)}
    if max_autotune:
        compiled["max-autotune"] = _compile(model, inputs, device, {**base, "max_autotune": True})
    times, contention = time_interleaved({n: c["fn"] for n, c in compiled.items()}, device, bench, rounds)
    ways: dict[str, dict[str, Any]] = {}
    for name, c in compiled.items():
        ways[name] = {"compile_s": c["compile_s"], **times[name], "error": relative_error(c["out"], reference),
                      "vs_default": versus(times[name], times["default"])}
    return {"report": compiled["table"]["report"], "ways": ways, "contention": contention}


@hydra.main(version_base="1.3", config_path="conf", config_name="check")
def _check_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.paths import check_output_path
    from zhantune.request import check_model_request

    try:  # what needs no torch first (importing it takes seconds)
        if not cfg.table:
            raise ConfigError("no table given; use table=FILE (written by python -m zhantune or zhantune.export)")
        if not 0.0 <= cfg.min_coverage <= 1.0:
            raise ConfigError(f"min_coverage={cfg.min_coverage} must be in [0, 1]")
        if cfg.rounds < 1:
            raise ConfigError(f"rounds={cfg.rounds} must be at least 1 (interleaved timing rounds)")
        check_bench(cfg.bench)
        if cfg.json:
            check_output_path(cfg.json, "json")
        check_model_request(cfg)
    except UserError as e:
        user_error(e)
        return
    from rich.table import Table

    from zhantune.bench.measurement import TOLERANCES
    from zhantune.device import resolve_device
    from zhantune.inductor.table import read_table
    from zhantune.models import from_config
    from zhantune.report.console import make_console, print_table

    console = make_console()
    try:
        # a malformed table, or one setting anything but allow-listed knobs, stops here
        tf = read_table(cfg.table, resolve_device(cfg.device).kind)
        req = from_config(cfg)
        model, inputs, device, dtype = req.model, req.inputs, req.device, req.dtype
    except UserError as e:
        user_error(e)
        return
    result = check_model(model, inputs, device, tf, cfg.bench, cfg.max_autotune, cfg.rounds)
    report = result["report"]

    console.print(f"table {cfg.table}: {len(tf.table)} key(s)"
                  + (f", made with torch {tf.torch_version}" if tf.torch_version else ", no metadata (bare format)"))
    for key, n in report.hits.items():
        console.print(f"[green]hit[/green]   x{n} {key}\n      -> {report.chosen.get(key, '')}", soft_wrap=True)
    for key, n in report.misses.items():
        console.print(f"[red]miss[/red]  x{n} {key}", soft_wrap=True)
    for key, why in report.stale.items():
        console.print(f"[yellow]stale[/yellow] {key}: {why}", soft_wrap=True)
    tol = TOLERANCES[dtype]
    coverage = report.coverage or 0.0  # no lookup at all proves nothing
    t = Table(title=f"{cfg.model} on {device.name}: {report.lookups} GEMM lookup(s), coverage {coverage:.0%}")
    for col in ("compile", "compile s", "min us", "median us", "vs default (rounds)", "max rel error"):
        t.add_column(col, justify="left" if col == "compile" else "right")
    for name, w in result["ways"].items():
        ok = w["error"] <= tol
        v = w["vs_default"]
        vs = "1.00x" if name == "default" else (f"{v['ratio']:.2f}x ({v['ratio_low']:.2f}-{v['ratio_high']:.2f})"
                                                 + ("" if v["consistent"] else " ~"))
        t.add_row(name, f"{w['compile_s']:.2f}", f"{w['run_us']:,.1f}", f"{w['median_us']:,.1f}", vs,
                  f"{w['error']:.2e}" + ("" if ok else " [red]> tol[/red]"))
    print_table(console, t)
    console.print(f"run times: the fastest of {cfg.rounds} interleaved rounds per compile; vs default: default / "
                  "this, with the per-round range; ~: the rounds disagree on which is faster (noise, no difference "
                  "shown)")
    if result["contention"].text():
        console.print(f"[yellow]warning: {result['contention'].text()}[/yellow]")
    if cfg.json:
        c = result["contention"]
        doc = {"table": str(cfg.table), "model": cfg.model, "device": device.key, "report": report.as_dict(),
               "ways": result["ways"], "tolerance": tol, "rounds": cfg.rounds,
               "contention": {"timed": c.timed, "contended": c.contended, "waited_s": c.waited_s,
                              "shielded": c.shielded}}
        Path(cfg.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    wrong = [n for n, w in result["ways"].items() if not w["error"] <= tol]
    if wrong:
        console.print(f"[red]output differs from eager beyond tolerance {tol:g}: {', '.join(wrong)}[/red]")
        sys.exit(COVERAGE_EXIT_CODE)
    if report.note:
        console.print(f"[red]{report.note}[/red]")
        sys.exit(COVERAGE_EXIT_CODE)
    if coverage < cfg.min_coverage:
        console.print(f"[red]coverage {coverage:.0%} is below min_coverage {cfg.min_coverage:.0%}[/red]")
        sys.exit(COVERAGE_EXIT_CODE)
    console.print(f"coverage {coverage:.0%} (min_coverage {cfg.min_coverage:.0%}): ok")


def main() -> None:
    run_app(_check_app)


if __name__ == "__main__":
    main()
