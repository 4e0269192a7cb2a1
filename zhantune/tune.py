"""The tune job: resolve and validate the config, measure baselines, search, store, export.

``resolve_run`` does every check that can fail on user input before anything is written, so a bad
value never touches an existing database. ``tune`` then runs the study.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from sqlalchemy.exc import IntegrityError

from zhantune import interrupt
from zhantune.bench.conditions import (
    ContentionCount,
    conditions,
    contention_count,
    is_contended,
    mark_tune_root,
)
from zhantune.bench.inductor import BACKEND_FLAGS, KERNEL_CACHE_PATCH, InductorBenchmarker
from zhantune.bench.isolated import CompilePool, IsolatedBenchmarker, WorkerSpec, default_compile_workers
from zhantune.bench.measurement import Measurement
from zhantune.bench.replay import KernelTunerFile, ReplayBenchmarker, ReplayProblem, load_kerneltuner
from zhantune.config import CONF_DIR
from zhantune.device import DeviceInfo, resolve_device
from zhantune.errors import ConfigError, SpaceError, StorageError
from zhantune.inductor.heuristics import (
    decompose_k_splits,
    offered_templates,
    template_params,
    tma_epilogue_bytes,
    triton_mm_configs,
)
from zhantune.inductor.knobs import config_knob_problem
from zhantune.inductor.templates import inductor_template_ids, is_default_kernel
from zhantune.problems import GemmProblem
from zhantune.request import check_request
from zhantune.search.driver import DuplicateTrial, SharedStudy, run_search
from zhantune.search.samplers import make_sampler
from zhantune.search.space import Branch, Candidate, Space, load_space
from zhantune.search.study import MAX_RETRIES, Heartbeat, HeartbeatSettings, open_study, retry_trial
from zhantune.storage import Store, check_url
from zhantune.storage import models as orm
from zhantune.storage.store import ClaimLost, decision_us, redact_url

__all__ = ["RunSpec", "TuneResult", "Recorder", "resolve_run", "tune", "study_budget", "software_versions", "CONF_DIR"]

log = logging.getLogger(__name__)

#: inductor config keys every candidate gets from zhantune itself (a space may not set them)
_RESERVED_CONFIG_KEYS = {"freezing", "force_disable_caches", "max_autotune", "lookup_table.table", *KERNEL_CACHE_PATCH}


def environment_fields() -> dict[str, str | None]:
    """Software and host of this process, for the environment table (provenance of every row)."""
    import platform
    import socket

    import zhantune

    return {**software_versions(), "cuda": torch.version.cuda, "hip": torch.version.hip,
            "driver": None, "python": platform.python_version(), "zhantune": zhantune.__version__,
            "host": socket.gethostname()}


def software_versions() -> dict[str, str | None]:
    """torch and triton versions for provenance (triton None where not installed)."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"torch": torch.__version__, "triton": triton}


@dataclass
class RunSpec:
    """A validated tune request: a GEMM problem compiled by Inductor, or a replay file."""

    problem: GemmProblem | ReplayProblem
    device: DeviceInfo
    space: Space
    space_names: list[str]
    problem_vars: dict[str, Any]
    cfg: DictConfig
    replay: KernelTunerFile | None = None

    @property
    def study_name(self) -> str:
        return self.cfg.search.study_name or f"{self.problem.key}@{self.device.key}"

    def compile_workers(self) -> int:
        """Compile-ahead workers for this run: ``bench.compile_workers`` (null: sized for the machine
        and device, zhantune.bench.isolated.default_compile_workers: 0 on this 2-core CPU machine, at
        least 1 on CUDA); 0 for replay or ``isolate: false``."""
        b = self.cfg.bench
        if self.replay is not None or not b.isolate:
            return 0
        if b.compile_workers is None:
            return default_compile_workers(self.device.kind)
        return int(b.compile_workers)

    def _worker_spec(self, cache_dir: str | None) -> WorkerSpec:
        if self.replay is not None:
            return WorkerSpec("replay", {"path": str(self.replay.path), "pace": float(self.cfg.bench.replay_pace)})
        device = self.device.kind if self.device.index is None else f"{self.device.kind}:{self.device.index}"
        return WorkerSpec("inductor", {"problem": self.problem, "device": device, "seed": self.cfg.search.seed,
                                       "bench": OmegaConf.to_container(self.cfg.bench, resolve=True),
                                       "cache_dir": cache_dir})

    def benchmarker(self, cache_dir: str | None = None) -> InductorBenchmarker | ReplayBenchmarker | IsolatedBenchmarker:
        """In a worker subprocess when ``bench.isolate`` (zhantune.bench.isolated), else in-process.
        ``cache_dir``: Inductor's kernel cache shared with a compile-ahead pool (None: caches off)."""
        b = self.cfg.bench
        if b.isolate:
            return IsolatedBenchmarker(self._worker_spec(cache_dir), b.compile_timeout_s, b.run_timeout_s)
        if self.replay is not None:
            return ReplayBenchmarker(self.replay, float(b.replay_pace))
        return InductorBenchmarker(self.problem, self.device, b, seed=self.cfg.search.seed)

    def compile_pool(self, size: int, cache_dir: str) -> CompilePool:
        """``size`` compile-ahead workers sharing ``cache_dir`` with the timing worker."""
        b = self.cfg.bench
        return CompilePool(self._worker_spec(cache_dir), size, b.compile_timeout_s, b.run_timeout_s)


def _space_selection(cfg: DictConfig, device: DeviceInfo) -> tuple[list[str], dict[str, Any] | None]:
    """Space names and, when chosen with space=[...], the files Hydra composed (name -> content)."""
    space = cfg.get("space")
    if space:  # composed by Hydra from conf/space/<name>.yaml, each under space.<name>
        composed = OmegaConf.to_container(space, resolve=True)
        return list(composed), composed
    names = (cfg.op.spaces or {}).get(device.kind)
    if not names:
        raise ConfigError(f"op {cfg.op.name} has no default space for {device.kind}; give space=[name,...]")
    return [str(n) for n in names], None


def _check_config_keys(space: Space, device: DeviceInfo) -> None:
    from torch._inductor import config as inductor_config

    known = set(inductor_config.get_config_copy())
    for b in space.branches:
        if b.scope == "backend":
            if device.kind == "cpu":
                raise SpaceError(f"{b.source}: backend-flag branches (tf32) apply on CUDA only")
            for key in list(b.fixed) + [p.key for p in b.params]:
                if key not in BACKEND_FLAGS:
                    raise SpaceError(f"{b.source}: {key!r} is not a backend flag zhantune sets; allowed: "
                                     f"{', '.join(sorted(BACKEND_FLAGS))}")
            continue
        if b.scope != "config":
            if device.kind == "cpu":
                raise SpaceError(f"{b.source}: template branches ({b.template_id}) apply on CUDA only; "
                                 "on CPU use config branches (conf/space/cpp_gemm.yaml)")
            continue
        values = {**{k: [v] for k, v in b.fixed.items()}, **{p.key: p.values() for p in b.params}}
        for key, choices in values.items():
            if key in _RESERVED_CONFIG_KEYS:
                raise SpaceError(f"{b.source}: {key!r} is set by zhantune itself and cannot be tuned")
            if key not in known:
                raise SpaceError(f"{b.source}: {key!r} is not an Inductor config key "
                                 "(see torch/_inductor/config.py)")
            # only allow-listed knobs with checked values: what a tune stores is what a table ships
            for value in choices:
                why = config_knob_problem(key, value, device.kind)
                if why:
                    raise SpaceError(f"{b.source}: {why}")


def problem_variables(problem: GemmProblem, device: DeviceInfo) -> dict[str, Any]:
    """Names a constraint may use: M, N, K, B, dtype_bytes, smem_bytes, sm_count, cores, n_threads,
    whether Inductor offers a template for this size on this device kind, ``decompose_k_offered``
    and ``triton_mm_offered`` (zhantune.inductor.heuristics.offered_templates), ``tma_offered``
    (Inductor's lowering offers the persistent TMA template on this CUDA device for this problem:
    compute capability 9.0, 16-byte aligned strides; :func:`cuda_offered_uids`), and
    ``tma_epilogue_bytes``, the bytes per element of the persistent TMA template's epilogue layout
    conversion in shared memory (zhantune.inductor.heuristics.tma_epilogue_bytes)."""
    p = device.properties
    d = problem.dims
    op = problem.lookup_op_on(device.kind)
    return {
        **d,
        **offered_templates(op, d["M"], d["N"], d["K"]),
        "tma_offered": device.kind == "cuda" and "triton::mm_persistent_tma" in cuda_offered_uids(problem, device),
        "tma_epilogue_bytes": tma_epilogue_bytes(op, problem.dtype_bytes),
        "dtype_bytes": problem.dtype_bytes,
        "smem_bytes": p.get("smem_bytes", 0),
        "sm_count": p.get("sm_count", 0),
        "cores": p.get("cores", 0),
        "n_threads": p.get("threads", 0),
    }


def cuda_offered_uids(problem: GemmProblem, device: DeviceInfo) -> frozenset[str]:
    """The template uids Inductor's GEMM lowering offers for ``problem`` on a CUDA ``device``: the
    real lowering on the real device, or under zhantune.inductor.simulate.simulated_cuda for a
    profile (``device_profile=``). Where the lowering cannot run (an Inductor change), every GEMM
    template uid, so that no branch is dropped on a guess (a template not offered then shows as
    ``not_applied`` trials)."""
    import logging

    from zhantune.inductor import simulate

    op = problem.lookup_op_on("cuda")
    try:
        if device.properties.get("profile"):
            with simulate.simulated_cuda(simulate.profile(device.properties["profile"])):
                return simulate.offered_uids(problem, op)
        with torch.cuda.device(device.index or 0):  # Inductor's TMA check reads the current device
            return simulate.offered_uids(problem, op, device.index or 0)
    except Exception as e:  # Inductor's internals: never fail a run on this preview
        cap = str(device.properties.get("capability") or "0.0").split(".")
        tma = not device.properties.get("hip") and (int(cap[0]), int(cap[1] or 0)) >= (9, 0)
        logging.getLogger(__name__).warning("could not run Inductor's lowering to see which templates it offers "
                                            "(%s: %s); assuming all%s", type(e).__name__, e,
                                            "" if tma else " but the persistent TMA one (compute capability < 9.0)")
        return frozenset(u for u in inductor_template_ids() if tma or u != "triton::mm_persistent_tma")


def resolve_run(cfg: DictConfig, preview: bool = False) -> RunSpec:
    """Validate the composed config; raises a UserError subclass (exit code 2) on bad input.
    ``preview``: the dry run (python -m zhantune.space), which also takes ``device_profile=``."""
    check_request(cfg)  # the command line's own checks (zhantune.request), again: a problems file's rows
    profile_name = cfg.get("device_profile")
    if profile_name and not preview:
        raise ConfigError(f"device_profile={profile_name} previews a GPU's search spaces in the dry run "
                          "(python -m zhantune.space); a tune measures a real device: use device=cuda:N")
    if cfg.bench.name == "replay":
        if profile_name:
            raise ConfigError(f"device_profile={profile_name}: bench=replay takes its device from the file")
        return _resolve_replay(cfg)
    shape = cfg.shape
    if isinstance(shape, ListConfig):
        shape = OmegaConf.to_container(shape)
    problem = GemmProblem.from_config(cfg.op.name, shape, cfg.dtype, cfg.op.activation,
                                      weight_layout=cfg.weight_layout)
    device = _profile_device(profile_name) if profile_name else resolve_device(cfg.device)
    check_fits(problem, device)
    names, composed = _space_selection(cfg, device)
    variables = problem_variables(problem, device)
    space = load_space(names, CONF_DIR / "space", variables, set(inductor_template_ids()),
                       op=problem.lookup_op_on(device.kind), composed=composed, template_params=template_params)
    _check_config_keys(space, device)
    check_url(cfg.storage.url)
    return RunSpec(problem, device, space, names, variables, cfg)


def _profile_device(name: str) -> DeviceInfo:
    """The DeviceInfo of GPU profile ``name`` (zhantune.inductor.simulate.PROFILES); ConfigError
    naming the known profiles otherwise."""
    from zhantune.inductor.simulate import profile

    try:
        return profile(name).device_info()
    except KeyError as e:
        raise ConfigError(f"device_profile={name}: unknown GPU profile; known: {e.args[0].split('known: ')[1]}") from None


def device_memory_bytes(device: DeviceInfo) -> int | None:
    """The device's memory in bytes: GPU memory on CUDA, physical memory on CPU; None if unknown."""
    if device.kind == "cuda":
        return device.properties.get("memory_bytes")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(problem: GemmProblem, device: DeviceInfo) -> None:
    """Refuse a problem whose tensors cannot fit in the device's memory, before anything is
    allocated or opened; raises ConfigError (exit code 2)."""
    have = device_memory_bytes(device)
    need = problem.memory_bytes()
    if have is not None and need > have:
        shape = "[" + ",".join(str(v) for v in problem.shape) + "]"
        raise ConfigError(f"shape={shape}: {problem.op} in {problem.dtype} needs at least {need / 2**30:,.1f} GiB "
                          f"(inputs, output and the float64 reference); {device.name} has {have / 2**30:,.1f} GiB")


def _resolve_replay(cfg: DictConfig) -> RunSpec:
    """bench=replay: problem, device and space all come from the Kernel Tuner file."""
    replay = load_kerneltuner(cfg.bench.path)  # bench.path and space=[...] were checked (check_request)
    return RunSpec(replay.problem(), replay.device(), replay.space(), ["replay"], {}, cfg, replay)


@dataclass
class TuneResult:
    study_name: str
    study_id: int
    eager: orm.Measurement | None
    default: orm.Measurement | None
    best: orm.Measurement | None
    statuses: collections.Counter = field(default_factory=collections.Counter)
    infeasible: int = 0
    cached: int = 0
    measured: int = 0
    interrupted: bool = False
    table_path: Path | None = None
    table_keys: list[str] = field(default_factory=list)
    #: "clear", "tie" (within noise after re-measuring) or None (fewer than two correct configs)
    verdict: str | None = None
    verdict_text: str | None = None
    #: timed rows taken on a busy machine, and what was done about it (zhantune.bench.conditions)
    contention: ContentionCount = field(default_factory=ContentionCount)
    #: set when the winner and the default were re-measured interleaved (settle_speedup)
    speedup_text: str | None = None
    #: the settled speedup claim over the default (zhantune.bench.decision.SpeedupVerdict); None: not settled
    claim: Any = None
    #: the config the claim is about: the best one a table can carry (``best`` unless that one is
    #: not carried, ``not_carried``)
    claimed: orm.Measurement | None = None
    #: CPU: Inductor's default compile without freezing (shown beside the frozen default)
    default_unfrozen: orm.Measurement | None = None
    #: why a lookup table cannot carry the best config on this device (a compile-wide setting on
    #: CUDA: fusion limits, TF32), or None; the summary says so and the table does not ship it
    not_carried: str | None = None
    #: the winner is the ``aten`` config, the very kernel Inductor's default compile runs: a
    #: difference between the two is noise, never a speedup (the summary says so)
    same_kernel_as_default: bool = False
    #: search.transfer: the prior the search started from (zhantune.search.transfer.Prior), None: cold
    transfer: Any = None
    #: one line on what transfer did (or why it did nothing), for the summary; None: nothing to say
    transfer_text: str | None = None
    #: the study's budget of measured trials (``search.n_trials``, or what it held plus
    #: ``search.more_trials``) and how much of it earlier runs had used
    target: int = 0
    before: int = 0
    #: the study had measured its budget (or every feasible point) before: nothing was run
    already_finished: bool = False
    #: every feasible point of the space is measured
    exhausted: bool = False
    #: the baselines came from the database (measured by an earlier run in this environment)
    baselines_reused: bool = False

    @property
    def done(self) -> int:
        """Measured trials of the study after this run (all runs and workers that used its budget)."""
        return self.before + self.measured
    #: of ``measured``: points of dead workers' trials measured again by this worker
    retried: int = 0
    #: dead workers' trials this worker failed (heartbeat older than storage.grace_period_s)
    reaped: int = 0
    #: measured candidates of the whole study (every worker) when this worker's search ended
    study_measured: int = 0
    #: seconds this worker waited for other workers' trials once every remaining trial was claimed
    waited_s: float = 0.0


def worker_name() -> str:
    """``host:pid`` of this process (log lines of a launcher's jobs name their worker)."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"




class Recorder:
    """Turns benchmark Measurements into rows (one commit per trial)."""

    def __init__(self, store: Store, problem: GemmProblem | ReplayProblem, study_id: int, device_id: int,
                 problem_id: int, device: DeviceInfo | None = None):
        """``device``: the device measured on here (its conditions are recorded with every timed
        row); None for recorded data (replay), which was measured elsewhere."""
        self.store, self.problem, self.study_id = store, problem, study_id
        self.device_kind = device.kind if device is not None else None
        self.device_index = device.index if device is not None else None
        self.device_id, self.problem_id = device_id, problem_id
        self.versions = software_versions()
        self.environment_id = store.environment_id(environment_fields())

    def add(self, meas: Measurement, kind: str, candidate: Candidate | None = None,
            trial_number: int | None = None, claimed: bool = False) -> orm.Measurement:
        """Store one row; ``claimed``: a claimed candidate's row, stored only while the claim is still
        this worker's (zhantune.storage.Store.add_measurement; else ClaimLost)."""
        t = meas.timing
        fields: dict[str, Any] = dict(
            study_id=self.study_id, device_id=self.device_id, problem_id=self.problem_id,
            environment_id=self.environment_id, trial_number=trial_number, kind=kind, status=meas.status,
            branch=candidate.branch if candidate else None,
            template_id=candidate.template_id if candidate else None,
            params=candidate.params if candidate else {},
            config_hash=candidate.config_hash if candidate else None,
            template_hash=meas.template_hash,
            lookup_key=meas.lookup.device_key if meas.lookup else None,
            error=meas.error if meas.error is not None and math.isfinite(meas.error) else None,
            error_text=meas.error_text, compile_s=meas.compile_s,
            torch_version=self.versions["torch"], triton_version=self.versions["triton"],
        )
        if t is not None:
            fields.update(median_us=t.median_us, min_us=t.min_us, max_us=t.max_us, p20_us=t.p20_us,
                          p80_us=t.p80_us, n=t.n, timing_method=t.method, mean_us=t.mean_us, std_us=t.std_us,
                          iqr_us=t.iqr_us, cv=t.cv,
                          tflops=self.problem.tflops(t.median_us) if t.median_us > 0 else None)
        if self.device_kind is not None and t is not None:
            # as the timing process saw it (with the back-off's wait), else a snapshot here
            c = meas.conditions or conditions(self.device_kind, self.device_index)
            fields.update(conditions=c, contended=is_contended(c))
        row_id = self.store.add_measurement(claimed=claimed, **fields)
        return orm.Measurement(id=row_id, **fields)


#: zt_study.status of a study that ended without an interrupt, and of one whose every feasible
#: point is measured (more trials cannot measure anything new)
FINISHED, EXHAUSTED = "finished", "exhausted"


def study_budget(run: RunSpec, store: Store) -> tuple[Any, int, int]:
    """(the study's row or None, trials it has used, its budget): ``search.n_trials`` is the
    study's total over all runs; ``search.more_trials=N`` makes it what the study holds plus N."""
    row = store.study(run.study_name)
    used = store.trials_used(row.id) if row is not None else 0
    more = run.cfg.search.get("more_trials")
    return row, used, (used + more if more is not None else run.cfg.search.n_trials)


def tune(run: RunSpec, store: Store, progress: Any = None) -> TuneResult:
    """Baselines first, then the Optuna study until it holds ``search.n_trials`` measured
    candidates (all runs together: a rerun measures only what is missing).

    Infeasible points (a constraint fails) and cache hits (same candidate, device, problem and
    software versions already measured) do not use the budget. Every trial is committed when it ends.
    A study that ended with its budget measured (or its space exhausted) is not run again: the result
    has ``already_finished`` set and nothing is measured or started. A resumed study re-uses the
    baselines it stored in this environment (Store.stored_baselines) unless
    ``bench.remeasure_baselines``.
    """
    row, used, target = study_budget(run, store)
    if row is not None and row.status in (FINISHED, EXHAUSTED) and (used >= target or row.status == EXHAUSTED):
        return _finished_result(run, store, row, used, target)
    mark_tune_root()  # NVML's "other processes" leave out this tune's workers (conditions.own_pids)
    sampler = make_sampler(OmegaConf.to_container(run.cfg.search.sampler, resolve=True))
    n_compile = run.compile_workers()
    # compile ahead: one kernel cache for this tune, shared by the timing and compile workers
    cache_dir = tempfile.mkdtemp(prefix="zhantune-kernels-") if n_compile else None
    bench = run.benchmarker(cache_dir)
    pool = run.compile_pool(n_compile, cache_dir) if cache_dir else None
    try:
        return _tune(run, store, bench, sampler, progress, pool, target)
    finally:
        for part in (pool, bench):
            close = getattr(part, "close", None)
            if close is not None:
                close()
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)


def _finished_result(run: RunSpec, store: Store, row: Any, used: int, target: int) -> TuneResult:
    """The result of a study that has nothing left to measure, from the database alone."""
    versions = software_versions()
    dev = next((d for d in store.devices() if d.key == run.device.key), None)
    stored = (store.stored_baselines(row.id, dev.id, run.problem.key, versions["torch"], versions["triton"])
              if dev is not None else {})
    best = next((m for _, p, m in store.best_candidates(run.device.key) if p.key == run.problem.key), None)
    return TuneResult(run.study_name, row.id, stored.get("eager"), stored.get("default"), best,
                      default_unfrozen=stored.get("default_unfrozen"), target=target, before=used,
                      already_finished=True, exhausted=row.status == EXHAUSTED, baselines_reused=bool(stored))


def _tune(run: RunSpec, store: Store, bench: Any, sampler: optuna.samplers.BaseSampler,
          progress: Any, pool: CompilePool | None = None, target: int | None = None) -> TuneResult:
    cfg, problem, device = run.cfg, run.problem, run.device
    target = cfg.search.n_trials if target is None else target

    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    config_dump = OmegaConf.to_container(cfg, resolve=True)
    study_id = store.study_id(run.study_name, config_dump)
    before = store.trials_used(study_id)

    # baselines (eager and Inductor's default; the default compile also records the lookup key):
    # a resumed study re-uses the ones it stored with this device, torch and triton
    versions = software_versions()
    stored = {} if cfg.bench.remeasure_baselines or run.replay is not None else store.stored_baselines(
        study_id, device_id, problem.key, versions["torch"], versions["triton"])
    if stored:
        problem_id = stored["eager"].problem_id
        if any(b.scope == "template" for b in run.space.branches):
            bench.record_lookup()  # untimed: template candidates are served under the key it records
    else:
        baselines = bench.baselines()
        fields = problem.row_fields()
        lookup = getattr(bench, "lookup", None)  # replay has none
        if lookup is not None:  # the op Inductor looked the GEMM up with (linear_act on a GPU: mm)
            fields["lookup_op"] = lookup.op_name
        problem_id = store.problem_id(problem.key, lookup_key=bench.lookup_key, **fields)
    rec = Recorder(store, problem, study_id, device_id, problem_id, None if run.replay is not None else device)
    rows = stored or {kind: rec.add(meas, kind) for kind, meas in baselines}
    result = TuneResult(run.study_name, study_id, rows.get("eager"), rows.get("default"), None,
                        default_unfrozen=rows.get("default_unfrozen"), target=target, before=before,
                        baselines_reused=bool(stored))
    if pool is not None:
        pool.lookup = bench.lookup  # template candidates are served under the recorded key
        # no compile shares the cores (CPU) or the GPU (a compile worker runs its candidate once to
        # check it, on the GPU being timed) with a timed run
        bench.phase_hook = pool.phase_hook

    beat = cfg.storage.get("heartbeat_interval_s")
    heartbeat = None
    if beat:
        def on_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            """Another worker's trial whose heartbeat stopped: release its claim, queue its point again."""
            released = store.release_trial(study_id, trial.number)
            retries = retry_trial(study, trial)
            result.reaped += 1
            log.warning("trial %d: its worker stopped beating (no heartbeat for %d s): failed; %s", trial.number,
                        cfg.storage.grace_period_s,
                        ("its point is queued again" + (f" (retry {retries})" if retries > 1 else "")
                         if retries is not None else f"not retried again (retried {MAX_RETRIES} times)")
                        + ("" if released else "; its measurement was already stored"))

        heartbeat = HeartbeatSettings(int(beat), int(cfg.storage.grace_period_s), on_stale)
    with store.schema_lock():  # N workers may start on one new database: Optuna creates its tables once
        study = open_study(run.study_name, cfg.storage.url, sampler, heartbeat)
    _enqueue_seeds(study, run)
    _use_prior(run, store, sampler, result)
    done_before, _ = store.trial_counts(study_id)
    log.info("worker %s: study %s in %s: %d of search.n_trials=%d measured so far", worker_name(), run.study_name,
             redact_url(cfg.storage.url), done_before, target)

    def cached(cand: Candidate) -> tuple[bool, float | None]:
        hit = store.cached(device_id, problem_id, cand.config_hash, rec.versions["torch"], rec.versions["triton"])
        if hit is None:
            return False, None
        result.cached += 1
        return True, hit.median_us if hit.status == "ok" else None

    def measure(cand: Candidate, trial_number: int) -> float | None:
        pre = pool.result(cand) if pool is not None else None
        if pre is not None and not pre.ok:  # it failed in the compile worker: it would here too
            meas = pre
        else:
            meas = bench.measure(cand)
            if pre is not None:  # the compile's cost is the compile worker's (the kernels came from it)
                meas = dataclasses.replace(meas, compile_s=pre.compile_s)
        try:
            row = rec.add(meas, "candidate", cand, trial_number, claimed=True)
        except ClaimLost as e:  # this worker was taken for dead: the point is another worker's now
            log.warning("trial %d: %s; its measurement is dropped", trial_number, e)
            raise DuplicateTrial(trial_number) from e
        except StorageError as e:
            if isinstance(e.__cause__, IntegrityError):  # another worker stored this trial first
                raise DuplicateTrial(trial_number) from e
            raise
        result.measured += 1
        result.statuses[meas.status] += 1
        if meas.ok and (result.best is None or (decision_us(row), row.id) < (decision_us(result.best), result.best.id)):
            result.best = row  # as Store.ranked_candidates ranks (one rule for every "best")
        if progress is not None:
            progress.update(result, cand, meas)
        else:  # a launcher's job: one log line per trial
            log.info("trial %d: %s%s", trial_number, meas.status,
                     f" {meas.timing.median_us:,.1f} us" if meas.timing else f" ({meas.error_text})")
        return row.median_us if meas.ok else None

    def measuring(cand: Candidate, trial_number: int, retry: bool) -> None:
        if progress is None:
            log.info("trial %d: measuring %s%s", trial_number, cand.describe(),
                     " (again: its first worker died)" if retry else "")

    shared = SharedStudy(
        claim=lambda c, n, limit: store.claim(study_id, c.config_hash, n, limit),
        release=lambda c: store.release(study_id, c.config_hash),
        counts=lambda: store.trial_counts(study_id),
        in_flight=lambda: store.in_flight(study_id),
        release_trial=lambda n: store.release_trial(study_id, n),
        poll_s=1.0)
    if progress is not None:
        progress.start(target, before)
    try:
        if beat:
            shared.heartbeat = Heartbeat(study)
        stats = run_search(study, run.space, run.problem_vars, measure, n_trials=target,
                           cached=cached, shared=shared, timeout_s=cfg.search.timeout_s,
                           seed=cfg.search.seed, prepare=pool.submit if pool is not None else None,
                           lookahead=pool.size if pool is not None else 0, on_measuring=measuring)
    finally:
        if shared.heartbeat is not None:
            shared.heartbeat.close()
        if progress is not None:
            progress.stop()
    result.infeasible, result.interrupted, result.exhausted = stats.infeasible, stats.interrupted, stats.exhausted
    if result.transfer is not None:
        result.transfer_text = _transfer_text(result.transfer, sampler)
    result.retried, result.study_measured, result.waited_s = stats.retried, stats.study_measured, stats.waited_s
    log.info("worker %s: study %s: this worker measured %d (%d retried after dead workers, %d cached, %d infeasible)"
             "%s; the study has %d of %d measured", worker_name(), run.study_name, stats.measured, stats.retried,
             stats.cached, stats.infeasible, f", waited {stats.waited_s:.0f} s for other workers" if stats.waited_s >= 1
             else "", stats.study_measured, target)
    if not result.interrupted and run.replay is None:
        try:  # the close call first: the speedup is then settled for the config the ranking names
            if cfg.bench.remeasure_rounds > 0:
                settle_close_call(run, store, bench, rec, problem_id, result)
            settle_speedup(run, store, bench, bench.measure_default, rec, problem_id, result)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM while re-measuring: the study itself is complete
            result.interrupted = True
    store.finish_study(study_id, "interrupted" if result.interrupted else EXHAUSTED if result.exhausted else FINISHED)
    result.contention = contention_count(store.timed_conditions(study_id))
    result.best = _best_for_problem(store, device.key, problem_id)
    result.same_kernel_as_default = result.best is not None and _is_default_kernel(result.best)
    result.not_carried = not_carried_reason(result.best, device.kind)
    if cfg.export.enabled and not result.interrupted and run.replay is None:
        from zhantune.export import export_table

        result.table_path, table = export_table(store, cfg.storage.url, cfg.export, device.key)
        result.table_keys = list(table)
    return result


def _use_prior(run: RunSpec, store: Store, sampler: optuna.samplers.BaseSampler, result: TuneResult) -> None:
    """search.transfer=auto: hand the sampler what the storage holds about this problem elsewhere
    (zhantune.search.transfer.load_prior). Samplers without ``set_prior`` (all but the default)
    start cold; the summary says so."""
    if run.cfg.search.transfer == "off":
        return
    from zhantune.search.transfer import load_prior

    prior = load_prior(store, run.device.key, run.problem)
    if prior is None:
        return
    set_prior = getattr(sampler, "set_prior", None)
    if not callable(set_prior):
        result.transfer_text = (f"transfer: not used: search={run.cfg.search.name} takes no prior "
                                f"({prior.describe()} available; the default search uses them)")
        return
    set_prior(prior.scores)
    result.transfer = prior


def _transfer_text(prior: Any, sampler: Any) -> str:
    """The summary's line on how the prior seeded the search (FeasibleTPESampler's seeds and region)."""
    region = getattr(sampler, "prior_region_size", None)
    feasible = len(sampler.feasible_set) if getattr(sampler, "feasible_set", None) is not None else None
    text = f"transfer: {prior.describe()}"
    if region is None or feasible is None:
        return text + "; none of their configs is in this space"
    seeds = sampler.prior_seed_count
    if seeds:
        text += f"; their {seeds} best config(s) were proposed before the sampler's own picks"
    if region < feasible:
        text += (f"; proposals stayed within their best {region:,} of {feasible:,} feasible configs "
                 "while the best point measured here was one of them")
    return text + " (search.transfer=off: a cold start)"


def settle_close_call(run: RunSpec, store: Store, bench: Any, rec: Recorder, problem_id: int,
                      result: TuneResult) -> None:
    """If the two fastest configs of this (device, problem) are within each other's noise
    (:func:`zhantune.bench.timing.is_tie`), measure both ``bench.remeasure_rounds`` more times,
    interleaved, and store those rows (kind ``remeasure``); the ranking then uses each config's
    lowest decision statistic (Store.ranked_candidates). Sets ``result.verdict`` to "clear" or "tie"
    with a sentence for the summary that names the configs in the ranking's order."""
    from zhantune.bench.timing import is_tie

    ranked = next((rows for dev, prob, rows in store.ranked_candidates(run.device.key, top_k=2)
                   if prob.id == problem_id), [])
    if len(ranked) < 2:
        return
    a, b = ranked
    if not is_tie(a, b):
        result.verdict = "clear"
        result.verdict_text = (f"clear winner: the runner-up is {decision_us(b) / decision_us(a):.2f}x slower, "
                               "outside the noise (20th-80th percentiles do not overlap)")
        return
    cands = []
    for row in (a, b):
        branch = next((br for br in run.space.branches if br.name == row.branch), None)
        if branch is None:  # measured by another space (a cached row): cannot be rebuilt here
            result.verdict, result.verdict_text = "tie", "close call with a config outside this space: not re-measured"
            return
        cands.append(Candidate(row.branch, branch.scope, row.template_id, dict(row.params)))
    fresh: dict[str, list[float]] = {c.config_hash: [] for c in cands}
    last = {}
    with interrupt.interruptible():
        for _ in range(run.cfg.bench.remeasure_rounds):
            for cand in cands:
                meas = bench.measure(cand)
                last[cand.config_hash] = rec.add(meas, "remeasure", cand)
                if meas.ok:
                    fresh[cand.config_hash].append(decision_us(last[cand.config_hash]))
    ra, rb = (last.get(c.config_hash) for c in cands)
    ma, mb = (sorted(fresh[c.config_hash]) for c in cands)
    if not ma or not mb or ra is None or rb is None:
        result.verdict, result.verdict_text = "tie", "close call: a re-measurement failed"
        return
    # the two configs in the order the ranking now gives (one rule for every "best")
    first, second = (0, 1) if min(decision_us(a), ma[0]) <= min(decision_us(b), mb[0]) else (1, 0)
    best_us = [min(decision_us(a), ma[0]), min(decision_us(b), mb[0])]
    tied = ma[0] <= mb[-1] and mb[0] <= ma[-1]  # the rounds' minimums overlap
    result.verdict = "tie" if tied else "clear"
    result.verdict_text = (f"close call re-measured {run.cfg.bench.remeasure_rounds}x interleaved (minimum of "
                           f"individually timed runs): {cands[first].describe()} {best_us[first]:,.1f} us is "
                           f"faster than {cands[second].describe()} {best_us[second]:,.1f} us; "
                           + ("still within the noise: a tie, either is fine" if tied else "now a clear winner"))


def settle_speedup(run: RunSpec, store: Store, bench: Any, measure_default: Callable[[], Measurement],
                   rec: Recorder, problem_id: int, result: TuneResult) -> None:
    """Settle the speedup claim of the winner over Inductor's default (always, not only when their
    times overlap): ``bench.remeasure_rounds`` interleaved rounds of the default and the winner, their
    order alternating; rows are stored as kinds ``default`` and ``remeasure``. The claim is judged by
    zhantune.bench.decision.judge_speedup and stored as a Verdict, which the exporter follows:
    an unconfirmed claim ships Inductor's default. Sets ``result.claim``, ``result.default``
    (its row with the lowest decision statistic) and ``result.speedup_text``."""
    from zhantune.bench.decision import Round, SpeedupVerdict, judge_speedup

    default = result.default
    ranked = next((rows for dev, prob, rows in store.ranked_candidates(run.device.key, top_k=1 << 30)
                   if prob.id == problem_id), [])
    # the fastest config a lookup table can carry on this device (a faster compile-wide setting,
    # a fusion limit or TF32 on CUDA, is reported but never shipped: not_carried_reason)
    best = next((r for r in ranked if run.replay is not None or not_carried_reason(r, run.device.kind) is None), None)
    if default is None or default.status != "ok" or best is None:
        return
    result.claimed = best
    branch = next((br for br in run.space.branches if br.name == best.branch), None)
    if _is_default_kernel(best):
        verdict = SpeedupVerdict(None, None, None, 0, 0, False,
                                 "the winner is the kernel Inductor's default compile runs: no speedup to claim")
    elif run.cfg.bench.remeasure_rounds == 0:
        verdict = SpeedupVerdict(None, None, None, 0, 0, False,
                                 "not settled (bench.remeasure_rounds=0): no paired rounds, no claim")
    elif branch is None:  # the winner was measured by another space (a cached row)
        verdict = SpeedupVerdict(None, None, None, 0, 0, False,
                                 "the winner was measured by another study's space: not re-measured, no claim")
    else:
        cand = Candidate(best.branch, branch.scope, best.template_id, dict(best.params))
        rounds, defaults = [], [default]
        with interrupt.interruptible():
            for i in range(run.cfg.bench.remeasure_rounds):
                got: dict[str, Any] = {}
                order = ("default", "winner") if i % 2 == 0 else ("winner", "default")
                for side in order:
                    meas = measure_default() if side == "default" else bench.measure(cand)
                    row = rec.add(meas, "default" if side == "default" else "remeasure",
                                  cand if side == "winner" else None)
                    got[side] = row
                    if side == "default" and meas.ok:
                        defaults.append(row)
                rounds.append(Round(*(decision_us(got[s]) if got.get(s) is not None and got[s].status == "ok"
                                      else None for s in ("default", "winner")),
                                    contended=sum(1 for r in got.values() if _contended_unshielded(r))))
        verdict = judge_speedup(rounds)
        result.default = min(defaults, key=lambda r: (decision_us(r), r.id or 0))
        result.speedup_text = (f"speedup vs default, {len(rounds)} paired interleaved round(s) (minimum of "
                               f"individually timed runs): {verdict.claim_text()}"
                               + ("" if verdict.confirmed or verdict.ratio is None else f"; {verdict.reason}"))
    store.add_verdict(study_id=result.study_id, device_id=rec.device_id, problem_id=problem_id,
                      config_hash=best.config_hash, ratio=verdict.ratio, ratio_low=verdict.ratio_low,
                      ratio_high=verdict.ratio_high, rounds=verdict.rounds, contended=verdict.contended,
                      confirmed=verdict.confirmed, reason=verdict.reason)
    result.claim = verdict


def _contended_unshielded(row: orm.Measurement) -> bool:
    """A timed row taken under contention and not shielded from it: only a ``:fifo`` timing
    (real-time scheduling, zhantune.bench.timing.realtime) is; niceness alone is not (measured:
    a 30 us kernel at 13.5 ms under four busy loops at nice -10)."""
    return bool(row.contended) and ":fifo" not in (row.timing_method or "")


def _is_default_kernel(row: orm.Measurement) -> bool:
    """The very kernel Inductor's default compile runs (zhantune.inductor.templates.is_default_kernel):
    re-measuring it against the default decides nothing."""
    return is_default_kernel(row.template_id, row.params)


def not_carried_reason(row: orm.Measurement | None, device_kind: str) -> str | None:
    """Why a lookup table cannot carry this measured config on ``device_kind`` (so the export skips
    it: zhantune.inductor.table.build_table), or None: a torch.backends flag (TF32) is process-wide,
    and on CUDA a config patch is compile-wide (zhantune.inductor.table.not_carried)."""
    from zhantune.inductor.table import entry_for, entry_problem, not_carried

    if row is None:
        return None
    if row.template_id is None and row.params and all(k in BACKEND_FLAGS for k in row.params):
        flags = ", ".join(f"torch.backends.{k} = {v}" for k, v in sorted(row.params.items()))
        return f"torch.backends flags are process-wide, not a per-GEMM choice a table can carry; set {flags} yourself"
    entry = entry_for(row.template_id, row.params, row.template_hash)
    why = not_carried(entry, device_kind)
    if why is None and entry_problem(entry, device_kind) is not None:
        name, problem = entry_problem(entry, device_kind)
        why = f"{name}: {problem}"
    return why


def _best_for_problem(store: Store, device_key: str, problem_id: int) -> orm.Measurement | None:
    """Fastest ok candidate for this device and problem, cache hits from earlier studies included."""
    return next((meas for _, prob, meas in store.best_candidates(device_key) if prob.id == problem_id), None)


def inductor_seeds(run: RunSpec) -> list[tuple[Branch, dict[str, Any]]]:
    """What Inductor itself would try, as points of the space: every fixed-only branch (aten), each
    config branch at Inductor's current defaults, the Triton configs of Inductor's own heuristic for
    this size, and its decomposeK splits. Only points that are feasible members of the space."""
    from torch._inductor import config as inductor_config

    problem = run.problem
    if not isinstance(problem, GemmProblem):
        return []
    dims = problem.dims
    seeds: list[tuple[Branch, dict[str, Any]]] = []
    heuristic: list[dict[str, Any]] | None = None

    def add(b: Branch, values: dict[str, Any]) -> None:
        tuned = [p for p in b.params if p.distribution is not None]
        if all(p.name in values and values[p.name] in p.values() for p in tuned) \
                and b.feasible(values, run.problem_vars) and (b, values) not in seeds:
            seeds.append((b, values))

    for b in run.space.branches:
        tuned = [p for p in b.params if p.distribution is not None]
        if not tuned:
            add(b, {})
        elif b.scope == "config":
            defaults = inductor_config.get_config_copy()
            add(b, {p.name: defaults.get(p.key) for p in tuned})
        elif b.scope == "template" and b.template_id in ("triton::mm", "triton::bmm") and run.cfg.search.seed_inductor:
            if heuristic is None:
                heuristic = triton_mm_configs(dims["M"], dims["N"], dims["K"], problem.dtype_bytes)
            for c in heuristic:
                add(b, {p.name: c.get(p.key) for p in tuned})
        elif b.template_id == "decompose_k" and run.cfg.search.seed_inductor:
            for k_split in decompose_k_splits(dims["M"], dims["N"], dims["K"]):
                add(b, {p.name: k_split for p in tuned if p.key == "k_split"})
    return seeds


def _enqueue_seeds(study: optuna.Study, run: RunSpec) -> None:
    """Before sampling (a new study only), enqueue what Inductor itself would try (inductor_seeds):
    fixed-only branches first, then the rest up to ``search.max_seeds``."""
    if study.trials:
        return
    seeds = inductor_seeds(run)
    if not run.cfg.search.seed_inductor:
        seeds = [(b, v) for b, v in seeds if not v]
    fixed = [(b, v) for b, v in seeds if not v]
    rest = [(b, v) for b, v in seeds if v][: max(0, run.cfg.search.max_seeds - len(fixed))]
    for b, values in fixed + rest:
        study.enqueue_trial(run.space.trial_params(b, values), skip_if_exists=True)
