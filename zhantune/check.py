"""``python -m zhantune.check``: prove a table works for a model, and what it buys.

    python -m zhantune.check model=zhantune.models:mlp input_shapes=[[64,256]] table=zhantune_table.json

Compiles the model with the table (zhantune.use_table) and reports every GEMM lookup Inductor made:
hits, misses (with their keys) and stale entries (template_hash or torch version mismatch). Then it
times the model three ways, each a cold compile (Inductor's caches off) in this process after one
untimed warm-up compile: with the table, with Inductor's default compile, and with max-autotune. For each: compile time (seconds, the
first call) and run time (microseconds, median, zhantune's timing protocol, ``bench.*``), and the
largest relative error against eager. On CPU all three are the inference compile a user gets
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


def _compile_and_time(model: Any, inputs: tuple, device: Any, bench: Any, patch: dict[str, Any],
                      table: Any = None) -> dict[str, Any]:
    import torch
    from torch._inductor import config as inductor_config

    from zhantune.bench.timing import time_cpu, time_cuda
    from zhantune.inductor.runtime import use_table

    torch._dynamo.reset()
    installed = use_table(table, device.kind) if table is not None else None
    try:
        with torch.no_grad(), inductor_config.patch({**patch, "force_disable_caches": True}):
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            out = compiled(*inputs)
            if device.kind == "cuda":  # pragma: no cover - needs a GPU
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            if device.kind == "cuda":  # pragma: no cover - needs a GPU
                timing = time_cuda(lambda: compiled(*inputs), warmup_ms=bench.warmup_ms, target_ms=bench.target_ms,
                                   cuda_graph=bench.cuda_graph)
            else:
                timing = time_cpu(lambda: compiled(*inputs), warmup_ms=bench.warmup_ms, target_ms=bench.target_ms,
                                  min_reps=bench.min_reps, max_reps=bench.max_reps, flush_cache=bench.flush_cache,
                                  nice=getattr(bench, "nice", None), fifo=getattr(bench, "fifo", False))
    finally:
        if installed is not None:
            installed.remove()
    return {"compile_s": compile_s, "run_us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us,
            "n": timing.n, "out": out, "report": installed.report if installed is not None else None}


def check_model(model: Any, inputs: tuple, device: Any, table: Any, bench: Any,
                max_autotune: bool = True) -> dict[str, Any]:
    """Compile and time ``model`` with ``table`` (a TableFile), by default, and with max-autotune.

    Returns {"report": TableReport, "ways": {name: {compile_s, run_us, error, ...}}}; run times in
    microseconds (median), compile times in seconds; ``error`` is the max relative error vs eager.
    """
    import torch

    from zhantune.bench.inductor import relative_error

    with torch.no_grad():
        reference = model(*inputs).double()
    base = {"freezing": True} if device.kind == "cpu" else {}
    # an untimed compile first, so that the process's one-time costs (Dynamo, Inductor's imports,
    # the C++ toolchain's first run) do not land on whichever way is timed first
    _compile_and_time(model, inputs, device, bench, base)
    ways: dict[str, dict[str, Any]] = {}
    table_run = _compile_and_time(model, inputs, device, bench, base, table)
    ways["table"] = table_run
    ways["default"] = _compile_and_time(model, inputs, device, bench, base)
    if max_autotune:
        ways["max-autotune"] = _compile_and_time(model, inputs, device, bench, {**base, "max_autotune": True})
    report = table_run["report"]
    for w in ways.values():
        w["error"] = relative_error(w.pop("out"), reference)
        w.pop("report")
    return {"report": report, "ways": ways}


@hydra.main(version_base="1.3", config_path="conf", config_name="check")
def _check_app(cfg: DictConfig) -> None:
    mark_task_started()
    from rich.console import Console
    from rich.table import Table

    from zhantune.bench.measurement import TOLERANCES
    from zhantune.device import resolve_device
    from zhantune.inductor.table import read_table
    from zhantune.models import from_config
    from zhantune.paths import check_output_path

    console = Console()
    try:
        if not cfg.table:
            raise ConfigError("no table given; use table=FILE (written by python -m zhantune or zhantune.export)")
        if not 0.0 <= cfg.min_coverage <= 1.0:
            raise ConfigError(f"min_coverage={cfg.min_coverage} must be in [0, 1]")
        check_bench(cfg.bench)
        if cfg.json:
            check_output_path(cfg.json, "json")
        # a malformed table, or one setting anything but allow-listed knobs, stops here
        tf = read_table(cfg.table, resolve_device(cfg.device).kind)
        req = from_config(cfg)
        model, inputs, device, dtype = req.model, req.inputs, req.device, req.dtype
    except UserError as e:
        user_error(e)
        return
    result = check_model(model, inputs, device, tf, cfg.bench, cfg.max_autotune)
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
    for col in ("compile", "compile s", "run us (median)", "p20-p80 us", "vs default", "max rel error"):
        t.add_column(col, justify="left" if col == "compile" else "right")
    default_us = result["ways"]["default"]["run_us"]
    for name, w in result["ways"].items():
        ok = w["error"] <= tol
        t.add_row(name, f"{w['compile_s']:.2f}", f"{w['run_us']:,.1f}", f"{w['p20_us']:,.1f}-{w['p80_us']:,.1f}",
                  f"{default_us / w['run_us']:.2f}x", f"{w['error']:.2e}" + ("" if ok else " [red]> tol[/red]"))
    console.print(t)
    if cfg.json:
        doc = {"table": str(cfg.table), "model": cfg.model, "device": device.key, "report": report.as_dict(),
               "ways": result["ways"], "tolerance": tol}
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
