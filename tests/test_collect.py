"""collect: a Linear + activation is the problem linear_act, whose own compile makes the model's lookup
and fuses the model's epilogue; what a tune leaves out is noted (zhantune.inductor.epilogue)."""

from __future__ import annotations

import sqlite3
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
import yaml
from compiles import lookups_seen
from torch._inductor.utils import is_mkldnn_bf16_supported

from zhantune.device import resolve_device
from zhantune.inductor.gemms import collect


class Heads(torch.nn.Module):
    """One Linear per epilogue, each of its own size (its own lookup key)."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.gelu, self.relu, self.silu, self.tanh = (torch.nn.Linear(64, n, bias=bias) for n in (128, 96, 80, 72))
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return (self.down(F.gelu(self.gelu(x))) + x, torch.relu(self.relu(x)), F.silu(self.silu(x)),
                F.gelu(self.tanh(x), approximate="tanh"))


def _by_n(found):
    return {p.problem.dims["N"]: p for p in found}


def _own_key(problem, patch: dict) -> str:
    """The device-agnostic key the problem's own compile (a tune's) looks up."""

    from zhantune.inductor.choices import recording

    module, inputs = problem.build(torch.device("cpu"))
    torch._dynamo.reset()
    with torch.no_grad(), recording() as rec, lookups_seen(**patch):
        torch.compile(module)(*inputs)
    (key,) = {e.agnostic_key for e in rec.events if e.offered}
    return key


def test_a_linear_and_its_activation_are_collected_as_linear_act_with_the_models_own_key():
    """A helper's check (session 44): collect listed the MLP's Linear + GELU as a bare addmm; with
    the table, the model ran the C++ template with GELU fused into its epilogue, the tune had timed
    the template without it. Now: addmm + relu / exact gelu is linear_act with that activation; its
    own compile (a tune's) looks up the key the model did; silu, tanh-GELU, and a GELU after a
    bias-less Linear (linear_act has a bias) stay the bare GEMM with a note; so does a residual add (no
    activation, yet the C++ template fuses it into its kernel: the tune timed the GEMM without it; a
    helper's, it was named only where oneDNN fused a bfloat16 one)."""
    from zhantune.inductor.settings import CPU_BASE_PATCH

    found = _by_n(collect(Heads().eval(), (torch.randn(8, 64),), resolve_device("cpu")))
    assert {n: (p.problem.op, p.problem.activation) for n, p in found.items()} == {
        128: ("linear_act", "gelu"), 64: ("addmm", None), 96: ("linear_act", "relu"), 80: ("addmm", None),
        72: ("addmm", None)}
    assert found[128].note is None and found[96].note is None
    assert found[64].note == ("its output feeds a residual add, which linear_act does not model (relu, gelu): tuned as "
                              "addmm without it")
    assert "feeds silu, which linear_act does not model" in found[80].note
    assert "feeds gelu (tanh), which linear_act does not model" in found[72].note
    for n in (128, 96):  # the tune's compile makes the model's lookup (an addmm on CPU)
        assert _own_key(found[n].problem, CPU_BASE_PATCH) == found[n].lookup_key
        assert found[n].lookup_key.endswith("+addmm")
    torch._dynamo.reset()
    bare = _by_n(collect(Heads(bias=False).eval(), (torch.randn(8, 64),), resolve_device("cpu")))
    assert (bare[128].problem.op, bare[128].problem.activation) == ("mm", None)
    assert bare[128].note == "its output feeds gelu, which linear_act models only after a bias: tuned as mm without it"
    assert (bare[96].problem.op, bare[96].problem.activation) == ("mm", None) and "feeds relu" in bare[96].note

    # a Linear on [B, S, D] not prepacked (bfloat16 where oneDNN has no bf16: an AMD EPYC without
    # AVX-512; with it, oneDNN fuses the GELU and no lookup is made: README): an addmm on [B*S, D]
    # whose output is viewed back as [B, S, N] before its activation
    if not is_mkldnn_bf16_supported("cpu"):
        torch._dynamo.reset()
        lin = torch.nn.Sequential(torch.nn.Linear(64, 56), torch.nn.GELU()).to(torch.bfloat16).eval()
        (viewed,) = collect(lin, (torch.randn(2, 4, 64, dtype=torch.bfloat16),), resolve_device("cpu"))
        assert (viewed.problem.op, viewed.problem.activation, viewed.problem.dims["M"]) == ("linear_act", "gelu", 8)
        assert _own_key(viewed.problem, CPU_BASE_PATCH) == viewed.lookup_key

    class Chained(torch.nn.Module):  # a helper's attack on the detection
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 96), torch.nn.Linear(64, 88)

        def forward(self, x):  # exact GELU, then another, tanh, GELU; a reinterpretation is not a view
            return F.gelu(F.gelu(self.a(x)), approximate="tanh"), F.relu(self.b(x).view(torch.int32))

    torch._dynamo.reset()
    chained = _by_n(collect(Chained().eval(), (torch.randn(8, 64),), resolve_device("cpu")))
    assert (chained[96].problem.op, chained[96].problem.activation, chained[96].note) == ("linear_act", "gelu", None)
    assert (chained[88].problem.op, chained[88].note) == ("addmm", None)

    class Hand(torch.nn.Module):  # x @ w + b: an mm's lookup (frozen: a packed linear, then the add)
        def __init__(self):
            super().__init__()
            self.w, self.b = torch.nn.Parameter(torch.randn(64, 40)), torch.nn.Parameter(torch.randn(40))

        def forward(self, x):
            return torch.relu(x @ self.w + self.b)

    torch._dynamo.reset()
    (hand,) = collect(Hand().eval(), (torch.randn(8, 64),), resolve_device("cpu"))
    assert (hand.problem.op, hand.note) == ("mm", "a 1-D tensor is added to its output by the model's own add, then "
                                                  "relu, which linear_act does not model (its lookup is an addmm's on "
                                                  "CPU): tuned as mm without them")

    class Mixed(torch.nn.Module):  # two Linears of one key: one table entry serves both
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 48), torch.nn.Linear(64, 48)

        def forward(self, x):
            return F.gelu(self.a(x)), self.b(x)

    torch._dynamo.reset()
    (mixed,) = collect(Mixed().eval(), (torch.randn(8, 64),), resolve_device("cpu"))
    assert (mixed.problem.op, mixed.problem.activation, mixed.count) == ("linear_act", "gelu", 2)
    assert mixed.note == ("2 GEMMs of this key feed different epilogues (gelu, none); a table holds one entry per "
                          "key: tuned as the first (gelu), which use_table serves to the GEMMs of that activation "
                          "(Inductor's default, reported stale, to the others)")


def test_a_gpus_unfused_addmm_then_gelu_is_linear_act_looked_up_as_mm():
    """On a GPU, Inductor's post-grad pass rewrites a float32 addmm whose uses are pointwise into
    mm + bias add (unfuse_bias_add_to_pointwise): the model's lookup is an mm. Its real pass run on
    CPU (``is_gpu`` patched, as PyTorch's own tests mock devices): the mm's output gets the bias and
    then GELU, so it is linear_act, and linear_act's own compile under the same pass looks up that mm
    key (GemmProblem.lookup_op_on); a plain residual add after the bias is not an activation."""
    from torch._inductor.fx_passes import post_grad

    from zhantune.inductor.choices import recording
    from zhantune.inductor.gemms import epilogue_note, problem_from_event

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(64, 96)

        def forward(self, x):
            return F.gelu(self.a(x)), self.b(x) + 1

    with mock.patch.object(post_grad, "is_gpu", lambda _: True):
        torch._dynamo.reset()
        with torch.no_grad(), recording() as rec, lookups_seen(freezing=False):
            torch.compile(Two().eval())(torch.randn(8, 64))
        events = {e.inputs[1][1][1]: e for e in rec.events if e.offered}
        assert {n: e.op_name for n, e in events.items()} == {128: "mm", 96: "mm"}
        problem, why = problem_from_event(events[128], {"float32": "float32"})
        assert why is None and (problem.op, problem.activation) == ("linear_act", "gelu")
        assert problem.lookup_op_on("cuda") == "mm"
        assert _own_key(problem, {"freezing": False}) == events[128].agnostic_key
        plain, _ = problem_from_event(events[96], {"float32": "float32"})
        assert plain.op == "mm" and events[96].epilogue.bias_added and events[96].epilogue.activation is None
        assert epilogue_note(plain, [events[96].epilogue]) == ("a bias is added to its output after it (an unfused "
                                                              "addmm): tuned as mm without it")
    from zhantune.inductor.epilogue import Epilogue
    from zhantune.problems import GemmProblem

    bmm = GemmProblem("bmm", (4, 8, 32, 16), "float32")  # linear_act is 2-D: a review found "only after a bias"
    assert epilogue_note(bmm, [Epilogue("relu")]) == ("its output feeds relu, which linear_act models only after a "
                                                      "Linear's addmm: tuned as bmm without it")


@pytest.mark.slow
def test_collect_writes_linear_act_rows_that_a_tune_of_the_file_compiles_with_their_activation(cli, tmp_path):
    """The problems file carries a linear_act row's activation (conf/op/linear_act.yaml's relu is
    the default a hand-written row gets), and the tune of the file tunes linear_act:gelu."""
    from zhantune.problems.file import problem_keys

    r = cli(["model=zhantune.models:mlp", "model_kwargs={d_model:32,hidden:64,layers:1}", "input_shapes=[[8,32]]",
             "measure=false", "out=p.yaml"], tmp_path, module="zhantune.collect")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "linear_act:gelu" in r.stdout
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    rows = doc["problems"]
    assert doc["format_version"] == 2  # rows with an activation: an older zhantune refuses it by its version
    assert [(p["op"], p.get("activation"), p["shape"]) for p in rows] == [
        ("linear_act", "gelu", [8, 64, 32]), ("addmm", None, [8, 32, 64])]
    assert problem_keys(tmp_path / "p.yaml")[0] == "linear_act[M=8,N=64,K=32]:float32:gelu:weight_nk"
    r = cli(["problems=p.yaml", "search.total_trials=2", "bench.remeasure_rounds=0", "bench.isolate=false",
             "progress=false", "storage.url=sqlite:///z.db", "export.path=t.json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    with sqlite3.connect(tmp_path / "z.db") as con:
        ops = set(con.execute("select op, activation from zt_problem"))
    assert ops == {("linear_act", "gelu"), ("addmm", None)}
    written = yaml.safe_load((tmp_path / "t.json").read_text())  # JSON is YAML
    device_key = yaml.safe_load((tmp_path / "p.yaml").read_text())["device"]["key"]
    assert set(written["table"]) == {f"{device_key}+{p['lookup_key']}" for p in rows}
    # the activation each key was measured with: use_table compares it with the GEMM's own
    assert written["format_version"] == 2 and written["activations"] == {f"{device_key}+{rows[0]['lookup_key']}": "gelu"}
    assert "is not the key this problem's own compile made" not in r.stdout, r.stdout[-3000:]
    # a helper's hand edit: the linear_act row made a bare mm, the model's addmm key kept: said, not silent
    edited = {**rows[0], "op": "mm"}
    del edited["activation"]
    (tmp_path / "p2.yaml").write_text(yaml.safe_dump({**doc, "problems": [edited]}))
    r = cli(["problems=p2.yaml", "search.total_trials=1", "bench.remeasure_rounds=0", "bench.isolate=false",
             "progress=false", "storage.url=sqlite:///z2.db", "export.path=t2.json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    assert (f"warning: mm[M=8,N=64,K=32]:float32:weight_nk: the problems file's lookup_key {rows[0]['lookup_key']!r}"
            in out and "+mm': its table entry is under the latter, which that model does not look up" in out), out[-3000:]
    assert "(1 key(s); 1 of its 1 problem(s) get Inductor's default choice" in out, out[-1000:]


def test_only_inductors_own_default_entry_escapes_the_activation_check():
    """A review (session 45): the exemption of Inductor's default entries took any ``aten::`` entry:
    ``aten::bias_addmm`` (another kernel, a tuned choice) or an ``aten::mm`` under an addmm key
    was served to a GEMM feeding relu from a table that recorded gelu. Only ``aten::<the key's op>``
    alone (or ``[]``) escapes it; a tuned entry, alone or beside the default, is stale there."""
    from types import SimpleNamespace

    from zhantune.inductor.epilogue import Epilogue, activation_stale

    key = "((torch.float32, [64], [1]), (torch.float32, [8, 32], [32, 1]), (torch.float32, [32, 64], [1, 32]))" \
          "+alpha=1&beta=1+addmm"
    relu = SimpleNamespace(op_name="addmm", epilogue=Epilogue("relu"))
    measured = {key: "gelu"}
    assert activation_stale(measured, key, relu, [{"template_id": "aten::addmm"}]) is None
    assert activation_stale(measured, key, relu, []) is None
    for entries in ([{"template_id": "aten::bias_addmm"}], [{"template_id": "aten::mm"}],
                    [{"template_id": "aten::addmm"}, {"template_id": "zhantune::config", "config_patch": {}}]):
        assert activation_stale(measured, key, relu, entries).startswith(
            "measured with gelu fused after the GEMM, and this GEMM's output feeds relu"), entries
    assert activation_stale(measured, key, SimpleNamespace(op_name="addmm", epilogue=Epilogue("gelu")),
                            [{"template_id": "aten::bias_addmm"}]) is None  # measured so
    assert activation_stale(None, key, relu, [{"template_id": "aten::bias_addmm"}]) is None  # the table does not say


def test_a_model_of_another_dtype_cast_by_the_default_dtype_is_said(cli, tmp_path):
    """A helper's: without dtype=, collect and check cast the factory's model to float32 on CPU (the
    documented default), and a bfloat16 model was collected and checked as float32 with nothing
    saying so. The cast is now said, once, in one line; with dtype= given, or a float32 model, not."""
    from omegaconf import OmegaConf

    from zhantune.models import from_config

    (tmp_path / "bfmod.py").write_text("import torch\n\ndef make(dtype='bfloat16'):\n"
                                       "    return torch.nn.Linear(32, 64).to(getattr(torch, dtype))\n")
    r = cli(["model=bfmod:make", "input_shapes=[[8,32]]", f"out={tmp_path}/p.yaml"], tmp_path, module="zhantune.collect")
    assert r.returncode == 0, r.stderr[-2000:]
    note = ("note: the model's bfloat16 weights were cast to float32 (dtype= not given: float32 on a cpu device; "
            "dtype=NAME casts the whole model to NAME)")
    assert note in " ".join(r.stdout.split()), r.stdout
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["problems"][0]["dtype"] == "float32"
    base = {"model": "bfmod:make", "model_kwargs": None, "input_shapes": [[8, 32]], "device": "cpu"}
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        assert from_config(OmegaConf.create({**base, "dtype": None})).cast_note == note
        assert from_config(OmegaConf.create({**base, "dtype": "float32"})).cast_note is None
        assert from_config(OmegaConf.create({**base, "model_kwargs": {"dtype": "float32"}, "dtype": None})).cast_note is None


class _AttentionAndWeightBmm(torch.nn.Module):
    """Attention's scores (both bmm operands computed at run time) and a bmm with a weight."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 64, 32))

    def forward(self, x):
        scores = torch.bmm(x, torch.relu(x).transpose(1, 2).contiguous())
        return scores.sum(), torch.bmm(x, self.w)


def test_a_cpu_bmm_whose_second_operand_is_computed_at_run_time_is_not_collected_as_tunable():
    """A helper's: collect listed attention's bmm (both operands computed at run time) as tunable, a
    tune then measured the C++ BMM template on a frozen constant operand, and the entry never applied
    (use_table: stale). It is listed not tunable, with why; a bmm with a weight still is."""
    found = collect(_AttentionAndWeightBmm().eval(), (torch.randn(2, 16, 64),), resolve_device("cpu"))
    by_n = {p.inputs[1][1][2]: p for p in found if p.op_name == "bmm"}
    assert by_n[16].problem is None and by_n[16].reason.startswith(
        "bmm whose second operand is computed at run time (e.g. attention's keys or values): a CPU tune measures the "
        "C++ BMM template on a frozen constant one"), by_n[16]
    assert by_n[32].problem is not None and by_n[32].problem.op == "bmm" and by_n[32].reason is None, by_n[32]


class _RuntimeAndWeightMm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 48))

    def forward(self, x):  # x [16, 64]: a Gram matrix (both operands at run time), then a weight
        return torch.mm(x, torch.relu(torch.mm(x.t(), x))), torch.mm(x, self.w)


def test_a_cpu_mm_whose_second_operand_is_computed_at_run_time_is_not_collected_as_tunable():
    """A review's: as attention's bmm, an mm whose second operand is computed at run time was collected
    as tunable, and a tune measured the C++ template on a frozen constant one, which Inductor needs for
    it: the entry never applied. Listed not tunable with why; an mm with a weight still is."""
    found = [p for p in collect(_RuntimeAndWeightMm().eval(), (torch.randn(16, 64),), resolve_device("cpu"))
             if p.op_name == "mm"]
    runtime = [p for p in found if p.problem is None]  # x.t() @ x: its transposed first operand is said first
    assert len(runtime) == 2 and [p.reason.startswith("mm whose second operand is computed at run time")
                                  for p in runtime].count(True) == 1, found
    weight = [p for p in found if p.problem is not None]
    assert [p.problem.dims["N"] for p in weight] == [48] and weight[0].reason is None, found
    # one key, a run-time operand's GEMM first: tunable all the same, where any of its GEMMs is (a review's)
    both = collect(_SameKeyRuntimeFirst().eval(), (torch.randn(16, 64), torch.randn(64, 48)), resolve_device("cpu"))
    ((p,),) = [[p for p in both if p.op_name == "mm"]]
    assert p.count == 2 and p.problem is not None and p.reason is None, both


class _SameKeyRuntimeFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 48))

    def forward(self, x, y):
        return torch.cat([x @ (y * 2), x @ self.w])
