"""Storage benchmark: a 1,000-trial replay study end to end on SQLite and on PostgreSQL.

Runs the real tune job (zhantune.tune.tune: Optuna study in the storage, one committed measurement
row per trial, claims, cache lookups) with the replay backend on the RTX 3090 GEMM file, and prints
trials per second and the share of wall time spent in database calls (SQLAlchemy cursor executions
of zhantune and Optuna together, timed with SQLAlchemy's engine events).

    python scripts/storage_benchmark.py                 # SQLite, then PostgreSQL (a server it starts)
    python scripts/storage_benchmark.py --trials 200 --search random --backends sqlite
    python scripts/storage_benchmark.py --search feasible_tpe --workers 1,2   # also 2 processes, one study

The PostgreSQL server is started like the tests' (tests/pgserver.py: Debian's postgresql-15 binaries).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hydra import compose, initialize_config_module  # noqa: E402
from pgserver import FreshDatabases  # noqa: E402  (tests/pgserver.py)

from zhantune.config import register  # noqa: E402
from zhantune.storage import Store  # noqa: E402
from zhantune.tune import resolve_run, tune  # noqa: E402

DATA = ROOT / "tests" / "data" / "kerneltuner" / "gemm_RTX_3090.json.gz"


class _DbClock:
    """Sums the time of every cursor execution on every engine (zhantune's and Optuna's)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        conn.info.setdefault("zt_t0", []).append(time.perf_counter())

    def _after(self, conn, cursor, statement, parameters, context, executemany):
        self.seconds += time.perf_counter() - conn.info["zt_t0"].pop()
        self.calls += 1


def _prepare(url: str, n_trials: int, search: str, seed: int = 0):
    register()
    overrides = ["bench=replay", f"bench.path={DATA}", f"search={search}", f"search.n_trials={n_trials}",
                 f"search.seed={seed}",
                 f"storage.url={url}", "progress=false", "export.enabled=false"]
    with initialize_config_module("zhantune.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return resolve_run(cfg)


def _tune_timed(url: str, run, n_trials: int, clock: _DbClock) -> tuple[float, float, float, int]:
    """(start, end) wall-clock seconds of one tune, its seconds in database calls, and the calls."""
    clock.seconds, clock.calls = 0.0, 0
    start = time.time()
    result = tune(run, Store(url))
    end = time.time()
    assert result.study_measured == n_trials, result  # search.n_trials is the study's total, every worker's
    return start, end, clock.seconds, clock.calls


def _worker(url: str, n_trials: int, search: str, seed: int, barrier, out) -> None:
    clock = _DbClock()
    run = _prepare(url, n_trials, search, seed)
    barrier.wait()  # every worker has imported and resolved its run: the study starts together
    out.put(_tune_timed(url, run, n_trials, clock))


def run_one(url: str, n_trials: int, search: str, clock: _DbClock, workers: int = 1) -> None:
    """One study of ``n_trials`` measured trials; with ``workers`` > 1, that many processes started
    on the same study and storage (splitting its ``n_trials`` between them), timed from the common start."""
    if workers == 1:
        run = _prepare(url, n_trials, search)
        results = [_tune_timed(url, run, n_trials, clock)]
    else:
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(workers), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(url, n_trials, search, i, barrier, out))
                 for i in range(workers)]
        for proc in procs:
            proc.start()
        results = [out.get() for _ in procs]
        for proc in procs:
            proc.join()
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    db_share = sum(r[2] for r in results) / sum(r[1] - r[0] for r in results)
    total = n_trials
    print(f"{url.split(':')[0]:22s} {search:13s} {workers:7d} {total:6d} {wall:8.1f} {total / wall:9.1f} "
          f"{100 * db_share:8.1f}% {sum(r[3] for r in results):9d}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--search", default="feasible_tpe,random")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--workers", default="1", help="comma-separated worker counts (processes on one study)")
    args = ap.parse_args()
    clock = _DbClock()
    print(f"{'backend':22s} {'search':13s} {'workers':>7s} {'trials':>6s} {'wall s':>8s} {'trials/s':>9s} "
          f"{'in db':>9s} {'db calls':>9s}")
    databases = FreshDatabases()
    try:
        for backend in args.backends.split(","):
            for search in args.search.split(","):
                for workers in map(int, args.workers.split(",")):
                    run_one(databases.new(backend), args.trials, search, clock, workers)
    finally:
        databases.close()


if __name__ == "__main__":
    main()
