"""What Inductor itself would try, read from its own template heuristics (never a copied list).

* :func:`triton_mm_configs`: the Triton GEMM configs max-autotune tries for an (M, N, K) problem on
  CUDA (``CUDAConfigHeuristic.get_mm_configs``, torch/_inductor/template_heuristics/triton.py, with
  its size scaling), as lookup-table kwargs.
* :func:`decompose_k_splits`: the k_split values Inductor's decomposeK heuristic offers
  (``torch._inductor.utils.get_k_splits``).
* :func:`template_params`: the kwargs a template takes: the keys Inductor's heuristic yields for it
  plus Triton's launch options; None where zhantune cannot tell (no check then).
* :func:`offered_templates`: whether Inductor's mm lowering offers decomposeK and the Triton mm
  templates for a size (the K-to-M/N thresholds of ``tuned_mm``).
* :func:`derived_kwargs`: the kwargs Inductor derives per config from the problem (``EVEN_K``),
  which a measured candidate's entry carries itself; :func:`with_derived_kwargs`: what an
  exported entry carries of them (safe for a dynamic K); :func:`even_k`: Inductor's own rule in a
  compile, as zhantune.use_table applies it.
* :func:`tf32_float32`: whether Inductor compiles a float32 GEMM with TF32 in this process.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["triton_mm_configs", "decompose_k_splits", "template_params", "derived_kwargs", "with_derived_kwargs",
           "even_k", "offered_templates", "tf32_float32", "TF32_ON",
           "half_math_changed",
           "LAUNCH_OPTIONS"]

#: Triton launch options a lookup-table entry may carry beside the template's constexprs
LAUNCH_OPTIONS = frozenset({"num_stages", "num_warps"})
_NOT_TUNABLE = {"hint_override"}  # bookkeeping of the heuristic, not a kernel parameter


def _with_graph(fn: Any) -> Any:
    """Run ``fn`` with a throwaway GraphLowering installed: the heuristics read size hints from it."""
    import torch
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    with V.set_graph_handler(GraphLowering(gm)):
        return fn()


def triton_mm_configs(m: int, n: int, k: int, dtype_bytes: int) -> list[dict[str, Any]]:
    """Inductor's Triton mm configs for this size, e.g. {"BLOCK_M": 64, ..., "num_warps": 4}."""
    from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic

    gen = CUDAConfigHeuristic().get_mm_configs()
    configs = _with_graph(lambda: list(gen(m, n, k, dtype_size=dtype_bytes, op_name="mm")))
    out = []
    for c in configs:
        entry = {key: v for key, v in c.kwargs.items() if key not in _NOT_TUNABLE}
        entry.update(num_stages=c.num_stages, num_warps=c.num_warps)
        if entry not in out:
            out.append(entry)
    return out


def decompose_k_splits(m: int, n: int, k: int) -> list[int]:
    """The k_split values Inductor's decomposeK would try for this size."""
    from torch._inductor.utils import get_k_splits

    return [int(s) for s in _with_graph(lambda: get_k_splits(m, n, k))]


@lru_cache
def template_params(template_id: str) -> frozenset[str] | None:
    """Kwargs the template takes (a lookup-table entry's keys besides template_id/template_hash)."""
    if template_id.startswith("aten::") or template_id.startswith("contiguous_"):
        return frozenset()  # an ATen call or a fixed rewrite: nothing to set
    if template_id == "decompose_k":
        return frozenset({"k_split"})  # the key template_heuristics/decompose_k.py yields
    if template_id.startswith("triton::"):
        keys = set(triton_mm_configs(256, 256, 256, 2)[0])
        return frozenset(keys | LAUNCH_OPTIONS)
    return None


def derived_kwargs(template_id: str, params: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    """Kwargs Inductor computes per config from the problem, for a template entry with ``params``,
    in a compile of the static sizes ``dims`` (a tune's: ``K`` is used): ``EVEN_K``, K a multiple of
    BLOCK_K (for a static K what Inductor's ``statically_known_true`` on ``K % BLOCK_K == 0`` gives:
    :func:`even_k`).

    Inductor merges a lookup-table entry over the kwargs of its *first* heuristic config
    (``LookupTableChoices._create_lookup_choices``), and that config's ``EVEN_K`` was computed from
    its own ``BLOCK_K`` (``MMTemplateConfigMixin._convert_config_to_template_kwargs`` in
    torch/_inductor/template_heuristics/triton.py). A candidate's entry without ``EVEN_K`` inherits
    it: with K=48 a BLOCK_K=32 entry gets ``EVEN_K=True`` from BLOCK_K=16 and its K loop reads past
    K unmasked. The other kwargs of that config (``ACC_TYPE``, ``USE_FAST_ACCUM``, the TMA options)
    depend on the op and dtype only, so the first config's are right. Empty for templates without
    ``BLOCK_K`` and for problems without a ``K``.
    """
    if not template_id.startswith("triton::") or "BLOCK_K" not in params or "K" not in dims:
        return {}
    return {"EVEN_K": dims["K"] % int(params["BLOCK_K"]) == 0}


def with_derived_kwargs(entry: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    """A lookup-table entry (``{"template_id": ..., kwargs}``) as a table ships it for a problem of
    ``dims``: ``EVEN_K: false`` where K is not a multiple of the entry's BLOCK_K, and no ``EVEN_K``
    where it is; entries of other kinds (ATen, config patches) unchanged.

    A table's key holds the compile's size hints, so a compile with a dynamic K whose hint is this
    K finds the entry too: ``EVEN_K: true`` there would drop the K masks for every other K (reads
    past the rows, wrong results). Without it, Inductor's own value of its first config is merged
    (:func:`derived_kwargs`): false for a dynamic K; for this static K true where that config's
    BLOCK_K divides K (the measured kernel), else false (masked: correct, possibly slower than
    measured). zhantune.use_table computes it for the entry's own BLOCK_K (:func:`even_k`)."""
    derived = derived_kwargs(entry["template_id"], entry, dims)
    if not derived:
        return entry
    out = {k: v for k, v in entry.items() if k != "EVEN_K"}
    return out if derived["EVEN_K"] else {**out, "EVEN_K": False}


def even_k(kernel_inputs: Any, block_k: int) -> bool:
    """``EVEN_K`` as Inductor computes it for a config of ``block_k`` in the compile under way:
    ``statically_known_true(Eq(Mod(K, BLOCK_K), 0))`` on the symbolic K of ``kernel_inputs`` (a
    torch._inductor.kernel_inputs.MMKernelInputs; MMTemplateConfigMixin._convert_config_to_template_kwargs
    in torch/_inductor/template_heuristics/triton.py): false for a dynamic K whatever its size hint."""
    import sympy
    from torch._inductor.virtualized import V
    from torch.utils._sympy.functions import Mod

    k = kernel_inputs.mnk_symbolic()[2]
    return bool(V.graph.sizevars.statically_known_true(sympy.Eq(Mod(k, int(block_k)), 0)))


def offered_templates(lookup_op: str, m: int, n: int, k: int) -> dict[str, bool]:
    """Which GEMM templates Inductor's lowering offers for this size, as constraint variables.

    ``tuned_mm`` (torch/_inductor/kernel/mm.py) offers ``decompose_k`` only when
    ``use_decompose_k_choice(m, n, k)`` holds (K >= ``triton.decompose_k_threshold`` * max(M, N),
    32 by default) and its heuristic has a split for the size (a lookup entry is merged over the
    first one, so without one the entry is dropped); it drops ``triton::mm`` (and the persistent
    TMA template) at twice that threshold unless ``max_autotune_gemm_search_space == "exhaustive"``,
    compared as Inductor compares it (kernel/mm.py): config.py upper-cases the environment's
    setting, so ``EXHAUSTIVE`` never keeps them (only a config patched in lower case does).
    addmm and bmm offer their Triton templates at any K and no decomposeK.
    Returns ``{"decompose_k_offered": bool, "triton_mm_offered": bool}``.
    """
    if lookup_op != "mm":
        return {"decompose_k_offered": False, "triton_mm_offered": True}
    from torch._inductor import config
    from torch._inductor.utils import use_decompose_k_choice

    check = use_decompose_k_choice.__wrapped__  # Inductor's cache would keep our throwaway graph's answer
    decompose = _with_graph(lambda: check(m, n, k))
    dropped = _with_graph(lambda: check(m, n, k, threshold_multiple=2))
    exhaustive = config.max_autotune_gemm_search_space == "exhaustive"  # verbatim tuned_mm's test
    return {"decompose_k_offered": bool(decompose and decompose_k_splits(m, n, k)),
            "triton_mm_offered": bool(exhaustive or not dropped)}


#: why a float32 CUDA entry compiled Inductor's default in a process with TF32 on (:func:`tf32_float32`)
TF32_ON = ("this process compiles float32 GEMMs with TF32 (torch.backends.cuda.matmul.fp32_precision is 'tf32', "
           "e.g. after torch.set_float32_matmul_precision('high')); the table's float32 entries and the default "
           "they beat were measured without it, so no measurement covers them here; Inductor's default compiled")


def tf32_float32(dtypes: list[str]) -> bool:
    """Whether a CUDA GEMM of inputs of ``dtypes`` (names, e.g. "float32") compiles with TF32 here:
    a float32 input, and ``torch.backends.cuda.matmul.fp32_precision == "tf32"``, read by Inductor
    at lowering (template_heuristics/triton.py ``ALLOW_TF32``) and by cuBLAS (its ATen default)."""
    import torch

    return "float32" in dtypes and torch.backends.cuda.matmul.fp32_precision == "tf32"


#: cuBLAS's half-precision math flags (torch.backends.cuda.matmul), torch's default, and the input
#: dtype each applies to: Inductor's ATen default follows them (its FX graph cache keys on them,
#: torch/_inductor/codecache.py), the Triton template does not
_HALF_MATH = (("allow_fp16_reduced_precision_reduction", True, "float16"),
              ("allow_fp16_reduced_precision_reduction_split_k", True, "float16"),
              ("allow_bf16_reduced_precision_reduction", True, "bfloat16"),
              ("allow_fp16_accumulation", False, "float16"))
#: why a half-precision CUDA entry compiled Inductor's default where cuBLAS's math differs (:func:`half_math_changed`)
HALF_MATH_CHANGED = ("torch.backends.cuda.matmul.{flag} is {value} in this process (torch's default: {default}): "
                     "cuBLAS, Inductor's default for this GEMM, computes otherwise than when the table's entry was "
                     "paired with it; Inductor's default compiled")


def half_math_changed(dtypes: list[str]) -> str | None:
    """HALF_MATH_CHANGED filled in for the first of cuBLAS's half-precision math flags that differs
    from torch's default for a CUDA GEMM of inputs of ``dtypes`` here (zhantune measures under the
    defaults; a tuned flag's winner is never exported), else None."""
    import torch

    for flag, default, dtype in _HALF_MATH:
        value = getattr(torch.backends.cuda.matmul, flag, default)
        if dtype in dtypes and bool(value) != default:
            return HALF_MATH_CHANGED.format(flag=flag, value=value, default=default)
    return None
