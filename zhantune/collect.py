"""``python -m zhantune.collect``: every GEMM problem Inductor compiles for a model, as a problems file.

    python -m zhantune.collect model=zhantune.models:mlp input_shapes=[[64,256]] out=problems.yaml

The model is compiled once with Inductor's defaults under a recording choices handler
(zhantune.inductor.gemms.collect): every GEMM lowering asks the handler for its lookup-table
entries, so the keys are Inductor's own. Each distinct key becomes a problem (op,
shape, dtype, weight layout, scalars, the kernel inputs' sizes and strides, how many times the model
compiles it). With ``measure=true`` (default) each problem is compiled and timed alone with
Inductor's default compile (its fastest timed run, as every decision in zhantune: a busy machine only
adds time), and its ``share`` is count x time over the model's total: the tune of the file
(``python -m zhantune problems=problems.yaml``) spends its trials in that proportion. A busy machine
is waited for and reported as in a tune (zhantune.bench.conditions).

On CPU the compile is the inference compile a user gets (``freezing=True``, oneDNN on; see
zhantune.inductor.settings): a GEMM that Inductor's freezing pass prepacks makes no lookup, and the CPU
lowering hook (zhantune.inductor.cpu_gemm) reports it with Inductor's own key, the one a CPU table
is looked up with.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune.bench.conditions import ContentionCount
from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import UserError

__all__ = ["main"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="collect")
def _collect_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    from zhantune.request import check_model_request

    try:  # before torch is imported (seconds)
        check_model_request(cfg)
    except UserError as e:
        user_error(e)
        return
    import torch

    from zhantune.config import check_bench
    from zhantune.inductor.gemms import collect
    from zhantune.models import from_config
    from zhantune.paths import check_output_path
    from zhantune.problems.file import write_problems
    from zhantune.problemset import measure_defaults
    from zhantune.provenance import software_versions
    from zhantune.report.console import make_console
    from zhantune.torch_support import check_torch

    console = make_console()
    try:
        check_torch(what="zhantune.collect")
        check_output_path(cfg.out, "out")
        if cfg.measure:
            check_bench(cfg.bench)
        req = from_config(cfg)
        if req.cast_note:
            console.print(req.cast_note, markup=False, soft_wrap=True)
        model, inputs, device, dtype, shapes, kwargs = req.model, req.inputs, req.device, req.dtype, req.shapes, req.kwargs
        problems = collect(model, inputs, device)
        if not any(p.problem is not None for p in problems):
            raise UserError(f"model={cfg.model}: Inductor compiled no tunable GEMM "
                            f"({len(problems)} lookup(s): {[p.reason for p in problems]})")
        contention = (measure_defaults(problems, device, OmegaConf.to_object(cfg.bench)) if cfg.measure
                      else ContentionCount())
    except UserError as e:
        user_error(e)
        return
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - needs a GPU
        user_error(UserError(f"model={cfg.model}: out of memory: {str(e).splitlines()[0]}"))
        return
    header = {"model": cfg.model, "model_kwargs": kwargs, "input_shapes": shapes, "dtype": dtype,
              "device": {"key": device.key, "name": device.name, "kind": device.kind},
              **{k: None if v is None else str(v) for k, v in software_versions().items()}, "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    try:  # a full disk: one line, the old file left as it was
        out = write_problems(cfg.out, problems, header)
    except UserError as e:
        user_error(e)
        return
    _print_problems(console, f"GEMM problems of {cfg.model} on {device.name}", problems, contention)
    n = sum(1 for p in problems if p.problem is not None and p.reason is None)
    console.print(f"wrote {n} problem(s) to {out}; tune them with: python -m zhantune problems={out}", markup=False)


def _print_problems(console: Any, title: str, problems: list[Any], contention: ContentionCount) -> None:
    """One row per GEMM lookup: the problem's op (linear_act with its activation: linear_act:gelu;
    the lookup's op where not tunable), shape, weight layout, count, default time (us), share, note
    (why not tunable, or what the tune leaves out: CollectedProblem.note)."""
    from rich.markup import escape
    from rich.table import Table

    from zhantune.report.console import print_table

    t = Table(title=escape(title))
    for col in ("op", "shape", "weight", "count", "default min us", "share", "note"):
        t.add_column(col, justify="right" if col in ("count", "default min us", "share") else "left")
    for p in problems:
        g = p.problem
        op = (f"{g.op}:{g.activation}" if g.activation else g.op) if g else p.op_name
        t.add_row(op, str(list(g.shape)) if g else "-", g.weight_layout if g else "-", str(p.count),
                  f"{p.default_us:.1f}" if p.default_us else "-", f"{p.share:.0%}" if p.share else "-",
                  escape(p.reason or p.note or ""))
    print_table(console, t)
    busy = contention.text("each default time is its fastest run; the shares, and so the order problems= tunes "
                           "them in, may differ on an idle machine")
    if busy:
        console.print(f"[yellow]warning: {escape(busy)}[/yellow]")


def main() -> None:
    run_app(_collect_app)


if __name__ == "__main__":
    main()
