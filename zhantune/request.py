"""Check a tune request before the heavy imports: what can be wrong with the command line alone.

torch and Inductor take seconds to import; a mistyped op, shape, dtype, device, option or storage
URL is refused before that, with the one-line message and exit code 2 of every user error. Nothing
here imports torch. :func:`zhantune.runspec.resolve_run` then checks what needs the machine (the CUDA
devices, the problem's memory, the search spaces against Inductor's config).
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import ListConfig, OmegaConf

from zhantune.config import TRANSFER_MODES, check_bench
from zhantune.errors import ConfigError, DeviceError

__all__ = ["OPS", "DTYPE_NAMES", "WEIGHT_LAYOUTS", "ACTIVATIONS", "check_request", "check_search", "check_problem",
           "check_device_spec", "check_model_request", "check_file"]

#: op name -> dimension names of its ``shape``
OPS: dict[str, tuple[str, ...]] = {
    "mm": ("M", "N", "K"),
    "addmm": ("M", "N", "K"),
    "bmm": ("B", "M", "N", "K"),
    "linear_act": ("M", "N", "K"),
}

#: dtype names accepted on the command line (zhantune.problems.gemm.DTYPES maps them to torch dtypes)
DTYPE_NAMES = ("float32", "bfloat16", "float16")

#: how the second operand is stored: "kn" is W [K, N] row-major (x @ W); "nk" is W [N, K] used as
#: W.t(), the layout of torch.nn.Linear's weight (its lookup key has strides [1, K])
WEIGHT_LAYOUTS = ("kn", "nk")

ACTIVATIONS = ("relu", "gelu")

_DEVICE_SPEC = re.compile(r"auto|cpu|cuda(?::\d+)?")


def check_request(cfg: Any) -> None:
    """Every check of a tune app's config that needs neither torch nor the machine; raises a
    UserError subclass (exit code 2) naming the value and what is allowed."""
    from zhantune.storage import check_url

    check_search(cfg)
    if not cfg.get("problems") and cfg.search.get("total_trials") is not None:
        raise ConfigError(f"search.total_trials={cfg.search.total_trials} shares trials among the problems of a "
                          "problems= file; one problem takes search.n_trials")
    if cfg.bench.name == "replay":
        if not cfg.bench.path:
            raise ConfigError("bench=replay needs bench.path=FILE (a Kernel Tuner cache file, .json or .json.gz)")
        if cfg.get("space"):
            raise ConfigError("bench=replay takes its space from the file's tune_params; drop space=[...]")
        given = [k for k in ("op", "shape") if k in cfg and not OmegaConf.is_missing(cfg, k)]
        if cfg.get("problems") or given:
            what = "problems=" if cfg.get("problems") else "+op=" if given[0] == "op" else "shape="
            raise ConfigError(f"bench=replay replays the one problem of bench.path's file (its kernel_name and "
                              f"problem_size): drop {what}")
        if cfg.bench.get("device_name") is not None and not str(cfg.bench.device_name).strip():
            raise ConfigError(f"bench.device_name={cfg.bench.device_name!r}: a device's name, not empty")
    elif cfg.bench.get("device_name") is not None:
        raise ConfigError(f"bench.device_name={cfg.bench.device_name!r} names a replayed file's device; "
                          "it needs bench=replay")
    elif not cfg.get("problems"):
        if OmegaConf.is_missing(cfg, "op"):
            raise ConfigError("no op given; use +op=<name> with a file from conf/op/ (mm, addmm, bmm, linear_act)")
        if OmegaConf.is_missing(cfg, "shape"):
            raise ConfigError(f"no shape given; use shape=[{','.join(cfg.op.dims)}]")
        shape = cfg.shape
        if isinstance(shape, ListConfig):
            shape = OmegaConf.to_container(shape, resolve=True)
        check_problem(cfg.op.name, shape, cfg.dtype, cfg.op.activation, weight_layout=cfg.weight_layout)
        if cfg.op.name != "linear_act" and cfg.op.get("activation") is not None:  # it was dropped without a word
            raise ConfigError(f"op.activation={cfg.op.activation!r} for op {cfg.op.name}: only linear_act takes an "
                              "activation (+op=linear_act op.activation=relu|gelu)")
        check_device_spec(cfg.device)
    else:
        check_file(cfg.problems, "problems")
        given = [o for o in _command_line_overrides() if o.lstrip("+~").split("=", 1)[0] in ("dtype", "weight_layout")]
        if given:
            raise ConfigError(f"override {given[0]}: problems= takes each problem's dtype and weight_layout from "
                              f"the file ({cfg.problems}); drop it")
        if cfg.search.get("study_name"):
            raise ConfigError(f"search.study_name={cfg.search.study_name!r} names one study; problems= tunes one "
                              "study per problem: drop search.study_name")
    _check_study_name(cfg.search.get("study_name"))
    _check_cpu_space(cfg)
    check_url(cfg.storage.url)
    _check_export_path_is_not_the_database(cfg)


def _check_cpu_space(cfg: Any) -> None:
    """``device=cpu`` with ``space=[...]``: a template or backend-flag branch applies on CUDA only
    (zhantune.runspec checks the same once ``device=auto`` is resolved, with torch imported)."""
    from zhantune.errors import SpaceError

    if str(cfg.get("device")) != "cpu" or not cfg.get("space"):
        return
    for name, content in OmegaConf.to_container(cfg.space, resolve=False).items():
        branches = content.get("branches") if isinstance(content, dict) else None
        for bname, b in (branches if isinstance(branches, dict) else {}).items():
            scope = b.get("scope", "config") if isinstance(b, dict) else None
            if scope == "template":
                raise SpaceError(f"space {name}: branches.{bname}: template branches ({b.get('template_id')}) apply "
                                 "on CUDA only; on CPU use config branches (conf/space/cpp_gemm.yaml)")
            if scope == "backend":
                raise SpaceError(f"space {name}: branches.{bname}: backend-flag branches (tf32) apply on CUDA only")


def _check_study_name(name: Any) -> None:
    """search.study_name fits zt_study.name (512 characters) and is text the database and a terminal
    hold (zhantune.bench.recorded_checks.printable_name)."""
    from zhantune.bench.recorded_checks import MAX_KEY, printable_name, shown_name

    if name is None:
        return
    name = str(name)
    if not name.strip() or len(name) > MAX_KEY or not printable_name(name):
        raise ConfigError(f"search.study_name={shown_name(name)} ({len(name)} characters): a study's name is 1 to {MAX_KEY} "
                          "characters without control, format or surrogate characters")


def _check_export_path_is_not_the_database(cfg: Any) -> None:
    """export.path must not name the SQLite database of storage.url (nor its -wal, -shm or -journal
    file), which may not exist yet: the export at the end of the tune would replace it."""
    from pathlib import Path

    from zhantune.paths import SQLITE_SIDE_FILES
    from zhantune.redact import hide_password
    from zhantune.storage import sqlite_path

    db = sqlite_path(cfg.storage.url)
    if db is None or not cfg.export.enabled or not cfg.export.path:
        return
    out = Path(cfg.export.path).resolve()
    if out in {Path(f"{db}{suffix}").resolve() for suffix in ("", *SQLITE_SIDE_FILES)}:
        raise ConfigError(f"export.path={cfg.export.path} is the database of storage.url={hide_password(cfg.storage.url)} "
                          "(or its -wal, -shm or -journal file); "
                          "the table would replace it: give another file name")


def check_search(cfg: Any) -> None:
    """The search, benchmark and export options of a tune (ranges, the table's output path)."""
    from zhantune.inductor.exporter import check_export_options

    check_export_options(cfg.export, "export.", {"problems": cfg.get("problems"),
                                                 "bench.path": cfg.bench.get("path")})
    s = cfg.search
    if s.n_trials < 1:
        raise ConfigError(f"search.n_trials={s.n_trials} must be at least 1")
    more = s.get("more_trials")
    if more is not None and more < 1:
        raise ConfigError(f"search.more_trials={more} must be at least 1 (or null: up to search.n_trials)")
    if s.get("max_seeds") is not None and s.max_seeds < 0:
        raise ConfigError(f"search.max_seeds={s.max_seeds} must be 0 (no seeds) or a positive count of "
                          "Inductor's own configs to measure first")
    if not 0 <= s.seed < 2**32:
        raise ConfigError(f"search.seed={s.seed} must be in [0, {2**32 - 1}] (the samplers' random seed)")
    if s.timeout_s is not None and not 0 < s.timeout_s <= 31_536_000:  # NaN too: a comparison with it is false
        raise ConfigError(f"search.timeout_s={s.timeout_s} must be positive and at most 31536000 (a year), "
                          "or null for no limit")
    if s.get("transfer", "auto") not in TRANSFER_MODES:
        raise ConfigError(f"search.transfer={s.transfer!r}; allowed: {', '.join(TRANSFER_MODES)}")
    beat, grace = cfg.storage.get("heartbeat_interval_s"), cfg.storage.get("grace_period_s")
    if beat is not None and not 1 <= beat <= 86_400:
        raise ConfigError(f"storage.heartbeat_interval_s={beat} must be 1 to 86400 (whole seconds; null: off)")
    if grace is not None and grace > 604_800:
        raise ConfigError(f"storage.grace_period_s={grace} must be at most 604800 (a week)")
    if beat is not None and (grace is None or grace <= beat):
        raise ConfigError(f"storage.grace_period_s={grace} must be more than storage.heartbeat_interval_s={beat} "
                          "(else a live worker's trial would be taken for a dead one's)")
    workers = cfg.bench.get("compile_workers")
    if workers is not None and workers < 0:
        raise ConfigError(f"bench.compile_workers={workers} must be 0 (off), a positive count, or null "
                          "(sized for the machine)")
    check_bench(cfg.bench)


#: the largest size of a tensor dimension (torch's sizes are int64)
MAX_SIZE = 2**63 - 1


def check_problem(op: str, shape: object, dtype: str, activation: str | None = None, source: str = "shape",
                  weight_layout: str = "kn") -> tuple[tuple[int, ...], str | None]:
    """Validate a problem as given by the user; returns (sizes, the activation that applies).
    Raises ConfigError for an unknown op or dtype, a wrong arity or a non-positive size."""
    if op not in OPS:
        raise ConfigError(f"unknown op {op!r} (from +op); allowed: {', '.join(sorted(OPS))}")
    if weight_layout not in WEIGHT_LAYOUTS or (op == "bmm" and weight_layout != "kn"):
        allowed = "kn" if op == "bmm" else " | ".join(WEIGHT_LAYOUTS)
        raise ConfigError(f"weight_layout={weight_layout!r} for op {op}; allowed: {allowed}")
    dims = OPS[op]
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {dtype!r} (from dtype); allowed: {', '.join(DTYPE_NAMES)}")
    if not isinstance(shape, (list, tuple)) or len(shape) != len(dims):
        raise ConfigError(
            f"{source}={_show(shape)} does not fit op {op}: expected {len(dims)} positive integers "
            f"[{','.join(dims)}]"
        )
    sizes = []
    for name, v in zip(dims, shape, strict=True):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(
                f"{source}={_show(shape)}: {name}={v!r} is not an integer; expected [{','.join(dims)}] "
                "of positive integers"
            )
        if v <= 0:
            raise ConfigError(f"{source}={_show(shape)}: {name}={v} must be a positive integer")
        if v > MAX_SIZE:  # a helper's 400-digit size overflowed a float in the memory check: a traceback
            raise ConfigError(f"{source}={_show(shape)}: {name} is {len(str(v))} digits; a tensor's size is at most "
                              f"{MAX_SIZE} (int64)")
        sizes.append(v)
    if op == "linear_act":
        if activation not in ACTIVATIONS:
            raise ConfigError(f"op linear_act needs op.activation in {list(ACTIVATIONS)}, got {activation!r}")
    else:
        activation = None
    return tuple(sizes), activation


def check_device_spec(spec: object) -> str:
    """``auto | cpu | cuda | cuda:N`` (lower-cased); raises DeviceError for anything else. Whether
    this machine has that device is zhantune.device.resolve_device's question."""
    text = str(spec).strip().lower()
    if not _DEVICE_SPEC.fullmatch(text):
        raise DeviceError(f"unknown device {text!r} (from device); allowed: auto, cpu, cuda, cuda:N")
    return text


def check_model_request(cfg: Any) -> None:
    """The checks of a collect or check config that need no torch (zhantune.models.from_config makes
    them again and builds the model): a model given, the dtype, the device's spelling, the shapes of
    the inputs and the factory's keyword arguments."""
    if not cfg.model:
        raise ConfigError("no model given; use model=module:factory (e.g. zhantune.models:mlp)")
    check_device_spec(cfg.device)
    if cfg.dtype is not None and cfg.dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype={cfg.dtype!r}; allowed: {', '.join(DTYPE_NAMES)}")
    shapes = OmegaConf.to_container(cfg.input_shapes, resolve=True) if isinstance(cfg.input_shapes, ListConfig) else cfg.input_shapes
    if not isinstance(shapes, list) or not shapes or not all(isinstance(s, list) for s in shapes):
        raise ConfigError(f"input_shapes={shapes}: expected a list of shapes, e.g. [[64,256]]")
    kwargs = cfg.model_kwargs
    if kwargs and not OmegaConf.is_dict(kwargs) and not isinstance(kwargs, dict):
        raise ConfigError(f"model_kwargs={kwargs}: expected a mapping, e.g. model_kwargs={{d_model:64}}")


def _command_line_overrides() -> list[str]:
    """The task's overrides as given on the command line ([] outside a Hydra app: the compose API)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def check_file(path: object, option: str) -> None:
    """An input file must exist and be a regular file (or a link to one): ``problems=x.yaml: no
    such file``, ``problems=adir: is a directory``, ``problems=fifo: not a regular file`` (a FIFO
    would block its reader forever); what else is wrong with it, its reader says."""
    from pathlib import Path

    p = Path(str(path))
    if not p.exists():
        raise ConfigError(f"{option}={path}: " + ("a symbolic link to nothing (or a loop of links)" if p.is_symlink()
                                                  else "no such file"))
    if p.is_dir():
        raise ConfigError(f"{option}={path}: is a directory; give a file")
    if not p.is_file():
        raise ConfigError(f"{option}={path}: not a regular file (a FIFO, socket or device): give a file")


def _show(shape: object) -> str:
    if isinstance(shape, (list, tuple)):
        return "[" + ",".join(str(v) for v in shape) + "]"
    return repr(shape)
