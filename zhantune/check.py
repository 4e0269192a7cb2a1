"""``python -m zhantune.check``: prove a table works for a model, and what it buys.

    python -m zhantune.check model=zhantune.models:mlp input_shapes=[[64,256]] table=zhantune_table.json

Compiles the model with the table (zhantune.use_table; zhantune.bench.model_check) and reports every GEMM lookup Inductor made:
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
it is below (gate CI on it), 2 for bad input (a malformed table, an unknown model). The share is of
the lookups a table can serve: a GEMM zhantune cannot tune (attention's bmm on CPU, reported "not
tunable" with the reason) is left out of it, and the report gives both shares.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import check_bench, register
from zhantune.errors import ConfigError, UserError
from zhantune.paths import write_atomic

__all__ = ["main"]

register()

#: exit code when coverage is under min_coverage
COVERAGE_EXIT_CODE = 1
#: why coverage is none in check (TableReport.note's "served from Inductor's cache" cannot be: caches are off)
NO_LOOKUP = ("no GEMM lookup seen: the model's compile made none (no mm, addmm or bmm Inductor looks up; check "
             "compiles with Inductor's caches off)")


def _check_options(cfg: DictConfig) -> None:
    """What needs no torch (importing it takes seconds); raises ConfigError."""
    from zhantune.paths import check_output_path
    from zhantune.request import check_file, check_model_request

    if not cfg.table:
        raise ConfigError("no table given; use table=FILE (written by python -m zhantune or zhantune.export)")
    check_file(cfg.table, "table")  # 'nope.json: cannot read' named no option
    if not 0.0 <= cfg.min_coverage <= 1.0:
        raise ConfigError(f"min_coverage={cfg.min_coverage} must be in [0, 1]")
    if cfg.rounds < 1:
        raise ConfigError(f"rounds={cfg.rounds} must be at least 1 (interleaved timing rounds)")
    check_bench(cfg.bench)
    if cfg.json:
        check_output_path(cfg.json, "json", {"table": cfg.table})
    check_model_request(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="check")
def _check_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    try:
        _check_options(cfg)
    except UserError as e:
        user_error(e)
        return
    from zhantune.bench.measurement import TOLERANCES
    from zhantune.bench.model_check import CompileFailed, check_model
    from zhantune.device import resolve_device
    from zhantune.inductor.table import read_table_option
    from zhantune.models import from_config
    from zhantune.report.console import make_console
    from zhantune.torch_support import check_torch

    console = make_console()
    try:
        check_torch(what="zhantune.check")
        # a malformed table, or one setting anything but allow-listed knobs, stops here
        tf = read_table_option(cfg.table, resolve_device(cfg.device).kind)
        req = from_config(cfg)
    except UserError as e:
        user_error(e)
        return
    if req.cast_note:
        console.print(req.cast_note, markup=False, soft_wrap=True)
    try:
        result = check_model(req.model, req.inputs, req.device, tf, OmegaConf.to_object(cfg.bench), cfg.max_autotune,
                             cfg.rounds)
    except UserError as e:  # a model that returns no tensor
        user_error(f"model={cfg.model}: {e}")
        return
    except CompileFailed as e:
        _compile_failed(console, cfg, e, req.device)
    tol = TOLERANCES[req.dtype]
    _print_report(console, cfg, tf, req.device, result, tol)
    if cfg.json:
        _write_json(cfg, req.device, result, tol)
    code = _verdict(console, cfg, result, tol)
    if code:
        sys.exit(code)


def _served_lines(report: Any, key: str) -> list[str]:
    """Check's lines for what a hit of ``key`` compiled, the entries it left out and a note (rich markup)."""
    from rich.markup import escape

    return ([f"      -> {escape(str(report.chosen.get(key, '')))}"]
            + ([f"      [yellow]{escape(report.dropped[key])}[/yellow]"] if key in report.dropped else [])
            + ([f"      note: {escape(report.notes[key])}"] if key in report.notes else []))


def _print_report(console: Any, cfg: DictConfig, tf: Any, device: Any, result: dict[str, Any], tol: float) -> None:
    """The lookups (hit, miss, stale, by key) and one row per compile: compile time (s), fastest and
    median run (us), the paired ratio to the default with its per-round range, the error vs eager."""
    from rich.markup import escape
    from rich.table import Table

    from zhantune.report.console import print_table

    report = result["report"]
    console.print(f"table {tf.source or cfg.table}: {len(tf.table)} key(s)"  # source: one line (JSON if need be)
                  + (f", made with torch {tf.torch_version}" if tf.torch_version else ", no metadata (bare format)")
                  + (f"; {len(tf.other_kind)} key(s) of {'/'.join(sorted(set(tf.other_kind.values())))} devices left "
                     "out (another kind of device)" if tf.other_kind else ""),
                  markup=False)
    for key, n in report.hits.items():
        lines = [f"[green]hit[/green]   x{n} {escape(key)}", *_served_lines(report, key)]
        for other in (k for k, counted in report.also.items() if counted == key):  # the GEMM's other lookup
            lines += [f"      and its other lookup {escape(other)}", *_served_lines(report, other)]
        console.print("\n".join(lines), soft_wrap=True)
    print_misses(console, cfg, report, tf.table)
    for key, why in report.stale.items():
        console.print(f"[yellow]stale[/yellow] {escape(key)}: {escape(why)}", soft_wrap=True)
    t = Table(title=escape(f"{cfg.model} on {device.name}: {report.lookups} GEMM lookup(s), {_coverage_text(report)}"))
    for col in ("compile", "compile s", "min us", "median us", "vs default (rounds)", "max rel error"):
        t.add_column(col, justify="left" if col == "compile" else "right")
    for name, w in result["ways"].items():
        v = w["vs_default"]
        rng = f"({v['ratio_low']:.2f}-{v['ratio_high']:.2f})"
        vs = "1.00x" if name == "default" else (f"{v['ratio']:.2f}x {rng}" if v["consistent"] else f"~ {rng}")
        t.add_row(name, f"{w['compile_s']:.2f}", f"{w['run_us']:,.1f}", f"{w['median_us']:,.1f}", vs,
                  f"{w['error']:.2e}" + ("" if w["error"] <= tol else " [red]> tol[/red]"))
    print_table(console, t)
    console.print(f"run times: the fastest of {cfg.rounds} interleaved rounds per compile; vs default: default / "
                  "this, the median of the rounds (a round's ways one after another), with the per-round range; "
                  "~ (range): no difference shown, only the rounds' range: they disagree on which is faster, or too "
                  "much for the difference they show, or there is one round, or a round began on a busy machine "
                  "or ran contended without SCHED_FIFO, as a tune's claim may not (noise could have made it)")
    for name, w in result["ways"].items():  # why each "~" (a helper read a same-code table's 0.79 as a slowdown)
        if name != "default" and not w["vs_default"]["consistent"]:
            console.print(f"{name}: no difference shown: {w['vs_default']['reason']}", soft_wrap=True, markup=False,
                          highlight=False)
    for name, why in result.get("failed", {}).items():  # Inductor's own max-autotune: not the table's doing
        console.print(f"[yellow]{name}: left out, its compile fails ({escape(why)})[/yellow]", soft_wrap=True)
    if result["contention"].text():
        console.print(f"[yellow]warning: {result['contention'].text()}[/yellow]")


def _write_json(cfg: DictConfig, device: Any, result: dict[str, Any], tol: float) -> None:
    c = result["contention"]
    report = result["report"].as_dict()
    if report["note"]:  # check compiles cold: not "served from Inductor's cache" (a review)
        report["note"] = NO_LOOKUP
    _write_doc(cfg, device, report=report, ways=result["ways"], recompile_limit=result.get("recompile_limit", []),
               tolerance=tol, rounds=cfg.rounds, failed=result.get("failed", {}),
               contention={"timed": c.timed, "contended": c.contended, "waited_s": c.waited_s,
                           "shielded": c.shielded})


def _write_doc(cfg: DictConfig, device: Any, **fields: Any) -> None:
    """The JSON report at ``json=``: table, model, device key, then ``fields``; a full disk is one line
    (exit 2), the old file left as it was."""
    doc = {"table": str(cfg.table), "model": cfg.model, "device": device.key, **fields}
    try:
        write_atomic(cfg.json, json.dumps(doc, indent=2) + "\n", "json")
    except UserError as e:
        user_error(e)


def _verdict(console: Any, cfg: DictConfig, result: dict[str, Any], tol: float) -> int:
    """0 when every way is correct and coverage reaches min_coverage; COVERAGE_EXIT_CODE otherwise."""
    from rich.markup import escape

    report = result["report"]
    wrong = [n for n, w in result["ways"].items() if not w["error"] <= tol]
    if wrong:
        console.print(f"[red]output differs from eager beyond tolerance {tol:g}: {', '.join(wrong)}[/red]")
        return COVERAGE_EXIT_CODE
    again = {n: w["recompiles"] for n, w in result["ways"].items() if w.get("recompiles")}
    if again:  # a helper's model (forward does self.n += 1) recompiled without the table, then ran eager
        console.print("[red]the model compiled again while it was timed ("
                      + ", ".join(f"{n}: {k} time(s)" for n, k in again.items()) + "): the timed code is not the "
                      "compile checked, nor the table's (check times a model whose compiled graph a second call "
                      "reuses: a forward that changes its own state, or inputs its guards fail on, recompiles)[/red]")
        return COVERAGE_EXIT_CODE
    if result.get("recompile_limit"):  # a frame ran uncompiled in some way (a review's submodule case)
        console.print("[red]Dynamo hit its recompile limit during the check (" + escape(", ".join(result["recompile_limit"]))
                      + "): part of the model ran uncompiled in some way; its timings are not the compiled model's"
                      "[/red]", soft_wrap=True)
        return COVERAGE_EXIT_CODE
    if report.note:  # check compiles cold (caches off): no lookup is the model's own
        console.print(f"[red]{NO_LOOKUP}[/red]")
        return COVERAGE_EXIT_CODE
    if report.tunable_coverage is None and cfg.min_coverage > 0:  # every lookup one no table serves
        console.print(f"[red]none of the {report.lookups} GEMM lookup(s) is one a table can serve (each is not "
                      "tunable, above): the table changes nothing in this model[/red]")
        return COVERAGE_EXIT_CODE
    if (report.tunable_coverage or 0.0) < cfg.min_coverage:
        console.print(f"[red]{_coverage_text(report)} is below min_coverage {_pct(cfg.min_coverage)}[/red]")
        return COVERAGE_EXIT_CODE
    console.print(f"{_coverage_text(report)} (min_coverage {_pct(cfg.min_coverage)}): ok")
    return 0


def _pct(share: float) -> str:
    """A share as a percentage rounded down to 0.1 (199 of 200 is "99.5%", never "100%"), "100%" only whole."""
    return f"{math.floor(share * 1000 + 1e-9) / 10:g}%"


def _coverage_text(report: Any) -> str:
    """"coverage 75%", and where some lookups are of GEMMs no table can serve (not tunable: attention's
    bmm on CPU), the share of the others, which min_coverage gates: "coverage 75% (100% of the 3 a
    table can serve)"."""
    text = f"coverage {_pct(report.coverage or 0.0)}"  # no lookup at all proves nothing
    if report.untunable_lookups:
        text += (f" ({_pct(report.tunable_coverage or 0.0)} of the {report.tunable_lookups} a table can serve)"
                 if report.tunable_lookups else " (none a table can serve)")
    return text


def _compile_failed(console: Any, cfg: DictConfig, e: Any, device: Any) -> None:
    """Exit 2 where Inductor's default compile of the model fails (check needs a model it compiles),
    else 1 with the lookups the table served and one line of the error; with ``json=`` the report says
    which compile failed and how ("failed")."""
    from rich.markup import escape

    if e.way == "default":
        user_error(f"model={cfg.model}: Inductor's default compile of it fails ({e.what}); check compares "
                   "compiles of a model torch.compile compiles")
    hits = dict(e.report.hits) if e.report is not None else {}
    for key, n in hits.items():
        console.print(f"hit   x{n} {key}\n      -> {e.report.chosen.get(key, '')}", markup=False, soft_wrap=True)
    console.print(f"[red]the compile with the table fails where Inductor's default compiles: {escape(e.what)}; "
                  + ("the table breaks this model (an Inductor bug its entries reach: leave their keys out of the "
                     "table, and report it to zhantune)" if hits else "no entry of the table was served (a failure "
                     "of Inductor's own, not the table's entries)") + "[/red]", soft_wrap=True)
    if cfg.json:
        _write_doc(cfg, device, report=e.report.as_dict() if e.report is not None else None, ways={},
                   failed={e.way: e.what})
    sys.exit(COVERAGE_EXIT_CODE)


def print_misses(console: Any, cfg: Any, report: Any, table: dict[str, Any] | None = None) -> None:
    """Each missed key (``report``: a TableReport), with why where no table can serve it (its GEMM is
    not tunable: TableReport.untunable) or where ``table`` has the GEMM under another device's key,
    then the hint to collect and tune the model's lookups where a miss is one collect lists (a
    helper's: the hint was given for GEMMs collect leaves out)."""
    from rich.markup import escape

    for key, n in report.misses.items():
        others = _other_devices(key, table or {})
        console.print(f"[red]miss[/red]  x{n} {escape(key)}" + (f"\n      not tunable: {escape(report.untunable[key])}; "
                                                              "no table serves it" if key in report.untunable else "")
                      + (f"\n      the table has this GEMM for another device: {escape(', '.join(others))} (a CPU's "
                         "device key names the threads Inductor compiles for: torch.set_num_threads, OMP_NUM_THREADS, "
                         "taskset; a GPU's, its name)" if others else ""), soft_wrap=True)
    if set(report.misses) - set(report.untunable):
        console.print(_miss_hint(cfg), soft_wrap=True, markup=False, highlight=False)


def _other_devices(key: str, table: dict[str, Any]) -> list[str]:
    """The device keys under which ``table`` holds the lookup of the device-specific ``key`` (a key is
    ``device key+((inputs))+...``, torch/_inductor/lookup_table/choices.py), another device's only (a
    helper's: a table tuned at 2 threads and used at 1 missed everywhere, and the hint blamed the shapes)."""
    device, sep, rest = key.partition("+((")
    if not sep:
        return []
    return sorted({k.partition("+((")[0] for k in table if k.partition("+((")[2] == rest and k.partition("+((")[0]
                   not in ("", device)})


def _miss_hint(cfg: Any) -> str:
    """What a miss means and how to tune exactly the model's lookups (collect, then problems=)."""
    import shlex

    from zhantune.cli import override_arg

    def arg(key: str) -> str:  # a list or a dict as Hydra's grammar reads it, quoted for the shell
        value = OmegaConf.to_container(cfg[key])
        return shlex.quote(f"{key}={str(value).replace(' ', '').replace(chr(39), '')}")

    extra = f" {arg('model_kwargs')}" if cfg.get("model_kwargs") else ""
    return ("a miss: the table has no entry under that key (Inductor's key is the GEMM's op and each input's dtype, "
            "sizes and strides, exactly: an nn.Linear's weight is transposed, weight_layout=nk, and its bias makes the "
            "lookup addmm); to tune this model's own lookups: python -m zhantune.collect "
            f"{override_arg('model', str(cfg.model))}{extra} {arg('input_shapes')} out=problems.yaml, then python -m zhantune "
            "problems=problems.yaml")



def main() -> None:
    run_app(_check_app)


if __name__ == "__main__":
    main()

