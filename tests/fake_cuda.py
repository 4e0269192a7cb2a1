"""Inductor's CUDA GEMM lowerings, run on a machine without a GPU.

Which choices a GEMM lowering builds, which lookups it makes and how a lookup-table entry merges
into template kwargs is plain Python in torch/_inductor/kernel/mm.py, bmm.py, choices.py and
lookup_table/choices.py. :func:`fake_cuda` makes that code see one CUDA device (the properties of
``PROFILE``: ``torch.cuda.is_available``, device properties and capability patched, Inductor's
property caches cleared before and after). :func:`lower` then calls the real lowering (``tuned_mm``,
``tuned_addmm``, ``tuned_bmm``) on input buffers placed on ``cuda:0`` inside a real GraphLowering,
and returns what it would autotune among: ``autotune_select_algorithm`` is replaced by a recorder,
and each choice stays Inductor's ``KernelTemplateChoice`` (template, merged kwargs) instead of being
rendered into a kernel (rendering needs a GPU compiler).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

#: an H100 SXM as torch.cuda.get_device_properties reports it (the fields Inductor reads)
PROFILE = types.SimpleNamespace(
    name="NVIDIA H100 80GB HBM3", gcnArchName="NVIDIA H100 80GB HBM3", major=9, minor=0,
    multi_processor_count=132, shared_memory_per_block_optin=232448, regs_per_multiprocessor=65536,
    max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32,
    total_memory=80 * 2**30, L2_cache_size=50 * 2**20, uuid="5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60")


def _clear_caches() -> None:
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._inductor.utils import use_decompose_k_choice

    DeviceProperties.create.cache_clear()
    LookupTableChoices._get_device_key.cache_clear()
    use_decompose_k_choice.cache_clear()


@contextlib.contextmanager
def fake_cuda(props: Any = PROFILE) -> Iterator[Any]:
    """Inside the block Inductor sees one CUDA device with ``props``."""
    _clear_caches()
    capability = (props.major, props.minor)
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.device_count", return_value=1), \
            mock.patch("torch.cuda.current_device", return_value=0), \
            mock.patch("torch.cuda.get_device_properties", return_value=props), \
            mock.patch("torch.cuda.get_device_capability", return_value=capability), \
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
    choices: list[Any]

    @property
    def uids(self) -> list[str]:
        return [c.template.uid for c in self.choices]

    def kwargs(self, i: int = 0) -> dict[str, Any]:
        return self.choices[i].params.to_kwargs()


def lower(op: str, shapes: list[tuple[int, ...]], dtype: torch.dtype,
          strides: list[tuple[int, ...] | None] | None = None) -> Lowered:
    """Call Inductor's lowering of ``op`` ("mm", "addmm", "bmm") on cuda:0 buffers of ``shapes``
    (contiguous unless ``strides`` says otherwise); the current choices handler (V.choices) and
    Inductor config apply. Use inside :func:`fake_cuda`."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.kernel import bmm, mm
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.virtualized import V

    strides = strides or [None] * len(shapes)
    seen: list[Lowered] = []
    graph = GraphLowering(torch.fx.symbolic_trace(torch.nn.Identity()))
    with V.set_graph_handler(graph):
        nodes = []
        for i, (size, stride) in enumerate(zip(shapes, strides, strict=True)):
            stride = stride or torch.empty(size, device="meta").stride()
            layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(size), list(stride))
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
    (result,) = seen
    return result
