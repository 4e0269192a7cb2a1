"""The Optuna side of a tune: the study in the shared storage, and the ask step over a Space."""

from __future__ import annotations

import datetime
import inspect
import logging
import random
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from zhantune.candidate import Candidate
from zhantune.quiet import quiet_optuna
from zhantune.search.schema import Branch, Space

__all__ = ["Asked", "HeartbeatSettings", "Heartbeat", "optuna_storage", "open_study", "ask", "completed_points", "feasible_size",
           "random_feasible_point", "fail_stale_trials", "release_orphan_claims", "retry_trial", "INTERRUPTED_ATTR",
           "RESULT_OF_ATTR",
           "RETRY_OF_ATTR", "MAX_RETRIES"]

#: user attribute of a trial whose measurement was interrupted (Ctrl-C, SIGTERM): not a result
INTERRUPTED_ATTR = "zhantune:interrupted"
#: user attribute of a trial told a result: the config hash it measured (zhantune.search.driver)
RESULT_OF_ATTR = "zhantune:result_of"
#: user attribute of a trial that measures again the point of a dead worker's trial (its number)
RETRY_OF_ATTR = "zhantune:retry_of"
#: user attribute: how many times this point was retried after dead workers (1 for the first retry)
RETRIES_ATTR = "zhantune:retries"
#: a point whose workers died this many times is not retried again (it may be what kills them)
MAX_RETRIES = 3

quiet_optuna()

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeartbeatSettings:
    """Optuna's heartbeat of running trials (RDBStorage ``heartbeat_interval``, ``grace_period``,
    whole seconds): a running trial whose heartbeat is older than ``grace_period_s`` is failed by
    the next worker that looks (:func:`fail_stale_trials`), which then calls ``on_stale(study,
    trial)`` (zhantune.tune: release the trial's claim, :func:`retry_trial`)."""

    interval_s: int
    grace_period_s: int
    on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None


def optuna_storage(storage_url: str, heartbeat: HeartbeatSettings | None = None) -> optuna.storages.BaseStorage:
    """Optuna's RDB storage on ``storage_url``; on SQLite with zhantune's connection settings (WAL,
    busy timeout, synchronous=NORMAL) so several workers can share the file; with ``heartbeat``,
    Optuna's heartbeat of running trials."""
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    from zhantune.storage.engine import SQLITE_BUSY_TIMEOUT_MS, sqlite_pragmas

    kwargs: dict[str, Any] = {}
    if heartbeat is not None:
        # Optuna 4.9 renamed failed_trial_callback to heartbeat_stale_trial_callback
        name = ("heartbeat_stale_trial_callback"
                if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                else "failed_trial_callback")
        kwargs = {"heartbeat_interval": heartbeat.interval_s, "grace_period": heartbeat.grace_period_s,
                  name: heartbeat.on_stale}
    sqlite = make_url(storage_url).get_backend_name() == "sqlite"
    if sqlite:
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(storage_url, **kwargs)
    if sqlite:
        event.listen(storage.engine, "connect", sqlite_pragmas)
        storage.engine.dispose()  # connections opened while Optuna created its tables lack the pragmas
    return storage


def open_study(name: str, storage_url: str, sampler: optuna.samplers.BaseSampler,
               heartbeat: HeartbeatSettings | None = None) -> optuna.Study:
    """Create or resume the study ``name`` in ``storage_url`` (minimising median microseconds)."""
    return optuna.create_study(study_name=name, storage=optuna_storage(storage_url, heartbeat), sampler=sampler,
                               direction="minimize", load_if_exists=True)


def fail_stale_trials(study: optuna.Study) -> None:
    """Optuna's :func:`optuna.storages.fail_stale_trials`: fail the study's running trials whose
    heartbeat is older than the grace period (their workers died) and call the storage's stale-trial
    callback for each this process failed. Nothing without a heartbeat."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def retry_trial(study: optuna.Study, trial: FrozenTrial) -> int | None:
    """Queue the point of a dead worker's ``trial`` again (the equivalent of Optuna's
    ``RetryHeartbeatStaleTrialCallback``, through ``enqueue_trial`` so that zhantune's sampler treats it
    like any queued point); the next ``ask`` of any worker measures it. Returns how many times the point
    has now been retried, or None when it reached :data:`MAX_RETRIES` (not queued) or has no params."""
    retries = int(trial.user_attrs.get(RETRIES_ATTR, 0)) + 1
    if not trial.params or retries > MAX_RETRIES:
        return None
    study.enqueue_trial(trial.params, user_attrs={RETRY_OF_ATTR: int(trial.user_attrs.get(RETRY_OF_ATTR, trial.number)),
                                                  RETRIES_ATTR: retries})
    return retries


class Heartbeat:
    """The heartbeats of this worker's running trials, recorded in Optuna's storage (its
    ``record_heartbeat``) now and then every ``interval_s`` from a daemon thread.

    Optuna beats only inside ``Study.optimize``; zhantune asks and tells itself, so it beats here.
    A trial is beaten from before it is claimed until it is told, so a claimed point always has a
    heartbeat that another worker can see stop."""

    def __init__(self, study: optuna.Study):
        self._storage = study._storage  # Optuna's RDBStorage (a BaseHeartbeat); no public accessor
        self.interval_s = int(self._storage.get_heartbeat_interval())
        #: a trial whose heartbeat is this old is failed by the next worker that looks (Optuna's default: 2 beats)
        # RDBStorage's own attribute (Optuna 5 wraps it in a _CachedStorage without one: read as 2 beats, 20 s,
        # the wait message said 20 s of a 60 s grace and a dead trial got a beat at 20 s, retried 20 s late)
        rdb = getattr(self._storage, "_backend", self._storage)
        self.grace_period_s = int(getattr(rdb, "grace_period", None) or 2 * self.interval_s)
        self._held: dict[int, int] = {}  # trial number -> Optuna's trial id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zhantune-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, trial: optuna.trial.Trial) -> None:
        """Beat ``trial`` now and from now on."""
        self._storage.record_heartbeat(trial._trial_id)
        with self._lock:
            self._held[trial.number] = trial._trial_id

    def beat_once(self, trial: FrozenTrial) -> None:
        """One heartbeat for another worker's trial: a claimed trial that has none (its worker ran with
        heartbeats off, or an older zhantune, and died) then goes stale after the grace period and is
        retried like any dead worker's; a live worker's trial only gets one beat more."""
        self._storage.record_heartbeat(trial._trial_id)

    def drop(self, trial: optuna.trial.Trial) -> None:
        with self._lock:
            self._held.pop(trial.number, None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                ids = list(self._held.values())
            for trial_id in ids:
                try:
                    self._storage.record_heartbeat(trial_id)
                except Exception as e:  # a missed beat; the next one may get through
                    log.warning("heartbeat of trial id %d not recorded: %s", trial_id, e)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class Asked:
    """One asked trial: its candidate, or None when the point violates a constraint (or is not in
    the space: branch None too)."""

    trial: optuna.trial.Trial
    branch: Branch | None
    values: dict[str, Any]
    candidate: Candidate | None


def ask(study: optuna.Study, space: Space, problem_vars: dict[str, Any]) -> Asked:
    """Ask the sampler for a point; check the branch's constraints before anything compiles. A point
    that is not in the space (an enqueued value outside a param's choices or range: a waiting trial of
    an earlier ``space=`` or of a merged study) is infeasible too (candidate None, branch None)."""
    with warnings.catch_warnings():  # zhantune beats the heartbeat itself (Heartbeat)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        warnings.filterwarnings("ignore", message="Fixed parameter .* is out of range", category=UserWarning)
        trial = study.ask()
        try:
            branch, values = space.suggest(trial)
        except ValueError:
            return Asked(trial, None, {}, None)
    cand = branch.candidate(values) if branch.feasible(values, problem_vars) else None
    return Asked(trial, branch, values, cand)


def completed_points(study: optuna.Study, space: Space, problem_vars: dict) -> set[str]:
    """Config hashes of the points of ``space`` that the study holds a result of: trials told a time
    or a measured failure, each with the hash it was measured as (``RESULT_OF_ATTR``, set when its
    result was told), kept only where this space rebuilds that very hash from the trial's params (a
    trial of another space, e.g. ``space=`` changed between runs, with other fixed values, is not a
    point of this one: counted, it could make the search call this space exhausted early).
    Trials interrupted or abandoned (``INTERRUPTED_ATTR``) and dead workers' (failed by heartbeat,
    retried) are not results."""
    out: set[str] = set()
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FixedTrial warns about a value outside a choice list
        for t in study.get_trials(deepcopy=False, states=states):
            told = t.user_attrs.get(RESULT_OF_ATTR)
            if told is None or t.user_attrs.get(INTERRUPTED_ATTR):
                continue
            try:
                branch, values = space.suggest(optuna.trial.FixedTrial(t.params))
            except (ValueError, KeyError):
                continue
            if branch.feasible(values, problem_vars) and branch.candidate(values).config_hash == told:
                out.add(told)
    return out


def feasible_size(space: Space, problem_vars: dict[str, Any], limit: int = 200_000) -> dict[str, tuple[int, int]] | None:
    """Per branch (size before constraints, size after); None when the product exceeds ``limit``."""
    sizes: dict[str, tuple[int, int]] = {}
    for b in space.branches:
        total = 1
        for p in b.params:
            total *= len(p.values())
        if total > limit:
            return None
        feasible = sum(1 for v in b.all_values() if b.feasible(v, problem_vars))
        sizes[b.name] = (total, feasible)
    return sizes


def random_feasible_point(space: Space, problem_vars: dict[str, Any], rng: random.Random,
                          exclude: set[str] = frozenset(), tries: int = 200) -> tuple[Branch, dict[str, Any]] | None:
    """A random feasible (branch, values) whose candidate's config_hash is not in ``exclude``."""
    for _ in range(tries):
        b = rng.choice(space.branches)
        values = {p.name: rng.choice(p.values()) for p in b.params if p.distribution is not None}
        if b.feasible(values, problem_vars) and b.candidate(values).config_hash not in exclude:
            return b, values
    return None


def release_orphan_claims(study: optuna.Study, shared: Any, beaten: set[int]) -> None:
    """Claims without a row whose trial is no longer running (its worker died after Optuna failed
    the trial but before the claim was released, or an older zhantune left it): release them. The
    claims are read before the running trials, so a claim made meanwhile is never taken for one;
    :attr:`SharedStudy.release_trial` keeps a claim whose row was stored meanwhile. A claimed trial
    running for longer than the grace period gets one heartbeat from here (once; ``beaten``), so that
    one without heartbeats of its own goes stale and is retried (Heartbeat.beat_once).
    ``shared``: the search's zhantune.search.driver.SharedStudy."""
    claimed = shared.in_flight()
    if not claimed:
        return
    running = {t.number: t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    now = datetime.datetime.now()
    for number in claimed:
        trial = running.get(number)
        if trial is None:
            if shared.release_trial(number):
                log.info("study %s: released the claim of trial %d (ended without a measurement)",
                         study.study_name, number)
        elif (shared.heartbeat is not None and number not in beaten and trial.datetime_start is not None
              and (now - trial.datetime_start).total_seconds() > shared.heartbeat.grace_period_s):
            beaten.add(number)
            shared.heartbeat.beat_once(trial)
