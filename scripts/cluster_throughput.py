"""Throughput of N local jobs on one study, through Hydra's submitit launcher (its local mode).

Each run is the README's cluster recipe on this machine: ``python -m zhantune -m
hydra/launcher=submitit_local bench=replay ... search.seed=0,...,N-1`` on one fresh database, the
replay backend answering from the RTX 3090 GEMM file. ``--pace 1`` makes every answer take as long
as the recorded measurement did (Kernel Tuner's compile + verification + benchmark times, 0.48 to
3.8 s, median 0.81 s), so the jobs behave like GPUs measuring; ``--pace 0`` answers at once, which
measures the coordination itself (Optuna's storage, claims, heartbeats). It prints, per run, the
measured trials, the launcher's wall time (job start-up included) and the trials per second between
the study's first and last measurement rows (start-up excluded).

    python scripts/cluster_throughput.py                          # pace 1 and 0, 1/2/4 jobs, PostgreSQL
    python scripts/cluster_throughput.py --jobs 1,2,4,8 --pace 1 --trials 80 --backends postgresql,sqlite

The PostgreSQL server is started like the tests' (tests/pgserver.py: Debian's postgresql-15 binaries).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pgserver import FreshDatabases  # noqa: E402  (tests/pgserver.py)
from sqlalchemy import func, select  # noqa: E402

from zhantune.storage import Store  # noqa: E402
from zhantune.storage import orm as m  # noqa: E402

DATA = ROOT / "tests" / "data" / "kerneltuner" / "gemm_RTX_3090.json.gz"


def run_one(url: str, jobs: int, pace: float, n_trials: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="zt-cluster-"))
    seeds = ",".join(str(i) for i in range(jobs))
    cmd = [sys.executable, "-m", "zhantune", "-m", "hydra/launcher=submitit_local", "bench=replay",
           f"bench.path={DATA}", f"bench.replay_pace={pace}", f"search.n_trials={n_trials}", f"search.seed={seeds}",
           f"storage.url={url}", "progress=false", f"hydra.sweep.dir={work}/sweep"]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    store = Store(url)
    with store.session() as s:
        n, first, last, configs = s.execute(
            select(func.count(), func.min(m.MeasurementRow.created_at), func.max(m.MeasurementRow.created_at),
                   func.count(func.distinct(m.MeasurementRow.config_hash)))
            .where(m.MeasurementRow.kind == "candidate")).one()
    span = (last - first).total_seconds()
    rate = (n - 1) / span if span > 0 else float("nan")
    print(f"{url.split(':')[0]:22s} {pace:5.1f} {jobs:5d} {n:7d} {configs:8d} {wall:8.1f} {span:8.1f} {rate:9.2f}",
          flush=True)
    store.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="1,2,4", help="comma-separated job counts")
    ap.add_argument("--pace", default="1,0", help="comma-separated bench.replay_pace values")
    ap.add_argument("--trials", type=int, default=0, help="search.n_trials (0: 60 at pace > 0, 400 at pace 0)")
    ap.add_argument("--backends", default="postgresql")
    args = ap.parse_args()
    print(f"{'backend':22s} {'pace':>5s} {'jobs':>5s} {'trials':>7s} {'configs':>8s} {'wall s':>8s} "
          f"{'span s':>8s} {'trials/s':>9s}   (span: first to last measurement row)")
    databases = FreshDatabases("zt-cluster-db-")
    try:
        for backend in args.backends.split(","):
            for pace in map(float, args.pace.split(",")):
                n_trials = args.trials or (60 if pace > 0 else 400)
                for jobs in map(int, args.jobs.split(",")):
                    run_one(databases.new(backend), jobs, pace, n_trials)
    finally:
        databases.close()


if __name__ == "__main__":
    main()
