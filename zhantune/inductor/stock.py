"""What stock Inductor does with a zhantune table, where it differs from zhantune.use_table: the
notes ``python -m zhantune.export format=inductor`` prints (:func:`stock_inductor_notes`)."""

from __future__ import annotations

from typing import Any

from zhantune.inductor.table import CONFIG_TEMPLATE_ID, parse_key

__all__ = ["stock_inductor_notes"]


def stock_inductor_notes(table: dict[str, list[dict[str, Any]]], device_kind: str | None = None) -> list[str]:
    """What stock Inductor (its own ``LookupTableChoices`` with ``lookup_table.table`` set) does
    differently from :func:`zhantune.use_table` with this table, one sentence per kind of key found
    (empty: stock Inductor compiles every key's entries as zhantune does). Stock Inductor applies
    mm and addmm entries only under max-autotune (``max_autotune`` or ``max_autotune_gemm``); it
    reads bmm keys without it too (``tuned_bmm`` offers its template regardless,
    torch/_inductor/kernel/bmm.py), and a Triton entry there then has no heuristic config to merge
    over and is dropped, which leaves the lowering no choice: the compile fails
    (NoValidChoicesError). It offers the persistent TMA template only with
    ``triton.enable_persistent_tma_matmul`` (use_table sets it). An empty list is a miss to it (Inductor's default choices for that
    lookup); it makes no lookup on CPU. Its key holds no precision: a float32 key's template entry
    compiles as a TF32 kernel in a process with TF32 on (``ALLOW_TF32`` from
    ``torch.backends.cuda.matmul.fp32_precision`` at lowering, template_heuristics/triton.py), a
    kernel no measurement covered (use_table compiles the default there). Checked against stock
    Inductor's own handler in tests/test_cuda_paths.py. ``device_kind`` "cpu" (every key's device
    is a CPU): that one note."""
    if device_kind == "cpu" and table:
        return [f"{len(table)} CPU key(s): stock Inductor makes no lookup on CPU; they apply through "
                "zhantune.use_table only"]
    counts = {"addmm_template": 0, "addmm_default": 0, "config": 0, "bmm_template": 0, "mm_template": 0, "tma": 0,
              "float32": 0}
    for key, entries in table.items():
        ids = [e.get("template_id") for e in entries]
        parsed = parse_key(key)
        counts["float32"] += bool(parsed and "torch.float32" in (parsed.get("inputs") or "")
                                  and any(not str(i).startswith(("aten::", CONFIG_TEMPLATE_ID)) for i in ids))
        if key.endswith(("+mm", "+addmm")) and any(not str(i).startswith(("aten::", CONFIG_TEMPLATE_ID)) for i in ids):
            counts["mm_template"] += 1
        counts["tma"] += "triton::mm_persistent_tma" in ids
        if key.endswith("+bmm") and any(str(i).startswith("triton::") for i in ids):
            counts["bmm_template"] += 1
        if CONFIG_TEMPLATE_ID in ids:
            counts["config"] += 1
        elif key.endswith("+addmm") and ids and all(i.startswith("aten::") for i in ids):
            counts["addmm_default"] += 1
        elif key.endswith("+addmm") and ids:
            counts["addmm_template"] += 1
    return [f"{counts[kind]} {text}" for kind, text in _NOTES if counts[kind]]


#: (kind of key, the note after its count): what stock Inductor does with such keys (see above)
_NOTES = (
    ("addmm_template", "addmm template key(s): stock Inductor also keeps ATen's addmm (its separate 1-D-bias lookup "
                       "reads [] as a miss) and autotunes it against the entry when compiling"),
    ("addmm_default", "addmm default key(s): stock Inductor's template lookup (expanded bias) misses, so max-autotune "
                      "also tries Inductor's own Triton configs"),
    ("bmm_template", "bmm key(s) with a Triton entry: stock Inductor reads bmm keys without max-autotune too, finds no "
                     "config to merge the entry over and fails the compile (NoValidChoicesError): compile with "
                     "max_autotune_gemm=True"),
    ("mm_template", "mm/addmm key(s) with a template entry: stock Inductor reads them only under max-autotune "
                    "(max_autotune or max_autotune_gemm) and compiles its default without it"),
    ("tma", "key(s) with a triton::mm_persistent_tma entry: stock Inductor offers that template only with "
            "torch._inductor.config.triton.enable_persistent_tma_matmul = True; without it the entry is dropped and "
            "max-autotune tries Inductor's own Triton configs"),
    ("config", f"CPU key(s) ({CONFIG_TEMPLATE_ID} entries): stock Inductor makes no lookup on CPU; they apply through "
               "zhantune.use_table only"),
    ("float32", "float32 key(s) with a template entry: they were measured without TF32, and stock Inductor compiles "
                "them as TF32 kernels, which no measurement covered, in a process with TF32 on "
                "(torch.backends.cuda.matmul.fp32_precision 'tf32', e.g. after "
                "torch.set_float32_matmul_precision('high')); zhantune.use_table compiles Inductor's default there"),
)
