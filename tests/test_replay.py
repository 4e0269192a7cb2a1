"""Replay of Kernel Tuner cache files: reader, benchmarker, and the whole tune pipeline on real GPU data."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import statistics
from pathlib import Path

import optuna
import pytest

from zhantune.bench.decision import decision_us
from zhantune.bench.recorded import ReplayBenchmarker, load_kerneltuner
from zhantune.errors import ConfigError
from zhantune.search.feasible import enumerate_feasible
from zhantune.storage import Store

DATA = Path(__file__).resolve().parent / "data" / "kerneltuner"
A100 = DATA / "convolution_A100.json.gz"


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def a100():
    return load_kerneltuner(A100)


def test_space_is_the_files_tune_params_and_feasible_points_are_its_cache_keys(a100):
    raw = _raw(A100)
    space = a100.space()
    (branch,) = space.branches
    tuned = {p.name: p.values() for p in branch.params if p.distribution is not None}
    fixed = {p.name: p.value for p in branch.params if p.distribution is None}
    assert tuned == {k: v for k, v in raw["tune_params"].items() if len(v) > 1}
    assert fixed == {k: v[0] for k, v in raw["tune_params"].items() if len(v) == 1}
    fs = enumerate_feasible(space, {})
    assert len(fs) == len(raw["cache"])  # 4,201 ran + 161 failed; the rest of 10,240 is infeasible
    absent = {"block_size_x": 16, "block_size_y": 1, "tile_size_x": 1, "tile_size_y": 1, "read_only": 0,
              "use_padding": 1, "use_shmem": 0}
    key = ",".join(str({**fixed, **absent}[n]) for n in raw["tune_params_keys"])
    assert key not in raw["cache"]
    assert not branch.feasible(absent, {})


def test_fixing_parameters_restricts_the_space_to_that_slice_of_the_file(a100):
    raw = _raw(A100)
    fixed = {"read_only": 1, "use_padding": 0, "use_shmem": 1}
    fs = enumerate_feasible(a100.space(fixed), {})
    in_slice = [e for e in raw["cache"].values() if all(e[k] == v for k, v in fixed.items())]
    assert 0 < len(fs) == len(in_slice) < len(raw["cache"])
    tuned = {p.name for p in a100.space(fixed).branches[0].params if p.distribution is not None}
    assert tuned == {"block_size_x", "block_size_y", "tile_size_x", "tile_size_y"}
    for branch, values in fs.points:  # every candidate of the slice carries the fixed values
        assert fixed.items() <= branch.candidate(values).params.items()


@pytest.mark.parametrize(("fixed", "message"), [
    ({"readonly": 1}, "cannot fix readonly: not a parameter of tune_params; allowed: block_size_x"),
    ({"read_only": 2}, "cannot fix read_only=2: allowed values [0, 1]"),
])
def test_fixing_an_unknown_parameter_or_value_is_a_clear_error(a100, fixed, message):
    with pytest.raises(ConfigError) as e:
        a100.space(fixed)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_measurements_are_answered_from_the_file(a100):
    raw = _raw(A100)
    bench = ReplayBenchmarker(a100)
    (branch,) = a100.space().branches
    names = raw["tune_params_keys"]
    by_marker: dict[str, str] = {}
    checked = 0
    for entry in raw["cache"].values():
        values = {n: entry[n] for n in names}
        meas = bench.measure(branch.candidate({k: v for k, v in values.items() if len(raw["tune_params"][k]) > 1}))
        if isinstance(entry["time"], str):
            assert not meas.ok and meas.error_text == entry["time"]
            by_marker[entry["time"]] = meas.status
        elif checked < 50:
            assert meas.ok
            assert meas.timing.median_us == pytest.approx(statistics.median(entry["times"]) * 1000)
            assert meas.timing.n == len(entry["times"])
            checked += 1
    assert by_marker == {"RuntimeFailedConfig": "runtime_error", "CompilationFailedConfig": "compile_error"}
    best = min(statistics.median(e["times"]) for e in raw["cache"].values() if not isinstance(e["time"], str))
    assert a100.best_time_us() == pytest.approx(best * 1000)


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    (b"not json", "not a Kernel Tuner cache file (JSON)"),
    (b"[1, 2]", "top level is not an object"),
    (b'{"device_name": "x"}', "missing key 'kernel_name'"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": []}, "cache": {}}', "tune_params.a must be a non-empty list"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1]}, "cache": {"1": {"a": 1}}}', "cache.1 lacks 'time'"),
    # values the search would offer twice (replay asked ~1000 times for a 2-point space), a parameter
    # whose name is the entry's recorded time, a file with nothing recorded
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1, 2, 1.0]}, "cache": {"1": {"a": 1, "time": 1}}}',
     "tune_params.a lists 1.0 twice; a parameter's values are distinct"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a", "a"],'
     b' "tune_params": {"a": [1]}, "cache": {"1,1": {"a": 1, "time": 1}}}', "tune_params_keys lists 'a' twice"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["time"],'
     b' "tune_params": {"time": [1]}, "cache": {"1": {"time": 1}}}',
     "tune_params_keys names the parameter 'time', which an entry uses for its recorded time"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1, true]}, "cache": {}}', "cache is empty: no recorded configuration"),
    # session 48's attack: an entry's 4 against tune_params' 4.0 imported, and the replay sampled 4.0 and
    # found no entry; a parameter's name or value with a control character was stored and printed raw
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1, 4.0]}, "cache": {"4": {"a": 4, "time": 1}}}',
     "cache.'4'.a=4 is not one of tune_params.a [1, 4.0] (written alike: 4 and 4.0 are two values)"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a\\nx"],'
     b' "tune_params": {"a\\nx": [1]}, "cache": {"1": {"a\\nx": 1, "time": 1}}}',
     "tune_params_keys holds 'a\\nx'; a parameter's name is plain text (no control or format character) of at most "
     "100 characters"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": ["x\\u0000y"]}, "cache": {"x\\u0000y": {"a": "x\\u0000y", "time": 1}}}',
     "tune_params.a holds 'x\\x00y'; a parameter's values are finite numbers, strings of plain text"),
    # a time that is neither a number nor a failure name (was stored as a failure), a run that is not a number
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1]}, "cache": {"1": {"a": 1, "time": true}}}', "cache.1.time=True; a recorded time"),
    (b'{"device_name": "x", "kernel_name": "k", "problem_size": [1], "tune_params_keys": ["a"],'
     b' "tune_params": {"a": [1]}, "cache": {"1": {"a": 1, "time": 2.0, "times": [2.0, null]}}}',
     "cache.1.times[1]=None; a recorded time"),
])
def test_bad_replay_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "cache.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_kerneltuner(path)
    assert str(e.value).startswith(f"bench.path={path}")
    assert message in str(e.value)


def test_a_second_recording_of_one_device_and_problem_is_replayed_from_its_own_data(cli, tmp_path):
    """Two Kernel Tuner files of one device, kernel and problem size (the second's times 3x the
    first's) replayed into one database: the second is not answered "finished" with the first's best
    nor served the first's rows as cached; it gets its own study (``[sha256:...]``) and stores its own
    times; the first file again finds its own study finished."""
    import gzip

    raw = {"device_name": "GPU-R", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
           "tune_params": {"x": [1, 2, 3]}, "objective": "time",
           "cache": {str(x): {"x": x, "time": float(x), "times": [float(x)] * 3} for x in (1, 2, 3)}}
    slow = {**raw, "cache": {k: {**e, "time": e["time"] * 3, "times": [t * 3 for t in e["times"]]}
                             for k, e in raw["cache"].items()}}
    for name, doc in (("a.json.gz", raw), ("b.json.gz", slow)):
        (tmp_path / name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    db = tmp_path / "r.db"

    def replay(name):
        r = cli(["bench=replay", f"bench.path={name}", "search.n_trials=3", "progress=false",
                 f"storage.url=sqlite:///{db}"], tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        return " ".join(r.stdout.split())

    assert "trials: 3 measured (ok 3), 0 cached" in replay("a.json.gz")
    out = replay("b.json.gz")
    assert "trials: 3 measured (ok 3), 0 cached" in out, out[-2000:]
    # the summary names the study whole (rich markup would take "[sha256:...]" for a style) and
    # gives this file's best (3,000 us), not the first file's (1,000 us)
    assert re.search(r"study: kerneltuner:k\[64\]\[sha256:[0-9a-f]{12}\]@GPU-R", out), out[-2000:]
    assert "│ ok │ 3,000.0 │" in out and "1,000.0" not in out, out[-2000:]
    again = replay("b.json.gz")
    assert re.search(r"study 'kerneltuner:k\[64\]\[sha256:[0-9a-f]{12}\]@GPU-R' is finished", again), again
    assert "best config: kerneltuner::k x=1 (3,000.0 us)" in again, again
    first = replay("a.json.gz")
    assert "'kerneltuner:k[64]@GPU-R' is finished" in first and "(1,000.0 us)" in first, first
    assert "zhantune.export" not in first, first  # no table carries a recording's configs (a helper's)
    with sqlite3.connect(db) as con:
        got = con.execute("select s.name, m.median_us from zt_measurement m join zt_study s on s.id = m.study_id "
                          "where m.kind = 'candidate' order by m.median_us").fetchall()
    plain = [us for name, us in got if name == "kerneltuner:k[64]@GPU-R"]
    other = [us for name, us in got if name != "kerneltuner:k[64]@GPU-R"]
    assert plain == pytest.approx([1000.0, 2000.0, 3000.0]) and other == pytest.approx([3000.0, 6000.0, 9000.0]), got


def _two_recordings(tmp_path, device_name="GPU-R"):
    """Two Kernel Tuner files of one device, kernel and problem size; the second's times are 3x."""
    import gzip

    paths = []
    for sub, scale in (("a", 1.0), ("b", 3.0)):
        doc = {"device_name": device_name, "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
               "tune_params": {"x": [1, 2]},
               "cache": {str(x): {"x": x, "time": x * scale, "times": [x * scale] * 2} for x in (1, 2)}}
        (tmp_path / sub).mkdir()
        paths.append(tmp_path / sub / "k_GPUX.json.gz")
        paths[-1].write_bytes(gzip.compress(json.dumps(doc).encode()))
    return paths


def test_two_gpus_recorded_under_their_names_never_become_one_device(cli, tmp_path):
    """A helper's attack on compare (session 44): a replay of an A100's file with
    bench.device_name='NVIDIA RTX A4000' added its rows to the A4000's device (its best went from
    997.9 to 812.0 us), and an import with devices=[GPU,GPU] made one device of both. A file that
    records its GPU's name may not join a device holding the problem from a file recorded on
    another: refused in one line (exit 2, nothing written); a second recording of the same GPU under
    the name given, and a replay of the imported file itself, still join it."""
    import gzip
    import hashlib

    a, b = _two_recordings(tmp_path)  # both recorded on GPU-R
    doc = json.loads(gzip.decompress(a.read_bytes()))
    other = tmp_path / "c.json"
    other.write_text(json.dumps({**doc, "device_name": "GPU-S"}))
    db = tmp_path / "r.db"
    url = f"storage.url=sqlite:///{db}"
    r = cli([f"files=[{a},{other}]", "devices=[GPU,GPU]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 2 and not db.exists(), r.stderr[-2000:]
    assert "(recorded on 'GPU-R') and" in r.stderr and "two GPUs in one device; name them apart with devices=[...]" \
        in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli([f"files=[{a}]", "devices=[GPU]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr[-2000:]
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    r = cli(["bench=replay", f"bench.path={other}", "bench.device_name=GPU", "search.n_trials=2", "progress=false", url],
            tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"bench.path={other}: recorded on 'GPU-S', gives device 'GPU', which holds" in r.stderr
    assert "recorded on 'GPU-R': two GPUs in one device; name them apart with bench.device_name=NAME" in r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    for path in (b, a):  # another recording of GPU-R, then the imported file replayed: the same GPU
        r = cli(["bench=replay", f"bench.path={path}", "bench.device_name=GPU", "search.n_trials=2",
                 "progress=false", url], tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]


def test_a_device_holds_the_recordings_of_one_gpu_whatever_the_problem_the_order_or_the_database(cli, tmp_path):
    """A helper's attack (session 45) on the check above: a finished replay's study lost the name its
    file records (the tune rewrote its config), so an A100's import then joined the device of an
    A4000's replay named after it; the check was per problem (an A4000's convolution and an A100's
    dedispersion under one name given passed); ``zhantune.db merge`` did not check at all; a study
    stored before the name was kept counted as no GPU. Each is refused in one line (exit 2), nothing
    written; a file of the device's own name still joins a database of before."""
    import gzip
    import hashlib

    from sqlalchemy import select

    from zhantune.storage import orm

    a, _ = _two_recordings(tmp_path)  # problem [64], recorded on GPU-R
    doc = json.loads(gzip.decompress(a.read_bytes()))
    s64, r128 = tmp_path / "s64.json", tmp_path / "r128.json"
    s64.write_text(json.dumps({**doc, "device_name": "GPU-S"}))
    r128.write_text(json.dumps({**doc, "problem_size": [128]}))

    def run(args, db, module="zhantune"):
        extra = ["progress=false", "search.n_trials=2"] if module == "zhantune" else []
        return cli([*args, f"storage.url=sqlite:///{db}", *extra], tmp_path, module=module)

    def refused(r, db, *parts):
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
        assert all(p in r.stderr for p in parts), r.stderr
        assert db is None or hashlib.sha256(db.read_bytes()).hexdigest() == digest[db], db

    one, two = tmp_path / "one.db", tmp_path / "two.db"
    assert run(["bench=replay", f"bench.path={s64}", "bench.device_name=GPU"], one).returncode == 0
    assert Store(f"sqlite:///{one}").study_config("kerneltuner:k[64]@GPU")["recorded_device"] == "GPU-S"
    assert run([f"files=[{a}]", "devices=[GPU-R]"], two, "zhantune.kerneltuner").returncode == 0
    digest = {db: hashlib.sha256(db.read_bytes()).hexdigest() for db in (one, two)}
    refused(run([f"files=[{r128}]", "devices=[GPU]"], one, "zhantune.kerneltuner"), one,
            "recorded on 'GPU-R', gives device 'GPU', which holds study 'kerneltuner:k[64]@GPU', recorded on 'GPU-S'")
    refused(run([f"files=[{s64},{r128}]", "devices=[G,G]"], tmp_path / "new.db", "zhantune.kerneltuner"), None,
            "(recorded on 'GPU-S') and", "(recorded on 'GPU-R') both give device 'G': two GPUs in one device")
    assert not (tmp_path / "new.db").exists()
    # two databases, each of one GPU named GPU-R: one of them renamed after the other
    assert run(["bench=replay", f"bench.path={s64}", "bench.device_name=GPU-R"], tmp_path / "three.db").returncode == 0
    refused(cli(["merge", f"sources=[sqlite:///{two},sqlite:///{tmp_path / 'three.db'}]",
                 f"storage.url=sqlite:///{tmp_path / 'merged.db'}"], tmp_path, module="zhantune.db"), None,
            "made on 'GPU-R' on device 'GPU-R', where study", "made on 'GPU-S': two GPUs in one device; nothing was merged")
    assert not (tmp_path / "merged.db").exists()
    # a database of before: its study holds no recorded name. The name is read from its file where that is
    # still there (a review: a second file of the same GPU was refused with no way to add it); without the
    # file a renamed one may be another GPU, a file of the device's own name is taken as its GPU
    old = tmp_path / "old.db"
    assert run([f"files=[{a}]", "devices=[G]"], old, "zhantune.kerneltuner").returncode == 0
    edit = Store(f"sqlite:///{old}")
    with edit.session() as s:
        study = s.scalars(select(orm.Study).where(orm.Study.name.like("kerneltuner:%"))).one()
        study.config = {k: v for k, v in study.config.items() if k != "recorded_device"}
    edit.engine.dispose()  # the WAL checkpointed into the file
    digest[old] = hashlib.sha256(old.read_bytes()).hexdigest()
    a.parent.rename(tmp_path / "gone")
    refused(run(["bench=replay", f"bench.path={s64}", "bench.device_name=G"], old), old,
            "recorded on 'GPU-S', gives device 'G', which holds study", "stored before zhantune kept the device name")
    (tmp_path / "gone").rename(a.parent)
    refused(run(["bench=replay", f"bench.path={s64}", "bench.device_name=G"], old), old,
            "recorded on 'GPU-S', gives device 'G', which holds study", "recorded on 'GPU-R': two GPUs in one device")
    assert run([f"files=[{r128}]", "devices=[G]"], old, "zhantune.kerneltuner").returncode == 0
    # one database that already holds two GPUs in one device (stored before the rule; made here by an
    # edit): its first merge is refused too, not only a second one (a review's finding)
    mixed = tmp_path / "mixed.db"
    assert run([f"files=[{a},{r128}]", "devices=[G,G]"], mixed, "zhantune.kerneltuner").returncode == 0
    edit = Store(f"sqlite:///{mixed}")
    with edit.session() as s:
        study = s.scalars(select(orm.Study).where(orm.Study.name.like("kerneltuner:r128%"))).one()
        study.config = {**study.config, "recorded_device": "GPU-S"}
    edit.engine.dispose()
    refused(cli(["merge", f"sources=[sqlite:///{mixed}]", f"storage.url=sqlite:///{tmp_path / 'm2.db'}"], tmp_path,
                module="zhantune.db"), None, "of sources[0] holds one made on", "two GPUs in one device; nothing was merged")
    assert not (tmp_path / "m2.db").exists()


def test_a_replay_study_records_its_file_before_anything_is_measured(tmp_path):
    """Naming a replay's study creates it with the file's digest at once (real SQLite): a job that
    starts on another file of the same device and problem before the first measured anything gets
    its own study (two jobs started together never share one); the first file keeps the plain name;
    search.study_name may not name another file's replay nor an import's study, and adopts a replay
    study stored before digests were recorded; an automatic name is never such a study. A device
    named after the file name belongs to the first file that named its study, measured or not."""
    from zhantune.storage import Store
    from zhantune.storage.ingest import check_import, replay_study

    a, b = (load_kerneltuner(p) for p in _two_recordings(tmp_path))
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    key, dev = a.problem().key, a.device_key
    assert replay_study(store, a, key, dev, None) == f"{key}@{dev}"
    other = replay_study(store, b, key, dev, None)
    assert other == f"{key}[sha256:{b.sha256[:12]}]@{dev}" and b.sha256 != a.sha256
    assert replay_study(store, a, key, dev, None) == f"{key}@{dev}" == replay_study(store, a, key, dev, f"{key}@{dev}")
    assert store.study_config(f"{key}@{dev}") == {"replay_sha256": a.sha256, "content_sha256": a.content_digest,
                                                  "recorded_device": "GPU-R"}
    with pytest.raises(ConfigError, match=r"search.study_name='kerneltuner:k\[64\]@GPU-R' holds another "
                                          r"file's replay \(sha256 [0-9a-f]{12}\.\.\.\), not bench.path=.*b/k_GPUX"):
        replay_study(store, b, key, dev, f"{key}@{dev}")
    store.reserve_study("imported", {"source": "x", "sha256": a.sha256, "format": "kerneltuner"})
    with pytest.raises(ConfigError, match="search.study_name='imported' holds an import's measurements"):
        replay_study(store, a, key, dev, "imported")
    store.reserve_study("old", {"bench": {"name": "replay"}})  # a replay stored before digests were
    assert replay_study(store, a, key, dev, "old") == "old"
    store.reserve_study("tuned", {"bench": {"name": "inductor"}, "op": {"name": "mm"}})
    with pytest.raises(ConfigError, match="search.study_name='tuned' holds a tune, not a replay"):
        replay_study(store, a, key, dev, "tuned")
    # the automatic name never adopts a digest-less study: it may hold another file
    fresh = Store(f"sqlite:///{tmp_path / 'f.db'}")
    fresh.reserve_study(f"{key}@{dev}", {"bench": {"name": "replay"}})
    assert replay_study(fresh, a, key, dev, None) == f"{key}[sha256:{a.sha256[:12]}]@{dev}"
    # files without device_name: the second file is refused while the first has not measured anything
    (tmp_path / "unnamed").mkdir()
    c, d = (load_kerneltuner(p) for p in _two_recordings(tmp_path / "unnamed", device_name=""))
    assert replay_study(fresh, c, c.problem().key, "GPUX", None) == f"{c.problem().key}@GPUX"
    with pytest.raises(ConfigError, match="records no device_name and its file name gives device 'GPUX'"):
        replay_study(fresh, d, d.problem().key, "GPUX", "another-name")
    with pytest.raises(ConfigError, match="files=.*records no device_name .* from study 'kerneltuner:k\\[64\\]@GPUX'"):
        check_import(fresh, d)  # an import of the other file: refused by the reservation alone


def test_one_recording_is_imported_once_and_a_named_file_never_joins_a_file_named_device(tmp_path):
    """An attack (session 42): (1) a renamed or decompressed copy of an imported file added its rows
    again as a new study of the same device ("importing the same file again adds nothing"); now the
    import answers the first study's name and 0. (2) A file-named device (its file records no
    device_name) took another file's data when that file's device_name (or devices=[...]) gave the
    same name; only the other order was refused. Now both orders are, before anything is written."""
    import gzip

    from zhantune.storage import Store
    from zhantune.storage.ingest import check_import, import_kerneltuner

    a_path, b_path = _two_recordings(tmp_path, device_name="")
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    name, added = import_kerneltuner(store, load_kerneltuner(a_path))
    assert name == "kerneltuner:k_GPUX.json.gz@GPUX" and added == 2
    (tmp_path / "c").mkdir()
    renamed, plain = tmp_path / "c" / "k_GPUX-copy.json.gz", tmp_path / "c" / "k_GPUX.json"
    renamed.write_bytes(a_path.read_bytes())
    plain.write_bytes(gzip.decompress(a_path.read_bytes()))
    for copy in (renamed, plain):
        assert import_kerneltuner(store, load_kerneltuner(copy, device="GPUX")) == (name, 0)
    assert len(store.study_candidates(name)) == 2 and len(store.study_names()) == 1
    doc = json.loads(gzip.decompress(b_path.read_bytes()))
    named = tmp_path / "named.json"
    named.write_text(json.dumps({**doc, "device_name": "GPUX"}))
    for other in (load_kerneltuner(named), load_kerneltuner(b_path, device="GPUX")):
        with pytest.raises(ConfigError, match=r"files=.*: gives device 'GPUX' \(from (its device_name|devices)\), a "
                                              r"device named after another Kernel Tuner file's name .* from study "
                                              r"'kerneltuner:k_GPUX.json.gz@GPUX'; name the device") as refused:
            check_import(store, other)
        assert "stored without" not in str(refused.value)  # the study's digests were read, not missing
    assert len(store.study_names()) == 1


def test_one_name_in_two_unicode_forms_is_one_device_and_one_gpu(tmp_path):
    """Noticed in session 45: a device name typed or recorded in NFC ("é", one code point) and in NFD
    (e + U+0301, as macOS file names are) printed alike but made two devices, and the second
    recording of one GPU was refused as another GPU. Names are NFC from the loader on."""
    import unicodedata

    from zhantune.storage.ingest import check_import, import_kerneltuner

    nfc, nfd = (unicodedata.normalize(form, "Café GPU") for form in ("NFC", "NFD"))
    assert nfc != nfd
    a_path, b_path = _two_recordings(tmp_path, device_name=nfc)
    doc = json.loads(gzip.decompress(b_path.read_bytes()))
    b_path.write_bytes(gzip.compress(json.dumps({**doc, "device_name": nfd}).encode()))
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    import_kerneltuner(store, load_kerneltuner(a_path))
    second = load_kerneltuner(b_path)
    assert second.device_key == nfc and second.device_name == nfc
    check_import(store, second)  # the same GPU: not refused as another
    import_kerneltuner(store, second)
    assert [d.key for d in store.devices()] == [nfc]
    named = load_kerneltuner(b_path, device=unicodedata.normalize("NFD", "Gérard's GPU"))
    assert named.device_key == unicodedata.normalize("NFC", "Gérard's GPU")


def test_a_second_recordings_study_name_that_would_not_fit_names_search_study_name(tmp_path):
    """The plain study name fits the database (507 characters), the second recording's [sha256:...]
    one would not: one line naming search.study_name, which then works."""
    from zhantune.storage import Store
    from zhantune.storage.ingest import replay_study

    long = dict(kernel_name="k" * 100, device_name="D" * 250, problem_size=[10**9] * 13)
    files = []
    for i in (1, 3):
        doc = {**long, "tune_params_keys": ["x"], "tune_params": {"x": [1]},
               "cache": {"1": {"x": 1, "time": float(i), "times": [float(i)]}}}
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(doc))
        files.append(load_kerneltuner(path))
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    key, dev = files[0].problem().key, files[0].device_key
    n = len(replay_study(store, files[0], key, dev, None))
    assert n <= 512 < n + len("[sha256:0123456789ab]")
    with pytest.raises(ConfigError, match=f"this file's own study name would be {n + 21} characters .* "
                                          "search.study_name=NAME"):
        replay_study(store, files[1], key, dev, None)
    assert replay_study(store, files[1], key, dev, "second") == "second"


def test_a_file_named_only_by_its_file_name_never_replays_into_another_files_device(cli, tmp_path):
    """Two files without device_name whose file names give one device (``k_GPUX``), different data:
    the second replay is refused in one line (exit 2, the database untouched) and names
    bench.device_name; with it, the second file replays as its own device. bench.device_name outside
    a replay is refused too."""
    import hashlib

    _two_recordings(tmp_path, device_name="")
    db = tmp_path / "r.db"

    def replay(path, *extra):
        return cli(["bench=replay", f"bench.path={path}", "search.n_trials=2", "progress=false",
                    f"storage.url=sqlite:///{db}", *extra], tmp_path)

    assert replay("a/k_GPUX.json.gz").returncode == 0
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    r = replay("b/k_GPUX.json.gz")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert ("bench.path=b/k_GPUX.json.gz: records no device_name and its file name gives device 'GPUX'" in r.stderr
            and "name the device with bench.device_name=NAME" in r.stderr), r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    r = replay("b/k_GPUX.json.gz", "bench.device_name=GPUX-b")
    assert r.returncode == 0, r.stderr[-2000:]
    with sqlite3.connect(db) as con:
        assert sorted(k for (k,) in con.execute("select key from zt_device")) == ["GPUX", "GPUX-b"]
    r = cli(["+op=mm", "shape=[8,8,8]", "device=cpu", "bench.device_name=x", f"storage.url=sqlite:///{db}"], tmp_path)
    assert r.returncode == 2 and "bench.device_name='x' names a replayed file's device; it needs bench=replay" \
        in r.stderr, r.stderr[-2000:]
    # the second file named into the first's device by bench.device_name (an attack, session 42: its
    # study landed beside the first file's): refused in one line, nothing written
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    r = replay("b/k_GPUX.json.gz", "bench.device_name=GPUX")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert ("bench.path=b/k_GPUX.json.gz: gives device 'GPUX' (from bench.device_name), a device named after another "
            "Kernel Tuner file's name" in r.stderr and "name the device with bench.device_name=NAME" in r.stderr), r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # search.study_name naming the first file's study for the second file: one line, nothing written
    r = replay("b/k_GPUX.json.gz", "bench.device_name=GPUX-b", 'search.study_name="kerneltuner:k[64]@GPUX"')
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "search.study_name='kerneltuner:k[64]@GPUX' holds another file's replay" in r.stderr, r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # a replay stored before digests were recorded may hold another file: the file-name device is refused
    with sqlite3.connect(db) as con:
        con.execute("update zt_study set config = json_remove(config, '$.replay_sha256') "
                    "where name = 'kerneltuner:k[64]@GPUX'")
    r = replay("a/k_GPUX.json.gz")
    assert r.returncode == 2 and "(stored without its file's sha256: it may be another file)" in r.stderr, r.stderr
    # ... unless search.study_name names it: then it is taken as this file's (README: old databases)
    r = replay("a/k_GPUX.json.gz", 'search.study_name="kerneltuner:k[64]@GPUX"')
    assert r.returncode == 0 and "is finished" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_renamed_copy_of_a_file_named_by_its_file_name_is_its_recordings_device(cli, tmp_path):
    """A helper's: dedispersion_MI250X.json.gz records no device_name, so its device is named after
    its file name; a decompressed copy under another name imported its 11,130 measurements again as a
    second device ('mi_copy'), and a replay of a renamed copy made a third: compare ranked them as three
    GPUs. The same recording under any file name is now the device that holds it: the import adds
    nothing and says which device holds it, the replay is that device's."""
    import shutil

    src = DATA / "dedispersion_MI250X.json.gz"
    (tmp_path / "mi_copy.json").write_bytes(gzip.decompress(src.read_bytes()))
    shutil.copy(src, tmp_path / "mi.json.gz")
    url = f"storage.url=sqlite:///{tmp_path}/z.db"
    r = cli([f"files=[{src}]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0 and "11,130 measurement(s) of device 'MI250X'" in r.stdout, r.stdout + r.stderr
    r = cli(["files=[mi_copy.json]", url], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0 and ("mi_copy.json: 0 measurement(s) of device 'MI250X' (the device holding this "
                                  "recording, imported under another file name)") in r.stdout, r.stdout + r.stderr
    r = cli(["bench=replay", "bench.path=mi.json.gz", "search.n_trials=3", "progress=false", url], tmp_path)
    assert r.returncode == 0 and "@MI250X" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    with sqlite3.connect(tmp_path / "z.db") as con:
        assert [k for (k,) in con.execute("select key from zt_device")] == ["MI250X"]
        assert con.execute("select count(*) from zt_measurement").fetchone() == (11130 + 3,)
    # the file and its copy in one import (a review's: adopted before either was stored, two devices)
    one = f"storage.url=sqlite:///{tmp_path}/one.db"
    r = cli([f"files=[{src},mi_copy.json]", one], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0 and "mi_copy.json: 0 measurement(s) of device 'MI250X'" in r.stdout, r.stdout + r.stderr
    with sqlite3.connect(tmp_path / "one.db") as con:
        assert [k for (k,) in con.execute("select key from zt_device")] == ["MI250X"]


def test_cli_replay_stores_100_measurements_and_resumes(cli, tmp_path):
    db = tmp_path / "replay.db"
    args = ["bench=replay", f"bench.path={A100}", "search.n_trials=100", f"storage.url=sqlite:///{db}",
            "progress=false"]
    r = cli(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trials: 100 measured" in r.stdout and "0 infeasible" in r.stdout
    # the summary says whose times these are, and shows the recorded median alone, the file's objective
    # (a claims audit, session 40: "min us" held the median, under a title that read as a measurement here)
    out = " ".join(r.stdout.split())
    assert f"recorded in {Path(A100).name} and replayed, not measured here" in out, out[:2000]
    assert "median us" in out and "min us" not in out, out[:2000]
    con = sqlite3.connect(db)
    rows = con.execute("select config_hash, status, median_us, template_id, params from zt_measurement "
                       "where kind='candidate'").fetchall()
    assert len(rows) == 100
    assert len({r[0] for r in rows}) == 100  # never the same configuration twice
    assert {r[3] for r in rows} == {"kerneltuner::convolution_kernel"}
    (dev,) = con.execute("select key from zt_device").fetchone()
    assert dev == "NVIDIA A100-PCIE-40GB"
    con.close()
    # every stored number is the file's: recompute it from the raw entry of the stored params
    raw = _raw(A100)
    for _, status, median_us, _, params in rows:
        entry = raw["cache"][",".join(str(json.loads(params)[n]) for n in raw["tune_params_keys"])]
        if isinstance(entry["time"], str):
            assert status != "ok" and median_us is None
        else:
            assert status == "ok" and median_us == pytest.approx(statistics.median(entry["times"]) * 1000)
    study = optuna.load_study(study_name="kerneltuner:convolution_kernel[4096x4096]@NVIDIA A100-PCIE-40GB",
                              storage=f"sqlite:///{db}")
    measured = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]
    assert len(measured) == 100

    # resume: 20 more, all new; its progress bar's best is the study's (it was this run's alone)
    r = cli([*args[:2], "search.more_trials=20", *args[3:4], "progress=true"], tmp_path)
    assert r.returncode == 0, r.stderr
    con = sqlite3.connect(db)
    hashes = [h for (h,) in con.execute("select config_hash from zt_measurement where kind='candidate'")]
    con.close()
    assert len(hashes) == 120 and len(set(hashes)) == 120
    # the study's best by the ranking's statistic (zhantune.bench.decision), as the summary ranks it
    study = "kerneltuner:convolution_kernel[4096x4096]@NVIDIA A100-PCIE-40GB"
    best_us = min(decision_us(row) for row in Store(f"sqlite:///{db}").study_candidates(study) if row.status == "ok")
    bar = [line for line in r.stdout.splitlines() if line.startswith("trial 120/120 ") and "best " in line]
    assert bar and f"best {best_us:,.1f} us | " in bar[-1], (best_us, r.stdout[-3000:])


def test_multirun_summary_prints_bracketed_study_names_whole(tmp_path, capsys):
    """A multirun's job and study tables print a replay's ``[sha256:...]`` study name and a config
    with brackets as stored: rich markup would take them for styles and drop them."""
    from zhantune.multirun import JOB_RECORD, print_multirun_summary

    name = "kerneltuner:k[64][sha256:0da0002419c5]@GPU-R"
    study = {"study": name, "n_trials": 3, "measured": 3, "retried": 0, "reaped": 0, "cached": 0,
             "study_measured": 3, "waited_s": 0.0, "interrupted": False, "already_finished": False,
             "resettled": False, "best_us": 3000.0, "best": "kerneltuner::k {x=[bold]1}"}
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / JOB_RECORD).write_text(json.dumps(
        {"zhantune_job": 1, "job": 0, "worker": "host[a]:1", "storage": "sqlite:///r.db",
         "ended_at": "2026-11-27T00:00:00+00:00", "studies": [study]}))
    print_multirun_summary(tmp_path, 1)
    out = capsys.readouterr().out
    assert out.count("[sha256:0da0002419c5]") == 2 and "host[a]:1" in out and "{x=[bold]1}" in out, out


def test_bracketed_names_and_values_from_a_file_print_as_recorded(cli, tmp_path):
    """Kernel, device and parameter values a Kernel Tuner file holds are printed as recorded by the
    replay's summary and "is finished" line and by compare (Rich markup took ``[bf16]``, ``[a]`` and
    ``[red]`` for styles: two devices ``gpu[a]`` and ``gpu[b]`` both printed as ``gpu``)."""
    import gzip

    for dev, scale in (("gpu[a]", 1.0), ("gpu[b]", 2.0)):
        doc = {"device_name": dev, "kernel_name": "mm[bf16]", "problem_size": [64], "tune_params_keys": ["y"],
               "tune_params": {"y": ["[red]v", "w"]},
               "cache": {y: {"y": y, "time": t * scale, "times": [t * scale] * 2} for y, t in (("[red]v", 1.0),
                                                                                             ("w", 2.0))}}
        (tmp_path / f"{scale}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    db = f"storage.url=sqlite:///{tmp_path / 'b.db'}"
    args = ["bench=replay", "bench.path=1.0.json.gz", "search.n_trials=2", "progress=false", db]
    out = " ".join(cli(args, tmp_path).stdout.split())
    assert "best config: kerneltuner::mm[bf16] y=[red]v" in out, out[-2000:]
    assert re.search(r"best candidate: .*mm\[bf16\] │", out), out[-2000:]  # the cell may wrap
    assert "kerneltuner:mm[bf16][64] on gpu[a]" in out, out[-2000:]
    out = " ".join(cli(args, tmp_path).stdout.split())
    assert "'kerneltuner:mm[bf16][64]@gpu[a]' is finished" in out and "y=[red]v (1,000.0 us)" in out, out
    r = cli(["files=[2.0.json.gz]", db], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli([db], tmp_path, module="zhantune.compare")
    out = " ".join(r.stdout.split())
    assert r.returncode == 0 and "winner of gpu[a]: y=[red]v" in out and "winner of gpu[b]: y=[red]v" in out, out


def test_more_trials_on_a_space_measured_whole_adds_no_trial(cli, tmp_path):
    """A replay study that measured every point of its file, run again with search.more_trials=5:
    the space is found exhausted at once; the Optuna study keeps its 3 trials (the sampler was asked
    again and again for measured points, each answer told as another COMPLETE trial: 11 trials for
    3 configs, an inflated history)."""
    import optuna

    doc = {"device_name": "GPU-R", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
           "tune_params": {"x": [1, 2, 3]}, "cache": {str(x): {"x": x, "time": float(x), "times": [float(x)]}
                                                      for x in (1, 2, 3)}}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    url = f"sqlite:///{tmp_path / 'm.db'}"
    args = ["bench=replay", "bench.path=a.json", "search.n_trials=3", "progress=false", f"storage.url={url}"]
    assert cli(args, tmp_path).returncode == 0
    r = cli([*args, "search.more_trials=5"], tmp_path)
    out = " ".join(r.stdout.split())
    assert r.returncode == 0 and "0 measured (none), 0 cached" in out and "every feasible point" in out, out[-2000:]
    study = optuna.load_study(study_name="kerneltuner:k[64]@GPU-R", storage=url)
    assert len(study.trials) == 3 and {t.params["k.x"] for t in study.trials} == {1, 2, 3}
