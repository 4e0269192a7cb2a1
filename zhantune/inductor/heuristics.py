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
  which a lookup-table entry must carry itself.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["triton_mm_configs", "decompose_k_splits", "template_params", "derived_kwargs", "with_derived_kwargs",
           "offered_templates",
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
    """Kwargs Inductor computes per config from the problem, for a template entry with ``params``.

    Inductor merges a lookup-table entry over the kwargs of its *first* heuristic config
    (``LookupTableChoices._create_lookup_choices``), and that config's ``EVEN_K`` was computed from
    its own ``BLOCK_K`` (``MMTemplateConfigMixin._convert_config_to_template_kwargs`` in
    torch/_inductor/template_heuristics/triton.py: ``EVEN_K = K % BLOCK_K == 0``). An entry without
    ``EVEN_K`` inherits it: with K=48 a BLOCK_K=32 entry gets ``EVEN_K=True`` from BLOCK_K=16 and
    its K loop reads past K unmasked. The other kwargs of that config (``ACC_TYPE``,
    ``USE_FAST_ACCUM``, the TMA options) depend on the op and dtype only, so the first config's are
    right. ``dims``: the problem's sizes (``K`` is used). Empty for templates without ``BLOCK_K`` and
    for problems without a ``K``.
    """
    if not template_id.startswith("triton::") or "BLOCK_K" not in params or "K" not in dims:
        return {}
    return {"EVEN_K": dims["K"] % int(params["BLOCK_K"]) == 0}


def with_derived_kwargs(entry: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    """A lookup-table entry (``{"template_id": ..., kwargs}``) with :func:`derived_kwargs` added for
    a problem of ``dims``; entries of other kinds (ATen, config patches) unchanged."""
    return {**entry, **derived_kwargs(entry["template_id"], entry, dims)}


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
