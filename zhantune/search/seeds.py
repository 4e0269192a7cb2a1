"""Seeds: what Inductor itself would try, proposed before the sampler's own picks.

A new study starts from points Inductor's own heuristics would compile (the ATen kernel, each config
branch at Inductor's defaults, its Triton configs and decomposeK splits for this size), so that a
search never does worse than Inductor's own autotuning on the same budget.
"""

from __future__ import annotations

from typing import Any

import optuna

from zhantune.search.schema import Branch, Space

__all__ = ["inductor_seeds", "enqueue_seeds"]


def inductor_seeds(space: Space, problem: Any, problem_vars: dict[str, Any],
                   seed_inductor: bool = True) -> list[tuple[Branch, dict[str, Any]]]:
    """What Inductor itself would try, as (branch, param name -> value) points of ``space``: every
    fixed-only branch (aten), each config branch at Inductor's current defaults, and with
    ``seed_inductor`` the Triton configs of Inductor's own heuristic for this size and its decomposeK
    splits. Only points that are feasible members of the space; none for a problem that is not a
    GEMM (a replayed file's)."""
    from zhantune.problems import GemmProblem

    if not isinstance(problem, GemmProblem):
        return []  # before Inductor's import (2.3 s): a replay never needs it
    from torch._inductor import config as inductor_config

    from zhantune.inductor.heuristics import decompose_k_splits, triton_mm_configs
    dims = problem.dims
    seeds: list[tuple[Branch, dict[str, Any]]] = []
    heuristic: list[dict[str, Any]] | None = None

    def add(b: Branch, values: dict[str, Any]) -> None:
        tuned = [p for p in b.params if p.distribution is not None]
        if all(p.name in values and values[p.name] in p.values() for p in tuned) \
                and b.feasible(values, problem_vars) and (b, values) not in seeds:
            seeds.append((b, values))

    for b in space.branches:
        tuned = [p for p in b.params if p.distribution is not None]
        if not tuned:
            add(b, {})
        elif b.scope == "config":
            defaults = inductor_config.get_config_copy()
            add(b, {p.name: defaults.get(p.key) for p in tuned})
        elif b.scope == "template" and b.template_id in ("triton::mm", "triton::bmm") and seed_inductor:
            if heuristic is None:
                heuristic = triton_mm_configs(dims["M"], dims["N"], dims["K"], problem.dtype_bytes)
            for c in heuristic:
                add(b, {p.name: c.get(p.key) for p in tuned})
        elif b.template_id == "decompose_k" and seed_inductor:
            for k_split in decompose_k_splits(dims["M"], dims["N"], dims["K"]):
                add(b, {p.name: k_split for p in tuned if p.key == "k_split"})
    return seeds


def enqueue_seeds(study: optuna.Study, space: Space, seeds: list[tuple[Branch, dict[str, Any]]],
                  seed_inductor: bool, max_seeds: int) -> None:
    """Before sampling (a new study only), enqueue ``seeds`` (:func:`inductor_seeds`): the
    fixed-only branches first, then, with ``seed_inductor``, the rest up to ``max_seeds`` in all."""
    if study.trials:
        return
    if not seed_inductor:
        seeds = [(b, v) for b, v in seeds if not v]
    fixed = [(b, v) for b, v in seeds if not v]
    rest = [(b, v) for b, v in seeds if v][: max(0, max_seeds - len(fixed))]
    for b, values in fixed + rest:
        study.enqueue_trial(space.trial_params(b, values), skip_if_exists=True)
