"""Per-GEMM decisions on CPU with oneDNN left on: Inductor's ``user_lowerings`` hook.

With ``freezing=True`` and oneDNN on (what a user's inference compile gets), Inductor's freezing
pass rewrites a GEMM with a constant weight (``nn.Linear``, ``x @ W``) into a prepacked linear:
``mkl._mkl_linear`` (float32, MKL) or ``mkldnn._linear_pointwise`` (bfloat16/float16)
(torch/_inductor/fx_passes/mkldnn_fusion.py, counter ``mkldnn_linear_weight_pack_matcher_count``).
Their lowerings (torch/_inductor/mkldnn_lowerings.py ``linear_unary``, ``mkl_packed_linear``) offer
Inductor's C++ GEMM template under ``max_autotune`` but never ask the choices handler, so no lookup
table can reach them. ``torch._inductor.lowering.user_lowerings`` is consulted before the built-in
lowering of an op (torch/_inductor/graph.py ``call_function``; ``None`` falls through to the
built-in lowering, unchanged). zhantune registers one there for each packed-linear op and for
``aten.mm`` / ``aten.addmm`` / ``aten.bmm``, and each asks the thread's choices handler
(``V.choices``) what to do with this one GEMM:

- packed linear: ``handler.cpu_packed_gemm(kernel_inputs, op_name, packed_op)`` (``epilogue=`` too for a
  fused one, below: a handler's method takes that keyword) gets the GEMM as
  Inductor's ``MMKernelInputs`` (bias, x, W^T with alpha = beta = 1 for addmm; x, W^T for mm; the key
  then comes from Inductor's own ``make_lookup_key_variants``) and returns an Inductor config patch
  to lower this GEMM under (``max_autotune`` and the ``cpp.gemm_*`` knobs: the template choice is
  created, and its blocking fixed, inside the lowering), or None: Inductor's default lowering;
- ``aten.mm`` / ``addmm`` / ``bmm`` (a GEMM the freezing pass did not pack: a bmm, a non-constant
  weight, a dtype oneDNN does not pack here): ``handler.cpu_gemm_lowering()`` is a context manager
  around the built-in lowering, whose lookup then goes through the handler as usual.

Handlers without these methods (Inductor's own) are not affected: the hooks return None. The hooks
are process-wide (``user_lowerings`` is a plain dict) and installed while a zhantune compile or
table needs them (:func:`installed`); what they change is scoped to one GEMM's lowering.

A packed linear fused with what follows it: Inductor's oneDNN fusion patterns
(torch/_inductor/fx_passes/mkldnn_fusion.py ``_register_unary_fusion_lowering``,
``_register_binary_unary_fusion_lowering``) replace the linear and its activation (a bfloat16 linear, or
a float32 one packed for oneDNN: dynamic M, reduced float32 math) or its residual add with one
lowering-pattern node that calls Inductor's ``lowerings`` dict directly, never ``user_lowerings``. While
the hooks are installed, the entries of ``lowerings`` for ``mkldnn._linear_pointwise.default`` and
``.binary`` are wrapped too: a call from any node but the linear's own (the pattern's) asks
``handler.cpu_packed_gemm`` the same question, with the fused op's epilogue (:func:`fused_epilogue`:
the activation is the op's ``attr``), and its patch applies to the fused lowering, which offers the C++
template with that epilogue under max-autotune (torch/_inductor/mkldnn_lowerings.py ``linear_unary``,
``linear_binary``). Until session 53 such a GEMM made no lookup: ``collect`` did not list it, a tune's
trials were ``not_applied`` and use_table's report left it out of its coverage.

Cost: nothing for a GEMM the handler leaves alone (one dict lookup and one method call per GEMM
lowering). With dynamic M the template reads ``cpp.gemm_max_k_slices`` again when its code is rendered,
after the lowering's patch is gone (such an entry is stale: cpu_entries.DYNAMIC_M).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.kernel_inputs import MMKernelInputs
from torch._inductor.virtualized import V

from zhantune.inductor.epilogue import Epilogue

__all__ = ["PACKED_OPS", "FUSED_OPS", "installed", "install", "uninstall", "packed_kernel_inputs", "fused_epilogue"]


def _ops(*names: str) -> list[Any]:
    out = []
    for name in names:
        ns, op = name.split("::")
        try:
            packet = getattr(getattr(torch.ops, ns), op)
            out += [packet, packet.default]
        except (AttributeError, RuntimeError):  # a build without MKL / oneDNN
            continue
    return out


#: the packed-linear ops of Inductor's freezing pass (the graph's target is the packet for
#: mkl::_mkl_linear, the overload for mkldnn::_linear_pointwise; both are hooked)
PACKED_OPS = _ops("mkl::_mkl_linear", "mkldnn::_linear_pointwise")
_ATEN_OPS = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]
#: the overloads oneDNN's fusion patterns lower through ``lowerings`` (a linear and its activation; its
#: residual add): wrapped there while installed
FUSED_OPS: list[Any] = []
with contextlib.suppress(AttributeError, RuntimeError):  # a build without oneDNN
    FUSED_OPS = [torch.ops.mkldnn._linear_pointwise.default, torch.ops.mkldnn._linear_pointwise.binary]

_lock = threading.Lock()
_users = 0
_previous: dict[Any, Callable[..., Any] | None] = {}
#: Inductor's own ``lowerings`` entries of FUSED_OPS while they are wrapped
_builtin: dict[Any, Callable[..., Any]] = {}


def packed_kernel_inputs(target: Any, args: tuple) -> tuple[MMKernelInputs, str]:
    """The GEMM of a packed-linear call as Inductor's MMKernelInputs and op name ("addmm" with a
    bias, else "mm"): inputs (bias, x, W^T) or (x, W^T), x viewed as 2-D like the lowering does.

    ``mkl._mkl_linear(x, packed_w, orig_w, b, batch_size)`` keeps the dense weight (``orig_w``) and
    its real strides. ``mkldnn._linear_pointwise(x, packed_w, b, ...)`` (``.binary(x, other, packed_w,
    b, attr)``: a fused residual add) has only the packed tensor, whose IR stride is not a dense one
    (torch/_inductor/codegen/cpp_gemm_template.py); W^T is then described as the dense [N, K] weight
    the pass packed, transposed: size [K, N], stride [1, K].
    """
    # realized as the lowering itself realizes them (mm_args / the extern kernel's inputs), so that
    # a fused producer (a gelu feeding the next linear) has the layout the GEMM reads
    x = ir.ExternKernel.realize_input(args[0])
    if "_mkl_linear" in str(target):
        w_t = L.permute(args[2], [1, 0])
        b = args[3]
    else:
        at = 2 if str(target).endswith(".binary") else 1  # the packed weight's position; the bias follows
        w = args[at]
        n, k = (int(s) for s in V.graph.sizevars.optimization_hints(w.get_size()))
        w_t = ir.InputBuffer(name="zhantune_dense_weight",
                             layout=ir.FixedLayout(w.get_device(), w.get_dtype(), [k, n], [1, k]))
        b = args[at + 1]
    if b is not None:
        b = ir.ExternKernel.realize_input(b)
    size = x.get_size()
    if len(size) > 2:
        x = L.view(x, [-1, size[-1]])
    if b is not None:
        return MMKernelInputs([b, x, w_t], scalars={"alpha": 1, "beta": 1}), "addmm"
    return MMKernelInputs([x, w_t]), "mm"


#: oneDNN's names of fused activations (mkldnn_fusion.py ``UnaryAttr``) where zhantune's Epilogue has another
_ATTR_NAMES = {"swish": "silu"}


def fused_epilogue(target: Any, args: tuple) -> Epilogue:
    """What a fused packed linear computes after its GEMM, as the unfused graph's epilogue would say
    (zhantune.inductor.epilogue.epilogue_of). ``mkldnn._linear_pointwise.default(x, w, b, attr, scalars,
    algorithm)``: attr "relu" is relu, "gelu" with algorithm "none" the exact gelu (linear_act's),
    "gelu" with "tanh" other="gelu (tanh)", "swish" other="silu", any other attr other=attr, "none"
    nothing. ``.binary(x, other, w, b, attr)``: other="a residual add" (attr "add"; another attr: "an
    elementwise ATTR with another tensor"), which no problem models: collect notes that the tune leaves
    it out, and use_table's report that the entry was not measured with it (a helper's review: the
    served template fused the add with nothing said)."""
    if str(target).endswith(".binary"):
        attr = args[4] if len(args) > 4 else None
        return Epilogue(other="a residual add" if attr == "add" else f"an elementwise {attr} with another tensor")
    if len(args) < 4 or args[3] in (None, "none"):
        return Epilogue()
    attr, algorithm = args[3], (args[5] if len(args) > 5 else None)
    if attr == "relu":
        return Epilogue("relu")
    if attr == "gelu":
        return Epilogue("gelu") if algorithm in (None, "", "none") else Epilogue(other="gelu (tanh)")
    return Epilogue(other=_ATTR_NAMES.get(attr, str(attr)))


def _on_cpu(args: tuple) -> bool:
    return bool(args) and hasattr(args[0], "get_device") and getattr(args[0].get_device(), "type", None) == "cpu"


def _lowering(target: Any) -> Callable[..., Any]:
    """Inductor's own lowering of ``target`` (not the wrapper :func:`_fused_hook` puts in its place)."""
    return _builtin.get(target) or L.lowerings[target]


def _packed_hook(target: Any) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        decide = getattr(V.choices, "cpu_packed_gemm", None)
        patch = None
        if decide is not None:
            inputs, op_name = packed_kernel_inputs(target, args)
            patch = decide(inputs, op_name, str(target))
        if patch is None:
            prev = _previous.get(target)
            return prev(*args, **kwargs) if prev is not None else None
        with inductor_config.patch(patch):
            return _lowering(target)(*args, **kwargs)
    return hook


def _fused_hook(target: Any) -> Callable[..., Any]:
    """The ``lowerings`` entry of a FUSED_OPS overload while installed: a call from a node other than
    the linear's own (a fusion pattern's, which user_lowerings never sees; the linear's own node was
    asked by :func:`_packed_hook`) asks the handler as a packed linear does, with :func:`fused_epilogue`."""
    builtin = _builtin[target]
    own = (target, target.overloadpacket)

    def lowering(*args: Any, **kwargs: Any) -> Any:
        decide = getattr(V.choices, "cpu_packed_gemm", None)
        node = getattr(V.graph, "current_node", None)
        if decide is None or getattr(node, "target", None) in own or not _on_cpu(args):
            return builtin(*args, **kwargs)
        inputs, op_name = packed_kernel_inputs(target, args)
        patch = decide(inputs, op_name, str(target), epilogue=fused_epilogue(target, args))
        if patch is None:
            return builtin(*args, **kwargs)
        with inductor_config.patch(patch):
            return builtin(*args, **kwargs)
    return lowering


def _aten_hook(target: Any) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        scope = getattr(V.choices, "cpu_gemm_lowering", None)
        on_cpu = _on_cpu(args)
        if scope is None or not on_cpu:
            prev = _previous.get(target)
            return prev(*args, **kwargs) if prev is not None else None
        with scope():
            return L.lowerings[target](*args, **kwargs)
    return hook


def install() -> None:
    """Register the hooks (counted: each install() needs one uninstall())."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        for target in PACKED_OPS + _ATEN_OPS:
            _previous[target] = L.user_lowerings.get(target)
            L.user_lowerings[target] = (_packed_hook if target in PACKED_OPS else _aten_hook)(target)
        for target in FUSED_OPS:
            if target in L.lowerings:
                _builtin[target] = L.lowerings[target]
                L.lowerings[target] = _fused_hook(target)


def uninstall() -> None:
    """Undo one install(); the last one puts back whatever ``user_lowerings`` held before, and
    Inductor's own ``lowerings`` of FUSED_OPS."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users:
            return
        for target, prev in _previous.items():
            if prev is None:
                L.user_lowerings.pop(target, None)
            else:
                L.user_lowerings[target] = prev
        _previous.clear()
        for target, builtin in _builtin.items():
            L.lowerings[target] = builtin
        _builtin.clear()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The hooks, for the compiles inside the block."""
    install()
    try:
        yield
    finally:
        uninstall()
