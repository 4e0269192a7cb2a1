"""zhantune: declarative tuning of PyTorch Inductor GEMM kernels, exported as Inductor lookup tables."""

__version__ = "0.1.0"

__all__ = ["__version__"]
