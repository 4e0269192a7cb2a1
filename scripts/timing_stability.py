"""Timing stability: the same CPU candidate measured N times in separate trials (a fresh compile and a
full timing each, as a tune does), printing the spread of the per-trial medians.

    python scripts/timing_stability.py                       # mm 512x512x512 fp32, ATen, 20 trials
    python scripts/timing_stability.py --shape 1024,1024,1024 --trials 20 --space cpp_gemm

    python scripts/timing_stability.py --load 4             # under 4 busy-loop processes it starts

Target (issue 15): under a self-made load of 4 busy loops on the 2-core machine, the coefficient of
variation of the decision statistic (the minimum of each trial's individually timed runs; see
docs/timing.md) over 20 separate trials at most 5%. The median's CV is printed beside it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_module  # noqa: E402

from zhantune.bench.conditions import conditions  # noqa: E402
from zhantune.bench.inductor import InductorBenchmarker  # noqa: E402
from zhantune.bench.timing import renice_threads  # noqa: E402
from zhantune.config import register  # noqa: E402
from zhantune.quiet import quiet_known_warnings  # noqa: E402
from zhantune.tune import resolve_run  # noqa: E402


def _busy() -> None:
    while True:
        pass


def start_load(n: int) -> list[multiprocessing.Process]:
    """``n`` busy-loop processes (stopped by :func:`stop_load`): a machine other work competes for."""
    procs = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop_load(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        p.kill()
        p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="mm")
    ap.add_argument("--shape", default="512,512,512")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--space", default="aten", help="a CPU space; its first feasible point is measured")
    ap.add_argument("--set", nargs="*", default=[], help="extra overrides, e.g. bench.target_ms=200")
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes to run during the trials")
    args = ap.parse_args()
    load = start_load(args.load)
    try:
        _trials(args)
    finally:
        stop_load(load)


def _trials(args: argparse.Namespace) -> None:
    quiet_known_warnings()
    register()
    with initialize_config_module("zhantune.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"+op={args.op}", f"shape=[{args.shape}]", "device=cpu",
                                           f"space=[{args.space}]", *args.set])
    run = resolve_run(cfg)
    if cfg.bench.nice is not None:  # as the timing worker does (zhantune.bench.isolated)
        print(f"timing at niceness {cfg.bench.nice}: {'yes' if renice_threads(cfg.bench.nice) else 'not permitted'}")
    branch = run.space.branches[0]
    values = next(v for v in branch.all_values() if branch.feasible(v, run.problem_vars))
    cand = branch.candidate(values)
    bench = InductorBenchmarker(run.problem, run.device, cfg.bench)
    bench.inductor_default()
    print(f"{run.problem.key} on {run.device.name}: {cand.describe()}, {args.trials} separate trials "
          f"(warmup {cfg.bench.warmup_ms} ms, target {cfg.bench.target_ms} ms, flush {cfg.bench.flush_cache})")
    print(f"conditions at start: {conditions('cpu')}")
    medians, cvs, mins, p20s = [], [], [], []
    t0 = time.perf_counter()
    for i in range(args.trials):
        m = bench.measure(cand)
        if not m.ok:
            sys.exit(f"trial {i}: {m.status} {m.error_text}")
        medians.append(m.timing.median_us)
        mins.append(m.timing.min_us)
        p20s.append(m.timing.p20_us)
        cvs.append(m.timing.cv)
        print(f"trial {i + 1:3d}: median {m.timing.median_us:10.1f} us  n={m.timing.n:4d}  "
              f"runs' cv {100 * m.timing.cv:5.2f}%  compile {m.compile_s:5.2f} s", flush=True)
    mean = statistics.fmean(medians)
    sd = statistics.stdev(medians)
    print(f"\nmedians over {args.trials} trials: mean {mean:,.1f} us, std {sd:,.1f} us, "
          f"CV {100 * sd / mean:.2f}%, min {min(medians):,.1f}, max {max(medians):,.1f} "
          f"(spread {100 * (max(medians) - min(medians)) / mean:.1f}%); median within-trial cv "
          f"{100 * statistics.median(cvs):.2f}%; {time.perf_counter() - t0:.0f} s")
    for name, xs in (("20th percentiles", p20s), ("minimums (decision statistic)", mins)):
        print(f"{name} over {args.trials} trials: mean {statistics.fmean(xs):,.1f} us, "
              f"CV {100 * statistics.stdev(xs) / statistics.fmean(xs):.2f}%")
    print(f"conditions at end: {conditions('cpu')}")


if __name__ == "__main__":
    main()
