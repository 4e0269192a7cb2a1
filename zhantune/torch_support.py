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
  (2.13: the ATen kernels with the 1-D bias), so an exported addmm key missed when loaded;
- ``torch._inductor.lowering.user_lowerings`` (the CPU per-GEMM hook, zhantune.inductor.cpu_gemm)
  and ``config.keep_addmm_fused_for_half_dtypes`` do not exist (every default compile failed).

So tuning with Inductor, collecting, checking and loading a table (``use_table``) refuse such a
torch before anything is measured or written; replayed data, exports and reports need no Inductor.
"""

from __future__ import annotations

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
        release = Version(version).release
    except InvalidVersion:
        return  # a build that does not say its version: nothing to refuse on
    if tuple(release[:2]) >= MIN_TORCH:
        return
    need = ".".join(map(str, MIN_TORCH))
    raise UnsupportedTorchError(
        f"{what} needs torch>={need}; this environment has torch {version}: before {need} Inductor's lookup "
        "table replaces a template's parameters with the table entry (its Triton templates then fail to "
        "compile: 'USE_FAST_ACCUM' is undefined, seen on an H200 with torch 2.11) and looks an addmm up "
        f"under another key, so tuned entries can neither be measured nor loaded; install torch>={need} "
        "(zhantune/torch_support.py)")
