"""Inductor's CUDA GEMM lowerings, run on a machine without a GPU (the tests' names for
zhantune.inductor.simulate): :func:`fake_cuda` makes Inductor see one H100 (``PROFILE``) or the
properties given; :func:`lower` calls the real lowering and returns the choices it would autotune
among (see zhantune/inductor/simulate.py)."""

from __future__ import annotations

from zhantune.inductor.simulate import PROFILES, Lowered, lower, simulated_cuda

__all__ = ["PROFILE", "fake_cuda", "lower", "Lowered"]

#: an H100 SXM as torch.cuda.get_device_properties reports it (the fields Inductor reads)
PROFILE = PROFILES["H100"].properties()


def fake_cuda(props=PROFILE):
    """Inside the block Inductor sees one CUDA device with ``props``."""
    return simulated_cuda(props)
