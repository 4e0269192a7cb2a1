"""Decisions under one-sided noise: is a tuned config really faster than Inductor's default?

Timing noise on a shared machine only adds time (a descheduled thread costs a scheduler slice;
another process's kernel shares the GPU), so every decision uses the minimum of individually timed
runs (:func:`decision_us`), and a speedup is claimed only from paired, interleaved
rounds of the two kernels (:func:`judge_speedup`): never from two measurements taken minutes apart.
The claim is the median of the per-round ratios (the lower middle one of an even number of rounds),
each round's two measurements taken back to back:
this machine also has slow phases (the whole VM, or one vCPU, slower for seconds at a time,
docs/timing.md), which a round's two back-to-back sides share, but which a ratio of minimums taken
from different rounds would turn into a fast-phase default over a slow-phase winner (or the reverse).

A claim is **confirmed** when no paired measurement was disturbed (checked first: a ratio taken
on a busy machine says nothing, either way), every round (at least two) measured both sides, and
the tuned config was faster in every round by a margin the rounds' own disagreement cannot explain
(:func:`beyond_spread`: the log of the smallest per-round speedup above ``CONFIRM_C[rounds]`` times
the log of their largest over their smallest, for a 0.5% false-claim rate between kernels of equal
speed). "Faster in every round" alone is a sign test that two kernels of equal speed pass one time
in eight with three rounds: two copies of one kernel were "confirmed" in 27 of 246 settles on this
machine and an H200, by this rule in 3 of 216 (scripts/claim_noise.py, docs/timing.md). The spread
is of the paired ratios, not of either side's own times, so a slow phase of the machine, which
moves both sides of a round alike, does not widen it. A measurement is disturbed when it began
while other tasks held the cores (or, on CUDA, other processes used the GPU), or was contended
without real-time scheduling (zhantune.bench.settle; SCHED_FIFO, zhantune.bench.timing.realtime,
shields a run's minimum from preemption, enough to rank by, but under sustained load it still
moved a paired ratio from 1.4x to 1.8x). Otherwise it is unconfirmed, and the exporter ships
Inductor's default for that key. (Eager is no plausibility bound: at 64x64x64 on CPU the default
compile's per-call overhead makes it 3.9x eager's time, measured, and that is real.)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Round", "SpeedupVerdict", "judge_speedup", "ratio_spread", "beyond_spread", "claim_holds", "CONFIRM_C",
           "below_min_speedup", "DEFAULT_MIN_SPEEDUP", "paired_ratio", "decision_us", "decision_value", "rank_key",
           "best_per_config", "timing_kind", "cpu_timing_method"]


def decision_us(row: Any) -> float:
    """The statistic every decision uses (rank, close call, speedup, min_speedup), microseconds: the
    minimum of a measurement's individually timed runs (``min_us``; ``median_us`` where a row has no
    minimum). Noise on a shared machine only adds time (a descheduled thread costs a scheduler
    slice), so it cannot make this smaller than the kernel's own time; docs/timing.md has the
    measurements behind the choice. The median and the other statistics stay for people to read.
    Recorded data (a Kernel Tuner file replayed, timing method ``kerneltuner:...``) keeps its own
    objective, the median of its recorded times (docs/search.md). ``row``: anything with
    ``min_us``, ``median_us`` and ``timing_method`` (a measurement row or a query's row)."""
    return decision_value(row.min_us, row.median_us, row.timing_method)


def decision_value(min_us: float | None, median_us: float | None, method: str | None) -> float | None:
    """:func:`decision_us` from a row's columns (microseconds)."""
    if min_us is None or (method or "").startswith("kerneltuner"):
        return median_us
    return min_us


def cpu_timing_method(flush: bool) -> str:
    """The method a CPU timing records before its scheduling suffix (zhantune.bench.timing.time_cpu):
    "cpu:perf_counter", with ":flush" where the cache was flushed before each run."""
    return "cpu:perf_counter" + (":flush" if flush else "")


def timing_kind(method: str | None) -> str | None:
    """What a timing ``method`` measures, without how it was shielded or batched: ``:fifo`` and
    ``:nice<N>`` (the scheduling a run got, zhantune.bench.timing.time_cpu) and ``:batch=N`` (the
    runs a CUDA graph replay averages) dropped; ``:flush`` (a cold cache), the CUDA timer and a
    recorded file's objective kept. "cpu:perf_counter:flush:fifo" -> "cpu:perf_counter:flush"."""
    if method is None:
        return None
    return ":".join(p for p in method.split(":") if p != "fifo" and not p.startswith(("nice", "batch=")))


def rank_key(row: Any) -> tuple[float, int]:
    """How rows are ordered for every "best": the decision statistic, then the older row (its id)."""
    return decision_us(row), row.id or 0


def best_per_config(rows: Iterable[Any]) -> list[Any]:
    """The ranking rule, the one place it is written: each config (``config_hash``) is represented
    by its row with the lowest :func:`rank_key` (a config measured several times, as close calls and
    speedup settles re-measure, counts with its fastest row: measuring more never hides a fast run,
    and one-sided noise never makes a row too fast), and the configs come fastest first."""
    best: dict[Any, Any] = {}
    for row in rows:
        have = best.get(row.config_hash)
        if have is None or rank_key(row) < rank_key(have):
            best[row.config_hash] = row
    return sorted(best.values(), key=rank_key)


@dataclass(frozen=True)
class Round:
    """One interleaved round, microseconds (each side's minimum run; None when it failed).
    ``contended``: how many of this round's measurements were disturbed (begun while other tasks held
    the cores, or contended at normal priority; zhantune.bench.settle)."""

    default_us: float | None
    winner_us: float | None
    contended: int = 0


@dataclass(frozen=True)
class SpeedupVerdict:
    """The settled claim: ``ratio`` = the median of the per-round ratios default / winner (each
    round's two sides measured back to back; the lower middle one of an even number), with their
    range (``ratio_low``, ``ratio_high``); ``confirmed`` only for a speedup that held in every round,
    by the margin of :func:`beyond_spread`."""

    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    rounds: int
    contended: int
    confirmed: bool
    reason: str

    def claim_text(self) -> str:
        """"1.23x (rounds 1.18-1.27x, n=3)" or the reason there is no claim."""
        if self.ratio is None:
            return self.reason
        return f"{self.ratio:.2f}x (rounds {self.ratio_low:.2f}-{self.ratio_high:.2f}x, n={self.rounds})"


def paired_ratio(per_round: Iterable[float]) -> float:
    """The one rule for a paired comparison's ratio (a tune's claim, check's "vs default"): the
    median of the per-round ratios, of two middle rounds the lower (never half an odd round).
    Raises statistics.StatisticsError on no rounds."""
    return statistics.median_low(per_round)


#: rounds -> c: a claim needs log(smallest ratio) > c * log(largest / smallest ratio), c set so that
#: two kernels of equal speed pass 0.5% of the time (and faster in every round: from 8 rounds the
#: sign test alone, 1 in 256, is stricter); calibrated by simulation, 2M settles of per-measurement
#: noise Gaussian, exponential and Student-t(3), the largest c of the three (Gaussian's)
CONFIRM_C = {2: 31.6, 3: 2.52, 4: 0.83, 5: 0.38, 6: 0.17, 7: 0.05}


def ratio_spread(ratios: Iterable[float]) -> float:
    """How much paired ratios (default / winner, each pair measured back to back) disagree: their
    largest over their smallest (1.0 for one ratio). Noise moves each pair's ratio; a slow phase of
    the machine moves both sides of a pair alike and leaves it. Raises ValueError on no ratios."""
    ratios = list(ratios)
    return max(ratios) / min(ratios)


def beyond_spread(low: float, high: float, rounds: int) -> bool:
    """The rule's margin: the smallest per-round speedup ``low`` (> 1) exceeds the rounds'
    disagreement, ``log(low) > CONFIRM_C[rounds] * log(high / low)``: a speedup that n paired rounds
    tell from noise with a 0.5% false-claim rate for kernels of equal speed. False for one round.
    Ratios equal in every round (replayed data answers each measurement alike) pass for any speedup;
    scripts/claim_calibration.py derives ``CONFIRM_C`` and prints the rule's power."""
    if rounds < 2 or low <= 1.0:
        return False
    return math.log(low) > CONFIRM_C.get(rounds, 0.0) * math.log(high / low)


def claim_holds(verdict: Any) -> bool:
    """Whether a stored verdict (a zhantune.storage.orm.Verdict row) carries a speedup claim under the
    rule in use: confirmed, and :func:`beyond_spread` on its rounds' ``ratio_low`` and ``ratio_high``.
    Verdicts stored under earlier rules (until 2026-11-27 "faster in every round", one round
    included; then two variants the same day) are re-judged with this by the export and compare,
    and settled again by zhantune.tune_result.settle_again when their tune is rerun."""
    v = verdict
    return bool(v is not None and v.confirmed and v.ratio is not None and v.ratio_low and v.ratio_high
                and beyond_spread(v.ratio_low, v.ratio_high, v.rounds or 0))


def claim_status(verdict: Any, other_torch: Any, min_speedup: float | None, torch: str) -> str | None:
    """None where a stored ``verdict`` (the newest with this ``torch`` release, Store.latest_verdicts)
    carries a claim that the export ships: :func:`claim_holds`, and a ratio of at least
    ``min_speedup`` (None: any confirmed claim). Else why not: "confirmed with torch X, not with
    this torch Y" (``other_torch``: the newest verdict of any torch; "never paired with this torch
    Y; with torch X: not confirmed: REASON" where that one did not confirm it), "confirmed at
    R.RRRx, below min_speedup", "not confirmed: REASON" (paired rounds that did not confirm it), or
    "never paired with the default" (no verdict, or one of no rounds). The one wording of export, compare's table,
    its JSON and its report."""
    if claim_holds(verdict) and (min_speedup is None or verdict.ratio >= min_speedup):
        return None
    unjudged = verdict is None or not verdict.rounds  # none here, or this torch's note that no claim was made
    if unjudged and other_torch is not None and other_torch is not verdict and claim_holds(other_torch):
        return f"confirmed with torch {other_torch.torch_version or '(not recorded)'}, not with this torch {torch}"
    if unjudged and other_torch is not None and other_torch is not verdict and other_torch.rounds:
        return (f"never paired with this torch {torch}; with torch {other_torch.torch_version or '(not recorded)'}: "
                f"not confirmed: {other_torch.reason}")
    if claim_holds(verdict):
        return f"confirmed at {verdict.ratio:.3f}x, below min_speedup"
    if verdict is not None and verdict.rounds:  # the reason once ("not confirmed: unconfirmed: ..." it read)
        return f"not confirmed: {verdict.reason.removeprefix('unconfirmed: ')}"
    return "never paired with the default"


def judge_speedup(rounds: list[Round]) -> SpeedupVerdict:
    """Settle a speedup claim from paired, interleaved rounds (module docstring for the rules)."""
    n = len(rounds)
    contended = sum(r.contended for r in rounds)
    # a side measured (a positive, finite time: a NaN would slip past min and max, and confirm)
    ok = [r for r in rounds if all(t is not None and 0 < t < math.inf for t in (r.default_us, r.winner_us))]
    if not ok:
        return SpeedupVerdict(None, None, None, n, contended, False, "no round measured both sides")
    per_round = [r.default_us / r.winner_us for r in ok]
    ratio = paired_ratio(per_round)
    low, high = min(per_round), max(per_round)

    def verdict(confirmed: bool, reason: str) -> SpeedupVerdict:
        return SpeedupVerdict(ratio, low, high, n, contended, confirmed, reason)

    if contended:  # first: a ratio taken so says nothing, either way (nor does a flip)
        return verdict(False, f"unconfirmed: {contended} paired measurement(s) taken on a busy machine (other "
                              "work on the cores or the GPU when they began, their threads kept waiting for a core, or "
                              "no real-time scheduling); rerun the "
                              "same command on an idle machine (a finished tune's rerun runs its paired rounds again, "
                              "not its search)")
    if ratio <= 1.0:
        return verdict(False, f"not faster than the default ({ratio:.2f}x)")
    if len(ok) < n:
        return verdict(False, f"unconfirmed: {n - len(ok)} of {n} rounds failed to measure both sides")
    if low <= 1.0:
        return verdict(False, f"unconfirmed: the default was as fast or faster in a round (rounds {low:.2f}-{high:.2f}x)")
    if n < 2:
        return verdict(False, "unconfirmed: one paired round cannot tell a speedup from noise "
                              "(bench.remeasure_rounds=2 or more settles a claim)")
    if not beyond_spread(low, high, n):
        return verdict(False, f"unconfirmed: the smallest round's speedup ({low:.3f}x) is too small for how much "
                              f"the rounds disagree ({ratio_spread(per_round):.3f}x, their largest ratio over their "
                              f"smallest): noise could have made it")
    return verdict(True, "confirmed in every round, beyond the rounds' disagreement")


def against_fastest(verdict: SpeedupVerdict, default_us: Iterable[float | None],
                    winner_us: Iterable[float | None]) -> SpeedupVerdict:
    """A confirmed ``verdict`` checked against every measurement of the two kernels in this run
    (microseconds, each row's decision statistic: the run's baseline and search rows too, not only the
    rounds'; never another run's): noise only adds time, so the default's fastest at or below the
    winner's fastest contradicts the speedup, whatever the rounds agreed on. A helper measured it: the default's
    compiled kernel ran 85-89 us through a settle's rounds and 76.6 us as its baseline, the winner
    78.3-79.7 us, and three rounds confirmed 1.09x for two kernels that replays found equal (13
    settles, 0.91-1.23x). Unconfirmed then, its ratio kept; other verdicts are returned as they are."""
    if not verdict.confirmed:
        return verdict
    d = min((t for t in default_us if t is not None and 0 < t < math.inf), default=None)
    w = min((t for t in winner_us if t is not None and 0 < t < math.inf), default=None)
    if d is None or w is None or d > w:
        return verdict
    return dataclasses.replace(verdict, confirmed=False, reason=(
        f"unconfirmed: the default's fastest measurement in this run ({d:,.1f} us) is as fast as the winner's "
        f"({w:,.1f} us): the rounds' difference is not the kernels' (noise only adds time)"))


def against_other_runs(verdict: SpeedupVerdict, runs: Iterable[tuple[float, float, Any, str]]) -> SpeedupVerdict:
    """A confirmed ``verdict`` checked against this machine's other runs of the same two kernels:
    ``runs`` holds, for each other run with the same host, software and timing method that measured
    both, neither on a busy machine (Store.other_runs_of_pair), the default's fastest and the winner's
    fastest (microseconds), when, and its study. Noise only adds time, so a run whose default was at
    or below its own winner contradicts the speedup, as :func:`against_fastest` judges this run's
    rows; one such run is enough. A slow phase that outlasts a tune can slow one kernel more than the other (a helper's, 2026-11-30: the default 278-306 us through five tunes'
    baselines and rounds, the C++ template 233-249 us, three rounds agreeing on 1.21-1.25x; in other
    runs the same default 210-227 us, the template 230-233 us). Each run against itself, never one
    run's default against another's winner: a phase of the whole machine (both 1.25x slower) between
    two runs would then sink a real claim, and the default (measured by every tune) would be taken
    over more phases than the winner. Unconfirmed then, its ratio kept (the table ships the default);
    other verdicts are returned as they are."""
    if not verdict.confirmed:
        return verdict
    against = min(((d / w, d, w, when, study) for d, w, when, study in runs if 0 < w < math.inf and d <= w), default=None,
                  key=lambda x: x[0])
    if against is None:
        return verdict
    _, d, w, when, study = against

    def reason(where: str) -> str:
        return (f"unconfirmed: {_when(when)} on this machine (same host, software and timing method{where}) "
                f"measured the default as fast as the winner (their fastest {d:,.1f} us and {w:,.1f} us, neither "
                "on a busy machine): the rounds' difference may be this run's phase of the machine, not the "
                "kernels' (noise only adds time)")

    text = reason(f"; study {study}")  # Verdict.reason holds 500 characters
    return dataclasses.replace(verdict, confirmed=False, reason=text if len(text) <= 500 else reason(""))


def _when(at: Any) -> str:
    """"a run of 2026-11-30 11:45 UTC" (``at``: when that run stored its first row; a naive time, as
    SQLite gives it back, is UTC, as zhantune stores it)."""
    if at is None:
        return "another run"
    if at.tzinfo is not None:
        at = at.astimezone(dt.timezone.utc)
    return f"a run of {at:%Y-%m-%d %H:%M} UTC"


#: export.min_speedup's default: two copies of one kernel were confirmed 1.002-1.015x apart on a
#: 2-vCPU Xeon and an H100 by the rule above (docs/timing.md, scripts/claim_noise.py)
DEFAULT_MIN_SPEEDUP = 1.02


def below_min_speedup(claim: Any, export: Any) -> float | None:
    """``export.min_speedup`` (zhantune.config.ExportConfig) where ``claim`` (a confirmed Verdict) is
    below it, so that the export ships Inductor's default (zhantune.inductor.builder.build_table);
    None where the claim clears it, there is no claim, or no export options (no check)."""
    floor = getattr(export, "min_speedup", None)
    if floor is None or claim is None or not claim.confirmed or claim.ratio is None:
        return None
    return floor if claim.ratio < floor else None


def other_torch_table(export: Any) -> str | None:
    """``export.torch_version`` (zhantune.config.ExportConfig) where it names another torch than this
    process's: a table of that torch ships only claims confirmed with it
    (zhantune.inductor.builder.table_torch), never this run's; None otherwise (no option, no export)."""
    want = getattr(export, "torch_version", None)
    if want is None or not getattr(export, "enabled", True):  # export.enabled=false: no table at all
        return None
    from zhantune.provenance import software_versions

    return None if want == software_versions()["torch"] else str(want)
