"""Search spaces: YAML branches of parameters with constraints, turned into Optuna distributions.

A space file (``conf/space/<name>.yaml``) holds ``branches``; a branch is one way to run the GEMM:

* ``scope: template`` -- an Inductor template choice (``template_id`` such as ``triton::mm``) whose
  params are the template kwargs (``BLOCK_M``, ``num_warps``, ...): exported as lookup-table entries.
* ``scope: config`` -- an Inductor config patch (dotted keys such as ``cpp.gemm_max_k_slices``).
* ``scope: backend`` -- PyTorch backend flags around Inductor's default choice (keys under
  ``torch.backends``, e.g. ``cuda.matmul.allow_tf32``).

A parameter is exactly one of::

    {choices: [a, b, c]}                 categorical (bools and null allowed)
    {low: 1, high: 8, step: 1}           integer range with step
    {low: 16, high: 256, pow2: true}     powers of two in [low, high]
    {low: 1, high: 4096, log: true}      log-scaled integer
    {value: 8}                           fixed

with an optional ``key`` (the Inductor config key or template kwarg it sets; default: its name).
Constraints are expressions over the params and the problem/device values (``M``, ``N``, ``K``,
``B``, ``op`` (the GEMM Inductor looks up: "mm", "addmm", "bmm"), ``dtype_bytes``, ``smem_bytes``,
``sm_count``, ``capability`` (a GPU's compute capability, "9.0"; "" elsewhere), ``cores``, ``n_threads``,
``decompose_k_offered``, ``triton_mm_offered``, ``tma_offered``, ``aten_offered``: zhantune.runspec.problem_variables), evaluated with
simpleeval (never ``eval``). Errors raise SpaceError naming the file and key path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig, ListConfig, OmegaConf
from simpleeval import EvalWithCompoundTypes, NameNotDefined

from zhantune.candidate import Candidate  # re-exported: the point a branch makes
from zhantune.errors import SpaceError

__all__ = [
    "Param",
    "Branch",
    "Space",
    "Candidate",
    "param_distribution",
    "load_space",
    "CONSTRAINT_FUNCTIONS",
]

_PARAM_KEYS = {"choices", "low", "high", "step", "pow2", "log", "value", "key"}
_BRANCH_KEYS = {"scope", "template_id", "fixed", "params", "constraints", "description"}
_SCOPES = ("template", "config", "backend")


def _factors_product(s: str | None) -> int:
    """Product of a comma-separated factor string such as "1,2,1" (Inductor's thread factors)."""
    if s is None:
        return 0
    return math.prod(int(p) for p in str(s).split(","))


def _pipelined_smem_bytes(block_m: int, block_n: int, block_k: int, num_stages: int, num_warps: int,
                          dtype_bytes: int, k: int, capability: str, template_id: str = "triton::mm") -> int:
    """Shared memory (bytes) Triton gives the pipelined A and B tiles of Inductor's Triton kernel
    ``template_id`` (mm, bmm, persistent TMA) for a GEMM of reduction size ``k`` with ``dtype_bytes``
    inputs on a GPU of compute ``capability`` ("9.0"; "" unknown):
    zhantune.inductor.cuda_entries.shared_memory_bytes, measured with Triton's compiler (``num_stages``
    buffers for Hopper's warpgroup MMA, else one fewer)."""
    from zhantune.inductor.cuda_entries import shared_memory_bytes

    cap = tuple(int(x) for x in capability.split(".")[:2]) if capability else None
    entry = {"template_id": template_id, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
             "num_stages": num_stages, "num_warps": num_warps}
    return shared_memory_bytes(entry, dtype_bytes, k, cap)


#: functions a constraint may call
CONSTRAINT_FUNCTIONS = {"min": min, "max": max, "abs": abs, "factors_product": _factors_product,
                        "pipelined_smem_bytes": _pipelined_smem_bytes}


@dataclass(frozen=True)
class Param:
    """One parameter: its Optuna distribution and the key it sets."""

    name: str
    key: str
    distribution: optuna.distributions.BaseDistribution | None  # None: fixed
    value: Any = None

    def values(self) -> list[Any]:
        """Every value this parameter can take (for sizes and grids)."""
        d = self.distribution
        if d is None:
            return [self.value]
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            return list(d.choices)
        assert isinstance(d, optuna.distributions.IntDistribution)
        return list(range(d.low, d.high + 1, d.step))


def param_distribution(name: str, spec: dict[str, Any], where: str) -> Param:
    """Turn one YAML parameter spec into a Param with its Optuna distribution.

    ``where`` names the file and key path for errors. Power-of-two ranges become a categorical over
    the powers (so TPE treats them as ordered choices). Raises SpaceError for an unknown key, empty
    choices, low > high, a non-integer bound, or a spec that is none or several of the kinds.
    """
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: expected a mapping such as {{choices: [...]}} or {{low: .., high: ..}}, got {spec!r}")
    unknown = set(spec) - _PARAM_KEYS
    if unknown:
        raise SpaceError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_PARAM_KEYS))}")
    key = str(spec.get("key", name))
    kinds = [k for k in ("choices", "low", "value") if k in spec]
    if len(kinds) != 1:
        raise SpaceError(f"{where}: give exactly one of choices, low/high, value (got {kinds or 'none'})")
    if "value" in spec:
        return Param(name, key, None, spec["value"])
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{where}.choices: must be a non-empty list, got {choices!r}")
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise SpaceError(f"{where}.choices: {c!r} is not a bool, number, string or null")
        return Param(name, key, optuna.distributions.CategoricalDistribution(tuple(choices)))
    if "high" not in spec:
        raise SpaceError(f"{where}: low without high")
    low, high, step = spec["low"], spec["high"], spec.get("step", 1)
    for label, v in (("low", low), ("high", high), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpaceError(f"{where}.{label}: must be an integer, got {v!r}")
    if low > high:
        raise SpaceError(f"{where}: low={low} > high={high}")
    if step < 1:
        raise SpaceError(f"{where}.step: must be >= 1, got {step}")
    if spec.get("pow2"):
        if low < 1:
            raise SpaceError(f"{where}.low: a pow2 range needs low >= 1, got {low}")
        powers = [1 << e for e in range(0, 63) if low <= (1 << e) <= high]
        if not powers:
            raise SpaceError(f"{where}: no power of two in [{low}, {high}]")
        return Param(name, key, optuna.distributions.CategoricalDistribution(tuple(powers)))
    if spec.get("log"):
        if low < 1:
            raise SpaceError(f"{where}.low: a log range needs low >= 1, got {low}")
        if step != 1:
            raise SpaceError(f"{where}: log and step cannot be combined")
        return Param(name, key, optuna.distributions.IntDistribution(low, high, log=True))
    return Param(name, key, optuna.distributions.IntDistribution(low, high, step=step))


@dataclass
class Branch:
    name: str
    scope: str
    template_id: str | None
    params: list[Param]
    fixed: dict[str, Any]
    constraints: list[str]
    source: str  # "file: branches.<name>"
    #: when set, the only feasible points: tuples of every param's value in ``params`` order
    #: (a replay file's measured configurations; absent ones are infeasible)
    members: frozenset[tuple] | None = None

    def candidate(self, values: dict[str, Any]) -> Candidate:
        """Build the candidate for param name -> value."""
        params = dict(self.fixed)
        for p in self.params:
            params[p.key] = values[p.name] if p.distribution is not None else p.value
        return Candidate(self.name, self.scope, self.template_id, params)

    def feasible(self, values: dict[str, Any], problem_vars: dict[str, Any]) -> bool:
        """True when every constraint holds for param values + problem/device variables."""
        point = {p.name: (values[p.name] if p.distribution is not None else p.value) for p in self.params}
        if self.members is not None and tuple(point.values()) not in self.members:
            return False
        if not self.constraints:
            return True
        names = {**problem_vars, **point}
        evaluator = EvalWithCompoundTypes(names=names, functions=CONSTRAINT_FUNCTIONS)
        for expr in self.constraints:
            try:
                ok = evaluator.eval(expr)
            except NameNotDefined as e:
                raise SpaceError(f"{self.source}.constraints: {expr!r} names unknown variable {e.name!r}") from None
            except Exception as e:  # simpleeval raises several types for bad expressions
                raise SpaceError(f"{self.source}.constraints: cannot evaluate {expr!r}: {e}") from None
            if not ok:
                return False
        return True

    def all_values(self) -> list[dict[str, Any]]:
        """Cartesian product of the params' values (for sizes and grids)."""
        combos: list[dict[str, Any]] = [{}]
        for p in self.params:
            combos = [{**c, p.name: v} for c in combos for v in p.values()]
        return combos


@dataclass
class Space:
    """Branches from one or more space files; a trial picks a branch, then its params."""

    branches: list[Branch]

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.branches]

    def branch(self, name: str) -> Branch:
        return next(b for b in self.branches if b.name == name)

    def suggest(self, trial: optuna.trial.BaseTrial) -> tuple[Branch, dict[str, Any]]:
        """Ask Optuna for a branch and its param values (define-by-run, params prefixed by branch)."""
        name = self.names[0] if len(self.branches) == 1 else trial.suggest_categorical("branch", self.names)
        b = self.branch(name)
        values: dict[str, Any] = {}
        for p in b.params:
            if p.distribution is not None:
                values[p.name] = _suggest(trial, f"{b.name}.{p.name}", p.distribution)
        return b, values

    def trial_params(self, branch: Branch, values: dict[str, Any]) -> dict[str, Any]:
        """Optuna param dict for enqueueing the candidate (inverse of :meth:`suggest`)."""
        out: dict[str, Any] = {} if len(self.branches) == 1 else {"branch": branch.name}
        out.update({f"{branch.name}.{k}": v for k, v in values.items()})
        return out


def _suggest(trial: optuna.trial.BaseTrial, name: str, d: optuna.distributions.BaseDistribution) -> Any:
    """The trial's value of one param; raises ValueError for an enqueued value outside ``d`` (a
    waiting trial of an earlier ``space=`` or of a merged study: Optuna refuses a categorical one and
    only warns about an integer out of range)."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    assert isinstance(d, optuna.distributions.IntDistribution)
    v = trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)  # an int (Optuna converts)
    if not d.low <= v <= d.high or (v - d.low) % d.step:
        raise ValueError(f"{name}={v!r} is outside [{d.low}, {d.high}] step {d.step}")
    return v


def _spec_to_container(node: Any) -> Any:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def load_branches(data: dict[str, Any], source: str, template_ids: set[str] | None = None,
                  op: str | None = None,
                  template_params: Callable[[str], frozenset[str] | None] | None = None) -> list[Branch]:
    """Parse the ``branches`` mapping of one space file; ``source`` is the file path for errors.

    ``{op}`` in a template_id is replaced by ``op`` (the lookup op: mm, addmm or bmm).
    ``template_params(template_id)`` gives the kwargs a template takes (None: unknown, not checked);
    a template branch setting anything else raises SpaceError.
    """
    data = _spec_to_container(data)
    if not isinstance(data, dict) or set(data) - {"branches", "description"}:
        extra = sorted(set(data) - {"branches", "description"}) if isinstance(data, dict) else data
        raise SpaceError(f"{source}: unknown top-level key {extra[0]!r}; allowed: branches, description"
                         if isinstance(data, dict) else f"{source}: expected a mapping with 'branches'")
    branches_data = data.get("branches")
    if not isinstance(branches_data, dict) or not branches_data:
        raise SpaceError(f"{source}: 'branches' must be a non-empty mapping of branch name -> branch")
    out = []
    for bname, b in branches_data.items():
        where = f"{source}: branches.{bname}"
        if not isinstance(b, dict):
            raise SpaceError(f"{where}: expected a mapping")
        unknown = set(b) - _BRANCH_KEYS
        if unknown:
            raise SpaceError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_BRANCH_KEYS))}")
        scope = b.get("scope", "config")
        if scope not in _SCOPES:
            raise SpaceError(f"{where}.scope: {scope!r} is not one of {', '.join(_SCOPES)}")
        template_id = b.get("template_id")
        if isinstance(template_id, str) and op is not None:
            template_id = template_id.replace("{op}", op)
        if scope == "template":
            if not template_id:
                raise SpaceError(f"{where}.template_id: a template branch needs a template_id")
            if template_ids is not None and template_id not in template_ids:
                raise SpaceError(f"{where}.template_id: unknown template_id {template_id!r}; allowed: "
                                 f"{', '.join(sorted(template_ids))}")
        params = [param_distribution(str(n), spec, f"{where}.params.{n}") for n, spec in (b.get("params") or {}).items()]
        fixed = b.get("fixed") or {}
        if not isinstance(fixed, dict):
            raise SpaceError(f"{where}.fixed: expected a mapping of key -> value")
        takes = template_params(template_id) if scope == "template" and template_params else None
        if takes is not None:
            for label, key in [(f"params.{p.name}", p.key) for p in params] + [(f"fixed.{k}", k) for k in fixed]:
                if key not in takes:
                    raise SpaceError(f"{where}.{label}: template {template_id} does not take {key!r}; it takes: "
                                     f"{', '.join(sorted(takes)) or 'no parameters'}")
        constraints = b.get("constraints") or []
        if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
            raise SpaceError(f"{where}.constraints: expected a list of expressions (strings)")
        out.append(Branch(str(bname), scope, template_id, params, dict(fixed), list(constraints), where))
    return out


def validate_constraints(branches: list[Branch], problem_vars: dict[str, Any]) -> None:
    """Parse and evaluate every constraint once with the first value of each param.

    Raises SpaceError naming the file, branch and expression for a parse error or an unknown name.
    """
    for b in branches:
        probe = {p.name: p.values()[0] for p in b.params if p.distribution is not None}
        b.feasible(probe, problem_vars)


def load_space(names: list[str], space_dir: Path, problem_vars: dict[str, Any],
               template_ids: set[str] | None = None, op: str | None = None,
               composed: dict[str, Any] | None = None,
               template_params: Callable[[str], frozenset[str] | None] | None = None) -> Space:
    """Load and validate ``conf/space/<name>.yaml`` for each name.

    ``composed`` holds the files' contents when Hydra already composed them (``space=[a,b]`` on the
    command line); errors still name the file, and say where a command-line override of
    ``space.<name>`` changed it. Raises SpaceError for an unknown space name, a malformed file or
    duplicate branch names.
    """
    if not names:
        raise SpaceError("no search space given; use space=[name,...] with files from conf/space/")
    branches: list[Branch] = []
    available = sorted(p.stem for p in space_dir.glob("*.yaml"))
    for name in names:
        path = space_dir / f"{name}.yaml"
        if composed is not None and name in composed:
            data = composed[name]
        elif not path.is_file():
            raise SpaceError(f"unknown space {name!r} (from space); allowed: {', '.join(available)}")
        else:
            try:
                data = OmegaConf.load(path)
            except Exception as e:
                raise SpaceError(f"{path}: cannot parse YAML: {str(e).splitlines()[0]}") from None
        # a space given inline (+space.NAME={branches: ...}) has no file: errors name the override
        source = str(path) if path.is_file() else f"override space.{name}"
        if path.is_file() and composed is not None and name in composed \
                and OmegaConf.to_container(OmegaConf.load(path)) != composed[name]:  # the value may be the override's
            source = f"{path} as changed by the command line's override of space.{name}"
        branches.extend(load_branches(data, source, template_ids, op, template_params))
    seen: set[str] = set()
    for b in branches:
        if b.name in seen:
            raise SpaceError(f"{b.source}: branch name {b.name!r} appears in more than one space")
        seen.add(b.name)
    validate_constraints(branches, problem_vars)
    return Space(branches)
