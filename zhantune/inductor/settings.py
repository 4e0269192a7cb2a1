"""The Inductor compile settings zhantune compiles under, in one place: the benchmarker's base
patches, a template candidate's patch, a shipped table's patch on CUDA, the model check's patches,
and the setters of dotted keys (Inductor config, ``torch.backends`` flags).

CPU: every compile is the inference compile a user gets: ``freezing=True`` under ``no_grad``,
oneDNN on (nothing here changes ``torch.backends.mkldnn``: without oneDNN bf16 GEMMs are 25x slower).
CUDA: a template candidate restricts ``max_autotune_gemm_backends`` so that Inductor builds that one
choice; ``torch.backends`` flags (TF32) are set around a compile and restored.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from zhantune.inductor.knobs import BACKEND_FLAGS, CONFIG_KNOBS
from zhantune.inductor.templates import TEMPLATE_CONFIG
from zhantune.quiet import NO_AUTOTUNE_REPORT

__all__ = ["CPU_BASE_PATCH", "CUDA_BASE_PATCH", "KERNEL_CACHE_PATCH", "BACKEND_FLAGS", "base_patch",
           "MAX_AUTOTUNE", "template_patch", "cuda_table_patch", "model_patch", "backend_flags", "backend_flag", "get_config",
           "set_knob", "scratch_cache_dir", "cache_dir_env"]

#: under every benchmark compile: Inductor's kernel caches stay on (C++ and Triton binaries in
#: TORCHINDUCTOR_CACHE_DIR, a tune's own temporary directory: :func:`scratch_cache_dir`; keyed by
#: the hash of their source and compiler command, so a hit is the identical kernel), every cache that
#: could skip the lowering is off (FX graph here, AOTAutograd and Dynamo's profile-guided shapes in
#: zhantune.bench.inductor), so each compile still makes its GEMM lookup and the benchmarker's checks
#: see it; autotuning results are not reused between candidates either. Not ``force_disable_caches``:
#: it compiles every kernel again (measured 1.5 s against 0.2 s for a kernel built before) and leaves
#: a temporary directory per compile in Inductor's cache directory (``fresh_cache(delete=False)`` in
#: torch/_inductor/compile_fx.py), which it never deletes
KERNEL_CACHE_PATCH: dict[str, Any] = {
    "fx_graph_cache": False, "fx_graph_remote_cache": False,
    "autotune_local_cache": False, "autotune_remote_cache": False,
}
#: no max-autotune unless a candidate's own patch turns it on: the default baseline is Inductor's
#: default whatever the environment says (TORCHINDUCTOR_MAX_AUTOTUNE=1 made it the C++ template on
#: CPU, and the ``aten`` candidate not_applied)
NO_MAX_AUTOTUNE: dict[str, Any] = {"max_autotune": False, "max_autotune_gemm": False}
#: every CPU compile of a benchmark: inference with constant weights (a user's ``freezing=True``
#: compile), no background pool of compile workers competing with the timed runs for the cores
CPU_BASE_PATCH: dict[str, Any] = {"freezing": True, "compile_threads": 1, **NO_MAX_AUTOTUNE, **KERNEL_CACHE_PATCH}
CUDA_BASE_PATCH: dict[str, Any] = {**NO_MAX_AUTOTUNE, **KERNEL_CACHE_PATCH}


def cache_dir_env(cache_dir: str) -> dict[str, str]:
    """The environment variables that put Inductor's and Triton's on-disk caches in ``cache_dir``
    (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR under it)."""
    return {"TORCHINDUCTOR_CACHE_DIR": cache_dir, "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton")}


@contextlib.contextmanager
def scratch_cache_dir(prefix: str = "zhantune-kernels-", kernel_store: str | None = None) -> Iterator[str]:
    """Inductor's and Triton's cache directories (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR; read
    by Inductor at every use, inherited by worker processes) in a new temporary directory, yielded,
    restored and deleted afterwards with everything compiled there. A tune kills workers in the middle
    of a compile (a timeout, the compile-ahead compiles abandoned at its end): a half-written binary
    stays in this directory, never in the user's cache, where Inductor would load it by its name
    (``_worker_compile_cpp`` in torch/_inductor/codecache.py builds only a missing file).
    ``kernel_store``: a directory of finished binaries from earlier tunes that builds in this process
    take from and add to (zhantune.inductor.kernel_store; workers are given it in their spec). The
    directory is locked while in use, and the next tune deletes one that a killed tune left
    (zhantune.scratch)."""
    from zhantune.inductor.kernel_store import serving
    from zhantune.scratch import owned_tempdir

    with owned_tempdir(prefix) as scratch:
        env = cache_dir_env(scratch)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        _clear_inductor_path_caches()
        try:
            with serving(kernel_store, scratch):
                yield scratch
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            _clear_inductor_path_caches()


def _clear_inductor_path_caches() -> None:
    """Inductor's in-memory caches that ``fresh_cache`` clears (paths under the cache directory such
    as ``CacheBase.get_local_cache_path``, loaded code by key), where Inductor is imported already:
    a compile in this process after :func:`scratch_cache_dir` must not write into its deleted
    directory (torch/_inductor/utils.py ``clear_on_fresh_cache``)."""
    import sys

    utils = sys.modules.get("torch._inductor.utils")
    if utils is not None and callable(getattr(utils, "clear_caches", None)):
        utils.clear_caches()


def base_patch(device_kind: str) -> dict[str, Any]:
    """Inductor config under every benchmark compile on ``device_kind`` ("cpu", "cuda"):
    CPU_BASE_PATCH or CUDA_BASE_PATCH (a copy)."""
    return dict(CPU_BASE_PATCH if device_kind == "cpu" else CUDA_BASE_PATCH)


#: the max-autotune switch of a GEMM compile per device kind. On CUDA ``max_autotune_gemm``: every
#: GEMM decision in Inductor reads ``max_autotune or max_autotune_gemm`` (torch/_inductor/utils.py
#: ``use_triton_template``, kernel/mm.py, scheduler.py), while ``max_autotune`` also autotunes every
#: pointwise and reduction kernel's launch config (runtime/triton_heuristics.py reads it from
#: inductor_meta): a candidate would be timed with autotuned epilogue kernels against a default
#: without them, and a table would autotune a user's whole model. On CPU ``max_autotune`` (the C++
#: GEMM template's path; Inductor's CPU kernels are not autotuned)
MAX_AUTOTUNE = {"cuda": "max_autotune_gemm", "cpu": "max_autotune"}


def template_patch(template_id: str, device_kind: str = "cuda") -> dict[str, Any]:
    """Inductor config under which a template candidate's compile builds that one choice only.

    ``max_autotune_gemm_backends``: ATEN for an ``aten::*`` template, TRITON for the rest
    (``triton::*``, ``decompose_k``, ``contiguous_*`` are offered only with TRITON in the list). With
    both, addmm makes a second lookup (ATen, 1-D bias, torch/_inductor/kernel/mm.py
    ``tuned_addmm``) that misses and keeps ``aten::addmm`` beside the candidate, or the template
    lookup misses and keeps every heuristic Triton config: Inductor would then autotune and time the
    faster of several kernels. ``triton::mm_persistent_tma`` is offered only with
    ``triton.enable_persistent_tma_matmul`` (``use_triton_tma_template`` in torch/_inductor/utils.py).
    """
    patch: dict[str, Any] = {MAX_AUTOTUNE[device_kind]: True,
                             "max_autotune_gemm_backends": "ATEN" if template_id.startswith("aten::") else "TRITON"}
    patch.update(TEMPLATE_CONFIG.get(template_id, {}))
    return patch


def cuda_table_patch(table: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Inductor config a CUDA table compiles under (zhantune.use_table): GEMM max-autotune
    (``max_autotune_gemm``, MAX_AUTOTUNE: pointwise and reduction kernels compile as without the
    table) over ATen and Triton (a miss compiles as without the table: the ATen kernel, or under the
    user's own max-autotune their backends' templates: zhantune.inductor.table_choices.TableChoices),
    convolutions over ATen only (max-autotune would
    otherwise offer and benchmark Triton conv templates: torch/_inductor/kernel/conv.py), and
    ``triton.enable_persistent_tma_matmul`` when an entry names ``triton::mm_persistent_tma``
    (Inductor offers that template only then: ``use_triton_tma_template`` in torch/_inductor/utils.py),
    unless the user has ``triton.native_matmul`` on when the table is installed: Inductor then raises
    "native matmul doesn't support tma codegen yet" at every mm on a GPU with TMA (kernel/mm_common.py),
    so such an entry is left unoffered instead.
    Two graph decisions still follow GEMM max-autotune (README: use_table on CUDA): a 1x1
    channels-last convolution is lowered as an mm, and ``a @ b + c @ d`` of equal sizes as one
    ``mm_plus_mm`` (torch/_inductor/fx_passes/post_grad.py)."""
    patch: dict[str, Any] = {MAX_AUTOTUNE["cuda"]: True, "max_autotune_gemm_backends": "ATEN,TRITON",
                             "max_autotune_conv_backends": "ATEN"}
    from torch._inductor import config as inductor_config

    for e in (e for entries in table.values() for e in entries) if not inductor_config.triton.native_matmul else ():
        patch.update(TEMPLATE_CONFIG.get(e.get("template_id"), {}))
    return patch


def model_patch(device_kind: str, max_autotune: bool = False) -> dict[str, Any]:
    """Inductor config of a model compile in ``python -m zhantune.check``: a user's compile (on CPU
    ``freezing=True``; Inductor's caches off, so each way compiles cold), optionally max-autotune,
    with max-autotune's stderr tables off (NO_AUTOTUNE_REPORT)."""
    patch: dict[str, Any] = {"freezing": True} if device_kind == "cpu" else {}
    patch.update(NO_AUTOTUNE_REPORT)
    # max-autotune only for that way: TORCHINDUCTOR_MAX_AUTOTUNE=1 made the "default" way a
    # max-autotune compile (max_autotune_gemm is left alone: use_table sets it for a CUDA table)
    patch["max_autotune"] = max_autotune
    return {**patch, "force_disable_caches": True}


@contextlib.contextmanager
def backend_flags(flags: dict[str, Any]) -> Iterator[None]:
    """Set ``torch.backends.<key>`` for each flag (keys from BACKEND_FLAGS, dotted:
    ``cuda.matmul.allow_tf32``), restored afterwards."""
    import torch

    saved = []
    try:
        for key, value in flags.items():
            *path, attr = key.split(".")
            obj: Any = torch.backends
            for part in path:
                obj = getattr(obj, part)
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def backend_flag(key: str) -> Any:
    """The current value of a ``torch.backends`` flag (dotted key from BACKEND_FLAGS); None when
    this torch has no such flag."""
    import torch

    obj: Any = torch.backends
    for part in key.split("."):
        obj = getattr(obj, part, None)
    return obj


def get_config(key: str) -> Any:
    """The current value of the Inductor config key ``key`` (dotted: ``cpp.gemm_max_k_slices``)."""
    from torch._inductor import config as inductor_config

    return inductor_config.get_config_copy().get(key)


def set_knob(key: str, value: Any) -> None:
    """Set an allow-listed Inductor tuning knob (zhantune.inductor.knobs.CONFIG_KNOBS, dotted key);
    any other key is a bug: ValueError."""
    from torch._inductor import config as inductor_config

    if not any(key in knobs for knobs in CONFIG_KNOBS.values()):
        raise ValueError(f"{key!r} is not an allow-listed tuning knob")
    *path, attr = key.split(".")
    obj: Any = inductor_config
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, attr, value)
