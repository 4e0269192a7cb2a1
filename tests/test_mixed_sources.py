"""What export, compare and a tune's ranking read from a database that holds rows of several sources:
machines sharing a device key (a merge), other devices of a kind, other torch releases, CPU and GPU
devices. Found by an attack on the export's and compare's truth (session 41): each of these shipped
or printed a config from rows that should not decide it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from zhantune.bench.measurement import Measurement
from zhantune.bench.timing import summarize_us
from zhantune.candidate import Candidate
from zhantune.inductor.builder import build_table
from zhantune.inductor.choices import LookupEvent
from zhantune.inductor.table import default_entry
from zhantune.problems import GemmProblem
from zhantune.report.regret import CompareError, compare
from zhantune.storage import Recorder, Store

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
PROBLEM = GemmProblem("mm", (64, 64, 64), "bfloat16")
AGNOSTIC = "((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"


def _triton(block_m: int) -> Candidate:
    return Candidate("triton_mm", "template", "triton::mm",
                     {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3, "GROUP_M": 8})


A, B = _triton(32), _triton(64)


class _Db:
    """A database built with the tune's own Store and Recorder; ``torch``: the version rows record."""

    def __init__(self, path) -> None:
        self.store = Store(f"sqlite:///{path}")

    def recorder(self, device: str, torch: str = "2.13.0+cu128", study: str = "s", key: str = AGNOSTIC,
                 kind: str = "cuda", problem: GemmProblem = PROBLEM) -> Recorder:
        s = self.store
        rec = Recorder(s, problem, s.study_id(study, {}), s.device_id(device, device, kind, {}),
                       s.problem_id(problem.key, lookup_key=key, **problem.row_fields()))
        rec.versions = {"torch": torch, "triton": "3.9.0"}
        rec.hit = LookupEvent("mm", f"{device}+{key}", key, {"triton::mm": None}, ("triton::mm",))
        return rec

    def default(self, rec: Recorder, us: float) -> None:
        rec.add(Measurement("ok", timing=summarize_us([us, us * 1.05], "t"), lookup=rec.hit), "default")

    def candidate(self, rec: Recorder, cand: Candidate, us: float | None, status: str = "ok") -> None:
        timing = summarize_us([us, us * 1.05], "t") if us is not None else None
        rec.add(Measurement(status, timing=timing, lookup=rec.hit), "candidate", cand, trial_number=None)

    def confirmed(self, device: str, cand: Candidate, us: float, ratio: float, **recorder) -> Recorder:
        """A device's tune: Inductor's default at 20 us, ``cand`` at ``us``, its claim confirmed at ``ratio``."""
        rec = self.recorder(device, **recorder)
        self.default(rec, 20.0)
        self.candidate(rec, cand, us)
        self.verdict(rec, cand, ratio, torch=recorder.get("torch", "2.13.0+cu128"))
        return rec

    def verdict(self, rec: Recorder, cand: Candidate, ratio: float, torch: str = "2.13.0+cu128") -> None:
        self.store.add_verdict(study_id=rec.study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                               config_hash=cand.config_hash, ratio=ratio, ratio_low=ratio - 0.02, ratio_high=ratio + 0.02,
                               rounds=3, contended=0, confirmed=True, reason="r", torch_version=torch)


def _entry(table: dict) -> dict:
    (entries,) = table.values()
    return entries[0]


def test_a_config_wrong_once_on_a_device_is_never_shipped_or_ranked_there(tmp_path):
    """Two machines with one device key (a merged database): on one, config A was confirmed 1.5x
    faster; on the other its output was wrong (``incorrect``). A wrong output is never exported
    (README), yet the export shipped A after the merge and compare called it the winner, confirmed:
    only ``ok`` rows were read. Now A is out on that device: B, confirmed on the second machine, ships."""
    db = _Db(tmp_path / "z.db")
    db.confirmed(H100, A, 10.0, 1.5, study="a")
    second = db.recorder(H100, study="b")
    db.candidate(second, A, None, status="incorrect")
    db.candidate(second, B, 12.0)
    db.verdict(second, B, 1.4)
    store = db.store
    assert [r.config_hash for _, _, rows in store.ranked_candidates(H100, top_k=5) for r in rows] == [B.config_hash]
    for agnostic in (False, True):
        assert _entry(build_table(store, device_agnostic=agnostic, min_speedup=1.02))["BLOCK_M"] == 64
    (p,) = compare(store).problems
    assert p.winner[H100].config_hash == B.config_hash and p.confirmed_speedup == {H100: 1.4}
    # an old torch release's wrong output does not veto this release's rows (a fixed kernel)
    assert store.incorrect_configs("2.12.0") == {} and store.incorrect_configs("2.13.0+cpu")


@pytest.mark.parametrize("status", ["incorrect", "compile_error", "timeout"])
def test_a_device_agnostic_key_never_carries_a_config_that_failed_on_another_device_of_its_kind(tmp_path, status):
    """A device-agnostic key applies on every device of its kind. Config A was confirmed on the H100;
    on the H200 its output was wrong (or it failed to compile, or timed out) and nothing else was
    correct there: the H200 was not counted as a device that measured the problem, and A shipped
    under a key the H200 loads, from the export and from compare devices=[H100] table= (a review:
    also with min_speedup=null, which checked nothing)."""
    from zhantune.inductor.portable import FAILED_THERE, portable_choices

    db = _Db(tmp_path / "z.db")
    db.confirmed(H100, A, 10.0, 1.5)
    h200 = db.recorder(H200)
    db.default(h200, 20.0)
    db.candidate(h200, A, None, status=status)
    for min_speedup in (1.02, None):
        table = build_table(db.store, device_agnostic=True, min_speedup=min_speedup)
        assert table == {AGNOSTIC: [default_entry("mm")]}, table
        out = portable_choices(compare(db.store, [H100]), db.store, min_speedup)
        assert out.table == table and out.withheld == {PROBLEM.key: {H200: FAILED_THERE}}, out
    # keyed by device, the H100's own key still carries it
    assert _entry(build_table(db.store, device_key=H100, min_speedup=1.02))["BLOCK_M"] == 32


def test_compare_reads_recorded_gpu_data_whatever_torch_replayed_it(tmp_path):
    """A replay's rows carry the torch of the process that replayed them, but recorded GPU times hold
    for any torch: compare left a replay made under another torch out (a review of the release filter)."""
    store = Store(f"sqlite:///{tmp_path / 'z.db'}")
    gpu = "NVIDIA GeForce RTX 3090"
    dev = store.device_id(gpu, gpu, "cuda", {})
    prob = store.problem_id("k[problem_size=[64]]", op="k", shape={"problem_size": [64]}, dtype="recorded",
                            activation=None, lookup_op="k", flops=0)  # a replay's (zhantune.bench.recorded)
    for x, us in ((1, 2.0), (2, 3.0)):
        store.add_measurement(study_id=store.study_id("replay", {}), device_id=dev, problem_id=prob, kind="candidate",
                              status="ok", template_id=None, params={"x": x}, median_us=us, config_hash=f"c{x}",
                              torch_version="2.12.0+cu121")
    cmp = compare(store)
    (p,) = cmp.problems
    assert p.best_us == {gpu: 2.0} and p.winner[gpu].config_hash == "c1" and cmp.other_torch == {}


def test_compare_ranks_this_torch_releases_rows_as_the_export_does(tmp_path):
    """On one H100: config A's fastest row and its confirmed claim are torch 2.12's, config B's torch
    2.13's. The export (this torch, 2.13) ships B, confirmed 1.3x; compare named A the winner from
    the 2.12 row, said "no claim", and its own table shipped the default. Now compare reads this
    release's rows, says how many of another release it left out, and agrees with the export."""
    db = _Db(tmp_path / "z.db")
    old = db.recorder(H100, torch="2.12.0+cu128")
    db.default(old, 20.0)
    db.candidate(old, A, 8.0)
    db.verdict(old, A, 1.5, torch="2.12.0+cu128")
    db.confirmed(H100, B, 10.0, 1.3)
    assert _entry(build_table(db.store, min_speedup=1.02))["BLOCK_M"] == 64
    cmp = compare(db.store)
    (p,) = cmp.problems
    assert p.winner[H100].config_hash == B.config_hash and p.best_us[H100] == pytest.approx(10.0)
    assert p.claims[H100].confirmed and p.confirmed_speedup == {H100: 1.3}
    assert cmp.other_torch == {H100: 2}  # A's row and the 2.12 default's
    # a database of another release alone: said in one line, with the release and what to do
    only_old = _Db(tmp_path / "old.db")
    only_old.candidate(only_old.recorder(H100, torch="2.12.0+cu128"), A, 8.0)
    with pytest.raises(CompareError, match=r"with a build of this torch \S+ \(1 measurement\(s\) of torch 2\.12\.0 are "
                                           r"not compared: run compare with that torch\)"):
        compare(only_old.store)


def test_a_tune_ranks_only_rows_of_its_own_torch_release(tmp_path):
    """A study resumed after a torch upgrade holds the old release's rows: the tune's summary, its
    close call and its speedup settle ranked an old row (10 us) first, which this torch measured
    slower in every round. A tune ranks as the export does: this release's rows (the old ones only
    while there are none); a replay every row."""
    from zhantune.tune_result import ranked_rows as _ranked

    db = _Db(tmp_path / "z.db")
    import torch

    old = db.recorder(H100, torch="2.12.0+cpu")
    db.candidate(old, A, 10.0)
    new = db.recorder(H100, torch=torch.__version__)
    db.candidate(new, B, 50.0)
    tune = SimpleNamespace(device=SimpleNamespace(key=H100), replay=None, problem=PROBLEM)
    replay = SimpleNamespace(device=SimpleNamespace(key=H100), replay=object(), problem=PROBLEM)
    assert [r.config_hash for r in _ranked(db.store, tune, new.problem_id, 5)] == [B.config_hash]
    assert [r.config_hash for r in _ranked(db.store, replay, new.problem_id, 5)] == [A.config_hash, B.config_hash]
    # a finished study rerun after the upgrade, before any row of this release: its settle re-measures
    # the old release's best here (ranking nothing, a review found, it settled nothing on every rerun)
    only_old = _Db(tmp_path / "old.db")
    rec = only_old.recorder(H100, torch="2.12.0+cpu")
    only_old.candidate(rec, A, 10.0)
    assert [r.config_hash for r in _ranked(only_old.store, tune, rec.problem_id, 5)] == [A.config_hash]
    # ... but not once this release has measured it, even where each of its rows failed (a second
    # review: A, ok with 2.12, failed to compile here; the summary showed its old time and the settle
    # re-measured a config this torch cannot compile)
    only_old.candidate(only_old.recorder(H100, torch=torch.__version__), A, None, status="compile_error")
    assert _ranked(only_old.store, tune, rec.problem_id, 5) == []


def test_the_tables_key_is_the_one_its_torch_release_looked_up(tmp_path):
    """A newer torch's default compile recorded another lookup key: a 2.13 table wrote its entry under
    the 2.14 key (the newest default row of any torch), which 2.13's Inductor never looks up."""
    db = _Db(tmp_path / "z.db")
    db.confirmed(H100, A, 10.0, 1.5)
    db.default(db.recorder(H100, torch="2.14.0+cu128", key=AGNOSTIC.replace("+mm", "+mm_v2")), 20.0)
    assert list(build_table(db.store, device_key=H100, min_speedup=1.02)) == [f"{H100}+{AGNOSTIC}"]


def test_device_agnostic_over_cpu_and_gpu_devices_is_refused_in_one_line(cli, tmp_path):
    """One device-agnostic key for a problem measured on a CPU and a GPU: the faster device's entry
    won, a CPU config patch the GPU's table reader refuses (the whole table failed to load there) or
    a Triton entry stale on the CPU. A key without its device has no kind to be checked against:
    such an export is refused in one line, and device= picks one kind."""
    db = _Db(tmp_path / "z.db")
    gpu = db.recorder(H100)
    db.default(gpu, 20.0)
    db.candidate(gpu, A, 10.0)
    cpu = db.recorder("AMD EPYC (2 threads)", torch="2.13.0+cpu", kind="cpu")
    db.default(cpu, 20.0)
    db.candidate(cpu, Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"}), 5.0)
    db.store.engine.dispose()
    before = (tmp_path / "z.db").read_bytes()
    r = cli(["storage.url=sqlite:///z.db", "device_agnostic=true", "min_speedup=null", "path=t.json"], tmp_path,
            module="zhantune.export")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "device_agnostic=true: the database holds measurements of cpu and cuda devices" in r.stderr
    assert not (tmp_path / "t.json").exists() and (tmp_path / "z.db").read_bytes() == before
    r = cli(["storage.url=sqlite:///z.db", "device_agnostic=true", "min_speedup=null", "path=t.json", f"device='{H100}'"],
            tmp_path, module="zhantune.export")
    assert r.returncode == 0 and "wrote 1 key(s)" in r.stdout, r.stdout + r.stderr


def test_a_device_agnostic_export_lists_only_the_devices_that_placed_its_keys(tmp_path):
    """A helper's: a CPU tuned one problem and a GPU another. ``problems=`` (the CPU's) got past the
    two-kinds refusal, yet the wrapper listed both devices, so the key without a device had no kind and
    the CPU's aten::mm entry was a hit on CUDA (where it stops Triton's autotuning). A GPU whose configs
    no table carries (config patches) did the same without problems=, its problem's default entry
    placed too. The wrapper lists the devices that placed a key: the keys are the CPU's, left out on CUDA."""
    from zhantune.errors import ConfigError
    from zhantune.inductor.exporter import export_table
    from zhantune.inductor.table import read_table

    db = _Db(tmp_path / "z.db")
    small = GemmProblem("mm", (32, 32, 32), "float32")
    key = "((torch.float32, [32, 32], [32, 1]), (torch.float32, [32, 32], [32, 1]))+mm"
    cpu = db.recorder("AMD EPYC (2 threads)", torch="2.13.0+cpu", kind="cpu", problem=small, key=key)
    db.default(cpu, 20.0)
    db.candidate(cpu, Candidate("aten", "config", None, {"max_autotune_gemm_backends": "ATEN"}), 19.0)
    gpu = db.confirmed(H100, A, 10.0, 1.5)
    opts = SimpleNamespace(device_agnostic=True, top_k=1, min_speedup=1.02, torch_version="2.13.0+cpu",
                           format="zhantune", path=str(tmp_path / "t.json"))
    with pytest.raises(ConfigError, match="holds measurements of cpu and cuda devices"):
        export_table(db.store, opts)
    path, table = export_table(db.store, opts, problem_ids={cpu.problem_id})
    assert table == {key: [{"template_id": "aten::mm"}]}
    assert [d["kind"] for d in read_table(path).meta["devices"]] == ["cpu"]
    assert read_table(path, "cpu").table == table
    on_cuda = read_table(path, "cuda")
    assert on_cuda.table == {} and list(on_cuda.other_kind) == [key]
    # the GPU's configs are config patches, which no CUDA table carries: it places no key either
    with db.store.engine.begin() as conn:
        conn.exec_driver_sql(f"delete from zt_verdict where device_id = {gpu.device_id}")
        conn.exec_driver_sql(f"delete from zt_measurement where device_id = {gpu.device_id} and kind = 'candidate'")
    db.candidate(gpu, Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"}), 5.0)
    path, table = export_table(db.store, opts)
    assert list(table) == [key] and [d["kind"] for d in read_table(path).meta["devices"]] == ["cpu"]
    assert read_table(path, "cuda").table == {}


def test_an_export_of_another_torchs_rows_names_that_torch_and_the_bare_format_says_what_it_drops(cli, tmp_path):
    """A helper's: a database measured with torch 2.12 alone said "no correct measured candidate" to a
    2.13 export, naming neither torch; and ``format=inductor`` (no torch, kind or ISA in the file: its
    entries are never reported stale) said nothing of it."""
    import torch

    db = _Db(tmp_path / "z.db")
    db.confirmed(H100, A, 10.0, 1.5, torch="2.12.0+cu126")
    db.store.engine.dispose()
    r = cli(["storage.url=sqlite:///z.db", "path=t.json"], tmp_path, module="zhantune.export")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"zhantune: nothing to export from sqlite:///z.db: no correct measured candidate with torch {torch.__version__}; "
        "its candidates were measured with torch 2.12.0: export torch_version=2.12.0 for that torch's table"), r.stderr
    r = cli(["storage.url=sqlite:///z.db", "path=t.json", "torch_version=2.12.0", "format=inductor"], tmp_path,
            module="zhantune.export")
    assert r.returncode == 0 and "wrote 1 key(s)" in r.stdout, r.stdout + r.stderr
    assert ("note: format=inductor: the bare table names no torch release, device kind or CPU ISA: zhantune.use_table "
            "cannot report its entries stale under a torch other than 2.12.0") in " ".join(r.stdout.split())


def test_an_export_says_which_defaults_are_a_shared_keys(cli, tmp_path):
    """A helper's: relu's and gelu's linear_act on one CPU make one addmm lookup; gelu's claim was
    confirmed, relu's another config's, so the key ships the default, and the export's count said "no
    tuned config confirmed faster ... by min_speedup" of it. It names the shared key instead."""
    db = _Db(tmp_path / "z.db")
    key = "((torch.float32, [64], [1]), (torch.float32, [32, 32], [32, 1]), (torch.float32, [32, 64], [1, 32]))+addmm"
    for act, blocking in (("relu", "4,4,4"), ("gelu", "8,8,8")):
        problem = GemmProblem("linear_act", (32, 64, 32), "float32", activation=act, weight_layout="nk")
        cand = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP",
                                                      "cpp.gemm_cache_blocking": blocking})
        rec = db.recorder("AMD EPYC (2 threads)", torch="2.13.0+cpu", kind="cpu", problem=problem, key=key)
        db.default(rec, 20.0)
        db.candidate(rec, cand, 10.0)
        db.verdict(rec, cand, 2.0, torch="2.13.0+cpu")
    db.store.engine.dispose()
    r = cli(["storage.url=sqlite:///z.db", "path=t.json", "torch_version=2.13.0+cpu"], tmp_path, module="zhantune.export")
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert ("wrote 1 key(s) to t.json (format zhantune, top_k 1); 1 of them Inductor's default choice: 1 shared by "
            "problems with different tuned entries (below)") in out and "no tuned config confirmed" not in out, out
    assert "Inductor's default choice: problems with different tuned entries share this lookup key" in out, out


def test_one_keys_equal_entries_tuned_for_several_activations_serve_each(tmp_path):
    """A helper's: a plain addmm and linear_act relu (and gelu) of one shape make one addmm lookup on a
    CPU; where each problem's tune confirmed the same config, the key ships it for all, but the table
    tagged the key with the first problem's activation alone, so use_table reported the others'
    GEMMs stale and compiled Inductor's default. The tag now lists every activation the entries were
    tuned with (None: none), in the export's table and compare's portable one."""
    from zhantune.inductor.portable import portable_choices

    db = _Db(tmp_path / "z.db")
    key = "((torch.float32, [64], [1]), (torch.float32, [32, 32], [32, 1]), (torch.float32, [32, 64], [1, 32]))+addmm"
    cand = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP", "cpp.gemm_cache_blocking": "4,4,4"})
    for op, act in (("linear_act", "relu"), ("addmm", None), ("linear_act", "gelu")):
        problem = GemmProblem(op, (32, 64, 32), "float32", activation=act, weight_layout="nk")
        rec = db.recorder("AMD EPYC (2 threads)", torch="2.13.0+cpu", kind="cpu", problem=problem, key=key)
        db.default(rec, 20.0)
        db.candidate(rec, cand, 10.0)
        db.verdict(rec, cand, 2.0, torch="2.13.0+cpu")
    acts: dict = {}
    table = build_table(db.store, min_speedup=1.02, torch_version="2.13.0+cpu", activations=acts)
    ((placed, [entry]),) = table.items()
    assert placed == f"AMD EPYC (2 threads)+{key}" and entry["config_patch"]["cpp.gemm_cache_blocking"] == "4,4,4"
    assert acts == {placed: ["gelu", "relu", None]}
    portable = portable_choices(compare(db.store), db.store, None)
    assert list(portable.table) == [key] and portable.activations == {key: ["gelu", "relu", None]}
    # written as format_version 3: a zhantune that reads 1 and 2 refuses it by its version (a review's)
    from zhantune.inductor.exporter import export_table

    opts = SimpleNamespace(device_agnostic=False, top_k=1, min_speedup=1.02, torch_version="2.13.0+cpu",
                           format="zhantune", path=str(tmp_path / "t.json"))
    path, _ = export_table(db.store, opts)
    written = json.loads(path.read_text())
    assert written["format_version"] == 3 and written["activations"] == {placed: ["gelu", "relu", None]}


def test_compares_table_of_some_devices_needs_the_claim_on_every_device_of_their_kind(cli, tmp_path):
    """compare devices=[H100] table=...: A is confirmed 1.5x on the H100 and refuted (0.7x, paired) on
    the H200 of the same database. The table's key is device-agnostic, so it applies on the H200 too:
    A shipped there, while the export ships the default for the same problem. Now every device of the
    kind that measured the problem must confirm the choice, and compare names the one that did not.
    The wrapper's ``devices`` names the compared device when devices= gives its number (it was [])."""
    from zhantune.inductor.portable import portable_choices

    db = _Db(tmp_path / "z.db")
    for device, ratio in ((H100, 1.5), (H200, 0.7)):
        rec = db.recorder(device)
        db.default(rec, 20.0)
        db.candidate(rec, A, 10.0)
        db.verdict(rec, A, ratio)
    db.store.add_verdict(study_id=1, device_id=2, problem_id=1, config_hash=A.config_hash, ratio=0.7, ratio_low=0.68,
                         ratio_high=0.72, rounds=3, contended=0, confirmed=False, reason="slower in every round",
                         torch_version="2.13.0+cu128")
    out = portable_choices(compare(db.store, [H100]), db.store, 1.02)
    assert out.table == {AGNOSTIC: [default_entry("mm")]}
    assert list(out.withheld[PROBLEM.key]) == [H200], out.withheld
    assert build_table(db.store, device_agnostic=True, min_speedup=1.02) == out.table  # as the export decides
    db.store.engine.dispose()
    r = cli(["storage.url=sqlite:///z.db", "devices=[0]", "table=t.json", "min_speedup=null"], tmp_path,
            module="zhantune.compare")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads((tmp_path / "t.json").read_text())
    assert [d["key"] for d in doc["devices"]] == [H100], doc["devices"]


def test_compares_table_decides_which_devices_measured_a_problem_and_its_key_as_the_export(tmp_path):
    """Two more disagreements between compare table= and the export (a review): a device that
    measured only configs no table can carry there (a config patch on CUDA) withheld the portable
    choice as "never paired" there, which the export does not count; and the portable table keyed a
    problem by the first lookup key ever recorded (a newer torch's, ``+mm_v2``), not this release's."""
    from zhantune.inductor.portable import portable_choices

    db = _Db(tmp_path / "z.db")
    v2 = AGNOSTIC.replace("+mm", "+mm_v2")
    db.store.problem_id(PROBLEM.key, lookup_key=v2, **PROBLEM.row_fields())
    db.default(db.recorder(H100, torch="2.14.0+cu128", key=v2), 20.0)
    db.confirmed(H100, A, 10.0, 1.5)
    h200 = db.recorder(H200)
    db.default(h200, 20.0)
    db.candidate(h200, Candidate("cfg", "config", None, {"max_autotune_gemm_backends": "TRITON"}), 15.0)
    exported = build_table(db.store, device_agnostic=True, min_speedup=1.02)
    assert list(exported) == [AGNOSTIC] and _entry(exported)["BLOCK_M"] == 32
    out = portable_choices(compare(db.store, [H100]), db.store, 1.02)
    assert out.table == exported and out.withheld == {}


def test_compares_table_keys_and_kinds_as_the_export_after_a_second_review(tmp_path):
    """A second review of compare table= against the export, each on its own database: (1) a template
    entry went under the key an older release's row hit (``+mm_old``), this release's key getting
    ``[]`` (no choice at all there); (2) a problem's key came from any device of the database,
    another kind's too (a CPU's config patch under a GPU's ``+mm``); (3) compared CPU and GPU
    devices wrote one table a GPU cannot read; (4) a config that failed on the H200 hid the H100,
    which measured only it, so the H200's config shipped on the H100, never measured there."""
    from zhantune.errors import ConfigError
    from zhantune.inductor.portable import portable_choices

    def both(db, devices=None):
        return build_table(db.store, device_agnostic=True, min_speedup=1.02), \
            portable_choices(compare(db.store, devices), db.store, 1.02).table

    db = _Db(tmp_path / "1.db")  # (1)
    old = db.recorder(H100, torch="2.12.0+cu128", key=AGNOSTIC.replace("+mm", "+mm_old"))
    db.default(old, 20.0)
    db.candidate(old, A, 9.0)
    for device in (H100, H200):
        rec = db.recorder(device)
        db.default(rec, 20.0)
        db.candidate(rec, A, 10.0)
        db.verdict(rec, A, 1.5)
    exported, portable = both(db)
    assert list(portable) == [AGNOSTIC] and portable == exported
    db = _Db(tmp_path / "2.db")  # (2)
    cpp = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"})
    cpus = ["AMD EPYC (2 threads)", "AMD EPYC (4 threads)"]
    for cpu in cpus:
        rec = db.recorder(cpu, torch="2.13.0+cpu", kind="cpu", key=AGNOSTIC.replace("+mm", "+addmm"))
        db.default(rec, 20.0)
        db.candidate(rec, cpp, 10.0)
        db.verdict(rec, cpp, 1.5, torch="2.13.0+cpu")
    gpu = db.recorder(H100)
    db.default(gpu, 20.0)
    db.candidate(gpu, A, 10.0)
    portable = portable_choices(compare(db.store, cpus), db.store, 1.02).table
    assert portable == build_table(db.store, cpus[0], device_agnostic=True, min_speedup=1.02)
    assert list(portable) == [AGNOSTIC.replace("+mm", "+addmm")]
    db = _Db(tmp_path / "3.db")  # (3) the CPUs' problem and a GPU problem in one comparison
    for cpu in cpus:
        db.candidate(db.recorder(cpu, torch="2.13.0+cpu", kind="cpu"), cpp, 10.0)
    other = GemmProblem("mm", (128, 64, 64), "bfloat16")
    for device in (H100, H200):
        db.candidate(db.recorder(device, problem=other, key=AGNOSTIC.replace("[64, 64], [64, 1]), (", "[128, 64], [64, 1]), (")),
                     A, 11.0)
    with pytest.raises(ConfigError, match=r"table=: the compared devices are of two kinds \(cpu and cuda\)"):
        portable_choices(compare(db.store), db.store, 1.02)
    db = _Db(tmp_path / "4.db")  # (4)
    db.confirmed(H100, A, 10.0, 1.5)
    h200 = db.recorder(H200)
    db.default(h200, 20.0)
    db.candidate(h200, A, None, status="compile_error")
    db.candidate(h200, _triton(128), 12.0)
    db.verdict(h200, _triton(128), 1.3)
    assert both(db, [H100]) == ({AGNOSTIC: [default_entry("mm")]},) * 2


def test_a_device_agnostic_table_lists_only_the_devices_of_its_release_so_its_keys_keep_their_kind(tmp_path):
    """A review (session 46) of the rule that a key without a device is of the kind of every device
    its table lists: the export listed every device with a candidate of any torch release, so a GPU
    tuned under an older torch beside a CPU's confirmed claim made the CPU's config patch a key of
    neither kind, read for CUDA as a CUDA key and refused ("CPP is not allowed")."""
    import json
    from pathlib import Path

    import torch

    from zhantune.inductor.exporter import export_table
    from zhantune.inductor.table import read_table

    cpp = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"})
    db = _Db(tmp_path / "z.db")
    key = AGNOSTIC.replace("+mm", "+addmm")
    db.confirmed("AMD EPYC (2 threads)", cpp, 10.0, 1.5, torch=torch.__version__, kind="cpu", key=key)
    gpu = db.recorder(H100, torch="2.12.0+cu128", study="g")  # a GPU tuned under an older torch
    db.default(gpu, 20.0)
    db.candidate(gpu, A, 10.0)
    opts = SimpleNamespace(device_agnostic=True, top_k=1, min_speedup=1.02, torch_version=None, format="zhantune",
                           path=str(tmp_path / "t.json"))
    path, table = export_table(db.store, opts)
    assert list(table) == [key] and [d["kind"] for d in json.loads(Path(path).read_text())["devices"]] == ["cpu"]
    assert read_table(path, "cpu").table == table
    on_cuda = read_table(path, "cuda")
    assert on_cuda.table == {} and on_cuda.other_kind == {key: "cpu"}


def test_compares_html_report_and_csv_say_which_rows_of_other_releases_it_left_out(tmp_path):
    """The terminal and json= said how many rows of other torch releases compare left out; the HTML
    report did not (a review), nor the CSV (noticed in session 45)."""
    import csv

    from zhantune.report.html import write_html_report
    from zhantune.report.outputs import write_csv

    db = _Db(tmp_path / "z.db")
    db.candidate(db.recorder(H100, torch="2.12.0+cu128"), A, 8.0)
    db.confirmed(H100, B, 10.0, 1.3)
    text = write_html_report(tmp_path / "r.html", compare(db.store)).read_text()
    assert "Left out: 1 measurement(s) made with another torch release than this " in text
    assert f"({H100}: 1)" in text
    cmp = compare(db.store)
    with open(write_csv(tmp_path / "c.csv", cmp), newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["torch"] == cmp.torch and r["other_torch_left_out"] == "1" for r in rows), rows


def test_compare_never_calls_devices_in_agreement_when_no_winner_ran_on_another(tmp_path):
    """Two devices of one problem that measured no config in common (an attack on imported data,
    session 42): no winner was measured on the other device, yet compare printed "most disagreement:
    1.000x" and wrote ``"disagreement": 1.0``, which its docstring defines as "all agree". Nothing
    was compared: the terminal says "-", the JSON null, the HTML says none was measured."""
    import json

    from rich.console import Console

    from zhantune.report.html import write_html_report
    from zhantune.report.outputs import print_comparison, write_json

    db = _Db(tmp_path / "z.db")
    db.candidate(db.recorder(H100), A, 10.0)
    db.candidate(db.recorder(H200), B, 12.0)
    cmp = compare(db.store)
    (p,) = cmp.problems
    assert p.regret == {(H100, H100): 1.0, (H200, H200): 1.0} and p.disagreement is None
    console = Console(record=True, width=400)
    print_comparison(console, cmp)
    assert f"most disagreement: {PROBLEM.key} -" in console.export_text()
    assert json.loads(write_json(tmp_path / "c.json", cmp).read_text())["problems"][0]["disagreement"] is None
    assert "largest regret between devices: none measured" in write_html_report(tmp_path / "c.html", cmp).read_text()
    db.candidate(db.recorder(H200), A, 15.0)  # A measured on both: now a disagreement, 15/12
    (p,) = compare(db.store).problems
    assert p.disagreement == pytest.approx(1.25)


def test_a_tune_after_a_torch_upgrade_measures_the_old_releases_best_again(tmp_path):
    """A study resumed after a torch upgrade (noticed in session 41, fixed in 42): its sampler takes the
    old release's points as tried and the tune ranks this release's rows only, so the fastest config
    found with the old torch was never measured again and the tune's result was the best of the new
    trials. The settle now measures it once with this torch (kind ``remeasure``), and it wins here."""
    from zhantune.provenance import software_versions
    from zhantune.tune import settle
    from zhantune.tune_result import TuneResult, other_release_best, ranked_rows

    db = _Db(tmp_path / "z.db")
    db.candidate(db.recorder(H100, torch="2.12.0+cu126"), A, 5.0)  # the old release's best
    rec = db.recorder(H100, torch=software_versions()["torch"])
    default = rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=rec.hit), "default")
    db.candidate(rec, B, 10.0)
    measured: list[str] = []

    def measure(cand):
        measured.append(cand.config_hash)
        return Measurement("ok", timing=summarize_us([6.0, 6.1], "t"), lookup=rec.hit)

    bench = SimpleNamespace(measure=measure, measure_default=lambda: Measurement(
        "ok", timing=summarize_us([20.0, 20.5], "t"), lookup=rec.hit))
    run = SimpleNamespace(replay=None, bench=SimpleNamespace(remeasure_rounds=0),
                          device=SimpleNamespace(key=H100, kind="cuda"), problem=PROBLEM,
                          space=SimpleNamespace(branches=[SimpleNamespace(name="triton_mm", scope="template")]))
    old = other_release_best(db.store, run, rec.problem_id, rec.device_id)
    assert old.config_hash == A.config_hash and old.torch_version == "2.12.0+cu126"
    assert [r.config_hash for r in ranked_rows(db.store, run, rec.problem_id, 5)] == [B.config_hash]
    result = TuneResult("s", rec.study_id, None, default, None)
    settle(run, db.store, bench, rec, rec.problem_id, result)  # remeasure_rounds=0: no settle, nothing measured
    assert measured == [] and result.carried_text is None
    run.bench.remeasure_rounds = 1
    settle(run, db.store, bench, rec, rec.problem_id, result)
    assert measured[0] == A.config_hash and "the fastest config of torch 2.12.0+cu126 (5.0 us with it), not yet " \
        "measured with this one: 6.0 us" in result.carried_text, result.carried_text
    assert [r.config_hash for r in ranked_rows(db.store, run, rec.problem_id, 5)] == [A.config_hash, B.config_hash]
    assert other_release_best(db.store, run, rec.problem_id, rec.device_id) is None  # measured here now


def test_a_tables_triton_is_the_one_its_tuned_entries_were_measured_with(tmp_path):
    """The wrapper's ``triton`` was the exporting process's: a merged database of GPU tunes exported on
    another machine named that machine's Triton (or none) for entries measured with another. Now it is
    the Triton of the rows its tuned entries ship, null where they recorded none or several (the field
    holds one version: a table file's checks, an older zhantune's too); a table of Inductor's defaults
    only keeps the process's."""
    from zhantune.config import ExportConfig
    from zhantune.inductor.exporter import export_table
    from zhantune.provenance import software_versions

    db = _Db(tmp_path / "z.db")

    def triton_of(device_key: str | None = None) -> str | None:
        path = tmp_path / "t.json"
        out, _ = export_table(db.store, ExportConfig(path=str(path)), device_key)
        return json.loads(out.read_text())["triton"]

    rec = db.recorder(H100)
    rec.versions = {"torch": "2.13.0+cu128", "triton": "3.6.0"}
    db.default(rec, 20.0)
    db.candidate(rec, B, 10.0)  # never confirmed: the table ships Inductor's default
    assert triton_of() == software_versions()["triton"]
    for device, triton in ((H100, "3.6.0"), (H200, "3.5.0")):
        rec = db.recorder(device)
        rec.versions = {"torch": "2.13.0+cu128", "triton": triton}
        db.default(rec, 20.0)
        db.candidate(rec, A, 10.0)
        db.verdict(rec, A, 2.0)
    assert software_versions()["triton"] not in ("3.5.0", "3.6.0")
    assert triton_of(H100) == "3.6.0" and triton_of(H200) == "3.5.0" and triton_of() is None
    rec = db.recorder("NVIDIA A100", problem=GemmProblem("mm", (32, 64, 64), "bfloat16"))
    rec.versions = {"torch": "2.13.0+cu128", "triton": None}
    db.default(rec, 20.0)
    db.candidate(rec, A, 10.0)
    db.verdict(rec, A, 2.0)
    assert triton_of("NVIDIA A100") is None
