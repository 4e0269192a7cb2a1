"""Transfer (issue 20): other devices' measurements of the same problem, and neighbouring shapes on
this device, as the search's prior; Kernel Tuner imports with no device name.

Behaviour only: where the search looks (seeds from the other device, proposals at the top of its
ranking, a misleading source left behind),
what the summary says, which sources are read. How much transfer gains is a benchmark
(scripts/search_peers.py, docs/search.md), never a timed assertion here.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import sqlite3
import statistics
from pathlib import Path

import pytest

from zhantune.bench.recorded import load_kerneltuner
from zhantune.report.regret import compare
from zhantune.search.transfer import load_prior, shape_distance
from zhantune.storage import Store
from zhantune.storage.ingest import import_kerneltuner

DATA = Path(__file__).resolve().parent / "data" / "kerneltuner"
CONV_A100, CONV_A4000 = DATA / "convolution_A100.json.gz", DATA / "convolution_A4000.json.gz"
DD_A100, DD_MI250X = DATA / "dedispersion_A100.json.gz", DATA / "dedispersion_MI250X.json.gz"


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _best_tenth(path: Path) -> tuple[set[tuple], list[str]]:
    """The configurations (tuples of the tuned parameters' values) in the best 10% of a file, ranked
    by the median of their recorded times with failures last, computed from the raw file."""
    raw = _raw(path)
    names = [n for n in raw["tune_params_keys"] if len(raw["tune_params"][n]) > 1]
    ranked = sorted(raw["cache"].values(),
                    key=lambda e: (isinstance(e["time"], str), 0 if isinstance(e["time"], str) else statistics.median(e["times"])))
    cut = math.ceil(0.1 * len(ranked))
    return {tuple(e[n] for n in names) for e in ranked[:cut]}, names


def _source_percentile(path: Path) -> tuple[dict[tuple, float], list[str]]:
    """Each configuration's place in a file's ranking (0: its best, 1: its worst; by the median of
    the recorded times, failures last), computed from the raw file."""
    raw = _raw(path)
    names = [n for n in raw["tune_params_keys"] if len(raw["tune_params"][n]) > 1]
    ranked = sorted(raw["cache"].values(),
                    key=lambda e: (isinstance(e["time"], str), 0 if isinstance(e["time"], str) else statistics.median(e["times"])))
    return {tuple(e[n] for n in names): i / len(ranked) for i, e in enumerate(ranked)}, names


def _measured_in_order(db: Path, study_suffix: str) -> list[dict]:
    con = sqlite3.connect(db)
    rows = con.execute("select m.params from zt_measurement m join zt_study s on m.study_id = s.id "
                       "where m.kind = 'candidate' and s.name like ? order by m.trial_number",
                       (f"%{study_suffix}",)).fetchall()
    con.close()
    return [json.loads(p) for (p,) in rows]


@pytest.fixture(scope="module")
def conv_db(tmp_path_factory):
    """A database holding the A4000's convolution measurements (imported as Kernel Tuner data)."""
    db = tmp_path_factory.mktemp("conv") / "z.db"
    store = Store(f"sqlite:///{db}")
    import_kerneltuner(store, load_kerneltuner(CONV_A4000))
    store.engine.dispose()  # the last connection closed: SQLite moves the WAL into the file we copy
    return db


def test_replay_on_a_new_device_starts_from_the_top_of_the_other_devices_ranking_and_says_so(cli, tmp_path, conv_db):
    """Acceptance: import A4000, then tune the A100 replay in the same storage."""
    db = tmp_path / "z.db"
    shutil.copy(conv_db, db)
    cold_db = tmp_path / "cold.db"
    shutil.copy(conv_db, cold_db)
    region, names = _best_tenth(CONV_A4000)
    place, _ = _source_percentile(CONV_A4000)
    args = ["bench=replay", f"bench.path={CONV_A100}", "search.n_trials=30", "progress=false"]

    r = cli([*args, f"storage.url=sqlite:///{db}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "transfer: 4,362 prior measurement(s) of this problem from 1 other device(s): NVIDIA RTX A4000 (4,362)" in out
    assert ("with their scores for 4,362 of 4,362 feasible configs, proposals came from a model of this "
            "device's times as their ranking plus per-parameter-value effects") in out
    assert "from TPE within their best 437" in out
    measured = _measured_in_order(db, "@NVIDIA A100-PCIE-40GB")
    assert len(measured) == 30
    # the first 24 come from the top of the A4000's ranking: the model's draws around its best
    # configs, every third one a uniform draw from its best tenth
    first = [place[tuple(p[n] for n in names)] for p in measured[:24]]
    assert statistics.median(first) < 0.2, first
    assert all(tuple(p[n] for n in names) in region for p in measured[2:24:3])

    r = cli([*args, f"storage.url=sqlite:///{cold_db}", "search.transfer=off"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "transfer:" not in r.stdout
    cold = _measured_in_order(cold_db, "@NVIDIA A100-PCIE-40GB")
    inside = sum(tuple(p[n] for n in names) in region for p in cold[:24])
    assert inside < 24  # a cold start draws from the whole space (16 uniform points first)
    assert statistics.median(place[tuple(p[n] for n in names)] for p in cold[:16]) > 0.3


def test_transfer_to_an_unnamed_device_uses_the_other_device_only(tune_cfg, tmp_path):
    """The dedispersion pair through the tune job: MI250X (no device_name in its file) from the A100."""
    from zhantune.tune import resolve_run, tune

    url = f"sqlite:///{tmp_path / 'dd.db'}"
    store = Store(url)
    import_kerneltuner(store, load_kerneltuner(DD_A100))
    region, names = _best_tenth(DD_A100)
    cfg = tune_cfg(["bench=replay", f"bench.path={DD_MI250X}", "bench.isolate=false", "search.n_trials=26",
                    f"storage.url={url}", "progress=false"])
    run = resolve_run(cfg)
    assert run.device.key == "MI250X"
    result = tune(run, store)
    assert [(s.kind, s.device_key, s.measured) for s in result.transfer.sources] == \
        [("device", "NVIDIA A100-PCIE-40GB", 11130)]
    measured = _measured_in_order(tmp_path / "dd.db", "@MI250X")
    assert len(measured) == 26
    assert all(tuple(p[n] for n in names) in region for p in measured[2:24:3])  # TPE's start-up draws
    assert "from TPE within their best 1,113" in result.transfer_text

    off = tune(resolve_run(tune_cfg(["bench=replay", f"bench.path={DD_MI250X}", "bench.isolate=false",
                                     "search.n_trials=2", f"storage.url={url}", "search.transfer=off",
                                     "search.study_name=cold", "progress=false"])), store)
    assert off.transfer is None and off.transfer_text is None


def test_unnamed_device_is_named_after_its_file_and_compares_as_its_own_device(tmp_path):
    assert _raw(DD_MI250X)["device_name"] == ""
    url = f"sqlite:///{tmp_path / 'dd.db'}"
    store = Store(url)
    for path in (DD_A100, DD_MI250X):
        import_kerneltuner(store, load_kerneltuner(path, source="files"))
    con = sqlite3.connect(tmp_path / "dd.db")
    devices = dict(con.execute("select key, properties from zt_device").fetchall())
    con.close()
    assert set(devices) == {"NVIDIA A100-PCIE-40GB", "MI250X"}
    assert json.loads(devices["MI250X"])["named_by"] == "file name"
    cmp = compare(store)
    assert sorted(cmp.devices) == ["MI250X", "NVIDIA A100-PCIE-40GB"]
    (problem,) = cmp.problems
    assert problem.best_us["MI250X"] == pytest.approx(49.572 * 1000, rel=1e-3)  # the README's best time


def _toy(folder: Path, scale: float, device_name: str = "") -> Path:
    """A small Kernel Tuner file without a device name, ``toy_X.json`` (its device: ``X``)."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = {f"{a},{b}": {"a": a, "b": b, "time": scale * (a + b), "times": [scale * (a + b)] * 3}
             for a in (1, 2, 3) for b in (1, 2)}
    doc = {"device_name": device_name, "kernel_name": "toy_kernel", "problem_size": [8],
           "tune_params_keys": ["a", "b"], "tune_params": {"a": [1, 2, 3], "b": [1, 2]}, "cache": cache}
    path = folder / "toy_X.json"
    path.write_text(json.dumps(doc))
    return path


def test_two_unnamed_files_of_one_problem_are_never_merged(cli, tmp_path):
    a, b = _toy(tmp_path / "a", 1.0), _toy(tmp_path / "b", 2.0)
    url = f"storage.url=sqlite:///{tmp_path / 'i.db'}"
    r = cli([f"files=[{a}]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0 and "device 'X' (device named by file name)" in r.stdout, r.stderr
    before = (tmp_path / "i.db").read_bytes()

    r = cli([f"files=[{b}]", url], tmp_path, module="zhantune.kerneltuner")  # same file name, other data
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "gives device 'X', which already holds kerneltuner:toy_kernel[8]" in r.stderr and "devices=[...]" in r.stderr
    assert (tmp_path / "i.db").read_bytes() == before
    # with a good file before it in one import: refused before either is written
    c = _toy(tmp_path / "c", 3.0, device_name="GPU-C")
    r = cli([f"files=[{c},{b}]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 2 and "gives device 'X', which already holds" in r.stderr, r.stdout + r.stderr
    assert (tmp_path / "i.db").read_bytes() == before

    r = cli([f"files=[{a},{b}]", f"storage.url=sqlite:///{tmp_path / 'j.db'}"], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 2 and "both give device 'X'" in r.stderr and not (tmp_path / "j.db").exists()

    r = cli([f"files=[{b}]", "devices=[Y]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr
    r = cli([f"files=[{a}]", url], tmp_path, module="zhantune.kerneltuner")  # the same file again: nothing new
    assert r.returncode == 0 and "already imported" in r.stdout
    cmp = compare(Store(f"sqlite:///{tmp_path / 'i.db'}"))
    assert sorted(cmp.devices) == ["X", "Y"]
    assert cmp.problems[0].best_us == {"X": pytest.approx(2000.0), "Y": pytest.approx(4000.0)}

    r = cli([f"files=[{a}]", "devices=[A,B]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 2 and "one non-empty device name per file" in r.stderr


def test_another_file_of_the_same_name_is_imported_as_its_own_study_and_leaves_the_first_as_it_was(tmp_path):
    """Two different files named toy_X.json (two folders, as benchmark_hub's <kernel>/<GPU>.json.gz
    layout gives) of one named device: the second is not dropped as "already imported" under the
    first's study, nor does it overwrite that study's provenance."""
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    a, b = _toy(tmp_path / "a", 1.0, device_name="GPU-N"), _toy(tmp_path / "b", 2.0, device_name="GPU-N")
    first, added = import_kerneltuner(store, load_kerneltuner(a, source="files"))
    assert (first, added) == ("kerneltuner:toy_X.json@GPU-N", 6)
    second, added = import_kerneltuner(store, load_kerneltuner(b, source="files"))
    assert added == 6 and second != first and second.startswith("kerneltuner:toy_X.json[sha256:")
    assert store.study_config(first)["source"] == str(a) and store.study_config(second)["source"] == str(b)
    # each file again: nothing new, under its own study
    assert import_kerneltuner(store, load_kerneltuner(b, source="files")) == (second, 0)
    assert import_kerneltuner(store, load_kerneltuner(a, source="files")) == (first, 0)
    with sqlite3.connect(tmp_path / "n.db") as con:
        per_study = dict(con.execute("select s.name, count(*) from zt_measurement m join zt_study s "
                                     "on s.id = m.study_id group by s.name").fetchall())
    assert per_study == {first: 6, second: 6}


def _gemm_rows(store: Store, device: str, op: str, dims: dict, dtype: str, times: dict[str, float | None],
               kind: str = "cuda") -> None:
    """Store candidate rows (config hash -> median us; None: failed) of a GEMM problem on a device."""
    did = store.device_id(device, device, kind, {})
    shape = ",".join(f"{d}={dims[d]}" for d in ("M", "N", "K"))
    pid = store.problem_id(f"{op}[{shape}]:{dtype}", lookup_key=None, op=op, shape={**dims, "B": 1}, dtype=dtype,
                           activation=None, lookup_op=op, flops=2 * dims["M"] * dims["N"] * dims["K"])
    sid = store.study_id(f"{op}[{shape}]:{dtype}@{device}", {})
    store.add_measurements([
        dict(study_id=sid, device_id=did, problem_id=pid, trial_number=i, kind="candidate",
             status="ok" if t is not None else "compile_error", params={}, config_hash=h, median_us=t,
             min_us=t, torch_version="t") for i, (h, t) in enumerate(times.items())])


def test_shape_prior_reads_the_nearest_shapes_of_the_same_gemm_on_this_device(tmp_path):
    from zhantune.problems import GemmProblem

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    near = {"M": 64, "N": 64, "K": 128}
    _gemm_rows(store, "gpu", "mm", near, "float32", {"a": 10.0, "b": 20.0, "c": None})
    _gemm_rows(store, "gpu", "mm", {"M": 64, "N": 64, "K": 64}, "float32", {"a": 40.0, "b": 10.0})
    _gemm_rows(store, "gpu", "mm", {"M": 4096, "N": 4096, "K": 4096}, "float32", {"z": 1.0})  # far
    _gemm_rows(store, "gpu", "mm", near, "bfloat16", {"y": 1.0})                            # other dtype
    _gemm_rows(store, "gpu", "addmm", near, "float32", {"x": 1.0})                           # other op
    _gemm_rows(store, "other", "mm", near, "float32", {"w": 1.0})                            # other device
    target = GemmProblem.from_config("mm", [64, 64, 256], "float32")
    prior = load_prior(store, "gpu", target)
    assert [(s.kind, s.problem_key, s.distance) for s in prior.sources] == [
        ("shape", "mm[M=64,N=64,K=128]:float32", 1.0), ("shape", "mm[M=64,N=64,K=64]:float32", 2.0)]
    assert set(prior.scores) == {"a", "b", "c"}
    # the mean of the two shapes' log regrets: a = (ln 1 + ln 4) / 2, b = (ln 2 + ln 1) / 2
    assert prior.scores["a"] == pytest.approx(math.log(4) / 2)
    assert prior.scores["b"] == pytest.approx(math.log(2) / 2)
    assert prior.scores["c"] == math.inf
    assert shape_distance({"M": 64, "N": 64, "K": 256}, near) == 1.0
    # the same problem on another device wins over shapes: device transfer first
    _gemm_rows(store, "other", "mm", {"M": 64, "N": 64, "K": 256}, "float32", {"a": 5.0, "b": 10.0})
    prior = load_prior(store, "gpu", target)
    assert [(s.kind, s.device_key) for s in prior.sources] == [("device", "other")]
    assert prior.scores == {"a": 0.0, "b": pytest.approx(math.log(2))}


def test_only_devices_of_this_kind_are_sources_and_shapes_take_over_otherwise(tmp_path):
    """A CPU's configs (aten config scope, cpp_gemm) share no config hash with a GPU's spaces: the
    same problem on a CPU in a team's database made a GPU tune's prior score nothing, and crowded out
    the GPU's own neighbouring shapes (a review's finding)."""
    from zhantune.problems import GemmProblem

    store = Store(f"sqlite:///{tmp_path / 'k.db'}")
    _gemm_rows(store, "gpu", "mm", {"M": 64, "N": 64, "K": 128}, "float32", {"a": 10.0, "b": 20.0})
    _gemm_rows(store, "AMD EPYC (2 threads)", "mm", {"M": 64, "N": 64, "K": 256}, "float32", {"x": 5.0}, kind="cpu")
    target = GemmProblem.from_config("mm", [64, 64, 256], "float32")
    prior = load_prior(store, "gpu", target, kind="cuda")
    assert [(s.kind, s.problem_key) for s in prior.sources] == [("shape", "mm[M=64,N=64,K=128]:float32")]
    assert [s.device_key for s in load_prior(store, "gpu", target).sources] == ["AMD EPYC (2 threads)"]  # any kind


def test_the_replayed_recording_under_another_device_name_is_not_another_device(tmp_path):
    """The same Kernel Tuner file imported under another device name (devices=[...], a merge, a
    copied file) was read as another device's measurements: a replay of it "transferred" from
    itself. A device holding the replayed file's sha256 is never a source; other devices still are."""
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    a100 = load_kerneltuner(CONV_A100)
    import_kerneltuner(store, load_kerneltuner(CONV_A100, device="A100"))
    problem = a100.problem()
    assert [s.device_key for s in load_prior(store, a100.device_key, problem).sources] == ["A100"]  # no recording
    assert load_prior(store, a100.device_key, problem, recording=a100.digests) is None
    import_kerneltuner(store, load_kerneltuner(CONV_A4000))
    prior = load_prior(store, a100.device_key, problem, recording=a100.digests)
    assert [s.device_key for s in prior.sources] == ["NVIDIA RTX A4000"]


def test_a_decompressed_copy_of_the_replayed_recording_is_not_another_device(tmp_path):
    """An attack (session 42): the replayed file's recording imported decompressed under another
    device name (``zcat a.json.gz > a.json``) passed the sha256 check (of the bytes as stored) and
    "transferred" 4,362 of its own measurements to its replay. The digest of the JSON decompressed
    is stored with an import (``content_sha256``) and compared too, so the other way round (the .gz
    imported, its .json replayed: only the stored digest of the JSON matches) holds as well."""
    import gzip

    plain = tmp_path / "convolution_A100.json"
    plain.write_bytes(gzip.decompress(CONV_A100.read_bytes()))
    gz, raw = load_kerneltuner(CONV_A100), load_kerneltuner(plain)
    assert gz.sha256 != raw.sha256 and gz.digests & raw.digests
    for imported, replayed in ((plain, gz), (CONV_A100, raw)):
        store = Store(f"sqlite:///{tmp_path / f'{replayed.path.name}.db'}")
        import_kerneltuner(store, load_kerneltuner(imported, device="A100copy"))
        import_kerneltuner(store, load_kerneltuner(CONV_A4000))
        prior = load_prior(store, replayed.device_key, replayed.problem(), recording=replayed.digests)
        assert [s.device_key for s in prior.sources] == ["NVIDIA RTX A4000"], replayed.path


def test_the_transfer_line_says_what_reached_this_search():
    """Seeds counted as proposed only when the sampler proposed them (a short run's enqueued
    Inductor seeds can take every trial); a source none of whose configs is in this space says so;
    a space too large to enumerate takes no prior."""
    import types

    import optuna

    from zhantune.search import FeasibleTPESampler, run_search
    from zhantune.search.feasible import enumerate_feasible
    from zhantune.search.transfer import Prior, Source, transfer_text

    replay = load_kerneltuner(CONV_A100)
    space = replay.space()
    (branch,) = space.branches
    tuned = [p.name for p in branch.params if p.distribution is not None]
    points = [{n: e[n] for n in tuned} for e in list(replay.cache.values())[:40]]
    hashes = [branch.candidate(p).config_hash for p in points]
    prior = Prior({h: float(i) for i, h in enumerate(hashes[:10])},
                  [Source("shape", "gpu", "p1", 10, 1.0, frozenset(hashes[:10])),
                   Source("shape", "gpu", "p2", 2, 2.0, frozenset({"elsewhere-1", "elsewhere-2"}))])
    sampler = FeasibleTPESampler(seed=0)
    sampler.set_prior(prior.scores)
    study = optuna.create_study(sampler=sampler)
    feasible = enumerate_feasible(space, {})
    for row in (100, 101):  # the tune's enqueued seeds (Inductor's), measured first
        assert feasible.trial_params(row) not in points[:10]
        study.enqueue_trial(feasible.trial_params(row))
    run_search(study, space, {}, lambda c, n: 1.0, n_trials=2)
    text = transfer_text(prior, sampler)
    assert sampler.prior_seeds_proposed == 0
    assert "of their 3 best config(s), 3 not reached before this run's trials ended" in text, text
    assert "p1 (10, distance 1.00), p2 (2, none in this space, distance 2.00)" in text, text
    order: list[str] = []
    run_search(study, space, {}, lambda c, n: order.append(c.config_hash) or 1.0, n_trials=6)
    assert order[:3] == hashes[:3] and sampler.prior_seeds_proposed == 3
    assert "of their 3 best config(s), 3 proposed in this run, after" in transfer_text(prior, sampler)
    assert "already tried" not in transfer_text(prior, sampler)
    # a resumed run (a new sampler on the same study) finds them measured: it says so, not that they
    # were not reached; a two-trial run whose sampler proposed two of three leaves one not reached
    resumed = FeasibleTPESampler(seed=1)
    resumed.set_prior(prior.scores)
    study.sampler = resumed
    run_search(study, space, {}, lambda c, n: 1.0, n_trials=7)
    text = transfer_text(prior, resumed)
    assert "of their 3 best config(s), 3 already tried in this study" in text, text
    assert "proposed in this run" not in text and "not reached" not in text, text
    short = FeasibleTPESampler(seed=0)
    short.set_prior(prior.scores)
    run_search(optuna.create_study(sampler=short), space, {}, lambda c, n: 1.0, n_trials=2)
    text = transfer_text(prior, short)
    assert "of their 3 best config(s), 2 proposed in this run, after Inductor's own seeds and before the " \
           "sampler's own picks, 1 not reached before this run's trials ended" in text, text
    # a replay has no Inductor seeds: the line does not name them (an attack, session 42)
    text = transfer_text(prior, short, inductor_seeds=False)
    assert "of their 3 best config(s), 2 proposed in this run, before the sampler's own picks, 1 not reached " \
           "before this run's trials ended (search" in text and "Inductor" not in text, text
    # a run of enqueued seeds alone (Inductor's own, here the prior's best two among them) never asks
    # the sampler: the study's trials tell which seeds were measured (it said "3 not reached")
    enqueued = FeasibleTPESampler(seed=0)
    enqueued.set_prior(prior.scores)
    only_seeds = optuna.create_study(sampler=enqueued)
    best_two = sorted((r for r in range(len(feasible)) if feasible.config_hash(r) in hashes[:2]),
                      key=lambda r: hashes.index(feasible.config_hash(r)))
    for row in (best_two[1], 100, best_two[0]):
        only_seeds.enqueue_trial(feasible.trial_params(row))
    run_search(only_seeds, space, {}, lambda c, n: 1.0, n_trials=3)
    assert enqueued.prior_seeds_proposed == 0
    text = transfer_text(prior, enqueued, only_seeds)
    assert "of their 3 best config(s), 2 already tried in this study (earlier, or as one of Inductor's own " \
           "seeds), 1 not reached before" in text, text
    huge = types.SimpleNamespace(feasible_set=None, prior_scored=None)
    assert transfer_text(prior, huge).startswith("transfer: not used: ")
    assert "too large to enumerate" in transfer_text(prior, huge)


def test_the_peer_benchmark_misleads_transfer_with_the_targets_own_scores(tmp_path, conv_db, monkeypatch):
    """scripts/search_peers.py --source: the "never hurts" measurement reads the target's own log
    regrets (its best config 0, the rest ln of their median over the best median, from the raw
    file; not its sibling's, which the database holds too) reversed or shuffled over its configs;
    shuffled: the same values, on other configs, by the shuffle docs/search.md measured (seeded by
    the file's name, the same in every process); failed configs stay failed when reversed."""
    import importlib.util
    import sys

    import numpy as np

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # the script imports search_efficiency from its folder
    spec = importlib.util.spec_from_file_location("search_peers", scripts / "search_peers.py")
    peers = importlib.util.module_from_spec(spec)
    before = sys.modules.pop("search_efficiency", None)
    try:
        spec.loader.exec_module(peers)
    finally:  # the worker's later tests see the modules they saw before
        sys.modules.pop("search_efficiency", None)
        if before is not None:
            sys.modules["search_efficiency"] = before
    db = tmp_path / "z.db"
    shutil.copy(conv_db, db)
    store = Store(f"sqlite:///{db}")
    import_kerneltuner(store, load_kerneltuner(CONV_A100))  # the sibling, first by device key
    replay = load_kerneltuner(CONV_A4000)
    backwards = peers.misleading_scores(store, replay, "reversed")
    shuffled = peers.misleading_scores(store, replay, "permuted")
    assert peers.misleading_scores(store, replay, "permuted") == shuffled
    store.engine.dispose()
    (branch,) = replay.space().branches
    tuned = [p.name for p in branch.params if p.distribution is not None]
    medians = {branch.candidate({n: e[n] for n in tuned}).config_hash: statistics.median(e["times"])
               for e in _raw(CONV_A4000)["cache"].values() if not isinstance(e["time"], str)}
    best = min(medians.values())
    for chash, median in medians.items():
        assert backwards[chash] == pytest.approx(-math.log(median / best), abs=1e-9)
    assert all(v == math.inf for h, v in backwards.items() if h not in medians) and len(backwards) > len(medians)
    keys = sorted(backwards)
    own = np.array([-v if math.isfinite(v) else v for v in (backwards[h] for h in keys)])
    np.random.default_rng(sum(b"convolution_A4000.json.gz")).shuffle(own)
    assert shuffled == dict(zip(keys, own.tolist(), strict=True))
    moved = sum(shuffled[h] != -backwards[h] for h in medians)
    assert moved > 0.9 * len(medians), moved


def test_a_shape_prior_gives_seeds_however_much_it_covers():
    """The transfer model's premise (another device's ranking holds here, scaled) was measured
    between devices only: a neighbouring shape scoring most of a small space (a CPU's 50 points) gives
    seeds (set_prior(model=False)), as docs/search.md says."""
    from zhantune.search import FeasibleTPESampler

    replay = load_kerneltuner(CONV_A100)
    space = replay.space()
    (branch,) = space.branches
    tuned = [p.name for p in branch.params if p.distribution is not None]
    scores = {branch.candidate({n: e[n] for n in tuned}).config_hash: float(i)
              for i, e in enumerate(replay.cache.values())}
    for model, complete in ((True, True), (False, False)):
        sampler = FeasibleTPESampler(seed=0)
        sampler.set_prior(scores, model=model)
        sampler.bind(space, {})
        assert sampler.prior_complete is complete
        assert sampler.prior_seed_count == (0 if complete else 3)


def test_a_device_with_an_empty_key_is_never_a_source(tmp_path):
    from zhantune.problems import GemmProblem

    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    _gemm_rows(store, "", "mm", {"M": 64, "N": 64, "K": 64}, "float32", {"a": 1.0})
    assert load_prior(store, "gpu", GemmProblem.from_config("mm", [64, 64, 64], "float32")) is None


def test_partial_prior_seeds_the_search_with_its_best_configs():
    """A prior covering a few points (a neighbouring shape's short tune): its best configs are
    proposed first, best first; no region."""
    import optuna

    from zhantune.search import FeasibleTPESampler, run_search

    replay = load_kerneltuner(CONV_A100)
    space = replay.space()
    (branch,) = space.branches
    entries = list(replay.cache.values())[:40]
    tuned = [p.name for p in branch.params if p.distribution is not None]
    hashes = [branch.candidate({n: e[n] for n in tuned}).config_hash for e in entries]
    scores = {h: float(i) for i, h in enumerate(hashes)}  # the first entries best
    sampler = FeasibleTPESampler(seed=0)
    sampler.set_prior(scores)
    order: list[str] = []
    run_search(optuna.create_study(sampler=sampler), space, {}, lambda c, n: order.append(c.config_hash) or 1.0,
               n_trials=5)
    assert order[:3] == hashes[:3] and sampler.prior_seed_count == 3
    assert not sampler.prior_complete and sampler.prior_region_size is None  # then the cold search
    assert sampler.prior_scored == 40


def test_problems_are_tuned_largest_share_first(tune_cfg, tmp_path):
    from zhantune.problemset import resolve_problems

    (tmp_path / "p.yaml").write_text(
        "format: zhantune-problems\nproblems:\n"
        "  - {op: mm, shape: [32, 32, 32], share: 0.2}\n"
        "  - {op: mm, shape: [64, 64, 64], share: 0.7}\n"
        "  - {op: mm, shape: [48, 48, 48], share: 0.1}\n")
    cfg = tune_cfg([f"problems={tmp_path / 'p.yaml'}", "device=cpu", "search.total_trials=10",
                    f"storage.url=sqlite:///{tmp_path / 'p.db'}"])
    runs = resolve_problems(cfg)
    assert [r.row["share"] for r in runs] == [0.7, 0.2, 0.1]
    assert runs[0].n_trials == max(r.n_trials for r in runs)  # the trials still follow the shares


def test_bad_transfer_value_is_a_one_line_error(cli, tmp_path):
    r = cli(["bench=replay", f"bench.path={CONV_A100}", "search.transfer=always",
             f"storage.url=sqlite:///{tmp_path / 'b.db'}"], tmp_path)
    assert r.returncode == 2 and "search.transfer='always'; allowed: auto, off" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "b.db").exists()


@pytest.mark.slow
def test_two_shape_multirun_starts_the_second_shape_from_the_first(cli, tmp_path):
    """A real CPU tune of two mm shapes (C++ GEMM template space): the second shape's trials after
    Inductor's own default are the first shape's configs, best first, and its summary says so."""
    r = cli(["-m", "+op=mm", "shape=[32,32,32],[32,32,64]", "search.n_trials=3", "device=cpu", "space=[cpp_gemm]",
             "bench.remeasure_rounds=0", "bench.isolate=false", "progress=false", "search.seed=${shape.2}",
             "export.enabled=false",
             f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    assert "transfer:" in out and "of 1 neighbouring shape(s) on this device: mm[M=32,N=32,K=32]:float32" in out
    con = sqlite3.connect(tmp_path / "zhantune.db")

    def trials(shape: str) -> list[tuple[str, str, float | None]]:
        return con.execute("select m.config_hash, m.status, m.min_us from zt_measurement m "
                           "join zt_problem p on m.problem_id = p.id where m.kind = 'candidate' and p.key = ? "
                           "order by m.trial_number", (f"mm[M=32,N=32,K={shape}]:float32",)).fetchall()

    first, second = trials("32"), trials("64")
    assert len(first) == 3 and len(second) == 3
    ranked = [h for h, status, t in sorted(first, key=lambda r: (r[1] != "ok", r[2] or 0.0))]
    # trial 0 of each shape is Inductor's default point of the space (enqueued first); then the seeds
    assert second[0][0] == first[0][0]
    assert [h for h, _, _ in second[1:]] == [h for h in ranked if h != first[0][0]][:2]


def _toy_space_search(folder: Path, scores: dict[tuple, float] | None, seed: int, trials: int) -> tuple[list[tuple], tuple]:
    """The default sampler on a 512-point toy replay (a, b, c in 1..8, time a * b * c: log time is
    additive, the best point (1, 1, 1)) with ``scores`` as its prior: the points measured, in order."""
    import optuna

    from zhantune.search import FeasibleTPESampler, run_search

    values = list(range(1, 9))
    cache = {f"{a},{b},{c}": {"a": a, "b": b, "c": c, "time": float(a * b * c), "times": [float(a * b * c)] * 3}
             for a in values for b in values for c in values}
    doc = {"device_name": "toy", "kernel_name": "toy", "problem_size": [8], "tune_params_keys": ["a", "b", "c"],
           "tune_params": {"a": values, "b": values, "c": values}, "cache": cache}
    path = folder / "toy3.json"
    path.write_text(json.dumps(doc))
    replay = load_kerneltuner(path)
    space = replay.space()
    (branch,) = space.branches
    sampler = FeasibleTPESampler(seed=seed)
    if scores is not None:
        sampler.set_prior({branch.candidate(dict(zip("abc", k, strict=True))).config_hash: v for k, v in scores.items()})
    seen: list[tuple] = []
    run_search(optuna.create_study(sampler=sampler), space, {},
               lambda cand, n: seen.append(tuple(cand.params[k] for k in "abc")) or float(math.prod(seen[-1])),
               n_trials=trials)
    return seen, (1, 1, 1)


@pytest.mark.parametrize("seed", range(4))
def test_a_source_that_ranks_this_device_backwards_does_not_trap_the_search(tmp_path, seed):
    """Transfer must never do worse than a cold start on a device unlike every source: here the
    source ranks every config exactly backwards (its best is this device's worst). The search stayed
    in the source's best tenth (this device's worst tenth) until something outside it was measured
    better, which a replay never offered; the transfer model learns the other device's weight
    (negative here) and the per-value effects from the results, and finds the best point within 30
    of 512 trials, where 30 uniform draws would find it once in 17 runs."""
    reversed_scores = {(a, b, c): -math.log(a * b * c) for a in range(1, 9) for b in range(1, 9) for c in range(1, 9)}
    seen, best = _toy_space_search(tmp_path, reversed_scores, seed, 30)
    assert best in seen, seen


def test_the_transfer_model_recovers_a_linear_log_time_and_ranks_failures_last():
    """zhantune.search.surrogate.TransferModel: log times that are exactly 0.5 * score + per-value
    effects are recovered from the posterior (draws agree on the ranking of unmeasured points); a
    failed config's value sits above the slowest that ran; bad prior sds are refused."""
    import numpy as np

    from zhantune.search.surrogate import TransferModel

    rng = np.random.default_rng(0)
    n, values = 200, 4
    codes = rng.integers(0, values, size=(n, 2))
    one_hot = np.zeros((n, 2 * values))
    one_hot[np.arange(n), codes[:, 0]] = one_hot[np.arange(n), values + codes[:, 1]] = 1
    score = rng.uniform(0, 2, size=n)
    effect = np.array([0.0, 0.3, -0.2, 0.5, 0.1, -0.4, 0.0, 0.2])
    log_t = 3.0 + 0.5 * score + one_hot @ effect
    model = TransferModel()
    x = model.design(score, one_hot)
    train, test = slice(0, 60), slice(60, n)
    w = model.sample_weights(x[train], np.exp(log_t[train]), rng)
    assert w[1] == pytest.approx(0.5, abs=0.05)  # the other devices' weight here
    predicted = x[test] @ w
    assert np.corrcoef(predicted, log_t[test])[0, 1] > 0.99
    # a failed config (inf) counts as slower than the slowest that ran: its predicted time goes up
    failed = np.exp(log_t[train]).copy()
    failed[0] = np.inf
    sharp = TransferModel(noise_sd=0.01)
    assert x[0] @ sharp.sample_weights(x[train], failed, np.random.default_rng(1)) > \
        x[0] @ sharp.sample_weights(x[train], np.exp(log_t[train]), np.random.default_rng(1)) + 0.01
    # no data: a draw from the prior, which trusts the other devices' ranking (weight near 1)
    draws = [TransferModel().sample_weights(x[:0], np.zeros(0), rng)[1] for _ in range(200)]
    assert statistics.mean(draws) == pytest.approx(1.0, abs=0.1)
    for bad in ({"slope_sd": 0}, {"effect_sd": -1}, {"noise_sd": float("nan")}):
        with pytest.raises(ValueError):
            TransferModel(**bad)


def test_a_huge_space_scores_the_top_of_the_prior_and_a_sample_of_the_rest():
    """Where the one-hot codes are not precomputed (spaces over ~60,000 points) the model scores
    ``limit`` candidates: half the best by prior score, half a uniform sample. A uniform sample
    alone would rarely hold the other devices' best config; here it is always proposed first."""
    import numpy as np

    from zhantune.search.surrogate import TransferModel

    n = 5000
    filled = np.full(n, 5.0)
    filled[1234] = 0.0  # the other devices' best by far
    one_hot = np.eye(2)[np.arange(n) % 2]
    order = np.argsort(filled, kind="stable")
    for seed in range(10):
        rng = np.random.default_rng(seed)
        row = TransferModel().pick(filled, order, np.ones(n, dtype=bool), np.zeros(0, dtype=np.int64), np.zeros(0),
                                   lambda rows: one_hot[rows], rng, limit=16)
        assert row == 1234
