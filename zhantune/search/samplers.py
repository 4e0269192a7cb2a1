"""Optuna samplers by config: ``_target_`` instantiation limited to an allowlist."""

from __future__ import annotations

from typing import Any

import optuna
from hydra.utils import instantiate

from zhantune.errors import ConfigError

__all__ = ["ALLOWED_TARGET_PREFIXES", "instantiate_allowed", "make_sampler"]

#: the only modules a config's ``_target_`` may name
ALLOWED_TARGET_PREFIXES = ("optuna.samplers.", "optuna.pruners.", "zhantune.")


def _check_targets(node: Any, where: str) -> None:
    if isinstance(node, dict):
        target = node.get("_target_")
        if target is not None and not (isinstance(target, str) and target.startswith(ALLOWED_TARGET_PREFIXES)):
            raise ConfigError(f"{where}._target_={target!r} is not allowed; allowed prefixes: "
                              f"{', '.join(ALLOWED_TARGET_PREFIXES)}")
        for k, v in node.items():
            _check_targets(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_targets(v, f"{where}[{i}]")


def instantiate_allowed(spec: dict[str, Any], where: str) -> Any:
    """hydra.utils.instantiate after checking every nested ``_target_`` against the allowlist."""
    _check_targets(spec, where)
    try:
        return instantiate(spec)
    except Exception as e:
        root = e  # Hydra wraps the target's own error (e.g. FeasibleTPESampler's ValueError naming the value)
        while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
            root = root.__cause__ or root.__context__
        text = str(root).strip().splitlines()[0] if str(root).strip() else type(root).__name__
        raise ConfigError(f"{where}: cannot instantiate {spec.get('_target_')!r}: {text}") from None


def make_sampler(spec: dict[str, Any]) -> optuna.samplers.BaseSampler:
    """The sampler from ``search.sampler``; raises ConfigError when it is not an Optuna sampler."""
    sampler = instantiate_allowed(spec, "search.sampler")
    if not isinstance(sampler, optuna.samplers.BaseSampler):
        raise ConfigError(f"search.sampler._target_={spec.get('_target_')!r} is not an Optuna sampler")
    return sampler
