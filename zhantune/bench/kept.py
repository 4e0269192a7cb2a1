"""Compiles kept for re-measurement: a close call's rounds and a paired round time the code compiled
for a config's first measurement again instead of compiling it anew (docs/timing.md, "Re-measurements
time the same compiled code").

Dynamo keeps compiled code per code object. Each compile therefore gets its own entry point
(:func:`own_entry`), so that several configs stay compiled side by side without a
``torch._dynamo.reset()`` between them; :class:`KeptCompiles` holds the last ``KEEP_COMPILED`` of
them by what they were compiled from (:func:`compile_key`).
"""

from __future__ import annotations

import copy
import itertools
import json
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zhantune.candidate import Candidate
from zhantune.inductor.settings import BACKEND_FLAGS, backend_flag

__all__ = ["KEEP_COMPILED", "RESET_EVERY", "Kept", "KeptCompiles", "own_entry", "compile_key", "forget"]

#: compiles kept: the two sides of a paired round (the default and the winner) or of a close call;
#: an older compile is dropped (its Dynamo cache entry with it)
KEEP_COMPILED = 2
#: Dynamo's global state is reset (and every kept compile dropped) after this many compiles
RESET_EVERY = 32

_entry_names = itertools.count()


def own_entry(module: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of ``module`` (the same parameters) whose ``forward`` has a code object of its
    own: Dynamo keeps compiled code per code object, so each compile (its own Inductor config) gets
    its own cache entry, and a kept compile stays valid while other configs compile. Still an
    ``nn.Module`` compiled as one, so each call pays what a user's ``torch.compile(model)`` call
    pays (a compiled plain function calling the module skipped two module-call layers: 12-14 us
    less per call, measured at 64x64x64)."""
    forward = type(module).forward
    code = forward.__code__.replace(co_name=f"zhantune_compile_{next(_entry_names)}")
    own = types.FunctionType(code, forward.__globals__, code.co_name, forward.__defaults__, forward.__closure__)
    entry = copy.copy(module)
    entry.forward = types.MethodType(own, entry)
    return entry


def forget(entry: torch.nn.Module) -> None:
    """Drop Dynamo's compiled code of an :func:`own_entry` (a compile that is not kept)."""
    torch._C._dynamo.eval_frame.reset_code(entry.forward.__code__)


def compile_key(patch: dict[str, Any], table: dict | None, expect: Candidate | None,
                any_key: list[dict[str, Any]] | None, tol: float | None) -> str:
    """What a compile depends on besides the problem: the config patch, the table, the candidate
    (its template and params: they decide the choices handler's entry), and the torch.backends
    flags a backend-scope candidate sets around the compile (BACKEND_FLAGS, current values)."""
    return json.dumps({"patch": patch, "table": table, "any_key": any_key, "tol": tol,
                       "flags": {flag: backend_flag(flag) for flag in BACKEND_FLAGS},
                       "candidate": None if expect is None else
                       [expect.scope, expect.template_id, expect.config_hash]},
                      sort_keys=True, default=repr)


@dataclass
class Kept:
    """A compile kept for re-measurement and what its first measurement found out at compile time
    (``compile_s`` in seconds; ``lookup``: zhantune.inductor.choices.LookupEvent or None)."""

    fn: Callable[[], Any]
    entry: torch.nn.Module
    compile_s: float
    lookup: Any
    template_hash: str | None


class KeptCompiles:
    """The last KEEP_COMPILED compiles that measured ok, by :func:`compile_key`; a dropped one's
    compiled code is released (:func:`forget`)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, Kept] = OrderedDict()

    def get(self, key: str) -> Kept | None:
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
        return kept

    def put(self, key: str, kept: Kept) -> None:
        self._kept[key] = kept
        while len(self._kept) > KEEP_COMPILED:
            self.drop(next(iter(self._kept)))

    def drop(self, key: str) -> None:
        forget(self._kept.pop(key).entry)

    def clear(self) -> None:
        for key in list(self._kept):
            self.drop(key)
