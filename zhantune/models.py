"""Example models built in code (no downloads), for the ship-a-table workflow, and model loading.

``python -m zhantune.collect model=zhantune.models:mlp input_shapes=[[64,256]]`` names a factory as
``module:function``; the factory takes keyword arguments (``model_kwargs``) and returns an
``nn.Module``. Loading a model imports the user's own module, like ``python -m`` does; tables, by
contrast, are data and never run code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from zhantune.errors import ConfigError, first_line, shown

__all__ = ["mlp", "transformer_block", "load_factory", "build_model", "example_inputs", "ModelRequest", "from_config", "raised_at"]


def mlp(d_model: int = 256, hidden: int = 1024, layers: int = 2) -> nn.Module:
    """An MLP: ``layers`` x (Linear(d_model, hidden), GELU, Linear(hidden, d_model)), residual.

    Input [tokens, d_model]; every Linear is an addmm GEMM for Inductor.
    """
    return _Residual(nn.ModuleList(_FeedForward(d_model, hidden) for _ in range(layers)))


def transformer_block(d_model: int = 256, heads: int = 4, hidden: int = 1024) -> nn.Module:
    """A pre-norm transformer block: attention (q, k, v, output projections; SDPA in between) and MLP.

    Input [batch, seq, d_model]. The four projections and the two MLP layers are GEMMs; attention
    itself goes to ``scaled_dot_product_attention`` (not a GEMM lowering).
    """
    return _Block(d_model, heads, hidden)


class _FeedForward(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class _Residual(nn.Module):
    def __init__(self, blocks: nn.ModuleList):
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


class _Block(nn.Module):
    def __init__(self, d_model: int, heads: int, hidden: int):
        super().__init__()
        if d_model % heads:
            raise ConfigError(f"transformer_block: d_model={d_model} is not a multiple of heads={heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = _FeedForward(d_model, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x).reshape(b * s, d)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        att = nn.functional.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)))
        x = x + self.o(att.transpose(1, 2).reshape(b * s, d)).reshape(b, s, d)
        return x + self.ff(self.norm2(x).reshape(b * s, d)).reshape(b, s, d)


def load_factory(spec: str, source: str = "model") -> Callable[..., nn.Module]:
    """Resolve ``module:function``; raises ConfigError naming the value when it does not resolve.

    ``model=`` is trusted input, like ``python -m``: importing the module runs its code. Before
    anything is called, the factory must be an ``nn.Module`` subclass or a function written in
    Python (``def``/``lambda``/``functools.partial`` of one) whose return annotation, when it has
    one, is not some other type; a builtin such as ``os:system`` or a non-Module class is refused.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{source}={spec!r}: expected module:factory, e.g. zhantune.models:mlp")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{source}={spec!r}: cannot import {module_name!r}: {e}") from None
    except Exception as e:  # the module's own code failed (a SyntaxError, a RuntimeError at import)
        raise ConfigError(f"{source}={spec!r}: importing {module_name!r} raised {type(e).__name__}: "
                          f"{first_line(e)}{raised_at(e)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"{source}={spec!r}: {module_name} has no callable {attr!r}")
    why = _not_a_model_factory(factory)
    if why:
        raise ConfigError(f"{source}={spec!r}: {why}; expected a function returning a torch.nn.Module "
                          "or an nn.Module subclass")
    return factory


def _not_a_model_factory(factory: Any) -> str | None:
    """Why ``factory`` cannot be a model factory (checked without calling it), or None."""
    import functools
    import inspect

    if inspect.isclass(factory):
        return None if issubclass(factory, nn.Module) else f"{factory.__name__} is a class but not an nn.Module"
    fn = factory.func if isinstance(factory, functools.partial) else factory
    if not inspect.isfunction(fn):
        return f"{type(fn).__name__} {getattr(fn, '__name__', fn)!r} is not a Python function"
    try:
        ret = inspect.signature(fn, eval_str=True).return_annotation
    except Exception:  # an annotation that does not resolve: nothing to learn from it
        return None
    if ret is inspect.Signature.empty or (inspect.isclass(ret) and issubclass(ret, nn.Module)):
        return None
    return f"{fn.__name__} is annotated to return {getattr(ret, '__name__', ret)}, not an nn.Module"


def build_model(spec: str, kwargs: dict | None = None, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
    """The factory's module in eval mode, in ``dtype`` on ``device``, weights seeded by ``seed``."""
    return _built(spec, kwargs, dtype, device, seed)[0]


def _built(spec: str, kwargs: dict | None, dtype: torch.dtype, device: torch.device | str,
           seed: int = 0) -> tuple[nn.Module, set[torch.dtype]]:
    """:func:`build_model`'s module, and the floating dtypes of its parameters and buffers as the
    factory made them, before the cast to ``dtype``."""
    factory = load_factory(spec)
    torch.manual_seed(seed)
    try:
        model = factory(**(kwargs or {}))
    except TypeError as e:
        raise ConfigError(f"model={spec!r} with model_kwargs={kwargs}: {e}") from None
    except (MemoryError, RuntimeError) as e:  # model_kwargs={d_model: 10000000000}: was a traceback
        if not _out_of_memory(e):  # {d_model: -4}: torch's RuntimeError for a negative size, the factory's answer
            raise ConfigError(f"model={spec!r} with model_kwargs={kwargs}: the factory raised "
                              f"{type(e).__name__}: {first_line(e)}{raised_at(e)}") from None
        raise ConfigError(f"model={spec!r} with model_kwargs={kwargs}: its weights do not fit in memory") from None
    except (ValueError, AssertionError, KeyError, IndexError, ZeroDivisionError) as e:  # the factory refuses its kwargs
        raise ConfigError(f"model={spec!r} with model_kwargs={kwargs}: the factory raised "
                          f"{type(e).__name__}: {first_line(e)}{raised_at(e)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model={spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    made = {t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()}
    try:
        return model.to(device=device, dtype=dtype).eval(), made
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError copying to a GPU: was a traceback
        if not _out_of_memory(e):
            raise
        raise ConfigError(f"model={spec!r} with model_kwargs={kwargs}: its weights do not fit in the memory of "
                          f"{device} in {dtype} ({first_line(e, 200)})") from None


def raised_at(e: BaseException) -> str:
    """Where the user's code raised ``e``, for a one-line error: " (at FILE:LINE in FUNCTION)" of the
    innermost frame outside torch and Python's own library (the frame that raised it when every
    frame is), FILE relative to the current directory when under it; "" without a traceback, and for a
    SyntaxError (its message names the file and line)."""
    import os
    import sysconfig
    import traceback

    if isinstance(e, SyntaxError):  # its message names the file and line; its frames are the importer's
        return ""
    # the first frame is the one that caught it (zhantune's build_model, load_factory, ModelRequest)
    frames = traceback.extract_tb(e.__traceback__)[1:] if e.__traceback__ is not None else []
    library = tuple(os.path.realpath(p) + os.sep for p in {os.path.dirname(torch.__file__),
                                                           sysconfig.get_path("stdlib"), sysconfig.get_path("purelib")})
    users = [f for f in frames if not (f.filename.startswith("<") or os.path.realpath(f.filename).startswith(library))] \
        or frames
    if not users:
        return ""
    where = users[-1]
    path = os.path.relpath(where.filename) if os.path.realpath(where.filename).startswith(os.getcwd() + os.sep) \
        else where.filename
    return f" (at {path}:{where.lineno} in {where.name})"


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: a MemoryError, torch.OutOfMemoryError (a
    RuntimeError: "CUDA out of memory. Tried to allocate ..."), or the CPU allocator's RuntimeError
    ("DefaultCPUAllocator: can't allocate memory")."""
    return isinstance(e, MemoryError) or "out of memory" in str(e) or "allocate" in str(e)


def example_inputs(shapes: list[list[int]], dtype: torch.dtype, device: torch.device | str = "cpu",
                   seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of the given shapes, N(0, 1) values, deterministic for a seed."""
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for i, shape in enumerate(shapes):
        if not shape or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
            raise ConfigError(f"input_shapes[{i}]={shape}: expected a list of positive integers")
        out.append(torch.randn(*shape, generator=g).to(device=device, dtype=dtype))
    return tuple(out)


def _check_inputs_fit(shapes: list[list[int]], dtype: torch.dtype, device: Any) -> None:
    """Refuse inputs that cannot fit in the device's memory before any is drawn (float32 draws, then
    ``dtype``): input_shapes=[[10000000,10000000]] asked the allocator for 400 TB, a traceback, and
    a shape that just fits could push the machine out of memory (a review's finding)."""
    import math

    from zhantune.runspec import device_memory_bytes

    have = device_memory_bytes(device)
    n = sum(math.prod(s) for s in shapes if isinstance(s, list) and s and all(type(v) is int and v > 0 for v in s))
    # the draw is float32 on the host; .to() copies it to the device, or on CPU to another dtype
    copy = dtype.itemsize if device.kind == "cuda" or dtype != torch.float32 else 0
    need = n * copy if device.kind == "cuda" else n * (4 + copy)
    if have is not None and need > have // 2:
        raise ConfigError(f"input_shapes={shown(shapes)}: the inputs need {need / 2**30:,.1f} GiB; {device.name} "
                          f"has {have / 2**30:,.1f} GiB (at most half of it is used for inputs)")


class ModelRequest:
    """A model and its example inputs as the collect and check apps are asked for them."""

    def __init__(self, spec: str, kwargs: dict, shapes: list[list[int]], dtype: str, device, defaulted: bool = False):
        from zhantune.problems import DTYPES

        self.spec, self.kwargs, self.shapes, self.dtype, self.device = spec, kwargs, shapes, dtype, device
        _check_inputs_fit(shapes, DTYPES[dtype], device)
        self.model, made = _built(spec, kwargs, DTYPES[dtype], device.torch_device)
        other = sorted(str(t).removeprefix("torch.") for t in made - {DTYPES[dtype]})
        #: where dtype was not given and the factory's weights were another dtype: the cast, said (a
        #: helper's: a bfloat16 model collected and checked as float32, with nothing saying so)
        self.cast_note = (f"note: the model's {' and '.join(other)} weights were cast to {dtype} (dtype= not given: "
                          f"{dtype} on a {device.kind} device; dtype=NAME casts the whole model to NAME)"
                          if defaulted and other else None)
        self.inputs = example_inputs(shapes, DTYPES[dtype], device.torch_device)
        try:  # one eager call: inputs the model cannot take are bad input, not a compile failure
            with torch.no_grad():
                self.model(*self.inputs)
        except Exception as e:  # a shape the model cannot take, or a bug in its forward: where it was raised
            raise ConfigError(f"input_shapes={shapes}: model={spec!r} failed on inputs of these shapes "
                              f"({type(e).__name__}: {first_line(e, 200)}{raised_at(e)})") from None


def from_config(cfg) -> ModelRequest:
    """Validate ``model``, ``model_kwargs``, ``input_shapes``, ``dtype`` and ``device`` of a collect or
    check config and build the model; raises ConfigError (exit code 2) naming the bad value.
    dtype defaults to float32 on CPU and bfloat16 on CUDA."""
    from omegaconf import OmegaConf

    from zhantune.device import resolve_device
    from zhantune.problems import DTYPES

    if not cfg.model:
        raise ConfigError("no model given; use model=module:factory (e.g. zhantune.models:mlp)")
    device = resolve_device(cfg.device)
    dtype = cfg.dtype or ("float32" if device.kind == "cpu" else "bfloat16")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    shapes = OmegaConf.to_container(cfg.input_shapes, resolve=True) if cfg.input_shapes is not None else None
    if not isinstance(shapes, list) or not shapes or not all(isinstance(s, list) for s in shapes):
        raise ConfigError(f"input_shapes={shapes}: expected a list of shapes, e.g. [[64,256]]")
    kwargs = OmegaConf.to_container(cfg.model_kwargs, resolve=True) if cfg.model_kwargs else {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"model_kwargs={kwargs}: expected a mapping, e.g. model_kwargs={{d_model:64}}")
    return ModelRequest(cfg.model, kwargs, shapes, dtype, device, defaulted=not cfg.dtype)
