"""Samplers: every shipped conf/search file, and zhantune's FeasibleTPESampler, through the real search loop."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import numpy as np
import optuna
import pytest
from omegaconf import OmegaConf

from zhantune.bench.recorded import ReplayBenchmarker, load_kerneltuner
from zhantune.config import CONF_DIR
from zhantune.errors import ConfigError
from zhantune.search import FeasibleTPESampler, run_search
from zhantune.search.driver import CLAIMED, SPENT, SharedStudy
from zhantune.search.feasible import enumerate_feasible
from zhantune.search.samplers import make_sampler
from zhantune.search.schema import Space, load_branches

DATA = Path(__file__).resolve().parent / "data" / "kerneltuner"

#: a small space with two branches, every parameter kind and constraints
SMALL = {
    "branches": {
        "tiles": {
            "scope": "config",
            "params": {
                "a": {"low": 16, "high": 128, "pow2": True},
                "b": {"choices": [1, 2, 3, 4, 5]},
                "c": {"low": 0, "high": 6, "step": 2},
                "flag": {"choices": [True, False]},
            },
            "constraints": ["a * b <= 256", "c <= K // 16 or flag"],
        },
        "plain": {"scope": "config", "fixed": {"x": 1}},
    }
}
VARS = {"K": 64}


def _small_space() -> Space:
    return Space(load_branches(SMALL, "test.yaml"))


def _independent_feasible_count() -> int:
    n = 0
    for a, b, c, flag in itertools.product([16, 32, 64, 128], [1, 2, 3, 4, 5], [0, 2, 4, 6], [True, False]):
        n += a * b <= 256 and (c <= VARS["K"] // 16 or flag)
    return n + 1  # the fixed-only branch


def _objective(cand, _number):
    p = cand.params
    if cand.branch == "plain":
        return 50.0
    return abs(p["a"] - 64) + 3 * abs(p["b"] - 3) + p["c"] + (5 if p["flag"] else 0) + 1.0


def test_feasible_set_matches_an_independent_count():
    fs = enumerate_feasible(_small_space(), VARS)
    assert len(fs) == _independent_feasible_count()
    assert fs.codes.shape == (len(fs), 1 + 4)  # branch + the 4 tuned params


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "search").glob("*.yaml")))
def test_every_shipped_sampler_runs_the_search_loop(name):
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "search" / f"{name}.yaml").sampler)
    spec["seed"] = 3
    sampler = make_sampler(spec)
    study = optuna.create_study(sampler=sampler)
    seen = []
    stats = run_search(study, _small_space(), VARS, lambda c, n: seen.append(c.config_hash) or _objective(c, n),
                       n_trials=12, seed=3)
    assert stats.measured == 12 == len(seen)
    assert study.best_value >= 1.0


def test_feasible_tpe_measures_every_feasible_point_once_then_stops():
    study = optuna.create_study(sampler=FeasibleTPESampler(seed=0, n_startup_trials=4, n_model_trials=10))
    seen = []
    stats = run_search(study, _small_space(), VARS, lambda c, n: seen.append(c.config_hash) or _objective(c, n),
                       n_trials=1000)
    total = _independent_feasible_count()
    assert stats.exhausted and stats.infeasible == 0
    assert len(seen) == len(set(seen)) == total == stats.measured
    assert study.best_value == 1.0  # a=64, b=3, c=0, flag=False


@pytest.mark.parametrize("cold_model_every", [0, 3])
def test_feasible_tpe_searches_next_to_the_best_point_after_the_model_phase(cold_model_every):
    """After the model phase TPE's proposals are Hamming neighbours of the best point; with
    cold_model_every=3 every third proposal (counted over the points tried) is the per-value model's
    instead, and only those."""
    sampler = FeasibleTPESampler(seed=1, n_startup_trials=4, n_model_trials=8, cold_model_every=cold_model_every)
    model_turns = []
    model_row = sampler._cold_model_row
    sampler._cold_model_row = lambda rows, values, unseen: model_turns.append(len(rows)) or model_row(rows, values, unseen)
    study = optuna.create_study(sampler=sampler)
    run_search(study, _small_space(), VARS, _objective, n_trials=8)
    # the model's turns among the first 8 (after the 4 uniform draws): the 6th point tried (5 before it)
    assert model_turns == ([5] if cold_model_every else [])
    fs = sampler.feasible_set
    for _ in range(9):
        rows = [fs.row_of(t.params) for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = rows[int(np.argmin([t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]))]
        del model_turns[:]
        nxt = sampler.next_row(study)
        model_turn = bool(cold_model_every) and len(rows) % cold_model_every == cold_model_every - 1
        assert model_turns == ([len(rows)] if model_turn else [])
        if not model_turn:
            distance = int((fs.codes[nxt] != fs.codes[best]).sum())
            unseen_near = [r for r in range(len(fs)) if r not in rows and (fs.codes[r] != fs.codes[best]).sum() == 1]
            assert distance == 1 if unseen_near else distance >= 1
        run_search(study, _small_space(), VARS, _objective, n_trials=1)


def test_the_cold_models_turn_proposes_a_best_point_of_a_log_additive_objective():
    """The per-value model's turn (Thompson sampling, log time = sum of per-value effects) on an
    objective that is exactly that (one branch of the small space, 112 points): after 26 measured
    trials it proposes an unmeasured point within 1.25x of the best unmeasured one, for every seed
    (the spread of one posterior draw; TPE's density ratio is not asked)."""
    space = Space(load_branches({"branches": {"tiles": SMALL["branches"]["tiles"]}}, "test.yaml"))
    effect = {"a": {16: 0.9, 32: 0.0, 64: 0.5, 128: 1.2}, "b": {1: 0.8, 2: 0.3, 3: 0.0, 4: 0.6, 5: 1.0},
              "c": {0: 0.4, 2: 0.0, 4: 0.7, 6: 0.2}, "flag": {True: 0.6, False: 0.0}}

    def time_of(params: dict) -> float:
        return float(np.exp(sum(effect[k][v] for k, v in params.items())))

    for seed in range(8):
        sampler = FeasibleTPESampler(seed=seed, n_startup_trials=16, cold_model_every=3)
        study = optuna.create_study(sampler=sampler)
        run_search(study, space, VARS, lambda c, _n: time_of(c.params), n_trials=26)  # the 27th: the model's
        fs = sampler.feasible_set
        tried = {fs.row_of(t.params) for t in study.trials}
        assert len(tried) % 3 == 2
        best_unseen = min(time_of(fs.points[r][1]) for r in range(len(fs)) if r not in tried)
        proposed = sampler.next_row(study)
        assert proposed not in tried and time_of(fs.points[proposed][1]) <= 1.25 * best_unseen, seed


def test_feasible_tpe_between_storage_reads_knows_exactly_what_a_storage_read_would_tell_it():
    """refresh_s bounds the storage reads; this process's own results (after_trial) must keep the
    sampler's view identical to reading every trial back: same seed, same points, failures included."""
    def failing(c, n):  # b == 5 fails: a measured failure counts as tried and as worst
        return None if c.params.get("b") == 5 else _objective(c, n)

    sequences = []
    for refresh_s in (0.0, 1e9):
        sampler = FeasibleTPESampler(seed=4, n_startup_trials=4, n_model_trials=10, refresh_s=refresh_s)
        study = optuna.create_study(sampler=sampler)
        stats = run_search(study, _small_space(), VARS, failing, n_trials=40)
        assert stats.measured == 40
        sequences.append([(t.params, t.state, t.value) for t in study.trials])
    assert sequences[0] == sequences[1]
    assert any(state == optuna.trial.TrialState.FAIL for _, state, _ in sequences[0])
    assert len({tuple(sorted(p.items())) for p, _, _ in sequences[0]}) == 40  # never a point twice


def _shared_in_memory(claimed: list[str], released: list[str], measured: list[str]) -> SharedStudy:
    """The claims of one study kept in lists (the store keeps them in zt_claim; test_cluster.py)."""
    def claim(c, n, limit):
        if len(claimed) - len(released) >= limit:
            return SPENT
        claimed.append(c.config_hash)
        return CLAIMED

    return SharedStudy(claim=claim, release=lambda c: released.append(c.config_hash),
                       counts=lambda: (len(measured), len(claimed) - len(released) - len(measured)),
                       in_flight=lambda: [], release_trial=lambda n: False)


def test_ask_ahead_prepares_the_next_candidate_before_the_current_one_is_measured():
    """Compile ahead (run_search's lookahead): while trial k is measured, trial k+1 has been asked,
    claimed and prepared; the sampler never proposes a point that is still being measured, even
    between storage reads (refresh_s)."""
    events: list[tuple[str, str]] = []
    claimed: list[str] = []
    measured_hashes: list[str] = []

    def measure(c, n):
        events.append(("measure", c.config_hash))
        measured_hashes.append(c.config_hash)
        return _objective(c, n)

    sampler = FeasibleTPESampler(seed=2, n_startup_trials=4, n_model_trials=10, refresh_s=1e9)
    study = optuna.create_study(sampler=sampler)
    stats = run_search(study, _small_space(), VARS, measure, n_trials=30, lookahead=1,
                       prepare=lambda c: events.append(("prepare", c.config_hash)),
                       shared=_shared_in_memory(claimed, [], measured_hashes))
    assert stats.measured == 30 and stats.duplicates == 0
    measured = [h for kind, h in events if kind == "measure"]
    prepared = [h for kind, h in events if kind == "prepare"]
    assert prepared == measured == claimed and len(set(measured)) == 30  # each point once, in order
    for k, h in enumerate(measured[:-1]):  # the next one was prepared before this one was measured
        assert events.index(("prepare", measured[k + 1])) < events.index(("measure", h))
    assert events[-1] == ("measure", measured[-1])  # nothing asked beyond the budget


def test_points_asked_ahead_are_counted_once_whether_or_not_the_storage_was_read():
    """With compile ahead (lookahead=2) a point asked ahead is in the storage (RUNNING, its params
    set) and in the sampler's own pending list: read back or not (refresh_s 0 or never), it counts
    once, so the model's turns and the points proposed are the same."""
    runs = []
    for refresh_s in (0.0, 1e9):
        sampler = FeasibleTPESampler(seed=3, n_startup_trials=4, n_model_trials=10, refresh_s=refresh_s)
        turns = []
        model_row = sampler._cold_model_row
        sampler._cold_model_row = lambda rows, values, unseen, m=model_row, t=turns: t.append(len(rows)) or m(rows, values, unseen)
        study = optuna.create_study(sampler=sampler)
        run_search(study, _small_space(), VARS, _objective, n_trials=40, lookahead=2, prepare=lambda c: None)
        runs.append((turns, [t.params for t in study.trials]))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) >= 10  # one proposal in three after the 4 uniform draws


def test_candidates_asked_ahead_but_not_measured_are_released_and_marked_interrupted():
    released: list[str] = []
    calls = []

    def measure(c, n):
        calls.append(n)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return _objective(c, n)

    study = optuna.create_study(sampler=FeasibleTPESampler(seed=0, n_startup_trials=4))
    stats = run_search(study, _small_space(), VARS, measure, n_trials=10, lookahead=2,
                       prepare=lambda c: None, shared=_shared_in_memory([], released, []))
    assert stats.interrupted and stats.measured == 2
    states = [t.state for t in study.trials]
    assert states[:2] == [optuna.trial.TrialState.COMPLETE] * 2
    abandoned = study.trials[2:]
    assert len(abandoned) == 3 and len(released) == 3  # the one being measured and the two asked ahead
    for t in abandoned:
        assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("zhantune:interrupted")


def test_feasible_tpe_falls_back_to_optuna_tpe_for_spaces_too_large_to_enumerate():
    big = {"branches": {"k": {"scope": "config", "params": {n: {"low": 1, "high": 100} for n in "abcd"}}}}
    sampler = FeasibleTPESampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    stats = run_search(study, Space(load_branches(big, "big.yaml")), {},
                       lambda c, n: float(sum(c.params.values())), n_trials=12)
    assert sampler.feasible_set is None and stats.measured == 12


def test_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="gamma"):
        FeasibleTPESampler(gamma=0)
    with pytest.raises(ValueError, match="cold_model_every=-1 must be at least 0"):
        FeasibleTPESampler(cold_model_every=-1)
    with pytest.raises(ConfigError, match="search.sampler._target_='os.system' is not allowed"):
        make_sampler({"_target_": "os.system", "command": "true"})


def test_a_sampler_argument_of_the_wrong_type_is_refused_before_a_stored_study_changes(cli, tmp_path):
    """Optuna's samplers keep what they are given: TPESampler(n_startup_trials='abc') failed only at
    its first ask, with a traceback, after the finished study it resumed was marked running with the
    bad run's config (a helper's finding). Plain-typed arguments are checked against the constructor's
    signature, nested ones too; what the signature does not type plainly (a Callable) is not judged."""
    with pytest.raises(ConfigError, match=r"^search.sampler.n_startup_trials='abc' is not an integer \(what "
                                          r"optuna.samplers.TPESampler's constructor takes for n_startup_trials\)$"):
        make_sampler({"_target_": "optuna.samplers.TPESampler", "n_startup_trials": "abc"})
    with pytest.raises(ConfigError, match=r"^search.sampler.base_sampler.seed=1.5 is not an integer or null"):
        make_sampler({"_target_": "optuna.samplers.PartialFixedSampler", "fixed_params": {},
                      "base_sampler": {"_target_": "optuna.samplers.RandomSampler", "seed": 1.5}})
    with pytest.raises(ConfigError, match=r"^search.sampler.multivariate='yes' is not a boolean or null"):
        make_sampler({"_target_": "optuna.samplers.TPESampler", "multivariate": "yes"})
    assert isinstance(make_sampler({"_target_": "optuna.samplers.TPESampler", "prior_weight": 2, "seed": None,
                                    "multivariate": True}), optuna.samplers.TPESampler)  # an int for a float
    replay = ["bench=replay", f"bench.path={DATA / 'gemm_RTX_3090.json.gz'}", "progress=false", "export.enabled=false"]
    r = cli([*replay, "search.n_trials=2"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    before = (tmp_path / "zhantune.db").read_bytes()
    r = cli([*replay, "search.more_trials=2", "search=tpe", "search.sampler.n_startup_trials=abc"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "zhantune: search.sampler.n_startup_trials='abc' is not an integer (what optuna.samplers.TPESampler's "
        "constructor takes for n_startup_trials)"], r.stderr[-3000:]
    assert (tmp_path / "zhantune.db").read_bytes() == before


def test_a_target_under_an_allowed_prefix_must_resolve_to_a_sampler_class(tmp_path):
    """A prefix is not enough: Hydra resolves ``zhantune.scratch.shutil.copyfile`` through module
    attributes to ``shutil.copyfile``; it, and zhantune's own functions, are refused before any call."""
    precious = tmp_path / "precious.txt"
    precious.write_text("precious")
    attempts = [
        ({"_target_": "zhantune.scratch.shutil.copyfile", "_args_": [__file__, str(precious)]},
         "search.sampler._target_='zhantune.scratch.shutil.copyfile' is not allowed: it is shutil.copyfile"),
        ({"_target_": "zhantune.inductor.table.write_table", "path": str(precious), "table": {}},
         "'zhantune.inductor.table.write_table' is not allowed: it is zhantune.inductor.table.write_table"),
        ({"_target_": "optuna.samplers.PartialFixedSampler", "fixed_params": {},
          "base_sampler": {"_target_": "zhantune.scratch.shutil.rmtree", "path": str(tmp_path)}},
         r"search.sampler.base_sampler._target_='zhantune.scratch.shutil.rmtree' is not allowed"),
        ({"_target_": "optuna.samplers.no_such_thing"}, "names nothing that can be imported"),
        ({"_target_": "optuna.samplers.TPESampler.hyperopt_parameters"}, "is not allowed: it is "),
    ]
    for spec, message in attempts:
        with pytest.raises(ConfigError, match=message):
            make_sampler(spec)
    assert precious.read_text() == "precious" and tmp_path.exists()
    nested = make_sampler({"_target_": "optuna.samplers.PartialFixedSampler", "fixed_params": {},
                           "base_sampler": {"_target_": "optuna.samplers.RandomSampler", "seed": 1}})
    assert isinstance(nested, optuna.samplers.PartialFixedSampler)


def test_an_escaped_interpolation_cannot_build_a_target_after_the_check(cli, tmp_path):
    """The spec arrives resolved, so an escaped ``\\${oc.create:{_target_: ...}}`` arrived as a plain
    string that instantiate resolved again, building a node whose ``_target_`` no check saw: it ran
    os.makedirs from a command-line override (a review's finding). Any ``${`` in an instantiated
    value is refused, and Hydra's own instantiated configs (callbacks) take no override."""
    made = tmp_path / "made"
    with pytest.raises(ConfigError, match=r"search.sampler.x=.*an interpolation is not allowed"):
        make_sampler({"_target_": "optuna.samplers.RandomSampler",
                      "x": "${oc.create:{_target_:os.makedirs,_args_:['" + str(made) + "']}}"})
    assert not made.exists()
    r = cli(["+op=mm", "shape=[64,64,64]", "device=cpu",
             "+search.sampler.x=\"\\${oc.create:{_target_:os.makedirs,_args_:['" + str(made) + "']}}\""],
            tmp_path, module="zhantune.space")
    assert r.returncode == 2 and "an interpolation is not allowed" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not made.exists()
    r = cli(["current", "storage.url=sqlite:///none.db", "+hydra.callbacks.x._target_=os.makedirs",
             f"+hydra.callbacks.x._args_=['{made}']"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "such overrides are not allowed" in r.stderr, r.stderr
    assert not made.exists()
    # the same through a mapping value of hydra itself (a review of the check)
    r = cli(["current", "storage.url=sqlite:///none.db",
             "++hydra={callbacks:{x:{_target_:os.makedirs,_args_:['" + str(made) + "']}}}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "such overrides are not allowed" in r.stderr, r.stderr
    assert not made.exists()


def _best_ratio(strategy, seed: int, path: Path) -> float:
    replay = load_kerneltuner(path)
    bench = ReplayBenchmarker(replay)
    best = [float("inf")]

    def measure(cand, _n):
        meas = bench.measure(cand)
        if meas.ok:
            best[0] = min(best[0], meas.timing.median_us)
            return meas.timing.median_us
        return None

    study = optuna.create_study(sampler=strategy(seed))
    run_search(study, replay.space(), {}, measure, n_trials=100, seed=seed)
    return best[0] / replay.best_time_us()


def test_default_strategy_beats_random_search_on_real_gpu_data():
    """5 seeds x 100 trials on the A4000 convolution data: the default finds better configs than random."""
    path = DATA / "convolution_A4000.json.gz"
    default = [_best_ratio(lambda s: FeasibleTPESampler(seed=s), s, path) for s in range(5)]
    rand = [_best_ratio(lambda s: optuna.samplers.RandomSampler(seed=s), s, path) for s in range(5)]
    assert statistics.median(default) < statistics.median(rand)
    assert statistics.median(default) <= 1.05


def _toy(g: int, fail: int | None = None) -> tuple[Space, object]:
    """x in {1, 2, 3} with a fixed g (not an Optuna param: another g is another config); the
    measurement of x == ``fail`` fails."""
    space = Space(load_branches({"branches": {"t": {"scope": "config", "params": {"x": {"choices": [1, 2, 3]}},
                                                    "fixed": {"g": g}}}}, "toy.yaml"))
    return space, lambda cand, _n: None if cand.params["x"] == fail else float(cand.params["x"])


@pytest.mark.parametrize("make", [lambda: FeasibleTPESampler(seed=0), lambda: optuna.samplers.RandomSampler(seed=0)])
def test_a_resumed_search_counts_only_this_spaces_results_as_seen(make):
    """Resuming one study: with the same space measured whole (one point a measured failure) the
    search is exhausted at once and adds no trial (each of its points was asked again, the answers
    told as duplicate trials); with another fixed value (the same Optuna params, other configs)
    each of its points is measured once: the old trials are not taken for its points (the space
    was called exhausted with nothing measured; the sampler took them as tried)."""
    study = optuna.create_study(sampler=make())
    space, measure = _toy(8, fail=2)
    stored: dict = {}  # the database: a point measured once is answered from it

    def store_and_measure(cand, n):
        stored[cand.config_hash] = measure(cand, n)
        return stored[cand.config_hash]

    def cached(cand):
        return cand.config_hash in stored, stored.get(cand.config_hash)

    first = run_search(study, space, {}, store_and_measure, n_trials=3, cached=cached)
    assert first.measured == 3 and len(stored) == 3
    trials = len(study.trials)
    again = run_search(study, space, {}, store_and_measure, n_trials=8, cached=cached)
    assert again.exhausted and again.asks == 0 and len(study.trials) == trials, again
    other, measure4 = _toy(4)
    told_here: list = []

    def measure_here(cand, n):
        told_here.append(cand.params["x"])
        return store_and_measure(cand, n)

    moved = run_search(study, other, {}, measure_here, n_trials=3, cached=cached)
    assert moved.measured == 3 and not moved.exhausted, moved
    # each of the three points of the other space measured once: the sampler took no old trial for
    # one of them (FeasibleTPESampler did: it measured x=2, 3, 3 and never x=1)
    assert sorted(told_here) == [1, 2, 3] and len(stored) == 6, told_here
    if isinstance(study.sampler, FeasibleTPESampler):  # and it proposed only those (no repeat asked)
        assert moved.asks == 3 and moved.cached == 0, moved


@pytest.mark.parametrize("make", [lambda: FeasibleTPESampler(seed=0), lambda: optuna.samplers.RandomSampler(seed=0)])
def test_a_waiting_trial_outside_the_space_is_infeasible_not_measured_or_a_crash(make):
    """Enqueued points (waiting trials) outlive their run: a tune killed after enqueuing its seeds and
    rerun with a narrower ``space=``, or a merged study, leaves values this space does not have.
    Optuna refuses a categorical one (the tune died with a ValueError traceback) and only warns
    about an integer out of range (y=10**9 was measured). Each is told infeasible; the budget goes
    to points of the space."""
    space = Space(load_branches({"branches": {"t": {"scope": "config", "params": {
        "x": {"choices": [1, 2, 3]}, "y": {"low": 16, "high": 64, "step": 16}}}}}, "toy.yaml"))
    study = optuna.create_study(sampler=make())
    for point in ({"t.x": 1, "t.y": 10**9}, {"t.x": 2, "t.y": 17}, {"t.x": 9, "t.y": 16}):
        study.enqueue_trial(point)
    measured: list = []
    stats = run_search(study, space, {}, lambda cand, _n: measured.append(dict(cand.params)) or 1.0, n_trials=3)
    assert stats.measured == 3 and stats.infeasible == 3, stats
    assert all(p["x"] in (1, 2, 3) and p["y"] in (16, 32, 48, 64) for p in measured), measured
