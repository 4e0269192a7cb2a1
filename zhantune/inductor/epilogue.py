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

__all__ = ["Epilogue", "epilogue_of", "shared_output", "modelled_activation", "activation_stale", "unmeasured_epilogue"]

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
    ("silu", "gelu (tanh)"), or any after a hand-written bias, else None. ``hand_bias``: a 1-D bias
    is added to an mm's output by an add of the model's own (``x @ w + b``): no addmm, so the
    lookup is the mm's, which linear_act's (an addmm's on CPU) is not.
    """

    activation: str | None = None
    bias_added: bool = False
    other: str | None = None
    hand_bias: bool = False

    def describe(self) -> str:
        """One phrase: "gelu", "bias + relu", "silu", "bias by hand + relu" or "none"."""
        act = self.activation or self.other
        parts = (["bias"] if self.bias_added else []) + (["bias by hand"] if self.hand_bias else []) + ([act] if act else [])
        return " + ".join(parts) or "none"


def _origin(node: Any) -> str | None:
    """The ATen op a post-grad node came from (its name: "gelu", "relu", "addmm"), or None."""
    op = node.meta.get("original_aten")
    name = getattr(op, "_opname", None) if op is not None else None
    return name if isinstance(name, str) else None


def _target(node: Any) -> str:
    """A call_function node's op name ("mm", "add", "erf", "_mkl_linear": an overload's, or a packet's
    as freezing's packed linears are called), else ""."""
    target = node.target if node.op == "call_function" else None
    name = getattr(target, "_opname", None) or (getattr(target, "__name__", None) if isinstance(
        getattr(target, "_qualified_op_name", None), str) else None)
    return name if isinstance(name, str) else ""


def _source(node: Any) -> frozenset[str]:
    """The names of the nodes of the graph before decomposition that ``node`` was made from
    (``meta["from_node"]``: "gelu", "gelu_1": one per call), empty where not recorded."""
    return frozenset(getattr(s, "name", "") for s in node.meta.get("from_node") or ())


def _bias_add(gemm: Any, origin: str = "addmm") -> Any:
    """The node adding a 1-D bias to an mm's output: its only use, an ``add`` that came from an
    addmm (the GPU's post-grad pass unfused it), or with ``origin="add"`` the model's own add; else None."""
    users = list(gemm.users)
    if _target(gemm) not in ("mm", "_mkl_linear", "_linear_pointwise") or len(users) != 1:
        return None
    add = users[0]
    if _target(add) != "add" or _origin(add) != origin or len(add.args) != 2:
        return None
    other = add.args[1] if add.args[0] is gemm else add.args[0]
    return add if _dims(other) == 1 else None


def _dims(node: Any) -> int | None:
    """How many dimensions the tensor an FX node stands for has (its ``meta["val"]``; a frozen
    parameter's ``get_attr``: the module holds it); None for a scalar argument or one not known."""
    val = getattr(node, "meta", {}).get("val") if hasattr(node, "meta") else None
    if val is None and getattr(node, "op", None) == "get_attr":
        val = getattr(node.graph.owning_module, str(node.target), None)
    return val.dim() if val is not None and hasattr(val, "dim") else None


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
    nothing zhantune models or names (several uses, the graph's output). A residual add (an add of
    a tensor of 2 or more dimensions, its only use) is ``other``="a residual add" (a helper's: a float32
    Linear's, which the C++ template fuses, was named only where oneDNN's pattern fused a bfloat16 one)."""
    if gemm is None or not hasattr(gemm, "users"):
        return Epilogue()
    out, bias = gemm, False
    add = _bias_add(gemm)
    if add is not None:
        out, bias = add, True
    elif (hand := _bias_add(gemm, "add")) is not None:  # x @ w + b: no linear_act (another lookup)
        found = _fed(_through_views(hand), False)
        return Epilogue(None, False, found.activation or found.other, hand_bias=True)
    return _fed(_through_views(out), bias)


def shared_output(gemm: Any) -> bool:
    """Whether the GEMM node ``gemm`` (an FX node of the post-grad graph, None: not known) has its
    output used more than once (attention's ``q @ k^T`` beside ``relu(q)``), counting the uses of every
    view of it (any op returning an alias of its input: unsqueeze, expand, a slice, as_strided; a
    helper's attack found ``y.unsqueeze(0)`` used twice passed a check of view/reshape chains) and the
    graph's output as a use."""
    if gemm is None or not hasattr(gemm, "users"):
        return False
    uses, queue = 0, deque([gemm])
    while queue:
        for user in queue.popleft().users:
            if _aliases(user):
                queue.append(user)
            else:
                uses += 1
    return uses > 1


def _aliases(node: Any) -> bool:
    """Whether ``node`` returns a view of its input (its ATen schema's first return aliases, without
    mutating it: unsqueeze, expand, permute, view, select), or is one of VIEWS."""
    if _target(node) in VIEWS:
        return True
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None
                and not schema.is_mutable)


def _fed(out: Any, bias: bool) -> Epilogue:
    """What ``out`` feeds alone: linear_act's activation, another activation, or nothing named."""
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
    if origin in TENSOR_OPS and len(users) == 1 and _with_tensor(users[0], out):  # x @ w + b + x (a residual)
        return Epilogue(None, bias, "a residual add" if origin == "add" else f"an elementwise {origin} with another tensor")
    return Epilogue(None, bias, origin if origin in NOTED else None)


#: the model's own elementwise ops with a second tensor that a template may fuse as an epilogue
#: (the C++ template fuses a float32 Linear's residual add: torch/_inductor/codegen/cpp_gemm_template.py)
TENSOR_OPS = ("add", "sub", "mul", "div")


def _with_tensor(node: Any, out: Any) -> bool:
    """Whether ``node`` (an elementwise op on ``out``) takes a second tensor of two or more dimensions
    (a residual's shape, not a bias's or a scalar's)."""
    if _target(node) not in TENSOR_OPS or len(node.args) < 2:
        return False
    other = node.args[1] if node.args[0] is out else node.args[0]
    return (_dims(other) or 0) >= 2


def modelled_activation(event: Any) -> str | None:
    """The activation a linear_act problem of this lookup carries (a zhantune.inductor.choices.LookupEvent):
    its epilogue's relu or gelu after an addmm, or after an mm whose output gets a bias added (a GPU's
    unfused addmm); None otherwise, a bias-less GEMM's activation too (collect tunes that one bare:
    zhantune.inductor.gemms.problem_from_event, whose rule this is)."""
    epi = getattr(event, "epilogue", None)
    if epi is None or not epi.activation:
        return None
    return epi.activation if event.op_name == "addmm" or epi.bias_added else None


#: why a table's entry is stale where the GEMM it would serve feeds another activation
ACTIVATION_STALE = ("measured with {want} fused after the GEMM, and this GEMM's output feeds {got}: never measured "
                    "so; Inductor's default compiles it (a table of another model: collect this one's GEMMs; a key "
                    "whose GEMMs feed different activations holds one entry, tuned for one of them)")


def activation_stale(activations: dict[str, str] | None, key: str | None, event: Any,
                     entries: list[dict[str, Any]] | None = None) -> str | None:
    """Why the entries under ``key`` are stale for this lookup, or None: the table says which
    activation they were measured fused with (``activations``: a table file's, key -> relu or gelu,
    or a list of them and None; a key not listed: none; None: the table does not say, and nothing is
    compared) and this GEMM feeds another (:func:`modelled_activation`). ``entries`` that are Inductor's default choice
    (``aten::<op>`` alone, of the key's own op: ``aten::bias_addmm`` is another kernel) or none (``[]``: the GEMM's templates come from another key) are never
    stale: they compile what Inductor would anyway (a helper saw a portable table's own defaults
    reported stale). A helper's attack found a table tuned on a Linear + GELU hit, coverage 100%, on
    the same Linear followed by relu, silu or nothing."""
    if activations is None or key is None:
        return None
    from zhantune.inductor.table import default_entry, parse_key  # not aten::bias_addmm: another kernel

    op = (parse_key(key) or {}).get("op")
    if entries is not None and op and all(e == default_entry(op) for e in entries):
        return None
    want, got = activations.get(key), modelled_activation(event)
    wants = want if isinstance(want, list) else [want]  # a list: equal entries tuned for problems of each
    # "alone": relu(y) + y feeds relu and an add, which no linear_act models (a helper read "no relu")
    if got in wants:
        return None
    return ACTIVATION_STALE.format(want=" or ".join(w or "no activation" for w in wants), got=got or "no relu or gelu alone")


def merged_activation(old: Any, new: str | None) -> Any:
    """A key's ``activations`` tag once a problem fused with ``new`` (None: none) ships the same entries
    there as the problems tagged ``old`` (a table's value: relu, gelu, a list of them and None; None:
    not listed, measured with none): one value where they agree, else the sorted list (None last)."""
    both = old if isinstance(old, list) else [old]
    both = both + [new] if new not in both else both
    return both[0] if len(both) == 1 else sorted(both, key=lambda a: (a is None, a or ""))


def unmeasured_epilogue(event: Any) -> str | None:
    """A note for a hit whose template entry serves a GEMM that feeds an epilogue no zhantune problem
    models (silu, a tanh GELU, an activation after a bias-less mm, a bias added by the model's own add:
    :class:`Epilogue`'s ``other``, ``hand_bias``, an unmodelled ``activation``), or None. The tune timed
    the GEMM without it, and a C++ or Triton template may fuse it into its kernel here (a helper's
    attack found such hits reported with nothing said; check's paired timing of the whole model is
    what measures them). Several uses are not named (:func:`epilogue_of`)."""
    epi = getattr(event, "epilogue", None)
    if epi is None or modelled_activation(event):  # linear_act's relu or gelu: compared by activation_stale
        return None
    act = epi.other or epi.activation
    what = ("a 1-D tensor added by the model's own add" + (f", then {act}" if act else "")) if epi.hand_bias else act
    if what is None:
        return None
    return (f"its output feeds {what} here, which the entry was not measured with (the tune timed the GEMM "
            "without it); the template may fuse it into its kernel: the model's paired timing measures that")
