"""Seeding from Inductor's own heuristics, and the backend (tf32) scope's rules."""

from __future__ import annotations

import pytest

from zhantune.errors import SpaceError
from zhantune.inductor.heuristics import decompose_k_splits, triton_mm_configs
from zhantune.inductor.simulate import PROFILES
from zhantune.runspec import _check_config_keys, problem_variables, resolve_run
from zhantune.search.seeds import inductor_seeds

H100_LIKE = PROFILES["H100"].device_info()


def test_cpu_seeds_are_aten_and_the_cpp_template_at_inductors_defaults(tune_cfg):
    from torch._inductor import config as inductor_config

    run = resolve_run(tune_cfg(["+op=mm", "shape=[256,256,256]", "device=cpu"]))
    seeds = {b.name: v for b, v in inductor_seeds(run.space, run.problem, run.problem_vars)}
    assert seeds["aten"] == {}
    assert seeds["cpp_gemm"] == {"k_slices": inductor_config.cpp.gemm_max_k_slices,
                                 "thread_factors": inductor_config.cpp.gemm_thread_factors,
                                 "cache_blocking": inductor_config.cpp.gemm_cache_blocking}


def test_cuda_seeds_are_inductors_heuristic_configs_inside_the_space(tune_cfg, monkeypatch):
    # K between 32 and 64 times max(M, N): Inductor offers both triton::mm and decompose_k
    cfg = tune_cfg(["+op=mm", "shape=[96,96,4096]", "device=cpu", "dtype=bfloat16",
                    "space=[aten_template,triton_mm,decompose_k]"])
    run = resolve_run(tune_cfg(["+op=mm", "shape=[96,96,4096]", "device=cpu"]))
    # the same request on a CUDA device (the space is loaded for it; nothing compiles here)
    from zhantune.config import CONF_DIR
    from zhantune.search.schema import load_space

    run.device = H100_LIKE
    run.problem_vars = problem_variables(run.problem, H100_LIKE)
    run.space = load_space(["aten_template", "triton_mm", "decompose_k"], CONF_DIR / "space", run.problem_vars, op="mm")
    run.cfg = cfg
    seeds = inductor_seeds(run.space, run.problem, run.problem_vars, run.cfg.search.seed_inductor)
    by_branch: dict[str, list[dict]] = {}
    for b, v in seeds:
        by_branch.setdefault(b.name, []).append(v)
    expected = triton_mm_configs(96, 96, 4096, 4)
    triton = by_branch["triton_mm"]
    assert triton and all({**v} in [{k: c[k] for k in v} for c in expected] for v in triton)
    assert [v["k_split"] for v in by_branch["decompose_k"]] == [
        s for s in decompose_k_splits(96, 96, 4096) if 4096 % s == 0 and 4096 // s >= 16]
    assert by_branch["aten_template"] == [{}]
    b = run.space.branch("triton_mm")
    assert all(b.feasible(v, run.problem_vars) for v in triton)


def test_backend_and_template_branches_are_cuda_only_and_flags_are_checked(tune_cfg):
    with pytest.raises(SpaceError, match="backend-flag branches .tf32. apply on CUDA only"):
        resolve_run(tune_cfg(["+op=mm", "shape=[64,64,64]", "device=cpu", "space=[tf32]"]))
    run = resolve_run(tune_cfg(["+op=mm", "shape=[64,64,64]", "device=cpu"]))
    from zhantune.search.schema import Space, load_branches

    bad = Space(load_branches({"branches": {"t": {"scope": "backend", "fixed": {"cuda.matmul.allow_tf64": True}}}}, "t.yaml"))
    with pytest.raises(SpaceError, match="'cuda.matmul.allow_tf64' is not a backend flag zhantune sets"):
        _check_config_keys(bad, H100_LIKE)
    good = Space(load_branches({"branches": {"t": {"scope": "backend", "fixed": {"cuda.matmul.allow_tf32": True}}}}, "t.yaml"))
    _check_config_keys(good, H100_LIKE)
    assert run.space.names == ["aten", "cpp_gemm"]
