"""Decisions that hold on a busy machine (issue 15): the decision statistic, raised priority for timed
runs, paired speedup verdicts, one "best" everywhere, and tunes under a load the test makes itself."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading

import pytest

from zhantune.bench.decision import Round, judge_speedup

VERDICTS = [  # (rounds, confirmed, reason contains)
    ([Round(100, 50), Round(110, 52), Round(105, 51)], True, "confirmed in every round"),
    ([Round(100, 50), Round(55, 60)], False, "as fast or faster in a round"),  # a flip
    ([Round(100, 120), Round(100, 110)], False, "not faster"),
    ([Round(100, 50), Round(None, 50)], False, "rounds failed"),
    ([Round(100, 50, contended=1), Round(100, 50)], False, "under contention without real-time"),
    ([], False, "no round measured both sides"),
]


@pytest.mark.parametrize("rounds,confirmed,reason", VERDICTS)
def test_judge_speedup(rounds, confirmed, reason):
    v = judge_speedup(rounds)
    assert v.confirmed is confirmed and reason in v.reason


def test_claim_is_the_ratio_of_each_sides_minimum_over_rounds():
    v = judge_speedup([Round(100, 50), Round(90, 60), Round(120, 45)])
    assert v.ratio == pytest.approx(90 / 45) and v.ratio_low == pytest.approx(1.5) and v.ratio_high == pytest.approx(120 / 45)


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering niceness needs root or CAP_SYS_NICE")
def test_timed_runs_get_the_cores_first_and_every_thread_is_restored():
    from zhantune.bench.timing import raised_priority, time_cpu

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        before = {t: _nice(t) for t in tids}
        with raised_priority(-5) as raised:
            assert raised and all(_nice(t) == -5 for t in tids)
        assert {t: _nice(t) for t in tids} == before
        assert time_cpu(lambda: None, warmup_ms=1, target_ms=1, flush_cache=False, nice=-5,
                        fifo=False).method.endswith(":nice-5")
        assert time_cpu(lambda: None, warmup_ms=1, target_ms=1, flush_cache=False, nice=None,
                        fifo=False).method == "cpu:perf_counter"
        assert {t: _nice(t) for t in tids} == before
        policies = {t: os.sched_getscheduler(t) for t in tids}
        seen = []
        timing = time_cpu(lambda: seen.append(os.sched_getscheduler(worker.native_id)), warmup_ms=1, target_ms=1,
                          flush_cache=False)
        assert timing.method.endswith(":fifo") and set(seen) == {os.SCHED_FIFO}  # every thread, while timed
        assert {t: os.sched_getscheduler(t) for t in tids} == policies  # and restored
    finally:
        stop.set()
        worker.join()


def _busy() -> None:
    while True:
        pass


@pytest.fixture
def load():
    """Four busy-loop processes on this machine for the test's duration (two cores in CI)."""
    procs = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(4)]
    for p in procs:
        p.start()
    yield procs
    for p in procs:
        p.kill()
        p.join()


def _claims(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"winner: \S+, ([\d.]+)x faster than inductor default", stdout)]


@pytest.mark.slow
@pytest.mark.load
def test_under_load_no_noise_speedup_is_claimed_or_exported(cli, tmp_path, load):
    """Under four busy loops: ten tunes of the default's own kernel (space=[aten]) claim nothing and
    export no tuned entry; full tunes of mm and linear_act at 64x64x64 claim no more than a paired
    measurement of the same two kernels gives once the load is gone (this machine and CI: 289x to
    711x were claimed under such load before)."""
    from zhantune.inductor.table import load_table

    shapes = ",".join(f"[64,64,{k}]" for k in range(64, 64 + 10 * 8, 8))
    r = cli(["-m", "+op=mm", f"shape={shapes}", "device=cpu", "space=[aten]", "search.n_trials=1", "progress=false",
             "bench.isolate=false", "storage.url=sqlite:///aten.db", "export.path=aten.json"], tmp_path, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("the kernel Inductor's default compile runs too") == 10, r.stdout[-3000:]
    assert _claims(r.stdout) == []
    for entries in load_table(tmp_path / "aten.json").values():  # Inductor's default choice only
        assert entries == [{"template_id": "aten::mm"}]

    tuned = {}
    for op in ("mm", "linear_act"):
        r = cli([f"+op={op}", "shape=[64,64,64]", "device=cpu", "search.n_trials=3", "progress=false",
                 "bench.remeasure_rounds=2",
                 f"storage.url=sqlite:///{op}.db", f"export.path={op}.json"], tmp_path, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]
        tuned[op] = _claims(r.stdout)
        print(op, "under load:", " ".join(r.stdout.split())[-600:])
    for p in load:
        p.kill()
    for op, claims in tuned.items():
        if not claims:
            continue
        quiet = _quiet_paired_ratio(tmp_path / f"{op}.db", op)
        print(op, "claimed under load", claims[0], "quiet paired", round(quiet, 3))
        assert claims[0] <= 1.25 * quiet, (op, claims, quiet)


def _quiet_paired_ratio(db, op: str) -> float:
    """Default / winner, minimum over 5 interleaved rounds of each, with the load gone."""
    from hydra import compose, initialize_config_module

    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import register
    from zhantune.search.space import Candidate
    from zhantune.storage import Store
    from zhantune.tune import resolve_run

    store = Store(f"sqlite:///{db}")
    (_, _, (best,)), = store.ranked_candidates(top_k=1)
    register()
    with initialize_config_module("zhantune.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"+op={op}", "shape=[64,64,64]", "device=cpu"])
    run = resolve_run(cfg)
    branch = next(b for b in run.space.branches if b.name == best.branch)
    bench = InductorBenchmarker(run.problem, run.device, cfg.bench)
    bench.inductor_default()
    cand = Candidate(best.branch, branch.scope, best.template_id, dict(best.params))
    d, w = [], []
    for _ in range(5):
        d.append(bench.measure_default().timing.min_us)
        w.append(bench.measure(cand).timing.min_us)
    return min(d) / min(w)


@pytest.mark.slow
def test_every_best_named_is_the_exported_entry(cli, tmp_path):
    """After a close call and a speedup settle, the best config, the close-call line's faster
    config, the speedup line and the exported entry are one config (one ranking)."""
    r = cli(["+op=mm", "shape=[64,64,64]", "device=cpu", "space=[aten,cpp_gemm]", "search.n_trials=5",
             "bench.remeasure_rounds=2", "storage.url=sqlite:///z.db", "export.path=t.json", "export.min_speedup=null",
             "progress=false"], tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())  # Rich wraps long lines
    m = re.search(r"best config: (\S+) \{(.*?)\}", out)
    assert m, out
    branch, params = m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split(", "))
    entry = next(iter(json.loads((tmp_path / "t.json").read_text())["table"].values()))[0]
    assert {k: str(v) for k, v in entry["config_patch"].items()} == params
    close = re.search(r"close call re-measured .*?: (\S+)\((.*?)\) [\d,.]+ us is faster", out)
    if close:  # the close call names the same config first
        assert close.group(1) == branch and dict(kv.split("=", 1) for kv in close.group(2).split(", ")) == params
    winner = re.search(r"winner: (\S+),", out)
    if winner:
        assert winner.group(1) == branch
