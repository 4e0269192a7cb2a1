"""Search spaces: YAML -> Optuna distributions (table-driven), constraints, errors, shipped files."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from zhantune.errors import SpaceError
from zhantune.inductor.heuristics import template_params, triton_mm_configs
from zhantune.inductor.templates import inductor_template_ids
from zhantune.search.schema import load_branches, load_space, param_distribution

CONF = Path(__file__).resolve().parents[1] / "zhantune" / "conf"

DISTRIBUTION_ROWS = [
    ({"choices": [2, 4, 8]}, CategoricalDistribution((2, 4, 8))),
    ({"choices": [True, False]}, CategoricalDistribution((True, False))),
    ({"choices": [None, "1,1,2"]}, CategoricalDistribution((None, "1,1,2"))),
    ({"low": 1, "high": 6}, IntDistribution(1, 6)),
    ({"low": 2, "high": 10, "step": 2}, IntDistribution(2, 10, step=2)),
    ({"low": 16, "high": 256, "pow2": True}, CategoricalDistribution((16, 32, 64, 128, 256))),
    ({"low": 10, "high": 100, "pow2": True}, CategoricalDistribution((16, 32, 64))),
    ({"low": 1, "high": 4096, "log": True}, IntDistribution(1, 4096, log=True)),
]


@pytest.mark.parametrize("spec,expected", DISTRIBUTION_ROWS)
def test_param_distribution(spec, expected):
    p = param_distribution("x", spec, "f.yaml: branches.b.params.x")
    assert p.distribution == expected
    assert p.key == "x"


def test_fixed_value_and_key():
    p = param_distribution("k_slices", {"value": 2, "key": "cpp.gemm_max_k_slices"}, "w")
    assert p.distribution is None and p.value == 2 and p.key == "cpp.gemm_max_k_slices"
    assert p.values() == [2]


ERROR_ROWS = [
    ({"choices": []}, "non-empty list"),
    ({"low": 8, "high": 2}, "low=8 > high=2"),
    ({"low": 1, "high": 4, "stepp": 2}, "unknown key 'stepp'"),
    ({"low": 1}, "low without high"),
    ({"choices": [1], "low": 1, "high": 2}, "exactly one of"),
    ({"low": "a", "high": 2}, "must be an integer"),
    ({"low": 100, "high": 120, "pow2": True}, "no power of two"),
    ({"low": 0, "high": 8, "log": True}, "log range needs low >= 1"),
    ({"choices": [[1, 2]]}, "not a bool, number, string or null"),
]


@pytest.mark.parametrize("spec,message", ERROR_ROWS)
def test_param_errors_name_file_and_key(spec, message):
    with pytest.raises(SpaceError) as e:
        param_distribution("BLOCK_M", spec, "conf/space/x.yaml: branches.b.params.BLOCK_M")
    assert message in str(e.value)
    assert "conf/space/x.yaml: branches.b.params.BLOCK_M" in str(e.value)


def _branch(constraints, params=None):
    data = {"branches": {"b": {"scope": "template", "template_id": "triton::mm",
                               "params": params or {"BLOCK_K": {"choices": [16, 32, 64]},
                                                    "k_split": {"choices": [2, 3]}},
                               "constraints": constraints}}}
    return load_branches(data, "s.yaml")[0]


CONSTRAINT_ROWS = [
    ("BLOCK_K <= K", {"BLOCK_K": 32, "k_split": 2}, {"K": 16}, False),
    ("BLOCK_K <= K", {"BLOCK_K": 16, "k_split": 2}, {"K": 16}, True),
    ("K % k_split == 0", {"BLOCK_K": 16, "k_split": 3}, {"K": 64}, False),
    ("(BLOCK_K + 16) * dtype_bytes <= smem_bytes", {"BLOCK_K": 64, "k_split": 2},
     {"dtype_bytes": 2, "smem_bytes": 160}, True),
    ("factors_product('1,2,2') == 4", {"BLOCK_K": 16, "k_split": 2}, {}, True),
]


@pytest.mark.parametrize("expr,values,variables,expected", CONSTRAINT_ROWS)
def test_constraints(expr, values, variables, expected):
    assert _branch([expr]).feasible(values, variables) is expected


def test_constraint_unknown_name_and_parse_error():
    with pytest.raises(SpaceError, match="names unknown variable 'NOPE'"):
        _branch(["BLOCK_K <= NOPE"]).feasible({"BLOCK_K": 16, "k_split": 2}, {})
    with pytest.raises(SpaceError, match="cannot evaluate"):
        _branch(["BLOCK_K <= ("]).feasible({"BLOCK_K": 16, "k_split": 2}, {})


def test_constraints_never_call_python_eval():
    with pytest.raises(SpaceError):
        _branch(["__import__('os').system('true') == 0"]).feasible({"BLOCK_K": 16, "k_split": 2}, {})


def test_unknown_template_id_and_branch_key():
    data = {"branches": {"b": {"scope": "template", "template_id": "triton::nope"}}}
    with pytest.raises(SpaceError, match="unknown template_id 'triton::nope'"):
        load_branches(data, "s.yaml", set(inductor_template_ids()))
    with pytest.raises(SpaceError, match="unknown key 'parms'"):
        load_branches({"branches": {"b": {"parms": {}}}}, "s.yaml")


def test_template_ids_come_from_inductor():
    ids = inductor_template_ids()
    assert {"triton::mm", "triton::bmm", "decompose_k", "aten::mm", "aten::addmm"} <= ids


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "linear_act"])
def test_every_shipped_space_loads_for_every_op(op):
    names = sorted(p.stem for p in (CONF / "space").glob("*.yaml"))
    # every template offered (zhantune.runspec.problem_variables computes these from Inductor per size)
    lookup_op = {"linear_act": "addmm"}.get(op, op)
    variables = {"M": 256, "N": 256, "K": 256, "B": 2, "op": lookup_op, "dtype_bytes": 4, "smem_bytes": 232448,
                 "sm_count": 132, "cores": 2, "n_threads": 2, "decompose_k_offered": True,
                 "triton_mm_offered": True, "tma_offered": True, "aten_offered": True, "capability": "9.0"}
    space = load_space(names, CONF / "space", variables, set(inductor_template_ids()), op=lookup_op,
                       template_params=template_params)
    assert space.branch("aten_template").template_id == f"aten::{lookup_op}"
    # every branch has at least one feasible point for this problem
    for b in space.branches:
        assert any(b.feasible(v, variables) for v in b.all_values()), b.name
    # thread factors abort the C++ BMM template's kernel (test_ship): never proposed for a bmm
    cpp = space.branch("cpp_gemm")
    factored = [v for v in cpp.all_values() if v["thread_factors"] is not None and cpp.feasible(v, variables)]
    assert (len(factored) == 0) == (lookup_op == "bmm"), len(factored)


def test_suggest_and_enqueue_round_trip():
    space = load_space(["aten", "cpp_gemm"], CONF / "space", {"n_threads": 2})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    b = space.branch("cpp_gemm")
    values = {"k_slices": 2, "thread_factors": None, "cache_blocking": "4,1,16"}
    study.enqueue_trial(space.trial_params(b, values))
    trial = study.ask()
    got_branch, got_values = space.suggest(trial)
    assert got_branch.name == "cpp_gemm" and got_values == values
    cand = got_branch.candidate(got_values)
    assert cand.params == {"max_autotune_gemm_backends": "CPP", "cpp.gemm_max_k_slices": 2,
                           "cpp.gemm_thread_factors": None, "cpp.gemm_cache_blocking": "4,1,16"}
    assert cand.config_hash == b.candidate(dict(values)).config_hash


@pytest.mark.parametrize("template_id, params, fixed, message", [
    ("triton::mm", {"BLOCK_Q": {"choices": [16]}}, {}, "params.BLOCK_Q: template triton::mm does not take 'BLOCK_Q'"),
    ("triton::mm", {"num_warps": {"choices": [4]}}, {"k_split": 2}, "fixed.k_split: template triton::mm does not take"),
    ("aten::mm", {"BLOCK_M": {"choices": [16]}}, {}, "template aten::mm does not take 'BLOCK_M'; it takes: no parameters"),
    ("decompose_k", {"BLOCK_M": {"choices": [16]}}, {}, "template decompose_k does not take 'BLOCK_M'; it takes: k_split"),
])
def test_a_parameter_its_template_does_not_take(template_id, params, fixed, message):
    data = {"branches": {"b": {"scope": "template", "template_id": template_id, "params": params, "fixed": fixed}}}
    with pytest.raises(SpaceError, match=message.replace("(", r"\(")):
        load_branches(data, "s.yaml", set(inductor_template_ids()), template_params=template_params)


def test_triton_template_params_are_the_keys_of_inductors_own_configs():
    config = triton_mm_configs(512, 512, 512, 2)[0]
    assert template_params("triton::mm") == frozenset(config)
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"} <= template_params("triton::mm")
