"""Transfer: what the storage already knows, as a prior for a new search (``search.transfer=auto``).

Two kinds of source, read from the same storage the tune writes to:

* **other devices, same problem** (a GEMM of the same op, shape, dtype, activation and weight
  layout, i.e. the same problem key; a Kernel Tuner import of the same kernel and problem size);
* when there is none, for a GEMM: **neighbouring shapes on this device** (same op, dtype,
  activation and weight layout; the ``max_shapes`` nearest in log2 space of M, N, K and B).

A source's measurements become per-config *log regrets*: ln(time / that source's best time), with
each config at its lowest decision statistic (zhantune.storage.store.decision_value, as compare and
export rank); a config that only failed there has an infinite regret. The prior's score of a config
is the mean log regret over the sources that measured it (the log of its geometric-mean regret, the
statistic of compare's geometric-mean portable choice). The sampler
(zhantune.search.FeasibleTPESampler.set_prior) turns the scores into seeds and a search region
(docs/search.md, "Transfer").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from zhantune.config import TRANSFER_MODES  # re-exported: the values search.transfer takes
from zhantune.storage import Store
from zhantune.storage import models as m
from zhantune.storage.store import decision_value

__all__ = ["Source", "Prior", "TRANSFER_MODES", "load_prior", "device_sources", "shape_sources",
           "shape_distance"]

#: the dims a GEMM problem row's shape holds (zhantune.problems.GemmProblem.dims)
_GEMM_DIMS = ("M", "N", "K", "B")


@dataclass(frozen=True)
class Source:
    """One (device, problem) whose measurements inform the prior."""

    kind: str            # "device" (same problem, other device) or "shape" (this device, other shape)
    device_key: str
    problem_key: str
    measured: int        # distinct configs measured there (failures included)
    distance: float = 0.0  # shape sources: log2-space distance to the problem being tuned


@dataclass
class Prior:
    """Per-config scores (config hash -> mean log regret over the sources that measured it; inf for
    a config that only failed) and the sources they came from."""

    scores: dict[str, float]
    sources: list[Source] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.sources[0].kind if self.sources else "none"

    def measurements(self) -> int:
        return sum(s.measured for s in self.sources)

    def describe(self) -> str:
        """One line for the summary, e.g. ``4,195 prior measurement(s) of this problem from 1 other
        device: NVIDIA RTX A4000 (4,195)``."""
        if self.kind == "device":
            where = f"of this problem from {len(self.sources)} other device(s): "
            items = [f"{s.device_key} ({s.measured:,})" for s in self.sources]
        else:
            where = f"of {len(self.sources)} neighbouring shape(s) on this device: "
            items = [f"{s.problem_key} ({s.measured:,}, distance {s.distance:.2f})" for s in self.sources]
        return f"{self.measurements():,} prior measurement(s) {where}{', '.join(items)}"


def _log_regrets(rows: list[tuple[str, str, Any, Any, Any]]) -> dict[str, float]:
    """(config hash, status, min_us, median_us, timing_method) rows of one (device, problem) ->
    config hash -> ln(time / best); inf where the config never ran ok there."""
    best_of: dict[str, float] = {}
    failed: set[str] = set()
    for chash, status, low, median, method in rows:
        value = decision_value(low, median, method)
        if status == "ok" and value is not None and value > 0:
            best_of[chash] = min(value, best_of.get(chash, math.inf))
        else:
            failed.add(chash)
    if not best_of:
        return {}
    best = min(best_of.values())
    out = {h: math.log(t / best) for h, t in best_of.items()}
    out.update({h: math.inf for h in failed if h not in out})
    return out


def _measurements(store: Store, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], list[tuple]]:
    """Candidate and re-measure rows of each (device id, problem id) in ``pairs``."""
    out: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    if not pairs:
        return out
    devices = {d for d, _ in pairs}
    problems = {p for _, p in pairs}
    with store.session() as s:
        q = (select(m.Measurement.device_id, m.Measurement.problem_id, m.Measurement.config_hash,
                    m.Measurement.status, m.Measurement.min_us, m.Measurement.median_us,
                    m.Measurement.timing_method)
             .where(m.Measurement.device_id.in_(devices), m.Measurement.problem_id.in_(problems),
                    m.Measurement.kind.in_(("candidate", "remeasure")), m.Measurement.config_hash.is_not(None)))
        for did, pid, chash, status, low, median, method in s.execute(q):
            if (did, pid) in pairs:
                out[(did, pid)].append((chash, status, low, median, method))
    return out


def device_sources(store: Store, device_key: str, problem_key: str) -> list[tuple[Source, dict[str, float]]]:
    """The same problem measured on other devices (devices with an empty key, which an older import
    could make from files without a device name, are never used), by device key."""
    with store.session() as s:
        problem = s.scalar(select(m.Problem).where(m.Problem.key == problem_key))
        if problem is None:
            return []
        q = (select(m.Device.id, m.Device.key)
             .join(m.Measurement, m.Measurement.device_id == m.Device.id)
             .where(m.Measurement.problem_id == problem.id, m.Device.key != device_key, m.Device.key != "")
             .distinct().order_by(m.Device.key))
        devices = list(s.execute(q))
        pid = problem.id
    rows = _measurements(store, [(did, pid) for did, _ in devices])
    out = []
    for did, key in devices:
        regrets = _log_regrets(rows[(did, pid)])
        if any(math.isfinite(v) for v in regrets.values()):
            out.append((Source("device", key, problem_key, len(regrets)), regrets))
    return out


def shape_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Euclidean distance between two GEMM shapes in log2 space of M, N, K and B (B=1 if absent)."""
    return math.sqrt(sum((math.log2(a.get(d, 1)) - math.log2(b.get(d, 1))) ** 2 for d in _GEMM_DIMS))


def shape_sources(store: Store, device_key: str, problem: Any, max_shapes: int = 2) -> list[tuple[Source, dict[str, float]]]:
    """The ``max_shapes`` nearest other shapes of the same GEMM (op, dtype, activation, weight
    layout) measured on this device, nearest first (ties by problem key)."""
    dims = getattr(problem, "dims", None)
    if not isinstance(dims, dict) or max_shapes < 1:
        return []
    fields = problem.row_fields()
    with store.session() as s:
        device = s.scalar(select(m.Device).where(m.Device.key == device_key))
        if device is None:
            return []
        # problems with measurements here (a subquery: PostgreSQL has no DISTINCT over a JSON column)
        measured = select(m.Measurement.problem_id).where(m.Measurement.device_id == device.id,
                                                          m.Measurement.kind.in_(("candidate", "remeasure")))
        q = select(m.Problem).where(m.Problem.id.in_(measured), m.Problem.key != problem.key,
                                    m.Problem.op == fields["op"], m.Problem.dtype == fields["dtype"],
                                    m.Problem.weight_layout == fields["weight_layout"])
        if fields["activation"] is None:
            q = q.where(m.Problem.activation.is_(None))
        else:
            q = q.where(m.Problem.activation == fields["activation"])
        others = [(shape_distance(dims, p.shape), p.key, p.id) for p in s.scalars(q)
                  if all(isinstance(p.shape.get(d), int) for d in ("M", "N", "K"))]
        did = device.id
    others.sort()
    rows = _measurements(store, [(did, pid) for _, _, pid in others])
    out = []
    for distance, key, pid in others:
        regrets = _log_regrets(rows[(did, pid)])
        if any(math.isfinite(v) for v in regrets.values()):
            out.append((Source("shape", device_key, key, len(regrets), distance), regrets))
        if len(out) == max_shapes:
            break
    return out


def load_prior(store: Store, device_key: str, problem: Any, max_shapes: int = 2) -> Prior | None:
    """The prior for tuning ``problem`` (a GemmProblem or a replayed problem) on ``device_key``:
    other devices' measurements of the same problem, else (GEMMs) neighbouring shapes on this
    device; None when the storage holds neither."""
    found = device_sources(store, device_key, problem.key) or shape_sources(store, device_key, problem, max_shapes)
    if not found:
        return None
    sums: dict[str, list[float]] = defaultdict(list)
    for _, regrets in found:
        for chash, value in regrets.items():
            sums[chash].append(value)
    scores = {h: (math.inf if any(math.isinf(v) for v in vs) else sum(vs) / len(vs)) for h, vs in sums.items()}
    return Prior(scores, [src for src, _ in found])
