"""What a GEMM's output feeds in the graph Inductor lowers: the activation of a Linear + activation,
so that ``python -m zhantune.collect`` lists it as ``linear_act`` (a problem whose own compile makes
the same lookup and fuses the same epilogue) rather than as the bare GEMM, whose tune would measure
neither the activation nor its fusion. A helper's check found the bare GEMM tuned for the MLP's
Linear + GELU: with the table the model ran the C++ template with GELU in its epilogue, the tune had
timed the template without it against the default without the separate GELU pass.

Read from the post-grad FX graph while the GEMM is lowered (``V.graph.current_node``,
torch/_inductor/graph.py ``run_node``). By then Inductor has decomposed the activation (GELU into
mul, erf, add: torch/_decomp), and each node it made keeps the ATen op it came from in
``meta["original_aten"]`` (torch/fx/experimental/proxy_tensor.py); a GPU's float32 addmm whose uses
are all pointwise is an mm plus a bias add by then (``unfuse_bias_add_to_pointwise``,
torch/_inductor/fx_passes/post_grad.py), and the add's node comes from the addmm.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Epilogue", "epilogue_of"]

#: activations named in a note when the GEMM's output feeds one of them alone and linear_act does
#: not model it (its ACTIVATIONS: relu, exact gelu); the ATen op names (``aten.<name>.default``)
NOTED = ("silu", "sigmoid", "tanh", "gelu", "hardswish", "hardsigmoid", "leaky_relu", "elu", "mish",
         "hardtanh", "softplus", "relu")


#: ops that only view a GEMM's output in another shape on its way to the activation
VIEWS = ("view", "reshape", "_unsafe_view")


@dataclass(frozen=True)
class Epilogue:
    """What one GEMM's output feeds.

    ``activation``: "relu" or "gelu" (exact) when the output, with a bias added where the GPU's
    post-grad pass unfused an addmm, feeds that activation and nothing else: linear_act's epilogue
    (zhantune.request.ACTIVATIONS). ``bias_added``: the output of an mm gets a 1-D bias added after it
    (an unfused addmm). ``other``: the activation it feeds alone that linear_act does not model
    ("silu", "gelu (tanh)"), else None.
    """

    activation: str | None = None
    bias_added: bool = False
    other: str | None = None

    def describe(self) -> str:
        """One phrase: "gelu", "bias + relu", "silu", or "none"."""
        act = self.activation or self.other
        parts = (["bias"] if self.bias_added else []) + ([act] if act else [])
        return " + ".join(parts) or "none"


def _origin(node: Any) -> str | None:
    """The ATen op a post-grad node came from (its name: "gelu", "relu", "addmm"), or None."""
    op = node.meta.get("original_aten")
    name = getattr(op, "_opname", None) if op is not None else None
    return name if isinstance(name, str) else None


def _target(node: Any) -> str:
    """A call_function node's op name ("mm", "add", "erf", "_mkl_linear"), else ""."""
    name = getattr(node.target, "_opname", None) if node.op == "call_function" else None
    return name if isinstance(name, str) else ""


def _source(node: Any) -> frozenset[str]:
    """The names of the nodes of the graph before decomposition that ``node`` was made from
    (``meta["from_node"]``: "gelu", "gelu_1": one per call), empty where not recorded."""
    return frozenset(getattr(s, "name", "") for s in node.meta.get("from_node") or ())


def _bias_add(gemm: Any) -> Any:
    """The node adding a 1-D bias to an mm's output when the GPU's post-grad pass unfused an addmm
    (its only use, an ``add`` that came from an addmm), else None."""
    users = list(gemm.users)
    if _target(gemm) != "mm" or len(users) != 1:
        return None
    add = users[0]
    if _target(add) != "add" or _origin(add) != "addmm" or len(add.args) != 2:
        return None
    other = add.args[1] if add.args[0] is gemm else add.args[0]
    val = getattr(other, "meta", {}).get("val")
    return add if val is not None and getattr(val, "dim", lambda: 0)() == 1 else None


def _through_views(node: Any) -> Any:
    """The last of a chain of views that is ``node``'s only use, each the next one's (a Linear on
    [B, S, D] is an addmm on [B*S, D] viewed back as [B, S, N] before its activation), else ``node``."""
    while len(node.users) == 1 and _target(user := next(iter(node.users))) in VIEWS and \
            getattr(user.target, "_overloadname", None) == "default":  # not view.dtype: a reinterpretation
        node = user
    return node


def _region(starts: list[Any], origin: str) -> list[Any]:
    """The nodes reachable from ``starts`` that came from the ATen op ``origin`` and from the same
    call (:func:`_source`: one activation's decomposition; a second GELU after the first is another
    call, a helper's attack found its tanh taken for the first's)."""
    seen, queue = {id(n): n for n in starts}, deque(starts)
    calls = frozenset().union(*(_source(n) for n in starts))
    while queue:
        for u in queue.popleft().users:
            if id(u) not in seen and _origin(u) == origin and (not calls or _source(u) <= calls):
                seen[id(u)] = u
                queue.append(u)
    return list(seen.values())


def epilogue_of(gemm: Any) -> Epilogue:
    """What the GEMM node ``gemm`` (an FX node of the post-grad graph) feeds; Epilogue() when
    nothing zhantune models or names (several uses, a residual add, the graph's output)."""
    if gemm is None or not hasattr(gemm, "users"):
        return Epilogue()
    out, bias = gemm, False
    add = _bias_add(gemm)
    if add is not None:
        out, bias = add, True
    out = _through_views(out)
    users = list(out.users)
    origins = {_origin(u) for u in users}
    if len(origins) != 1 or None in origins:
        return Epilogue(bias_added=bias)
    (origin,) = origins
    if len({_source(u) for u in users}) > 1:  # two calls of it on one output (gelu(h), gelu(h))
        return Epilogue(bias_added=bias)
    if origin == "relu" and len(users) == 1 and _target(users[0]) == "relu":
        return Epilogue("relu", bias)
    if origin == "gelu":
        targets = {_target(n) for n in _region(users, origin)}
        if "erf" in targets and "tanh" not in targets:
            return Epilogue("gelu", bias)
        return Epilogue(None, bias, "gelu (tanh)" if "tanh" in targets else "gelu")
    return Epilogue(None, bias, origin if origin in NOTED else None)
