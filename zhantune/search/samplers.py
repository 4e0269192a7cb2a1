"""Optuna samplers by config: ``_target_`` instantiation limited to an allowlist.

A ``_target_`` must name, under one of :data:`ALLOWED_TARGET_PREFIXES`, a class that is an Optuna
sampler or pruner defined in Optuna or zhantune. The path is resolved the way Hydra resolves it
(``hydra._internal.utils._locate``) before anything is instantiated: a prefix alone is not enough, as
``zhantune.scratch.shutil.copyfile`` is ``shutil.copyfile`` to Hydra.
"""

from __future__ import annotations

import inspect
from typing import Any

import optuna
from hydra._internal.utils import _locate
from hydra.utils import instantiate

from zhantune.errors import ConfigError, first_line, shown

__all__ = ["ALLOWED_TARGET_PREFIXES", "instantiate_allowed", "make_sampler"]

#: the only modules a config's ``_target_`` may name
ALLOWED_TARGET_PREFIXES = ("optuna.samplers.", "optuna.pruners.", "zhantune.")
#: what it must resolve to: a class of these, defined in one of these packages
_ALLOWED_BASES = (optuna.samplers.BaseSampler, optuna.pruners.BasePruner)
_ALLOWED_PACKAGES = ("optuna.", "zhantune.")


def _check_target(target: Any, where: str) -> None:
    """Raise ConfigError unless ``target`` names an Optuna sampler or pruner class of Optuna or
    zhantune under an allowed prefix (resolved as Hydra resolves it, nothing instantiated)."""
    allowed = (f"allowed: an Optuna sampler or pruner class under {', '.join(ALLOWED_TARGET_PREFIXES)} "
               "(e.g. optuna.samplers.TPESampler, zhantune.search.FeasibleTPESampler)")
    if not (isinstance(target, str) and target.startswith(ALLOWED_TARGET_PREFIXES)):
        raise ConfigError(f"{where}._target_={target!r} is not allowed; {allowed}")
    try:
        obj = _locate(target)
    except Exception:  # ImportError or Hydra's own: the path names nothing
        raise ConfigError(f"{where}._target_={target!r} names nothing that can be imported; {allowed}") from None
    if not (inspect.isclass(obj) and issubclass(obj, _ALLOWED_BASES)
            and obj.__module__.startswith(_ALLOWED_PACKAGES)):
        raise ConfigError(f"{where}._target_={target!r} is not allowed: it is "
                          f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}; "
                          f"{allowed}")


def _check_targets(node: Any, where: str) -> None:
    """Every nested ``_target_`` allowed, and no string holding ``${``: the spec arrives resolved,
    so one is left only by an escaped ``\\${...}``, which instantiate resolves again (an
    ``oc.create`` there builds a node whose ``_target_`` no check saw: arbitrary code, found in a
    review)."""
    if isinstance(node, str) and "${" in node:
        raise ConfigError(f"{where}={shown(node)}: an interpolation is not allowed in a value that is "
                          "instantiated (it would be resolved again, after the _target_ allowlist's check)")
    if isinstance(node, dict):
        if "_target_" in node:
            _check_target(node["_target_"], where)
        for k, v in node.items():
            _check_targets(k, f"{where} key")
            _check_targets(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_targets(v, f"{where}[{i}]")


def _check_arguments(node: Any, where: str) -> None:
    """Every argument of every nested ``_target_`` of the type its constructor's signature declares,
    where that is a plain one (``int``, ``float``, ``bool``, ``str``, ``None`` or a union of them, as
    written in the signature; anything else is not judged): Optuna's samplers keep what they are
    given and fail only at the first ask, e.g. TPESampler's ``n_startup_trials='abc'`` as ``'<' not
    supported`` after a finished study had been resumed and marked running (a helper's finding)."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            _check_arguments(v, f"{where}[{i}]")
    if not isinstance(node, dict):
        return
    try:
        params = inspect.signature(_locate(node["_target_"]).__init__).parameters if "_target_" in node else {}
    except Exception:  # no signature to read: not judged
        params = {}
    for key, value in node.items():
        _check_arguments(value, f"{where}.{key}")
        plain = _plain_types(params[key].annotation) if key in params else None
        if plain is not None and not any(_is(value, t) for t in plain):
            names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null"}
            raise ConfigError(f"{where}.{key}={shown(value)} is not {' or '.join(names[t] for t in plain)} (what "
                              f"{node['_target_']}'s constructor takes for {key})")


_PLAIN = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}


def _plain_types(annotation: Any) -> tuple[type, ...] | None:
    """An annotation as written (``'int | None'``, or the type itself) as its plain types; None for
    anything else (a Callable, a class, a generic). Read from the text, never evaluated."""
    if isinstance(annotation, type) and annotation in _PLAIN.values():
        return (annotation,)
    if not isinstance(annotation, str):
        return None
    parts = [_PLAIN.get(t.strip()) for t in annotation.split("|")]
    return None if None in parts else tuple(parts)


def _is(value: Any, t: type) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, t) and (t is bool or not isinstance(value, bool))


def instantiate_allowed(spec: dict[str, Any], where: str) -> Any:
    """hydra.utils.instantiate after checking every nested ``_target_`` against the allowlist and
    its plain-typed arguments against its constructor's signature."""
    _check_targets(spec, where)
    _check_arguments(spec, where)
    try:
        return instantiate(spec)
    except Exception as e:
        root = e  # Hydra wraps the target's own error (e.g. FeasibleTPESampler's ValueError naming the value)
        while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
            root = root.__cause__ or root.__context__
        raise ConfigError(f"{where}: cannot instantiate {spec.get('_target_')!r}: {first_line(root)}") from None


def make_sampler(spec: dict[str, Any]) -> optuna.samplers.BaseSampler:
    """The sampler from ``search.sampler``; raises ConfigError when it is not an Optuna sampler."""
    sampler = instantiate_allowed(spec, "search.sampler")
    if not isinstance(sampler, optuna.samplers.BaseSampler):
        raise ConfigError(f"search.sampler._target_={spec.get('_target_')!r} is not an Optuna sampler")
    return sampler
