"""Inductor's CUDA GEMM lowerings without a GPU: GPU profiles, a simulated device, the real lowering.

Which choices a GEMM lowering builds and which lookups it makes is plain Python in
torch/_inductor/kernel/mm.py, bmm.py, choices.py and lookup_table/choices.py.
:func:`simulated_cuda` makes that code see one CUDA device with a profile's properties
(``torch.cuda.is_available``, device properties and capability patched, ``torch.version.hip`` for
an AMD profile, Inductor's property caches cleared before and after). :func:`lower` calls the real
lowering (``tuned_mm``, ``tuned_addmm``, ``tuned_bmm``) on input buffers placed on ``cuda:0``
inside a real GraphLowering and returns what it would autotune among: ``autotune_select_algorithm``
is replaced by a recorder, and each choice stays Inductor's ``KernelTemplateChoice`` (template,
merged kwargs) instead of being rendered into a kernel (rendering needs a GPU compiler). Nothing is
allocated, so :func:`lower` runs on a real CUDA device as well.

Used by the dry run (``python -m zhantune.space ... device_profile=H100``) and by the tests of the
CUDA path. On an AMD profile the lowering follows ``torch.version.hip``, but the template config
heuristics this torch registered at import are CUDA's (a CPU or CUDA build), so which templates are
offered is Inductor's, the configs each would try are not ROCm's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

__all__ = ["DeviceProfile", "PROFILES", "profile", "simulated_cuda", "Lowered", "lower", "offered_uids",
           "problem_inputs"]


@dataclass(frozen=True)
class DeviceProfile:
    """A GPU as ``torch.cuda.get_device_properties`` reports it: the fields Inductor reads.
    ``gcn_arch_name`` is the lookup table's device key; ``smem_bytes`` the opt-in shared memory per
    block (bytes); ``hip`` the ROCm version an AMD device's torch reports (None: CUDA)."""

    name: str
    gcn_arch_name: str
    major: int
    minor: int
    sm_count: int
    smem_bytes: int
    memory_bytes: int
    l2_bytes: int
    warp_size: int = 32
    hip: str | None = None
    uuid: str = "00000000-0000-0000-0000-000000000000"

    def properties(self) -> Any:
        """A stand-in for ``torch.cuda.get_device_properties(0)``."""
        import types

        return types.SimpleNamespace(
            name=self.name, gcnArchName=self.gcn_arch_name, major=self.major, minor=self.minor,
            multi_processor_count=self.sm_count, shared_memory_per_block_optin=self.smem_bytes,
            shared_memory_per_block=min(self.smem_bytes, 49152) if self.hip is None else self.smem_bytes,
            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024,
            warp_size=self.warp_size, total_memory=self.memory_bytes, L2_cache_size=self.l2_bytes, uuid=self.uuid)

    def device_info(self) -> Any:
        """The DeviceInfo (zhantune.device) a tune on this GPU would resolve, index 0."""
        from zhantune.device import DeviceInfo

        return DeviceInfo("cuda", 0, self.gcn_arch_name, self.name, {
            "sm_count": self.sm_count, "smem_bytes": self.smem_bytes, "memory_bytes": self.memory_bytes,
            "capability": f"{self.major}.{self.minor}", "cuda": None, "hip": self.hip,
            "profile": self.key})

    @property
    def key(self) -> str:
        """The name :data:`PROFILES` knows this profile by."""
        return next(k for k, p in PROFILES.items() if p == self)


#: datasheet values (SMs/CUs, opt-in shared memory per block, memory, L2) of common GPUs; H200's are
#: ``torch.cuda.get_device_properties`` read on a lent H200 (2026-11-27, torch 2.11), which also
#: matched H100's (one GH100 die) in every other property the stand-in has; Inductor reads none of
#: the real ones the stand-in lacks (clock rates, bus width, PCI ids, shared memory per SM)
PROFILES: dict[str, DeviceProfile] = {
    "H100": DeviceProfile("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 9, 0, 132, 232448, 80 << 30, 50 << 20,
                          uuid="5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60"),
    "H200": DeviceProfile("NVIDIA H200", "NVIDIA H200", 9, 0, 132, 232448, 150109880320, 62914560),
    "A100": DeviceProfile("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912, 80 << 30, 40 << 20),
    # fewer than 68 SMs: Inductor offers no Triton template and no decomposeK (utils.py is_big_gpu)
    "L4": DeviceProfile("NVIDIA L4", "NVIDIA L4", 8, 9, 58, 101376, 24 << 30, 48 << 20),
    "MI300X": DeviceProfile("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 9, 4, 304, 65536, 192 << 30, 4 << 20,
                            warp_size=64, hip="6.2"),
}


def profile(name: str) -> DeviceProfile:
    """The profile named ``name`` (case-insensitive); raises KeyError listing the known ones."""
    for key, p in PROFILES.items():
        if key.lower() == str(name).lower():
            return p
    raise KeyError(f"{name!r}; known: {', '.join(PROFILES)}")


#: modules whose functools caches hold answers about the device (capability, TMA, SM count, ...)
_CACHED_MODULES = ("torch.utils._triton", "torch._inductor.utils", "torch._inductor.codegen.cuda.cuda_env",
                   "torch._inductor.template_heuristics.triton", "torch._inductor.kernel.mm_common")


def _clear_caches() -> None:
    """Forget every cached answer about the device, so that a profile's properties take effect and
    do not outlive the block: the functools caches of the modules in _CACHED_MODULES, Inductor's
    DeviceProperties and the lookup table's device key."""
    import importlib

    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.runtime.hints import DeviceProperties

    DeviceProperties.create.cache_clear()
    LookupTableChoices._get_device_key.cache_clear()
    for name in _CACHED_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for obj in list(vars(module).values()):
            clear = getattr(obj, "cache_clear", None)
            if callable(clear) and getattr(obj, "__module__", None) == name:
                clear()


@contextlib.contextmanager
def simulated_cuda(device: DeviceProfile | Any = None) -> Iterator[Any]:
    """Inside the block torch and Inductor see one CUDA device: a DeviceProfile (default H100) or a
    properties object like ``torch.cuda.get_device_properties``'s. Yields the properties."""
    device = PROFILES["H100"] if device is None else device
    props = device.properties() if isinstance(device, DeviceProfile) else device
    hip = device.hip if isinstance(device, DeviceProfile) else None
    _clear_caches()
    capability = (props.major, props.minor)
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.device_count", return_value=1), \
            mock.patch("torch.cuda.current_device", return_value=0), \
            mock.patch("torch.cuda.get_device_properties", return_value=props), \
            mock.patch("torch.cuda.get_device_capability", return_value=capability), \
            mock.patch.object(torch.version, "hip", hip), \
            mock.patch("torch._dynamo.device_interface.CudaInterface.get_device_properties",
                       staticmethod(lambda device=None: props)):
        try:
            yield props
        finally:
            _clear_caches()


@dataclass
class Lowered:
    """What one lowering did: ``choices`` (KernelTemplateChoice: ``.template.uid``,
    ``.params.to_kwargs()``) it would autotune among, under the name it gave the selection."""

    name: str
    choices: list[Any] = field(default_factory=list)

    @property
    def uids(self) -> list[str]:
        return [c.template.uid for c in self.choices]

    def kwargs(self, i: int = 0) -> dict[str, Any]:
        return self.choices[i].params.to_kwargs()


def lower(op: str, shapes: list[tuple[int | str, ...]], dtype: torch.dtype,
          strides: list[tuple[int, ...] | None] | None = None, index: int = 0,
          hints: dict[str, int] | None = None) -> Lowered:
    """Call Inductor's lowering of ``op`` ("mm", "addmm", "bmm") on ``cuda:index`` buffers of
    ``shapes`` (contiguous unless ``strides`` says otherwise); the current choices handler
    (V.choices) and Inductor config apply. A size given as a name is a dynamic dimension (a
    symbol of the graph's ShapeEnv, as Dynamo makes for a dynamic shape) with the size hint
    ``hints[name]``. Use inside :func:`simulated_cuda` (or with a GPU). Where the lowering makes no
    GEMM selection (a bmm with M = N = 1 and K <= 32 on CUDA: a multiply and a sum), no choices."""
    from torch._dynamo.source import ConstantSource
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.kernel import bmm, mm
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.virtualized import V
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    strides = strides or [None] * len(shapes)
    seen: list[Lowered] = []
    shape_env = ShapeEnv() if hints else None
    symbols = {name: shape_env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
               for name, hint in (hints or {}).items()}
    graph = GraphLowering(torch.fx.symbolic_trace(torch.nn.Identity()), shape_env=shape_env)
    with V.set_graph_handler(graph):
        nodes = []
        for i, (size, stride) in enumerate(zip(shapes, strides, strict=True)):
            size = [symbols[d] if isinstance(d, str) else d for d in size]
            if stride is None:  # contiguous, as torch computes it (a size of 0 counts as 1)
                stride = [1] * len(size)
                for d in range(len(size) - 2, -1, -1):
                    stride[d] = stride[d + 1] * (max(size[d + 1], 1) if isinstance(size[d + 1], int) else size[d + 1])
            layout = ir.FixedLayout(torch.device("cuda", index), dtype, list(size), list(stride))
            graph.graph_inputs[f"arg{i}"] = ir.TensorBox.create(ir.InputBuffer(name=f"arg{i}", layout=layout))
            nodes.append(graph.graph_inputs[f"arg{i}"])

        def select(name: str, choices: list[Any], *args: Any, **kwargs: Any) -> tuple[Any, None]:
            seen.append(Lowered(name, list(choices)))
            return nodes[-1], None

        lowering = {"mm": mm.tuned_mm, "addmm": mm.tuned_addmm, "bmm": bmm.tuned_bmm}[op]
        with mock.patch.object(mm, "autotune_select_algorithm", select), \
                mock.patch.object(bmm, "autotune_select_algorithm", select), \
                mock.patch.object(KernelTemplateChoice, "choice", property(lambda ktc: ktc)):
            lowering(*nodes)
    if not seen:  # no GEMM selection at all: a dot-shaped bmm on CUDA is a multiply and a sum (kernel/bmm.py)
        return Lowered(op, [])
    (result,) = seen
    return result


def problem_inputs(problem: Any, lookup_op: str) -> tuple[list[tuple[int, ...]], list[tuple[int, ...] | None]]:
    """(shapes, strides) of the GEMM's kernel inputs as Inductor lowers ``problem`` (a GemmProblem)
    under ``lookup_op``: the bias first for addmm; the weight transposed (stride (1, K)) for
    ``weight_layout=nk``."""
    d = problem.dims
    m, n, k = d["M"], d["N"], d["K"]
    if lookup_op == "bmm":
        return [(d["B"], m, k), (d["B"], k, n)], [None, None]
    weight = ((k, n), (1, k)) if problem.weight_layout == "nk" else ((k, n), None)
    shapes, strides = [(m, k), weight[0]], [None, weight[1]]
    if lookup_op == "addmm":
        shapes, strides = [(n,)] + shapes, [None] + strides
    return shapes, strides


def offered_uids(problem: Any, lookup_op: str, index: int = 0) -> frozenset[str]:
    """The template uids Inductor's ``lookup_op`` lowering offers for ``problem`` on the CUDA device
    torch sees now (real, or :func:`simulated_cuda`), with every GEMM template enabled (max-autotune
    over ATen and Triton, the persistent TMA matmul on): size thresholds (decomposeK, Triton mm at
    large K), device checks (TMA: compute capability 9.0 and aligned strides; ROCm) and the
    heuristics' pruning are all Inductor's own."""
    from torch._inductor import config as inductor_config

    shapes, strides = problem_inputs(problem, lookup_op)
    with inductor_config.patch({"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                                "triton.enable_persistent_tma_matmul": True}):
        return frozenset(lower(lookup_op, shapes, problem.torch_dtype, strides, index).uids)
