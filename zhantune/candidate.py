"""One point of a search space, as every stage sees it: the search proposes it, a benchmarker
measures it, the store keys its rows by its ``config_hash``, a table entry is made from it.

Neutral ground: it imports nothing of zhantune's, so that the benchmarkers (zhantune.bench) and
the search (zhantune.search) share it without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate"]


@dataclass(frozen=True)
class Candidate:
    """One point of the space: a template choice or an Inductor config patch.

    ``params`` maps the effective keys (template kwargs or dotted config keys) to values, with the
    branch's fixed values included. ``config_hash`` is stable across runs and machines.
    """

    branch: str
    scope: str
    template_id: str | None
    params: dict[str, Any] = field(hash=False)

    @property
    def config_hash(self) -> str:
        """16 hex digits of the sha256 of the canonical JSON of template_id and params: the key of
        a config in the store, in a study's claims and across devices."""
        payload = json.dumps({"template_id": self.template_id, "params": self.params}, sort_keys=True,
                             separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``template_id`` (or the branch) and the params as compact ``k=v`` tokens, keys sorted:
        ``cpp_gemm cpp.gemm_max_k_slices=1 max_autotune_gemm_backends=CPP``."""
        return " ".join([self.template_id or self.branch, *(f"{k}={v}" for k, v in sorted(self.params.items()))])
