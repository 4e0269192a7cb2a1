"""Typed benchmark results: a status, never a bare float."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # light: zhantune.storage reads this module without importing torch
    from zhantune.bench.timing import Timing
    from zhantune.inductor.choices import LookupEvent

__all__ = ["STATUSES", "Measurement", "TOLERANCES", "TF32_TOLERANCE", "tolerance"]

#: every status a measurement can have (DESIGN.md "Measurements are data")
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "not_applied", "invalid")

#: max |out - ref| / max |ref| allowed per dtype, the reference computed in float64 from the same
#: inputs. float32 allows accumulation-order differences; bfloat16/float16 allow a few output ulps.
TOLERANCES = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-3}
#: a float32 GEMM whose inputs are rounded to TF32 (10 explicit mantissa bits, as float16) on the
#: tensor cores: float16's tolerance. TF32's unit roundoff is 2**-11 = 4.9e-4, and the error of such a
#: GEMM against the float64 reference is about 3e-4 at K=4096 (tests/test_cuda_paths.py emulates it),
#: three times float32's 1e-4, so a TF32 candidate checked against float32's tolerance never passes
TF32_TOLERANCE = 2e-3
#: torch.backends flags (zhantune.inductor.knobs.BACKEND_FLAGS) under which float32 GEMMs may round
#: their inputs below float32: TF32, and fp16/bf16 reduced-precision reductions (half dtypes only)
_TF32_FLAGS = ("cuda.matmul.allow_tf32",)


def tolerance(dtype: str, backend_flags: dict[str, Any] | None = None) -> float:
    """The max relative error allowed for a GEMM in ``dtype`` (TOLERANCES) computed under
    ``backend_flags`` (a ``scope: backend`` candidate's params): TF32_TOLERANCE for float32 with
    ``cuda.matmul.allow_tf32`` true. Raises KeyError for a dtype not in TOLERANCES."""
    tol = TOLERANCES[dtype]
    if dtype == "float32" and any((backend_flags or {}).get(flag) is True for flag in _TF32_FLAGS):
        return max(tol, TF32_TOLERANCE)
    return tol


@dataclass(frozen=True)
class Measurement:
    """The result of compiling and timing one candidate (or a baseline).

    ``timing`` (microseconds) is set when status is ``ok`` or ``incorrect``; ``error`` is the max
    error relative to the reference's max magnitude; ``lookup`` is the GEMM lookup Inductor made.
    """

    status: str
    timing: Timing | None = None
    error: float | None = None
    error_text: str | None = None
    compile_s: float | None = None
    template_hash: str | None = None
    lookup: LookupEvent | None = None
    conditions: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown measurement status {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"
