"""A LookupTableChoices subclass that records what Inductor asks while it compiles.

Keys are never built by hand: Inductor's own ``make_lookup_key_variants`` builds them from the
kernel inputs it lowers (torch/_inductor/lookup_table/choices.py). This handler records, for every
GEMM lowering, the op name, both key variants, the template uids offered with their ``src_hash``,
and whether the installed table hit. On CPU, where stock Inductor does no lookup at all, the device
key is zhantune's CPU key (the CPU model name), so CPU problems get keys of the same form.
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

__all__ = ["LookupEvent", "RecordingChoices", "recording"]


@dataclass(frozen=True)
class LookupEvent:
    """One lookup Inductor made: ``device_key`` / ``agnostic_key`` as Inductor formats them.

    ``inputs`` are the kernel inputs the key was made from, as (dtype name, size, stride) in
    Inductor's order (bias first for addmm); ``scalars`` are alpha/beta where the op has them.
    """

    op_name: str
    device_key: str | None
    agnostic_key: str | None
    template_hashes: dict[str, str | None] = field(hash=False)
    hit_templates: tuple[str, ...] = ()
    inputs: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()
    scalars: tuple[tuple[str, float | int], ...] = ()

    @property
    def hit(self) -> bool:
        return bool(self.hit_templates)


@lru_cache
def _cpu_device_key() -> str:
    from zhantune.device import resolve_device

    return resolve_device("cpu").key


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

    def event(self, kernel_inputs, op_name: str, template_hash_map: dict[str, str | None] | None,
              hit_templates: tuple[str, ...]) -> LookupEvent:
        """The LookupEvent for one lookup (keys from Inductor's own make_lookup_key_variants)."""
        device_key, agnostic_key = self.make_lookup_key_variants(kernel_inputs, op_name)
        inputs = tuple(
            (str(dtype).removeprefix("torch."), tuple(int(v) for v in size), tuple(int(v) for v in stride))
            for dtype, size, stride in zip(kernel_inputs.dtypes(), kernel_inputs.shapes_hinted(),
                                           kernel_inputs.strides_hinted(), strict=True)
        )
        scalars = tuple(sorted((getattr(kernel_inputs, "_scalars", None) or {}).items()))
        return LookupEvent(op_name, device_key, agnostic_key, dict(template_hash_map or {}), hit_templates,
                           inputs, scalars)


@contextmanager
def recording(table: dict[str, list[dict[str, Any]]] | None = None,
              any_key: list[dict[str, Any]] | None = None) -> Iterator[RecordingChoices]:
    """Install a RecordingChoices handler (serving ``table``, or ``any_key`` entries under every key)
    for the compiles inside the block."""
    handler = RecordingChoices(table, any_key)
    with V.set_choices_handler(handler):
        yield handler
