"""GEMM problems by op name (mm, addmm, bmm, linear_act)."""

from zhantune.problems.gemm import DTYPES, OPS, GemmModule, GemmProblem

__all__ = ["DTYPES", "OPS", "GemmModule", "GemmProblem"]
