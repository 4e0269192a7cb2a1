"""The search loop shared by the tune job and the offline strategy benchmark (ask/tell over a Space).

Budget rules: a point that violates a constraint is told PRUNED and never measured; a candidate
already measured (``cached`` answers it) is told its stored value; neither uses the budget of
``n_trials`` measured candidates. The study's trials are the only search state, so a resumed study
or several workers on one storage continue from everything measured so far.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from zhantune import interrupt
from zhantune.search.space import Candidate, Space
from zhantune.search.study import (
    INTERRUPTED_ATTR,
    ask,
    feasible_size,
    random_feasible_point,
)

__all__ = ["SearchStats", "Outcome", "run_search", "bind_sampler", "DuplicateTrial", "BudgetSpent"]


class DuplicateTrial(Exception):
    """Raised by ``measure`` when another worker already stored this trial (an enqueued point that
    two workers popped at once: Optuna's SQLite storage cannot lock the row). Not counted."""


class BudgetSpent(Exception):
    """Raised by ``claim`` when the study's budget of measured trials is used up (other workers
    sharing the study measured the rest): the search stops, the asked point is left unmeasured."""


#: the result of measuring (or looking up) one candidate: objective in microseconds, None when failed
Outcome = float | None


@dataclass
class SearchStats:
    measured: int = 0
    infeasible: int = 0
    cached: int = 0
    asks: int = 0
    #: points another worker was already measuring (told PRUNED, not measured twice)
    duplicates: int = 0
    interrupted: bool = False
    exhausted: bool = False
    #: ``claim`` raised BudgetSpent: the study's budget was used up by all its workers together
    budget_spent: bool = False


def bind_sampler(sampler: optuna.samplers.BaseSampler, space: Space, problem_vars: dict) -> None:
    """Give a space-aware sampler (zhantune.search.FeasibleTPESampler) the space before it samples."""
    bind = getattr(sampler, "bind", None)
    if callable(bind):
        bind(space, problem_vars)


def _feasible_total(sampler: optuna.samplers.BaseSampler, space: Space, problem_vars: dict) -> int | None:
    fs = getattr(sampler, "feasible_set", None)
    if fs is not None:
        return len(fs)
    sizes = feasible_size(space, problem_vars)
    return sum(f for _, f in sizes.values()) if sizes else None


def run_search(study: optuna.Study, space: Space, problem_vars: dict,
               measure: Callable[[Candidate, int], Outcome], *, n_trials: int,
               cached: Callable[[Candidate], tuple[bool, Outcome]] | None = None,
               claim: Callable[[Candidate, int], bool] | None = None,
               release: Callable[[Candidate], None] | None = None,
               timeout_s: float | None = None, seed: int = 0, max_asks_per_trial: int = 50,
               prepare: Callable[[Candidate], None] | None = None, lookahead: int = 0) -> SearchStats:
    """Ask/tell until ``n_trials`` candidates were measured, the space is exhausted or time is up.

    ``measure(candidate, trial_number)`` returns the objective (microseconds) or None for a failed
    measurement; ``cached(candidate)`` returns (hit, outcome); ``claim(candidate, trial_number)``
    returns False when another worker sharing the study is measuring that candidate (the trial is told
    PRUNED) and raises BudgetSpent when the study's budget is used up (the search stops);
    ``release(candidate)`` undoes a claim whose measurement was interrupted. A KeyboardInterrupt
    (Ctrl-C, or SIGTERM routed by :func:`zhantune.interrupt.install`) during a measurement marks that trial
    interrupted (user attribute ``zhantune:interrupted``, state FAIL) and ends the search with
    ``interrupted`` set.

    Compile ahead: with ``lookahead`` n > 0 the loop keeps up to n candidates asked (and claimed)
    beyond the one being measured, and calls ``prepare(candidate)`` (which must return at once: it
    starts a compile) for each as soon as it is asked; the sampler proposes them without the results
    still being measured, as an asynchronous search does. Candidates asked ahead but never measured
    (time up, interrupted) are marked interrupted and released, so a resumed study measures them.
    With ``lookahead`` 0 the loop asks one candidate at a time.
    """
    stats = SearchStats()
    bind_sampler(study.sampler, space, problem_vars)
    total = _feasible_total(study.sampler, space, problem_vars)
    seen: set[str] = set()
    rng = random.Random(seed)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    pending: deque[tuple[optuna.trial.Trial, Candidate]] = deque()

    def next_measurable() -> tuple[optuna.trial.Trial, Candidate] | None:
        """Ask until a candidate that must be measured comes up; None when the search must stop."""
        while stats.asks < max_asks_per_trial * n_trials and not stats.budget_spent:
            if interrupt.requested():
                raise KeyboardInterrupt("interrupt requested")
            if deadline is not None and time.monotonic() > deadline:
                return None
            if total is not None and len(seen) >= total:
                stats.exhausted = True
                return None
            stats.asks += 1
            asked = ask(study, space, problem_vars)
            cand = asked.candidate
            if cand is None:
                study.tell(asked.trial, state=optuna.trial.TrialState.PRUNED)
                stats.infeasible += 1
                continue
            seen.add(cand.config_hash)
            if cached is not None:
                hit, outcome = cached(cand)
                if hit:
                    stats.duplicates += not _tell(study, asked.trial, outcome)
                    stats.cached += 1
                    # a sampler that keeps proposing known points would stall: offer an unseen one
                    # (a feasible-set sampler never proposes a measured point by itself)
                    if getattr(study.sampler, "feasible_set", None) is None:
                        fresh = random_feasible_point(space, problem_vars, rng, exclude=seen)
                        if fresh is not None:
                            study.enqueue_trial(space.trial_params(*fresh))
                    continue
            try:
                mine = claim is None or claim(cand, asked.trial.number)
            except BudgetSpent:
                _abandon(study, asked.trial, cand, None)
                stats.budget_spent = True
                return None
            if not mine:
                study.tell(asked.trial, state=optuna.trial.TrialState.PRUNED)  # another worker measures it
                stats.duplicates += 1
                continue
            return asked.trial, cand
        return None

    try:
        while True:
            stop = False
            while len(pending) <= lookahead and stats.measured + len(pending) < n_trials:
                got = next_measurable()
                if got is None:
                    stop = True
                    break
                if prepare is not None:
                    prepare(got[1])
                pending.append(got)
            if not pending or (stop and deadline is not None and time.monotonic() > deadline):
                break
            trial, cand = pending.popleft()
            try:
                with interrupt.interruptible():
                    outcome = measure(cand, trial.number)
            except DuplicateTrial:
                stats.duplicates += 1
                continue
            except KeyboardInterrupt:
                pending.appendleft((trial, cand))
                raise
            if _tell(study, trial, outcome):
                stats.measured += 1
            else:
                stats.duplicates += 1
    except KeyboardInterrupt:
        stats.interrupted = True
    finally:
        for trial, cand in pending:  # asked (and claimed) but not measured
            _abandon(study, trial, cand, release)
    return stats


def _abandon(study: optuna.Study, trial: optuna.trial.Trial, cand: Candidate,
             release: Callable[[Candidate], None] | None) -> None:
    """Not a result: a resumed study measures this point again (samplers skip a point as tried only
    when it has a value or a measured failure)."""
    if release is not None:
        release(cand)
    trial.set_user_attr(INTERRUPTED_ATTR, True)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _tell(study: optuna.Study, trial: optuna.trial.Trial, value: Outcome) -> bool:
    """Tell the outcome; False when another worker already finished this (enqueued) trial."""
    try:
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True
