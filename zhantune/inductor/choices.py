"""A LookupTableChoices subclass that records what Inductor asks while it compiles.

Keys are never built by hand: Inductor's own ``make_lookup_key_variants`` builds them from the
kernel inputs it lowers (torch/_inductor/lookup_table/choices.py). This handler records, for every
GEMM lowering, the op name, both key variants, the template uids offered with their ``src_hash``,
and whether the installed table hit. On CPU, where stock Inductor does no lookup at all, the device
key is zhantune's CPU key (the CPU model name), so CPU problems get keys of the same form. A GEMM
that Inductor's freezing pass turned into a prepacked linear (fused with its activation or not) makes no
lookup; the CPU lowering hook (zhantune.inductor.cpu_gemm) reports it with Inductor's kernel inputs and
the key comes from the same ``make_lookup_key_variants``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.lookup_table import LookupTableChoices
from torch._inductor.virtualized import V

from zhantune.inductor.epilogue import Epilogue, epilogue_of, shared_output

__all__ = ["LookupEvent", "RecordingChoices", "recording"]


@dataclass(frozen=True)
class LookupEvent:
    """One lookup Inductor made: ``device_key`` / ``agnostic_key`` as Inductor formats them.

    ``inputs`` are the kernel inputs the key was made from, as (dtype name, size, stride) in
    Inductor's order (bias first for addmm); ``scalars`` are alpha/beta where the op has them.
    ``packed`` names the prepacked linear op (``mkl._mkl_linear``, ``mkldnn._linear_pointwise``)
    when the GEMM reached zhantune through the CPU lowering hook (zhantune.inductor.cpu_gemm)
    instead of Inductor's GEMM lookup; Inductor's default for it is that packed op. ``epilogue``:
    what the GEMM's output feeds in the graph (zhantune.inductor.epilogue: linear_act's activation).
    ``runtime_mat2``: a CPU GEMM (bmm, mm, addmm; not a packed linear) whose second operand is computed
    at run time, not a frozen constant (attention's keys): a tune measures the C++ template on a
    constant one, which Inductor needs for it (zhantune.inductor.cpu_entries). ``shared_output``: a CPU
    bmm whose output is used more than once (zhantune.inductor.epilogue.shared_output), where Inductor's
    C++ BMM template fails to compile (cpu_entries.BMM_SHARED_OUTPUT).
    """

    op_name: str
    device_key: str | None
    agnostic_key: str | None
    template_hashes: dict[str, str | None] = field(hash=False)
    hit_templates: tuple[str, ...] = ()
    inputs: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()
    scalars: tuple[tuple[str, float | int], ...] = ()
    packed: str | None = None
    epilogue: Epilogue = Epilogue()
    runtime_mat2: bool = False
    shared_output: bool = False

    @property
    def hit(self) -> bool:
        return bool(self.hit_templates)

    @property
    def offered(self) -> bool:
        """A lookup with something to choose: templates offered, or a packed linear (the C++
        template or the packed op). addmm's expanded-bias pass without max-autotune offers none."""
        return bool(self.template_hashes) or self.packed is not None


@lru_cache
def _cpu_model() -> str:
    from zhantune.device import cpu_model

    return cpu_model()


def _cpu_device_key() -> str:
    """This CPU's device key now (zhantune.device.cpu_device_key: the thread count may change
    within a process, torch.set_num_threads)."""
    from zhantune.device import cpu_device_key, cpu_threads

    return cpu_device_key(_cpu_model(), cpu_threads())


def legacy_cpu_key(device_key: str | None, agnostic_key: str | None) -> str | None:
    """The key a table made before database revision 0009 has for a CPU lookup: the CPU's model
    name alone (no thread count) as its device part; None for a lookup that is not this CPU's."""
    if device_key is None or agnostic_key is None or not device_key.startswith(_cpu_device_key() + "+"):
        return None
    return f"{_cpu_model()}+{agnostic_key}"


class RecordingChoices(LookupTableChoices):
    """Records every lookup; serves ``table`` (or Inductor's configured table) on CUDA and CPU."""

    def __init__(self, table: dict[str, list[dict[str, Any]]] | None = None,
                 any_key: list[dict[str, Any]] | None = None):
        super().__init__()
        self.table = table
        #: entries served under whatever key Inductor asks with (a one-GEMM candidate compile: addmm
        #: looks its ATen kernel up with the 1-D bias and its templates with the expanded bias, so
        #: the key a template hits is only known when Inductor makes it; the event records it)
        self.any_key = any_key
        self.events: list[LookupEvent] = []

    @staticmethod
    def _get_device_key(device: torch.device) -> str | None:
        if device.type == "cpu":
            return _cpu_device_key()
        return LookupTableChoices._get_device_key(device)

    def _get_lookup_table(self) -> dict[str, list[dict[str, Any]]]:
        if self.table is not None:
            return self.table
        return inductor_config.lookup_table.table or {}

    def lookup_template_configs(self, kernel_inputs, op_name, template_uids, template_hash_map=None):
        if self.any_key is not None:
            device_key, _ = self.make_lookup_key_variants(kernel_inputs, op_name)
            self.table = {device_key: self.any_key} if device_key else {}
        result = super().lookup_template_configs(kernel_inputs, op_name, template_uids, template_hash_map)
        self.events.append(self.event(kernel_inputs, op_name, template_hash_map, tuple(result)))
        return result

    def cpu_packed_gemm(self, kernel_inputs, op_name: str, packed_op: str,
                        epilogue: Epilogue | None = None) -> dict[str, Any] | None:
        """A packed linear is being lowered (zhantune.inductor.cpu_gemm; ``epilogue``: what a fused one
        computes after its GEMM): record it; None keeps Inductor's default lowering (the packed op)."""
        self.events.append(self.event(kernel_inputs, op_name, {}, (), packed=packed_op, epilogue=epilogue))
        return None

    @contextmanager
    def cpu_gemm_lowering(self) -> Iterator[None]:
        """Around an unpacked CPU GEMM's lowering (zhantune.inductor.cpu_gemm): nothing to change;
        its lookup is recorded by :meth:`lookup_template_configs`."""
        yield

    def event(self, kernel_inputs, op_name: str, template_hash_map: dict[str, str | None] | None,
              hit_templates: tuple[str, ...], packed: str | None = None,
              epilogue: Epilogue | None = None) -> LookupEvent:
        """The LookupEvent for one lookup (keys from Inductor's own make_lookup_key_variants); its
        epilogue read from the graph (epilogue_of) unless given (a fused linear's: cpu_gemm.fused_epilogue)."""
        device_key, agnostic_key = self.make_lookup_key_variants(kernel_inputs, op_name)
        inputs = tuple(
            (str(dtype).removeprefix("torch."), tuple(int(v) for v in size), tuple(int(v) for v in stride))
            for dtype, size, stride in zip(kernel_inputs.dtypes(), kernel_inputs.shapes_hinted(),
                                           kernel_inputs.strides_hinted(), strict=True)
        )
        scalars = tuple(sorted((getattr(kernel_inputs, "_scalars", None) or {}).items()))
        runtime = shared = False
        # a frozen compile (collect's, a tune's on CPU): without it every weight is a graph input, not a
        # constant (freezing set, grad mode on: a GEMM a table could serve under no_grad, not an untunable one)
        from zhantune.inductor.cpu_entries import constant_operand, frozen_compile

        if op_name in ("bmm", "mm", "addmm") and packed is None and kernel_inputs.device_type == "cpu" \
                and frozen_compile():

            runtime = not constant_operand(kernel_inputs)
            shared = op_name == "bmm" and shared_output(getattr(V.graph, "current_node", None))
        return LookupEvent(op_name, device_key, agnostic_key, dict(template_hash_map or {}), hit_templates,
                           inputs, scalars, packed,
                           epilogue if epilogue is not None else epilogue_of(getattr(V.graph, "current_node", None)),
                           runtime, shared)


@contextmanager
def recording(table: dict[str, list[dict[str, Any]]] | None = None,
              any_key: list[dict[str, Any]] | None = None) -> Iterator[RecordingChoices]:
    """Install a RecordingChoices handler (serving ``table``, or ``any_key`` entries under every key)
    for the compiles inside the block, with the CPU lowering hooks (packed linears are recorded)."""
    from zhantune.inductor import cpu_gemm

    handler = RecordingChoices(table, any_key)
    with V.set_choices_handler(handler), cpu_gemm.installed():
        yield handler
