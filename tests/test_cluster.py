"""Scale-out on Hydra's submitit launcher (its local mode): N jobs on one PostgreSQL study split its
``search.n_trials``; a job killed with SIGKILL mid-trial has its trial retried by another job once
its heartbeat is older than the grace period; a problems file swept by jobs gives one table."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from procs import kill_while
from sqlalchemy import select

from zhantune.search.study import RETRY_OF_ATTR
from zhantune.storage import Store
from zhantune.storage import orm as m

HERE = Path(__file__).resolve().parent
GEMM = HERE / "data" / "kerneltuner" / "gemm_RTX_3090.json.gz"
GEMM_STUDY = "kerneltuner:Xgemm[4096x4096]@NVIDIA GeForce RTX 3090"
HEARTBEAT_S, GRACE_S = 1, 3


def test_claims_split_the_study_budget_and_a_released_claim_stores_nothing(tmp_path):
    """The storage side of N jobs on one study (SQLite here; PostgreSQL in the launcher tests)."""
    from zhantune.storage import ClaimLost

    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    study = store.study_id("s", {})
    dev = store.device_id("d", "d", "cpu", {})
    prob = store.problem_id("p", op="mm", shape={"M": 4, "N": 4, "K": 4}, dtype="float32", activation=None,
                            lookup_op="mm", flops=128)

    def row(config: str, trial: int) -> dict:
        return dict(study_id=study, device_id=dev, problem_id=prob, kind="candidate", status="ok", params={},
                    config_hash=config, trial_number=trial, median_us=1.0, torch_version="t")

    assert store.claim(study, "a", 0, limit=2) == "claimed"
    assert store.claim(study, "a", 1, limit=2) == "taken"      # another worker measures it
    assert store.claim(study, "b", 2, limit=2) == "claimed"
    assert store.claim(study, "c", 3, limit=2) == "spent"      # 2 of 2 claimed
    assert store.trial_counts(study) == (0, 2) and store.in_flight(study) == [0, 2]
    store.add_measurement(claimed=True, **row("a", 0))
    assert store.trial_counts(study) == (1, 1) and store.in_flight(study) == [2]
    assert not store.release_trial(study, 0)                    # measured: its claim stays
    assert store.release_trial(study, 2)                        # a dead worker's trial: released
    assert store.trial_counts(study) == (1, 0)
    with pytest.raises(ClaimLost):                              # its worker comes back late: not stored
        store.add_measurement(claimed=True, **row("b", 2))
    assert len(_rows(store.url)) == 1
    assert store.claim(study, "b", 4, limit=2) == "claimed"     # the point is measured again
    assert store.claim(study, "c", 5, limit=2) == "spent"


def test_the_heartbeat_reads_the_storages_grace_period_through_optunas_cache(tmp_path):
    """The grace period a worker waits for and beats a claimless trial at is the storage's
    (storage.grace_period_s), not two heartbeats: Optuna 5 wraps RDBStorage in a _CachedStorage,
    which has no grace_period (a helper measured 20 s in the message and a retry 81 s after a kill,
    of a 60 s grace)."""
    from zhantune.search.study import Heartbeat, HeartbeatSettings, open_study

    study = open_study("s", f"sqlite:///{tmp_path / 'h.db'}", optuna.samplers.RandomSampler(),
                       HeartbeatSettings(10, 60))
    beat = Heartbeat(study)
    try:
        assert (beat.interval_s, beat.grace_period_s) == (10, 60)
    finally:
        beat.close()


def test_a_missing_launcher_names_the_cluster_extra(monkeypatch):
    import importlib.util

    from zhantune.launcher import launcher_hint

    message = "In 'hydra/config': Could not find 'hydra/launcher/submitit_slurm'"
    assert launcher_hint(message) == ""  # installed here (the dev extra includes it)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "hydra_plugins.hydra_submitit_launcher" else real(name, *a))
    assert "pip install 'zhantune[cluster]'" in launcher_hint(message)
    assert launcher_hint("Could not find 'op/mmm'") == ""


def test_a_submitit_jobs_user_error_is_its_one_line_not_hydras_traceback(tmp_path):
    """A helper's: a bad value that fails in a submitit job printed Hydra's 45-line traceback of
    submitit's UncompletedJobError, the job's one line at its end, exit 1. It is that line now, naming
    the job and its log, exit 2, then the sweep's summary. The jobs' error, seen only by a tune: the
    database holds the problem's rows timed without flushing the cache, the jobs time with it."""
    from stored import warm_default_row

    warm_default_row(tmp_path / "z.db")
    launcher = _launch(["+op=mm", "shape=[16,16,16]", "device=cpu", "bench.flush_cache=true",
                        f"storage.url=sqlite:///{tmp_path}/z.db"], tmp_path)  # one job: a sweep all the same
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert re.fullmatch(rf"zhantune: a sweep job \(submitit job \S+, log in {tmp_path}/sweep/\.submitit/\S+\): "
                        r"bench.flush_cache=true: 1 measurement\(s\) of mm\[M=16,N=16,K=16\]:float32 on .* timed without "
                        r"flushing the cache before each run; .*", err.strip()), err
    assert "the sweep ended on a job's failure" in out and "1 job(s) wrote no record (#0: " in " ".join(out.split())


def test_a_launcher_parameter_submitit_does_not_know_is_one_line(tmp_path):
    """A newcomer's (session 51): Hydra's hint for a launcher option it does not have is to add it with
    '+'; submitit then refused it with a traceback ending in its NameError, exit 1. It is one line
    naming the option and what the executor takes, exit 2, and no job runs."""
    launcher = _launch(["+hydra.launcher.timeout_mn=5", "+op=mm", "shape=[16,16,16]", "device=cpu",
                        f"storage.url=sqlite:///{tmp_path}/z.db"], tmp_path)
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.strip() == ("zhantune: hydra.launcher.timeout_mn: submitit's local executor has no parameter 'timeout_mn'; "
                           "it takes: name, timeout_min, mem_gb, nodes, cpus_per_task, gpus_per_node, tasks_per_node, "
                           "stderr_to_stdout, setup"), err
    assert not (tmp_path / "z.db").exists()


def _launch(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zhantune", "-m", "hydra/launcher=submitit_local", *args,
                             "progress=false", f"hydra.sweep.dir={cwd}/sweep"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))


def _rows(url: str) -> list[m.MeasurementRow]:
    with Store(url).session() as s:
        return list(s.scalars(select(m.MeasurementRow).where(m.MeasurementRow.kind == "candidate")))


def _kill_mid_trial(log: Path, launcher: subprocess.Popen, url: str,
                    timeout_s: float = 180) -> tuple[int, int, dt.datetime]:
    """SIGKILL the job that writes ``log`` while it measures (after its second trial; the trial not
    stored in ``url``): returns its pid, the trial it was measuring and when it was killed."""
    deadline = time.monotonic() + timeout_s
    while not (worker := re.search(r"worker [^:]+:(\d+)", log.read_text() if log.exists() else "")):
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no worker line in {log} after {timeout_s} s"
        time.sleep(0.02)
    pid = int(worker.group(1))

    def measuring() -> bool:  # after its second trial, in the middle of one: logged, its row not stored
        lines = log.read_text().splitlines()
        if sum(": measuring " in ln for ln in lines) < 3 or ": measuring " not in lines[-1]:
            return False
        number = int(re.search(r"trial (\d+): measuring", lines[-1]).group(1))
        return number not in {r.trial_number for r in _rows(url)}

    try:  # checked again once stopped: the trial cannot end between check and kill
        kill_while(pid, measuring, max(1.0, deadline - time.monotonic()))
    except AssertionError as e:
        raise AssertionError(f"{e}; launcher: {launcher.communicate()[1][-3000:]}") from None
    number = int(re.search(r"trial (\d+): measuring", log.read_text().splitlines()[-1]).group(1))
    return pid, number, dt.datetime.now()


@pytest.mark.slow
def test_two_jobs_split_one_study_and_retry_a_killed_jobs_trial(postgres, tmp_path):
    url = postgres.new_database()
    # bench.replay_pace=0.5: each answer takes half as long as the recorded measurement did (0.24 to
    # 1.9 s), so a job is killed in the middle of a trial
    launcher = _launch(["bench=replay", f"bench.path={GEMM}", "bench.replay_pace=0.5", "search.n_trials=20",
                        "search.seed=0,1", f"storage.url={url}", f"storage.heartbeat_interval_s={HEARTBEAT_S}",
                        f"storage.grace_period_s={GRACE_S}"], tmp_path)
    log1 = tmp_path / "sweep" / "1" / "app.log"
    pid, killed, killed_at = _kill_mid_trial(log1, launcher, url)
    out, err = launcher.communicate(timeout=600)
    # the launcher waits for job 0 (which finishes the study), then reports job 1's death in one line
    assert launcher.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert re.fullmatch(r"zhantune: a sweep job \(submitit job \S+, log in \S+\) ended without a result \(state: .*",
                        err.strip()), err[-3000:]
    assert ": measuring " in log1.read_text().splitlines()[-1]  # it died in the middle of that trial

    rows = _rows(url)
    assert len(rows) == 20                                   # the study's total, over both jobs
    assert len({r.config_hash for r in rows}) == 20          # no configuration measured twice
    assert len({r.trial_number for r in rows}) == 20
    assert killed not in {r.trial_number for r in rows}      # the dead job stored nothing for it
    study = optuna.load_study(study_name=GEMM_STUDY, storage=url)
    trials = {t.number: t for t in study.trials}
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    # the other job failed the dead trial and measured its point again, exactly once
    (retry,) = [t for t in study.trials if t.user_attrs.get(RETRY_OF_ATTR) == killed]
    assert retry.params == trials[killed].params
    (retry_row,) = [r for r in rows if r.trial_number == retry.number]
    assert sum(1 for r in rows if r.config_hash == retry_row.config_hash) == 1
    assert retry.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    # ... once its heartbeat was older than the grace period (3 s), within a few polls after that
    waited_s = (retry.datetime_start - killed_at).total_seconds()
    assert 0 < waited_s <= GRACE_S + 10, waited_s
    log0 = (tmp_path / "sweep" / "0" / "app.log").read_text()
    assert f"trial {killed}: its worker stopped beating" in log0
    assert f"trial {retry.number}: measuring" in log0 and "(again: its first worker died)" in log0
    assert "the study has 20 of 20 measured" in log0
    with Store(url).session() as s:  # every claim is a stored row's: none left over
        assert len(list(s.scalars(select(m.Claim)))) == 20


@pytest.mark.slow
def test_problems_file_swept_by_jobs_into_one_database_then_one_export(postgres, cli, tmp_path):
    url = postgres.new_database()
    (tmp_path / "problems.yaml").write_text(
        "format: zhantune-problems\nproblems:\n"
        "- {op: mm, shape: [16, 16, 16]}\n- {op: mm, shape: [32, 16, 16]}\n- {op: mm, shape: [16, 32, 16]}\n")
    # tiny GEMMs, one trial each, short timing: the point is three problems, two jobs, one database
    launcher = _launch(["problems=problems.yaml", "device=cpu", "search.total_trials=3", "search.min_trials=1",
                        "search.seed=0,1", "bench.isolate=false", "bench.remeasure_rounds=0", "bench.warmup_ms=1",
                        "bench.target_ms=2", "bench.busy_wait_s=0", "export.enabled=false", f"storage.url={url}"],
                       tmp_path)
    out, err = launcher.communicate(timeout=900)
    assert launcher.returncode == 0, err[-3000:]
    # the launcher's summary: both jobs' records, every study at its total
    assert "zhantune multirun: 2 job record(s)" in out
    records = [json.loads((tmp_path / "sweep" / str(i) / "zhantune_job.json").read_text()) for i in (0, 1)]
    assert [len(r["studies"]) for r in records] == [3, 3]
    for i in range(3):  # each problem's one trial measured by exactly one of the jobs
        assert sum(r["studies"][i]["measured"] for r in records) == 1
    # no paired rounds (bench.remeasure_rounds=0): each study's best time is no claim, and the
    # summary's studies say so beside it (a review's finding: only the best time was listed)
    claims = [s["claim"] for r in records for s in r["studies"]]  # "not settled": a job that measured none of it
    # the default's own kernel (with its gap to the default's time where the two tiny timings are over
    # 1.2x apart, as they can be with two jobs on two cores: CI saw 99.7 us against 39.3 us)
    same = "none: the best is the default's own kernel"
    assert all(c in ("unconfirmed: Inductor's default ships", "not settled") or c.startswith(same)
               and c.endswith("; Inductor's default ships") for c in claims), claims
    assert claims.count("not settled") < 6
    # each study's row (the one trial: ATen, the default's own kernel, or a template's config)
    assert out.count("unconfirmed: Inductor's default ships") + out.count(same) == 3, out[-3000:]
    rows = _rows(url)
    assert len(rows) == 3 and len({(r.problem_id, r.config_hash) for r in rows}) == 3

    r = cli(["storage.url=" + url, "path=table.json"], tmp_path, module="zhantune.export")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wrote 3 key(s)" in r.stdout
    table = json.loads((tmp_path / "table.json").read_text())["table"]
    with Store(url).session() as s:  # the keys Inductor looked the three problems up with
        (device,) = s.scalars(select(m.Device.key))
        keys = [f"{device}+{p.lookup_key}" for p in s.scalars(select(m.Problem))]
    assert len(set(keys)) == 3 and sorted(table) == sorted(keys)


def test_a_job_that_finds_its_study_finished_is_reported_done_not_failed(tmp_path):
    """A late job of a sweep (the study measured its total before it started) writes its record:
    the launcher's summary lists it as finished before the job, never as a job that wrote no record."""
    url = f"sqlite:///{tmp_path / 'z.db'}"
    r = subprocess.run([sys.executable, "-m", "zhantune", "-m", "bench=replay", f"bench.path={GEMM}",
                        "search.n_trials=3", "search.seed=0,1", "progress=false", f"storage.url={url}",
                        f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    assert "zhantune multirun: 2 job record(s)" in out and "wrote no record" not in out, out[-3000:]
    records = [json.loads((tmp_path / "sweep" / str(i) / "zhantune_job.json").read_text()) for i in (0, 1)]
    first, late = (rec["studies"][0] for rec in records)
    assert (first["measured"], first["already_finished"]) == (3, False)
    assert (late["measured"], late["study_measured"], late["already_finished"]) == (0, 3, True)
    assert "3/3 (finished before the job)" in out


def test_a_submitit_failure_names_its_log_folder_whole():
    """A review's: a sweep folder with a space was cut at it ("log in /tmp")."""
    from zhantune.launcher import submitit_failure

    text = ("Traceback (most recent call last):\n  File \"x\", line 1\n"
            "submitit.core.utils.UncompletedJobError: Job 7141 (task: 0) with path /tmp/my sweeps/.submitit/7141/"
            "7141_0_result.pkl\nhas not produced any output (state: FINISHED)\nError stream produced:\n"
            + "-" * 40 + "\nzhantune: shape=[1]: bad\n")
    assert submitit_failure(text) == ("zhantune: a sweep job (submitit job 7141, log in /tmp/my sweeps/.submitit/7141): "
                                      "shape=[1]: bad", 2)
    killed = text.replace("state: FINISHED", "state: INTERRUPTED").replace("zhantune: shape=[1]: bad\n", "")
    assert submitit_failure(killed) == ("zhantune: a sweep job (submitit job 7141, log in /tmp/my sweeps/.submitit/7141) "
                                        "ended without a result (state: INTERRUPTED)", 1)
    assert submitit_failure("Traceback ... ValueError: x") is None
