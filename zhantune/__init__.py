"""zhantune: declarative tuning of PyTorch Inductor GEMM kernels, exported as Inductor lookup tables.

Runtime API (imported lazily, so ``import zhantune`` stays light):

- ``zhantune.use_table(path_or_dict, device="cpu")``: install a shipped table for the compiles that
  follow (plain call or context manager); see :mod:`zhantune.inductor.runtime`.
- ``zhantune.table_report()``: hits, misses and stale drops since the table was installed.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "use_table", "table_report"]


def __getattr__(name: str) -> Any:
    if name in ("use_table", "table_report"):
        from zhantune.inductor import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'zhantune' has no attribute {name!r}")
