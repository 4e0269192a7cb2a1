"""The torch side of a GEMM problem: dtype names to torch dtypes, and the module that is compiled.
Imported only where tensors are built (zhantune.problems.gemm.GemmProblem.build): a Kernel Tuner
import, a replay or a merge never loads torch."""

from __future__ import annotations

import torch

from zhantune.problems.gemm import DTYPE_BYTES
from zhantune.request import DTYPE_NAMES

__all__ = ["DTYPES", "GemmModule"]

#: dtype names accepted on the command line (zhantune.request.DTYPE_NAMES) -> torch dtypes
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
assert tuple(DTYPES) == DTYPE_NAMES  # one list of names, checked before torch is imported


class GemmModule(torch.nn.Module):
    """``act(x @ W + b)`` for one op; W is [K, N] ([B, K, N] for bmm), or [N, K] used as W.t() when
    ``weight_layout`` is "nk"; b is [N]."""

    def __init__(self, op: str, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                 weight_layout: str = "kn"):
        super().__init__()
        self.op = op
        self.activation = activation
        self.weight_layout = weight_layout
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op == "bmm":
            return torch.bmm(x, self.weight)
        w = self.weight.t() if self.weight_layout == "nk" else self.weight
        if self.bias is None:
            return x @ w
        y = torch.addmm(self.bias, x, w)
        if self.activation == "relu":
            return torch.relu(y)
        if self.activation == "gelu":
            return torch.nn.functional.gelu(y)
        return y
assert all(DTYPES[name].itemsize == n for name, n in DTYPE_BYTES.items())
