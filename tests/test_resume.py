"""Resume: search.n_trials is the study's total; a rerun measures what is missing, re-uses the stored
baselines, and a finished study exits at once. Also what a tune writes to a log file (stdout not a
terminal): one line per trial, a summary no wider than 100 columns, no third-party log lines."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import kill_while

from zhantune.report.console import LOG_WIDTH

TUNE = ["+op=mm", "shape=[64,48,32]", "device=cpu", "search.n_trials=6", "bench.target_ms=5", "bench.warmup_ms=2",
        "bench.remeasure_rounds=0", "bench.busy_wait_s=0"]


def _tune(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.Popen([sys.executable, "-m", "zhantune", *TUNE, *extra, f"hydra.run.dir={tmp_path}/hydra"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, PYTHONWARNINGS="ignore"))


def _kinds(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("select kind, count(*) from zt_measurement group by kind").fetchall())


def _wait_for_candidates(db: Path, n: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if _kinds(db).get("candidate", 0) >= n:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} candidates after {timeout_s} s")


def _trial_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"trial \d+/\d+ \w", line) and "━" not in line]


@pytest.mark.slow
def test_interrupted_study_resumes_to_its_total_with_the_stored_baselines(tmp_path):
    db = tmp_path / "zhantune.db"
    first = _tune(tmp_path)
    _wait_for_candidates(db, 2, first)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-3000:]
    k = _kinds(db)["candidate"]
    assert 2 <= k < 6
    assert [int(re.match(r"trial (\d+)/6", line).group(1)) for line in _trial_lines(out)] == list(range(1, k + 1))
    baselines = {kind: n for kind, n in _kinds(db).items() if kind != "candidate"}
    assert baselines == {"eager": 1, "default": 1, "default_unfrozen": 1}

    # the same command again: the trials still missing, numbered on from the study's, no baselines
    second = _tune(tmp_path)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    assert _kinds(db) == {**baselines, "candidate": 6}
    lines = _trial_lines(out)
    assert [int(re.match(r"trial (\d+)/6", line).group(1)) for line in lines] == list(range(k + 1, 7))
    assert "trial 6/6 " in out and "the study holds 6 of 6" in out
    assert "baselines: stored ones re-used" in " ".join(out.split())

    # a log file: one line per trial (the config whole on it), no Rich log-handler column or time
    # stamp, a summary no wider than LOG_WIDTH, no Inductor AUTOTUNE or Optuna [I ...] lines
    for line in lines:
        assert re.fullmatch(r"trial \d/6 ok [\d,.]+ us (aten|cpp_gemm( \S+=\S+)+)", line), line
    assert not re.search(r"\.py:\d+|^\[\d\d:\d\d:\d\d\]", out, re.M)
    summary = out[out.index("mm[M=64,N=48,K=32]:float32 on"):].splitlines()
    assert max(len(line) for line in summary) <= LOG_WIDTH == 100
    assert "AUTOTUNE" not in out + err and not re.search(r"^\[I ", out + err, re.M)

    # finished: says so, measures nothing, exit code 0
    third = _tune(tmp_path)
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-3000:]
    assert "is finished: 6 of 6 trials measured; nothing to measure" in " ".join(out.split())
    assert _kinds(db) == {**baselines, "candidate": 6}
    # ... and what its paired rounds settled, from the stored verdict (the second run's)
    with sqlite3.connect(db) as con:
        ratio, confirmed = con.execute("select ratio, confirmed from zt_verdict order by id desc limit 1").fetchone()
    said = re.search(r"speedup vs default, its stored paired rounds: (confirmed|no claim \()([\d.]+)x", " ".join(out.split()))
    assert (said is None) is (ratio is None), out[-2000:]
    assert said is None or float(said.group(2)) == pytest.approx(ratio, abs=0.006), (said.group(0), ratio, confirmed)
    assert not list(tmp_path.glob("*.zt-lock"))  # no lock file left in the working directory


def test_a_rerun_shows_the_defaults_fastest_run_of_every_run_before(tmp_path):
    """The stored baselines a rerun re-uses: the default's row is its fastest ok run of every run of
    the study (the paired rounds' default rows included), as the summary says; a rerun showed the first
    baseline instead (3,185.3 us after a run that had shown 3,097.7 us: a newcomer's finding). A failed
    row never stands in, and a failed first default still means no stored set."""
    import torch

    from zhantune.storage import Store

    store = Store(f"sqlite:///{tmp_path / 'z.db'}")
    study = store.study_id("s", {})
    dev = store.device_id("cpu-x", "cpu-x", "cpu", {})
    prob = store.problem_id("mm[M=4,N=4,K=4]:float32", op="mm", shape={"M": 4, "N": 4, "K": 4, "B": 1},
                            dtype="float32", activation=None, weight_layout="kn", lookup_op="mm", lookup_key=None,
                            flops=128)

    def row(kind: str, min_us: float | None, status: str = "ok", trial: int | None = None) -> int:
        return store.add_measurement(study_id=study, device_id=dev, problem_id=prob, kind=kind, status=status,
                                     template_id=None, params={}, median_us=None if min_us is None else min_us + 5,
                                     min_us=min_us, trial_number=trial, torch_version=torch.__version__)

    row("eager", 50.0)
    first = row("default", 100.0)
    row("default_unfrozen", 120.0)
    row("candidate", 90.0, trial=0)
    row("default", 101.0)  # the first run's paired rounds: slower, then faster
    fastest = row("default", 97.0)
    row("default", None, status="error")
    row("remeasure", 91.0)

    def stored():
        return store.stored_baselines(study, dev, "mm[M=4,N=4,K=4]:float32", torch.__version__, None)

    got = stored()
    assert got["default"].id == fastest != first and got["default_unfrozen"].min_us == 120.0
    with store.engine.begin() as conn:  # a failed first default: measured again, as before
        conn.exec_driver_sql(f"update zt_measurement set status = 'error' where id = {first}")
    assert stored() == {}


@pytest.mark.slow
def test_new_environment_or_the_option_measures_the_baselines_again(tmp_path):
    db = tmp_path / "zhantune.db"
    p = _tune(tmp_path, "search.n_trials=1", "bench.isolate=false")  # in process: the tests' time
    assert p.wait(timeout=300) == 0, p.communicate()
    assert _kinds(db) == {"eager": 1, "default": 1, "default_unfrozen": 1, "candidate": 1}
    p = _tune(tmp_path, "search.more_trials=1", "bench.remeasure_baselines=true", "bench.isolate=false")
    assert p.wait(timeout=300) == 0, p.communicate()
    assert _kinds(db) == {"eager": 2, "default": 2, "default_unfrozen": 2, "candidate": 2}
    # rows of another torch version are not this environment's baselines
    with sqlite3.connect(db) as con:
        con.execute("update zt_measurement set torch_version = '2.0.0' where kind != 'candidate'")
    p = _tune(tmp_path, "search.more_trials=1", "bench.isolate=false")
    assert p.wait(timeout=300) == 0, p.communicate()
    assert _kinds(db) == {"eager": 3, "default": 3, "default_unfrozen": 3, "candidate": 3}


@pytest.mark.slow
def test_an_exhausted_study_exits_at_once_for_its_space_and_measures_another_space(tmp_path):
    """space=[aten] has one point: the study is exhausted, and the same command exits at once. A run
    of the same problem with more spaces is not "exhausted": it measures their points."""
    db = tmp_path / "zhantune.db"

    def tune(*extra: str) -> str:
        p = _tune(tmp_path, "search.n_trials=3", "bench.isolate=false", *extra)
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        return " ".join(out.split())

    tune("space=[aten]")
    assert _kinds(db)["candidate"] == 1
    assert "every feasible point" in tune("space=[aten]")
    assert _kinds(db)["candidate"] == 1
    out = tune("space=[aten,cpp_gemm]")
    assert "every feasible point" not in out and _kinds(db)["candidate"] == 3, out[-2000:]


A100 = Path(__file__).resolve().parent / "data" / "kerneltuner" / "convolution_A100.json.gz"


def _in_flight(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("select count(*) from zt_claim c where not exists (select 1 from zt_measurement m "
                           "where m.study_id = c.study_id and m.trial_number = c.trial_number)").fetchone()[0]


@pytest.mark.slow
def test_a_killed_tunes_orphaned_trial_is_not_counted_as_measured(tmp_path):
    """A tune killed with SIGKILL mid-trial leaves a claim without a measurement. The rerun retries
    that point once its heartbeat is stale, and every count it prints is of measured trials: the
    trial lines number on to n_trials, never past it, and the study holds what the database holds."""
    db = tmp_path / "k.db"
    args = ["bench=replay", f"bench.path={A100}", "bench.replay_pace=1", "search.n_trials=6", "search.transfer=off",
            f"storage.url=sqlite:///{db}", "storage.heartbeat_interval_s=1", "storage.grace_period_s=3"]
    env = dict({k: v for k, v in os.environ.items() if k != "COLUMNS"}, PYTHONWARNINGS="ignore")

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "zhantune", *args, f"hydra.run.dir={tmp_path}/hydra"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    first = start()
    _wait_for_candidates(db, 2, first)
    # killed while a trial is measured (its claim has no row yet), checked again once stopped
    kill_while(first.pid, lambda: _in_flight(db) == 1, timeout_s=120, poll_s=0.05)
    first.communicate(timeout=60)
    measured = _kinds(db)["candidate"]
    assert _in_flight(db) == 1 and measured < 6

    time.sleep(3)  # the orphan's heartbeat is stale by now
    second = start()
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert _kinds(db)["candidate"] == 6 and _in_flight(db) == 0
    numbers = [int(re.match(r"trial (\d+)/6", line).group(1)) for line in _trial_lines(out)]
    assert numbers == list(range(measured + 1, 7)), out
    assert "the study holds 6 of 6" in " ".join(out.split()), out
    # a Kernel Tuner replay has no lookup table: its summary does not explain why a config is not in one
    assert "not in the lookup table" not in out, out


@pytest.mark.slow
def test_ctrl_c_while_the_baselines_are_measured_stops_them_and_stores_none(tmp_path):
    """A helper's: Ctrl-C during the baselines was acted on only once all three were measured and
    stored (16 s at shape [128,64,80]; 29 s with a long bench.target_ms). They are interruptible now:
    the run stops with exit 130 and stores no baseline (a rerun measures them). Its study is marked
    interrupted, as a search's interrupt marks it (another helper's: it was left "running")."""
    db = tmp_path / "zhantune.db"
    p = _tune(tmp_path, "bench.target_ms=30000", "bench.warmup_ms=0", "progress=false")  # 30 s per baseline
    deadline = time.monotonic() + 120
    while not db.exists() and time.monotonic() < deadline:  # the study's row is made before the baselines
        assert p.poll() is None, p.communicate()
        time.sleep(0.1)
    time.sleep(3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "interrupted" in out + err, err[-2000:]
    assert _kinds(db) == {}, _kinds(db)  # no eager, default or default_unfrozen row
    with sqlite3.connect(db) as con:
        assert con.execute("select status from zt_study").fetchall() == [("interrupted",)]


@pytest.mark.slow
def test_a_study_a_timed_out_run_marked_finished_with_a_dead_claim_is_measured_to_its_budget(tmp_path):
    """A helper's: a tune killed mid-trial, then a rerun whose search.timeout_s ends while it waits
    for the dead claim, marked the study finished with 5 of 6 measured; every later run counted the
    dead claim as used and said the study was finished with nothing to measure, for good. A later
    run now retries the dead trial once its heartbeat is stale and ends with 6 of 6."""
    db = tmp_path / "f.db"
    args = ["bench=replay", f"bench.path={A100}", "search.n_trials=6", "search.transfer=off",
            f"storage.url=sqlite:///{db}", "storage.heartbeat_interval_s=1", "storage.grace_period_s=8"]
    env = dict({k: v for k, v in os.environ.items() if k != "COLUMNS"}, PYTHONWARNINGS="ignore")

    def start(*extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "zhantune", *args, *extra, f"hydra.run.dir={tmp_path}/hydra"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    first = start("bench.replay_pace=1")  # each answer takes its recorded compile time and runs
    _wait_for_candidates(db, 2, first)
    kill_while(first.pid, lambda: _in_flight(db) == 1, timeout_s=120, poll_s=0.05)
    first.communicate(timeout=60)
    # at once: the dead claim is not stale yet; it measures the rest, waits for that one and times out
    timed_out = start("search.timeout_s=3")
    out, err = timed_out.communicate(timeout=300)
    assert timed_out.returncode == 0, err[-3000:]
    assert _kinds(db)["candidate"] == 5 and _in_flight(db) == 1, out[-2000:]
    with sqlite3.connect(db) as con:
        assert con.execute("select status from zt_study").fetchone()[0] == "finished"
    time.sleep(8)
    last = start()
    out, err = last.communicate(timeout=300)
    assert last.returncode == 0, err[-3000:]
    assert "nothing to measure" not in out, out[-2000:]
    assert _kinds(db)["candidate"] == 6 and _in_flight(db) == 0, out[-2000:]
    assert "the study holds 6 of 6" in " ".join(out.split()), out[-2000:]


def test_with_heartbeats_off_a_claim_that_holds_the_budget_is_named(tmp_path):
    """A helper's: with storage.heartbeat_interval_s=null a killed worker's claim is never released,
    and every rerun printed "0 measured ... the study holds 9 of 10" and exited 0 with no reason. The
    summary names the claims and what measures them (heartbeats on: a dead claim is retried)."""
    import gzip
    import json

    from zhantune.storage import Store

    cache = {f"{a},{b}": {"a": a, "b": b, "time": float(a + b), "times": [float(a + b)] * 3, "compile_time": 1.0}
             for a in (1, 2, 3) for b in (1, 2)}
    doc = {"device_name": "GPU-T", "kernel_name": "toy_kernel", "problem_size": [8], "tune_params_keys": ["a", "b"],
           "tune_params": {"a": [1, 2, 3], "b": [1, 2]}, "cache": cache}
    with gzip.open(tmp_path / "toy.json.gz", "wt") as f:
        json.dump(doc, f)
    args = ["bench=replay", f"bench.path={tmp_path / 'toy.json.gz'}", "storage.url=sqlite:///t.db", "progress=false"]

    def tune(*extra: str) -> str:
        r = subprocess.run([sys.executable, "-m", "zhantune", *args, *extra, f"hydra.run.dir={tmp_path}/hydra"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert r.returncode == 0, r.stderr[-3000:]
        return " ".join(r.stdout.split())

    assert "note: " not in tune("search.n_trials=3")
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    store.claim(1, "a-killed-workers-point", 3)  # trial 3 of study 1: claimed, never stored
    out = tune("search.n_trials=4", "storage.heartbeat_interval_s=null")
    assert "the study holds 3 of 4" in out, out[-2000:]
    assert ("note: 1 trial(s) of the budget are claimed by workers that stored no result: still running elsewhere, "
            "or killed; with storage.heartbeat_interval_s=null a killed worker's claim is never released") in out, out


@pytest.mark.slow
def test_a_rerun_at_once_after_a_kill_waits_for_the_dead_claim_before_calling_the_space_exhausted(tmp_path):
    """A space smaller than search.n_trials, its tune killed mid-trial and rerun at once (the dead
    claim's heartbeat not stale yet): the rerun measures every other point, then waits for that claim
    instead of ending "every feasible point" with one point never measured (the study was marked
    exhausted, and later runs said it was finished)."""
    import gzip
    import json

    cache = {f"{a},{b}": {"a": a, "b": b, "time": float(a + b), "times": [float(a + b)] * 3, "compile_time": 400.0}
             for a in (1, 2, 3) for b in (1, 2)}
    doc = {"device_name": "GPU-T", "kernel_name": "toy_kernel", "problem_size": [8], "tune_params_keys": ["a", "b"],
           "tune_params": {"a": [1, 2, 3], "b": [1, 2]}, "cache": cache}
    toy = tmp_path / "toy.json.gz"
    with gzip.open(toy, "wt") as f:
        json.dump(doc, f)
    db = tmp_path / "t.db"
    args = ["bench=replay", f"bench.path={toy}", "search.n_trials=20", f"storage.url=sqlite:///{db}",
            "storage.heartbeat_interval_s=1", "storage.grace_period_s=15"]
    env = dict({k: v for k, v in os.environ.items() if k != "COLUMNS"}, PYTHONWARNINGS="ignore")

    def start(*extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "zhantune", *args, *extra, f"hydra.run.dir={tmp_path}/hydra"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    first = start("bench.replay_pace=1")  # each answer takes its compile time (0.4 s) and runs
    _wait_for_candidates(db, 1, first)
    kill_while(first.pid, lambda: _in_flight(db) == 1, timeout_s=120, poll_s=0.05)
    first.communicate(timeout=60)
    assert _in_flight(db) == 1

    second = start()  # at once: the dead trial's heartbeat is not 15 s old yet
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert _kinds(db)["candidate"] == 6 and _in_flight(db) == 0, out[-2000:]
    assert "the study holds 6 of 20, every feasible point" in " ".join(out.split()), out[-2000:]
