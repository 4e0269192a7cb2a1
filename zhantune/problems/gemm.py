"""GEMM-family problems: mm, addmm, bmm and linear + activation.

A problem is what gets compiled: ``x @ W`` with ``W`` (and the bias) held as module parameters, so
that on CPU Inductor's freezing turns them into constants and its C++ GEMM template applies
(``use_cpp_gemm_template`` in torch/_inductor/utils.py needs a constant second operand). The same
module is compiled on CUDA, where parameters are ordinary graph inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zhantune.request import ACTIVATIONS, OPS, WEIGHT_LAYOUTS, check_problem

if TYPE_CHECKING:  # torch only where tensors are built: keys, row fields and flops need none
    import torch

    from zhantune.problems.module import GemmModule

__all__ = ["DTYPE_BYTES", "OPS", "ACTIVATIONS", "WEIGHT_LAYOUTS", "GemmProblem"]

#: bytes per element of each dtype name (zhantune.problems.module.DTYPES checks them against torch)
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM problem: op, dims, dtype (and the epilogue activation for linear_act).

    ``dims`` maps the op's dimension names to sizes, e.g. {"M": 512, "N": 512, "K": 512}.
    ``weight_layout`` (WEIGHT_LAYOUTS) is how the second operand is stored: it is part of Inductor's
    lookup key (strides), so a problem collected from an nn.Linear is tuned with "nk".
    Raises ConfigError (exit code 2) for an unknown op or dtype, a wrong arity or a non-positive size.
    """

    op: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    activation: str | None = None
    weight_layout: str = "kn"

    @classmethod
    def from_config(cls, op: str, shape: object, dtype: str, activation: str | None = None,
                    source: str = "shape", weight_layout: str = "kn") -> GemmProblem:
        """Validate user input (``shape`` as given on the CLI; zhantune.request.check_problem) and
        build the problem."""
        sizes, activation = check_problem(op, shape, dtype, activation, source, weight_layout)
        return cls(op=op, shape=tuple(sizes), dtype=dtype, activation=activation, weight_layout=weight_layout)

    # -- identity ----------------------------------------------------------------------------
    @property
    def dims(self) -> dict[str, int]:
        """Dimension name -> size, e.g. {"M": 512, "N": 512, "K": 512}; B=1 for non-batched ops."""
        d = dict(zip(OPS[self.op], self.shape, strict=True))
        d.setdefault("B", 1)
        return d

    @property
    def torch_dtype(self) -> torch.dtype:
        from zhantune.problems.module import DTYPES

        return DTYPES[self.dtype]

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def key(self) -> str:
        """Canonical, stable problem key, e.g. ``mm[M=512,N=512,K=512]:float32`` (``:weight_nk``
        appended for the nn.Linear weight layout)."""
        dims = ",".join(f"{n}={v}" for n, v in zip(OPS[self.op], self.shape, strict=True))
        act = f":{self.activation}" if self.activation else ""
        layout = ":weight_nk" if self.weight_layout == "nk" else ""
        return f"{self.op}[{dims}]:{self.dtype}{act}{layout}"

    @property
    def lookup_op(self) -> str:
        """The op name Inductor uses in its lookup key for this problem's GEMM on CPU (the op of the
        graph); :meth:`lookup_op_on` gives it per device kind."""
        return "mm" if self.op == "mm" else "bmm" if self.op == "bmm" else "addmm"

    def lookup_op_on(self, device_kind: str) -> str:
        """The op name of this problem's GEMM lookup when Inductor compiles it for ``device_kind``.

        On a GPU, Inductor's post-grad pass ``unfuse_bias_add_to_pointwise``
        (torch/_inductor/fx_passes/post_grad.py) rewrites an addmm whose every use is pointwise
        (linear_act's activation) into mm + add, except for float16/bfloat16 while
        ``keep_addmm_fused_for_half_dtypes`` is set (the default): such a GEMM is looked up as "mm".
        """
        if self.op == "linear_act" and device_kind != "cpu":
            from torch._inductor import config as inductor_config

            half = self.dtype in ("float16", "bfloat16")
            if not (half and inductor_config.keep_addmm_fused_for_half_dtypes):
                return "mm"
        return self.lookup_op

    def flops(self) -> int:
        """Floating-point operations of the GEMM: 2*B*M*N*K (the epilogue is not counted)."""
        d = self.dims
        return 2 * d["B"] * d["M"] * d["N"] * d["K"]

    def memory_bytes(self) -> int:
        """Bytes a tune of this problem holds at least: inputs, weight, bias and output in its dtype,
        their float32 draws, and the float64 reference (:meth:`build`, :meth:`reference`)."""
        d = self.dims
        elems = d["B"] * (d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"]) + d["N"]
        return elems * (self.dtype_bytes + 4 + 8)

    def row_fields(self) -> dict[str, object]:
        """Columns of the problem row (zhantune.storage.orm.Problem), lookup key aside."""
        return dict(op=self.op, shape=self.dims, dtype=self.dtype, activation=self.activation,
                    weight_layout=self.weight_layout, lookup_op=self.lookup_op, flops=self.flops())

    def tflops(self, time_us: float) -> float:
        """TFLOP/s for one run taking ``time_us`` microseconds."""
        return self.flops() / (time_us * 1e-6) / 1e12

    # -- tensors -----------------------------------------------------------------------------
    def build(self, device: torch.device, seed: int = 0) -> tuple[GemmModule, tuple[torch.Tensor, ...]]:
        """The module (weights as parameters) and its inputs, deterministic for a seed.

        Values are drawn from N(0, 1) / sqrt(K) so outputs stay O(1) in every dtype.
        """
        import torch

        from zhantune.problems.module import GemmModule

        d = self.dims
        g = torch.Generator().manual_seed(seed)
        scale = 1.0 / math.sqrt(d["K"])

        def rand(*size: int) -> torch.Tensor:
            return (torch.randn(*size, generator=g) * scale).to(self.torch_dtype).to(device)

        if self.op == "bmm":
            x, w, b = rand(d["B"], d["M"], d["K"]), rand(d["B"], d["K"], d["N"]), None
        else:
            x = rand(d["M"], d["K"])
            w = rand(d["N"], d["K"]) if self.weight_layout == "nk" else rand(d["K"], d["N"])
            b = rand(d["N"]) if self.op in ("addmm", "linear_act") else None
        module = GemmModule(self.op, w, b, self.activation, self.weight_layout).eval()
        return module, (x,)

    def reference(self, module: GemmModule, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The eager result in float64 from the same (rounded) inputs."""
        import torch

        from zhantune.problems.module import GemmModule

        ref = GemmModule(
            self.op,
            module.weight.detach().double(),
            None if module.bias is None else module.bias.detach().double(),
            self.activation,
            self.weight_layout,
        )
        with torch.no_grad():
            return ref(*(t.double() for t in inputs))
