"""Template ids Inductor offers for GEMMs, read from Inductor's own modules (not a copied list)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["inductor_template_ids", "TEMPLATE_CONFIG", "DEFAULT_KERNEL_TEMPLATES", "is_default_kernel"]

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


#: the template uids of the ATen kernels Inductor's default compile (no max-autotune) runs for a
#: GEMM (torch/_inductor/kernel/mm.py, bmm.py: aten_mm, aten_addmm, aten_bmm; cuBLAS on CUDA)
DEFAULT_KERNEL_TEMPLATES = frozenset({"aten::mm", "aten::addmm", "aten::bmm"})


def is_default_kernel(template_id: str | None, params: dict[str, Any] | None) -> bool:
    """A measured config that is the very kernel Inductor's default compile runs: the ``aten`` config
    (backend list = ATEN only, or none given beside C++-template knobs, which then apply to nothing:
    the CPU path, the prepacked linear), on CUDA an ``aten::<op>`` template
    choice (DEFAULT_KERNEL_TEMPLATES; ``aten::bias_addmm`` is another kernel), or torch.backends flags
    set to what they are anyway (``allow_tf32: false``). Its "speedup" over the default is noise, and a
    table ships Inductor's default entry for it."""
    from zhantune.inductor.knobs import BACKEND_FLAGS
    from zhantune.inductor.settings import backend_flag

    if template_id is not None:
        return template_id in DEFAULT_KERNEL_TEMPLATES
    if params and all(k in BACKEND_FLAGS for k in params):  # the default compile under flags ...
        return all(backend_flag(k) == v for k, v in params.items())  # ... that are this process's own
    # the backend list ATEN alone (the cpp.gemm_* knobs then change nothing: the template is not
    # offered), however written: Inductor strips each comma-separated part (torch/_inductor/utils.py);
    # none given beside C++-template knobs (CPU knobs) is ATEN too: a CPU entry without CPP compiles
    # ATen (table_choices; an attack found {"cpp.gemm_max_k_slices": 2} paired against its own kernel).
    # No params at all is not: on CUDA that config compiles under max-autotune (Triton's templates too)
    params = params or {}
    backends = {b.strip() for b in str(params.get("max_autotune_gemm_backends", "ATEN" if params else "")).upper()
                .split(",")}
    return backends - {""} == {"ATEN"} and all(k == "max_autotune_gemm_backends" or k.startswith("cpp.gemm_")
                                        for k in params)
