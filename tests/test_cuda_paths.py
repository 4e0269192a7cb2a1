"""zhantune's CUDA path against Inductor's own CUDA decisions, on a machine without a GPU.

Inductor's real lowerings (torch/_inductor/kernel/mm.py, bmm.py), choices handlers and lookup-table
merge run on buffers placed on a fake ``cuda:0`` (tests/fake_cuda.py); only kernel rendering and
timing are left out. Each test is one finding of issue 17.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from fake_cuda import fake_cuda, lower
from torch._inductor import config as inductor_config

from zhantune.bench.inductor import CUDA_BASE_PATCH, candidate_entry, template_patch
from zhantune.inductor.choices import recording
from zhantune.search.space import Candidate

TRITON_PARAMS = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3, "GROUP_M": 8}


def _candidate_compile(op: str, cand: Candidate, shapes: list[tuple[int, ...]], dims: dict[str, int],
                       dtype: torch.dtype = torch.bfloat16):
    """Lower ``op`` as zhantune's candidate compile does (InductorBenchmarker._candidate): its config
    patch, its one entry served under whatever key Inductor asks with."""
    with inductor_config.patch({**CUDA_BASE_PATCH, **template_patch(cand.template_id)}), \
            recording(any_key=[candidate_entry(cand, dims)]) as rec:
        lowered = lower(op, shapes, dtype)
    return lowered, rec.events


@pytest.mark.parametrize("op, template_id, shapes, dims", [
    ("addmm", "triton::mm", [(64,), (32, 16), (16, 64)], {"M": 32, "N": 64, "K": 16}),
    ("addmm", "aten::addmm", [(64,), (32, 16), (16, 64)], {"M": 32, "N": 64, "K": 16}),
    ("mm", "triton::mm", [(32, 16), (16, 64)], {"M": 32, "N": 64, "K": 16}),
    ("mm", "aten::mm", [(32, 16), (16, 64)], {"M": 32, "N": 64, "K": 16}),
    ("mm", "decompose_k", [(16, 4096), (4096, 16)], {"M": 16, "N": 16, "K": 4096}),
    ("mm", "triton::mm_persistent_tma", [(256, 256), (256, 256)], {"M": 256, "N": 256, "K": 256}),
    ("bmm", "triton::bmm", [(2, 32, 16), (2, 16, 64)], {"M": 32, "N": 64, "K": 16}),
    ("bmm", "aten::bmm", [(2, 32, 16), (2, 16, 64)], {"M": 32, "N": 64, "K": 16}),
])
def test_a_template_candidate_compile_builds_exactly_that_one_choice(op, template_id, shapes, dims):
    """Finding 1 (and 3): with ATen and Triton both in max_autotune_gemm_backends, addmm's separate
    ATen lookup (1-D bias) misses and keeps aten::addmm beside a Triton candidate, and an ATen
    candidate's template lookup misses and keeps every heuristic Triton config: Inductor would
    autotune and the trial would time the faster kernel. triton::mm_persistent_tma is not even
    offered without triton.enable_persistent_tma_matmul."""
    params = {"k_split": 4} if template_id == "decompose_k" else \
        {} if template_id.startswith("aten::") else TRITON_PARAMS
    cand = Candidate("b", "template", template_id, params)
    with fake_cuda():
        lowered, events = _candidate_compile(op, cand, shapes, dims)
    assert lowered.uids == [template_id]
    assert any(template_id in e.hit_templates for e in events)
    assert all(lowered.kwargs()[k] == v for k, v in params.items())


def test_even_k_comes_from_the_candidates_own_block_k():
    """Finding 5: Inductor merges an entry over its first heuristic config's kwargs; for K=48 that
    config has BLOCK_K=16 and EVEN_K=True, which a BLOCK_K=32 entry would inherit (unmasked loads
    past K). zhantune's candidate entry carries EVEN_K = K % BLOCK_K == 0 itself."""
    dims = {"M": 64, "N": 64, "K": 48}
    with fake_cuda():
        for block_k, even in ((32, False), (16, True)):
            cand = Candidate("b", "template", "triton::mm", {**TRITON_PARAMS, "BLOCK_K": block_k})
            lowered, _ = _candidate_compile("mm", cand, [(64, 48), (48, 64)], dims, torch.float32)
            assert lowered.uids == ["triton::mm"]
            assert lowered.kwargs()["BLOCK_K"] == block_k and lowered.kwargs()["EVEN_K"] is even
        # the kwargs of Inductor's own configs are the reference: EVEN_K is its only per-config
        # kwarg computed from the problem; everything else an entry does not set is op-wide
        with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="TRITON"):
            own = lower("mm", [(64, 48), (48, 64)], torch.float32)
    kwargs = [c.params.to_kwargs() for c in own.choices]
    assert {(k["BLOCK_K"], k["EVEN_K"]) for k in kwargs} >= {(16, True), (32, False)}
    tuned = set(TRITON_PARAMS)
    op_wide = {key: {repr(k[key]) for k in kwargs} for key in kwargs[0] if key not in tuned | {"EVEN_K"}}
    assert all(len(values) == 1 for values in op_wide.values()), op_wide


def test_an_exported_and_a_served_entry_carry_even_k(tmp_path):
    """Finding 5, the table side: build_table writes EVEN_K into each Triton entry, and zhantune's
    runtime derives it for a table made without it, so Inductor never merges another config's."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import build_table
    from zhantune.problems import GemmProblem
    from zhantune.storage import Store
    from zhantune.tune import Recorder

    dev = "NVIDIA H100 80GB HBM3"
    key = "((torch.float32, [64, 48], [48, 1]), (torch.float32, [48, 64], [64, 1]))+mm"
    store = Store(f"sqlite:///{tmp_path}/z.db")
    problem = GemmProblem("mm", (64, 64, 48), "float32")
    rec = Recorder(store, problem, store.study_id("s", {}), store.device_id(dev, dev, "cuda", {}),
                   store.problem_id(problem.key, lookup_key=key, **problem.row_fields()))
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t"), lookup=hit), "candidate",
            Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS), trial_number=0)
    table = build_table(store)
    assert table == {f"{dev}+{key}": [{"template_id": "triton::mm", **TRITON_PARAMS, "EVEN_K": False}]}

    old = {f"{dev}+{key}": [{"template_id": "triton::mm", **TRITON_PARAMS}]}  # made before the fix
    with fake_cuda(), use_table(old, device="cuda"):
        served = lower("mm", [(64, 48), (48, 64)], torch.float32)
    assert served.uids == ["triton::mm"] and served.kwargs()["EVEN_K"] is False


def test_use_table_on_cuda_offers_the_persistent_tma_template():
    """Finding 3, the runtime side: a table whose entry is triton::mm_persistent_tma hits only when
    triton.enable_persistent_tma_matmul is on (off by default); use_table(device="cuda") sets it."""
    from zhantune.inductor.runtime import use_table

    dev = "NVIDIA H100 80GB HBM3"
    key = f"{dev}+((torch.bfloat16, [256, 256], [256, 1]), (torch.bfloat16, [256, 256], [256, 1]))+mm"
    entry = {"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}
    with fake_cuda(), use_table({key: [entry]}, device="cuda") as installed:
        served = lower("mm", [(256, 256), (256, 256)], torch.bfloat16)
    assert installed.report.hits == {key: 1}
    assert served.uids == ["triton::mm_persistent_tma"]


@pytest.mark.parametrize("dtype, activation", [("float32", "relu"), ("bfloat16", "gelu")])
def test_linear_act_is_benchmarked_under_the_op_inductor_looks_up_on_a_gpu(dtype, activation):
    """Finding 2: on a GPU, Inductor's post-grad pass unfuse_bias_add_to_pointwise rewrites addmm
    followed by pointwise ops into mm + add (half dtypes stay fused): a float32 linear_act is looked
    up as "mm". The real pass runs here, on CPU, with its GPU check (post_grad.is_gpu) answering
    yes; the benchmarker must record that lookup, and lookup_op_on("cuda") must predict it."""
    from torch._inductor.fx_passes import post_grad

    from zhantune.bench import inductor
    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device
    from zhantune.problems import GemmProblem

    problem = GemmProblem.from_config("linear_act", [32, 64, 48], dtype, activation)
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BenchConfig(warmup_ms=1, target_ms=2))
    # a GPU compile prepacks nothing; on CPU the frozen weight would be prepacked by oneDNN before
    # the post-grad pass runs, so this CPU stand-in compiles without freezing
    with mock.patch.object(post_grad, "is_gpu", lambda device: True), \
            mock.patch.dict(inductor.CPU_BASE_PATCH, {"freezing": False}):
        default = bench.inductor_default()
    assert default.status == "ok", default.error_text
    assert default.lookup.op_name == problem.lookup_op_on("cuda")
    assert problem.lookup_op_on("cuda") == ("mm" if dtype == "float32" else "addmm")
    assert problem.lookup_op_on("cpu") == "addmm"


def _cuda_space(problem, names: list[str]):
    from zhantune.device import DeviceInfo
    from zhantune.inductor.heuristics import template_params
    from zhantune.inductor.templates import inductor_template_ids
    from zhantune.search.space import load_space
    from zhantune.tune import CONF_DIR, problem_variables

    h100 = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3",
                      {"sm_count": 132, "smem_bytes": 232448, "capability": "9.0"})
    variables = problem_variables(problem, h100)
    space = load_space(names, CONF_DIR / "space", variables, set(inductor_template_ids()),
                       op=problem.lookup_op_on("cuda"), template_params=template_params)
    return space, variables


@pytest.mark.parametrize("op, shape", [("mm", [64, 64, 4096]), ("mm", [64, 32, 2048]), ("mm", [64, 64, 512]),
                                       ("addmm", [64, 64, 4096])])
def test_a_cuda_branch_has_feasible_points_exactly_when_inductor_offers_its_template(op, shape):
    """Finding 4: decompose_k is offered only for K >= 32 * max(M, N) and triton::mm disappears at
    K >= 64 * max(M, N) (mm only): a branch Inductor does not offer would spend the budget on
    not_applied trials. The offered templates come from Inductor's real mm lowering."""
    from zhantune.problems import GemmProblem
    from zhantune.search.study import feasible_size

    problem = GemmProblem.from_config(op, shape, "bfloat16")
    space, variables = _cuda_space(problem, ["triton_mm", "decompose_k"])
    sizes = feasible_size(space, variables)
    m, n, k = shape
    inputs = [(m, k), (k, n)] if op == "mm" else [(n,), (m, k), (k, n)]
    with fake_cuda(), inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"):
        offered = set(lower(op, inputs, torch.bfloat16).uids)
    assert (sizes["triton_mm"][1] > 0) == ("triton::mm" in offered), (sizes, offered)
    assert (sizes["decompose_k"][1] > 0) == ("decompose_k" in offered), (sizes, offered)


def test_the_triton_spaces_bound_accumulators_per_thread_and_keep_inductors_own_configs():
    """Finding 12: 256x256 tiles with 2 warps hold 1,024 fp32 accumulators per thread (a thread has
    255 registers); Inductor's own CUDA mm configs stay at 128 or fewer. The Triton spaces admit every
    config of Inductor's heuristic for the size and no tile above that bound."""
    from zhantune.inductor.heuristics import triton_mm_configs
    from zhantune.problems import GemmProblem

    problem = GemmProblem.from_config("mm", [4096, 4096, 4096], "bfloat16")
    space, variables = _cuda_space(problem, ["triton_mm", "triton_bmm", "triton_persistent_tma"])
    own = triton_mm_configs(4096, 4096, 4096, 2)
    for branch in space.branches:
        names = {p.key: p.name for p in branch.params}
        feasible = [v for v in branch.all_values() if branch.feasible(v, variables)]
        assert feasible and all(v["BLOCK_M"] * v["BLOCK_N"] <= 128 * 32 * v["num_warps"] for v in feasible)
        assert not branch.feasible({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 32, "num_warps": 4,
                                    "num_stages": 2, "GROUP_M": 8}, variables)
        if branch.template_id != "triton::mm_persistent_tma":  # its own heuristic, other ranges
            roomy = {**variables, "smem_bytes": 1 << 30}  # Inductor drops configs over smem later
            for c in own:
                point = {names[k]: c[k] for k in names if k in c}
                assert branch.feasible(point, roomy), (branch.name, c)


@pytest.mark.parametrize("op, inputs", [("mm", [(32, 16), (16, 64)]), ("addmm", [(64,), (32, 16), (16, 64)]),
                                        ("bmm", [(2, 32, 16), (2, 16, 64)])])
def test_an_aten_template_winner_is_recognised_as_the_defaults_own_kernel(op, inputs):
    """Finding 9: Inductor's default compile (no max-autotune) runs exactly one choice, its ATen
    kernel; an aten::<op> winner on CUDA is that kernel, so its "speedup" over the default is noise
    and is never claimed (the CPU ``aten`` config was the only one recognised)."""
    from zhantune.storage import models as orm
    from zhantune.tune import _is_default_kernel

    with fake_cuda(), inductor_config.patch(max_autotune=False):
        default = lower(op, inputs, torch.bfloat16)
    (uid,) = default.uids
    assert _is_default_kernel(orm.Measurement(template_id=uid, params={}))
    assert not _is_default_kernel(orm.Measurement(template_id="triton::mm", params=TRITON_PARAMS))
    assert not _is_default_kernel(orm.Measurement(template_id="aten::bias_addmm", params={}))
