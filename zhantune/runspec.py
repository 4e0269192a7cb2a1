"""A validated tune request: resolve the composed config into a problem, a device and a search
space, refusing bad input before anything is written.

``resolve_run`` does every check that can fail on user input (the command line's own checks,
zhantune.request, again; then those that need torch: the device, the problem's memory, the spaces
against Inductor's config and the allow-list of table knobs), so a bad value never touches an
existing database. ``zhantune.tune.tune`` then runs the study.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from zhantune.bench.compile_pool import default_compile_workers
from zhantune.bench.isolated import WorkerSpec
from zhantune.bench.recorded import KernelTunerFile, ReplayProblem, load_kerneltuner
from zhantune.config import CONF_DIR, BenchConfig, ExportConfig, SearchConfig, StorageConfig
from zhantune.device import DeviceInfo, resolve_device
from zhantune.errors import ConfigError, SpaceError, shown
from zhantune.inductor import kernel_store
from zhantune.inductor.heuristics import offered_templates, template_params
from zhantune.inductor.knobs import BACKEND_FLAGS, TEMPLATE_KWARGS, config_knob_problem
from zhantune.inductor.settings import KERNEL_CACHE_PATCH
from zhantune.inductor.templates import inductor_template_ids
from zhantune.problems import GemmProblem
from zhantune.request import check_request
from zhantune.search.samplers import make_sampler
from zhantune.search.schema import Space, load_space
from zhantune.storage import check_url

if TYPE_CHECKING:
    from zhantune.bench.compile_pool import CompilePool
    from zhantune.bench.protocol import Benchmarker

__all__ = ["RunSpec", "resolve_run", "problem_variables", "cuda_offered_uids", "check_fits", "device_memory_bytes",
           "CONF_DIR"]

#: inductor config keys every candidate gets from zhantune itself (a space may not set them)
_RESERVED_CONFIG_KEYS = {"freezing", "force_disable_caches", "max_autotune", "max_autotune_gemm", "lookup_table.table",
                         *KERNEL_CACHE_PATCH}


@dataclass
class RunSpec:
    """A validated tune request: a GEMM problem compiled by Inductor, or a replay file.

    ``cfg`` is the composed config as the app got it (stored with the study); ``search``,
    ``bench``, ``storage`` and ``export`` are its groups as the typed dataclasses of
    zhantune.config (``OmegaConf.to_object``), which the library below the app reads."""

    problem: GemmProblem | ReplayProblem
    device: DeviceInfo
    space: Space
    space_names: list[str]
    problem_vars: dict[str, Any]
    cfg: DictConfig
    replay: KernelTunerFile | None = None
    #: bench.kernel_store's directory (zhantune.inductor.kernel_store.store_dir); None: off, a replay,
    #: the dry run
    kernel_store: str | None = None
    search: SearchConfig = field(init=False)
    bench: BenchConfig = field(init=False)
    storage: StorageConfig = field(init=False)
    export: ExportConfig = field(init=False)

    def __post_init__(self) -> None:
        for group in ("search", "bench", "storage", "export"):
            setattr(self, group, OmegaConf.to_object(self.cfg[group]))

    @property
    def study_name(self) -> str:
        """``search.study_name``, else ``<problem key>@<device key>``."""
        return self.search.study_name or f"{self.problem.key}@{self.device.key}"

    def compile_workers(self) -> int:
        """Compile-ahead workers for this run: ``bench.compile_workers`` (null: sized for the machine
        and device, zhantune.bench.compile_pool.default_compile_workers: 0 on this 2-core CPU machine, at
        least 1 on CUDA); 0 for replay or ``isolate: false``."""
        b = self.bench
        if self.replay is not None or not b.isolate:
            return 0
        if b.compile_workers is None:
            return default_compile_workers(self.device.kind)
        return int(b.compile_workers)

    def worker_spec(self, cache_dir: str | None = None) -> WorkerSpec:
        """How a benchmark worker builds this run's benchmarker (zhantune.bench.isolated.WorkerSpec)."""
        if self.replay is not None:
            return WorkerSpec("replay", {"path": str(self.replay.path), "pace": float(self.bench.replay_pace)})
        device = self.device.kind if self.device.index is None else f"{self.device.kind}:{self.device.index}"
        return WorkerSpec("inductor", {"problem": self.problem, "device": device, "seed": self.search.seed,
                                       "bench": dataclasses.asdict(self.bench),
                                       "cache_dir": cache_dir, "kernel_store": self.kernel_store})

    def benchmarker(self, cache_dir: str | None = None) -> Benchmarker:
        """In a worker subprocess when ``bench.isolate`` (zhantune.bench.isolated.IsolatedBenchmarker,
        built from :meth:`worker_spec`), else in-process (InductorBenchmarker, or ReplayBenchmarker
        for a Kernel Tuner file). ``cache_dir``: the worker's kernel cache directory (None: Inductor's
        own, TORCHINDUCTOR_CACHE_DIR or its default; zhantune.inductor.settings.KERNEL_CACHE_PATCH)."""
        b = self.bench
        if b.isolate:
            from zhantune.bench.isolated import IsolatedBenchmarker

            return IsolatedBenchmarker(self.worker_spec(cache_dir), b.compile_timeout_s, b.run_timeout_s)
        if self.replay is not None:
            from zhantune.bench.recorded import ReplayBenchmarker

            return ReplayBenchmarker(self.replay, float(b.replay_pace))
        from zhantune.bench.inductor import InductorBenchmarker

        return InductorBenchmarker(self.problem, self.device, b, seed=self.search.seed)

    def compile_pool(self, size: int, cache_dir: str | None = None) -> CompilePool:
        """``size`` compile-ahead workers sharing a kernel cache directory with the timing worker
        (``cache_dir``, None: Inductor's own)."""
        from zhantune.bench.compile_pool import CompilePool

        b = self.bench
        return CompilePool(self.worker_spec(cache_dir), size, b.compile_timeout_s, b.run_timeout_s)


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
        values = {**{k: [v] for k, v in b.fixed.items()}, **{p.key: p.values() for p in b.params}}
        if b.scope != "config":
            if device.kind == "cpu":
                raise SpaceError(f"{b.source}: template branches ({b.template_id}) apply on CUDA only; "
                                 "on CPU use config branches (conf/space/cpp_gemm.yaml)")
            # what a table may carry (knobs.TEMPLATE_KWARGS): a value outside it was measured, then
            # refused by export and made db merge refuse the whole database (a review's finding)
            for key, choices in values.items():
                bad = next(((v, why) for v in choices if (why := TEMPLATE_KWARGS.get(key, lambda _: None)(v))), None)
                if bad is not None:
                    raise SpaceError(f"{b.source}: {key}={shown(bad[0])}: a template kwarg is {bad[1]}")
            continue
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
    """Names a constraint may use: M, N, K, B, op (the lookup op on this device kind: mm, addmm,
    bmm), dtype_bytes, smem_bytes, sm_count, capability (a GPU's compute capability, "9.0"), cores, n_threads,
    whether Inductor offers a template for this size on this device kind, ``decompose_k_offered``
    and ``triton_mm_offered`` (its Triton GEMM template: ``triton::mm``, a bmm's ``triton::bmm``;
    zhantune.inductor.heuristics.offered_templates), ``tma_offered`` (the persistent TMA template:
    compute capability 9.0, 16-byte aligned strides), ``aten_offered`` (ATen's kernel as a lookup's
    choice: not where Inductor makes no GEMM selection, a dot-shaped bmm). On CUDA each is also what
    Inductor's lowering offers on this device (:func:`cuda_offered_uids`): no Triton template and no decomposeK on a GPU
    of fewer than 68 SMs (torch/_inductor/utils.py is_big_gpu), whose trials were all not applied."""
    p = device.properties
    d = problem.dims
    op = problem.lookup_op_on(device.kind)
    offered = offered_templates(op, d["M"], d["N"], d["K"])
    uids = cuda_offered_uids(problem, device) if device.kind == "cuda" else frozenset()
    if device.kind == "cuda":
        offered = {"decompose_k_offered": offered["decompose_k_offered"] and "decompose_k" in uids,
                   "triton_mm_offered": offered["triton_mm_offered"] and f"triton::{'bmm' if op == 'bmm' else 'mm'}" in uids}
    return {
        **d,
        "op": op,
        **offered,
        "tma_offered": "triton::mm_persistent_tma" in uids,
        "aten_offered": device.kind != "cuda" or f"aten::{op}" in uids,
        "dtype_bytes": problem.dtype_bytes,
        "smem_bytes": p.get("smem_bytes", 0),
        "sm_count": p.get("sm_count", 0),
        "capability": str(p.get("capability") or ""),
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
        import torch

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
    make_sampler(OmegaConf.to_container(cfg.search.sampler, resolve=True))  # its arguments, before anything is written
    profile_name = cfg.get("device_profile")
    if profile_name and not preview:
        raise ConfigError(f"device_profile={profile_name} previews a GPU's search spaces in the dry run "
                          "(python -m zhantune.space); a tune measures a real device: use device=cuda:N")
    if profile_name and (device := str(cfg.get("device", "auto"))) != "auto" and not device.startswith("cuda"):
        raise ConfigError(f"device_profile={profile_name} previews a GPU; device={cfg.device} asks for another device: "
                          "give one of them")  # the profile won, silently (an attack, session 42)
    if cfg.bench.name == "replay":
        if profile_name:
            raise ConfigError(f"device_profile={profile_name}: bench=replay takes its device from the file")
        return _resolve_replay(cfg)
    from zhantune.torch_support import check_torch

    check_torch(what="the zhantune.space dry run" if preview else "tuning with Inductor (bench=inductor)")
    shape = cfg.shape
    if isinstance(shape, ListConfig):
        shape = OmegaConf.to_container(shape, resolve=True)
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
    store = None if preview else kernel_store.store_dir(cfg.bench.get("kernel_store"))
    return RunSpec(problem, device, space, names, variables, cfg, kernel_store=None if store is None else str(store))


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


def check_task_fits(task: DictConfig) -> None:
    """A sweep job's problems (``shape=``, or each row of its ``problems=`` file) against its device's
    memory (:func:`check_fits`), before any job runs (zhantune.multirun: job #1's shape beyond memory
    was refused after job #0 had tuned); a replay has none. Raises ConfigError."""
    from zhantune.problems.file import op_activation, read_problems

    if task.bench.name == "replay":
        return
    if task.get("problems"):
        rows = [(r["op"], r["shape"], r.get("dtype", "float32"), r.get("activation") or op_activation(r["op"]),
                 r.get("weight_layout", "kn")) for r in read_problems(str(task.problems))]
    elif not OmegaConf.is_missing(task, "shape"):
        rows = [(task.op.name, list(task.shape), task.dtype, task.op.activation, task.weight_layout)]
    else:
        return
    device = resolve_device(task.device)
    for op, shape, dtype, activation, layout in rows:
        check_fits(GemmProblem.from_config(op, list(shape), dtype, activation, weight_layout=layout), device)


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
    # bench.path and space=[...] were checked (check_request)
    # stripped, as the import's devices=[...] (a helper found 'NAME ' a second device that prints as NAME)
    replay = load_kerneltuner(cfg.bench.path, device=str(cfg.bench.get("device_name") or "").strip() or None)
    return RunSpec(replay.problem(), replay.device(), replay.space(), ["replay"], {}, cfg, replay)
