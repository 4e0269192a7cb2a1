"""The Optuna side of a tune: the study in the shared storage, and the ask step over a Space."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import optuna

from zhantune.quiet import quiet_optuna
from zhantune.search.space import Branch, Candidate, Space

__all__ = ["Asked", "optuna_storage", "open_study", "ask", "feasible_size", "random_feasible_point", "INTERRUPTED_ATTR"]

#: user attribute of a trial whose measurement was interrupted (Ctrl-C, SIGTERM): not a result
INTERRUPTED_ATTR = "zhantune:interrupted"

quiet_optuna()


def optuna_storage(storage_url: str) -> optuna.storages.BaseStorage:
    """Optuna's RDB storage on ``storage_url``; on SQLite with zhantune's connection settings (WAL,
    busy timeout, synchronous=NORMAL) so several workers can share the file."""
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    from zhantune.storage.store import SQLITE_BUSY_TIMEOUT_MS, sqlite_pragmas

    if make_url(storage_url).get_backend_name() != "sqlite":
        return optuna.storages.RDBStorage(storage_url)
    storage = optuna.storages.RDBStorage(
        storage_url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}})
    event.listen(storage.engine, "connect", sqlite_pragmas)
    storage.engine.dispose()  # connections opened while Optuna created its tables lack the pragmas
    return storage


def open_study(name: str, storage_url: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create or resume the study ``name`` in ``storage_url`` (minimising median microseconds)."""
    return optuna.create_study(study_name=name, storage=optuna_storage(storage_url), sampler=sampler,
                               direction="minimize", load_if_exists=True)


@dataclass
class Asked:
    """One asked trial: its candidate, or None when the point violates a constraint."""

    trial: optuna.trial.Trial
    branch: Branch
    values: dict[str, Any]
    candidate: Candidate | None


def ask(study: optuna.Study, space: Space, problem_vars: dict[str, Any]) -> Asked:
    """Ask the sampler for a point; check the branch's constraints before anything compiles."""
    trial = study.ask()
    branch, values = space.suggest(trial)
    cand = branch.candidate(values) if branch.feasible(values, problem_vars) else None
    return Asked(trial, branch, values, cand)


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
