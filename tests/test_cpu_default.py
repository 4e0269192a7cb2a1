"""Issue 18: on CPU the default is the compile users get (freezing, oneDNN on, prepacked linear), a
C++-template candidate reaches the template per GEMM with oneDNN on, and use_table changes only the
GEMMs it covers. Every check counts what Inductor compiled (counters, generated code); the one timing
(the acceptance test's bf16 nn.Linear before and after use_table) guards a 25x regression."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from compiles import lookups_seen
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor import lowering
from torch._inductor.utils import is_mkldnn_bf16_supported, run_and_get_code

from zhantune.bench.inductor import InductorBenchmarker
from zhantune.candidate import Candidate
from zhantune.config import BenchConfig
from zhantune.device import resolve_device
from zhantune.inductor.choices import recording
from zhantune.inductor.runtime import use_table
from zhantune.inductor.table import CONFIG_TEMPLATE_ID
from zhantune.problems import GemmProblem

pytestmark = pytest.mark.slow

BENCH = BenchConfig(warmup_ms=1, target_ms=2, min_reps=3, flush_cache=False)
CPP = {"max_autotune_gemm_backends": "CPP", "cpp.gemm_thread_factors": None, "cpp.gemm_max_k_slices": 1,
       "cpp.gemm_cache_blocking": None}
ATEN = {"max_autotune_gemm_backends": "ATEN"}
#: whether Inductor's freezing pass packs a linear of this dtype for MKL / oneDNN on this CPU: bf16
#: needs oneDNN's bf16 support (torch/_inductor/fx_passes/mkldnn_fusion.py asks
#: is_mkldnn_bf16_supported; an AMD EPYC without AVX-512 has none), and Inductor's default is then
#: the extern ATen GEMM. Either way the default baseline is what a user's compile makes.
PACKED = {"float32": True, "bfloat16": is_mkldnn_bf16_supported("cpu")}


def _default_counts(dtype: str, seen: dict) -> dict:
    """What Inductor's default compile of one GEMM makes on this CPU: the prepacked linear (one
    pack by the freezing pass, one or more packed-op calls), or where this dtype is not packed the
    extern ATen GEMM; never the C++ template."""
    if PACKED[dtype]:
        return {"packed_by_freezing": 1, "cpp_template": 0, "packed_op_calls": max(1, seen["packed_op_calls"]),
                "extern_mm": 0}
    return {"packed_by_freezing": 0, "cpp_template": 0, "packed_op_calls": 0, "extern_mm": 1}


def _counted(fn, *args):
    """Run ``fn`` (which compiles); return (its result, what the compile produced, by count)."""
    packs = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    templated = counters["inductor"]["cpp_templated_kernel_counter"]
    result, code = run_and_get_code(fn, *args)
    code = "\n".join(code)
    return result, {
        "packed_by_freezing": counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] - packs,
        "cpp_template": counters["inductor"]["cpp_templated_kernel_counter"] - templated,
        "packed_op_calls": len(re.findall(r"torch\.ops\.(?:mkl\._mkl_linear|mkldnn\._linear_pointwise)", code)),
        "extern_mm": len(re.findall(r"extern_kernels\.(?:add)?mm\(", code)),
    }


def _flags(installed: bool = False) -> dict:
    """Every global setting use_table could touch. While a table is installed its hooks are in
    ``user_lowerings`` and the table is in ``lookup_table.table`` (Inductor's FX graph cache keys
    then differ per table); ``installed`` leaves those two out."""
    config = inductor_config.get_config_copy()
    flags = {"mkldnn": torch.backends.mkldnn.enabled, "config": config, "user_lowerings": dict(lowering.user_lowerings)}
    if installed:
        del config["lookup_table.table"], flags["user_lowerings"]
    return flags


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_baseline_is_the_prepacked_linear_a_user_compiles(dtype):
    """The "inductor default" baseline and the ``aten`` candidate compile oneDNN's / MKL's prepacked
    linear (freezing on, oneDNN on); the C++-template candidate replaces exactly that GEMM."""
    problem = GemmProblem.from_config("addmm", [32, 64, 48], dtype, weight_layout="nk")
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BENCH)
    default, seen = _counted(bench.inductor_default)
    assert default.status == "ok"
    assert seen == _default_counts(dtype, seen)
    assert torch.backends.mkldnn.enabled
    # the problem's key is Inductor's, made from the packed GEMM's kernel inputs (or its ATen GEMM's)
    assert default.lookup is not None and (default.lookup.packed is not None) == PACKED[dtype]
    assert bench.lookup_key == default.lookup.agnostic_key and bench.lookup_key.endswith("+addmm")

    aten, seen_aten = _counted(bench.measure, Candidate("aten", "config", None, ATEN))
    assert aten.status == "ok" and seen_aten == seen  # "leave it to Inductor": the same compile
    cpp, seen_cpp = _counted(bench.measure, Candidate("cpp_gemm", "config", None, CPP))
    assert cpp.status == "ok", cpp.error_text
    assert seen_cpp["cpp_template"] == 1 and seen_cpp["packed_op_calls"] == 0 and seen_cpp["extern_mm"] == 0
    # the candidate's key (from the hook) is the key use_table looks up
    assert cpp.lookup.agnostic_key == bench.lookup_key and cpp.lookup.hit_templates == (CONFIG_TEMPLATE_ID,)
    assert not inductor_config.max_autotune and torch.backends.mkldnn.enabled
    # the baselines: eager, that default, and the default compile without freezing (what a user who
    # does not set freezing gets: the GEMM as an extern ATen call, nothing packed, no template)
    measured, seen_all = _counted(bench.baselines)
    assert [kind for kind, _ in measured] == ["eager", "default", "default_unfrozen"]
    assert all(m.status == "ok" for _, m in measured), [m.error_text for _, m in measured]
    packed = int(PACKED[dtype])
    assert seen_all["packed_by_freezing"] == packed and seen_all["extern_mm"] == 2 - packed
    assert seen_all["cpp_template"] == 0


def test_max_autotune_in_the_environment_does_not_change_the_default_baseline():
    """TORCHINDUCTOR_MAX_AUTOTUNE=1 (Inductor reads it into config.max_autotune at import) made the
    "inductor default" baseline the C++ template and the ``aten`` candidate not_applied (a review);
    every benchmark compile now turns max-autotune off unless its candidate's patch turns it on."""
    problem = GemmProblem.from_config("addmm", [32, 64, 48], "float32", weight_layout="nk")
    with inductor_config.patch(max_autotune=True, max_autotune_gemm=True):  # as the environment sets it
        bench = InductorBenchmarker(problem, resolve_device("cpu"), BENCH)
        default, seen = _counted(bench.inductor_default)
        assert default.status == "ok" and seen == _default_counts("float32", seen)
        aten, seen_aten = _counted(bench.measure, Candidate("aten", "config", None, ATEN))
        assert aten.status == "ok" and seen_aten == seen, aten.error_text
        cpp, seen_cpp = _counted(bench.measure, Candidate("cpp_gemm", "config", None, CPP))
        assert cpp.status == "ok" and seen_cpp["cpp_template"] == 1, cpp.error_text


def _linear(n: int, k: int, dtype=torch.bfloat16) -> torch.nn.Module:
    return torch.nn.Linear(k, n).to(dtype).eval()


def _compile(model, *x):
    torch._dynamo.reset()
    with torch.no_grad(), lookups_seen(freezing=True):
        return torch.compile(model)(*x)


def test_use_table_changes_only_the_gemms_it_covers():
    torch.manual_seed(0)
    covered, other = _linear(48, 64), _linear(40, 32)
    x_covered, x_other = torch.randn(16, 64, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    with recording() as rec:
        _compile(covered, x_covered)
    (key,) = [e.device_key for e in rec.events if e.offered]
    table = {key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}

    before, before_installed = _flags(), _flags(installed=True)
    for plain in (True, False):
        installed = use_table(table)
        try:
            assert _flags(installed=True) == before_installed  # installing changes no global flag
            with contextlib.nullcontext() if plain else installed:
                _, seen = _counted(_compile, covered, x_covered)
                assert seen["cpp_template"] == 1 and seen["packed_op_calls"] == 0
                out, seen = _counted(_compile, other, x_other)
                assert seen == _default_counts("bfloat16", seen)
                torch.testing.assert_close(out, other(x_other), rtol=2e-2, atol=2e-2)
                assert installed.report.hits[key] == 1 and len(installed.report.misses) == 1
                assert _flags(installed=True) == before_installed  # compiling changed none either
        finally:  # a failed assertion must not leave the handler installed for the worker's next tests
            installed.remove()
        assert _flags() == before  # removed: everything as it was
    # without freezing the template cannot apply: the default compiles and the report says why
    with use_table(table) as installed:
        torch._dynamo.reset()
        with torch.no_grad(), lookups_seen():
            _, seen = _counted(torch.compile(covered), x_covered)
        assert seen["cpp_template"] == 0 and seen["extern_mm"] == 1
        assert "freezing = True" in installed.report.stale[key]
    assert _flags() == before


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # packed by the freezing pass, and not where unsupported
def test_an_aten_entry_on_cpu_is_a_hit_only_as_the_ops_own_kernel(dtype):
    """Tables are data (session 39 attack): any ``aten::*`` template_id on CPU ("aten::does_not_exist")
    was counted a hit, Inductor's default compiled, so check's coverage gate passed on a table naming
    a kernel that does not exist. Only the op's own ATen kernel (the entry export writes for Inductor's
    default) is one; any other is stale, said so, and the default compiles all the same."""
    torch.manual_seed(0)
    model, x = _linear(48, 64, getattr(torch, dtype)), torch.randn(16, 64, dtype=getattr(torch, dtype))
    with recording() as rec:
        _compile(model, x)
    (event,) = [e for e in rec.events if e.offered]
    assert event.op_name == "addmm"
    for tid, hit in (("aten::addmm", True), ("aten::does_not_exist", False)):
        with use_table({event.device_key: [{"template_id": tid}]}) as installed:
            _, seen = _counted(_compile, model, x)
        assert seen == _default_counts(dtype, seen)
        assert bool(installed.report.hits) is hit and bool(installed.report.stale) is not hit, installed.report.as_dict()
        if not hit:
            assert installed.report.stale[event.device_key].startswith(f"{tid} is not a CPU choice")


@pytest.mark.parametrize("setting", [{"cpp.weight_prepack": False}, {"cpp.simdlen": 1}])
def test_a_cpp_entry_under_settings_that_change_its_kernel_is_stale_not_a_hit(setting):
    """A settings audit (session 39): with torch._inductor.config.cpp.weight_prepack = False after an
    earlier compile in the process (the freezing pass still packs the linear), Inductor's packed
    lowering offers no C++ template: the default packed op compiled while the report counted a hit.
    With cpp.simdlen (or ATEN_CPU_CAPABILITY) below the CPU's vector ISA the entry compiled a
    scalar micro-kernel, not the one measured, and the report counted a hit."""
    from zhantune.inductor.cpu_entries import ISA_MISMATCH, PREPACK_OFF, isa_mismatch

    torch.manual_seed(0)
    model, x = _linear(48, 64, torch.float32), torch.randn(16, 64)
    with recording() as rec:
        _compile(model, x)
    (key,) = [e.device_key for e in rec.events if e.offered]
    with inductor_config.patch(setting), \
            use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        out, seen = _counted(_compile, model, x)
        why = PREPACK_OFF if "cpp.weight_prepack" in setting else isa_mismatch()
    assert seen["cpp_template"] == 0 and seen["packed_op_calls"] >= 1
    assert why and installed.report.stale == {key: why} and not installed.report.hits
    if "cpp.simdlen" in setting:
        assert why.startswith(ISA_MISMATCH.split("{")[0] + "no vector ISA")
    torch.testing.assert_close(out, model(x))


class _TransposedInput(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.lin = torch.nn.Linear(64, 48).to(dtype)

    def forward(self, x):
        return self.lin(x.t())


@pytest.mark.parametrize("dtype, frozen", [(torch.float32, True), (torch.bfloat16, True), (torch.float32, False)])
def test_a_cpp_entry_inductor_does_not_offer_the_template_for_is_stale_with_the_real_reason(dtype, frozen):
    """A hostile-table attack (session 40): a linear of a transposed input (``x.t()``), for which
    Inductor offers no C++ template (use_cpp_gemm_template: the input's last dimension must be
    contiguous). A float32 one is packed: the packed path never asked, so the report and ``check``
    counted a hit while MKL compiled; a bfloat16 one (unpacked where oneDNN has no bf16) was stale
    for "needs a frozen constant weight", which it had. Now both are stale for the transposed input;
    a weight that is not frozen still says so."""
    from zhantune.inductor.cpu_entries import NOT_FROZEN, TRANSPOSED_INPUT

    torch.manual_seed(0)
    model, x = (_TransposedInput(dtype).eval(), torch.randn(64, 16, dtype=dtype)) if frozen else \
        (_linear(48, 64, dtype), torch.randn(16, 64, dtype=dtype))  # row-contiguous, not frozen

    def compile_(model, x):
        torch._dynamo.reset()
        with torch.no_grad(), lookups_seen(freezing=frozen):
            return torch.compile(model)(x)

    with recording() as rec:
        compile_(model, x)
    (key,) = [e.device_key for e in rec.events if e.offered]
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        out, seen = _counted(compile_, model, x)
    assert seen["cpp_template"] == 0
    assert installed.report.stale == {key: TRANSPOSED_INPUT if frozen else NOT_FROZEN} and not installed.report.hits
    torch.testing.assert_close(out, model(x))


@pytest.mark.parametrize("requires_grad, act", [(True, False), (False, False), (True, True)])
def test_a_compile_outside_no_grad_says_so_and_its_gemm_stays_tunable(requires_grad, act):
    """A helper's (session 52): freezing on, the first call outside torch.no_grad(). Inductor freezes
    nothing then (compile_fx.py: only with grad mode off), and the report blamed "the GEMM's second
    operand is computed at run time" and left the Linear out of the coverage as untunable. Now the
    reason names no_grad and the GEMM counts, as under no_grad it would be served. A linear_act
    entry (``act``: a Linear + GELU, the table tagged gelu) said "a table of another model" (autograd
    keeps the GEMM's output, so it fed no GELU alone: a helper's, session 53)."""
    from zhantune.inductor.cpu_entries import GRAD_ON
    from zhantune.inductor.table import FORMAT

    torch.manual_seed(0)
    model, x = _linear(48, 64, torch.float32).requires_grad_(requires_grad), torch.randn(16, 64)
    model = torch.nn.Sequential(model, torch.nn.GELU()).eval() if act else model
    with recording() as rec:
        _compile(model, x)
    (key,) = [e.device_key for e in rec.events if e.offered]
    assert (rec.events[0].epilogue.activation == "gelu") is act
    table = {"format": FORMAT, "format_version": 2, "torch": str(torch.__version__), "activations": {key: "gelu"} if act else {},
             "table": {key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}}
    torch._dynamo.reset()
    with use_table(table) as installed, lookups_seen(freezing=True):
        _, seen = _counted(torch.compile(model), x)  # grad mode on
    report = installed.report
    assert seen["cpp_template"] == 0 and not report.hits
    assert set(report.stale.values()) == {GRAD_ON} and not report.untunable and report.tunable_coverage == 0


class _BatchPermutedBmm(torch.nn.Module):
    def forward(self, x, w):
        return torch.bmm(x.transpose(0, 1), w)


def test_a_bmm_entry_for_a_batch_permuted_input_is_stale_for_its_layout_not_its_weight():
    """A review (session 40): Inductor's C++ BMM template needs a first input contiguous in each batch
    (use_cpp_bmm_template) and no constant operand; a bmm of ``x.transpose(0, 1)`` was stale for
    "needs a frozen constant weight"."""
    from zhantune.inductor.cpu_entries import TRANSPOSED_INPUT

    torch.manual_seed(0)
    model, args = _BatchPermutedBmm(), (torch.randn(16, 2, 64), torch.randn(2, 64, 48))

    def compile_(*args):
        torch._dynamo.reset()
        with torch.no_grad(), lookups_seen():
            return torch.compile(model)(*args)

    with recording() as rec:
        compile_(*args)
    (key,) = [e.device_key for e in rec.events if e.offered]
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        out, seen = _counted(compile_, *args)
    assert seen["cpp_template"] == 0
    assert installed.report.stale == {key: TRANSPOSED_INPUT} and not installed.report.hits
    torch.testing.assert_close(out, model(*args))


class _WeightBmm(torch.nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return torch.bmm(x, self.w)


class _ActivationBmm(torch.nn.Module):
    def forward(self, x):  # attention's q @ k^T: both operands computed at run time
        return torch.bmm(x, torch.relu(x).transpose(1, 2).contiguous())


def test_a_bmm_entry_applies_to_a_constant_second_operand_only():
    """An attack's finding: a tune measures a bmm with its second operand a frozen weight (the C++
    BMM template blocks it when compiled), and a collected attention bmm (both operands activations)
    hit its entry, compiling another kernel that no measurement covered (checked, not a speedup).
    Such a hit is stale now, and the default compiles; on a frozen weight the entry is a hit."""
    from zhantune.inductor.cpu_entries import BMM_RUNTIME_OPERAND

    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    weight, activations = _WeightBmm(torch.randn(2, 64, 32)), _ActivationBmm()
    for model, hit in ((weight, True), (activations, False)):
        with recording() as rec:
            _compile(model, x)
        (key,) = [e.device_key for e in rec.events if e.offered]
        with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
            out, seen = _counted(_compile, model, x)
        assert (seen["cpp_template"] == 1) is hit and bool(installed.report.hits) is hit, installed.report
        assert installed.report.stale == ({} if hit else {key: BMM_RUNTIME_OPERAND})
        torch.testing.assert_close(out, model(x))


def test_a_miss_no_table_can_serve_says_why_and_check_gives_no_collect_hint():
    """A helper's: check's advice for every miss was to collect the model's GEMMs and tune them, also
    for a GEMM collect does not list (attention's bmm on CPU, a transposed operand), so coverage
    never rose. The report now says why such a miss is not tunable, and check prints the collect hint
    only for the others."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    with use_table({}) as installed:
        _compile(_ActivationBmm(), x)
    ((key, why),) = installed.report.untunable.items()
    assert installed.report.misses == {key: 1} and why.startswith("bmm whose second operand is computed at run time")
    untunable = installed.report
    with use_table({}) as installed:
        _compile(_WeightBmm(torch.randn(2, 64, 32)), x)
    assert len(installed.report.misses) == 1 and installed.report.untunable == {}
    from omegaconf import OmegaConf
    from rich.console import Console

    from zhantune.check import print_misses

    cfg = OmegaConf.create({"model": "models:scores", "model_kwargs": None, "input_shapes": [[2, 32, 64]]})
    for report, hint in ((untunable, False), (installed.report, True)):
        console = Console(record=True, width=300)
        print_misses(console, cfg, report)
        out = " ".join(console.export_text().split())
        assert ("not tunable: bmm whose second operand is computed at run time" in out) is not hint, out
        assert ("python -m zhantune.collect model=models:scores" in out) is hint, out


def test_a_miss_the_table_holds_for_another_thread_count_says_so():
    """A helper's (session 52): a table tuned at 2 threads and used at 1 (taskset, OMP_NUM_THREADS) missed
    every GEMM, and check's hint said the key was the GEMM's op, dtypes, sizes and strides, the one thing
    that did not differ. The miss now names the device keys the table holds the GEMM under."""
    from omegaconf import OmegaConf
    from rich.console import Console

    from zhantune.check import print_misses

    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    model = _WeightBmm(torch.randn(2, 64, 32))
    with use_table({}) as installed:
        _compile(model, x)
    ((key, _),) = installed.report.misses.items()
    device = resolve_device("cpu").key
    assert key.startswith(device + "+((")
    other = device.rsplit("(", 1)[0] + "(7 threads)"
    table = {other + key[len(device):]: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}
    with use_table(table) as installed:
        _compile(model, x)
    assert installed.report.misses == {key: 1}
    cfg = OmegaConf.create({"model": "models:scores", "model_kwargs": None, "input_shapes": [[2, 32, 64]]})
    for held, said in ((table, True), ({}, False)):
        console = Console(record=True, width=400)
        print_misses(console, cfg, installed.report, held)
        out = " ".join(console.export_text().split())
        assert (f"the table has this GEMM for another device: {other} (a CPU's device key names the threads" in out) \
            is said, out


class _WeightThenAttention(_WeightBmm):
    def forward(self, x):  # a frozen-weight bmm (tunable), then attention's scores of its output (not)
        return _ActivationBmm()(torch.bmm(x, self.w))


class _WeightThenRuntime(_WeightBmm):
    def forward(self, x):  # a frozen-weight bmm (tunable) used once, by a bmm with a run-time operand (not)
        return torch.bmm(torch.bmm(x, self.w), torch.relu(x[:, :, :32]).transpose(1, 2).contiguous())


class _RuntimeMm(torch.nn.Module):
    def forward(self, x):  # an mm whose second operand is computed at run time (no weight)
        return x @ torch.relu(x).t().contiguous()


class _TransposedLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 96)

    def forward(self, x):  # a prepacked linear of a transposed activation (no table can serve it)
        return self.lin(x.t())


def test_a_stale_entry_of_a_prepacked_linear_no_table_can_serve_counts_as_its_miss():
    """Session 51: the prepacked-linear hook wrote its stale entries past the report's classification,
    so an entry for a GEMM no table can serve (a transposed activation) counted against check's gate
    (1 lookup a table can serve, coverage 0%); a miss of it did not. Both count alike now."""
    torch.manual_seed(0)
    model, x = _TransposedLinear().eval(), torch.randn(64, 32)
    with recording() as rec:
        _compile(model, x)
    (key,) = [e.device_key for e in rec.events if e.offered and e.packed]
    for entry in ({"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP},  # the C++ template is not offered
                  {"template_id": "triton::mm", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8,
                   "num_stages": 2, "num_warps": 4}):  # a GPU entry on CPU
        with use_table({key: [entry]}) as installed:
            out = _compile(model, x)
        report = installed.report
        assert list(report.stale) == [key] and report.untunable[key].startswith("activation [M, K] with strides")
        assert report.tunable_lookups == 0 and report.tunable_coverage is None, report.as_dict()
        torch.testing.assert_close(out, model(x))


class _WeightAndRuntimeBmm(_WeightBmm):
    def forward(self, x, y):  # one lookup key, two GEMMs: a frozen weight's and a run-time operand's
        return torch.bmm(x, self.w), torch.bmm(x, torch.relu(y).contiguous())


def test_the_gate_leaves_out_lookups_not_keys_a_table_cannot_serve():
    """A review (session 51): two bmms of one key, one of a frozen weight (tunable) and one of a
    run-time operand (no table can serve it), counted 2 lookups a table can serve with no table and 1
    with the best one: the key was classified by its first GEMM. Each lookup is counted by its own
    GEMM now: 1 of 2 either way, 0% then 100%."""
    from zhantune.inductor.cpu_entries import BMM_RUNTIME_OPERAND

    torch.manual_seed(0)
    model, x, y = _WeightAndRuntimeBmm(torch.randn(2, 64, 64)).eval(), torch.randn(2, 32, 64), torch.randn(2, 64, 64)
    with recording() as rec:
        _compile(model, x, y)
    (key,) = {e.device_key for e in rec.events if e.offered}
    for table, coverage in (({}, 0.0), ({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}, 1.0)):
        with use_table(table) as installed:
            out = _compile(model, x, y)
        report = installed.report
        assert report.lookups == 2 and report.tunable_lookups == 1, report.as_dict()
        assert report.tunable_coverage == coverage and report.stale == ({key: BMM_RUNTIME_OPERAND} if table else {})
        for got, want in zip(out, model(x, y), strict=True):
            torch.testing.assert_close(got, want)


def test_an_empty_entry_list_on_cpu_is_stale_not_a_hit():
    """A review (session 51): ``[]`` ("nothing from this lookup", what a CUDA addmm's ATen key holds) under
    a key a CPU GEMM looks up counted as a hit, 100% coverage, while Inductor's default compiled. It is
    stale now, for a prepacked linear and an unpacked bmm alike."""
    from zhantune.inductor.cpu_entries import EMPTY_ON_CPU

    torch.manual_seed(0)
    for model, x in ((torch.nn.Linear(64, 48).eval(), torch.randn(16, 64)),
                     (_WeightBmm(torch.randn(2, 64, 32)).eval(), torch.randn(2, 32, 64))):
        with recording() as rec:
            _compile(model, x)
        (key,) = [e.device_key for e in rec.events if e.offered]
        with use_table({key: []}) as installed:
            out = _compile(model, x)
        report = installed.report
        assert report.stale == {key: EMPTY_ON_CPU} and not report.hits and report.coverage == 0.0, report.as_dict()
        torch.testing.assert_close(out, model(x))


class _WeightUnsqueezedTwice(_WeightBmm):
    def forward(self, x):  # a view of the output (not a view/reshape chain) used twice: a helper's
        t = torch.bmm(x, self.w).unsqueeze(0)
        return torch.relu(t), t.sum(0)


@pytest.mark.parametrize("cls", [_WeightThenAttention, _WeightUnsqueezedTwice])
def test_a_bmm_entry_where_the_bmm_output_is_used_twice_compiles_the_default(cls):
    """Found while writing the next test: Inductor's C++ BMM template fails to compile ("AssertionError"
    in ir.py's indexer, torch 2.13) with an epilogue fused and another use of its output, as in
    attention's q @ k^T beside relu(q): a table's entry for the bmm made a model that compiles by
    default fail. Such a hit is stale now, said why, and the default compiles; so through any view of
    the output (a helper's attack: unsqueeze, expand, as_strided, y[None] were still hits)."""
    from zhantune.inductor.cpu_entries import BMM_SHARED_OUTPUT

    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    model = cls(torch.randn(2, 64, 32))
    with recording() as rec:
        _compile(model, x)
    event = [e for e in rec.events if e.offered][0]
    key = event.device_key
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        out, seen = _counted(_compile, model, x)
    assert installed.report.stale == {key: BMM_SHARED_OUTPUT} and seen["cpp_template"] == 0, installed.report
    torch.testing.assert_close(out, model(x))
    # nor does collect list it (no tuned entry can apply), as check's report says of a miss
    from zhantune.inductor.gemms import dtype_names, problem_from_event

    problem, why = problem_from_event(event, dtype_names())
    assert problem is None and why.startswith("bmm whose output is used more than once here"), why


def test_check_says_in_one_line_that_a_tables_compile_fails_where_the_default_compiles(tmp_path, monkeypatch):
    """A table whose compile fails (here the bmm above with its guard taken away: Inductor's own
    error) was check's 40-line traceback; it is now the entries served and one line naming the
    error, exit 1. A model whose default compile fails is a user error (exit 2), not the table's."""
    from omegaconf import OmegaConf
    from rich.console import Console

    import zhantune.inductor.epilogue as epilogue
    from zhantune.bench.model_check import CompileFailed, _compile
    from zhantune.check import _compile_failed
    from zhantune.device import resolve_device
    from zhantune.inductor.settings import model_patch
    from zhantune.inductor.table import read_table

    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    model = _WeightThenAttention(torch.randn(2, 64, 32))
    key = (f"{resolve_device('cpu').key}+((torch.float32, [2, 32, 64], [2048, 64, 1]), "
           "(torch.float32, [2, 64, 32], [2048, 32, 1]))+bmm")  # x @ w's lookup (the test above records it)
    (tmp_path / "t.json").write_text(json.dumps({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}))
    monkeypatch.setattr(epilogue, "shared_output", lambda gemm: False)
    with pytest.raises(CompileFailed) as failed:  # the table's way, as check_model compiles it
        _compile(model, (x,), resolve_device("cpu"), model_patch("cpu"), read_table(tmp_path / "t.json", "cpu"),
                 way="table")
    e = failed.value
    assert e.way == "table" and e.what.startswith("InductorError: AssertionError") and dict(e.report.hits) == {key: 1}
    cfg = OmegaConf.create({"model": "models:attention", "json": None})
    console = Console(record=True, width=300)
    with pytest.raises(SystemExit) as code:
        _compile_failed(console, cfg, e, resolve_device("cpu"))
    out = " ".join(console.export_text().split())
    assert code.value.code == 1 and f"hit x1 {key}" in out and "Traceback" not in out, out
    assert "the compile with the table fails where Inductor's default compiles: InductorError: AssertionError" in out
    device = resolve_device("cpu")
    with pytest.raises(SystemExit) as code:
        _compile_failed(console, cfg, CompileFailed("default", "RuntimeError: boom (raised at x.py:1)"), device)
    assert code.value.code == 2
    # nothing served: not the table's doing, said so; json= still written (a review's: none was)
    from zhantune.inductor.table_report import TableReport

    cfg = OmegaConf.create({"model": "models:attention", "table": "t.json", "json": str(tmp_path / "r.json")})
    console = Console(record=True, width=300)
    with pytest.raises(SystemExit) as code:
        _compile_failed(console, cfg, CompileFailed("table", "RuntimeError: boom (raised at x.py:1)", TableReport(None)),
                        device)
    out = " ".join(console.export_text().split())
    assert code.value.code == 1 and "no entry of the table was served" in out and "breaks" not in out, out
    assert json.loads((tmp_path / "r.json").read_text())["failed"] == {"table": "RuntimeError: boom (raised at x.py:1)"}


def test_check_leaves_out_max_autotune_where_its_compile_fails_untimed_or_timed(monkeypatch):
    """A review's: only max-autotune's untimed compile was caught; a failure of its timed compile was
    reported as the table's. Either is now left out with its reason (Inductor's own choices)."""
    from torch._inductor.graph import GraphLowering

    from zhantune.bench.model_check import check_model
    from zhantune.device import resolve_device
    from zhantune.inductor.table import read_table

    real, calls = GraphLowering.codegen, []

    def codegen(self, *args, **kwargs):  # Inductor's own code generation, failing on its Nth call
        calls.append(1)
        if len(calls) == fail_at:
            raise RuntimeError("injected")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "codegen", codegen)
    model, x = torch.nn.Linear(16, 8).eval(), torch.randn(4, 16)
    # untimed compiles: default, table, max-autotune (3rd); then timed: table, default, max-autotune (6th)
    for fail_at in (3, 6):
        calls.clear()
        result = check_model(model, (x,), resolve_device("cpu"), read_table({}, "cpu"),
                             BenchConfig(warmup_ms=1.0, target_ms=2.0, busy_wait_s=0.0), max_autotune=True, rounds=1)
        assert set(result["ways"]) == {"table", "default"}, (fail_at, calls)
        assert result["failed"]["max-autotune"].startswith("InductorError: RuntimeError: injected")


def test_check_gates_coverage_on_the_lookups_a_table_can_serve():
    """A helper's: check's min_coverage (1.0 by default) counted the lookups of GEMMs no table can
    serve, so a model with attention's bmm on CPU failed the gate with every tunable lookup a hit.
    The gate is now on the others' share; the report gives both; a model with none fails it."""
    from omegaconf import OmegaConf
    from rich.console import Console

    from zhantune.check import _verdict

    torch.manual_seed(0)
    x = torch.randn(2, 32, 64)
    both = _WeightThenRuntime(torch.randn(2, 64, 32))
    with recording() as rec:
        _compile(both, x)
    keys = [e.device_key for e in rec.events if e.offered]
    assert len(set(keys)) == 2
    cfg = OmegaConf.create({"min_coverage": 1.0})
    for table, model, code, said in (
            ({keys[0]: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}, both, 0,
             "coverage 50% (100% of the 1 a table can serve) (min_coverage 100%): ok"),
            ({}, both, 1, "coverage 0% (0% of the 1 a table can serve) is below min_coverage 100%"),
            # an entry for the GEMM no table can serve (stale) counts as its miss does (a review's: it failed)
            ({keys[1]: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}, both, 1,
             "coverage 0% (0% of the 1 a table can serve) is below min_coverage 100%"),
            ({}, _ActivationBmm(), 1, "none of the 1 GEMM lookup(s) is one a table can serve")):
        with use_table(table) as installed:
            _compile(model, x)
        report = installed.report
        console = Console(record=True, width=300)
        assert _verdict(console, cfg, {"report": report, "ways": {"table": {"error": 0.0}}}, 1e-4) == code
        assert said in " ".join(console.export_text().split()), report.as_dict()
    assert report.as_dict()["tunable_lookups"] == 0 and report.as_dict()["tunable_coverage"] is None
    # so for an mm whose second operand is computed at run time, with its stale entry's reason (a review's:
    # it advised freezing, on already)
    from zhantune.inductor.cpu_entries import RUNTIME_OPERAND

    with recording() as rec:
        _compile(_RuntimeMm(), x[0])
    (key,) = [e.device_key for e in rec.events if e.offered]
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        _compile(_RuntimeMm(), x[0])
    assert installed.report.stale == {key: RUNTIME_OPERAND} and key in installed.report.untunable, installed.report
    assert installed.report.tunable_coverage is None
    # min_coverage=0 asks for nothing (a review's: it exited 1); a share is never rounded up to the gate
    console = Console(record=True, width=300)
    result = {"report": report, "ways": {"table": {"error": 0.0}}}
    assert _verdict(console, OmegaConf.create({"min_coverage": 0.0}), result, 1e-4) == 0
    assert "coverage 0% (none a table can serve) (min_coverage 0%): ok" in " ".join(console.export_text().split())
    from zhantune.check import _pct

    assert [_pct(s) for s in (199 / 200, 1.0, 0.5, 0.995, 0.9999, 0.0)] == ["99.5%", "100%", "50%", "99.5%", "99.9%", "0%"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpp_entry_compiles_under_inductors_defaults_for_the_knobs_it_leaves_out(dtype):
    """A hostile-table attack (session 40): a hand-written C++-template entry that names only its
    backend took the user's own ``cpp.gemm_*`` values for the rest (TORCHINDUCTOR_CPP_GEMM_THREAD_FACTORS,
    say), so factors for another thread count failed the user's compile with a hit in the report. The
    entry now compiles under Inductor's source defaults for what it leaves out (cpp_knobs)."""
    torch.manual_seed(0)
    model, x = _linear(48, 64, dtype), torch.randn(16, 64, dtype=dtype)
    with recording() as rec:
        _compile(model, x)
    (key,) = [e.device_key for e in rec.events if e.offered]
    factors = f"1,1,{torch.get_num_threads() + 1}"  # the user's, for no thread count this process has
    with inductor_config.patch({"cpp.gemm_thread_factors": factors}), \
            use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": {"max_autotune_gemm_backends": "CPP"}}]}) \
            as installed:
        out, seen = _counted(_compile, model, x)
        assert inductor_config.cpp.gemm_thread_factors == factors  # the user's value, restored after the GEMM
    assert seen["cpp_template"] == 1 and installed.report.hits == {key: 1} and not installed.report.stale
    torch.testing.assert_close(out, model(x), **({"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}))


def test_an_unpacked_float32_gemm_is_stale_under_reduced_math_where_the_cpu_has_it(monkeypatch):
    """A second review (session 39): ATen's CPU mm/bmm take oneDNN's tf32 path only on a CPU with
    AMX-FP16 (bf16: oneDNN's bf16 support); the check asked torch under a name it does not have and
    never fired. A packed linear's default changes whatever the CPU."""
    from zhantune.inductor.cpu_entries import reduced_float32

    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "tf32"
    try:
        for amx in (True, False):
            monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda amx=amx: amx)
            assert reduced_float32(["float32", "float32"], packed=False) == ("tf32" if amx else None)
            assert reduced_float32(["float32", "float32"], packed=True) == "tf32"
            assert reduced_float32(["bfloat16", "bfloat16"], packed=True) is None
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before


class _Bmm(torch.nn.Module):
    def forward(self, ab):
        return torch.bmm(*ab)


@pytest.mark.parametrize("precision", ["high", "highest"])
def test_a_float32_linear_under_onednns_reduced_math_compiles_the_default_and_says_why(precision):
    """Session 39: torch.set_float32_matmul_precision("high") (common in scripts written for GPUs) turns
    oneDNN's reduced float32 math on, and Inductor's freezing pass then packs a float32 linear for
    mkldnn._linear_pointwise instead of mkl._mkl_linear: another default than the one zhantune paired
    the table's entry with. The entry compiled anyway, with a hit in the report. Now it is stale
    with the reason, and Inductor's default (that packed op) compiles; an unpacked GEMM (a bmm) only
    where the CPU has that math (ATen's bmm then takes oneDNN's path; elsewhere nothing changes)."""
    from zhantune.inductor.cpu_entries import REDUCED_FLOAT32

    torch.manual_seed(0)
    model, x = _linear(48, 64, torch.float32), torch.randn(16, 64)
    a, b = torch.randn(2, 16, 24), torch.randn(2, 24, 8)
    with recording() as rec:
        _compile(model, x)
        _compile(_Bmm(), (a, b))  # unpacked: ATen's bmm takes oneDNN's bf32 path on a CPU with bf16
    key, bmm_key = [e.device_key for e in rec.events if e.offered]
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}],
                        bmm_key: [{"template_id": "aten::bmm"}]}) as installed:
            _, seen = _counted(_compile, model, x)
            packed_ops = re.findall(r"torch\.ops\.(mkl\._mkl_linear|mkldnn\._linear_pointwise)",
                                    "\n".join(run_and_get_code(_compile, model, x)[1]))
            torch.testing.assert_close(_compile(_Bmm(), (a, b)), torch.bmm(a, b))
    finally:
        torch.set_float32_matmul_precision(before)
    if precision == "highest":
        assert seen["cpp_template"] == 1 and installed.report.hits == {key: 2, bmm_key: 1}
        assert not installed.report.stale
    else:  # the bmm's default changes only where the CPU has AMX-FP16 (tf32): not an AMD EPYC's
        assert seen["cpp_template"] == 0 and set(packed_ops) == {"mkldnn._linear_pointwise"}
        changed = torch.cpu._is_amx_fp16_supported()
        stale = (key, bmm_key) if changed else (key,)
        assert installed.report.stale == {k: REDUCED_FLOAT32.format(precision="tf32") for k in stale}
        assert installed.report.hits == ({} if changed else {bmm_key: 1})


@pytest.mark.parametrize("autotune, backends", [(True, "ATEN,CPP"), (True, "CPP"), (False, "CPP")])
def test_under_the_users_max_autotune_a_gemm_the_table_does_not_tune_compiles_as_without_it(autotune, backends):
    """CPU audit (session 38): under a user's max-autotune, a GEMM Inductor does not prepack (a bmm, a
    bf16 linear without AVX-512) that the table misses, or ships Inductor's default for, was pinned
    to the ATen kernel: Inductor without the table autotunes ATen against its C++ template (a bf16
    addmm ran 2.5-3.7x slower with the table installed). Now it is lowered under the user's own
    settings: the same choices reach Inductor's autotuning, table or not, also where the table's C++
    entry for another GEMM has zhantune lower this one under max-autotune with ATen and CPP (a
    review: with the user's backends CPP alone, ATen was still served; without max-autotune Inductor
    offers ATen whatever the backends, and a second review found the table then served nothing)."""
    from unittest import mock

    from torch._inductor.kernel import bmm

    a, b = torch.randn(2, 16, 24), torch.randn(2, 24, 8)
    real = bmm.autotune_select_algorithm

    def choices_of_a_bmm_compile() -> list[str]:
        seen: list[str] = []

        def select(name, choices, *args, **kwargs):
            seen.extend(sorted("cpp" if c.name.startswith("cpp") else c.name for c in choices))
            return real(name, choices, *args, **kwargs)

        torch._dynamo.reset()
        with torch.no_grad(), lookups_seen(max_autotune=autotune, max_autotune_gemm_backends=backends), \
                mock.patch.object(bmm, "autotune_select_algorithm", select):
            out = torch.compile(lambda x, y: torch.bmm(x, y))(a, b)
        torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-4, atol=1e-4)
        return seen

    own = ["bmm"] if not autotune else ["bmm", "cpp"] if backends == "ATEN,CPP" else ["cpp"]
    with recording() as rec:
        assert choices_of_a_bmm_compile() == own  # without a table: the user's backends
    (key,) = [e.device_key for e in rec.events]
    other = key.replace("[2, 16, 24]", "[2, 16, 40]").replace("[384, 24, 1]", "[640, 40, 1]")
    cpp_elsewhere = {other: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}
    for table, report in (({}, "misses"), ({key: [{"template_id": "aten::bmm"}]}, "hits"), (cpp_elsewhere, "misses")):
        with use_table(table) as installed:
            assert choices_of_a_bmm_compile() == own, table
        # with CPP alone the lookup offers nothing (no ATen template): none is counted, unless the C++
        # entry elsewhere has zhantune lower the GEMM with ATen and CPP (then a miss, served as the user's)
        counted = backends == "ATEN,CPP" or not autotune or table is cpp_elsewhere
        assert getattr(installed.report, report) == ({key: 1} if counted else {}), (table, installed.report)


@pytest.mark.parametrize("backends", ["ATEN,CPP", "ATEN"])
def test_a_config_entry_for_a_gemm_lowered_outside_zhantunes_hook_is_stale_and_compiles_as_without_it(backends):
    """A runtime attack (session 41): a baddbmm (and the GEMMs of Inductor's mm_plus_mm pattern) is
    lowered outside the CPU GEMM lowerings zhantune sets a table's knobs in. Under the user's
    max-autotune, a C++-template entry under its key crashed the compile with the user's ATen
    backends (NoValidChoicesError: the lookup served nothing and the knobs were never set) and with
    the defaults was counted a hit while its knobs never applied. Now it is stale, says why, and
    Inductor compiles what it compiles without the table (the same C++-template count, the right output)."""
    from zhantune.inductor.cpu_entries import UNHOOKED_LOWERING

    class Baddbmm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias, self.w = torch.nn.Parameter(torch.randn(2, 16, 8)), torch.nn.Parameter(torch.randn(2, 24, 8))

        def forward(self, x):
            return torch.baddbmm(self.bias, x, self.w)

    model, a = Baddbmm().eval(), torch.randn(2, 16, 24)

    def compile_it():
        torch._dynamo.reset()
        with torch.no_grad(), lookups_seen(freezing=True, max_autotune_gemm_backends=backends):
            return _counted(torch.compile(model, mode="max-autotune"), a)

    with recording() as rec:
        _, without = compile_it()
    (key,) = [e.device_key for e in rec.events if e.op_name == "baddbmm"]
    patch = {**CPP, "cpp.gemm_cache_blocking": "1,1,8"}
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": patch}]}) as installed:
        out, seen = compile_it()
    with torch.no_grad():
        torch.testing.assert_close(out, model(a), rtol=1e-4, atol=1e-4)
    assert installed.report.hits == {} and installed.report.stale == {key: UNHOOKED_LOWERING.format(op="baddbmm")}
    assert seen["cpp_template"] == without["cpp_template"], (seen, without)


def test_a_cpp_entry_under_a_dynamic_m_is_stale_not_a_hit():
    """With M dynamic (mark_dynamic on the batch) the key holds M's hint, so a C++-template entry
    tuned for that M was found and counted a hit, but Inductor's template then picks its blocking,
    thread split and K slices at run time: a kernel nobody measured (a review). Such a lookup is
    stale: Inductor's default compiles, and the report says why; a static compile still hits."""
    from zhantune.inductor.cpu_entries import DYNAMIC_M

    torch.manual_seed(0)
    lin, x = _linear(64, 48, torch.float32), torch.randn(32, 48)
    with recording() as rec:
        _compile(lin, x)
    (key,) = [e.device_key for e in rec.events if e.offered]
    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": {**CPP, "cpp.gemm_cache_blocking": "1,1,8",
                                                                                "cpp.gemm_max_k_slices": 4}}]}) as t:
        _, seen = _counted(_compile, lin, x)
        assert seen["cpp_template"] == 1 and t.report.hits[key] == 1
        torch._dynamo.mark_dynamic(x, 0)
        out, seen = _counted(_compile, lin, x)
        assert seen == _default_counts("float32", seen) and t.report.stale == {key: DYNAMIC_M}
        torch.testing.assert_close(out, lin(x))


def test_a_table_whose_cpu_had_another_vector_isa_is_stale_and_the_export_says_which(tmp_path):
    """An attack's finding: a CPU's key is its model name and thread count, and this VM's name ("AMD
    EPYC") covers AVX2 and AVX-512 machines; an AVX-512 machine's C++-template claim hit here. The
    export records each CPU's ISA in the wrapper's devices, and use_table reports a key whose CPU had
    another ISA stale (the default compiles); under this CPU's own ISA the entry hits."""
    from zhantune.device import cpuid
    from zhantune.inductor.cpu_entries import OTHER_CPU, OTHER_ISA
    from zhantune.inductor.exporter import table_metadata
    from zhantune.inductor.table import FORMAT
    from zhantune.storage import Store

    torch.manual_seed(0)
    model, x = _linear(48, 64), torch.randn(16, 64, dtype=torch.bfloat16)
    with recording() as rec:
        _compile(model, x)
    (event,) = [e for e in rec.events if e.offered]
    mine = torch.backends.cpu.get_cpu_capability()
    device = event.device_key.partition("+((")[0]
    here = cpuid()
    # the ISA; then (session 53) the cpuid under one ISA: Zen 4 and Zen 5 are both "AMD EPYC", AVX-512
    for ident, why in (({"isa": mine, "cpuid": here}, None),
                       ({"isa": f"NOT_{mine}"}, OTHER_ISA.format(theirs=f"NOT_{mine}", mine=mine)),
                       # a device without its kind is compared too (a review's: only "cpu" ones were, for a while)
                       ({"kind": None, "isa": f"NOT_{mine}"}, OTHER_ISA.format(theirs=f"NOT_{mine}", mine=mine)),
                       ({"isa": mine, "cpuid": "GenuineIntel family 6 model 1"},
                        OTHER_CPU.format(theirs="GenuineIntel family 6 model 1", mine=here) if here else None)):
        table = {"format": FORMAT, "format_version": 1, "torch": str(torch.__version__),
                 "devices": [{"key": device, "name": device, "kind": "cpu", **ident}],
                 "table": {event.device_key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}}
        with use_table(table) as installed:
            _, seen = _counted(_compile, model, x)
        hit = why is None
        assert (seen["cpp_template"] > 0) is hit and bool(installed.report.hits) is hit, installed.report
        if not hit:
            assert installed.report.stale == {event.device_key: why}
    store = Store(f"sqlite:///{tmp_path / 'z.db'}")  # the export's wrapper names the tuned CPU's ISA (its stored properties)
    dev = store.device_id(device, device, "cpu", {"isa": mine, "cpuid": "AuthenticAMD family 26 model 2"})
    prob = store.problem_id("p", op="mm", shape={"M": 4, "N": 4, "K": 4, "B": 1}, dtype="float32", activation=None,
                            lookup_op="mm", flops=128)
    store.add_measurement(study_id=store.study_id("s", {}), device_id=dev, problem_id=prob, kind="candidate",
                          status="ok", template_id=None, params={}, median_us=1.0, torch_version="2.13.0")
    assert table_metadata(store, {}, {}, "s")["devices"] == [{"key": device, "name": device, "kind": "cpu", "isa": mine,
                                                               "cpuid": "AuthenticAMD family 26 model 2"}]


def test_a_cpu_key_names_the_thread_count_and_a_model_only_key_is_stale():
    """A CPU's device key is its model and its thread count (zhantune.device.cpu_device_key):
    Inductor's C++ kernels are compiled for that count, and timings with another count are another
    device's. A table made before (the model alone as the key's device part) is reported stale, with
    what to do, and the default compiles; with another thread count the current key misses."""
    from zhantune.device import cpu_device_key, cpu_model
    from zhantune.inductor.table_choices import LEGACY_CPU_KEY

    torch.manual_seed(0)
    model, x = _linear(48, 64), torch.randn(16, 64, dtype=torch.bfloat16)
    with recording() as rec:
        _compile(model, x)
    (event,) = [e for e in rec.events if e.offered]
    assert event.device_key == f"{cpu_device_key(cpu_model(), torch.get_num_threads())}+{event.agnostic_key}"
    legacy = f"{cpu_model()}+{event.agnostic_key}"
    with use_table({legacy: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        _, seen = _counted(_compile, model, x)
    assert seen["cpp_template"] == 0 and not installed.report.hits
    assert installed.report.stale[legacy].startswith(LEGACY_CPU_KEY.split("{")[0])
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        with use_table({event.device_key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
            _, seen = _counted(_compile, model, x)
    finally:
        torch.set_num_threads(threads)
    assert seen["cpp_template"] == 0 and not installed.report.hits and len(installed.report.misses) == 1


def test_export_ships_the_real_default_where_nothing_beats_it(tune_cfg, tmp_path):
    """A CPU tune's table gets Inductor's default entry where no candidate beats the default; at use
    time that entry compiles the prepacked linear, as without a table."""
    from rich.console import Console

    from zhantune.inductor.builder import build_table
    from zhantune.report.summary import print_summary
    from zhantune.storage import Store
    from zhantune.tune import resolve_run, tune

    cfg = tune_cfg(["+op=addmm", "shape=[32,64,48]", "weight_layout=nk", "device=cpu", "search.n_trials=1",
                    "space=[cpp_gemm]", "bench.isolate=false", "bench.target_ms=5", "bench.warmup_ms=1",
                    "bench.remeasure_rounds=0", f"storage.url=sqlite:///{tmp_path}/z.db", "export.enabled=false"])
    store = Store(cfg.storage.url)
    run = resolve_run(cfg)
    result = tune(run, store)
    assert result.eager is not None and result.default is not None and result.best is not None
    assert result.best.branch == "cpp_gemm"
    # the summary lists eager, both real defaults (with freezing: what claims are measured against;
    # without: what a user who does not freeze gets) and the best candidate, each measured and stored
    assert result.default_unfrozen is not None and result.default_unfrozen.status == "ok"
    assert result.default_unfrozen.kind == "default_unfrozen" and result.default.kind == "default"
    console = Console(record=True, width=200)
    print_summary(console, run, result, cfg.storage.url)
    rows = [line.split("│") for line in console.export_text().splitlines() if line.count("│") > 2]
    labels = [row[1].strip() for row in rows]
    assert labels == ["eager", "inductor default", "inductor default, no freezing", "best candidate: cpp_gemm"]
    # every ratio there but a paired claim is two measurements taken apart: "(unpaired)", not "(unconfirmed)",
    # which is for paired rounds that did not confirm (a claims audit, session 40: one tag covered both)
    speeds = [row[6].strip() for row in rows]
    assert speeds[1] == "1.00x" and all(cell.endswith("x (unpaired)") for cell in speeds[::2] + speeds[3:]), speeds
    # a min_speedup no candidate reaches: every key ships Inductor's default
    (key, entries), = build_table(store, min_speedup=1e9).items()
    assert entries == [{"template_id": "aten::addmm"}]
    torch.manual_seed(0)
    model, x = _linear(64, 48, torch.float32), torch.randn(32, 48)
    with use_table({key: entries}) as installed:
        _, seen = _counted(_compile, model, x)
    assert installed.report.hits[key] == 1
    assert seen["packed_by_freezing"] == 1 and seen["cpp_template"] == 0 and seen["packed_op_calls"] >= 1
    # the tuned entry (the C++ template) under the same key compiles the template instead
    (_, tuned), = build_table(store).items()
    with use_table({key: tuned}):
        _, seen = _counted(_compile, model, x)
    assert seen["cpp_template"] == 1 and seen["packed_op_calls"] == 0


ACCEPTANCE = textwrap.dedent("""
    import json, re, sys, time, torch
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    import zhantune
    from zhantune.inductor.choices import recording

    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 1024).to(torch.bfloat16).eval()      # not in the table
    x = torch.randn(64, 1024, dtype=torch.bfloat16)
    tuned = torch.nn.Linear(256, 128).to(torch.bfloat16).eval()          # in the table: the C++ template
    xt = torch.randn(16, 256, dtype=torch.bfloat16)
    torch._inductor.config.freezing = True

    def fastest_call_us(reps=15):
        best = float("inf")
        with torch.no_grad():
            for _ in range(reps):
                t0 = time.perf_counter()
                linear(x)
                best = min(best, time.perf_counter() - t0)
        return best * 1e6

    with torch.no_grad(), recording() as rec:
        torch.compile(tuned)(xt)
    key = [e.device_key for e in rec.events if e.offered][0]
    table = {key: [{"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}]}
    torch._dynamo.reset()
    flag = torch.backends.mkldnn.enabled
    installed = zhantune.use_table(table)                 # the plain call
    with torch.no_grad():
        torch.compile(tuned)(xt)                          # the table acts on its GEMM
    torch._dynamo.reset()
    packs = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    templated = counters["inductor"]["cpp_templated_kernel_counter"]
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(linear), x)   # the uncovered Linear, compiled
    code = "\\n".join(code)
    report = zhantune.table_report().as_dict()
    # interleaved rounds: without a table, then after a plain use_table call (removed again so
    # that the next round is without), same noise on both sides. Each side's timed calls run under
    # SCHED_FIFO where permitted, as zhantune's own timings do: on the shared 2-core CI machine a
    # busy neighbour (the other pytest worker) made one side's minimum 1.4x the other's at normal
    # priority, either way round. Noise only adds time, so more rounds (up to 24) are taken while
    # the sides differ by over 1.2x: a real slowdown (oneDNN off: 25x) stays in every round. Where
    # oneDNN has no bf16 (no AVX-512: this EPYC) oneDNN off changes nothing measurable here; the
    # flag assertions below catch it there.
    from zhantune.bench.timing import realtime
    installed.remove()
    before, after, fifo = [], [], True
    while len(before) < 8 or (min(after) > 1.2 * min(before) and len(before) < 24):
        with realtime(True) as rt:
            before.append(fastest_call_us())
        installed = zhantune.use_table(table)
        with realtime(True) as rt_after:
            after.append(fastest_call_us())
        fifo = fifo and rt and rt_after
        installed.remove()
    zhantune.use_table(table)
    print(json.dumps({"flag_before": flag, "flag_after": torch.backends.mkldnn.enabled,
                      "before_us": min(before), "after_us": min(after), "rounds": len(before), "fifo": fifo,
                      "packed": counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] - packs,
                      "templated": counters["inductor"]["cpp_templated_kernel_counter"] - templated,
                      "packed_calls": len(re.findall(r"torch\\.ops\\.mkldnn\\._linear_pointwise", code)),
                      "report": report}))
""")


@pytest.mark.slow
def test_acceptance_bf16_linear_as_fast_after_a_plain_use_table_call(tmp_path):
    """Issue 18's acceptance, in a fresh process: a bf16 nn.Linear the table does not cover runs as
    fast after ``zhantune.use_table(...)`` (plain call, a C++-template entry for another GEMM) as
    before (within 1.2x, the minimum of interleaved rounds on each side, timed under SCHED_FIFO where
    permitted; oneDNN off made it 25x slower),
    oneDNN stays on, and compiled it is still oneDNN's prepacked linear (where oneDNN has bf16 on this CPU;
    elsewhere Inductor's default, the extern ATen GEMM, as without the table)."""
    # the run's Inductor cache (tests/conftest.py), the FX graph and AOTAutograd caches off: the compile
    # makes its lookups (tests/compiles.py), and the kernels (and the ISA probe's) built before load
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    r = subprocess.run([sys.executable, "-c", ACCEPTANCE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["flag_before"] is True and got["flag_after"] is True
    assert got["after_us"] <= 1.2 * got["before_us"], got
    packed = PACKED["bfloat16"]  # where oneDNN has no bf16 (no AVX-512), Inductor's default is not packed
    assert got["packed"] == int(packed) and got["templated"] == 0 and (got["packed_calls"] >= 1) == packed, got
    assert got["report"]["coverage"] == 0.5 and len(got["report"]["hits"]) == 1, got["report"]


def _ops_run(fn):
    """(result, the ATen / oneDNN / MKL op names the call ran), from torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, {e.key for e in prof.key_averages()}


def _compiles(fn, *args):
    """(result, Dynamo compiles, freezing packs, C++ template kernels) of a call, from Inductor's
    counters (run_and_get_code would reset Dynamo first: the kept compiles with it)."""
    before = (counters["stats"]["unique_graphs"], counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"],
              counters["inductor"]["cpp_templated_kernel_counter"])
    result = fn(*args)
    after = (counters["stats"]["unique_graphs"], counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"],
             counters["inductor"]["cpp_templated_kernel_counter"])
    return (result, *(a - b for a, b in zip(after, before, strict=True)))


def test_a_re_measurement_times_the_kept_compile_of_its_own_config():
    """Paired rounds alternate the default and the winner: a re-measurement times the code compiled
    for its first measurement again (no compile), and that is still its own config's code although
    another config compiled in between (the default runs MKL's packed linear, the C++ template none
    of it). A third config pushes out the oldest kept compile (two are kept), which then compiles
    again; so does one whose compiled code a ``torch._dynamo.reset()`` elsewhere removed (it is
    compiled under its own config again, never silently under none)."""
    problem = GemmProblem.from_config("addmm", [32, 64, 48], "float32", weight_layout="nk")
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BENCH)
    (default, graphs, packs, templated), packed_ops = _ops_run(lambda: _compiles(bench.inductor_default))
    packed_ops = {op for op in packed_ops if re.fullmatch(r"mkl::_mkl_linear|mkldnn::_linear_pointwise", op)}
    assert default.status == "ok" and (graphs, packs, templated) == (1, 1, 0) and packed_ops, packed_ops
    cpp_candidate = Candidate("cpp_gemm", "config", None, CPP)
    cpp, graphs, _, templated = _compiles(bench.measure, cpp_candidate)
    assert cpp.status == "ok" and (graphs, templated) == (1, 1)
    for _ in range(2):
        (again, *compiled), ops = _ops_run(lambda: _compiles(bench.measure_default))
        assert again.status == "ok" and compiled == [0, 0, 0] and packed_ops <= ops, (compiled, ops)
        assert again.lookup.agnostic_key == default.lookup.agnostic_key and again.compile_s == default.compile_s
        (again, *compiled), ops = _ops_run(lambda: _compiles(bench.measure, cpp_candidate))
        assert again.status == "ok" and compiled == [0, 0, 0] and not packed_ops & ops, (compiled, ops)
        assert again.lookup.hit_templates == (CONFIG_TEMPLATE_ID,)
    aten, graphs, packs, _ = _compiles(bench.measure, Candidate("aten", "config", None, ATEN))  # a third config
    assert aten.status == "ok" and (graphs, packs) == (1, 1)
    again, graphs, packs, templated = _compiles(bench.measure_default)  # pushed out: compiled again
    assert again.status == "ok" and (graphs, packs, templated) == (1, 1, 0)
    torch._dynamo.reset()  # the kept default's compiled code is gone: compiled again, under its config
    again, graphs, packs, templated = _compiles(bench.measure_default)
    assert again.status == "ok" and (graphs, packs, templated) == (1, 1, 0)
    bench.close()


def test_the_kept_compile_key_tells_backend_flags_apart():
    """A backend-scope candidate (CUDA's TF32 flags) compiles with the default's patch and no
    candidate entry, under its torch.backends flags: those are part of what a kept compile is
    looked up by, so two flag settings never share (or evict each other's) kept compile."""
    from zhantune.bench.kept import compile_key as key
    from zhantune.inductor.settings import backend_flags

    base = {"force_disable_caches": True}
    plain = key(base, None, None, None, None)
    with backend_flags({"cuda.matmul.allow_tf32": not torch.backends.cuda.matmul.allow_tf32}):
        flipped = key(base, None, None, None, None)
    assert plain != flipped and key(base, None, None, None, None) == plain
