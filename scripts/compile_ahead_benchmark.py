"""Compile ahead: wall time of the same CPU tune with and without compile-ahead workers.

Runs ``python -m zhantune`` (a real tune: baselines, ``--trials`` measured candidates of the C++
GEMM template and aten, no re-measure rounds, no export) once per setting of ``bench.compile_workers``
and round, alternating the settings so slow drifts of the machine hit both, each into a fresh SQLite
file. Prints per run: wall seconds, seconds per measured trial, and the sum of the stored compile
seconds; then the median per setting.

    python scripts/compile_ahead_benchmark.py                       # mm 512^3 fp32, 16 trials, 0 vs 1, 2 rounds
    python scripts/compile_ahead_benchmark.py --workers 0,1,2 --rounds 3 --shape 256,256,256
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(workers: int, shape: str, trials: int, seed: int, out: Path) -> tuple[float, float, int]:
    """(wall s, sum of compile_s over the candidates, candidates stored) of one tune."""
    db = out / f"w{workers}-{time.monotonic_ns()}.db"
    args = [sys.executable, "-m", "zhantune", "+op=mm", f"shape=[{shape}]", "device=cpu", "dtype=float32",
            "space=[aten,cpp_gemm]", f"search.n_trials={trials}", f"search.seed={seed}",
            f"bench.compile_workers={workers}", "bench.remeasure_rounds=0", "export.enabled=false",
            "progress=false", f"storage.url=sqlite:///{db}", f"hydra.run.dir={out}/hydra"]
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=out, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"tune failed (compile_workers={workers}):\n{r.stderr[-2000:]}")
    con = sqlite3.connect(db)
    compile_s, n = con.execute("select coalesce(sum(compile_s), 0), count(*) from zt_measurement "
                               "where kind = 'candidate'").fetchone()
    con.close()
    return wall, compile_s, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="0,1", help="settings of bench.compile_workers to compare")
    ap.add_argument("--shape", default="512,512,512")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    settings = [int(w) for w in args.workers.split(",")]
    print(f"mm [{args.shape}] fp32 on CPU ({os.cpu_count()} cores), {args.trials} measured trials, "
          f"space=[aten,cpp_gemm], seed {args.seed}")
    print(f"{'round':>5s} {'workers':>7s} {'wall s':>8s} {'s/trial':>8s} {'compile s':>10s}")
    walls: dict[int, list[float]] = {w: [] for w in settings}
    with tempfile.TemporaryDirectory(prefix="zhantune-ahead-") as tmp:
        for rnd in range(args.rounds):
            for w in settings if rnd % 2 == 0 else reversed(settings):
                wall, compile_s, n = one_run(w, args.shape, args.trials, args.seed, Path(tmp))
                walls[w].append(wall)
                print(f"{rnd:5d} {w:7d} {wall:8.1f} {wall / n:8.2f} {compile_s:10.1f}", flush=True)
    print("median wall s: " + ", ".join(f"compile_workers={w}: {statistics.median(v):.1f}" for w, v in walls.items()))


if __name__ == "__main__":
    main()
