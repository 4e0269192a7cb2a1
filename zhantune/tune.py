"""The tune job: baselines, the search, the settles, the study's end, the export.

``zhantune.runspec.resolve_run`` validates a request into a RunSpec before anything is written;
:func:`tune` then runs its study against a Store. The parts live where their job is: the search loop
in zhantune.search.driver, the seeds in zhantune.search.seeds, the rows in zhantune.storage.rows,
the close-call and speedup settles in zhantune.bench.settle, the table in zhantune.inductor.builder.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import optuna
from sqlalchemy.exc import IntegrityError

from zhantune import interrupt
from zhantune.bench.conditions import contention_count, mark_tune_root
from zhantune.bench.decision import decision_us, rank_key
from zhantune.bench.protocol import Benchmarker
from zhantune.bench.settle import rebuild_candidate, settle_close_call, settle_speedup
from zhantune.candidate import Candidate
from zhantune.errors import ConfigError
from zhantune.inductor.builder import not_carried_reason
from zhantune.inductor.exporter import export_table
from zhantune.inductor.settings import scratch_cache_dir
from zhantune.provenance import software_versions, worker_name
from zhantune.redact import stored_config
from zhantune.runspec import RunSpec, resolve_run
from zhantune.search.driver import DuplicateTrial, SharedStudy, run_search
from zhantune.search.samplers import make_sampler
from zhantune.search.seeds import enqueue_seeds, inductor_seeds
from zhantune.search.study import MAX_RETRIES, Heartbeat, HeartbeatSettings, open_study, retry_trial
from zhantune.search.transfer import load_prior, transfer_text
from zhantune.storage import ClaimLost, MeasurementRow, Recorder, Store, redact_url
from zhantune.storage.ingest import RECORDED_DEVICE, adopt_recorded_device, refuse_merge, replay_study
from zhantune.tune_result import (
    TuneResult,
    busy_text,
    held_claims_text,
    other_release_best,
    own_rows,
    ranked_rows,
    refuse_other_timing,
    same_space,
    stored_claim,
    study_best,
)
from zhantune.tune_result import settle_again as _settle_again

__all__ = ["TuneResult", "tune", "settle", "study_budget", "RunSpec", "resolve_run", "FINISHED", "EXHAUSTED"]

log = logging.getLogger(__name__)

#: zt_study.status of a study that ended without an interrupt, and of one whose every feasible point is measured
FINISHED, EXHAUSTED = "finished", "exhausted"


def study_budget(run: RunSpec, store: Store) -> tuple[Any, int, int]:
    """(the study's row or None, trials it has used, its budget): ``search.n_trials`` is the
    study's total over all runs; ``search.more_trials=N`` makes it what the study holds plus N."""
    row = store.study(run.study_name)
    used, more = (store.trials_used(row.id) if row is not None else 0), run.search.more_trials
    return row, used, (used + more if more is not None else run.search.n_trials)


def tune(run: RunSpec, store: Store, progress: Any = None) -> TuneResult:
    """Baselines first, then the Optuna study until it holds ``search.n_trials`` measured
    candidates (all runs together: a rerun measures only what is missing).

    Infeasible points (a constraint fails) and cache hits (same candidate, device, problem and
    software versions already measured) do not use the budget. Every trial is committed when it ends.
    A study that ended with its budget measured (or the same space exhausted) is not run again: the
    result has ``already_finished`` set and nothing is measured or started; unless its last speedup
    settle was taken on a busy machine, or confirmed by a rule since replaced (:func:`_settle_again`):
    then its settles (close call, paired rounds) run again without a search (``resettled``), once
    the machine is idle (else ``settle_deferred`` says so and nothing is measured). A
    replay's study is named by :func:`zhantune.storage.ingest.replay_study`. A resumed study re-uses the
    baselines it stored in this environment (Store.stored_baselines) unless
    ``bench.remeasure_baselines``. ``progress``: a zhantune.report.TuneProgress, or None for a log
    line per trial.
    """
    if run.replay is not None:  # a file named only by its file name joins no other file's device
        run.replay = adopt_recorded_device(store, run.replay)  # ... but its own recording's under another name
        run.device = run.replay.device()
        refuse_merge(store, run.replay, "bench.path", "bench.device_name=NAME", adopt=run.search.study_name)
        run.search.study_name = replay_study(store, run.replay, run.problem.key, run.device.key,
                                             run.search.study_name)
    row, _, target = study_budget(run, store)
    others = sorted(store.study_problem_keys(row.id) - {run.problem.key}) if row is not None else []
    if others:
        raise ConfigError(f"search.study_name={run.study_name!r} is the study of {others[0]}, not of "
                          f"{run.problem.key}: one study tunes one problem; choose another name or drop it")
    refuse_other_timing(run, store)  # warm-cache and cold-cache rows in one ranking
    # measured, not used: a dead worker's claim stays in flight until a search retries it
    finished = row is not None and (row.status == FINISHED and store.trial_counts(row.id)[0] >= target
                                    or row.status == EXHAUSTED and same_space(row.config, run))
    again = finished and _settle_again(run, store, row.id)
    busy = busy_text(run) if again else None  # a busy machine would disturb its rounds again
    if finished and (not again or busy):
        return _finished_result(run, store, row, target, settle_deferred=busy)
    mark_tune_root()  # NVML's "other processes" leave out this tune's workers (conditions.own_pids)
    sampler, n_compile = make_sampler(run.search.sampler), run.compile_workers()
    # one kernel cache for this tune, shared by the timing and compile-ahead workers, deleted at its end
    with scratch_cache_dir(kernel_store=run.kernel_store) as cache_dir:
        bench = run.benchmarker(cache_dir)
        pool = run.compile_pool(n_compile, cache_dir) if n_compile and not finished else None  # a settle compiles in place
        try:
            job = _Tune(run, store, bench, pool, target)
            return job.settle_only(row) if finished else job.run(sampler, progress)
        finally:
            if pool is not None:
                pool.close()
            bench.close()


def _finished_result(run: RunSpec, store: Store, row: Any, target: int, settle_deferred: str | None = None) -> TuneResult:
    """The result of a study that has nothing left to measure, from the database alone
    (``settle_deferred``: why its settles, due again, wait for an idle machine)."""
    versions = software_versions()
    dev = next((d for d in store.devices() if d.key == run.device.key), None)
    stored = (store.stored_baselines(row.id, dev.id, run.problem.key, versions["torch"], versions["triton"])
              if dev is not None else {})
    result = TuneResult(run.study_name, row.id, stored.get("eager"), stored.get("default"), study_best(run, store, row.id),
                        default_unfrozen=stored.get("default_unfrozen"), target=target, before=store.trial_counts(row.id)[0],
                        already_finished=True, exhausted=row.status == EXHAUSTED, baselines_reused=bool(stored),
                        settle_deferred=settle_deferred)
    result.claim, result.claimed = stored_claim(store, row.id)  # what its tunes settled
    return result


def settle(run: RunSpec, store: Store, bench: Benchmarker, rec: Recorder, problem_id: int, result: TuneResult) -> None:
    """After the search (when ``bench.remeasure_rounds`` > 0): the fastest config of another torch
    release measured once with this one when it never was (a study resumed after a torch upgrade,
    zhantune.tune_result.other_release_best: else the ranking of this release's rows lost it), the
    close call (zhantune.bench.settle.settle_close_call), then the speedup claim of the fastest config a table can carry
    over Inductor's default (settle_speedup), whose verdict is stored (Store.add_verdict) for the
    exporter. New rows go through ``rec``; sets ``result``'s verdict, claim, claimed, default and
    texts. A Ctrl-C or SIGTERM meanwhile sets ``result.interrupted`` (the study itself is complete)."""
    rounds = run.bench.remeasure_rounds
    try:
        if rounds > 0 and (old := other_release_best(store, run, problem_id, rec.device_id)) is not None \
                and (cand := rebuild_candidate(old, run.space.branches)) is not None:  # kept in the race
            row = rec.add(bench.measure(cand), "remeasure", cand)
            now = f"{decision_us(row):,.1f} us" if row.status == "ok" else row.status
            result.carried_text = (f"measured again with this torch: {cand.describe()}, the fastest config of torch "
                                   f"{old.torch_version} ({decision_us(old):,.1f} us with it), not yet measured with "
                                   f"this one: {now}")
        if rounds > 0:
            verdict, text = settle_close_call(ranked_rows(store, run, problem_id, 2), run.space.branches,
                                              bench, rec.add, rounds)
            if verdict is not None:
                result.verdict, result.verdict_text = verdict, text
        # the fastest config a lookup table can carry on this device (a faster compile-wide setting,
        # a fusion limit or TF32 on CUDA, is reported but never shipped: not_carried_reason)
        best = next((r for r in ranked_rows(store, run, problem_id, 1 << 30)
                     if run.replay is not None or not_carried_reason(r, run.device.kind) is None), None)
        default = result.default
        if default is None or default.status != "ok" or best is None:
            return
        result.claimed = best
        settled = settle_speedup(best, default, run.space.branches, bench, rec.add, rounds,
                                 earlier=[r for r in (default, best) if r.id in rec.stored_ids],
                                 other_runs=lambda method: rec.other_runs(best, method))
        result.default = settled.default
        result.speedup_text = settled.text if settled.text is not None else result.speedup_text
        v = settled.verdict
        store.add_verdict(study_id=result.study_id, device_id=rec.device_id, problem_id=problem_id,
                          config_hash=best.config_hash, ratio=v.ratio, ratio_low=v.ratio_low, ratio_high=v.ratio_high,
                          rounds=v.rounds, contended=v.contended, confirmed=v.confirmed, reason=v.reason)
        result.claim = v
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM while re-measuring: the study itself is complete
        result.interrupted = True


class _Tune:
    """One tune's state between its steps (:meth:`run`)."""

    def __init__(self, run: RunSpec, store: Store, bench: Benchmarker, pool: Any, target: int):
        self.run_spec, self.store, self.bench, self.pool, self.target = run, store, bench, pool, target
        self.progress: Any = None

    def run(self, sampler: optuna.samplers.BaseSampler, progress: Any) -> TuneResult:
        """The tune, step by step: rows of the device and the study, baselines, the Optuna study
        with its seeds and prior, the search, the settles, the study's end and the export."""
        run, store = self.run_spec, self.store
        self.progress = progress
        self.device_id = store.device_id(run.device.key, run.device.name, run.device.kind, run.device.properties)
        config = stored_config(run.cfg)  # no password: stored, and merged elsewhere
        if run.replay is not None:  # which file this study replays, and the GPU it records (zhantune.storage.ingest)
            config["replay_sha256"], config["content_sha256"] = run.replay.sha256, run.replay.content_digest
            config[RECORDED_DEVICE] = run.replay.device_name.strip()  # a helper found it dropped here
        self.study_id = store.study_id(run.study_name, config)
        before, _ = store.trial_counts(self.study_id)  # measured: a dead worker's claim is not
        try:
            rows, reused = self._baselines()
        except KeyboardInterrupt:  # before its first trial (a helper's: left "running"), as a search's interrupt
            store.finish_study(self.study_id, "interrupted")
            raise
        self.result = TuneResult(run.study_name, self.study_id, rows.get("eager"), rows.get("default"), None,
                                 default_unfrozen=rows.get("default_unfrozen"), target=self.target,
                                 before=before, baselines_reused=reused)
        if self.pool is not None:
            self.pool.lookup = self.bench.lookup  # template candidates are served under the recorded key
            # no compile shares the cores (CPU) or the GPU (a compile worker runs its candidate once to
            # check it, on the GPU being timed) with a timed run
            self.bench.phase_hook = self.pool.phase_hook
        with store.database_lock():  # N workers may start on one new database: Optuna creates its tables once
            study = open_study(run.study_name, run.storage.url, sampler, self._heartbeat())
        seeds = inductor_seeds(run.space, run.problem, run.problem_vars, run.search.seed_inductor)
        enqueue_seeds(study, run.space, seeds, run.search.seed_inductor, run.search.max_seeds)
        self.inductor_seeds = bool(seeds)  # the transfer line's (a replay has none)
        self._use_prior(sampler)
        done_before, _ = store.trial_counts(self.study_id)
        log.info("worker %s: study %s in %s: %d of search.n_trials=%d measured so far", worker_name(),
                 run.study_name, redact_url(run.storage.url), done_before, self.target)
        self._search(study, sampler)
        self._settle()
        return self._finish()

    def settle_only(self, study: Any) -> TuneResult:
        """A finished study (``study``: its row) whose last speedup settle was disturbed or confirmed
        by a replaced rule (:func:`_settle_again`): its stored baselines, the settles again (close call and paired
        rounds), the export; no search, and the study's row (status, config) is left as it was."""
        run, store = self.run_spec, self.store
        self.device_id = store.device_id(run.device.key, run.device.name, run.device.kind, run.device.properties)
        self.study_id = study.id
        before, _ = store.trial_counts(self.study_id)
        rows, reused = self._baselines()
        self.result = TuneResult(run.study_name, self.study_id, rows.get("eager"), rows.get("default"), None,
                                 default_unfrozen=rows.get("default_unfrozen"), target=self.target,
                                 before=before, baselines_reused=reused, exhausted=study.status == EXHAUSTED,
                                 resettled=True)
        self.result.study_measured = before
        self._settle()
        return self._finish(keep_status=True)

    def _baselines(self) -> tuple[dict[str, MeasurementRow], bool]:
        """Eager and Inductor's default (the default compile also records the lookup key), or the
        ones a resumed study stored with this device, torch and triton; sets ``problem_id`` and the
        Recorder. Returns ({kind: row}, whether they were re-used)."""
        run, store, bench = self.run_spec, self.store, self.bench
        versions = software_versions()
        stored = {} if run.bench.remeasure_baselines or run.replay is not None else store.stored_baselines(
            self.study_id, self.device_id, run.problem.key, versions["torch"], versions["triton"])
        if stored:
            self.problem_id = stored["eager"].problem_id
            if any(b.scope == "template" for b in run.space.branches):
                with interrupt.interruptible():  # Ctrl-C stops a compile at once (it waited for every baseline)
                    bench.record_lookup()  # untimed: template candidates are served under the key it records
        else:
            with interrupt.interruptible():  # nothing is stored until all three are measured
                baselines = bench.baselines()
            fields = run.problem.row_fields()
            if bench.lookup is not None:  # the op Inductor looked the GEMM up with (linear_act on a GPU: mm)
                fields["lookup_op"] = bench.lookup.op_name
            self.problem_id = store.problem_id(run.problem.key, lookup_key=bench.lookup_key, **fields)
        self.rec = Recorder(store, run.problem, self.study_id, self.device_id, self.problem_id,
                            None if run.replay is not None else run.device)
        return stored or {kind: self.rec.add(meas, kind) for kind, meas in baselines}, bool(stored)

    def _heartbeat(self) -> HeartbeatSettings | None:
        """Optuna's heartbeat (``storage.heartbeat_interval_s``): another worker's trial whose
        heartbeat stopped has its claim released and its point queued again."""
        storage, store = self.run_spec.storage, self.store
        beat = storage.heartbeat_interval_s
        if not beat:
            return None

        def on_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            released = store.release_trial(self.study_id, trial.number)
            retries = retry_trial(study, trial)
            self.result.reaped += 1
            log.warning("trial %d: its worker stopped beating (no heartbeat for %d s): failed; %s", trial.number,
                        storage.grace_period_s,
                        ("its point is queued again" + (f" (retry {retries})" if retries > 1 else "")
                         if retries is not None else f"not retried again (retried {MAX_RETRIES} times)")
                        + ("" if released else "; its measurement was already stored"))

        return HeartbeatSettings(int(beat), int(storage.grace_period_s), on_stale)

    def _use_prior(self, sampler: optuna.samplers.BaseSampler) -> None:
        """search.transfer=auto: hand the sampler what the storage holds about this problem elsewhere
        (transfer.load_prior); samplers without ``set_prior`` (all but the default) start cold, as the summary says."""
        run, result = self.run_spec, self.result
        prior = None if run.search.transfer == "off" else load_prior(  # a replay's own file is never "another device"
            self.store, run.device.key, run.problem, kind=run.device.kind, recording=getattr(run.replay, "digests", None))
        if prior is None:
            return
        set_prior = getattr(sampler, "set_prior", None)
        if not callable(set_prior):
            result.transfer_text = (f"transfer: not used: search={run.search.name} takes no prior "
                                    f"({prior.describe()} available; the default search uses them)")
            return
        set_prior(prior.scores, model=prior.kind == "device")  # shapes: seeds only (docs/search.md)
        result.transfer = prior

    # -- the search ---------------------------------------------------------------------------
    def _cached(self, cand: Candidate) -> tuple[bool, float | None]:
        v = self.rec.versions
        hit = self.store.cached(self.device_id, self.problem_id, cand.config_hash, v["torch"], v["triton"],
                                own_rows(self.run_spec, self.study_id))
        if hit is None:
            return False, None
        self.result.cached += 1
        return True, hit.median_us if hit.status == "ok" else None

    def _measure(self, cand: Candidate, trial_number: int) -> float | None:
        pool = self.pool
        pre = pool.result(cand) if pool is not None else None
        if pre is not None and not pre.ok:  # it failed in the compile worker: it would here too
            meas = pre
        else:
            meas = self.bench.measure(cand)
            if pre is not None:  # the compile's cost is the compile worker's (the kernels came from it)
                meas = dataclasses.replace(meas, compile_s=pre.compile_s)
        with interrupt.deferred(stop_after=False):  # a stored row is told: Ctrl-C stops the search next step
            return self._stored(cand, trial_number, meas)

    def _stored(self, cand: Candidate, trial_number: int, meas: Any) -> float | None:
        result = self.result
        try:
            row = self.rec.add(meas, "candidate", cand, trial_number, claimed=True)
        except ClaimLost as e:  # this worker was taken for dead: the point is another worker's now
            log.warning("trial %d: %s; its measurement is dropped", trial_number, e)
            raise DuplicateTrial(trial_number) from e
        except IntegrityError as e:  # another worker stored this trial first
            raise DuplicateTrial(trial_number) from e
        result.measured += 1
        result.statuses[meas.status] += 1
        if meas.ok and (result.best is None or rank_key(row) < rank_key(result.best)):
            result.best = row  # as Store.ranked_candidates ranks (one rule for every "best")
        if self.progress is not None:
            self.progress.update(result, cand, meas)
        else:  # a launcher's job: one log line per trial
            log.info("trial %d: %s%s", trial_number, meas.status,
                     f" {meas.timing.median_us:,.1f} us" if meas.timing else f" ({meas.error_text})")
        return row.median_us if meas.ok else None

    def _measuring(self, cand: Candidate, trial_number: int, retry: bool) -> None:
        if self.progress is None:
            log.info("trial %d: measuring %s%s", trial_number, cand.describe(),
                     " (again: its first worker died)" if retry else "")

    def _search(self, study: optuna.Study, sampler: optuna.samplers.BaseSampler) -> None:
        run, store, result, pool, sid = self.run_spec, self.store, self.result, self.pool, self.study_id
        shared = SharedStudy(
            claim=lambda c, n, limit: store.claim(sid, c.config_hash, n, limit),
            release=lambda c: store.release(sid, c.config_hash),
            counts=lambda: store.trial_counts(sid),
            in_flight=lambda: store.in_flight(sid),
            release_trial=lambda n: store.release_trial(sid, n),
            poll_s=1.0)
        if self.progress is not None:
            result.best = study_best(run, store, sid)  # the bar's best is the study's, as the summary's
            self.progress.start(self.target, result.before, result.best)
        try:
            if run.storage.heartbeat_interval_s:
                shared.heartbeat = Heartbeat(study)
            stats = run_search(study, run.space, run.problem_vars, self._measure, n_trials=self.target,
                               cached=self._cached, shared=shared, timeout_s=run.search.timeout_s,
                               seed=run.search.seed, prepare=pool.submit if pool is not None else None,
                               lookahead=pool.size if pool is not None else 0, on_measuring=self._measuring)
        finally:
            if shared.heartbeat is not None:
                shared.heartbeat.close()
            if self.progress is not None:
                self.progress.stop()
        result.infeasible, result.interrupted, result.exhausted = stats.infeasible, stats.interrupted, stats.exhausted
        if result.transfer is not None:
            result.transfer_text = transfer_text(result.transfer, sampler, study, self.inductor_seeds)
        result.retried, result.study_measured, result.waited_s = stats.retried, stats.study_measured, stats.waited_s
        log.info("worker %s: study %s: this worker measured %d (%d retried after dead workers, %d cached, "
                 "%d infeasible)%s; the study has %d of %d measured", worker_name(), run.study_name, stats.measured,
                 stats.retried, stats.cached, stats.infeasible,
                 f", waited {stats.waited_s:.0f} s for other workers" if stats.waited_s >= 1 else "",
                 stats.study_measured, self.target)

    # -- after the search ---------------------------------------------------------------------
    def _settle(self) -> None:
        if not self.result.interrupted and self.run_spec.replay is None:
            settle(self.run_spec, self.store, self.bench, self.rec, self.problem_id, self.result)

    def _finish(self, keep_status: bool = False) -> TuneResult:
        run, store, result = self.run_spec, self.store, self.result
        if not keep_status:  # a re-settle (settle_only) leaves a finished study's row alone
            store.finish_study(self.study_id, "interrupted" if result.interrupted
                               else EXHAUSTED if result.exhausted else FINISHED)
        result.contention = contention_count(store.timed_conditions(self.study_id))
        result.held_text = None if result.interrupted else held_claims_text(run, store, self.study_id, self.target)
        result.best = study_best(run, store, self.study_id)
        # a Kernel Tuner replay has no lookup table to carry its configs: nothing to say
        result.not_carried = not_carried_reason(result.best, run.device.kind) if run.replay is None else None
        if run.export.enabled and not result.interrupted and run.replay is None:
            shipped: dict = {}  # what the table's key ships for this problem, for the summary
            result.table_path, table = export_table(store, run.export, run.device.key, shipped=shipped)
            result.table_keys, result.shipped = list(table), shipped.get((self.device_id, self.problem_id))
        return result
