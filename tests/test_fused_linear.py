"""A packed linear fused with its activation or residual add by Inductor's oneDNN patterns
(torch/_inductor/fx_passes/mkldnn_fusion.py: a bfloat16 linear on a CPU with oneDNN's bf16, a
float32 one with a dynamic batch size). The pattern lowers the fused op through Inductor's
``lowerings`` dict, never ``user_lowerings``: until session 53 such a GEMM made no lookup, so
``collect`` did not list it, a tune's trials were not_applied, and use_table's report left it out of
its coverage (a helper saw 100% for a table whose entry for it did not apply). Each test counts what
Inductor compiled (its counters) through real compiles."""

from __future__ import annotations

import pytest
import torch
from compiles import lookups_seen
from torch._dynamo.utils import counters
from torch._inductor import lowering
from torch._inductor.utils import is_mkldnn_bf16_supported

from zhantune.bench.inductor import InductorBenchmarker
from zhantune.candidate import Candidate
from zhantune.config import BenchConfig
from zhantune.device import resolve_device
from zhantune.inductor import cpu_gemm
from zhantune.inductor.choices import recording
from zhantune.inductor.cpu_entries import DYNAMIC_M
from zhantune.inductor.runtime import use_table
from zhantune.inductor.table import CONFIG_TEMPLATE_ID
from zhantune.problems import GemmProblem

pytestmark = pytest.mark.slow

CPP = {"max_autotune_gemm_backends": "CPP", "cpp.gemm_thread_factors": None, "cpp.gemm_max_k_slices": 1,
       "cpp.gemm_cache_blocking": None}
BF16 = pytest.mark.skipif(not is_mkldnn_bf16_supported("cpu"),
                          reason="this CPU has no oneDNN bf16: a bfloat16 linear is not packed, nothing fuses")


class _Block(torch.nn.Module):
    """A Linear, then an activation (``act``) or a residual add (``act="add"``)."""

    def __init__(self, act: str | None, dtype: torch.dtype):
        super().__init__()
        self.linear = torch.nn.Linear(64, 48).to(dtype)
        self.act = act

    def forward(self, x, r):
        y = self.linear(x)
        if self.act == "add":
            return y + r
        return {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, None: lambda t: t}[self.act](y)


def _run(model, x, r, dynamic: bool):
    """Compile ``model`` as a user's inference compile does (freezing, no_grad); with ``dynamic`` a
    second batch size too. Returns (the first call's output, C++ templates compiled)."""
    torch._dynamo.reset()
    before = counters["inductor"]["cpp_templated_kernel_counter"]
    with torch.no_grad(), lookups_seen(freezing=True):
        compiled = torch.compile(model, dynamic=dynamic)
        out = compiled(x, r)
        if dynamic:
            compiled(x[:7], r[:7])
    return out, counters["inductor"]["cpp_templated_kernel_counter"] - before


CASES = [  # dtype, what follows the linear, dynamic M, the packed op the fused GEMM is lowered as, its epilogue
    pytest.param(torch.bfloat16, "gelu", False, "mkldnn._linear_pointwise.default", "gelu", marks=BF16, id="bf16-gelu"),
    pytest.param(torch.bfloat16, "silu", False, "mkldnn._linear_pointwise.default", "silu", marks=BF16, id="bf16-silu"),
    pytest.param(torch.bfloat16, "add", False, "mkldnn._linear_pointwise.binary", "a residual add", marks=BF16, id="bf16-residual"),
    pytest.param(torch.float32, "gelu", True, "mkldnn._linear_pointwise.default", "gelu", id="fp32-gelu-dynamic"),
]


@pytest.mark.parametrize("dtype, act, dynamic, packed, epilogue", CASES)
def test_a_fused_linear_makes_one_lookup_and_a_table_serves_or_reports_it(dtype, act, dynamic, packed, epilogue):
    torch.manual_seed(0)
    model, x, r = _Block(act, dtype).eval(), torch.randn(16, 64, dtype=dtype), torch.randn(16, 48, dtype=dtype)
    builtin = {op: lowering.lowerings[op] for op in cpu_gemm.FUSED_OPS}
    with recording() as rec:
        _run(model, x, r, dynamic)
    # one lookup per compile of the GEMM (the pattern's call; the hook is not asked twice), with
    # what the fused op computes after it
    assert {(e.op_name, e.packed, e.epilogue.describe()) for e in rec.events} == {("addmm", packed, epilogue)}
    assert len(rec.events) == 1  # (dynamic=True: one compile serves both batch sizes)
    assert {op: lowering.lowerings[op] for op in cpu_gemm.FUSED_OPS} == builtin  # put back when uninstalled
    key = rec.events[0].device_key

    with use_table({key: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        out, templated = _run(model, x, r, dynamic)
    torch.testing.assert_close(out, model(x, r), **({"atol": 0.05, "rtol": 0.02} if dtype == torch.bfloat16 else {}))
    report = installed.report
    if dynamic:  # the template would pick its blocking at run time: stale, counted, the default compiled
        assert templated == 0 and not report.hits and set(report.stale.values()) == {DYNAMIC_M}
    else:  # the entry's template compiled, with the activation or the add in its epilogue
        assert templated == 1 and report.hits == {key: 1} and not report.stale and not report.misses
    # what the entry was not measured with is noted (linear_act's gelu is measured; silu and the add are not)
    assert (key in report.notes) is (epilogue in ("silu", "a residual add")) and epilogue in report.notes.get(key, epilogue)


def test_a_fused_linear_with_no_entry_is_a_miss_and_compiles_the_default():
    """The fused float32 linear of a dynamic batch under a table without its key: a miss (it was left
    out of the report before), and Inductor's default (oneDNN's fused op) compiled."""
    torch.manual_seed(0)
    model, x, r = _Block("gelu", torch.float32).eval(), torch.randn(16, 64), torch.randn(16, 48)
    other = "((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"  # another GEMM's key
    with use_table({other: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": CPP}]}) as installed:
        _, templated = _run(model, x, r, True)
    assert templated == 0 and sum(installed.report.misses.values()) == 1 and not installed.report.hits


@BF16
def test_a_bfloat16_linear_act_candidate_compiles_the_template_with_its_activation():
    """A tune of linear_act in bfloat16 on a CPU with oneDNN's bf16: its trials were not_applied (the
    fused GEMM made no lookup); the default now records the problem's key and a C++-template
    candidate compiles the template, the GELU fused in, under that key."""
    problem = GemmProblem.from_config("linear_act", [32, 64, 48], "bfloat16", weight_layout="nk", activation="gelu")
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BenchConfig(warmup_ms=1, target_ms=2, min_reps=3,
                                                                            flush_cache=False))
    default = bench.inductor_default()
    assert default.status == "ok", default.error_text
    assert default.lookup.packed == "mkldnn._linear_pointwise.default" and default.lookup.epilogue.activation == "gelu"
    before = counters["inductor"]["cpp_templated_kernel_counter"]
    cpp = bench.measure(Candidate("cpp_gemm", "config", None, CPP))
    assert cpp.status == "ok", cpp.error_text
    assert counters["inductor"]["cpp_templated_kernel_counter"] - before == 1
    assert cpp.lookup.agnostic_key == default.lookup.agnostic_key
