"""A tune's settles: re-measure what a decision hangs on, interleaved, before it is reported.

* the **close call** (:func:`settle_close_call`): the two fastest configs within each other's
  noise (or first only by the fastest run, the runner-up's runs faster) are measured again in
  alternating rounds, and the ranking then uses each config's lowest decision statistic;
* the **speedup claim** (:func:`settle_speedup`): the winner a table can carry and Inductor's
  default are measured in paired, interleaved rounds and judged by
  zhantune.bench.decision.judge_speedup; an unconfirmed claim ships Inductor's default.

The caller (zhantune.tune) reads the ranked rows from the store and stores the new rows through
``record``; nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zhantune import interrupt
from zhantune.bench.conditions import disturbs_claim
from zhantune.bench.decision import (
    Round,
    SpeedupVerdict,
    against_fastest,
    against_other_runs,
    beyond_spread,
    decision_us,
    judge_speedup,
    rank_key,
)
from zhantune.bench.measurement import Measurement
from zhantune.bench.protocol import Benchmarker
from zhantune.candidate import Candidate
from zhantune.inductor.templates import is_default_kernel as default_kernel

__all__ = ["rebuild_candidate", "settle_close_call", "settle_speedup", "SpeedupSettle", "is_default_kernel", "Record"]

#: stores one re-measurement as a row and returns it: (measurement, kind, candidate or None) -> row
Record = Callable[[Measurement, str, Candidate | None], Any]


def rebuild_candidate(row: Any, branches: Sequence[Any]) -> Candidate | None:
    """The candidate a stored row measured, rebuilt from this run's space; None when its branch is
    not in it (a row another study's space measured)."""
    branch = next((b for b in branches if b.name == row.branch), None)
    return None if branch is None else Candidate(row.branch, branch.scope, row.template_id, dict(row.params))


def settle_close_call(ranked: Sequence[Any], branches: Sequence[Any], bench: Benchmarker, record: Record,
                      rounds: int) -> tuple[str | None, str | None]:
    """(verdict, sentence) on the two fastest configs ``ranked`` (rows, fastest first, as
    Store.ranked_candidates gives them): None, None with fewer than two; "clear" when they are not
    within each other's noise (:func:`zhantune.bench.timing.is_tie`) and the first one's runs are
    the faster ones (its 80th percentile below the runner-up's 20th: a first place by the fastest run
    alone, against the runner-up's faster spread, is a close call); else both are measured
    ``rounds`` more times, interleaved, stored through ``record`` (kind ``remeasure``), and the
    verdict is "clear" where the rounds agree on which is faster by a margin their disagreement
    cannot explain (the rule of a speedup claim, zhantune.bench.decision.beyond_spread, on each
    round's ratio of the two; two identical kernels pass it in under 1% of settles, where the
    rounds' ranges not overlapping passed 13% at 3 rounds) and that one is first by the ranking
    (each config's fastest run, which the table uses), else "tie" (the sentence says where the
    rounds favour the config the ranking puts second); "unconfirmed" where it would
    be "clear" but a measurement it rests on was taken on a busy machine (:func:`_disturbed`); the
    sentence names the configs in the order the ranking now gives."""
    from zhantune.bench.timing import run_range_us

    if len(ranked) < 2:
        return None, None
    a, b = ranked[:2]
    (a20, a80), (b20, b80) = run_range_us(a), run_range_us(b)
    if a80 < b20:  # not within each other's noise (timing.is_tie), and the first one's runs the faster
        busy = _disturbed(a) or _disturbed(b)  # a slow phase under one of them could have set them apart
        return ("unconfirmed" if busy else "clear"), (
            f"clear winner in the search's own runs (not re-measured): its runs' 20th-80th percentiles "
            f"{a20:,.1f}-{a80:,.1f} us, the runner-up's {b20:,.1f}-{b80:,.1f} us; a ranking, not a "
            "speedup claim" + ("; unconfirmed: measured on a busy machine, noise could have made it" if busy else ""))
    cands = [rebuild_candidate(row, branches) for row in (a, b)]
    if None in cands:  # measured by another space (a cached row): cannot be rebuilt here
        return "tie", "close call with a config outside this space: not re-measured"
    pairs: list[tuple[float, float]] = []  # each round's two decision statistics, where both measured
    busy = 0  # rounds a paired comparison cannot vouch for (zhantune.bench.conditions.disturbs_claim)
    with interrupt.interruptible():
        for i in range(rounds):  # the order alternates, as a speedup claim's rounds do
            order = (0, 1) if i % 2 == 0 else (1, 0)
            got = dict(zip(order, (record(bench.measure(cands[j]), "remeasure", cands[j]) for j in order), strict=True))
            if all(row.status == "ok" for row in got.values()):
                pairs.append((decision_us(got[0]), decision_us(got[1])))
                busy += any(_disturbed(row) for row in got.values())
    if not pairs:
        return "tie", "close call: a re-measurement failed"
    # the two configs in the order the ranking now gives (one rule for every "best")
    best_us = [min(decision_us(a), *(p[0] for p in pairs)), min(decision_us(b), *(p[1] for p in pairs))]
    first, second = (0, 1) if best_us[0] <= best_us[1] else (1, 0)
    ratios = [pb / pa for pa, pb in pairs]  # > 1: a faster in that round
    n, low, high = len(ratios), min(ratios), max(ratios)
    # the config every round found faster by the claim rule's margin (None: none such)
    clear = 0 if beyond_spread(low, high, n) else 1 if beyond_spread(1 / high, 1 / low, n) else None
    tied = clear is None
    spans = [f"{min(p[i] for p in pairs):,.1f}-{max(p[i] for p in pairs):,.1f} us" for i in (0, 1)]
    if clear is not None and clear != first:  # the rounds say the other one: no clear winner
        return "tie", (
            f"close call re-measured {rounds}x interleaved, each round's fastest run: {cands[first].describe()} "
            f"{spans[first]}, {cands[second].describe()} {spans[second]}; every round found the second faster, "
            f"yet the first one's single fastest run ({best_us[first]:,.1f} us, against {best_us[second]:,.1f} us) "
            "ranks it first (it would be a table's entry only where its speedup over Inductor's default is "
            "confirmed): the rounds and the ranking disagree, no clear winner"
            + (f" ({busy} of {n} round(s) taken on a busy machine)" if busy else ""))
    if not tied and busy:
        return "unconfirmed", (
            f"close call re-measured {rounds}x interleaved: {cands[first].describe()} ranked before "
            f"{cands[second].describe()} ({best_us[first]:,.1f} us before {best_us[second]:,.1f} us, each config's "
            f"fastest run); unconfirmed: {busy} of {n} round(s) taken on a busy machine, noise could have set them apart")
    return ("tie" if tied else "clear"), (
        f"close call re-measured {rounds}x interleaved, each round's fastest run: {cands[first].describe()} "
        f"{spans[first]}, {cands[second].describe()} {spans[second]}; ranked by each config's fastest run of the "
        f"search and the rounds, {best_us[first]:,.1f} us before {best_us[second]:,.1f} us; "
        + (_tie_text(ratios if first == 0 else [1 / r for r in ratios], busy) if tied
           else "now a clear winner in every round (a ranking, not a speedup claim)"))


def _tie_text(ratios: list[float], busy: int) -> str:
    """The end of a tied close call's sentence; ``ratios``: each round's second / first (> 1: the
    first faster in that round). A helper's attack found "a tie, either is fine" printed where the
    first was 1.18-1.48x faster in every round (the rounds' disagreement too large for the rule); a
    review, the mirror case, where the table ships the first."""
    lo, hi = min(ratios), max(ratios)
    on_busy = f" ({busy} of {len(ratios)} round(s) taken on a busy machine)" if busy else ""
    if lo > 1:
        return (f"every round found the first faster ({lo:.2f}-{hi:.2f}x), by less than the rounds disagree: no "
                f"clear winner{on_busy}; the first ranks first")
    if hi < 1:
        return (f"every round found the second faster ({1 / hi:.2f}-{1 / lo:.2f}x), by less than the rounds "
                f"disagree: no clear winner{on_busy}; the first ranks first by its single fastest run (it would be "
                "a table's entry only where its speedup over Inductor's default is confirmed)")
    return f"still within the noise: a tie, either is fine{on_busy}"


@dataclass
class SpeedupSettle:
    """What :func:`settle_speedup` found: the verdict (stored as a zhantune.storage.orm.Verdict),
    the default's row with the lowest decision statistic, and the summary's sentence (None when no
    rounds ran)."""

    verdict: SpeedupVerdict
    default: Any
    text: str | None = None


def _no_claim(default: Any, reason: str) -> SpeedupSettle:
    return SpeedupSettle(SpeedupVerdict(None, None, None, 0, 0, False, reason), default)


def settle_speedup(best: Any, default: Any, branches: Sequence[Any], bench: Benchmarker, record: Record,
                   rounds: int, candidate: Candidate | None = None, earlier: Sequence[Any] = (),
                   other_runs: Callable[[str | None], Any] | None = None) -> SpeedupSettle:
    """Settle the speedup claim of ``best`` (the fastest row a table can carry) over Inductor's
    default (``default``, its ok row; always, not only when their times overlap): one measurement of
    each first (it compiles what is not kept compiled; stored, not judged), then ``rounds``
    interleaved rounds of the default (Benchmarker.measure_default) and the winner, their order
    alternating, judged by zhantune.bench.decision.judge_speedup; rows are stored through
    ``record`` as kinds ``default`` and ``remeasure``. No rounds
    (and no claim) when the winner is the kernel the default compile runs (:func:`is_default_kernel`),
    when ``rounds`` is 0, or when its branch is not in ``branches`` (a row of another space).
    ``candidate``: the candidate ``best`` measured, where the caller has it (a table's replay, which
    has no space); else rebuilt from ``branches``. ``earlier``: rows of the two this run measured
    before the settle (a default's baseline of kind ``default``, the winner's search row), which
    zhantune.bench.decision.against_fastest weighs with the settle's own; never another run's (another
    machine of the device key, another phase, another torch). ``other_runs``: given the settle's
    timing method, each other run on this machine that measured both (zhantune.storage.Recorder.other_runs),
    which zhantune.bench.decision.against_other_runs weighs; called only for a claim the rounds and
    this run's rows confirm."""
    if is_default_kernel(best):
        return _no_claim(default, "the winner is the kernel Inductor's default compile runs: no speedup to claim")
    if rounds == 0:
        return _no_claim(default, "not settled (bench.remeasure_rounds=0): no paired rounds, no claim")
    cand = candidate or rebuild_candidate(best, branches)
    if cand is None:  # the winner was measured by another space (a cached row)
        return _no_claim(default, "the winner was measured by another study's space: not re-measured, no claim")
    paired, defaults = [], [default]
    seen_default = [r for r in earlier if r.kind == "default"]  # against_fastest's evidence: this run's rows
    seen_winner = [r for r in earlier if r.kind != "default"]

    def measure(side: str) -> Any:
        """One measurement of ``side`` (default or winner), stored; an ok row is kept."""
        meas = bench.measure_default() if side == "default" else bench.measure(cand)
        row = record(meas, "default", None) if side == "default" else record(meas, "remeasure", cand)
        if meas.ok:
            (seen_default if side == "default" else seen_winner).append(row)
            if side == "default":
                defaults.append(row)
        return row

    with interrupt.interruptible():
        # round 0, not judged (a compile may fall between its two sides): both sides compiled (and
        # kept, zhantune.bench.kept), so that each round's two timings run back to back, never with
        # a compile between them
        for side in ("default", "winner"):
            measure(side)
        for i in range(rounds):
            got = {side: measure(side) for side in (("default", "winner") if i % 2 == 0 else ("winner", "default"))}
            paired.append(Round(*(decision_us(got[s]) if got.get(s) is not None and got[s].status == "ok"
                                  else None for s in ("default", "winner")),
                                contended=sum(1 for r in got.values() if _disturbed(r))))
    # the rounds' verdict, then against every measurement of the two in this run (the baseline's, the
    # search's), then against this machine's other runs of the two
    verdict = against_fastest(judge_speedup(paired), map(_ok_us, seen_default), map(_ok_us, seen_winner))
    if verdict.confirmed and other_runs is not None:
        verdict = against_other_runs(verdict, other_runs(seen_winner[-1].timing_method))
    text = (f"speedup vs default, median of {len(paired)} paired interleaved round(s) (each side's fastest run, "
            "back to back): "
            f"{verdict.claim_text()}" + ("" if verdict.confirmed or verdict.ratio is None else f"; {verdict.reason}"))
    return SpeedupSettle(verdict, min(defaults, key=rank_key), text)


def _ok_us(row: Any) -> float | None:
    """An ok row's decision statistic (microseconds), None for any other."""
    return decision_us(row) if row is not None and row.status == "ok" else None


def _disturbed(row: Any) -> bool:
    """A timed row a paired round cannot vouch for (zhantune.bench.conditions.disturbs_claim)."""
    return disturbs_claim(row.conditions, row.contended, row.timing_method)


def is_default_kernel(row: Any) -> bool:
    """The very kernel Inductor's default compile runs (a measured row; the rule is
    zhantune.inductor.templates.is_default_kernel), so re-measuring it against the default decides
    nothing and a table ships Inductor's default entry for it."""
    return default_kernel(row.template_id, row.params)
