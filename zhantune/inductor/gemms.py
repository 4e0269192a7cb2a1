"""A model's GEMMs, as Inductor sees them: compile the model once under a recording choices handler
and turn each distinct GEMM lookup into a problem to tune (``python -m zhantune.collect``).

Every GEMM lowering asks the handler (zhantune.inductor.choices.RecordingChoices) for its
lookup-table entries, so the keys are Inductor's own. On CPU the compile is the inference compile a
user gets (``freezing=True``, oneDNN on; zhantune.inductor.settings): a GEMM that Inductor's freezing
pass prepacks makes no lookup, and the CPU lowering hook (zhantune.inductor.cpu_gemm) reports it
with Inductor's own key, the one a CPU table is looked up with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zhantune.inductor.epilogue import modelled_activation

__all__ = ["CollectedProblem", "collect", "epilogue_note", "problem_from_event"]


@dataclass
class CollectedProblem:
    """One distinct GEMM lookup of a model: the problem to tune, or why it cannot be tuned."""

    lookup_key: str
    op_name: str
    inputs: list[list[Any]]
    scalars: dict[str, Any]
    count: int
    problem: Any = None  # GemmProblem, or None when not tunable
    reason: str | None = None
    default_us: float | None = None
    share: float | None = None
    #: what the tuned problem leaves out of what the model runs (an epilogue linear_act does not
    #: model, GEMMs of one key with different epilogues), or None
    note: str | None = None


def problem_from_event(event: Any, dtype_names: dict[str, str]) -> tuple[Any, str | None]:
    """:func:`_problem_of`'s problem, or where it is one but the GEMM's second operand is computed at
    run time on CPU (``event.runtime_mat2``), (None, why): a CPU tune measures it on a frozen constant;
    so for a CPU bmm whose output is used more than once (``event.shared_output``): no C++ BMM entry
    compiles there."""
    problem, why = _problem_of(event, dtype_names)
    if problem is not None and getattr(event, "runtime_mat2", False):  # a helper's: tuned, never applied
        op = event.op_name
        return None, (f"{op} whose second operand is computed at run time (e.g. attention's keys or values): a CPU "
                      f"tune measures the C++ {'BMM ' if op == 'bmm' else ''}template on a frozen constant one, "
                      "which Inductor needs for it, so its entry cannot apply here (Inductor's default compiles it)")
    if problem is not None and getattr(event, "shared_output", False):
        return None, ("bmm whose output is used more than once here: Inductor's C++ BMM template fails to compile "
                      "with an epilogue fused and another use of its output (torch 2.13), so no tuned entry applies "
                      "(Inductor's default compiles it)")
    return problem, why


def _problem_of(event: Any, dtype_names: dict[str, str]) -> tuple[Any, str | None]:
    """The GemmProblem whose own compile makes the same lookup key, or (None, why not).

    Tunable: mm / addmm with a contiguous [M, K] activation and a [K, N] weight stored row-major
    ("kn") or as nn.Linear's [N, K] transposed ("nk"), addmm with a [N] bias and alpha = beta = 1;
    bmm with contiguous [B, M, K] and [B, K, N]. An addmm whose output feeds relu or (exact) gelu
    alone, or an mm whose output gets a 1-D bias and then one of them (a GPU's float32 addmm, unfused
    by Inductor's post-grad pass: the lookup is "mm"), is linear_act with that activation
    (``event.epilogue``, zhantune.inductor.epilogue): its own compile makes the same lookup and
    fuses the same epilogue (GemmProblem.lookup_op_on).
    """
    from zhantune.problems import GemmProblem

    ins = event.inputs
    dtypes = {d for d, _, _ in ins}
    if len(dtypes) != 1 or next(iter(dtypes)) not in dtype_names:
        return None, f"input dtypes {sorted(dtypes)} (tunable: one of {sorted(dtype_names)})"
    dtype = dtype_names[next(iter(dtypes))]
    scalars = dict(event.scalars)
    op = event.op_name
    if op == "bmm" and len(ins) == 2:
        (_, (b, m, k), s1), (_, (b2, k2, n), s2) = ins
        if b == b2 and k == k2 and list(s1) == [m * k, k, 1] and list(s2) == [k * n, n, 1]:
            return GemmProblem("bmm", (b, m, n, k), dtype), None
        return None, "bmm operands are not contiguous [B, M, K] and [B, K, N]"
    if op == "mm" and len(ins) == 2:
        x, w = ins
        bias = None
    elif op == "addmm" and len(ins) == 3:
        bias, x, w = ins
        # the integer 1: Inductor writes the scalars into the lookup key as text (lookup_table/choices.py),
        # so alpha=1.0 makes a key ("alpha=1.0&beta=1.0") that a problem's own compile (1) never does
        if scalars and any(type(scalars.get(name, 1)) is not int or scalars.get(name, 1) != 1 for name in ("alpha", "beta")):
            return None, f"addmm with alpha/beta {scalars} (tunable: the integers 1 and 1)"
    else:
        return None, f"op {op} with {len(ins)} inputs is not a GEMM zhantune tunes"
    (_, (m, k), sx), (_, (k2, n), sw) = x, w
    if k != k2 or list(sx) != [k, 1]:
        return None, f"activation [M, K] with strides {list(sx)} (tunable: contiguous)"
    if list(sw) == [n, 1]:
        layout = "kn"
    elif list(sw) == [1, k]:
        layout = "nk"
    else:
        return None, f"weight [K, N] with strides {list(sw)} (tunable: [N, 1] or [1, K])"
    if bias is not None and (list(bias[1]) != [n] or list(bias[2]) != [1]):
        return None, f"addmm bias of size {list(bias[1])} (tunable: [N])"
    if act := modelled_activation(event):  # an addmm's (bias is not None here), or an unfused one's
        return GemmProblem("linear_act", (m, n, k), dtype, activation=act, weight_layout=layout), None
    return GemmProblem(op, (m, n, k), dtype, weight_layout=layout), None


def epilogue_note(problem: Any, epilogues: list[Any]) -> str | None:
    """What a collected problem's tune leaves out of what the model runs, given the epilogues of
    every GEMM of its key (first first), or None: an epilogue linear_act does not model, or GEMMs of
    one key with different epilogues (one table entry per key; the first is tuned)."""
    if problem is None:
        return None
    kinds = list(dict.fromkeys(e.describe() for e in epilogues))
    if len(kinds) > 1:
        served = ("which use_table serves to the GEMMs of that activation (Inductor's default, reported stale, to "
                  "the others)" if len({e.activation for e in epilogues}) > 1 else "which use_table serves to them all")
        return (f"{len(epilogues)} GEMMs of this key feed different epilogues ({', '.join(kinds)}); a table holds "
                f"one entry per key: tuned as the first ({kinds[0]}), {served}")
    first = epilogues[0]
    if problem.op == "linear_act":
        return None
    if first.hand_bias:
        then = f", then {first.other}" if first.other else ""
        return (f"a 1-D tensor is added to its output by the model's own add{then}, which linear_act does not "
                f"model (its lookup is an addmm's on CPU): tuned as {problem.op} without {'them' if then else 'it'}")
    if first.activation:  # an mm without a bias (linear_act has one), or a bmm (linear_act is 2-D)
        after = "a bias" if problem.op == "mm" else "a Linear's addmm"
        return (f"its output feeds {first.activation}, which linear_act models only after {after}: tuned as "
                f"{problem.op} without it")
    if first.other:
        return (f"its output feeds {first.other}, which linear_act does not model (relu, gelu): tuned as "
                f"{problem.op} without it")
    if first.bias_added:
        return f"a bias is added to its output after it (an unfused addmm): tuned as {problem.op} without it"
    return None


def dtype_names() -> dict[str, str]:
    """A lookup's dtype as its event records it ("float32", "bfloat16") -> zhantune's dtype name, for
    :func:`problem_from_event` (collect's and use_table's report)."""
    from zhantune.problems import DTYPES

    return {str(t).removeprefix("torch."): name for name, t in DTYPES.items()}


def collect(model: Any, inputs: tuple, device: Any) -> list[CollectedProblem]:
    """Compile ``model`` on ``device`` (a DeviceInfo) with Inductor's defaults and return its GEMM
    problems, one per distinct lookup key, in first-seen order."""
    import torch
    from torch._inductor import config as inductor_config

    from zhantune.inductor.choices import recording
    from zhantune.inductor.settings import CPU_BASE_PATCH, CUDA_BASE_PATCH

    names = dtype_names()
    patch = CPU_BASE_PATCH if device.kind == "cpu" else CUDA_BASE_PATCH
    torch._dynamo.reset()
    with torch.no_grad(), recording() as rec, inductor_config.patch(patch):
        torch.compile(model, fullgraph=False)(*inputs)
    found: dict[str, CollectedProblem] = {}
    epilogues: dict[str, list[Any]] = {}
    for e in rec.events:
        if not e.offered:  # a pass with nothing to choose (addmm's expanded-bias pass)
            continue
        key = e.agnostic_key or e.device_key
        epilogues.setdefault(key, []).append(e.epilogue)
        problem, reason = problem_from_event(e, names)
        if key in found:
            found[key].count += 1
            if found[key].problem is None and problem is not None:  # tunable where any of its GEMMs is (a review's:
                found[key].problem, found[key].reason = problem, reason  # a run-time operand's GEMM came first)
            continue
        found[key] = CollectedProblem(key, e.op_name, [[d, list(s), list(st)] for d, s, st in e.inputs],
                                      dict(e.scalars), 1, problem, reason)
    for key, p in found.items():
        p.note = epilogue_note(p.problem, epilogues[key])
    return list(found.values())
