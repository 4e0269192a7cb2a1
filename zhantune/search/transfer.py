"""Transfer: what the storage already knows, as a prior for a new search (``search.transfer=auto``).

Two kinds of source, read from the same storage the tune writes to:

* **other devices, same problem** (a GEMM of the same op, shape, dtype, activation and weight
  layout, i.e. the same problem key; a Kernel Tuner import of the same kernel and problem size), of
  the same kind as this one (a CPU's configs are not a GPU's); a device holding the very recording
  this run replays (the same file's sha256 under another device name: a merge, a copied file) is
  this device, not another;
* when there is none, for a GEMM: **neighbouring shapes on this device** (same op, dtype,
  activation and weight layout; the ``max_shapes`` nearest in log2 space of M, N, K and B).

Rows of every torch release count: a prior only orders the proposals, and every claim the tune
makes is measured in this run.

A source's measurements become per-config *log regrets*: ln(time / that source's best time), with
each config at its lowest decision statistic (zhantune.bench.decision.best_per_config, as compare and
export rank); a config that only failed there has an infinite regret. The prior's score of a config
is the mean log regret over the sources that measured it (the log of its geometric-mean regret, the
statistic of compare's geometric-mean portable choice). The sampler
(zhantune.search.FeasibleTPESampler.set_prior) turns the scores into seeds (a partial prior) or
the transfer model's feature (zhantune.search.surrogate; docs/search.md, "Transfer").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zhantune.bench.decision import best_per_config, decision_us
from zhantune.config import TRANSFER_MODES  # re-exported: the values search.transfer takes

if TYPE_CHECKING:
    from zhantune.storage import Store

__all__ = ["Source", "Prior", "TRANSFER_MODES", "load_prior", "device_sources", "shape_sources",
           "shape_distance", "transfer_text"]

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
    configs: frozenset[str] = field(default=frozenset(), compare=False, repr=False)  # their config hashes


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

    def describe(self, here: set[str] | None = None) -> str:
        """One line for the summary, e.g. ``4,362 prior measurement(s) of this problem from 1 other
        device: NVIDIA RTX A4000 (4,362)`` (distinct configs measured per source, failed ones included). ``here``: the
        config hashes of this space's feasible points; a source with none of them says so."""
        def count(src: Source) -> str:
            if here is None or not src.configs or src.configs & here:
                return f"{src.measured:,}"
            return f"{src.measured:,}, none in this space"
        if self.kind == "device":
            where = f"of this problem from {len(self.sources)} other device(s): "
            items = [f"{s.device_key} ({count(s)})" for s in self.sources]
        else:
            where = f"of {len(self.sources)} neighbouring shape(s) on this device: "
            items = [f"{s.problem_key} ({count(s)}, distance {s.distance:.2f})" for s in self.sources]
        return f"{self.measurements():,} prior measurement(s) {where}{', '.join(items)}"


def _log_regrets(rows: list[Any]) -> dict[str, float]:
    """Rows of one (device, problem) (``config_hash``, ``status``, ``min_us``, ``median_us``,
    ``timing_method``, ``id``) -> config hash -> ln(time / best); inf where the config never ran ok
    there."""
    ok = [r for r in rows if r.status == "ok" and (decision_us(r) or 0) > 0]
    lowest = {r.config_hash: decision_us(r) for r in best_per_config(ok)}
    best_of = {r.config_hash: lowest[r.config_hash] for r in ok}  # in the rows' order
    if not best_of:
        return {}
    best = min(best_of.values())
    out = {h: math.log(t / best) for h, t in best_of.items()}
    out.update({r.config_hash: math.inf for r in rows if r.config_hash not in out})
    return out


def device_sources(store: Store, device_key: str, problem_key: str, kind: str | None = None,
                   recording: Collection[str] | None = None) -> list[tuple[Source, dict[str, float]]]:
    """The same problem measured on other devices of ``kind`` (None: any), by device key. Never
    used: devices with an empty key (an older import of files without a device name could make
    one), and devices holding ``recording`` (the digests of the Kernel Tuner file this run replays,
    KernelTunerFile.digests: the same recording stored under another device name, gzipped or
    decompressed, is this device's own data; zhantune.storage.ingest.recording_digests)."""
    from zhantune.storage.ingest import recording_digests

    pid, devices = store.other_devices(problem_key, device_key, kind)
    if pid is None:
        return []
    if recording:
        mine = {recording} if isinstance(recording, str) else set(recording)
        devices = [(did, key) for did, key in devices
                   if not any(recording_digests(config) & mine for _, config in store.studies_holding(key, problem_key))]
    rows = store.measured_configs([(did, pid) for did, _ in devices])
    out = []
    for did, key in devices:
        regrets = _log_regrets(rows.get((did, pid), []))
        if any(math.isfinite(v) for v in regrets.values()):
            out.append((Source("device", key, problem_key, len(regrets), configs=frozenset(regrets)), regrets))
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
    did, problems = store.neighbour_problems(device_key, problem.row_fields(), problem.key)
    if did is None:
        return []
    others = [(shape_distance(dims, p.shape), p.key, p.id) for p in problems
              if all(isinstance(p.shape.get(d), int) for d in ("M", "N", "K"))]
    others.sort()
    rows = store.measured_configs([(did, pid) for _, _, pid in others])
    out = []
    for distance, key, pid in others:
        regrets = _log_regrets(rows.get((did, pid), []))
        if any(math.isfinite(v) for v in regrets.values()):
            out.append((Source("shape", device_key, key, len(regrets), distance, frozenset(regrets)), regrets))
        if len(out) == max_shapes:
            break
    return out


def load_prior(store: Store, device_key: str, problem: Any, max_shapes: int = 2, kind: str | None = None,
               recording: Collection[str] | None = None) -> Prior | None:
    """The prior for tuning ``problem`` (a GemmProblem or a replayed problem) on ``device_key``:
    other devices' measurements of the same problem (devices of ``kind``, None: any; never one
    holding ``recording``, the digests of the file a replay replays: :func:`device_sources`), else
    (GEMMs) neighbouring shapes on this device; None when the storage holds neither. The caller
    checks the storage's stored times first (Store.check_readable: the tune app does, once, when it
    opens the database)."""
    found = (device_sources(store, device_key, problem.key, kind, recording)
             or shape_sources(store, device_key, problem, max_shapes))
    if not found:
        return None
    sums: dict[str, list[float]] = defaultdict(list)
    for _, regrets in found:
        for chash, value in regrets.items():
            sums[chash].append(value)
    scores = {h: (math.inf if any(math.isinf(v) for v in vs) else sum(vs) / len(vs)) for h, vs in sums.items()}
    return Prior(scores, [src for src, _ in found])


def _seed_fates(proposed: int, tried: int, seeds: int, inductor: bool = True) -> list[str]:
    """What became of a partial prior's ``seeds`` best configs in this run, for the summary;
    ``inductor``: the study has Inductor's own seeds (a GEMM's; a replay has none)."""
    left = seeds - proposed - tried
    return [text for n, text in (
        (proposed, f"{proposed} proposed in this run, " + ("after Inductor's own seeds and " if inductor else "")
         + "before the sampler's own picks"),
        (tried, f"{tried} already tried in this study (earlier"
         + (", or as one of Inductor's own seeds)" if inductor else ")")),
        (left, f"{left} not reached before this run's trials ended"
         + (" (Inductor's own seeds are measured first)" if inductor else ""))) if n > 0]


def transfer_text(prior: Prior, sampler: Any, study: Any = None, inductor_seeds: bool = True) -> str:
    """The summary's line on how ``prior`` seeded the search of ``sampler``
    (zhantune.search.FeasibleTPESampler's seeds, or its transfer model) in ``study`` (its trials
    tell which seeds were tried: a run of enqueued seeds alone never asks the sampler);
    ``inductor_seeds``: whether the study has Inductor's own seeds (zhantune.search.seeds; a replay's none)."""
    scored = getattr(sampler, "prior_scored", None)
    feasible = len(sampler.feasible_set) if getattr(sampler, "feasible_set", None) is not None else None
    if feasible is None:
        return (f"transfer: not used: {prior.describe()}; this space is too large to enumerate, and the "
                "search over it is Optuna's multivariate TPE, which takes no prior")
    text = f"transfer: {prior.describe(getattr(sampler, 'prior_hashes', None))}"
    if scored is None:
        return text + "; none of their configs is in this space"
    if study is not None and getattr(sampler, "prior_seed_count", 0):
        sampler.count_seeds_tried(study)
    seeds, proposed = sampler.prior_seed_count, getattr(sampler, "prior_seeds_proposed", 0)
    if seeds:
        text += f"; of their {seeds} best config(s), " + ", ".join(_seed_fates(
            proposed, getattr(sampler, "prior_seeds_tried", 0), seeds, inductor_seeds))
    if sampler.prior_complete:
        text += (f"; with their scores for {scored:,} of {feasible:,} feasible configs, proposals came from a "
                 "model of this device's times as their ranking plus per-parameter-value effects, fitted to "
                 "the results here")
        if getattr(sampler, "transfer_tpe_every", 0):
            text += f", and from TPE within their best {sampler.prior_region_size:,}"
    return text + " (search.transfer=off for a cold start)"
