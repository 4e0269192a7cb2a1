"""The fusion-limit parameters (conf/space/fusion.yaml) change the code Inductor generates when set
for the compile, and a CPU lookup table cannot carry them (it sets an entry's knobs only while its
GEMM is lowered; Inductor reads the fusion limits when it schedules the graph)."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from compiles import lookups_seen
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from zhantune.device import resolve_device
from zhantune.inductor.choices import recording
from zhantune.inductor.runtime import use_table
from zhantune.inductor.settings import CPU_BASE_PATCH
from zhantune.problems import GemmProblem

pytestmark = pytest.mark.slow


def _kernels(patch: dict, table: dict | None = None) -> list[str]:
    """Names of the C++ kernels Inductor generates for linear_act (x @ W + b, gelu) with ``patch``
    (or with the lookup table ``table`` installed, and only the CPU settings a tune compiles with)."""
    device = resolve_device("cpu")
    module, inputs = GemmProblem.from_config("linear_act", [64, 64, 64], "float32", "gelu").build(device.torch_device)
    torch._dynamo.reset()
    compile_patch = dict(CPU_BASE_PATCH)
    if table is None:
        compile_patch.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP", **patch})
    with torch.no_grad(), lookups_seen(**compile_patch), \
            (use_table(table, "cpu") if table is not None else contextlib.nullcontext()) as installed:
        out, code = run_and_get_code(torch.compile(module), *inputs)
    if table is not None:
        _kernels.report = installed.report
    torch.testing.assert_close(out, module(*inputs), rtol=1e-4, atol=1e-4)
    return sorted(set(re.findall(r"cpp_fused_\w+", "\n".join(code))))


def test_fusion_limits_change_the_generated_code():
    fused = _kernels({})
    assert len(fused) == 1 and "gelu" in fused[0] and "addmm" in fused[0]  # epilogue inside the GEMM
    for patch in ({"epilogue_fusion": False}, {"max_fusion_size": 1}, {"max_fusion_unique_io_buffers": 1}):
        split = _kernels(patch)
        assert len(split) == 2, (patch, split)  # the GEMM and the gelu epilogue as separate kernels
        # the GEMM alone, and the gelu epilogue (its kernel's name carries the GEMM node it reads)
        assert any("gelu" not in k for k in split) and any("gelu" in k for k in split), (patch, split)


def test_a_cpu_table_entry_with_a_fusion_limit_is_stale_not_a_hit():
    """Measured (2026-11-28, this CPU): a table entry {CPP, epilogue_fusion: false} compiled the
    fused GEMM + gelu kernel exactly as {CPP} alone did, so the limit never applied though the
    lookup counted as a hit; such an entry is now reported stale (the default compiles), and one
    without a fusion limit still hits and compiles the C++ template with its fused epilogue."""
    device = resolve_device("cpu")
    module, inputs = GemmProblem.from_config("linear_act", [64, 64, 64], "float32", "gelu").build(device.torch_device)
    torch._dynamo.reset()
    with torch.no_grad(), lookups_seen(**CPU_BASE_PATCH), \
            recording() as rec:
        torch.compile(module)(*inputs)
    (key,) = {e.device_key for e in rec.events if e.offered}
    cpp = {"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}
    templated = counters["inductor"]["cpp_templated_kernel_counter"]
    assert _kernels({}, {key: [cpp]}) == ["cpp_fused_addmm_gelu_0"]
    assert counters["inductor"]["cpp_templated_kernel_counter"] == templated + 1
    assert set(_kernels.report.hits) == {key} and not _kernels.report.stale
    limited = {**cpp, "config_patch": {**cpp["config_patch"], "epilogue_fusion": False}}
    templated = counters["inductor"]["cpp_templated_kernel_counter"]
    _kernels({}, {key: [limited]})
    assert not _kernels.report.hits and "epilogue_fusion" in _kernels.report.stale[key]
    assert "schedules the whole graph" in _kernels.report.stale[key]
    # Inductor's default compiled: no C++ template (the entry's backends did not apply either)
    assert counters["inductor"]["cpp_templated_kernel_counter"] == templated


def test_a_cpu_fusion_candidate_is_measured_with_its_limit_applied():
    """A tune's CPU candidate served its fusion limit through the per-GEMM handler, where it never
    applies (Inductor reads it when it schedules the graph): {CPP, epilogue_fusion: false} was not
    measured as itself (a review). The limit now applies to the candidate's whole compile, as on
    CUDA (and, as there, no table carries it: the summary says so): the C++ template's gelu epilogue
    becomes a kernel of its own."""
    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.candidate import Candidate
    from zhantune.config import BenchConfig

    problem = GemmProblem.from_config("linear_act", [64, 64, 64], "float32", "gelu")
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BenchConfig(warmup_ms=1, target_ms=2, min_reps=3))
    bench.inductor_default()  # records the problem's lookup, as a tune does first
    kernels = {}
    cpp = {"max_autotune_gemm_backends": "CPP", "cpp.gemm_thread_factors": None, "cpp.gemm_max_k_slices": 1,
           "cpp.gemm_cache_blocking": None}
    for name, params in (("cpp", cpp), ("cpp, no epilogue fusion", {**cpp, "epilogue_fusion": False})):
        meas, code = run_and_get_code(lambda p=params: bench.measure(Candidate("c", "config", None, p)))
        assert meas.status == "ok", meas.error_text
        kernels[name] = sorted(set(re.findall(r"cpp_fused_\w+", "\n".join(code))))
    assert len(kernels["cpp"]) == 1 and len(kernels["cpp, no epilogue fusion"]) == 2, kernels
