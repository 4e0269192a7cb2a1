"""The search loop shared by the tune job and the offline strategy benchmark (ask/tell over a Space).

Budget rules: a point that violates a constraint is told PRUNED and never measured; a candidate
already measured (``cached`` answers it) is told its stored value; neither uses the budget of
``n_trials`` measured candidates. ``n_trials`` is the study's total: with a :class:`SharedStudy`
(the tune job) the count is the study's, read from the storage, so a resumed study and several
workers on one study (N jobs of a launcher) together measure exactly ``n_trials`` candidates;
without one (the offline benchmark) it is this call's own count.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from zhantune import interrupt
from zhantune.candidate import Candidate
from zhantune.search.schema import Space
from zhantune.search.study import (
    INTERRUPTED_ATTR,
    RESULT_OF_ATTR,
    RETRY_OF_ATTR,
    Heartbeat,
    ask,
    completed_points,
    fail_stale_trials,
    feasible_size,
    random_feasible_point,
    release_orphan_claims,
)

__all__ = ["SearchStats", "Outcome", "run_search", "bind_sampler", "DuplicateTrial", "SharedStudy",
           "CLAIMED", "TAKEN", "SPENT"]

log = logging.getLogger(__name__)

#: answers of :attr:`SharedStudy.claim`: this worker measures the point; another worker holds it;
#: the study's ``n_trials`` are all measured or being measured
CLAIMED, TAKEN, SPENT = "claimed", "taken", "spent"


class DuplicateTrial(Exception):
    """Raised by ``measure`` when its result must not be stored: another worker already stored this
    trial (an enqueued point that two workers popped at once: Optuna's SQLite storage cannot lock the
    row), or this worker's claim was released meanwhile (it stopped beating its heartbeat and another
    worker retried the point). Not counted."""


#: the result of measuring (or looking up) one candidate: objective in microseconds, None when failed
Outcome = float | None


@dataclass
class SharedStudy:
    """How the workers of one study share its ``n_trials`` (zhantune.tune builds this over the
    store's claim rows, zhantune.storage.Store.claim).

    ``claim(candidate, trial_number, n_trials)`` claims a point for this worker, atomically with the
    budget: CLAIMED, TAKEN (another worker measures it) or SPENT (measured + claimed points of the
    study reached ``n_trials``). ``release(candidate)`` undoes this worker's own claim (an
    interrupted measurement). ``counts()`` is (measured, in flight) over every worker: candidates
    stored, and points claimed but not stored yet. ``in_flight()`` lists the trial numbers of the
    latter; ``release_trial(number)`` drops the claim of a trial that ended without a row (True when
    it did). ``heartbeat`` beats this worker's trials (None: heartbeats off; then nothing dead is
    retried, and a worker stops when the budget is claimed instead of waiting for other workers).
    ``poll_s``: how often a worker whose budget is claimed looks for dead workers' trials.
    """

    claim: Callable[[Candidate, int, int], str]
    release: Callable[[Candidate], None]
    counts: Callable[[], tuple[int, int]]
    in_flight: Callable[[], list[int]]
    release_trial: Callable[[int], bool]
    heartbeat: Heartbeat | None = None
    poll_s: float = 1.0


@dataclass
class SearchStats:
    #: candidates this worker measured
    measured: int = 0
    infeasible: int = 0
    cached: int = 0
    asks: int = 0
    #: points another worker was already measuring (told PRUNED, not measured twice)
    duplicates: int = 0
    #: of ``measured``: points of dead workers' trials measured again here
    retried: int = 0
    #: measured candidates of the whole study when the search ended (every worker; SharedStudy only)
    study_measured: int = 0
    #: seconds spent waiting for other workers' trials in flight once the budget was claimed
    waited_s: float = 0.0
    interrupted: bool = False
    exhausted: bool = False


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
               shared: SharedStudy | None = None,
               timeout_s: float | None = None, seed: int = 0, max_asks_per_trial: int = 50,
               prepare: Callable[[Candidate], None] | None = None, lookahead: int = 0,
               on_measuring: Callable[[Candidate, int, bool], None] | None = None) -> SearchStats:
    """Ask/tell until the study has ``n_trials`` measured candidates, the space is exhausted or time is up.

    ``measure(candidate, trial_number)`` returns the objective (microseconds) or None for a failed
    measurement; ``cached(candidate)`` returns (hit, outcome). With ``shared`` (several workers, or a
    resumed study) ``n_trials`` counts the study's measured candidates in the storage, every
    worker's: a point is measured only after :attr:`SharedStudy.claim` answered CLAIMED; a point
    another worker holds is told PRUNED. Once every remaining trial is claimed, a worker waits for
    the others' trials in flight, and fails the trials of workers whose heartbeat stopped (their
    storage callback releases the claim and queues the point again, which this worker then measures),
    so the study ends with ``n_trials`` measured however many workers ran or died. A KeyboardInterrupt
    (Ctrl-C, or SIGTERM routed by :func:`zhantune.interrupt.install`) during a measurement marks that
    trial interrupted (user attribute ``zhantune:interrupted``, state FAIL) and ends the search with
    ``interrupted`` set. ``on_measuring(candidate, trial_number, retry)`` is called just before a
    measurement starts (per-trial log lines of a launcher's job).

    Compile ahead: with ``lookahead`` n > 0 the loop keeps up to n candidates asked (and claimed)
    beyond the one being measured, and calls ``prepare(candidate)`` (which must return at once: it
    starts a compile) for each as soon as it is asked; the sampler proposes them without the results
    still being measured, as an asynchronous search does. Candidates asked ahead but never measured
    (time up, interrupted) are marked interrupted and released, so a resumed study measures them.
    With ``lookahead`` 0 the loop asks one candidate at a time.
    """
    search = _Search(study, space, problem_vars, measure, n_trials, cached, shared, timeout_s, seed,
                     max_asks_per_trial, prepare, lookahead, on_measuring)
    return search.run()


class _Search:
    """The state of one :func:`run_search` call (its arguments, the points seen, the trials asked
    ahead) and its steps."""

    def __init__(self, study: optuna.Study, space: Space, problem_vars: dict,
                 measure: Callable[[Candidate, int], Outcome], n_trials: int,
                 cached: Callable[[Candidate], tuple[bool, Outcome]] | None, shared: SharedStudy | None,
                 timeout_s: float | None, seed: int, max_asks_per_trial: int,
                 prepare: Callable[[Candidate], None] | None, lookahead: int,
                 on_measuring: Callable[[Candidate, int, bool], None] | None):
        self.study, self.space, self.problem_vars, self.measure = study, space, problem_vars, measure
        self.n_trials, self.cached, self.shared, self.max_asks = n_trials, cached, shared, max_asks_per_trial
        self.prepare, self.lookahead, self.on_measuring = prepare, lookahead, on_measuring
        self.stats = SearchStats()
        bind_sampler(study.sampler, space, problem_vars)
        self.total = _feasible_total(study.sampler, space, problem_vars)
        #: points with a result (zhantune.search.study.completed_points: a resumed study's too, so a space
        #: measured whole is found exhausted at once, not asked again point by point, each a duplicate trial)
        self.seen: set[str] = completed_points(study, space, problem_vars) if self.total is not None else set()
        #: points seen only as held by another worker (told PRUNED): seen again once that worker's
        #: claim is measured or released (a dead worker's, after its heartbeat's grace period)
        self.taken: set[str] = set()
        #: every point is seen but some are held by other workers: wait for them before "exhausted"
        self.space_held = False
        self.rng = random.Random(seed)
        self.deadline = time.monotonic() + timeout_s if timeout_s else None
        self.pending: deque[tuple[optuna.trial.Trial, Candidate]] = deque()
        self.heartbeat = shared.heartbeat if shared is not None else None
        self.last_reap = -float("inf")
        self.beaten: set[int] = set()  # other workers' claimed trials given one heartbeat (release_orphan_claims)

    def time_up(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def reap(self, force: bool = False) -> None:
        """Fail dead workers' trials (heartbeat older than the grace period), at most once a poll."""
        if self.heartbeat is None or (not force and time.monotonic() - self.last_reap < self.shared.poll_s):
            return
        self.last_reap = time.monotonic()
        fail_stale_trials(self.study)

    def budget_left(self) -> int:
        if self.shared is None:
            return self.n_trials - self.stats.measured - len(self.pending)
        measured, in_flight = self.shared.counts()
        self.stats.study_measured = measured
        return self.n_trials - measured - in_flight

    def _answered_from_cache(self, asked: Any, cand: Candidate) -> bool:
        """A candidate measured before is told its stored outcome (True); a sampler that keeps
        proposing known points would stall, so an unseen one is offered (a feasible-set sampler
        never proposes a measured point by itself)."""
        if self.cached is None:
            return False
        hit, outcome = self.cached(cand)
        if not hit:
            return False
        self.stats.duplicates += not _tell(self.study, asked.trial, outcome, cand.config_hash)
        self.stats.cached += 1
        if getattr(self.study.sampler, "feasible_set", None) is None:
            fresh = random_feasible_point(self.space, self.problem_vars, self.rng, exclude=self.seen)
            if fresh is not None:
                self.study.enqueue_trial(self.space.trial_params(*fresh))
        return True

    def _claim(self, asked: Any, cand: Candidate) -> str:
        """CLAIMED, TAKEN (told PRUNED: another worker measures it) or SPENT (abandoned)."""
        heartbeat, trial = self.heartbeat, asked.trial
        if heartbeat is not None:  # beating before the claim: a claimed point always has a heartbeat
            heartbeat.hold(trial)
        got = self.shared.claim(cand, trial.number, self.n_trials)
        if got != CLAIMED:
            if heartbeat is not None:
                heartbeat.drop(trial)
            if got == SPENT:  # another worker claimed the last trial first: not a result
                _abandon(self.study, trial, cand, None)
            else:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # another worker measures it
                self.stats.duplicates += 1
                self.taken.add(cand.config_hash)
        return got

    def next_measurable(self) -> tuple[optuna.trial.Trial, Candidate] | str | None:
        """Ask until a candidate that must be measured comes up; SPENT when the study's budget was
        claimed meanwhile, or when every point is seen but other workers hold some (alive or dead:
        :meth:`wait_for_others` waits for them); None when the search must stop (``exhausted`` set
        when every feasible point is measured or failed)."""
        stats = self.stats
        while stats.asks < self.max_asks * self.n_trials:
            if interrupt.requested():
                raise KeyboardInterrupt("interrupt requested")
            if self.time_up():
                return None
            if self.total is not None and len(self.seen) >= self.total:
                if self.taken and self.shared is not None and self.heartbeat is not None:
                    self.space_held = True  # a point held elsewhere may come back (its worker died)
                    return SPENT
                stats.exhausted = True
                return None
            self.reap()
            stats.asks += 1
            asked = ask(self.study, self.space, self.problem_vars)
            cand = asked.candidate
            if cand is None:
                self.study.tell(asked.trial, state=optuna.trial.TrialState.PRUNED)
                stats.infeasible += 1
                continue
            self.seen.add(cand.config_hash)
            if self._answered_from_cache(asked, cand):
                continue
            if self.shared is not None:
                got = self._claim(asked, cand)
                if got == SPENT:
                    return SPENT
                if got != CLAIMED:
                    continue
            return asked.trial, cand
        return None

    def wait_for_others(self) -> bool:
        """The budget is claimed but not all measured (or every point is seen and other workers
        hold some, ``space_held``): wait while other workers' trials are in flight, failing dead
        workers' trials so that their points come back. True when a trial became free for this
        worker (with ``space_held``: when no other worker holds a claim, and the points they held
        are asked again: measured ones are answered from the storage, released ones measured here);
        False when the study is done or the search must stop."""
        shared, heartbeat = self.shared, self.heartbeat
        if shared is None or heartbeat is None:
            return False  # no heartbeat: nothing dead can be told from slow; the others finish theirs
        said = False
        start = time.monotonic()
        try:
            while True:
                if interrupt.requested():
                    raise KeyboardInterrupt("interrupt requested")
                if self.time_up():
                    return False
                self.reap(force=True)
                release_orphan_claims(self.study, shared, self.beaten)
                measured, in_flight = shared.counts()
                self.stats.study_measured = measured
                if measured >= self.n_trials:
                    return False
                if self.space_held and not in_flight:
                    self.seen -= self.taken
                    self.taken.clear()
                    self.space_held = False
                    return True
                if not self.space_held and measured + in_flight < self.n_trials:
                    return True
                if not said:
                    log.info("study %s: %d of %d measured; waiting for %d trial(s) in flight in other workers "
                             "(a dead worker's trial is measured again once its heartbeat is %d s old)",
                             self.study.study_name, measured, self.n_trials, in_flight, heartbeat.grace_period_s)
                    said = True
                time.sleep(shared.poll_s)
        finally:
            self.stats.waited_s += time.monotonic() - start

    def _fill(self) -> bool:
        """Ask (and claim) up to ``lookahead`` candidates beyond the one measured next, starting
        each one's compile (``prepare``); True when the search must stop."""
        while len(self.pending) <= self.lookahead and self.budget_left() > 0:
            got = self.next_measurable()
            if got == SPENT:
                return False
            if got is None:
                return True
            if self.prepare is not None:
                self.prepare(got[1])
            self.pending.append(got)
        return False

    def _measure_next(self) -> None:
        trial, cand = self.pending.popleft()
        retry = trial.user_attrs.get(RETRY_OF_ATTR) is not None
        if self.on_measuring is not None:
            self.on_measuring(cand, trial.number, retry)
        try:
            with interrupt.interruptible():
                outcome = self.measure(cand, trial.number)
        except DuplicateTrial:
            self.stats.duplicates += 1
            if self.heartbeat is not None:
                self.heartbeat.drop(trial)
            return
        except KeyboardInterrupt:
            self.pending.appendleft((trial, cand))
            raise
        if _tell(self.study, trial, outcome, cand.config_hash):
            self.stats.measured += 1
            self.stats.retried += retry
        else:
            self.stats.duplicates += 1
        if self.heartbeat is not None:
            self.heartbeat.drop(trial)

    def run(self) -> SearchStats:
        """Fill the look-ahead, measure the next candidate, until the budget, the space or the time
        is used up or an interrupt came; candidates asked but not measured are abandoned."""
        try:
            while True:
                stop = self._fill()
                if not self.pending:
                    if stop or not self.wait_for_others():
                        break
                    continue
                if stop and self.time_up():
                    break
                self._measure_next()
        except KeyboardInterrupt:
            self.stats.interrupted = True
        else:  # a signal while the last trial's row was stored (zhantune.interrupt.deferred): still a stop
            self.stats.interrupted = interrupt.requested()
        finally:
            for trial, cand in self.pending:  # asked (and claimed) but not measured
                _abandon(self.study, trial, cand, self.shared.release if self.shared is not None else None)
                if self.heartbeat is not None:
                    self.heartbeat.drop(trial)
        if self.shared is not None:
            self.stats.study_measured = self.shared.counts()[0]
        return self.stats


def _abandon(study: optuna.Study, trial: optuna.trial.Trial, cand: Candidate,
             release: Callable[[Candidate], None] | None) -> None:
    """Not a result: a resumed study measures this point again (samplers skip a point as tried only
    when it has a value or a measured failure)."""
    if release is not None:
        release(cand)
    trial.set_user_attr(INTERRUPTED_ATTR, True)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _tell(study: optuna.Study, trial: optuna.trial.Trial, value: Outcome, config_hash: str) -> bool:
    """Tell the outcome, with the config hash it is a result of (``RESULT_OF_ATTR``: a resumed search
    counts the point as seen, zhantune.search.study.completed_points); False when another worker
    already finished this (enqueued) trial."""
    try:
        trial.set_user_attr(RESULT_OF_ATTR, config_hash)
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True
