"""Template ids Inductor offers for GEMMs, read from Inductor's own modules (not a copied list)."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["inductor_template_ids", "TEMPLATE_CONFIG"]

#: template uid -> the Inductor config without which Inductor does not offer that template
#: (``triton::mm_persistent_tma``: ``use_triton_tma_template`` in torch/_inductor/utils.py)
TEMPLATE_CONFIG: dict[str, dict[str, object]] = {
    "triton::mm_persistent_tma": {"triton.enable_persistent_tma_matmul": True},
}


@lru_cache
def inductor_template_ids() -> frozenset[str]:
    """Every ``uid`` of the KernelTemplate / ExternKernelChoice objects in kernel/mm.py and bmm.py,
    e.g. ``triton::mm``, ``decompose_k``, ``aten::mm``."""
    from torch._inductor.codegen.common import KernelTemplate
    from torch._inductor.kernel import bmm, mm
    from torch._inductor.select_algorithm import ExternKernelChoice

    ids = set()
    for module in (mm, bmm):
        for obj in vars(module).values():
            if isinstance(obj, (KernelTemplate, ExternKernelChoice)) and isinstance(obj.uid, str):
                ids.add(obj.uid)
    return frozenset(ids)
