"""Storage benchmark: a 1,000-trial replay study end to end on SQLite and on PostgreSQL.

Runs the real tune job (zhantune.tune.tune: Optuna study in the storage, one committed measurement
row per trial, claims, cache lookups) with the replay backend on the RTX 3090 GEMM file, and prints
trials per second and the share of wall time spent in database calls (SQLAlchemy cursor executions
of zhantune and Optuna together, timed with SQLAlchemy's engine events).

    python scripts/storage_benchmark.py                 # SQLite, then PostgreSQL (a server it starts)
    python scripts/storage_benchmark.py --trials 200 --search random --backends sqlite

The PostgreSQL server is started like the tests' (tests/pgserver.py: Debian's postgresql-15 binaries).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hydra import compose, initialize_config_module  # noqa: E402

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


def run_one(url: str, n_trials: int, search: str, clock: _DbClock) -> None:
    register()
    overrides = ["bench=replay", f"bench.path={DATA}", f"search={search}", f"search.n_trials={n_trials}",
                 f"storage.url={url}", "progress=false", "export.enabled=false"]
    with initialize_config_module("zhantune.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run = resolve_run(cfg)
    clock.seconds, clock.calls = 0.0, 0
    t0 = time.perf_counter()
    store = Store(url)
    result = tune(run, store)
    wall = time.perf_counter() - t0
    assert result.measured == n_trials, result
    print(f"{url.split(':')[0]:22s} {search:13s} {n_trials:6d} {wall:8.1f} {n_trials / wall:9.1f} "
          f"{100 * clock.seconds / wall:8.1f}% {clock.calls:9d}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--search", default="feasible_tpe,random")
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    clock = _DbClock()
    print(f"{'backend':22s} {'search':13s} {'trials':>6s} {'wall s':>8s} {'trials/s':>9s} {'in db':>9s} {'db calls':>9s}")
    server = None
    try:
        for backend in args.backends.split(","):
            for search in args.search.split(","):
                if backend == "sqlite":
                    url = f"sqlite:///{tempfile.mkdtemp(prefix='zt-bench-')}/bench.db"
                else:
                    if server is None:
                        from pgserver import PostgresServer

                        server = PostgresServer()
                    url = server.new_database()
                run_one(url, args.trials, search, clock)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
