"""End to end on CPU through real Inductor compiles, real SQLite and real Optuna studies."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest
import torch
from compiles import lookups_seen

from zhantune.config import CONF_DIR, ExportConfig
from zhantune.device import resolve_device
from zhantune.inductor.builder import build_table
from zhantune.inductor.choices import recording
from zhantune.inductor.table import CONFIG_TEMPLATE_ID, default_entry, load_table
from zhantune.inductor.templates import inductor_template_ids
from zhantune.problems import GemmProblem
from zhantune.search.schema import load_space
from zhantune.storage import Store
from zhantune.tune import resolve_run, tune

pytestmark = pytest.mark.slow

SPACES = Path(__file__).resolve().parent / "spaces"


def _logging_compiler(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``g++`` first on PATH that logs each output file (``-o``) and runs the real one."""
    bin_dir, log = tmp_path / "bin", tmp_path / "compiler.log"
    bin_dir.mkdir()
    real = shutil.which("g++")
    assert real, "the tests need g++"
    shim = bin_dir / "g++"
    shim.write_text(f'#!/bin/sh\nprev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && echo "$a" >> {log}; '
                    f'prev="$a"; done\nexec {real} "$@"\n')
    shim.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def _binaries_built(log: Path) -> list[str]:
    lines = log.read_text().split() if log.exists() else []
    return [Path(p).name for p in lines if p.endswith((".so", ".o"))]


def _recorded_key(problem: GemmProblem) -> str:
    """The key Inductor asks for when it compiles the problem (independent of zhantune's tune)."""
    device = resolve_device("cpu")
    module, inputs = problem.build(device.torch_device)
    torch._dynamo.reset()
    with torch.no_grad(), recording() as rec, \
            lookups_seen(freezing=True):
        torch.compile(module)(*inputs)
    keys = [e.device_key for e in rec.events if e.op_name == problem.lookup_op and e.offered]
    assert len(keys) == 1
    return keys[0]


@pytest.mark.slow
def test_cli_tune_stores_every_trial_and_exports_inductors_key(cli, tmp_path):
    # two re-measure rounds (close call, speedup over the default: the fewest that can confirm a claim)
    # keep this test short; the rounds themselves are tested in test_timing.py and test_noise.py
    cache, tmp = tmp_path / "inductor_cache", tmp_path / "tmp"
    tmp.mkdir()
    compiler, log = _logging_compiler(tmp_path)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TMPDIR": str(tmp), **compiler}
    tune_args = ["+op=mm", "shape=[64,48,32]", "search.n_trials=3", "device=cpu", "progress=false",
                 "bench.remeasure_rounds=2"]
    r = cli([*tune_args, "export.path=table.json"], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "inductor default" in r.stdout and "best config:" in r.stdout
    # which GEMM the table serves (a newcomer's: the demo's x @ W table on an nn.Linear hit nothing, unexplained)
    assert "it serves x @ W with W stored [K, N]: an nn.Linear's GEMM" in " ".join(r.stdout.split()), r.stdout[-2000:]
    # the summary's TFLOP/s are at each row's minimum, the statistic every comparison uses (they were
    # at the median, which one-sided noise inflates: a review's finding)
    cells = re.findall(r"│ (eager|inductor default|best candidate: \S+) +│ ok +│ +([\d,.]+) │ +([\d,.]+) │ +([\d.]+) │",
                       r.stdout)
    assert {c[0] for c in cells} >= {"eager", "inductor default"}, r.stdout[-3000:]  # a longer label may wrap
    for _, _median, min_us, tflops in cells:  # both printed rounded: min us to 0.1 us, TFLOP/s to 0.001
        us = float(min_us.replace(",", ""))
        low, high = (2 * 64 * 48 * 32 / (us + d) / 1e6 for d in (0.05, -0.05))
        assert low - 5e-4 - 1e-9 <= float(tflops) <= high + 5e-4 + 1e-9, (min_us, tflops)
    # the tune compiled in its own kernel cache and deleted it: in the user's Inductor cache only the
    # finished binaries it keeps for the next tune (bench.kernel_store=auto: zhantune-kernels/<torch
    # and compiler>/, no temporary name; force_disable_caches left a directory per compile there), and
    # none of its own left in TMPDIR (Inductor keeps its precompiled headers in its default directory
    # there whatever the cache directory)
    (store,) = (cache / "zhantune-kernels").iterdir()
    kept = [p for p in cache.rglob("*") if p.is_file()]
    assert kept and all(p.is_relative_to(store) and p.suffix == ".so" for p in kept), kept
    assert sorted(p.name for p in kept) == sorted(set(_binaries_built(log)))  # every one it built, whole
    assert all(p.read_bytes()[:4] == b"\x7fELF" for p in kept)
    assert not list(cache.glob("tmp*"))
    assert all(p.name.startswith("torchinductor_") for p in tmp.iterdir()) and not list(tmp.rglob("*.so"))

    con = sqlite3.connect(tmp_path / "zhantune.db")
    rows = con.execute("select kind, trial_number, status, median_us, n, params, lookup_key, min_us "
                       "from zt_measurement order by id").fetchall()
    kinds = [row[0] for row in rows]
    # baselines: eager, Inductor's default (freezing, as the claims' reference) and on CPU the
    # default compile without freezing
    assert kinds[:3] == ["eager", "default", "default_unfrozen"] and kinds.count("candidate") == 3
    assert set(kinds[6:]) <= {"remeasure", "default"}  # close calls, speedup re-measurements
    for kind, trial, status, median_us, n, _params, _key, _min in rows:
        assert status == "ok" and median_us > 0 and n >= 5
        assert (trial is None) == (kind != "candidate")

    # the DB rows match the Optuna trials of the same study
    study_name = con.execute("select name from zt_study").fetchone()[0]
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path}/zhantune.db")
    done = {t.number: t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    measured = {row[1]: row[3] for row in rows if row[0] == "candidate"}
    for number, median_us in measured.items():
        assert done[number] == pytest.approx(median_us)

    table = load_table(tmp_path / "table.json")
    problem = GemmProblem.from_config("mm", [64, 48, 32], "float32")
    assert list(table) == [_recorded_key(problem)]
    (entry,) = table[list(table)[0]]
    # the documented rules (docs/timing.md): configs ranked by the minimum of their runs (a config
    # measured several times by its lowest); the tuned entry ships only for a speedup over the
    # default confirmed in paired rounds (the stored verdict), else Inductor's default choice
    best = min((row for row in rows if row[0] in ("candidate", "remeasure")), key=lambda row: row[7])
    ((confirmed, ratio, verdict_params),) = con.execute(
        "select v.confirmed, v.ratio, m.params from zt_verdict v join zt_measurement m "
        "on m.config_hash = v.config_hash and m.study_id = v.study_id group by v.id").fetchall()
    assert json.loads(verdict_params) == json.loads(best[5])  # the verdict is on the ranking's best
    if confirmed and ratio >= ExportConfig().min_speedup:
        assert entry["template_id"] == CONFIG_TEMPLATE_ID and entry["config_patch"] == json.loads(best[5])
        assert f"{ratio:.2f}x faster than inductor default" in r.stdout
    elif confirmed:  # confirmed, but below export.min_speedup: the default ships, and the summary says so
        assert ratio > 1.0 and entry == {"template_id": "aten::mm"}
        assert f"{ratio:.3f}x faster than inductor default, below export.min_speedup" in r.stdout
    else:
        assert entry == {"template_id": "aten::mm"}
        out = " ".join(r.stdout.split())  # the console wraps at 100 columns off a terminal
        assert "no candidate's speedup over it was confirmed in paired rounds" in out or "default compile runs too" in out

    # one trial more resumes the study (known candidates answered from the database) with the
    # baselines it stored
    r2 = cli(["+op=mm", "shape=[64,48,32]", "search.more_trials=1", "device=cpu", "progress=false",
              "bench.remeasure_rounds=0", "bench.isolate=false", "export.enabled=false"], cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path}/zhantune.db")
    assert len(study.trials) > len(done)

    # the same tune into another database: every binary from the store (the compiler built none),
    # the same candidates measured, each ok
    log.unlink()
    r3 = cli([*tune_args[:-1], "bench.remeasure_rounds=0", "storage.url=sqlite:///second.db", "export.enabled=false"],
             cwd=tmp_path, env={**env, "ZHANTUNE_TEST_FORKSERVER": "0"})  # a hash seed of its own
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert _binaries_built(log) == []
    again = sqlite3.connect(tmp_path / "second.db").execute(
        "select trial_number, status, params from zt_measurement where kind = 'candidate' order by trial_number")
    assert [(n, s, json.loads(p)) for n, s, p in again] == [
        (n, "ok", json.loads(row[5])) for n in sorted(measured) for row in rows if row[:2] == ("candidate", n)]
    kinds = [k for (k,) in con.execute("select kind from zt_measurement")]
    assert kinds.count("candidate") == 4 and kinds.count("eager") == 1


@pytest.mark.slow
def test_incorrect_candidate_is_stored_and_never_exported(tune_cfg, tmp_path):
    cfg = tune_cfg(["+op=linear_act", "shape=[32,32,16]", "device=cpu", "search.n_trials=2",
                    f"storage.url=sqlite:///{tmp_path}/z.db", f"export.path={tmp_path}/t.json"])
    run = resolve_run(cfg)
    # Inductor's own fault injection makes the generated relu wrong; aten is the correct alternative
    run.space = load_space(["buggy_relu"], SPACES, run.problem_vars, set(inductor_template_ids()))
    run.space.branches += load_space(["aten"], CONF_DIR / "space", run.problem_vars).branches
    store = Store(cfg.storage.url)
    result = tune(run, store)
    rows = {r.branch: r for r in store.measurements(result.study_id) if r.kind == "candidate"}
    assert rows["buggy_relu"].status == "incorrect"
    assert rows["buggy_relu"].error > 0.1 and "tolerance" in rows["buggy_relu"].error_text
    assert rows["aten"].status == "ok"
    table = build_table(store)
    (entries,) = table.values()
    # the only correct config is aten, the kernel the default compile runs: the table ships Inductor's
    # own default entry for it (inductor.templates.is_default_kernel), never the incorrect template
    assert entries == [default_entry("addmm")]
    # the tune's export applies export.min_speedup (ExportConfig's default)
    assert load_table(tmp_path / "t.json") == build_table(store, min_speedup=ExportConfig().min_speedup)


def test_cpp_template_candidate_really_uses_the_cpp_template(tune_cfg, tmp_path):
    cfg = tune_cfg(["+op=mm", "shape=[64,64,64]", "device=cpu", "search.n_trials=2", "space=[cpp_gemm]", "bench.isolate=false",
                    f"storage.url=sqlite:///{tmp_path}/z.db", "export.enabled=false"])
    from torch._dynamo.utils import counters

    run = resolve_run(cfg)
    before = counters["inductor"]["cpp_templated_kernel_counter"]  # it counts every compile in this process
    result = tune(run, Store(cfg.storage.url))
    assert result.measured == 2 and result.statuses["ok"] == 2
    assert counters["inductor"]["cpp_templated_kernel_counter"] - before >= 2


def test_a_reused_sweep_directory_summarises_only_the_latest_sweep(tmp_path):
    """A helper's attack (session 46): a multirun into a sweep directory an earlier one had used read
    the earlier sweep's job records as its own: two records for one job, "-1 job(s) wrote no record",
    and the earlier sweep's database named as the storage to export from. Each record carries the
    token its sweep wrote at its start; only those of the latest are read (test_multirun_over_shapes
    runs the whole path)."""
    from zhantune.multirun import JOB_RECORD, SWEEP_TOKEN, read_records

    for job, sweep in ((0, "new"), (1, "old"), (2, None)):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / JOB_RECORD).write_text(json.dumps({"job": job, "sweep": sweep, "studies": []}))
    assert [r["job"] for r in read_records(tmp_path)] == [0, 1, 2]  # a directory of before: every record
    (tmp_path / SWEEP_TOKEN).write_text("new")
    assert [r["job"] for r in read_records(tmp_path)] == [0]


@pytest.mark.slow
def test_a_sweep_a_job_ends_still_summarises_the_jobs_before(cli, tmp_path):
    """A helper's attack (session 46): a job's user error ends a sweep (Hydra's basic launcher; a job
    killed under submitit raises in the launcher), and Hydra then skips on_multirun_end: no summary of
    what the jobs before it had stored. The launcher prints it after the job's error (exit 2 here: job #1
    times with the cache flushed where job #0 stored rows timed without, which only a tune can see; a
    shape beyond memory is refused before job #0 now)."""
    r = cli(["-m", "+op=mm", "shape=[16,16,16]", "bench.flush_cache=false,true", "search.n_trials=1", "device=cpu",
             "progress=false", "space=[aten]", "bench.isolate=false", "export.enabled=false",
             f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path)
    assert r.returncode == 2 and "timed without flushing the cache" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    out = r.stdout[r.stdout.index("the sweep ended on a job's failure; what its jobs recorded"):]
    assert "zhantune multirun: 1 job record(s)" in out and "1 job(s) wrote no record (#1: failed, killed" in out, out
    assert "mm[M=16,N=16,K=16]:float32" in out and "storage of the jobs: sqlite:///" in out, out


@pytest.mark.slow
def test_multirun_over_shapes(cli, tmp_path):
    r = cli(["-m", "+op=mm", "shape=[32,32,32],[48,32,16]", "search.n_trials=1", "device=cpu",
             "progress=false", "space=[aten]", "bench.isolate=false", f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "zhantune multirun: 2 job record(s)" in r.stdout, r.stdout[-3000:]
    con = sqlite3.connect(tmp_path / "zhantune.db")
    assert con.execute("select count(*) from zt_problem").fetchone()[0] == 2
    assert len(load_table(tmp_path / "zhantune_table.json")) == 2

    def claims(sweep: str) -> list[str]:
        return [s["claim"] for i in (0, 1) for s in json.loads((tmp_path / sweep / str(i) / "zhantune_job.json")
                                                                .read_text())["studies"]]

    # the same sweep again: each study is finished, and its job record says what its tune settled
    # (it said "not settled", the stored verdict unread)
    first = claims("sweep")
    assert "not settled" not in first, first
    r = cli(["-m", "+op=mm", "shape=[32,32,32],[48,32,16]", "search.n_trials=1", "device=cpu", "progress=false",
             "space=[aten]", "bench.isolate=false", f"hydra.sweep.dir={tmp_path}/sweep2"], cwd=tmp_path)
    assert r.returncode == 0 and "finished before the job" in r.stdout, r.stderr[-3000:]
    assert claims("sweep2") == first
