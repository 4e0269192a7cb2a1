"""GEMM problems by op name (mm, addmm, bmm, linear_act)."""

from typing import Any

from zhantune.problems.gemm import DTYPE_BYTES, OPS, GemmProblem

__all__ = ["DTYPES", "DTYPE_BYTES", "OPS", "GemmModule", "GemmProblem"]


def __getattr__(name: str) -> Any:
    """DTYPES and GemmModule come with torch (zhantune.problems.module), imported on first use."""
    if name in ("DTYPES", "GemmModule"):
        from zhantune.problems import module

        return getattr(module, name)
    raise AttributeError(f"module 'zhantune.problems' has no attribute {name!r}")
