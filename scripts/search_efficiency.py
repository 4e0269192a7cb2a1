"""Search-efficiency benchmark on recorded GPU data (Kernel Tuner cache files, replayed).

For each dataset and strategy, runs ``--seeds`` independent searches of ``--trials`` measured trials
through zhantune's own search loop (zhantune.search.run_search: infeasible points are free, failed
configurations use a trial) and prints the ratio of the best time found to the file's optimum:
median and worst over the seeds, plus how often the optimum itself was found and how often a
configuration within 10% of it (ratio at most 1.10, the target for the worst seed).

Strategies: ``default`` (conf/search/<default>.yaml, what ``python -m zhantune`` uses), ``random``
(conf/search/random.yaml) and ``tpe`` (plain Optuna TPESampler(seed=...), no other settings), plus
any other conf/search file by name.

    python scripts/search_efficiency.py                      # 3 datasets x 20 seeds x 100 trials
    python scripts/search_efficiency.py --seeds 5 --strategies default,tpe
    python scripts/search_efficiency.py --set n_model_trials=40   # try a setting of the default
    python scripts/search_efficiency.py --datasets convolution_A100 --strategies default \
        --fix read_only=1 --fix use_padding=0 --fix use_shmem=1     # a search told part of the answer

``--fix`` pins parameters of the file to one value, so the search runs over that slice only; the
ratio is still to the optimum of the whole file. It measures how hard the rest of the problem is
once those parameters are known (docs/search.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import optuna
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zhantune.bench.recorded import ReplayBenchmarker, load_kerneltuner  # noqa: E402
from zhantune.config import CONF_DIR  # noqa: E402
from zhantune.errors import ConfigError  # noqa: E402
from zhantune.quiet import quiet_known_warnings  # noqa: E402
from zhantune.search.driver import run_search  # noqa: E402
from zhantune.search.samplers import make_sampler  # noqa: E402

DATA = ROOT / "tests" / "data" / "kerneltuner"
DATASETS = ["gemm_RTX_3090", "convolution_A100", "convolution_A4000"]


def default_strategy() -> str:
    cfg = OmegaConf.load(CONF_DIR / "config.yaml")
    entry = next(d for d in cfg.defaults if OmegaConf.is_dict(d) and "search" in d)
    return str(entry["search"])


def sampler_for(strategy: str, seed: int, overrides: dict) -> optuna.samplers.BaseSampler:
    if strategy == "tpe":  # plain Optuna TPE, as a user would get it without zhantune's settings
        return optuna.samplers.TPESampler(seed=seed)
    name = default_strategy() if strategy == "default" else strategy
    spec = OmegaConf.load(CONF_DIR / "search" / f"{name}.yaml").sampler
    spec = OmegaConf.to_container(spec, resolve=False)
    spec["seed"] = seed
    if strategy == "default":
        spec.update(overrides)
    return make_sampler(spec)


class ReplayObjective:
    """run_search's ``measure`` over a replayed file: a config's recorded median (us), None for a
    failed one; ``best`` is the lowest returned so far."""

    def __init__(self, replay) -> None:
        self.bench = ReplayBenchmarker(replay)
        self.best = float("inf")

    def __call__(self, cand, _number):
        meas = self.bench.measure(cand)
        if not meas.ok:
            return None
        self.best = min(self.best, meas.timing.median_us)
        return meas.timing.median_us


def one_run(path: Path, strategy: str, seed: int, n_trials: int, overrides: dict,
            fixed: dict | None = None) -> float:
    """Best median (us) found by one search of ``n_trials`` measured trials (over the slice where the
    parameters in ``fixed`` take the given values, when set)."""
    replay = load_kerneltuner(path)
    measure = ReplayObjective(replay)
    study = optuna.create_study(sampler=sampler_for(strategy, seed, overrides), direction="minimize")
    stats = run_search(study, replay.space(fixed), {}, measure, n_trials=n_trials, seed=seed)
    assert stats.measured == n_trials, (strategy, seed, stats)
    return measure.best


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = OmegaConf.create(f"v: {value}").v  # YAML typing: 40 -> int, 0.6 -> float
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--strategies", default="default,random,tpe")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a sampler argument of the default strategy")
    ap.add_argument("--fix", action="append", default=[], metavar="PARAM=VALUE",
                    help="search only the slice of each file where PARAM has this value (repeatable)")
    args = ap.parse_args()
    overrides = parse_overrides(args.set)
    fixed = parse_overrides(args.fix)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    quiet_known_warnings()
    files = {name: load_kerneltuner(DATA / f"{name}.json.gz") for name in args.datasets.split(",")}
    for replay in files.values():  # check --fix against every file before the first run
        try:
            replay.space(fixed)
        except ConfigError as e:  # one line, exit code 2
            print(f"error: --fix: {e}", file=sys.stderr)
            sys.exit(2)
    print(f"default strategy: {default_strategy()} {overrides or ''}; {args.trials} measured trials, "
          f"{args.seeds} seeds (0..{args.seeds - 1})" + (f"; only the slice {fixed}" if fixed else ""))
    print(f"{'dataset':20s} {'strategy':10s} {'median':>7s} {'worst':>7s} {'optimum found':>14s} {'within 10%':>11s} {'time s':>7s}")
    for name, replay in files.items():
        path = replay.path
        optimum = replay.best_time_us()
        for strategy in args.strategies.split(","):
            t0 = time.perf_counter()
            ratios = [one_run(path, strategy, seed, args.trials, overrides, fixed) / optimum
                      for seed in range(args.seeds)]
            found = sum(r <= 1.0 + 1e-9 for r in ratios)
            near = sum(r <= 1.10 for r in ratios)  # the target for the worst seed
            print(f"{name:20s} {strategy:10s} {statistics.median(ratios):7.3f} {max(ratios):7.3f} "
                  f"{found:>7d}/{args.seeds:<6d} {near:>5d}/{args.seeds:<5d} {time.perf_counter() - t0:7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
