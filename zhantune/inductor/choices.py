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
    """One lookup Inductor made: ``device_key`` / ``agnostic_key`` as Inductor formats them."""

    op_name: str
    device_key: str | None
    agnostic_key: str | None
    template_hashes: dict[str, str | None] = field(hash=False)
    hit_templates: tuple[str, ...] = ()

    @property
    def hit(self) -> bool:
        return bool(self.hit_templates)


@lru_cache
def _cpu_device_key() -> str:
    from zhantune.device import resolve_device

    return resolve_device("cpu").key


class RecordingChoices(LookupTableChoices):
    """Records every lookup; serves ``table`` (or Inductor's configured table) on CUDA and CPU."""

    def __init__(self, table: dict[str, list[dict[str, Any]]] | None = None):
        super().__init__()
        self.table = table
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
        result = super().lookup_template_configs(kernel_inputs, op_name, template_uids, template_hash_map)
        device_key, agnostic_key = self.make_lookup_key_variants(kernel_inputs, op_name)
        hashes = dict(template_hash_map or {})
        self.events.append(LookupEvent(op_name, device_key, agnostic_key, hashes, tuple(result)))
        return result


@contextmanager
def recording(table: dict[str, list[dict[str, Any]]] | None = None) -> Iterator[RecordingChoices]:
    """Install a RecordingChoices handler (serving ``table``) for the compiles inside the block."""
    handler = RecordingChoices(table)
    with V.set_choices_handler(handler):
        yield handler
