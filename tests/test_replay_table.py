"""A table tuned on another device, measured here (python -m zhantune.replay), then compared."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
import torch

from zhantune.inductor.table import load_table
from zhantune.report.regret import compare
from zhantune.storage import Store

pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_replay_a_remote_table_then_compare_gives_its_regret_here(cli, tmp_path):
    db = tmp_path / "z.db"
    url = f"sqlite:///{db}"
    # one re-measure round keeps it short and still stores re-measure rows for compare to rank
    # space=[cpp_gemm]: the remote winner is a config_patch entry (with ATen in the space a slow phase
    # during the template's trials ranks ATen first: it is only 1.12-1.17x behind at 64^3 here)
    r = cli(["+op=mm", "shape=[64,64,64]", "device=cpu", "space=[cpp_gemm]", "search.n_trials=3", f"storage.url={url}",
             "progress=false", "export.enabled=false", "bench.remeasure_rounds=1", "bench.isolate=false"], tmp_path)
    assert r.returncode == 0, r.stderr
    # the database arrives from another machine: its device is "Remote CPU"
    with sqlite3.connect(db) as con:
        (local_key,) = con.execute("select key from zt_device").fetchone()
        con.execute("update zt_device set key='Remote CPU', name='Remote CPU'")
    # min_speedup=null: the remote winner itself, even where it lost to Inductor's default there
    r = cli([f"storage.url={url}", f"path={tmp_path}/remote.json", "device=Remote CPU", "min_speedup=null"], tmp_path,
            module="zhantune.export")
    assert r.returncode == 0, r.stderr
    table = load_table(tmp_path / "remote.json")
    ((key, [entry]),) = table.items()

    r = cli([f"table={tmp_path}/remote.json", f"storage.url={url}", "device=cpu"], tmp_path, module="zhantune.replay")
    assert r.returncode == 0, r.stderr
    # each measurement's median and its fastest run, the statistic every decision uses
    assert re.search(r"inductor default ok median [\d,.]+ us, fastest [\d,.]+ us", r.stdout), r.stdout
    # the replay warns of a busy machine where its timed rows were taken so, as a tune's summary does
    with sqlite3.connect(db) as con:
        (contended,), = con.execute("select count(*) from zt_measurement m join zt_study s on m.study_id = s.id "
                                    "where s.name like 'replay:%' and m.contended").fetchall()
    assert ("timed measurement(s) were taken on a busy machine" in r.stdout) == (contended > 0), r.stdout
    # the entry's speedup over the default here, settled in paired rounds as a tune settles its winner
    with sqlite3.connect(db) as con:
        verdicts = con.execute("select v.rounds, v.config_hash from zt_verdict v join zt_study s on v.study_id = s.id "
                               "where s.name like 'replay:%'").fetchall()
    assert len(verdicts) == 1 and verdicts[0][0] == 3, verdicts  # bench.remeasure_rounds
    # stored under the tune's branch name, not "table": a tune's summary names its best config by it
    with sqlite3.connect(db) as con:
        branches = con.execute("select s.name like 'replay:%', m.branch from zt_measurement m join zt_study s "
                               "on m.study_id = s.id where m.kind = 'candidate' and m.config_hash = ?",
                               (verdicts[0][1],)).fetchall()
    assert {b for replayed, b in branches if replayed} == {b for replayed, b in branches if not replayed}, branches
    assert len(branches) >= 2 and "table" not in {b for _, b in branches}
    assert "speedup vs default, median of 3 paired interleaved round(s)" in r.stdout
    store = Store(url)
    cmp = compare(store)
    assert set(cmp.devices) == {"Remote CPU", local_key}
    (p,) = cmp.problems
    remote_winner = p.winner["Remote CPU"]
    assert remote_winner.params == entry["config_patch"]
    regret = p.regret[("Remote CPU", local_key)]
    with sqlite3.connect(db) as con:
        (here_us,) = con.execute(
            "select min(m.min_us) from zt_measurement m join zt_device d on m.device_id = d.id "
            "where d.key = ? and m.kind in ('candidate', 'remeasure') and m.status = 'ok' and m.config_hash = ?",
            (local_key, remote_winner.config_hash)).fetchone()
    assert regret >= 1.0 and regret == pytest.approx(here_us / p.best_us[local_key])
    # the portable table: one round confirms no claim, so by the export's rule (min_speedup, 1.02 by
    # default) the problem's device-agnostic key gets Inductor's default choice, and compare says why;
    # with min_speedup=null the portable choice itself
    agnostic = key.split("+", 1)[1]
    r = cli([f"storage.url={url}", f"table={tmp_path}/portable.json"], tmp_path, module="zhantune.compare")
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "portable.json").read_text())
    assert written["table"] == {agnostic: [{"template_id": "aten::mm"}]}
    assert written["torch"] == torch.__version__  # the torch its claims must have been confirmed with
    assert f"{p.problem_key}: Inductor's default ships; its portable choice on " in r.stdout
    # the remote tune's 1 round (or, on a busy machine, its rounds taken busy): no claim confirmed; a
    # round not flagged busy may also have the 3-trial winner slower than ATen ("not faster than the
    # default (0.97x)")
    assert re.search(r"Remote CPU: not confirmed: (one paired round|\d+ paired measurement|\d+ of \d+ rounds|the default|the smallest|not faster than)",
                     r.stdout), r.stdout
    assert "not confirmed: unconfirmed" not in r.stdout  # the reason said once
    assert "to pair them with the default: write the table with min_speedup=null" in r.stdout
    r = cli([f"storage.url={url}", f"table={tmp_path}/portable.json", "min_speedup=null"], tmp_path,
            module="zhantune.compare")
    assert r.returncode == 0, r.stderr
    portable = json.loads((tmp_path / "portable.json").read_text())["table"]
    assert list(portable) == [agnostic] and "Inductor's default ships" not in r.stdout
    assert "note: min_speedup=null: each key's fastest stored config ships as it was measured, never paired" in r.stdout
    assert portable[agnostic][0]["config_patch"] == p.portable.params


def _one_warm_row(tmp_path):
    """A database with one warm-cache default row of mm 16^3 on this CPU, and a table of its key:
    (db path, the CPU, the problem)."""
    from stored import warm_default_row

    db, lookup = tmp_path / "z.db", "((torch.float32, [16, 16], [16, 1]), (torch.float32, [16, 16], [16, 1]))+mm"
    cpu, problem = warm_default_row(db, lookup_key=lookup)
    (tmp_path / "t.json").write_text(json.dumps({f"{cpu.key}+{lookup}": [{"template_id": "aten::mm"}]}))
    return db, cpu, problem


def test_a_replay_with_the_other_cache_flushing_than_the_stored_rows_is_refused(cli, tmp_path):
    """A replay's rows join the rankings of its problems on this device (compare's, the export's), as
    a tune's do: where the stored rows of a problem were timed with the other bench.flush_cache
    (warm-cache 24.9 us beside cold-cache 100 us rows), the replay is refused before anything is
    measured, as the tune is (tests/test_cli.py), one line, exit 2, nothing stored."""
    db, cpu, problem = _one_warm_row(tmp_path)
    with sqlite3.connect(db) as con:
        before = con.execute("select count(*) from zt_measurement").fetchone()
    r = cli([f"table={tmp_path}/t.json", f"storage.url=sqlite:///{db}", "device=cpu", "bench.flush_cache=true"],
            tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"zhantune: bench.flush_cache=true: 1 measurement(s) of {problem.key} on {cpu.key} in this database were "
        "timed without flushing the cache before each run; this replay's would join their rankings (compare's, the "
        "export's): use bench.flush_cache=false"), r.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from zt_measurement").fetchone() == before
        assert con.execute("select count(*) from zt_study where name like 'replay:%'").fetchone() == (0,)
    # a merged database holding rows timed both ways (a review's: either value refused, and a replay
    # cannot leave its database): its rankings mix them already, and the replay is not refused
    from stored import warm_default_row

    from zhantune.bench.decision import cpu_timing_method
    from zhantune.errors import ConfigError
    from zhantune.tune_result import refuse_other_flushing

    warm_default_row(db, method=cpu_timing_method(True) + ":fifo", study="cold", us=99.0)
    store = Store(f"sqlite:///{db}")
    for flush in (True, False):
        refuse_other_flushing(store, cpu.key, [problem.key], flush, "why", mixed_ok=True)
        with pytest.raises(ConfigError, match=f"bench.flush_cache={str(flush).lower()}: 1 measurement"):
            refuse_other_flushing(store, cpu.key, [problem.key], flush, "why")


def test_a_replay_on_a_cpu_of_another_vector_isa_under_the_stored_key_is_one_line(cli, tmp_path):
    """A helper's: the device's row refused a CPU whose vector ISA differs from the stored one (one
    model name, two kinds of machine), and the replay printed that refusal as a traceback (exit 1); a
    tune said it in one line. Now the replay does too: exit 2, nothing stored."""
    db, cpu, _ = _one_warm_row(tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("""update zt_device set properties = '{"isa": "NOT-THIS-ONE"}'""")
        before = con.execute("select count(*) from zt_measurement").fetchone()
    r = cli([f"table={tmp_path}/t.json", f"storage.url=sqlite:///{db}", "device=cpu"], tmp_path,
            module="zhantune.replay")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "is a CPU with vector ISA 'NOT-THIS-ONE'" in r.stderr, r.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from zt_measurement").fetchone() == before


def test_replay_table_errors(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url)
    (tmp_path / "t.json").write_text(json.dumps({"X+((torch.float32, [8, 8], [8, 1]),)+mm": [{"template_id": "aten::mm"}]}))
    r = cli([f"table={tmp_path}/t.json", f"storage.url={url}", "device=cpu"], tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and "no problem with this Inductor input key in the database" in r.stderr
    # no database at all (a newcomer's, session 48: the hint was to run a tune): where the problems are
    r = cli([f"table={tmp_path}/t.json", f"storage.url=sqlite:///{tmp_path}/none.db"], tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "none.db (a replay measures the problems stored in the database the table was exported from: give its "
        "storage.url, or copy it here)"), r.stderr
    (tmp_path / "bad.json").write_text("{not json")
    r = cli([f"table={tmp_path}/bad.json", f"storage.url={url}"], tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and "not valid JSON" in r.stderr
    (tmp_path / "empty.json").write_text("{}")
    r = cli([f"table={tmp_path}/empty.json", f"storage.url={url}", "device=cpu"], tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and "empty.json: holds no lookup keys, nothing to measure" in r.stderr
    assert "Traceback" not in r.stderr
    # its only keys are another kind's device's: they are there, and left out for this kind
    (tmp_path / "gpu.json").write_text(json.dumps({
        "format": "zhantune-lookup-table", "format_version": 1, "torch": "2.13.0",
        "devices": [{"key": "NVIDIA H100", "kind": "cuda"}],
        "table": {"NVIDIA H100+((torch.float32, [8, 8], [8, 1]),)+mm": [{"template_id": "aten::mm"}]}}))
    r = cli([f"table={tmp_path}/gpu.json", f"storage.url={url}", "device=cpu"], tmp_path, module="zhantune.replay")
    assert r.returncode == 2 and ("gpu.json: holds no lookup keys for a cpu device (its 1 key(s) are of cuda devices: "
                                  "replay it on one), nothing to measure") in r.stderr, r.stderr
    with sqlite3.connect(tmp_path / "empty.db") as con:  # no study was made for it
        assert con.execute("select count(*) from studies").fetchone() == (0,)


def test_a_replay_on_a_busy_machine_leaves_a_confirmed_claim_standing_and_says_so(tmp_path, monkeypatch):
    """A helper's attack (session 46): a replay under load stored "not confirmed: 6 paired
    measurement(s) taken on a busy machine", the newest verdict, and the export and compare dropped
    the entry's confirmed 2.01x claim without a word. Busy rounds neither confirm nor refute it: the
    claim stands, and the replay says so; quiet rounds that do not confirm it replace it, said too."""
    from types import SimpleNamespace

    from zhantune.bench import settle
    from zhantune.bench.decision import SpeedupVerdict
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.candidate import Candidate
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder
    from zhantune.table_replay import _settle

    store = Store(f"sqlite:///{tmp_path}/z.db")
    device_id, study_id = store.device_id("dev", "dev", "cpu", {}), store.study_id("s", {})
    problem = GemmProblem("mm", (64, 64, 64), "float32")
    rec = Recorder(store, problem, study_id, device_id, store.problem_id(problem.key, **problem.row_fields()))
    cand = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"})
    row = rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t")), "candidate", cand, trial_number=0)
    store.add_verdict(study_id=study_id, device_id=device_id, problem_id=row.problem_id, config_hash=cand.config_hash,
                      ratio=2.01, ratio_low=2.0, ratio_high=2.03, rounds=3, contended=0, confirmed=True, reason="r")
    for contended, said_then, ratio in ((6, "stands: rounds of fewer than two or on a busy machine", 2.01),
                                        (0, "is replaced by this one, which the export and compare follow", 1.5)):
        verdict = SpeedupVerdict(1.5, 1.3, 1.6, 3, contended, False, "not confirmed")
        settled = SimpleNamespace(verdict=verdict, text=None, default=row)
        monkeypatch.setattr(settle, "settle_speedup", lambda *a, settled=settled, **k: settled)
        said: list[str] = []
        _settle(store, study_id, device_id, row, row, cand, None, rec, 3, said.append)
        assert said[1] == f"    the claim stored before (2.01x confirmed in 3 rounds) {said_then}" + (
            " neither confirm nor refute it" if contended else ""), said
        (latest,) = store.latest_verdicts().values()
        assert latest.ratio == ratio and latest.confirmed is (ratio == 2.01)


@pytest.mark.parametrize(("default_us", "warned"), [(100.0, False), (115.0, False), (183.0, True), (50.0, True)])
def test_a_replayed_default_kernel_beyond_noise_from_the_default_is_a_warning(default_us, warned):
    """A table entry that is the default's own kernel is not paired (nothing to claim); where the two
    measurements of that one kernel differ beyond noise (1.2x either way) the replay says so, as a
    tune's summary does, instead of leaving 623 us against 340 us unexplained (a newcomer's finding)."""
    from types import SimpleNamespace

    from zhantune.table_replay import _settle

    def row(us: float) -> SimpleNamespace:
        return SimpleNamespace(template_id=None, params={"max_autotune_gemm_backends": "ATEN"}, min_us=us,
                               median_us=us * 1.1, timing_method="cpu_wall:fifo", problem_id=1)

    said: list[str] = []
    never = SimpleNamespace(add=lambda *a, **k: pytest.fail("the default's own kernel is not re-measured"))
    _settle(None, 1, 1, row(100.0), row(default_us), None, None, never, 3, said.append)
    assert said[0] == "    the winner is the kernel Inductor's default compile runs: no speedup to claim"
    assert any("warning: this entry is the default's own kernel" in line for line in said) is warned, said
    if warned:
        assert (f"the default's fastest run took {default_us:,.1f} us and this entry's 100.0 us "
                f"(default / entry {default_us / 100:.2f}x)") in said[1]
