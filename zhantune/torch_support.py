"""The oldest torch zhantune compiles with, and the one-line refusal of an older one.

zhantune measures and loads Inductor's lookup-table entries as torch 2.13's Inductor reads them
(torch/_inductor/lookup_table/choices.py, torch/_inductor/kernel/mm.py, torch/_inductor/lowering.py).
Older Inductor differs where it matters, as seen on an NVIDIA H200 with torch 2.11.0+cu130 and
Triton 3.6.0 (scripts/gpu_check.py, 2026-11-26; README "Which paths have run on a GPU"):

- its ``LookupTableChoices`` replaces a template's parameters with the table entry instead of
  merging the entry over them, so an entry as Inductor's own tables write it (the config, no derived
  kwargs) fails to compile: every Triton candidate was ``compile_error`` ("'USE_FAST_ACCUM' is
  undefined", "ACC_TYPE is not defined");
- under max-autotune an addmm makes one lookup, with the expanded bias, for ATen and Triton alike
  (2.13: the ATen kernels with the 1-D bias), so the bfloat16 addmm-keyed problems (addmm, linear_act) missed when loaded;
- ``torch._inductor.lowering.user_lowerings`` (the CPU per-GEMM hook, zhantune.inductor.cpu_gemm)
  and ``config.keep_addmm_fused_for_half_dtypes`` do not exist (without the first every default
  compile failed; without the second the bfloat16 linear_act tune and gpu_check's own check stopped).

Only 2.11 was seen failing. torch 2.12's source already has all four as 2.13 has them (read from
its wheel: the merge, the separate ATen addmm lookup, the hook, the flag), but no test has run on
it, and 2.13 is the oldest torch the tests run on. So tuning with Inductor (and its dry
run), collecting, checking, replaying a table (``zhantune.replay``) and loading one (``use_table``)
refuse such a torch before anything is measured or written; a Kernel Tuner replay
(``bench=replay``), exports, comparisons and reports compile nothing and run on any torch.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from zhantune.errors import UserError

__all__ = ["MIN_TORCH", "UnsupportedTorchError", "check_torch"]

#: (major, minor) of the oldest torch release zhantune supports (pyproject.toml says the same)
MIN_TORCH = (2, 13)


class UnsupportedTorchError(UserError):
    """The installed torch is older than :data:`MIN_TORCH` (a user error: exit code 2)."""


def check_torch(version: str | None = None, what: str = "zhantune") -> None:
    """Raise UnsupportedTorchError when ``version`` (default: the running ``torch.__version__``) is
    older than :data:`MIN_TORCH`; pre-releases and local builds of 2.13 (``2.13.0a0+git...``) pass.
    ``what`` names the command or call in the message."""
    if version is None:
        import torch

        version = str(torch.__version__)
    try:
        release = tuple(Version(version).release[:2])
    except InvalidVersion:  # a custom build's string ("2.11.0-custom"): its leading major.minor
        found = re.match(r"\s*v?(\d+)\.(\d+)", version)
        if found is None:
            return  # a build that does not say its version: nothing to refuse on
        release = (int(found[1]), int(found[2]))
    if release >= MIN_TORCH:
        return
    need = ".".join(map(str, MIN_TORCH))
    raise UnsupportedTorchError(
        f"{what} needs torch>={need}; this environment has torch {version}: {need} is the oldest torch "
        "zhantune is tested on, and older Inductor reads lookup tables differently (torch 2.11, seen on an "
        "H200, replaces a Triton template's parameters with the entry, so every tuned Triton config failed "
        f"to compile, and looks addmm up under another key); install torch>={need} (zhantune/torch_support.py)")
