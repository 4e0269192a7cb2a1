"""The fusion-limit parameters (conf/space/fusion.yaml) change the code Inductor generates."""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from zhantune.device import resolve_device
from zhantune.inductor.settings import CPU_BASE_PATCH
from zhantune.problems import GemmProblem

pytestmark = pytest.mark.slow


def _kernels(patch: dict) -> list[str]:
    """Names of the C++ kernels Inductor generates for linear_act (x @ W + b, gelu) with ``patch``."""
    device = resolve_device("cpu")
    module, inputs = GemmProblem.from_config("linear_act", [64, 64, 64], "float32", "gelu").build(device.torch_device)
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(
            {**CPU_BASE_PATCH, "max_autotune": True, "max_autotune_gemm_backends": "CPP", **patch}):
        out, code = run_and_get_code(torch.compile(module), *inputs)
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
