"""The feasible set of a space: every (branch, values) point whose constraints hold, encoded.

Enumerating is cheap for the spaces zhantune ships (a few thousand points; Kernel Tuner spaces up to
a few hundred thousand before constraints), and it lets a sampler propose only feasible, unseen
points and measure distances between points (Hamming distance over parameter indices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zhantune.search.schema import Branch, Space

__all__ = ["FeasibleSet", "enumerate_feasible", "DEFAULT_ENUMERATION_LIMIT"]

#: largest Cartesian product (summed over branches) that is enumerated
DEFAULT_ENUMERATION_LIMIT = 500_000


@dataclass
class FeasibleSet:
    """Feasible points of a space and their integer codes.

    ``codes`` has shape (n_points, n_dims): dim 0 is the branch index, then one dim per distinct
    ``branch.param`` name holding the value's index in that param's values (-1 where the branch does
    not have the param). ``index`` maps the Optuna params of a trial (as :meth:`Space.trial_params`
    writes them) to the point's row.
    """

    space: Space
    points: list[tuple[Branch, dict[str, Any]]]
    codes: np.ndarray
    sizes: np.ndarray  # number of values per dim (branch count for dim 0)
    index: dict[tuple, int]
    _hashes: dict[int, str] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.points)

    def key(self, trial_params: dict[str, Any]) -> tuple:
        """Canonical key of an Optuna params dict (order-independent)."""
        return tuple(sorted(trial_params.items(), key=lambda kv: kv[0]))

    def row_of(self, trial_params: dict[str, Any]) -> int | None:
        """The row of a trial's params, or None when the point is not feasible (or not in the space)."""
        return self.index.get(self.key(trial_params))

    def config_hash(self, row: int) -> str:
        """The config hash of the point's candidate (zhantune.candidate.Candidate.config_hash: the
        branch, its fixed values included, and the params), computed once per row."""
        if row not in self._hashes:
            branch, values = self.points[row]
            self._hashes[row] = branch.candidate(values).config_hash
        return self._hashes[row]

    def trial_params(self, row: int) -> dict[str, Any]:
        branch, values = self.points[row]
        return self.space.trial_params(branch, values)


def enumerate_feasible(space: Space, problem_vars: dict[str, Any],
                       limit: int = DEFAULT_ENUMERATION_LIMIT) -> FeasibleSet | None:
    """Enumerate the feasible points of ``space``; None when the product of values exceeds ``limit``."""
    total = 0
    for b in space.branches:
        size = 1
        for p in b.params:
            size *= len(p.values())
        total += size
    if total > limit:
        return None
    dims: list[tuple[str, str]] = []  # (branch name, param name) of each tuned param
    values_of: dict[tuple[str, str], list[Any]] = {}
    for b in space.branches:
        for p in b.params:
            if p.distribution is not None:
                dims.append((b.name, p.name))
                values_of[(b.name, p.name)] = p.values()
    dim_of = {d: i + 1 for i, d in enumerate(dims)}
    points: list[tuple[Branch, dict[str, Any]]] = []
    rows: list[list[int]] = []
    index: dict[tuple, int] = {}
    for bi, b in enumerate(space.branches):
        tuned = [p for p in b.params if p.distribution is not None]
        for values in b.all_values():
            values = {p.name: values[p.name] for p in tuned}
            if not b.feasible(values, problem_vars):
                continue
            code = [-1] * (len(dims) + 1)
            code[0] = bi
            for p in tuned:
                code[dim_of[(b.name, p.name)]] = values_of[(b.name, p.name)].index(values[p.name])
            index[tuple(sorted(space.trial_params(b, values).items(), key=lambda kv: kv[0]))] = len(points)
            points.append((b, values))
            rows.append(code)
    sizes = np.array([len(space.branches)] + [len(values_of[d]) for d in dims], dtype=np.int64)
    codes = np.array(rows, dtype=np.int32).reshape(len(rows), len(dims) + 1)
    return FeasibleSet(space, points, codes, sizes, index)
