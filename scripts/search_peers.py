"""zhantune's search against the field's peers, side by side on recorded GPU data (Kernel Tuner files).

Every strategy searches the same replayed files with the same objective (the median of a
configuration's recorded ``times``) and the same budget: ``--trials`` distinct configurations
measured, where a failed configuration costs one as in zhantune, and the result is the ratio of the
best objective found to the file's optimum (median and worst over ``--seeds`` seeds, and how many
seeds ended within 10% of the optimum).

Strategies (``--strategies``, comma-separated):

* ``zhantune`` (the default search, cold start: ``search.transfer=off``) and ``zhantune+transfer``
  (the default with ``search.transfer=auto``: the other devices' files of the same kernel and problem
  size are imported into a temporary SQLite database and the search reads them back through
  zhantune.search.transfer.load_prior, leave one device out; files without a sibling get no row);
* ``tpe`` (plain Optuna ``TPESampler(seed=...)``) and ``random`` (conf/search/random.yaml), through
  zhantune's search loop (infeasible points are free for every strategy);
* ``kt:<name>``: Kernel Tuner 1.5.0's strategy in its simulation mode (``pip install -e .[peers]``),
  on a temporary copy of the file whose ``time`` is the median of ``times`` (the one objective).
  ``restrictions`` admits exactly the file's configurations (failed ones included), so a Kernel Tuner
  feval is the first evaluation of a distinct configuration of the file, failures included, as in
  zhantune; ``strategy_options={"max_fevals": trials}``. Kernel Tuner draws from Python's and
  NumPy's global generators, which are seeded per run. ``kt:dual_annealing+`` and
  ``kt:simulated_annealing+`` restart the strategy until the budget is spent: Kernel Tuner's
  dual_annealing hands scipy ``maxfun=max_fevals``, which counts repeated points (a run visits far
  fewer distinct configurations), and simulated_annealing ends its schedule before the budget.

    python scripts/search_peers.py                                   # 5 files x 20 seeds x 100 trials
    python scripts/search_peers.py --trials 50 --strategies zhantune,zhantune+transfer
    python scripts/search_peers.py --files convolution_A100 --seeds 5 --strategies kt:pso,zhantune

``--source`` replaces what ``zhantune+transfer`` reads, to measure a source that does not hold:
``reversed`` (the target's own scores, negated: its ranking backwards) or ``permuted`` (the target's
own scores shuffled over its configs, seeded: a device unrelated to it); ``real`` (default) is the
other devices' files.
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import importlib.util
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_efficiency import ReplayObjective, sampler_for  # noqa: E402  (scripts/, this script's folder)

from zhantune.bench.recorded import KernelTunerFile, entry_times_us, load_kerneltuner  # noqa: E402
from zhantune.quiet import quiet_known_warnings  # noqa: E402
from zhantune.search.driver import run_search  # noqa: E402
from zhantune.search.transfer import device_sources, load_prior  # noqa: E402
from zhantune.storage import Store  # noqa: E402
from zhantune.storage.ingest import import_kerneltuner  # noqa: E402

DATA = ROOT / "tests" / "data" / "kerneltuner"
FILES = ["gemm_RTX_3090", "convolution_A100", "convolution_A4000", "dedispersion_A100", "dedispersion_MI250X"]
KT_STRATEGIES = ["random_sample", "genetic_algorithm", "pso", "diff_evo", "firefly_algorithm", "greedy_ils",
                 "mls", "basinhopping", "simulated_annealing", "simulated_annealing+", "dual_annealing",
                 "dual_annealing+", "bayes_opt"]
STRATEGIES = ["zhantune", "zhantune+transfer", "tpe", "random"] + [f"kt:{s}" for s in KT_STRATEGIES]


def zhantune_run(replay: KernelTunerFile, strategy: str, seed: int, trials: int, prior_scores: dict | None) -> float:
    """Best objective (us) of one search through zhantune's loop."""
    measure = ReplayObjective(replay)
    sampler = sampler_for(strategy if strategy in ("tpe", "random") else "default", seed, {})
    if strategy not in ("tpe", "random") and prior_scores is not None:
        sampler.set_prior(prior_scores)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    stats = run_search(study, replay.space(), {}, measure, n_trials=trials, seed=seed)
    assert stats.measured == trials, (strategy, seed, stats)
    return measure.best


def misleading_scores(store: Store, replay: KernelTunerFile, source: str) -> dict[str, float]:
    """The target's own scores (log regret by config hash), ``reversed`` (finite ones negated: its
    ranking backwards; its failed configs stay failed, which a real backwards device would not know)
    or ``permuted`` (the scores shuffled over its configs, failures included, one shuffle per file
    seeded by its name: a source unrelated to the target)."""
    own = next((r for s, r in device_sources(store, "", replay.problem().key) if s.device_key == replay.device_key),
               None)
    if own is None:
        raise SystemExit(f"{replay.path.name}: its device {replay.device_key!r} has no rows of its problem in the "
                         "benchmark's database")
    if source == "reversed":
        return {h: (-v if np.isfinite(v) else v) for h, v in own.items()}
    keys = sorted(own)
    values = np.array([own[h] for h in keys])
    np.random.default_rng(sum(replay.path.name.encode())).shuffle(values)  # the seed docs/search.md measured
    return dict(zip(keys, values.tolist(), strict=True))


def median_cache(replay: KernelTunerFile, folder: Path) -> Path:
    """A copy of the file (plain JSON, as Kernel Tuner's cache reader wants) whose ``time`` is the
    median of ``times`` in milliseconds: the objective every strategy here optimises."""
    opener = gzip.open if replay.path.suffix == ".gz" else open
    with opener(replay.path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    for entry in data["cache"].values():
        times = entry_times_us(entry)
        if times:
            entry["time"] = statistics.median(times) / 1000.0
    data["device_name"] = replay.device_key  # Kernel Tuner's simulation device takes the file's name
    out = folder / (replay.path.name.removesuffix(".gz").removesuffix(".json") + ".json")
    out.write_text(json.dumps(data))
    return out


def _restarted(module_name: str):
    """A Kernel Tuner strategy that runs ``module_name`` again (fresh random start) until the
    budget of distinct configurations is spent."""
    import importlib

    from kernel_tuner.util import StopCriterionReached

    module = importlib.import_module(f"kernel_tuner.strategies.{module_name}")

    class Restarted:
        @staticmethod
        def tune(searchspace, runner, tuning_options):
            results = []
            while not tuning_options.budget.is_done():
                before = tuning_options.budget.num_fevals
                try:
                    results.extend(module.tune(searchspace, runner, tuning_options))
                except StopCriterionReached:
                    break
                if tuning_options.budget.num_fevals == before:  # nothing new: the space is exhausted
                    break
            return results

    return Restarted


def kt_run(cache_path: Path, strategy: str, seed: int, trials: int) -> float:
    """Best objective (us) of one Kernel Tuner simulation run (a feval: a distinct configuration)."""
    from kernel_tuner import tune_kernel
    from kernel_tuner.util import infer_args_from_cache, read_cache

    cache = read_cache(str(cache_path), open_cache=False)
    names = cache["tune_params_keys"]
    members = {tuple(e[n] for n in names) for e in cache["cache"].values()}

    def restrictions(params: dict) -> bool:  # exactly the file's configurations, failed ones included
        return tuple(params[n] for n in names) in members

    random.seed(seed)
    np.random.seed(seed)
    plain = strategy.removesuffix("+")
    chosen = _restarted(plain) if strategy.endswith("+") else plain
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = tune_kernel(**infer_args_from_cache(cache), restrictions=restrictions, cache=str(cache_path),
                                 simulation_mode=True, strategy=chosen, strategy_options={"max_fevals": trials},
                                 quiet=True, verbose=False)
    ok = [r["time"] for r in results if "__error__" not in r and isinstance(r.get("time"), (int, float))]
    return min(ok) * 1000.0 if ok else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default=",".join(FILES), help="names in tests/data/kerneltuner (no .json.gz)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--source", choices=["real", "reversed", "permuted"], default="real",
                    help="what zhantune+transfer reads: the other devices' files, or the target's own scores "
                         "reversed or shuffled")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    quiet_known_warnings()
    names = args.files.split(",")
    strategies = args.strategies.split(",")
    if any(s.startswith("kt:") for s in strategies) and importlib.util.find_spec("kernel_tuner") is None:
        ap.error("the kt: strategies need kernel-tuner 1.5.0, the optional extra: pip install -e '.[peers]' "
                 "(or --strategies without kt: rows)")  # before hours of the other rows, not after
    if args.source != "real" and "zhantune+transfer" not in strategies:
        ap.error(f"--source {args.source} replaces what zhantune+transfer reads: add it to --strategies")
    files = {n: load_kerneltuner(DATA / f"{n}.json.gz") for n in names}
    optimum = {n: f.best_time_us() for n, f in files.items()}
    tmp = Path(tempfile.mkdtemp(prefix="zhantune-peers-"))
    atexit.register(shutil.rmtree, tmp, True)  # the median caches and the transfer database
    priors: dict[str, tuple[dict, str] | None] = {}
    if "zhantune+transfer" in strategies:  # every file in one database; each target reads the others
        store = Store(f"sqlite:///{tmp / 'transfer.db'}")
        for f in files.values():
            import_kerneltuner(store, f)
        for n, f in files.items():
            prior = load_prior(store, f.device_key, f.problem())
            priors[n] = (prior.scores, ", ".join(s.device_key for s in prior.sources)) if prior else None
            if prior and args.source != "real":  # the same targets as the real source: those with a sibling
                priors[n] = (misleading_scores(store, f, args.source), f"its own scores, {args.source}")
    caches = {n: median_cache(f, tmp) for n, f in files.items()} if any(s.startswith("kt:") for s in strategies) else {}

    print(f"{args.trials} distinct configurations per run (failures count), {args.seeds} seeds; ratio of the best "
          "median time found to the file's optimum: median / worst over the seeds (runs within 1.10x)")
    for n in names:
        if n in priors:
            print(f"  {n}: transfer from " + (priors[n][1] if priors[n] else "nothing (no other device of this problem)"))
    header = f"{'strategy':28s}" + "".join(f"{n:>26s}" for n in names) + f"{'all within 1.10':>17s}{'s':>7s}"
    print(header)
    for strategy in strategies:
        t0 = time.perf_counter()
        cells, near, total = [], 0, 0
        for n in names:
            if strategy == "zhantune+transfer" and not priors.get(n):
                cells.append("-")
                continue
            ratios = []
            for seed in range(args.seeds):
                if strategy.startswith("kt:"):
                    best = kt_run(caches[n], strategy[3:], seed, args.trials)
                else:
                    scores = priors[n][0] if strategy == "zhantune+transfer" else None
                    best = zhantune_run(files[n], strategy.split("+")[0], seed, args.trials, scores)
                ratios.append(best / optimum[n])
            within = sum(r <= 1.10 for r in ratios)
            near, total = near + within, total + len(ratios)
            cells.append(f"{statistics.median(ratios):.3f}/{max(ratios):.3f} ({within}/{len(ratios)})")
        print(f"{strategy:28s}" + "".join(f"{c:>26s}" for c in cells) + f"{f'{near}/{total}':>17s}"
              f"{time.perf_counter() - t0:7.0f}", flush=True)


if __name__ == "__main__":
    main()
