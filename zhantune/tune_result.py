"""What a tune did: :class:`TuneResult`, read by the summary (zhantune.report.summary), a problems
file's table (zhantune.problemset) and a multirun's job records (zhantune.multirun)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zhantune.bench.conditions import ContentionCount
from zhantune.bench.decision import SpeedupVerdict, claim_holds, cpu_timing_method, timing_kind
from zhantune.errors import ConfigError
from zhantune.provenance import software_versions
from zhantune.search.transfer import Prior
from zhantune.storage import MeasurementRow

__all__ = ["TuneResult", "claim_verdict", "stored_claim", "own_rows", "study_best", "ranked_rows"]


def stored_claim(store: Any, study_id: int) -> tuple[SpeedupVerdict | None, MeasurementRow | None]:
    """A finished study's claim from the database, for a run that measures nothing: the verdict on
    the config its newest verdict is about (Store.study_verdict), as the export reads it
    (Store.latest_verdicts: this torch's release first, a judged claim before a later "no claim
    made") and as the SpeedupVerdict a tune's settle leaves, confirmed only where the rule in use
    holds (zhantune.bench.decision.claim_holds) and its rounds ran with this torch's release; and
    the fastest row of that config (None where the verdict names none). (None, None) where no
    verdict was stored."""
    from zhantune.bench.decision import claim_holds
    from zhantune.provenance import software_versions, torch_release

    v = claim_verdict(store, study_id)
    if v is None:
        return None, None
    this = software_versions()["torch"]
    confirmed = claim_holds(v) and torch_release(v.torch_version) == torch_release(this)
    reason = v.reason
    if claim_holds(v) and not confirmed:
        reason = f"confirmed with torch {v.torch_version or '(not recorded)'}, not with this torch {this}"
    elif v.confirmed and not confirmed:
        reason = "confirmed by a rule zhantune no longer uses (docs/timing.md): settle it again"
    claimed = store.config_best(v.device_id, v.problem_id, v.config_hash) if v.config_hash else None
    ratio = v.ratio if v.ratio_low is not None and v.ratio_high is not None else None  # a row without its range
    return SpeedupVerdict(ratio, v.ratio_low, v.ratio_high, v.rounds or 0, v.contended or 0, confirmed, reason), claimed


def claim_verdict(store: Any, study_id: int) -> Any:
    """The stored verdict a finished study's claim is read from (:func:`stored_claim`): the newest on
    the config of the study's newest verdict (Store.study_verdict), whoever settled it (a replay of a
    table with that entry, another study), as the export reads it (Store.latest_verdicts: this torch's
    release first); None where the study stored none."""
    from zhantune.provenance import software_versions

    newest = store.study_verdict(study_id)
    if newest is None:
        return None
    key = (newest.device_id, newest.problem_id, newest.config_hash)
    v = store.latest_verdicts(software_versions()["torch"]).get(key)
    return v or store.latest_verdicts().get(key) or newest  # every torch's verdicts read only where needed


@dataclass
class TuneResult:
    """What a tune did; rows are measurement rows (zhantune.storage.MeasurementRow), times in us."""

    study_name: str
    study_id: int
    eager: MeasurementRow | None
    default: MeasurementRow | None
    best: MeasurementRow | None
    statuses: collections.Counter = field(default_factory=collections.Counter)
    infeasible: int = 0
    cached: int = 0
    measured: int = 0
    interrupted: bool = False
    table_path: Path | None = None
    table_keys: list[str] = field(default_factory=list)
    #: the close call's: "clear", "tie" (within noise after re-measuring, or the rounds favouring the
    #: config the ranking puts second), "unconfirmed" (clear but
    #: measured on a busy machine) or None (fewer than two correct configs)
    verdict: str | None = None
    verdict_text: str | None = None
    #: timed rows taken on a busy machine, and what was done about it (zhantune.bench.conditions)
    contention: ContentionCount = field(default_factory=ContentionCount)
    #: set when the winner and the default were re-measured interleaved (zhantune.bench.settle)
    speedup_text: str | None = None
    #: the settled speedup claim over the default; None: not settled
    claim: SpeedupVerdict | None = None
    #: the config the claim is about: the best one a table can carry (``best`` unless that one is
    #: not carried, ``not_carried``)
    claimed: MeasurementRow | None = None
    #: CPU: Inductor's default compile without freezing (shown beside the frozen default)
    default_unfrozen: MeasurementRow | None = None
    #: why a lookup table cannot carry the best config on this device (a compile-wide setting on
    #: CUDA: fusion limits, TF32), or None; the summary says so and the table does not ship it
    not_carried: str | None = None
    #: what the run's table ships under this problem's key (zhantune.inductor.builder.Shipped: the
    #: tuned row, or None for Inductor's default, and whether a shared key made it so); None: no
    #: table was written (export off, an interrupted run, a replay)
    shipped: Any = None
    #: search.transfer: the prior the search started from; None: a cold start
    transfer: Prior | None = None
    #: one line on what transfer did (or why it did nothing), for the summary; None: nothing to say
    transfer_text: str | None = None
    #: one line on the fastest config of another torch release measured again with this one
    #: (:func:`other_release_best`), for the summary; None: none was
    carried_text: str | None = None
    #: one line on trials of the budget claimed by workers that stored no result, with heartbeats off
    #: (:func:`held_claims_text`); None: none
    held_text: str | None = None
    #: the study's budget of measured trials (``search.n_trials``, or what it held plus
    #: ``search.more_trials``) and the trials earlier runs had measured
    target: int = 0
    before: int = 0
    #: the study had measured its budget (or every feasible point) before: nothing was run
    already_finished: bool = False
    #: every feasible point of the space is measured
    exhausted: bool = False
    #: a finished study run again only to settle its speedup anew (its last paired rounds were taken
    #: on a busy machine; settle_again): no search
    resettled: bool = False
    #: why a finished study's settles, due again, were not run (the machine busy: busy_text)
    settle_deferred: str | None = None
    #: the baselines came from the database (measured by an earlier run in this environment)
    baselines_reused: bool = False
    #: of ``measured``: points of dead workers' trials measured again by this worker
    retried: int = 0
    #: dead workers' trials this worker failed (heartbeat older than storage.grace_period_s)
    reaped: int = 0
    #: measured candidates of the whole study (every worker) when this worker's search ended
    study_measured: int = 0
    #: seconds this worker waited for other workers' trials once every remaining trial was claimed
    waited_s: float = 0.0

    @property
    def same_kernel_as_default(self) -> bool:
        """The config the claim is about (``claimed``; ``best`` where nothing was settled) is the very
        kernel Inductor's default compile runs (the ``aten`` config; zhantune.bench.settle
        .is_default_kernel): a difference between the two is noise, never a speedup (the summary says
        so). From the rows, so that a finished study's result, read from the database, says it as
        the run that measured it did."""
        from zhantune.bench.settle import is_default_kernel

        row = self.claimed or self.best
        return row is not None and is_default_kernel(row)

    @property
    def done(self) -> int:
        """Measured trials of the study after this run (all runs and workers that used its budget;
        a claim whose trial has no measurement, a killed worker's, is not one)."""
        return max(self.before + self.measured, self.study_measured)


def settle_again(run: Any, store: Any, study_id: int) -> bool:
    """Whether a finished study's settles run again: its newest verdict is unconfirmed for paired
    rounds taken on a busy machine (decision.judge_speedup), confirmed under a rule since replaced
    (decision.claim_holds) or from rounds timed before zhantune checked how long their threads waited
    for a core (Store.rounds_unchecked_for_waiting), or settled with another torch (a claim holds for
    the torch its rounds ran with), and this run settles (``bench.remeasure_rounds`` > 0, not a
    replay; ``run``: a RunSpec). Judged on the study's newest verdict, and on the one its summary
    reports (:func:`claim_verdict`) where that is newer: a helper found a busy replay's later verdict
    on the study's config reported, with "rerun the same command on an idle machine", by reruns that
    never settled (they read the study's own). A "no claim" of the study's own newer than the claim
    reported (the default's kernel won a re-settle's close call) ends it, as before."""
    if run.replay is not None or not run.bench.remeasure_rounds:
        return False
    own, reported = store.study_verdict(study_id), claim_verdict(store, study_id)
    newer = (reported is not None and own is not None  # newest as the store orders them (a merge keeps created_at)
             and (reported.created_at, reported.id) > (own.created_at, own.id))
    return _due(store, own) or (newer and _due(store, reported))


def _due(store: Any, v: Any) -> bool:
    """Whether stored verdict ``v`` is due to be settled again (:func:`settle_again`)."""
    return v is not None and bool(v.rounds) and v.ratio is not None and (
        (not v.confirmed and bool(v.contended)) or (v.confirmed and not claim_holds(v))
        or v.torch_version != software_versions()["torch"]
        or (v.confirmed and store.rounds_unchecked_for_waiting(v)))


def busy_text(run: Any) -> str | None:
    """Why a finished study's settles, due again (:func:`settle_again`), wait for another run: the
    machine is still busy after ``bench.busy_wait_s`` (zhantune.bench.conditions.wait_until_idle),
    so paired rounds would be disturbed again and unconfirmed (a newcomer's reruns on a busy
    machine each spent 33 s re-settling, never converging); None when it is idle."""
    from zhantune.bench.conditions import wait_until_idle

    waited = wait_until_idle(run.bench.busy_wait_s, run.device.kind, run.device.index)
    if not waited["busy_at_start"]:
        return None
    return (f"the machine is still busy after {waited['waited_s']:.1f} s (bench.busy_wait_s): its paired rounds "
            "run again when this command finds it idle")


def held_claims_text(run: Any, store: Any, study_id: int, target: int) -> str | None:
    """With heartbeats off (``storage.heartbeat_interval_s=null``), the line saying that the study's
    budget is short of measured trials by claims of workers that stored no result (running
    elsewhere, or killed: then never released; a helper's rerun printed "0 measured ... the study
    holds 9 of 10" with no reason); None with heartbeats on (a dead claim is retried) or none held."""
    if run.storage.heartbeat_interval_s:
        return None
    measured, in_flight = store.trial_counts(study_id)
    if not in_flight or measured >= target:
        return None
    return (f"{in_flight} trial(s) of the budget are claimed by workers that stored no result: still running "
            "elsewhere, or killed; with storage.heartbeat_interval_s=null a killed worker's claim is never "
            "released: rerun with heartbeats on (the default) to measure them")


def own_rows(run: Any, study_id: int) -> int | None:
    """The study whose rows alone answer a run (its best, its cache hits): a replay's own, so that a
    second recording of one device and problem is never answered from the first's; None (every
    study's rows of the device and problem) for a tune."""
    return study_id if run.replay is not None else None


def study_best(run: Any, store: Any, study_id: int) -> Any:
    """The best correct candidate row of the run's problem that the study ranks, as :func:`ranked_rows`."""
    torch = _torch(run, store)
    return next((m for _, p, (m, *_) in store.ranked_candidates(run.device.key, torch, 1, own_rows(run, study_id))
                 if p.key == run.problem.key), None)


def ranked_rows(store: Any, run: Any, problem_id: int, top_k: int) -> list[Any]:
    """A problem's configs on the run's device, fastest first (Store.ranked_candidates), of this torch's
    release for a tune (the export's ranking: another release's rows compiled other kernels), or,
    while the device holds no candidate of this release at all (a finished study rerun after a
    torch upgrade), of every release: its settle re-measures the old best here."""
    return next((rows for _, prob, rows in store.ranked_candidates(run.device.key, _torch(run, store), top_k)
                 if prob.id == problem_id), [])


def other_release_best(store: Any, run: Any, problem_id: int, device_id: int) -> Any:
    """The fastest config of the problem on the run's device, of every torch release, when it has no
    row of this release (a study resumed after a torch upgrade: its sampler takes the old release's
    points as tried, and the tune ranks this release's rows, so that config was never measured again
    and its result was lost); None for a replay, while this release has no candidate (the ranking
    then reads every release), or where this release measured that config (ok or failed: wrong
    output, a compile error or a timeout here keeps it out, zhantune.storage.Queries.incorrect_configs)."""
    if run.replay is not None or _torch(run, store) is None:
        return None
    this = {r.config_hash for r in ranked_rows(store, run, problem_id, 1 << 30)}
    every = next((rows for _, prob, rows in store.ranked_candidates(run.device.key, None, 1) if prob.id == problem_id), [])
    failed = store.incorrect_configs(software_versions()["torch"], failed_too=True)
    if not every or every[0].config_hash in this or device_id in failed.get((problem_id, every[0].config_hash), {}):
        return None
    return every[0]


def _torch(run: Any, store: Any) -> str | None:
    """The torch whose release's rows a tune ranks: this process's, None (every row) for a replay or
    where the device has no candidate of this release for the problem."""
    this = software_versions()["torch"]
    return this if run.replay is None and store.has_candidates(run.device.key, run.problem.key, this) else None


def refuse_other_timing(run: Any, store: Any) -> None:
    """A CPU tune ranks its rows with every study's of the problem on the device
    (Store.ranked_candidates) and answers trials from them (Store.cached); rows timed with the other
    ``bench.flush_cache`` (a cold last-level cache before every run, or a warm one) measure another
    thing (a helper's, session 48: a cached warm-cache ATen row, 24.9 us, ranked beside cold-cache
    rows of 100-157 us, "4.04x"). Raises ConfigError naming the option, how many rows were timed the
    other way, and what to do; nothing is measured or stored. Replays of recorded data and CUDA are not checked (a
    CUDA timing falls back from CUDA graphs to do_bench by itself, zhantune.bench.timing.time_cuda); a
    table's replay is, by zhantune.replay (:func:`refuse_other_flushing`)."""
    if run.replay is not None or run.device.kind != "cpu":
        return
    refuse_other_flushing(store, run.device.key, [run.problem.key], bool(run.bench.flush_cache),
                          "its rankings and cached trials would mix the two", ", or another storage.url")


def refuse_other_flushing(store: Any, device_key: str, problem_keys: list[str], flush: bool, why: str,
                          instead: str = "", mixed_ok: bool = False) -> None:
    """Raise ConfigError where ok rows of one of ``problem_keys`` on this CPU device were timed with the
    other ``bench.flush_cache`` than ``flush``: the first such problem, how many rows, ``why`` that
    matters and what to do (``instead``: a second way out). A tune's check (:func:`refuse_other_timing`)
    and a table replay's (zhantune.replay: its rows join the same rankings, compare's and the export's;
    ``mixed_ok``: not where rows of both are stored, a merged database's, which a replay cannot leave and
    whose rankings mix them already: a review found either value refused)."""
    want = cpu_timing_method(flush)
    for key in problem_keys:
        kinds = [(timing_kind(method) == want, n) for method, n in store.timing_methods(device_key, key).items()
                 if (method or "").startswith("cpu:")]
        other = sum(n for same, n in kinds if not same)
        if other and not (mixed_ok and any(same for same, _ in kinds)):
            raise ConfigError(
                f"bench.flush_cache={str(flush).lower()}: {other} measurement(s) of {key} on {device_key} in this "
                f"database were timed {'without' if flush else 'with'} flushing the cache before each run; {why}: "
                f"use bench.flush_cache={str(not flush).lower()}{instead}")


def same_space(stored: dict[str, Any] | None, run: Any) -> bool:
    """Whether the run that exhausted a study searched this run's space (the ``space=`` files' contents,
    the op's default spaces): another space has points the study never measured."""
    now = OmegaConf.to_container(run.cfg, resolve=True)
    return stored is not None and all(stored.get(k) == now.get(k) for k in ("space", "op"))
