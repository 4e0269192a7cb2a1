"""What decides how a CUDA lookup-table entry is served (zhantune.inductor.table_choices serves the
table): the templates Inductor offers, addmm's ATen default held back for its templates' lookup,
and the choices a GEMM gets under the user's own max-autotune where the table does not decide it.
"""

from __future__ import annotations

from typing import Any

from torch._inductor import config as inductor_config

from zhantune.inductor.table import CONFIG_TEMPLATE_ID

__all__ = ["EMPTY_ALONE", "NOT_OFFERED", "SHARED_MEMORY", "held_back", "no_choice", "users_template", "stale_reason",
           "gemm_settings", "shared_memory_bytes", "shared_memory_short", "resources_stale"]

#: why a CUDA entry compiled Inductor's default: its template is not among those Inductor offers for
#: this GEMM here (torch/_inductor/utils.py use_triton_template: a GPU of at least 68 SMs;
#: use_triton_tma_template: TMA, compute capability 9.0; a Blackwell GPU has its own TMA template)
NOT_OFFERED = ("{tids}: not among the templates Inductor offers for this GEMM on this device (e.g. a TMA "
               "template without TMA, any Triton template on a GPU of fewer than 68 SMs); Inductor's default compiled")

#: why ``[]`` compiled Inductor's default on CUDA: it is an addmm's ATen key where its templates' lookup follows
#: (zhantune.inductor.table_choices._addmm_lookup); on any other lookup it left the GEMM with no kernel and was
#: reported a hit (a review, session 51)
EMPTY_ALONE = ("[] (\"nothing from this lookup\") is for an addmm's ATen lookup, which its templates' lookup "
               "follows; no lookup of this GEMM follows here, so it would leave the GEMM no kernel; Inductor's "
               "default compiled")

#: why a CUDA entry compiled Inductor's default: its kernel cannot fit the GPU's shared memory (Triton
#: refuses to launch it: OutOfResources, triton/compiler/compiler.py), so the user's compile would fail
SHARED_MEMORY = ("{tid} with BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, num_stages={stages} needs at least {need:,} "
                 "bytes of shared memory for its pipelined {dtype} tiles, and this GPU allows {have:,} per block "
                 "(Triton would refuse to launch it); Inductor's default compiled")


def shared_memory_bytes(entry: dict[str, Any], itemsize: int, k: Any = None,
                        capability: tuple[int, int] | None = None) -> int | None:
    """The shared memory (bytes) Triton gives the pipelined A and B tiles of a Triton template entry's
    kernel, for inputs of ``itemsize`` bytes per element, a GEMM of reduction size ``k`` (None or a
    symbol: unknown) on a GPU of compute ``capability`` (None: unknown); None where it is not a
    Triton template or a block size is missing.

    ``(BLOCK_M + BLOCK_N) * BLOCK_K * itemsize`` bytes once per pipeline buffer: ``num_stages``
    buffers on a compute capability 9.0 GPU with 8- or 16-bit inputs, ``BLOCK_M >= 64``, ``BLOCK_N >=
    8`` and ``num_warps`` a multiple of 4 (Hopper's warpgroup MMA); one where ``k <= BLOCK_K`` (a
    single K step: not pipelined), but for ``triton::mm_persistent_tma`` (its loop runs over tiles too,
    so it pipelines even a single K step); else ``max(1, num_stages - 1)`` (the persistent TMA kernel's
    too: a review compiled float32 ones at one buffer fewer than counted before); num_stages 0 as 1.
    Measured with Triton's own compiler (``metadata.shared``, the number Triton checks against the
    device's limit) for Inductor's mm, addmm, bmm and persistent TMA kernels on sm_80 and sm_90
    (tests/test_cuda_paths.py; by hand in session 40, two reviews): the tiles are what Triton
    allocates there, and its total is at least this (a few barrier bytes more; with small BLOCK_K,
    or more than 4 warps on sm_80, the epilogue's layout conversion may take more than the tiles).
    So it is a lower bound, never a refusal of a kernel that fits; on another GPU (sm_100, ROCm)
    too, as far as seen. Inductor's own estimate (get_shared_memory_estimation in
    torch/_inductor/template_heuristics/triton.py) counts ``num_stages`` buffers and an epilogue
    tile and over-prunes, as it says."""
    tid = str(entry.get("template_id", ""))
    blocks = [entry.get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages")]
    if not tid.startswith("triton::") or not all(type(v) is int and v >= 0 for v in blocks):
        return None
    bm, bn, bk, stages = blocks
    stages = max(1, stages)  # num_stages 0 pipelines nothing, as 1
    warps = entry.get("num_warps")
    wgmma = (capability == (9, 0) and itemsize in (1, 2) and bm >= 64 and bn >= 8 and type(warps) is int
             and warps % 4 == 0)
    tma = tid == "triton::mm_persistent_tma"
    if wgmma and (tma or not (isinstance(k, int) and k <= bk)):
        buffers = stages
    elif not tma and isinstance(k, int) and k <= bk:
        buffers = 1
    else:
        buffers = max(1, stages - 1)
    return (bm + bn) * bk * itemsize * buffers


def shared_memory_short(entry: dict[str, Any], kernel_inputs: Any, note: str = "") -> str | None:
    """:data:`SHARED_MEMORY` where a Triton entry's kernel needs more shared memory than the GPU of
    this lookup allows per block (:func:`shared_memory_bytes` against ``shared_memory_per_block_optin``
    of ``torch.cuda.get_device_properties``, as Inductor's own check reads it), else None. A table
    made on this device never has such an entry (it would not have run); a forged one, or one written
    for another GPU under this one's key, made the user's compile fail at launch. None on ROCm (the
    LDS use of AMD's pipeliner is not measured here). ``note`` follows the numbers (resources_stale's
    word that the entry was merged)."""
    import torch

    if torch.version.hip or not str(entry.get("template_id", "")).startswith("triton::"):
        return None
    dtype = kernel_inputs.dtype()
    k = kernel_inputs.mnk_symbolic()[2] if hasattr(kernel_inputs, "mnk_symbolic") else None
    props = torch.cuda.get_device_properties(kernel_inputs.device())
    need = shared_memory_bytes(entry, dtype.itemsize, int(k) if getattr(k, "is_number", False) else k,
                               (props.major, props.minor))
    if need is None:
        return None
    have = getattr(props, "shared_memory_per_block_optin", None)
    if not have or need <= have:
        return None
    why = SHARED_MEMORY.format(tid=entry["template_id"], bm=entry["BLOCK_M"], bn=entry["BLOCK_N"], bk=entry["BLOCK_K"],
                               stages=entry["num_stages"], need=need, dtype=str(dtype).removeprefix("torch."),
                               have=int(have))
    return why.replace("; Inductor's default compiled", f"{note}; Inductor's default compiled") if note else why


def resources_stale(entry: dict[str, Any], kernel_inputs: Any, templates: list[Any], op_name: str,
                    choices: Any) -> str | None:
    """Why a Triton entry's kernel cannot run on this lookup's GPU, or None: more accumulators a
    thread or a larger tile than a kernel holds (zhantune.inductor.knobs.triton_resources_problem), or
    more shared memory than the GPU has (:func:`shared_memory_short`), on the kwargs Inductor compiles:
    an entry that leaves one of TRITON_REQUIRED out is merged over its template's first heuristic
    config first, as Inductor merges it (torch/_inductor/lookup_table/choices.py _create_lookup_choices;
    ``choices``: the handler, whose ``get_ktc`` makes that config)."""
    from zhantune.inductor.knobs import TRITON_REQUIRED, triton_resources_problem

    tid = str(entry.get("template_id", ""))
    if not tid.startswith("triton::"):
        return None
    merged = entry
    if any(k not in entry for k in TRITON_REQUIRED):
        template = next((t for t in templates if getattr(t, "uid", None) == tid), None)
        if template is None:
            return None  # not offered: said by the caller
        base = next(choices.get_ktc(kernel_inputs, template, op_name), None)
        if base is None:  # Inductor would skip the template: no choice at all (NoValidChoicesError)
            return (f"{tid}: Inductor's heuristic has no config of it for this GEMM to merge the entry over; "
                    "Inductor's default compiled")
        merged = {**base.params.to_kwargs(), **entry}
    merged_note = "" if merged is entry else " (the entry merged over Inductor's first config for what it leaves out)"
    if bad := triton_resources_problem(merged):
        return f"{bad[1]}{merged_note}; Inductor's default compiled"
    return shared_memory_short(merged, kernel_inputs, merged_note)


def held_back(entries: list[dict[str, Any]], uids: dict[str, Any], kernel_inputs: Any) -> bool:
    """Whether an addmm's ATen lookup holds its default back for the templates' lookup (TableChoices
    ._addmm_lookup): its entries are ``[]`` or templates only that lookup offers (not a config
    patch: never served on CUDA, reported stale by the ATen lookup itself), and the GEMM is not of
    a size statically zero (tuned_addmm then makes the ATen lookup alone: torch/_inductor/kernel/mm.py)."""
    from torch._inductor.kernel.mm_common import _is_static_problem

    if any(e.get("template_id") in uids or e.get("template_id") == CONFIG_TEMPLATE_ID for e in entries):
        return False
    return _is_static_problem(kernel_inputs.output_layout())[1]


def no_choice(template_hashes: dict[str, str | None]) -> bool:
    """Whether a CUDA lookup is one Inductor makes with nothing to choose: max-autotune off
    (``max_autotune`` and ``max_autotune_gemm``, as torch/_inductor/utils.py tests them) and only
    ATen kernels offered."""
    return (not (inductor_config.max_autotune or inductor_config.max_autotune_gemm)
            and all(uid.startswith("aten::") for uid in template_hashes))


def gemm_settings() -> dict[str, Any]:
    """The GEMM autotuning settings in Inductor's config now, as TableChoices._cuda_users_own reads a
    user's: ``max_autotune_gemm``, ``backends`` (max_autotune_gemm_backends), ``persistent_tma``."""
    return {"max_autotune_gemm": bool(inductor_config.max_autotune_gemm),
            "backends": str(inductor_config.max_autotune_gemm_backends),
            "persistent_tma": bool(inductor_config.triton.enable_persistent_tma_matmul)}


def users_template(uid: str, user: dict[str, Any]) -> bool:
    """Whether Inductor would offer template ``uid`` under the user's own GEMM settings (``user``:
    :func:`gemm_settings` before use_table): it belongs to one of their ``backends``
    (``max_autotune_gemm_backends``, e.g. "ATEN,TRITON": ``aten::*`` to ATEN, every other template
    use_table lets Inductor offer, ``triton::*`` and ``decompose_k``, to TRITON), and a template
    ``triton.enable_persistent_tma_matmul`` gates only where they had it on. A table's TMA entry turns
    it on, which in torch 2.13 also offers ``triton::blackwell_ws_persistent_device_tma``, scaled_mm's
    ``scaled_mm_device_tma_*`` and on ROCm ``triton::mm_persistent`` (kernel/mm.py; ``use_triton_tma_template``
    in utils.py): a helper found the Blackwell one offered on a miss of a B200; any ``triton::`` uid naming
    TMA counts."""
    names = {b.strip().upper() for b in user["backends"].split(",")}
    tma = uid == "triton::mm_persistent" or (uid.startswith("triton::") and "tma" in uid)
    return ("ATEN" if uid.startswith("aten::") else "TRITON") in names and (user["persistent_tma"] or not tma)


def stale_reason(entry: dict[str, Any], template_hashes: dict[str, str | None]) -> str | None:
    """Why an entry is stale for the templates Inductor offers (uid -> ``src_hash``), or None.

    Stale: the entry carries a ``template_hash`` and the offered template's source hash differs (the
    template's code changed since the table was made). Entries without a hash, and templates without
    one (ATen kernels), are never stale; ``lookup_table.check_src_hash=False`` turns the check off,
    as it does in Inductor (torch/_inductor/lookup_table/choices.py ``_entry_is_valid``).
    """
    tid = entry["template_id"]
    want, have = entry.get("template_hash"), template_hashes.get(tid)
    if want and have and want != have and inductor_config.lookup_table.check_src_hash:
        return f"template_hash of {tid} is {want}, this torch's template has {have}"
    return None
