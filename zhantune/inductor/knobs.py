"""The tuning knobs a lookup table, a search space or a merged database may set: an allow-list.

A table travels with a model and may come from someone else's database, so it is data, never code:
an Inductor config key such as ``cpp.march`` or ``cpp.cxx`` reaches the C++ compiler's command line,
and a string template kwarg such as ``ACC_TYPE`` is pasted into the Triton kernel's Python source.
Only the knobs below are accepted, each with a checked type and range; anything else is refused
with one line naming where it came from and what is allowed.

- **Config patches** (``zhantune::config`` entries, ``scope: config`` space branches), per device
  kind: on CPU the C++ GEMM template's knobs (``max_autotune_gemm_backends``: ATEN or CPP, one,
  ``cpp.gemm_max_k_slices``, ``cpp.gemm_thread_factors``, ``cpp.gemm_cache_blocking``); on CUDA the
  backend (ATEN or TRITON); on both, the fusion limits the shipped ``fusion`` space tunes. Key
  names and meanings from torch/_inductor/config.py.
- **Template kwargs** (lookup-table entries), per template: on ``triton::*`` the tuned config
  (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``) and ``EVEN_K``;
  on ``decompose_k`` ``k_split``; on ``aten::*`` and any other template nothing. Inductor merges an
  entry over its first heuristic config's kwargs (torch/_inductor/lookup_table/choices.py), which
  hold what it derives from the inputs, the device and the op (``ACC_TYPE``, ``USE_FAST_ACCUM``,
  ``A_ROW_MAJOR``, ``NUM_SMS``, ``TMA_SIZE``, ``TMA_EXPERIMENTAL_API``, ...;
  template_heuristics/triton.py), and passes ``ALLOW_TF32`` beside them (``extra_kwargs``): an entry
  that sets one of those overrides a derived value with one that may be wrong here, or repeats
  ``ALLOW_TF32`` (a TypeError that fails the compile); a kwarg on an ATen entry reaches the ATen
  call (``torch.mm(..., BLOCK_M=64)``, a TypeError at run time).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from zhantune.errors import shown

__all__ = ["DEVICE_KINDS", "CONFIG_KNOBS", "FUSION_KNOBS", "TEMPLATE_KWARGS", "BACKEND_FLAGS", "config_knob_problem",
           "triton_resources_problem", "key_inputs", "TRITON_REQUIRED", "MAX_ACCUMULATORS", "MAX_TILE_NUMEL", "MAX_TABLE_WARPS",
           "config_patch_problem", "template_entry_problem", "stored_params_problem", "allowed_config_keys",
           "template_kwargs", "TRITON_KWARGS"]

DEVICE_KINDS = ("cpu", "cuda")
# matched whole (fullmatch: ``$`` would let a trailing newline through) and ASCII only (``\d``, ``\w``
# would take other scripts' digits and letters, "١,٢,٣")
_TEMPLATE_ID = re.compile(r"[A-Za-z_][\w:.]{0,127}", re.ASCII)
_HASH = re.compile(r"[0-9A-Za-z_]{1,128}", re.ASCII)
_TRIPLE = re.compile(r"\d{1,4},\d{1,4},\d{1,4}", re.ASCII)

Check = Callable[[Any], str | None]


def _int(low: int, high: int, none_ok: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None and none_ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            return f"an integer in [{low}, {high}]" + (" or null" if none_ok else "")
        return None
    return check


def _one_of(values: tuple[Any, ...]) -> Check:
    def check(v: Any) -> str | None:
        if type(v) is not type(values[0]) or v not in values:  # 4.0 == 4, and True == 1, in Python
            return "one of " + ", ".join(map(repr, values))
        return None
    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


_BACKENDS = re.compile(r"[A-Za-z]+(?: *, *[A-Za-z]+)*")


def _backends(allowed: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        # ASCII letters, commas and spaces beside them (Inductor strips each part: torch/_inductor/
        # utils.py): "trıton" (dotless i) upper-cases to TRITON, and a newline or an em space would
        # reach Inductor's config with the value
        parts = v.upper().split(",") if isinstance(v, str) and len(v) <= 64 and _BACKENDS.fullmatch(v) else None
        # one backend (a list of it, "ATEN, aten", is the same): a table entry or a candidate is one
        # kernel, and "ATEN,CPP" would make the user's compile autotune between the two
        if not parts or any(p.strip(" ") not in allowed for p in parts) or len({p.strip(" ") for p in parts}) > 1:
            return f"one of {', '.join(allowed)} (one backend)"
        return None
    return check


def _triple(v: Any) -> str | None:
    """Thread factors / cache blocking: null (Inductor chooses) or "a,b,c" of positive integers."""
    if v is None or (isinstance(v, str) and _TRIPLE.fullmatch(v) and all(int(x) > 0 for x in v.split(","))):
        return None
    return 'null or a string "a,b,c" of three positive integers'


#: Inductor's fusion limits, tuned by the shipped ``fusion`` space on both device kinds
_FUSION_KNOBS: dict[str, Check] = {
    "epilogue_fusion": _bool,
    "max_fusion_size": _int(1, 4096),
    "max_fusion_unique_io_buffers": _int(1, 4096, none_ok=True),
    "max_epilogue_benchmarked_choices": _int(1, 64),
}

#: the fusion limits' keys: Inductor reads them when it schedules the whole graph (torch/_inductor/
#: scheduler.py, choices.py: can_fuse), after every GEMM's lowering, so a per-GEMM table entry cannot
#: apply them (zhantune.inductor.table.not_carried); a compile-wide setting, on both device kinds
FUSION_KNOBS = frozenset(_FUSION_KNOBS)

#: device kind -> Inductor config key -> value check
CONFIG_KNOBS: dict[str, dict[str, Check]] = {
    "cpu": {
        "max_autotune_gemm_backends": _backends(("ATEN", "CPP")),
        "cpp.gemm_max_k_slices": _int(0, 4096),
        "cpp.gemm_thread_factors": _triple,
        "cpp.gemm_cache_blocking": _triple,
        **_FUSION_KNOBS,
    },
    "cuda": {
        "max_autotune_gemm_backends": _backends(("ATEN", "TRITON")),
        **_FUSION_KNOBS,
    },
}

#: torch.backends flags a ``scope: backend`` branch may set (CUDA; booleans); never a table entry
BACKEND_FLAGS = frozenset({
    "cuda.matmul.allow_tf32",
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
})

#: template kwarg -> value check (a lookup-table entry's keys besides template_id and template_hash)
TEMPLATE_KWARGS: dict[str, Check] = {
    # block sizes are tl.arange extents: powers of two (48 passed and failed the user's compile);
    # BLOCK_K's least for tl.dot depends on the dtype (key_entry_problem)
    **{k: _one_of(tuple(1 << i for i in range(13))) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")},
    "GROUP_M": _int(1, 1024),
    # (a table entry: at most 8, triton_resources_problem; a stored row or a custom space may have more)
    "num_warps": _one_of((1, 2, 4, 8, 16, 32)),
    "num_stages": _int(0, 32),
    "k_split": _int(1, 1 << 20),
    "EVEN_K": _bool,
}

#: the kwargs a ``triton::*`` entry may set: the tuned config and EVEN_K (module docstring)
TRITON_KWARGS = frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "EVEN_K"})


def template_kwargs(template_id: str) -> frozenset[str]:
    """The kwargs an entry of this template may set (module docstring): ``triton::*``
    TRITON_KWARGS, ``decompose_k`` ``k_split``, any other template none."""
    if template_id.startswith("triton::"):
        return TRITON_KWARGS
    return frozenset({"k_split"}) if template_id == "decompose_k" else frozenset()


def allowed_config_keys(device_kind: str | None) -> list[str]:
    """The config keys a patch may set on this device kind (None: on any kind), sorted."""
    kinds = DEVICE_KINDS if device_kind is None else (device_kind,)
    return sorted({k for kind in kinds for k in CONFIG_KNOBS.get(kind, {})})


def config_knob_problem(key: str, value: Any, device_kind: str | None) -> str | None:
    """Why ``key = value`` is not an allowed config knob on ``device_kind`` (None: any kind), or None."""
    kinds = DEVICE_KINDS if device_kind is None else (device_kind,)
    checks = [CONFIG_KNOBS[k][key] for k in kinds if key in CONFIG_KNOBS.get(k, {})]
    if not checks:
        where = f"on {device_kind}" if device_kind else "in a table"
        return f"{shown(key)} is not a tuning knob zhantune allows {where}; allowed: " + \
            ", ".join(allowed_config_keys(device_kind))
    wants = [c(value) for c in checks]
    if all(w is not None for w in wants):
        return f"{key}={shown(value)} is not allowed; expected {wants[0]}"
    return None


def config_patch_problem(patch: Any, device_kind: str | None) -> tuple[str, str] | None:
    """(key, why) for the first disallowed entry of a config patch, or None when all are allowed."""
    if not isinstance(patch, dict):
        return "", f"expected an object of config key -> value, got {type(patch).__name__}"
    for key, value in patch.items():
        why = config_knob_problem(str(key), value, device_kind)
        if why:
            return str(key), why
    return None


def template_entry_problem(entry: dict[str, Any]) -> tuple[str, str] | None:
    """(key, why) for the first disallowed key or value of a template entry, or None.

    ``template_id`` must look like an Inductor template uid (``triton::mm``, ``decompose_k``),
    ``template_hash`` a hash string, and every other key a kwarg this template's entries may set
    (:func:`template_kwargs`) with a value TEMPLATE_KWARGS allows.
    """
    tid = entry.get("template_id")
    if not isinstance(tid, str) or not _TEMPLATE_ID.fullmatch(tid):
        return "template_id", f"{shown(tid)} is not an Inductor template uid (e.g. 'triton::mm', 'decompose_k')"
    for key, value in entry.items():
        if key == "template_id":
            continue
        if key == "template_hash":
            if value is not None and not (isinstance(value, str) and _HASH.fullmatch(value)):
                return key, "expected a hash string of letters and digits"
            continue
        allowed = template_kwargs(tid)
        if key not in allowed:
            return key, (f"{shown(key)} is not a kwarg zhantune allows in a {tid} entry (Inductor derives the "
                         "others from the inputs and the device); allowed: " + (", ".join(sorted(allowed)) or "none"))
        why = TEMPLATE_KWARGS[key](value)
        if why:
            return key, f"{key}={shown(value)} is not allowed; expected {why}"
    if "EVEN_K" in entry and "BLOCK_K" not in entry:
        # Inductor merges an entry over its first heuristic config: this EVEN_K would then describe
        # another config's BLOCK_K (True there: the K loop reads past K unmasked)
        return "EVEN_K", "EVEN_K is K % BLOCK_K == 0 of the entry's own BLOCK_K: an entry that sets it sets BLOCK_K"
    return None


def stored_params_problem(template_id: str | None, params: Any, device_kind: str | None) -> tuple[str, str] | None:
    """(key, why) when a stored measurement's params set anything a tune could not have stored:
    a template row's kwargs as :func:`template_entry_problem`; a config row's keys as
    :func:`config_knob_problem`, or CUDA backend flags (BACKEND_FLAGS) with boolean values."""
    if not isinstance(params, dict):
        return "", f"expected an object, got {type(params).__name__}"
    if template_id is not None:
        return template_entry_problem({"template_id": template_id, **params})
    for key, value in params.items():
        if key in BACKEND_FLAGS and device_kind in (None, "cuda"):
            why = _bool(value)
            if why:
                return key, f"{key}={shown(value)} is not allowed; expected {why}"
            continue
        why = config_knob_problem(str(key), value, device_kind)
        if why:
            return str(key), why
    return None


#: the ops whose lookup key's last two inputs are the GEMM's operands, [..., M, K] and [..., K, N]
_OPERANDS_LAST = ("mm", "addmm", "bmm", "baddbmm", "int_mm")
_INPUT = re.compile(r"\(torch\.(\w+), \[([\d, ]*)\], \[[\d, ]*\]\)")
#: the least K of tl.dot on NVIDIA GPUs by operand bytes (Triton's ``min_dot_size``,
#: triton/backends/nvidia/compiler.py: 8-bit 32, 16-bit 16, 32-bit 8; AMD's is 1)
_MIN_DOT_K = {1: 32, 2: 16, 4: 8}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}


#: the kwargs that decide a Triton kernel's resources (registers, shared memory); one an entry leaves
#: out Inductor fills from its template's first heuristic config (torch/_inductor/lookup_table/
#: choices.py), so they are checked on the merged kwargs when the lookup is made
#: (zhantune.inductor.cuda_entries.resources_stale: a 1024 BLOCK_K with Inductor's 32x32 tiles
#: needed 393,216 bytes of shared memory on an A100)
TRITON_REQUIRED = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
#: fp32 accumulators per thread a Triton entry may have (BLOCK_M * BLOCK_N over num_warps x 32): the
#: most Inductor's own configs reach (its exhaustive search's 64x256 on 2 warps, scaled_mm's 256x128
#: on 4, ROCm's 256x256 on 8; the Triton spaces keep 128); 1024x1024 tiles on 4 warps compiled for
#: minutes and ran out of memory
MAX_ACCUMULATORS = 256
#: warps a Triton table entry may have: no zhantune space and no Inductor GEMM config uses more
MAX_TABLE_WARPS = 8
#: elements a Triton tensor may have (triton.language TRITON_MAX_TENSOR_NUMEL): a larger tile fails
#: the compile ("numel exceeds triton maximum tensor numel")
MAX_TILE_NUMEL = 1 << 20


def triton_resources_problem(entry: dict[str, Any]) -> tuple[str, str] | None:
    """(key, why) where a ``triton::*`` table entry's tiles or warps are more than a kernel can hold
    (:data:`MAX_TABLE_WARPS`, :data:`MAX_ACCUMULATORS`, :data:`MAX_TILE_NUMEL`; 2 warps on a TMA template), else None (also where it leaves a kwarg of
    the bound out: checked when the lookup is made, on the kwargs Inductor merges). Checked at load
    and by the export, which skips such a config (zhantune.inductor.table.entry_problem); never on a
    stored measurement's params (a space of 2026-11-24 measured 256x256 tiles on 4 warps)."""
    bm, bn, bk, warps = (entry.get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"))
    if type(warps) is int and warps > MAX_TABLE_WARPS:
        return "num_warps", (f"num_warps={warps} is more than a table entry may have ({MAX_TABLE_WARPS}: 16 and 32 "
                             "failed ptxas on sm_90 for 16-bit tiles, and took Triton's epilogue past shared memory)")
    if warps == 2 and "tma" in str(entry.get("template_id", "")):  # a review's finding: an entry bypassed that filter
        return "num_warps", ("num_warps=2 on a TMA template: Inductor's own configs leave it out as not safe for TMA "
                             "(torch/_inductor/template_heuristics/triton.py)")
    if not all(type(v) is int and v > 0 for v in (bm, bn, bk, warps)):
        return None  # left out (merged later), or the value checks name it
    threads = warps * 32
    if bm * bn > MAX_ACCUMULATORS * threads:
        return "BLOCK_M", (f"BLOCK_M x BLOCK_N = {bm} x {bn} accumulators on num_warps={warps} ({threads} threads) is "
                           f"{bm * bn // threads} per thread, more than {MAX_ACCUMULATORS} (registers spill; Triton's "
                           "compile ran for minutes)")
    if max(bm, bn) * bk > MAX_TILE_NUMEL:
        return "BLOCK_K", (f"BLOCK_K={bk} with BLOCK_M={bm}, BLOCK_N={bn} makes a tile of more than {MAX_TILE_NUMEL:,} "
                           "elements, Triton's most (the compile fails)")
    return None


def key_inputs(inputs: str) -> list[tuple[str, list[int]]]:
    """(dtype, sizes) of each input of a lookup key's inputs part (zhantune.inductor.table.parse_key's
    ``inputs``), e.g. ("float32", [32, 64]); an input whose sizes are not all numbers is left out."""
    return [(m.group(1), [int(v) for v in m.group(2).split(",") if v.strip()]) for m in _INPUT.finditer(inputs)]


def key_entry_problem(entry: dict[str, Any], inputs: str, op: str, amd: bool = False) -> tuple[str, str] | None:
    """(key, why) when an allow-listed template entry cannot be right for its lookup key's sizes
    (``inputs``, ``op``: the parts zhantune.inductor.table.parse_key splits off), or None.

    K is the key's: its first operand's last size (a dynamic K's size hint). A ``triton::*`` entry's
    BLOCK_K is at least tl.dot's least K for the operands' dtype on NVIDIA (16 for a dtype or op not
    known here; ``amd``: a key of an AMD GPU, where it is 1): BLOCK_K=8 of a bfloat16 entry failed
    Triton's compile. A TMA template's blocks hold at least 16 bytes in each dimension (Triton's
    descriptor minimum; BLOCK_N=4 of bfloat16 failed). A ``triton::*`` entry
    whose BLOCK_K does not divide K may not say ``EVEN_K: true`` (the K loop reads past K unmasked:
    wrong results). Without EVEN_K, zhantune.use_table derives it (false), and export writes false,
    but stock Inductor merges its first heuristic config's (torch/_inductor/lookup_table/choices.py),
    possibly true (a table zhantune exported before it wrote EVEN_K loads for use_table). A ``decompose_k``
    entry's ``k_split`` must divide K (Inductor reshapes K into k_split slices: the compile fails)."""
    found = key_inputs(inputs)
    tid = entry.get("template_id", "")
    dtype = found[-2][0] if len(found) >= 2 else found[0][0] if found else "an unknown dtype"
    nbytes = _DTYPE_BYTES.get(dtype)
    blocks = {b: entry[b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if isinstance(entry.get(b), int)}
    least = 1 if amd else _MIN_DOT_K.get(nbytes or 0, 16)  # an op or dtype not known here: 16
    if tid.startswith("triton::") and blocks.get("BLOCK_K", least) < least:
        return "BLOCK_K", (f"BLOCK_K={blocks['BLOCK_K']} is below {least}, the least K of Triton's tl.dot for {dtype} "
                           "on an NVIDIA GPU (the compile fails)")
    if "tma" in tid and (small := next((b for b, v in blocks.items() if v * (nbytes or 1) < 16), None)):
        return small, (f"{small}={blocks[small]} gives a TMA block of {blocks[small] * (nbytes or 1)} bytes in a "
                       f"dimension for {dtype}; Triton's TMA descriptors need at least 16 (the compile fails)")
    if op not in _OPERANDS_LAST or len(found) < 2 or len(found[-2][1]) < 2:
        return None
    k = found[-2][1][-1]
    if tid.startswith("triton::") and isinstance(entry.get("BLOCK_K"), int) and entry["BLOCK_K"] > 0 \
            and k % entry["BLOCK_K"] and entry.get("EVEN_K") is True:
        return "EVEN_K", (f"EVEN_K=true is wrong for K={k} (the key's), no multiple of BLOCK_K={entry['BLOCK_K']}: "
                          "the K loop would read past K unmasked (wrong results); expected false")
    if tid == "decompose_k" and isinstance(entry.get("k_split"), int) and entry["k_split"] > 0 and k % entry["k_split"]:
        return "k_split", (f"k_split={entry['k_split']} does not divide K={k} (the key's): decomposeK splits K "
                           "into k_split equal slices, and the compile fails")
    return None
