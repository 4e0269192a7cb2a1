"""The CUDA path end to end, on a machine with a GPU: one command, one table.

    .venv/bin/python scripts/gpu_check.py [--trials 6] [--device cuda:0] [--out gpu_check]
        [--problems mm:bfloat16,addmm:float32,...] [--budget-s SECONDS]

For mm, addmm, bmm and linear_act (relu) in bfloat16 and float32, at one small size each:

1. **tune** (``python -m zhantune``, the real CLI) with every CUDA space that applies
   (aten_template, triton_mm or triton_bmm, triton_persistent_tma, decompose_k; tf32 for float32),
   ``search.n_trials`` small, into one SQLite database;
2. **check** the stored trials: no trial of a template branch that Inductor's lowering offers for
   the problem on this GPU (zhantune.runspec.cuda_offered_uids) may be ``not_applied`` (a candidate
   that did not apply would be a measurement of something else), and every problem has an ``ok``
   default and an ``ok`` best candidate;
3. **export** the table (``python -m zhantune.export``, both formats);
4. **load** it in a fresh process: each problem compiled with ``zhantune.use_table(device="cuda")``
   (every key hit, the output correct) and with stock Inductor (its own ``LookupTableChoices``,
   ``max_autotune_gemm=True``, ``lookup_table.table`` set: at least one of its lookups finds the
   problem's entry, the output correct; addmm's other lookup may miss, zhantune.inductor.stock).

Prints one row per problem (trials by status, best config, the settled speedup claim, use_table
and stock Inductor hits) and exits 1 when a check fails, 2 without a CUDA device. Record its output
in the README's "Which paths have run on a GPU". It has run twice, on an H200 whose image had torch
2.11 (docs/gpu_runs/: its output; README: what ran, what failed and why); it needs torch >= 2.13
(zhantune.torch_support) and exits 2 on an older one. ``--problems`` and ``--budget-s`` fit it to
a short GPU lease.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

#: op -> (shape, spaces besides aten_template); small sizes where Inductor offers every branch listed
#: (mm: decomposeK needs K >= 32 * max(M, N), Triton mm K < 64 * max(M, N); the dry run shows it)
PROBLEMS = {
    "mm": ([64, 64, 2048], ["triton_mm", "triton_persistent_tma", "decompose_k"]),
    "addmm": ([256, 256, 256], ["triton_mm", "triton_persistent_tma"]),
    "bmm": ([4, 128, 128, 128], ["triton_bmm"]),
    "linear_act": ([256, 256, 512], ["triton_mm", "triton_persistent_tma"]),  # not addmm's key
}
DTYPES = ("bfloat16", "float32")

LOAD = textwrap.dedent("""
    import json, sys, torch
    from torch._inductor import config as ic
    from torch._inductor.virtualized import V
    import zhantune
    from zhantune.bench.inductor import relative_error
    from zhantune.bench.measurement import TOLERANCES
    from zhantune.inductor.choices import RecordingChoices
    from zhantune.inductor.table import load_table
    from zhantune.problems import GemmProblem

    table_path, stock_path, device, problems = sys.argv[1], sys.argv[2], torch.device(sys.argv[3]), json.loads(sys.argv[4])
    table, stock_table = load_table(table_path, "cuda"), load_table(stock_path, "cuda")
    out = {}
    for p in problems:
        problem = GemmProblem.from_config(p["op"], p["shape"], p["dtype"], p["activation"])
        module, inputs = problem.build(device)
        ref = problem.reference(module, inputs)
        row = {}
        for way in ("use_table", "stock"):
            torch._dynamo.reset()
            with torch.no_grad(), ic.patch(force_disable_caches=True):
                if way == "use_table":
                    with zhantune.use_table(table, device="cuda") as t:
                        got = torch.compile(module)(*inputs)
                    row[way] = {"hits": sum(t.report.hits.values()), "misses": sum(t.report.misses.values()),
                                "stale": sum(t.report.stale_count.values())}
                else:  # stock Inductor's lookup semantics on the format=inductor file (RecordingChoices only
                    # records the lookups); TMA entries need the flag set, as a stock user would
                    handler = RecordingChoices()
                    with ic.patch({"max_autotune_gemm": True, "lookup_table.table": stock_table,
                                   "triton.enable_persistent_tma_matmul": True}), V.set_choices_handler(handler):
                        got = torch.compile(module)(*inputs)
                    looked = [e for e in handler.events if e.offered]
                    row[way] = {"lookups": len(looked), "found": sum(1 for e in looked if e.hit)}
                torch.cuda.synchronize()
            error = relative_error(got, ref)
            row[way]["correct"] = error <= max(TOLERANCES[p["dtype"]], 2e-3)
        out[p["name"]] = row
    print(json.dumps(out))
""")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6, help="measured trials per problem (default 6)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=None, help="directory for the database and tables (default: a temporary one)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no further tune after this many seconds (export and load still run on what was "
                         "tuned; the skipped problems fail the check); default: no limit")
    ap.add_argument("--problems", default=None,
                    help="comma-separated op:dtype pairs to check, in this order (default: every op in "
                         f"{', '.join(PROBLEMS)} with each of {', '.join(DTYPES)})")
    args = ap.parse_args()
    every = [(op, dtype) for op in PROBLEMS for dtype in DTYPES]
    selected = every if args.problems is None else [tuple(x.split(":", 1)) for x in args.problems.split(",") if x]
    bad = [":".join(x) for x in selected if x not in every]
    if bad or not selected:
        print(f"gpu_check: --problems {args.problems!r}: {', '.join(bad) or 'empty'} not allowed; allowed op:dtype "
              f"with op in {', '.join(PROBLEMS)} and dtype in {', '.join(DTYPES)}", file=sys.stderr)
        return 2

    import torch

    from zhantune.torch_support import UnsupportedTorchError, check_torch

    try:  # before any GPU work: an older Inductor reads the tables differently (zhantune.torch_support)
        check_torch(what="scripts/gpu_check.py")
    except UnsupportedTorchError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a machine with a GPU",
              file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    from zhantune.bench.decision import decision_us
    from zhantune.device import resolve_device
    from zhantune.problems import GemmProblem
    from zhantune.runspec import cuda_offered_uids
    from zhantune.storage import Store

    device = resolve_device(args.device)
    out = Path(args.out or tempfile.mkdtemp(prefix="zhantune-gpu-check-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{out / 'gpu_check.db'}"
    console = Console()
    console.print(f"gpu_check on {device.name} ({device.key}), torch {torch.__version__}, results in {out}")
    problems, failures = [], []
    start = time.monotonic()
    for op, dtype in selected:
        shape, spaces = PROBLEMS[op]
        name = f"{op} {dtype}"
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            failures.append(f"{name}: not tuned (--budget-s {args.budget_s:g} spent)")
            continue
        space = ["aten_template", *spaces] + (["tf32"] if dtype == "float32" else [])
        cmd = [sys.executable, "-m", "zhantune", f"+op={op}", f"shape=[{','.join(map(str, shape))}]",
               f"dtype={dtype}", f"device={args.device}", f"space=[{','.join(space)}]",
               f"search.n_trials={args.trials}", f"storage.url={url}", "export.enabled=false", "progress=false",
               f"search.study_name=gpu_check {name}"]
        console.print(f"tuning {name} ...")
        t0 = time.monotonic()
        r = _run(cmd, out)
        console.print(f"  exit {r.returncode} after {time.monotonic() - t0:.0f} s; the tune's last lines:")
        console.print(textwrap.indent("\n".join((r.stdout + r.stderr).strip().splitlines()[-12:]), "  | "),
                      markup=False, highlight=False)
        if r.returncode != 0:
            failures.append(f"{name}: the tune exited {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
        problems.append({"name": name, "op": op, "shape": shape, "dtype": dtype,
                         "activation": "relu" if op == "linear_act" else None})

    store = Store(url)
    verdicts = store.latest_verdicts()
    rows = []
    for p in problems:
        problem = GemmProblem.from_config(p["op"], p["shape"], p["dtype"], p["activation"])
        try:
            offered = cuda_offered_uids(problem, device)
        except Exception as e:  # noqa: BLE001 - a check that cannot run is a failed check, not the end of the run
            failures.append(f"{p['name']}: Inductor's offers could not be read: {type(e).__name__}: {e}")
            offered = set()
        study = store.study(f"gpu_check {p['name']}")
        meas = store.measurements(study.id) if study is not None else []
        statuses: dict[str, int] = {}
        for m in meas:
            if m.kind == "candidate":
                statuses[m.status] = statuses.get(m.status, 0) + 1
                if m.status == "not_applied" and m.template_id in offered:
                    failures.append(f"{p['name']}: {m.template_id} {m.params} not_applied although Inductor offers it: "
                                    f"{m.error_text}")
        default = [m for m in meas if m.kind == "default" and m.status == "ok"]
        best = min((m for m in meas if m.kind in ("candidate", "remeasure") and m.status == "ok"),
                   key=decision_us, default=None)
        if not default or best is None:
            failures.append(f"{p['name']}: no ok default or no ok candidate")
        verdict = None if best is None else verdicts.get((best.device_id, best.problem_id, best.config_hash))
        rows.append((p, statuses, best, verdict))

    tables = {}
    for fmt in ("zhantune", "inductor"):
        path = out / f"table_{fmt}.json"
        r = _run([sys.executable, "-m", "zhantune.export", f"storage.url={url}", f"path={path}", f"format={fmt}"], out)
        if r.returncode != 0:
            failures.append(f"export format={fmt} exited {r.returncode}: {r.stderr.strip()[-300:]}")
        tables[fmt] = path
        console.print(r.stdout.strip())
    r = _run([sys.executable, "-c", LOAD, str(tables["zhantune"]), str(tables["inductor"]), args.device,
              json.dumps(problems)], out)
    loaded = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    if r.returncode != 0:
        failures.append(f"loading the table in a fresh process failed: {r.stderr.strip()[-500:]}")

    t = Table(title=f"gpu_check: {device.name}")
    for col in ("problem", "trials by status", "best config", "claim vs default", "use_table", "stock Inductor"):
        t.add_column(col)
    for p, statuses, best, verdict in rows:
        got = loaded.get(p["name"], {})
        mine, stock = got.get("use_table", {}), got.get("stock", {})
        if got and (mine.get("misses") or mine.get("stale") or not mine.get("correct")):
            failures.append(f"{p['name']}: use_table {mine}")
        if got and not stock.get("correct"):
            failures.append(f"{p['name']}: stock Inductor output incorrect")
        if got and not stock.get("found"):
            failures.append(f"{p['name']}: stock Inductor found none of its {stock.get('lookups', 0)} lookup(s) in the table")
        best_text = "-" if best is None else f"{best.template_id or best.branch} " + ", ".join(
            f"{k}={v}" for k, v in sorted(best.params.items()))
        claim = "-" if verdict is None else verdict.reason if verdict.ratio is None else (
            f"{verdict.ratio:.2f}x " + ("confirmed" if verdict.confirmed else f"unconfirmed: {verdict.reason}"))
        t.add_row(p["name"], " ".join(f"{k}={v}" for k, v in sorted(statuses.items())), best_text, claim,
                  f"hits {mine.get('hits', '?')} misses {mine.get('misses', '?')} "
                  + ("ok" if mine.get("correct") else "WRONG"),
                  f"hits {stock.get('found', '?')}/{stock.get('lookups', '?')} lookups "
                  + ("ok" if stock.get("correct") else "WRONG"))
    console.print(t)
    for f in failures:
        console.print(f"[red]FAIL[/red] {f}")
    console.print("gpu_check: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
