"""Typed benchmark results: a status, never a bare float."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zhantune.bench.timing import Timing
from zhantune.inductor.choices import LookupEvent

__all__ = ["STATUSES", "Measurement", "TOLERANCES"]

#: every status a measurement can have (DESIGN.md "Measurements are data")
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "not_applied", "invalid")

#: max |out - ref| / max |ref| allowed per dtype, the reference computed in float64 from the same
#: inputs. float32 allows accumulation-order differences; bfloat16/float16 allow a few output ulps.
TOLERANCES = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-3}


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
