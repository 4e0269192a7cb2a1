"""zhantune's CUDA path against Inductor's own CUDA decisions, on a machine without a GPU.

Inductor's real lowerings (torch/_inductor/kernel/mm.py, bmm.py), choices handlers and lookup-table
merge run on buffers placed on a fake ``cuda:0`` (tests/fake_cuda.py); only kernel rendering and
timing are left out. Each test is one finding of issue 17.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from pathlib import Path
from unittest import mock

import pytest
import torch
from fake_cuda import fake_cuda, lower
from torch._inductor import config as inductor_config

from zhantune.bench.inductor import candidate_entry
from zhantune.candidate import Candidate
from zhantune.inductor.choices import recording
from zhantune.inductor.cuda_entries import SHARED_MEMORY, shared_memory_bytes
from zhantune.inductor.settings import CUDA_BASE_PATCH, template_patch
from zhantune.inductor.simulate import PROFILES

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
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.runtime import use_table
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

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


def test_a_dynamic_k_never_gets_even_k_from_a_table(tmp_path):
    """A table's key holds the compile's size hints, so a compile with a dynamic K whose hint is the
    tuned K (a model table of several sequence lengths, recompiled dynamic) finds the entry too:
    ``EVEN_K: true`` from the tuned K dropped the K masks for every other K (a review reproduced it
    with use_table and with stock Inductor). use_table computes EVEN_K as Inductor does, on the
    symbolic K; the export writes ``EVEN_K: false`` where BLOCK_K does not divide K and no EVEN_K
    where it does, so stock Inductor merges its own (false for a dynamic K)."""
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.runtime import use_table
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

    dev = "NVIDIA H100 80GB HBM3"
    params = {**TRITON_PARAMS, "BLOCK_K": 32}
    static, dynamic = [(64, 64), (64, 64)], [(64, "k"), ("k", 64)]

    def even_k(table, shapes, stock=False):
        """EVEN_K of the table's entry as Inductor lowers an mm of ``shapes`` (K hinted 64)."""
        with fake_cuda():
            if stock:
                with inductor_config.patch({"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                                            "lookup_table.table": table}), V.set_choices_handler(LookupTableChoices()):
                    got = lower("mm", shapes, torch.bfloat16, hints={"k": 64})
            else:
                with use_table(table, device="cuda") as installed:
                    got = lower("mm", shapes, torch.bfloat16, hints={"k": 64})
                assert sum(installed.report.hits.values()) == 1, installed.report.as_dict()
        assert got.uids == ["triton::mm"] and got.kwargs()["BLOCK_K"] == 32
        return got.kwargs()["EVEN_K"]

    key = f"{dev}+((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    old = {key: [{"template_id": "triton::mm", **params, "EVEN_K": True}]}  # as tables were exported
    assert even_k(old, static) is True and even_k(old, dynamic) is False
    assert even_k({key: [{**old[key][0], "EVEN_K": False}]}, static) is False  # never true against the entry

    store = Store(f"sqlite:///{tmp_path}/z.db")
    problem = GemmProblem("mm", (64, 64, 64), "bfloat16")
    rec = Recorder(store, problem, store.study_id("s", {}), store.device_id(dev, dev, "cuda", {}),
                   store.problem_id(problem.key, lookup_key=key.split("+", 1)[1], **problem.row_fields()))
    hit = LookupEvent("mm", key, key.split("+", 1)[1], {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t"), lookup=hit), "candidate",
            Candidate("triton_mm", "template", "triton::mm", params), trial_number=0)
    exported = build_table(store)
    assert exported == {key: [{"template_id": "triton::mm", **params}]}
    assert even_k(exported, static, stock=True) is True and even_k(exported, dynamic, stock=True) is False
    assert even_k(exported, static) is True and even_k(exported, dynamic) is False


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


def test_a_device_agnostic_table_of_cpus_only_is_never_served_on_cuda(tmp_path):
    """A helper's attack (session 46): ``export device_agnostic=true device=cpu`` writes keys without a
    device, its ``devices`` a CPU alone. Read for CUDA such a key took the kind read for: its
    ``aten::mm`` entry hit on an H100 (coverage 100%) and stopped the user's max-autotune from
    offering triton::mm; a C++-template entry refused the whole table ("not a knob on cuda"). A key
    without a device is of the kind of every device the wrapper lists: here a CPU's, left out on CUDA."""
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import FORMAT, read_table, write_table

    key = "((torch.bfloat16, [256, 256], [256, 1]), (torch.bfloat16, [256, 512], [512, 1]))+mm"
    cpp = {"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}
    meta = {"format": FORMAT, "format_version": 2, "torch": torch.__version__,
            "devices": [{"key": "AMD EPYC 7B13 (2 threads)", "kind": "cpu", "isa": "AVX2"}],
            "options": {"device_agnostic": True}}
    shapes = [(256, 256), (256, 512)]
    with fake_cuda(), inductor_config.patch(max_autotune=True):
        without = sorted(set(lower("mm", shapes, torch.bfloat16).uids))
    assert without == ["aten::mm", "triton::mm"]
    for entry in ({"template_id": "aten::mm"}, cpp):
        path = write_table(tmp_path / "t.json", {key: [entry]}, meta)
        tf = read_table(path, "cuda")
        assert tf.table == {} and tf.other_kind == {key: "cpu"}
        assert read_table(path, "cpu").table == {key: [entry]}
        with fake_cuda(), inductor_config.patch(max_autotune=True), use_table(path, device="cuda") as installed:
            served = lower("mm", shapes, torch.bfloat16)
        assert sorted(set(served.uids)) == without and not installed.report.hits and not installed.report.stale
    # listed devices of both kinds (a hand-made file: the export refuses it): the kind read for, as before
    both = {**meta, "devices": [*meta["devices"], {"key": "NVIDIA H100 80GB HBM3", "kind": "cuda"}]}
    path = write_table(tmp_path / "both.json", {key: [{"template_id": "aten::mm"}]}, both)
    assert read_table(path, "cuda").table == {key: [{"template_id": "aten::mm"}]}


def test_a_tma_entry_of_another_gemm_never_changes_what_a_miss_autotunes_nor_breaks_native_matmul():
    """A helper's attack (session 46): a table whose only entry is a triton::mm_persistent_tma one,
    under another GPU's key, turns on ``triton.enable_persistent_tma_matmul`` for the compile; on a
    B200 a GEMM the table does not hold (a miss) then autotuned
    triton::blackwell_ws_persistent_device_tma too, which the flag also gates, under the user's
    max-autotune. A miss now offers what it would without the table. Under the user's
    ``triton.native_matmul`` the flag is left off (Inductor raises at every mm with both on)."""
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.settings import cuda_table_patch

    b200 = dataclasses.replace(PROFILES["H100"], name="NVIDIA B200", gcn_arch_name="NVIDIA B200", major=10, minor=0,
                               sm_count=148)
    other = "NVIDIA A100-SXM4-80GB+((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    table = {other: [{"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}]}
    shapes = [(256, 256), (256, 256)]
    with fake_cuda(b200.properties()), inductor_config.patch(max_autotune=True):
        without = sorted(set(lower("mm", shapes, torch.bfloat16).uids))
        with inductor_config.patch({"triton.enable_persistent_tma_matmul": True}):  # what the flag offers here
            flagged = set(lower("mm", shapes, torch.bfloat16).uids)
        with use_table(table, device="cuda") as installed:
            served = sorted(set(lower("mm", shapes, torch.bfloat16).uids))
    assert "triton::blackwell_ws_persistent_device_tma" in flagged - set(without)
    assert served == without and sum(installed.report.misses.values()) == 1 and not installed.report.hits
    assert cuda_table_patch(table)["triton.enable_persistent_tma_matmul"] is True
    with inductor_config.patch({"triton.native_matmul": True}):
        assert "triton.enable_persistent_tma_matmul" not in cuda_table_patch(table)


def test_a_hit_that_leaves_out_some_of_its_keys_entries_says_which_and_why():
    """A helper's attack (session 46): a top_k=2 device-agnostic table from an H100, its first entry
    (the one confirmed against the default) triton::mm_persistent_tma, hit on an A100, which has no
    TMA: only the second entry, never paired with the default, was served and the report said a
    plain hit. The report (and check) now names what a hit left out."""
    from zhantune.inductor.runtime import use_table

    key = "((torch.bfloat16, [256, 256], [256, 1]), (torch.bfloat16, [256, 256], [256, 1]))+mm"
    first = {"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}
    second = {"template_id": "triton::mm", **TRITON_PARAMS}
    stale_hash = {**second, "BLOCK_N": 128, "template_hash": "0" * 16}
    for entries, dropped in (([first, second], "1 of 2 entries not served (the first is the one a claim confirmed "
                                               "against the default): [0] triton::mm_persistent_tma: a template "
                                               "Inductor does not offer here"),
                             ([second, stale_hash], "1 of 2 entries not served: [1] triton::mm: "),
                             ([second], None)):
        with fake_cuda(PROFILES["A100"].properties()), use_table({key: entries}, device="cuda") as installed:
            served = lower("mm", [(256, 256), (256, 256)], torch.bfloat16)
        assert served.uids == ["triton::mm"] and installed.report.hits == {f"{key}": 1}, installed.report
        got = installed.report.as_dict()["dropped"]
        assert (got == {}) if dropped is None else got[key].startswith(dropped), got


def test_a_cuda_candidate_or_table_compile_autotunes_the_gemm_only():
    """C1 of the second review: with ``max_autotune=True`` Inductor also autotunes every pointwise
    and reduction kernel (runtime/triton_heuristics.py reads ``max_autotune`` from each kernel's
    inductor_meta): a linear_act candidate was timed with an autotuned activation kernel against a
    default without one, and use_table autotuned a user's whole model. The GEMM switch alone
    (``max_autotune_gemm``) still serves the candidate and the table (the tests above compile under
    these same patches); the kernels' meta, from Inductor's own codegen, has autotuning off."""
    import torch.utils._triton as triton_utils
    from torch._inductor import ir
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.utils import _use_conv_autotune_backend, use_triton_template
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from zhantune.inductor.runtime import use_table

    backend = make_backend(GPUTarget("cuda", 90, 32))
    key = "NVIDIA H100 80GB HBM3+((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    with fake_cuda(), mock.patch.object(triton_utils, "triton_backend", lambda: backend):
        for tid in ("triton::mm", "decompose_k", "aten::mm", "triton::mm_persistent_tma"):
            with inductor_config.patch({**CUDA_BASE_PATCH, **template_patch(tid)}):
                meta = TritonKernel.inductor_meta_common()
                assert inductor_config.max_autotune_gemm
            assert not meta["max_autotune"] and not meta["max_autotune_pointwise"], tid
        conv = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [8, 64, 32, 32], [65536, 1024, 32, 1])
        assert not (use_triton_template(conv) and _use_conv_autotune_backend("TRITON"))  # no table: ATen convs
        with use_table({key: [{"template_id": "triton::mm", **TRITON_PARAMS}]}, device="cuda"):
            meta = TritonKernel.inductor_meta_common()
            assert inductor_config.max_autotune_gemm
            # nor with one (a review: GEMM max-autotune offered and benchmarked Triton conv templates)
            assert use_triton_template(conv) and not _use_conv_autotune_backend("TRITON")
        assert not meta["max_autotune"] and not meta["max_autotune_pointwise"]


def _lower_mm_and_its_subgraphs(m: int, n: int, k: int, dtype: torch.dtype) -> list[tuple[str, list[str]]]:
    """Inductor's real tuned_mm on fake cuda:0 buffers, the single choice it builds lowered for
    real (decompose_k's subgraph included, with its inner bmm): (op, choice names) per selection."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.kernel import bmm, mm
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[tuple[str, list[str]]] = []
    graph = GraphLowering(torch.fx.symbolic_trace(torch.nn.Identity()))
    with V.set_graph_handler(graph), V.set_fake_mode(FakeTensorMode()):
        nodes = []
        for i, size in enumerate([(m, k), (k, n)]):
            layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(size), list(torch.empty(size, device="meta").stride()))
            graph.graph_inputs[f"arg{i}"] = ir.TensorBox.create(ir.InputBuffer(name=f"arg{i}", layout=layout))
            nodes.append(graph.graph_inputs[f"arg{i}"])

        def select(name, choices, *args, **kwargs):
            seen.append((name, [c.name for c in choices]))
            return choices[0].output_node(), choices[0]

        with mock.patch.object(mm, "autotune_select_algorithm", select), \
                mock.patch.object(bmm, "autotune_select_algorithm", select):
            mm.tuned_mm(*nodes)
    return seen


def test_use_table_does_not_count_decompose_ks_inner_bmm_as_a_miss():
    """decompose_k lowers its bmm in a subgraph under max_autotune=False and ATen only
    (torch/_inductor/ir.py SubgraphBuffer); that bmm still asks the choices handler. No table can
    change it: use_table reported it as a missed key (coverage 50%, and gpu_check failed a
    decompose_k winner for it)."""
    from zhantune.inductor.runtime import use_table

    m, n, k = 64, 64, 2048
    key = f"NVIDIA H100 80GB HBM3+((torch.bfloat16, [{m}, {k}], [{k}, 1]), (torch.bfloat16, [{k}, {n}], [{n}, 1]))+mm"
    with fake_cuda(), use_table({key: [{"template_id": "decompose_k", "k_split": 4}]}, device="cuda") as installed:
        seen = _lower_mm_and_its_subgraphs(m, n, k, torch.bfloat16)
    assert [op for op, _ in seen] == ["mm", "bmm"]  # the subgraph's bmm was lowered and looked up
    assert seen[0][1][0].startswith("decompose_k") and seen[1][1] == ["bmm_dtype"]
    assert installed.report.hits == {key: 1}
    assert not installed.report.misses and installed.report.coverage == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype, activation", [("float32", "relu"), ("bfloat16", "gelu")])
def test_linear_act_is_benchmarked_under_the_op_inductor_looks_up_on_a_gpu(dtype, activation):
    """Finding 2: on a GPU, Inductor's post-grad pass unfuse_bias_add_to_pointwise rewrites addmm
    followed by pointwise ops into mm + add (half dtypes stay fused): a float32 linear_act is looked
    up as "mm". The real pass runs here, on CPU, with its GPU check (post_grad.is_gpu) answering
    yes; the benchmarker must record that lookup, and lookup_op_on("cuda") must predict it."""
    from torch._inductor.fx_passes import post_grad

    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device
    from zhantune.inductor import settings
    from zhantune.problems import GemmProblem

    problem = GemmProblem.from_config("linear_act", [32, 64, 48], dtype, activation)
    bench = InductorBenchmarker(problem, resolve_device("cpu"), BenchConfig(warmup_ms=1, target_ms=2))
    # a GPU compile prepacks nothing; on CPU the frozen weight would be prepacked by oneDNN before
    # the post-grad pass runs, so this CPU stand-in compiles without freezing
    with mock.patch.object(post_grad, "is_gpu", lambda device: True), \
            mock.patch.dict(settings.CPU_BASE_PATCH, {"freezing": False}):
        default = bench.inductor_default()
    assert default.status == "ok", default.error_text
    assert default.lookup.op_name == problem.lookup_op_on("cuda")
    assert problem.lookup_op_on("cuda") == ("mm" if dtype == "float32" else "addmm")
    assert problem.lookup_op_on("cpu") == "addmm"


def _cuda_space(problem, names: list[str], gpu: str = "H100"):
    from zhantune.inductor.heuristics import template_params
    from zhantune.inductor.simulate import PROFILES
    from zhantune.inductor.templates import inductor_template_ids
    from zhantune.runspec import CONF_DIR, problem_variables
    from zhantune.search.schema import load_space

    with fake_cuda(PROFILES[gpu].properties()):
        variables = problem_variables(problem, PROFILES[gpu].device_info())
    space = load_space(names, CONF_DIR / "space", variables, set(inductor_template_ids()),
                       op=problem.lookup_op_on("cuda"), template_params=template_params)
    return space, variables


@pytest.mark.parametrize("op, shape, search_space", [
    ("mm", [64, 64, 4096], "DEFAULT"), ("mm", [64, 32, 2048], "DEFAULT"), ("mm", [64, 64, 512], "DEFAULT"),
    ("addmm", [64, 64, 4096], "DEFAULT"),
    # TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_SEARCH_SPACE=EXHAUSTIVE: config.py upper-cases it and tuned_mm
    # compares it with "exhaustive", so Inductor still drops triton::mm at K >= 64 * max(M, N)
    ("mm", [64, 64, 4096], "EXHAUSTIVE"), ("mm", [16, 16, 4096], "EXHAUSTIVE")])
def test_a_cuda_branch_has_feasible_points_exactly_when_inductor_offers_its_template(op, shape, search_space):
    """Finding 4: decompose_k is offered only for K >= 32 * max(M, N) and triton::mm disappears at
    K >= 64 * max(M, N) (mm only): a branch Inductor does not offer would spend the budget on
    not_applied trials. The offered templates come from Inductor's real mm lowering."""
    from zhantune.problems import GemmProblem
    from zhantune.search.study import feasible_size

    problem = GemmProblem.from_config(op, shape, "bfloat16")
    with inductor_config.patch(max_autotune_gemm_search_space=search_space):
        space, variables = _cuda_space(problem, ["triton_mm", "decompose_k"])
    sizes = feasible_size(space, variables)
    m, n, k = shape
    inputs = [(m, k), (k, n)] if op == "mm" else [(n,), (m, k), (k, n)]
    with fake_cuda(), inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON",
                                            max_autotune_gemm_search_space=search_space):
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


@pytest.mark.parametrize("gpu, dtype, size", [("A100", "bfloat16", 4096), ("H100", "bfloat16", 4096),
                                              ("H100", "float32", 2048), ("A100", "float32", 256)])
def test_the_triton_spaces_keep_inductors_own_configs_whose_tiles_fit_shared_memory(gpu, dtype, size):
    """A helper's (session 52): the Triton mm and bmm spaces bounded shared memory by Inductor's own
    estimate, num_stages buffers of the A and B tiles, and left out some of Inductor's own configs that
    fit, e.g. on an A100 bf16 64x128x128 in 4 stages (Triton gives it 3 buffers, 147,456 bytes of the
    166,912); on an H100 fp32 64x32x128 in 5 stages. The bound is now the one measured with Triton's
    compiler (shared_memory_bytes: num_stages buffers for Hopper's warpgroup MMA, else one fewer)."""
    from zhantune.inductor.heuristics import triton_mm_configs
    from zhantune.inductor.simulate import PROFILES
    from zhantune.problems import GemmProblem

    for op, shape in (("mm", [size] * 3), ("bmm", [4] + [size] * 3)):
        problem = GemmProblem.from_config(op, shape, dtype)
        space, variables = _cuda_space(problem, ["triton_bmm" if op == "bmm" else "triton_mm"], gpu)
        (branch,) = space.branches
        names = {p.key: p.name for p in branch.params}
        props = PROFILES[gpu]
        fits = []
        for c in triton_mm_configs(size, size, size, problem.dtype_bytes):
            need = shared_memory_bytes({"template_id": branch.template_id, **c}, problem.dtype_bytes, size,
                                       (props.major, props.minor))
            assert branch.feasible({names[k]: c[k] for k in names if k in c}, variables) == (
                need + 128 <= props.smem_bytes), (op, c, need)
            fits.append(need + 128 <= props.smem_bytes)
        assert any(fits)
    if (gpu, dtype) == ("A100", "bfloat16"):  # Inductor's own, left out before
        for c in ({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_stages": 4, "num_warps": 4},
                  {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 4, "num_warps": 8}):
            assert branch.feasible({**c, "GROUP_M": 8}, variables), c


def test_the_persistent_tma_space_keeps_inductors_own_configs_for_small_gemms():
    """A helper's (session 52): Inductor scales its persistent TMA configs down to a small GEMM's size
    (16x128x128 for M = 8, K = 96; 32x64x64 for M = 32, K = 48 on an H100); the space started its tiles at 64
    and bounded BLOCK_K by K, so none of them was in it. Tiles under 64 are in it only for such a GEMM."""
    from zhantune.inductor.simulate import problem_inputs
    from zhantune.problems import GemmProblem

    patch = {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON",
             "triton.enable_persistent_tma_matmul": True}
    for shape in ([8, 96, 96], [32, 64, 48], [4096, 4096, 4096]):
        problem = GemmProblem.from_config("mm", shape, "bfloat16")
        space, variables = _cuda_space(problem, ["triton_persistent_tma"])
        (branch,) = space.branches
        with fake_cuda(), inductor_config.patch(patch):
            own = [c.params.to_kwargs() for c in lower("mm", *problem_inputs(problem, "mm")[:1], torch.bfloat16).choices
                   if c.template.uid == "triton::mm_persistent_tma"]
        names = {p.key: p.name for p in branch.params}
        assert own and all(branch.feasible({names[k]: c[k] for k in names}, variables) for c in own), (shape, own)
        small = [v for v in branch.all_values() if branch.feasible(v, variables) and min(v["BLOCK_M"], v["BLOCK_N"]) < 64]
        assert bool(small) == (shape[0] < 64), shape


@pytest.mark.parametrize("op, inputs", [("mm", [(32, 16), (16, 64)]), ("addmm", [(64,), (32, 16), (16, 64)]),
                                        ("bmm", [(2, 32, 16), (2, 16, 64)])])
def test_an_aten_template_winner_is_recognised_as_the_defaults_own_kernel(op, inputs):
    """Finding 9: Inductor's default compile (no max-autotune) runs exactly one choice, its ATen
    kernel; an aten::<op> winner on CUDA is that kernel, so its "speedup" over the default is noise
    and is never claimed (the CPU ``aten`` config was the only one recognised)."""
    from zhantune.bench.settle import is_default_kernel as _is_default_kernel
    from zhantune.storage import orm as orm

    with fake_cuda(), inductor_config.patch(max_autotune=False):
        default = lower(op, inputs, torch.bfloat16)
    (uid,) = default.uids
    assert _is_default_kernel(orm.MeasurementRow(template_id=uid, params={}))
    assert not _is_default_kernel(orm.MeasurementRow(template_id="triton::mm", params=TRITON_PARAMS))
    assert not _is_default_kernel(orm.MeasurementRow(template_id="aten::bias_addmm", params={}))
    # the tf32 space's "off" point is the default compile too (torch's default), "on" is not
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert _is_default_kernel(orm.MeasurementRow(template_id=None, params={"cuda.matmul.allow_tf32": False}))
    assert not _is_default_kernel(orm.MeasurementRow(template_id=None, params={"cuda.matmul.allow_tf32": True}))
    # CPU: ATen alone is the default compile whatever C++-template knobs ride along (a custom space's
    # {ATEN, k_slices=2} got paired rounds against itself), and so are C++ knobs without a backend list (an
    # attack: {k_slices=2} compiles ATen under use_table and was paired against it); CPP in the list, a
    # fusion limit, or no params at all (on CUDA: max-autotune with Triton's templates; a review) is not
    for params, default in (({"max_autotune_gemm_backends": "ATEN"}, True),
                            ({"max_autotune_gemm_backends": "aten", "cpp.gemm_max_k_slices": 2}, True),
                            ({"max_autotune_gemm_backends": "ATEN, aten"}, True),  # a review's: was settled as a speedup
                            ({"max_autotune_gemm_backends": "ATEN,CPP"}, False),
                            ({"max_autotune_gemm_backends": "ATEN", "epilogue_fusion": False}, False),
                            ({}, False), ({"cpp.gemm_max_k_slices": 2}, True), ({"epilogue_fusion": False}, False)):
        assert _is_default_kernel(orm.MeasurementRow(template_id=None, params=params)) is default, params


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) rounded to TF32: 10 explicit mantissa bits, round to nearest even (the low 13
    of float32's 23 bits dropped). Hardware that truncates instead gives about 8e-4 at K=4096, still
    within TF32_TOLERANCE."""
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


def test_a_tf32_candidate_is_checked_against_tf32s_own_tolerance(monkeypatch):
    """Finding 8: a float32 GEMM under ``cuda.matmul.allow_tf32`` rounds its inputs to TF32; checked
    against float32's 1e-4 it is always "incorrect", so tf32 could never win. The error here is the
    TF32 GEMM's (inputs rounded to TF32, float32 accumulation) on the
    problem's own inputs at K=4096, against its float64 reference."""
    from zhantune.bench.inductor import InductorBenchmarker, relative_error
    from zhantune.bench.measurement import TF32_TOLERANCE, TOLERANCES, tolerance
    from zhantune.config import BenchConfig
    from zhantune.device import DeviceInfo, resolve_device
    from zhantune.problems import GemmProblem

    problem = GemmProblem.from_config("mm", [64, 64, 4096], "float32")
    module, (x,) = problem.build(torch.device("cpu"))
    reference = problem.reference(module, (x,))
    emulated = _tf32(x) @ _tf32(module.weight.detach())
    error = relative_error(emulated, reference)
    assert TOLERANCES["float32"] < error <= TF32_TOLERANCE, error
    assert relative_error(x @ module.weight.detach(), reference) <= TOLERANCES["float32"]
    on, off = {"cuda.matmul.allow_tf32": True}, {"cuda.matmul.allow_tf32": False}
    assert tolerance("float32", on) == TF32_TOLERANCE and tolerance("float32", off) == TOLERANCES["float32"]
    assert tolerance("bfloat16", on) == TOLERANCES["bfloat16"]  # TF32 changes float32 GEMMs only

    # the benchmarker checks a backend candidate's output against that tolerance
    bench = InductorBenchmarker(GemmProblem.from_config("mm", [8, 8, 8], "float32"), resolve_device("cpu"),
                                BenchConfig(warmup_ms=1, target_ms=2))
    bench.device = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", {})
    seen = {}
    monkeypatch.setattr(bench, "_run", lambda *a, **kw: seen.update(kw))
    bench.measure(Candidate("tf32", "backend", None, on))
    assert seen["tol"] == TF32_TOLERANCE


def test_cuda_graph_timings_are_batch_means_and_ties_compare_per_run_spreads(monkeypatch):
    """Finding 13: ``do_bench_cudagraph(return_mode="all")`` returns ten replay means of N unrolled
    calls, not per-run times, so its 20th-80th percentile range is about sqrt(N) times narrower than
    a per-run range and a close call on CUDA would almost never be a tie. time_cuda records N, and
    is_tie widens such ranges back to one run's spread. Triton's own functions are called here with
    a stand-in ``fn`` whose CUDA events report known times (no GPU)."""
    import random
    import statistics

    import triton.testing

    from zhantune.bench.timing import Timing, is_tie, run_range_us, runs_per_sample, summarize_us, time_cuda

    # Triton's do_bench_cudagraph, run as is: its events and graph stand in for a GPU whose call
    # takes 20 us, the graph replaying N of them
    rng = random.Random(0)
    per_call_ms, state = 0.02, {"n": 0, "calls": 0}

    class Event:
        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self):
            self.t = state["calls"] * per_call_ms

        def elapsed_time(self, other):
            return other.t - self.t

    class Graph:
        def replay(self):
            state["calls"] += state["n"]

    class Capture:
        def __init__(self, g):
            pass

        def __enter__(self):
            state["capturing"] = True
            state.setdefault("calls_before_capture", state["calls"])

        def __exit__(self, *exc):
            state["capturing"] = False

    def fn():
        if state.get("capturing"):
            state["n"] += 1
        else:
            state["calls"] += 1

    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: bool(state.get("capturing")))
    monkeypatch.setattr(triton.testing, "cuda_graph_without_gc", Capture)
    t = time_cuda(fn, warmup_ms=25.0, target_ms=10.0)
    assert runs_per_sample(t.method) == state["n"] == 500 and t.n == 10
    assert t.median_us == pytest.approx(20.0)
    # warmup_ms of calls before the graph is captured (Triton's function makes only a handful)
    assert state["calls_before_capture"] * per_call_ms >= 25.0

    # the spread: per-run times ~ N(100, 5) us; samples that are means of 400 runs spread 20x less,
    # and run_range_us gives back the per-run 20th-80th percentile range
    runs = [rng.gauss(100.0, 5.0) for _ in range(400 * 2000)]
    means = [statistics.fmean(runs[i:i + 400]) for i in range(0, len(runs), 400)]
    per_run = summarize_us(runs[:20000], "cpu")
    batched = summarize_us(means, "cuda:triton.do_bench_cudagraph:batch=400")
    width = per_run.p80_us - per_run.p20_us
    lo, hi = run_range_us(batched)
    assert batched.p80_us - batched.p20_us < width / 10
    assert hi - lo == pytest.approx(width, rel=0.15)

    # two configs 2% apart: clearly apart as batch means, within one run's noise per run
    a = Timing(100.0, 99.5, 100.5, 99.9, 100.1, 10, "cuda:triton.do_bench_cudagraph:batch=400")
    b = Timing(102.0, 101.5, 102.5, 101.9, 102.1, 10, "cuda:triton.do_bench_cudagraph:batch=400")
    assert is_tie(a, b)
    assert not is_tie(dataclasses.replace(a, method="cuda:triton.do_bench"),
                      dataclasses.replace(b, method="cuda:triton.do_bench"))


def test_nvml_readings_match_the_cuda_device_by_uuid_and_leave_out_the_tunes_own_processes(monkeypatch):
    """Finding 11: NVML numbers every GPU of the machine, CUDA only the visible ones: with
    CUDA_VISIBLE_DEVICES=3, CUDA device 0 is NVML device 3, and reading NVML's device 0 reads another
    GPU. And the tune's own processes (this one, its parent, their children: the timing and compile
    workers hold CUDA contexts) are not "other processes", else every row is contended. NVML is a
    stand-in module here (no GPU); the process ids are real."""
    import subprocess
    import sys
    import types

    from zhantune.bench.conditions import conditions, is_contended, own_pids, wait_until_idle

    # a worker of the tune (this process) and a compile sidecar below it: both the tune's own
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                              "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())  # started: no deadline for a busy machine to miss
        assert Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split() == [str(grandchild)]
        visible = {"uuid": "GPU-" + "5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60", "index": 3}
        others = [{"uuid": f"GPU-other-{i}", "index": i} for i in range(3)]
        procs = {"GPU-5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60": [os.getpid(), child.pid, grandchild],
                 "GPU-other-0": [1]}
        nvml = types.ModuleType("pynvml")
        nvml.NVMLError = type("NVMLError", (Exception,), {})
        nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
        nvml.nvmlInit = lambda: None
        nvml.nvmlDeviceGetHandleByIndex = lambda i: {3: visible, 0: others[0], 1: others[1], 2: others[2]}[i]
        nvml.nvmlDeviceGetHandleByUUID = lambda u: next(h for h in [visible] + others if h["uuid"] == u)
        nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=p) for p in procs.get(h["uuid"], [])]
        nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1980 if kind == 1 else 2619
        nvml.nvmlDeviceGetTemperature = lambda h, kind: 41
        nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0)
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
        monkeypatch.delenv("ZHANTUNE_TUNE_PID", raising=False)
        with fake_cuda():
            assert {child.pid, grandchild} <= own_pids()
            seen = conditions("cuda", 0)
            assert seen["gpu"]["other_processes"] == 0 and seen["gpu"]["sm_clock_mhz"] == 1980
            assert not is_contended({**seen, "load_avg_1m": 0.0, "others_running": 0})
            assert wait_until_idle(0.05, "cuda", 0)["busy_at_start"] is False
            procs["GPU-5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60"].append(1)  # another user's job arrives
            assert conditions("cuda", 0)["gpu"]["other_processes"] == 1
            assert wait_until_idle(0.05, "cuda", 0)["busy_at_start"] is True
            # inside a container NVML reports the host's pids, none of them ours: unknown, not "busy"
            procs["GPU-5f3a61b2-8d2e-4c1b-9a7e-0c3d2b1a4f60"] = [4000001, 4000002]
            assert conditions("cuda", 0)["gpu"]["other_processes"] is None
            # a CUDA row is contended by the GPU's state only (CPU load does not change kernel time)
            assert not is_contended({"load_avg_1m": 9.0, "cores": 2, "others_running": 5, "gpu": {"other_processes": 0}})
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        if grandchild:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, 9)


def _triton_shared_bytes(op: str, size: int, entries: list[dict] | None, capability: int = 90,
                        dtype: torch.dtype = torch.bfloat16, kernels: str = "persistent_tma") -> dict[tuple[int, ...], int]:
    """Shared memory (bytes) that Triton's own compiler gives each Triton kernel Inductor renders for
    ``op`` on ``dtype`` ``size``^3 on a fake H100 whose choice name holds ``kernels``: compiled for
    sm_``capability`` without a GPU (Triton ships ptxas), ``metadata.shared``, the number Triton
    checks against the device's limit when it loads the kernel (triton/compiler/compiler.py,
    OutOfResources). ``entries``: lookup entries to render (Inductor builds one choice per entry);
    None: Inductor's own heuristic configs. Keyed by (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)."""
    import importlib.util

    import torch.utils._triton as triton_utils
    import triton
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.kernel import mm
    from torch._inductor.virtualized import V
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    shapes = {"mm": [(size, size), (size, size)], "addmm": [(size,), (size, size), (size, size)]}[op]
    choices: list = []
    patch = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON", "force_disable_caches": True,
             "triton.enable_persistent_tma_matmul": True}
    handler = recording(any_key=entries) if entries is not None else contextlib.nullcontext()
    with fake_cuda(), inductor_config.patch(patch), handler, \
            mock.patch.object(triton_utils, "triton_backend", lambda: backend):
        graph = GraphLowering(torch.fx.symbolic_trace(torch.nn.Identity()))
        with V.set_graph_handler(graph):
            nodes = []
            for i, shape in enumerate(shapes):
                layout = ir.FixedLayout(torch.device("cuda", 0), dtype, list(shape),
                                        list(torch.empty(shape, device="meta").stride()))
                graph.graph_inputs[f"arg{i}"] = ir.TensorBox.create(ir.InputBuffer(name=f"arg{i}", layout=layout))
                nodes.append(graph.graph_inputs[f"arg{i}"])

            def select(name, offered, *args, **kwargs):
                choices.extend(offered)
                return nodes[-1], None

            with mock.patch.object(mm, "autotune_select_algorithm", select):
                {"mm": mm.tuned_mm, "addmm": mm.tuned_addmm}[op](*nodes)
    shared = {}
    for choice in choices:
        req = getattr(choice, "bmreq", None)
        if req is None or kernels not in choice.name:
            continue
        spec = importlib.util.spec_from_file_location("rendered", req.module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = next(v for v in vars(module).values() if hasattr(v, "fn") and hasattr(v, "triton_meta"))
        meta = kernel.triton_meta
        compiled = triton.compile(ASTSource(kernel.fn, meta["signature"], meta.get("constants", {}), meta["configs"][0]),
                                  target=target, options={"num_warps": req.num_warps, "num_stages": req.num_stages})
        source = open(req.module_path).read()
        blocks = (int(re.search(rf"{name} : tl.constexpr = (\d+)", source).group(1)) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        shared[(*blocks, req.num_stages, req.num_warps)] = int(compiled.metadata.shared)
    return shared


@pytest.mark.slow
@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_the_persistent_tma_space_keeps_exactly_the_configs_whose_kernels_fit_shared_memory(op):
    """Finding 3, the shared-memory bound, checked against Triton's compiler rather than an estimate:
    Inductor's persistent TMA kernels for an H100, compiled for sm_90, use the pipelined A and B
    tiles (times num_stages) and a few barrier bytes; the epilogue's layout conversion reuses that
    buffer (the tile loop is not pipelined across tiles), so it adds nothing. The space kept an
    extra BLOCK_M x BLOCK_N epilogue tile (Inductor's own estimate, used only under
    max_autotune_prune_choices_based_on_shared_mem, "will over-prune"), which dropped 1 (mm) and 4
    (addmm) of Inductor's own 8 default configs. Every default config is kept, and on the configs
    compiled here the space keeps exactly those that fit."""
    from zhantune.problems import GemmProblem

    problem = GemmProblem.from_config(op, [1024, 1024, 1024], "bfloat16")
    space, variables = _cuda_space(problem, ["triton_persistent_tma"])
    (branch,) = space.branches
    smem = variables["smem_bytes"]
    # two points at the limit's edge: fits (256,128,64,4), does not (256,128,128,3; 64,256,128,4)
    edges = [(256, 128, 64, 4, 8), (256, 128, 128, 3, 8), (64, 256, 128, 4, 4)]
    entries = [{"template_id": "triton::mm_persistent_tma", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k,
                "num_stages": st, "num_warps": w, "GROUP_M": 8} for m, n, k, st, w in edges]
    own = _triton_shared_bytes(op, 1024, None)
    assert len(own) >= 4, own  # Inductor's heuristic configs for this template
    measured = {**own, **_triton_shared_bytes(op, 1024, entries)}
    assert set(edges) <= set(measured), measured
    for (m, n, k, stages, warps), shared in measured.items():
        point = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_stages": stages, "num_warps": warps, "GROUP_M": 8}
        assert branch.feasible(point, variables) == (shared <= smem), (point, shared, smem)
    assert all(shared <= smem for shared in own.values()), own
    for (m, n, k, stages, _warps), shared in measured.items():  # use_table's bound (shared_memory_short)
        entry = {"template_id": "triton::mm_persistent_tma", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_stages": stages}
        assert shared_memory_bytes(entry, 2, 1024, (9, 0)) <= shared, (entry, shared)


@pytest.mark.slow
def test_the_persistent_tma_bound_counts_a_buffer_fewer_without_hopper_warpgroup_mma():
    """A review (session 52), compiled for sm_90: Inductor's persistent TMA kernels in float32, and in
    bfloat16 with BLOCK_M < 64 or 2 warps, get num_stages - 1 buffers of the A and B tiles; the bound
    counted num_stages, so use_table called such an entry that fits stale, and the space left out
    Inductor's own float32 configs that fit (128x64x64 in 5 stages: 196,640 bytes of the 232,448).
    The bound is now Triton's to within its barrier bytes (tiles under 64 are in the space only for a
    GEMM that small: the space is checked on the others)."""
    from zhantune.problems import GemmProblem

    for dtype, points in ((torch.float32, [(128, 64, 64, 5, 4), (128, 128, 32, 4, 8), (128, 32, 128, 3, 8)]),
                          (torch.bfloat16, [(32, 64, 64, 3, 4), (64, 64, 64, 3, 2), (64, 32, 64, 4, 4)])):
        entries = [{"template_id": "triton::mm_persistent_tma", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k,
                    "num_stages": st, "num_warps": w, "GROUP_M": 8} for m, n, k, st, w in points]
        measured = _triton_shared_bytes("mm", 1024, entries, 90, dtype)
        assert set(measured) == set(points), measured
        space, variables = _cuda_space(GemmProblem.from_config("mm", [1024] * 3, str(dtype).removeprefix("torch.")),
                                       ["triton_persistent_tma"])
        (branch,) = space.branches
        for entry, point in zip(entries, points, strict=True):
            bound = shared_memory_bytes(entry, dtype.itemsize, 1024, (9, 0))
            assert bound <= measured[point] <= bound + 128, (entry, bound, measured[point])
            values = {k: entry[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps", "GROUP_M")}
            assert min(point[:2]) < 64 or branch.feasible(values, variables) == (
                measured[point] <= variables["smem_bytes"]), entry


@pytest.mark.slow
@pytest.mark.parametrize("capability, dtype", [(80, torch.bfloat16), (90, torch.bfloat16), (80, torch.float32),
                                               (90, torch.float32)])
def test_use_tables_shared_memory_bound_is_what_triton_gives_the_kernel(capability, dtype):
    """The bound use_table refuses an entry by (session 40, shared_memory_bytes) must never refuse a
    kernel that runs: Triton's compiler, for sm_80 (pipelined with num_stages - 1 buffers) and sm_90
    (num_stages with Hopper's warpgroup MMA: 16-bit, BLOCK_M >= 64, a multiple of 4 warps; else one
    fewer), gives each of these Inductor triton::mm kernels exactly the bound."""
    points = [(64, 64, 32, 1, 4), (64, 64, 32, 3, 4), (128, 128, 64, 4, 8), (32, 32, 16, 5, 2), (64, 64, 32, 3, 2),
              (32, 64, 32, 3, 4), (64, 16, 32, 3, 4)]
    entries = [{"template_id": "triton::mm", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_stages": st,
                "num_warps": w, "GROUP_M": 8} for m, n, k, st, w in points]
    measured = _triton_shared_bytes("mm", 1024, entries, capability, dtype, kernels="triton_mm")
    assert set(measured) == set(points), measured
    for entry in entries:
        point = tuple(entry[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps"))
        bound = shared_memory_bytes(entry, dtype.itemsize, 1024, divmod(capability, 10))
        assert bound == measured[point], (capability, entry, bound, measured[point])
    # K = BLOCK_K: a single iteration, which Triton does not pipeline: one buffer, whatever num_stages
    single = dict(entries[2], BLOCK_K=64)
    (shared,) = _triton_shared_bytes("mm", 64, [single], capability, dtype, kernels="triton_mm").values()
    assert shared_memory_bytes(single, dtype.itemsize, 64, divmod(capability, 10)) == shared, (capability, shared)


@pytest.mark.parametrize("gpu, template_id, blocks, k, served", [
    ("A100", "triton::mm", (256, 128, 128, 3), 1024, ["aten::mm"]),  # at least 196,608 bytes > 166,912
    ("H100", "triton::mm", (128, 128, 64, 4), 1024, ["triton::mm"]),  # 131,072 < 232,448
    # sm_90 with bfloat16, BLOCK_M >= 64, 4 warps: num_stages buffers, 294,912 (a review: it was served)
    ("H100", "triton::mm", (256, 128, 128, 3), 1024, ["aten::mm"]),
    ("H100", "triton::mm_persistent_tma", (256, 128, 128, 3), 1024, ["aten::mm"]),  # 3 buffers: 294,912
    ("H100", "triton::mm_persistent_tma", (256, 128, 64, 4), 1024, ["triton::mm_persistent_tma"]),  # 196,608
    # K = BLOCK_K: one iteration, one buffer (98,304; a review found Triton does not pipeline it)
    ("A100", "triton::mm", (256, 128, 128, 4), 128, ["triton::mm"]),
    # the persistent kernel pipelines across tiles, K = BLOCK_K or not: 294,912 (a second review: served)
    ("H100", "triton::mm_persistent_tma", (256, 128, 128, 3), 128, ["aten::mm"]),
    # num_stages 0 pipelines nothing, one buffer: 262,144 > 166,912 (a fuzz: it skipped the check)
    ("A100", "triton::mm", (128, 128, 512, 0), 1024, ["aten::mm"]),
])
def test_an_entry_too_big_for_the_gpus_shared_memory_compiles_the_default_and_says_why(gpu, template_id, blocks, k,
                                                                                       served):
    """Tables are data (session 40): an entry whose tiles cannot fit the GPU's shared memory (a forged
    table, or one for another GPU under a device-agnostic key) was served as a hit, and the user's
    compile would fail when Triton refused to launch the kernel. Now it is stale with the reason."""
    from zhantune.inductor.runtime import use_table

    bm, bn, bk, stages = blocks
    shapes = [(1024, k), (k, 1024)]
    with fake_cuda(PROFILES[gpu].properties()):
        with recording() as rec:
            lower("mm", shapes, torch.bfloat16)
        key = rec.events[-1].agnostic_key
        entry = {"template_id": template_id, **TRITON_PARAMS, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                 "num_stages": stages, "num_warps": 8}
        with use_table({key: [entry]}, device="cuda") as installed:
            got = lower("mm", shapes, torch.bfloat16)
    assert got.uids == served
    if served == [template_id]:
        assert installed.report.hits == {key: 1} and not installed.report.stale
    else:
        need = shared_memory_bytes(entry, 2, k, (PROFILES[gpu].major, PROFILES[gpu].minor))
        assert installed.report.stale == {key: SHARED_MEMORY.format(
            tid=template_id, bm=bm, bn=bn, bk=bk, stages=stages, need=need, dtype="bfloat16",
            have=PROFILES[gpu].smem_bytes)}, installed.report.stale
        assert not installed.report.hits


def test_an_entry_that_leaves_kwargs_out_is_checked_as_inductor_merges_it():
    """A fuzz of CUDA entries (session 40): Inductor merges an entry over its template's first
    heuristic config (torch/_inductor/lookup_table/choices.py), so ``{"BLOCK_K": 1024, "num_stages": 4}``
    compiled that config's tiles with a 1024 BLOCK_K, past an A100's shared memory, unchecked. The
    merged kwargs are checked now; a partial entry that fits is served as before."""
    from zhantune.inductor.runtime import use_table

    shapes = [(4096, 4096), (4096, 4096)]
    with fake_cuda(PROFILES["A100"].properties()):
        with recording() as rec:
            lower("mm", shapes, torch.bfloat16)
        key = rec.events[-1].agnostic_key
        for entry, served in (({"template_id": "triton::mm", "BLOCK_K": 1024, "num_stages": 4}, ["aten::mm"]),
                              ({"template_id": "triton::mm", "BLOCK_K": 32, "num_stages": 3}, ["triton::mm"])):
            with use_table({key: [entry]}, device="cuda") as installed:
                got = lower("mm", shapes, torch.bfloat16)
            assert got.uids == served
            if served == ["aten::mm"]:
                (why,) = installed.report.stale.values()
                assert why.startswith("triton::mm with BLOCK_M=") and "num_stages=4 needs at least" in why, why
                assert why.endswith("(the entry merged over Inductor's first config for what it leaves out); "
                                    "Inductor's default compiled"), why
                assert got.uids == ["aten::mm"] and not installed.report.hits
            else:
                assert installed.report.hits == {key: 1} and got.kwargs()["BLOCK_K"] == 32
        # no heuristic config to merge over: Inductor would skip the template and have no choice at all
        from zhantune.inductor.table_choices import TableChoices

        real = TableChoices.get_ktc

        def no_triton_config(self, kernel_inputs, template, op_name, *args, **kwargs):
            return iter(()) if template.uid.startswith("triton::") else real(self, kernel_inputs, template, op_name,
                                                                              *args, **kwargs)

        with mock.patch.object(TableChoices, "get_ktc", no_triton_config), \
                use_table({key: [{"template_id": "triton::mm", "BLOCK_K": 32}]}, device="cuda") as installed:
            got = lower("mm", shapes, torch.bfloat16)
        assert got.uids == ["aten::mm"] and not installed.report.hits
        assert installed.report.stale == {key: "triton::mm: Inductor's heuristic has no config of it for this GEMM to "
                                               "merge the entry over; Inductor's default compiled"}


@pytest.mark.parametrize("rounds", [[(100.0, 97.0), (101.0, 97.5), (100.5, 97.2)],  # 1.03x
                                    [(202.80, 201.07), (203.28, 201.17), (200.65, 198.74)]])  # 1.010x
def test_a_finished_studys_claim_names_its_config_where_the_best_is_one_no_table_carries(tmp_path, rounds):
    """A claims audit (session 40): a finished study's rerun printed its best config (on CUDA
    linear_act's fastest may be an Inductor ``fusion`` setting no table carries), then the stored
    claim, which is about the best config a table carries, as if it were the best's; a claim below
    export.min_speedup read "confirmed" with no word that the table ships the default. The problems
    table put that claim beside the best's time the same way."""
    from types import SimpleNamespace

    from rich.console import Console

    from zhantune.app import print_finished
    from zhantune.bench.decision import Round, judge_speedup
    from zhantune.config import ExportConfig
    from zhantune.report.problems import claim_cell

    v = judge_speedup([Round(d, w) for d, w in rounds])
    assert v.confirmed
    fusion = SimpleNamespace(branch="fusion", template_id=None, params={"epilogue_fusion": False}, min_us=90.0,
                             median_us=91.0, timing_method="cuda:t", id=3, config_hash="f" * 16)
    tuned = SimpleNamespace(branch="triton_mm", template_id="triton::mm", params={"BLOCK_M": 64}, min_us=97.0,
                            median_us=98.0, timing_method="cuda:t", id=2, config_hash="t" * 16)
    opts = ExportConfig(path=str(tmp_path / "t.json"))
    for best in (fusion, tuned):
        result = SimpleNamespace(exhausted=False, before=4, target=4, study_name="s", best=best, claimed=tuned, claim=v,
                                 settle_deferred=None, same_kernel_as_default=False, shipped=None)
        console = Console(record=True, width=400)
        print_finished(console, result, opts)
        text = console.export_text()
        assert f"best config: {best.template_id or best.branch}" in text
        of = " of triton::mm BLOCK_M=64 (the best config a table carries)" if best is fusion else ""
        assert f"speedup vs default{of}, its stored paired rounds: confirmed {v.claim_text()}" in text, text
        below = v.ratio < opts.min_speedup
        assert ("below export.min_speedup (1.02): an exported table ships Inductor's default" in text) == below
        cell = claim_cell(result, opts)
        assert cell.endswith(" (of the best a table carries)") == (best is fusion), cell
        assert cell.startswith(f"{v.ratio:.3f}x (< min_speedup)" if below else f"{v.ratio:.2f}x"), cell


def _h100_bf16_mm_study(tmp_path):
    """A store with one study of mm 64^3 bfloat16 on an H100: (device key, Inductor's agnostic key,
    store, study id, a Recorder for it)."""
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

    dev = "NVIDIA H100 80GB HBM3"
    key = "((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    store = Store(f"sqlite:///{tmp_path}/z.db")
    problem = GemmProblem("mm", (64, 64, 64), "bfloat16")
    study_id = store.study_id("s", {})
    rec = Recorder(store, problem, study_id, store.device_id(dev, dev, "cuda", {}),
                   store.problem_id(problem.key, lookup_key=key, **problem.row_fields()))
    return dev, key, store, study_id, rec


def test_a_config_branch_winner_on_cuda_is_never_shipped_as_if_it_applied(tmp_path):
    """Finding 7: a fusion-limit (config branch) winner on CUDA was exported as a ``zhantune::config``
    entry that neither Inductor's handler nor zhantune's applies on CUDA (fusion limits are
    compile-wide): the table claimed a win it could not deliver. Such a row is not carried: the
    export ships Inductor's default (the carried runner-up was never paired against the default),
    the summary says why, and an old table's config entry on CUDA is reported stale, not a miss."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table, not_carried_reason
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import CONFIG_ENTRY_ON_CUDA, CONFIG_TEMPLATE_ID

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    default = LookupEvent("mm", f"{dev}+{key}", key, {"aten::mm": None}, ())
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=default), "default")
    fusion = Candidate("fusion", "config", None, {"max_fusion_size": 8, "epilogue_fusion": False})
    tf32 = Candidate("tf32", "backend", None, {"cuda.matmul.allow_tf32": True})
    triton = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rows = [rec.add(Measurement("ok", timing=summarize_us([t, t + 1], "t"), lookup=e), "candidate", c, trial_number=i)
            for i, (c, t, e) in enumerate([(fusion, 10.0, default), (tf32, 11.0, default), (triton, 12.0, hit)])]
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=fusion.config_hash, ratio=2.0, ratio_low=1.9, ratio_high=2.1, rounds=3,
                      contended=0, confirmed=True, reason="confirmed in every round")

    assert build_table(store, min_speedup=1.0) == {f"{dev}+{key}": [{"template_id": "aten::mm"}]}  # the default
    # without the speedup check (min_speedup=null: always the tuned entry) the best carried entry
    (entries,) = build_table(store, min_speedup=None).values()
    assert [e["template_id"] for e in entries] == ["triton::mm"]
    assert not_carried_reason(rows[0], "cuda") == CONFIG_ENTRY_ON_CUDA
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in not_carried_reason(rows[1], "cuda")
    assert not_carried_reason(rows[2], "cuda") is None
    # nor on CPU: a CPU entry's knobs hold while its GEMM is lowered, the fusion limits are read later
    assert "schedules the whole graph" in not_carried_reason(rows[0], "cpu")

    old = {f"{dev}+{key}": [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": fusion.params}]}
    with fake_cuda(), use_table(old, device="cuda") as installed:
        served = lower("mm", [(64, 64), (64, 64)], torch.bfloat16)
    assert served.uids == ["aten::mm"]
    assert installed.report.stale == {f"{dev}+{key}": CONFIG_ENTRY_ON_CUDA} and not installed.report.misses


def test_an_exported_table_under_stock_inductors_handler_and_under_use_table(tmp_path):
    """Finding 6: stock Inductor (its own LookupTableChoices, max-autotune, the exported bare table in
    ``lookup_table.table``) reads ``[]`` as a miss. Each kind of key, exported by build_table from
    measured rows, lowered by the real mm/addmm lowerings with both handlers: mm keys compile exactly
    their entry under both; for addmm, use_table compiles exactly the entry while stock Inductor keeps
    ATen's addmm beside a template entry, and tries its own Triton configs beside a default entry,
    as stock_inductor_notes says (the export prints those notes for format=inductor)."""
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.stock import stock_inductor_notes
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

    dev = "NVIDIA H100 80GB HBM3"
    store = Store(f"sqlite:///{tmp_path}/z.db")
    study_id = store.study_id("s", {})
    device_id = store.device_id(dev, dev, "cuda", {})
    cases = {  # problem -> (inputs of the lowering, the winner: a Triton config or Inductor's ATen kernel)
        ("mm", (32, 64, 48)): ([(32, 48), (48, 64)], "triton::mm"),
        ("addmm", (32, 64, 48)): ([(64,), (32, 48), (48, 64)], "triton::mm"),
        ("addmm", (16, 64, 48)): ([(64,), (16, 48), (48, 64)], "aten::addmm"),
    }
    with fake_cuda():
        for trial, ((op, shape), (inputs, winner)) in enumerate(cases.items()):
            problem = GemmProblem(op, shape, "bfloat16")
            with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"), \
                    recording() as rec:
                lower(op, inputs, torch.bfloat16)
            own = next(e for e in rec.events if e.offered)  # the problem's own (ATen) lookup
            hit = next(e for e in rec.events if winner in e.template_hashes)
            rec_ = Recorder(store, problem, study_id, device_id,
                            store.problem_id(problem.key, lookup_key=own.agnostic_key, **problem.row_fields()))
            rec_.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=own), "default")
            params = {} if winner.startswith("aten::") else TRITON_PARAMS
            cand = Candidate("b", "template", winner, params)
            rec_.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t"), lookup=dataclasses.replace(
                hit, hit_templates=(winner,))), "candidate", cand, trial_number=trial)
        table = build_table(store, min_speedup=None)
        assert sum(1 for entries in table.values() if entries == []) == 1  # the addmm template winner's ATen key

        def lowered(op, inputs, stock):
            if stock:
                with inductor_config.patch({"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                                            "lookup_table.table": table}), V.set_choices_handler(LookupTableChoices()):
                    return lower(op, inputs, torch.bfloat16)
            with use_table(table, device="cuda") as installed:
                got = lower(op, inputs, torch.bfloat16)
            # every GEMM's own lookup hits; addmm's secondary passes (expanded-bias templates under a
            # default entry, the contiguous rewrite) are no misses
            assert not installed.report.misses and not installed.report.stale and installed.report.hits
            return got

        for (op, shape), (inputs, winner) in cases.items():
            mine, stock = lowered(op, inputs, False), lowered(op, inputs, True)
            assert mine.uids == [winner], (op, shape)
            if winner == "triton::mm":
                assert all(mine.kwargs()[k] == v for k, v in TRITON_PARAMS.items())
                ks = next(i for i, u in enumerate(stock.uids) if u == "triton::mm")
                assert stock.kwargs(ks)["EVEN_K"] == (shape[2] % TRITON_PARAMS["BLOCK_K"] == 0)
            if op == "mm":
                assert stock.uids == [winner]
            elif winner == "triton::mm":
                assert sorted(stock.uids) == ["aten::addmm", "triton::mm"]
            else:
                assert stock.uids[0] == "aten::addmm" and stock.uids.count("triton::mm") > 1
    notes = stock_inductor_notes(table)
    assert len(notes) == 3 and notes[0].startswith("1 addmm template key(s)") and notes[1].startswith("1 addmm default")
    assert notes[2].startswith("2 mm/addmm key(s) with a template entry: stock Inductor reads them only under max-autotune")


def test_stock_inductor_compiles_a_float32_entry_as_tf32_where_the_process_allows_it_and_the_export_says_so():
    """A review's finding: Inductor's key holds no precision. Stock Inductor reads ALLOW_TF32 from
    torch.backends.cuda.matmul.fp32_precision when it lowers, so a float32 key's Triton entry (measured
    without TF32) compiles as a TF32 kernel no measurement covered in a process with TF32 on; the
    export's notes for format=inductor say so (README said such keys "compile exactly their entry").
    use_table compiles Inductor's default there instead (stale)."""
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.stock import stock_inductor_notes

    dev = "NVIDIA H100 80GB HBM3"
    key = f"{dev}+((torch.float32, [256, 512], [512, 1]), (torch.float32, [512, 512], [512, 1]))+mm"
    table = {key: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        with fake_cuda():
            for precision in ("ieee", "tf32"):
                torch.backends.cuda.matmul.fp32_precision = precision
                with inductor_config.patch({"max_autotune_gemm": True, "lookup_table.table": table}), \
                        V.set_choices_handler(LookupTableChoices()):
                    stock = lower("mm", [(256, 512), (512, 512)], torch.float32)
                assert stock.uids == ["triton::mm"], stock.uids
                assert stock.choices[0].extra_kwargs.get("ALLOW_TF32") is (precision == "tf32")
                with use_table(table, device="cuda") as installed:
                    mine = lower("mm", [(256, 512), (512, 512)], torch.float32)
                assert bool(installed.report.stale) is (precision == "tf32"), installed.report
                assert (mine.uids == ["triton::mm"]) is (precision == "ieee"), mine.uids
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    tf32 = [note for note in stock_inductor_notes(table) if "TF32" in note]
    assert len(tf32) == 1 and tf32[0].startswith("1 float32 key(s) with a template entry"), tf32
    assert "fp32_precision 'tf32'" in tf32[0]
    bf16 = {key.replace("float32", "bfloat16"): table[key], key.replace("triton", "x"): [{"template_id": "aten::mm"}]}
    assert not [note for note in stock_inductor_notes(bf16) if "TF32" in note]  # no template entry in float32


@pytest.mark.parametrize("name", ["H100", "MI300X"])
def test_a_cuda_devices_key_is_inductors_own_device_key_and_its_name_the_devices_name(name):
    """A review's finding: nothing tested the device key a tune on a GPU stores (and its table's keys
    start with). It must be what Inductor's lookup computes, props.gcnArchName (on ROCm an arch
    string, not the name; NVIDIA's equals the name), and the device's name is props.name."""
    from torch._inductor.lookup_table import LookupTableChoices

    from zhantune.device import resolve_device
    from zhantune.inductor.simulate import PROFILES

    props = PROFILES[name].properties()
    LookupTableChoices._get_device_key.cache_clear()
    try:
        with fake_cuda(props):
            info = resolve_device("cuda")
            inductors = LookupTableChoices._get_device_key(torch.device("cuda", 0))
    finally:
        LookupTableChoices._get_device_key.cache_clear()
    assert info.kind == "cuda" and info.key == inductors == props.gcnArchName and info.name == props.name
    assert (info.key != info.name) is (name == "MI300X")


def test_stock_inductor_fails_a_bmm_triton_entry_without_max_autotune_and_the_export_says_so():
    """Stock Inductor reads bmm keys without max-autotune too (tuned_bmm offers its template
    regardless); a triton::bmm entry then has no heuristic config to merge over and is dropped, and
    the lowering is left with no choice (the compile fails: NoValidChoicesError). An mm entry is
    not read without max-autotune. The export's notes for format=inductor say so; use_table sets
    max_autotune_gemm and compiles the entry."""
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.stock import stock_inductor_notes

    dev = "NVIDIA H100 80GB HBM3"
    bmm = f"{dev}+((torch.bfloat16, [2, 64, 64], [4096, 64, 1]), (torch.bfloat16, [2, 64, 64], [4096, 64, 1]))+bmm"
    mm = f"{dev}+((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    table = {bmm: [{"template_id": "triton::bmm", **TRITON_PARAMS}], mm: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
    big = f"{dev}+((torch.bfloat16, [256, 256], [256, 1]), (torch.bfloat16, [256, 256], [256, 1]))+mm"
    tma = {big: [{"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}]}
    with fake_cuda():
        # a persistent TMA entry: stock Inductor offers the template only with the flag (use_table sets it)
        for flag in (False, True):
            with inductor_config.patch({"max_autotune_gemm": True, "lookup_table.table": tma,
                                        "triton.enable_persistent_tma_matmul": flag}), \
                    V.set_choices_handler(LookupTableChoices()):
                uids = lower("mm", [(256, 256), (256, 256)], torch.bfloat16).uids
            assert (uids == ["triton::mm_persistent_tma"]) == flag and ("triton::mm" in uids) != flag, uids
        for autotune, bmm_uids, mm_uids in ((False, [], ["aten::mm"]), (True, ["triton::bmm"], ["triton::mm"])):
            with inductor_config.patch({"max_autotune_gemm": autotune, "lookup_table.table": table}), \
                    V.set_choices_handler(LookupTableChoices()):
                assert lower("bmm", [(2, 64, 64), (2, 64, 64)], torch.bfloat16).uids == bmm_uids
                assert lower("mm", [(64, 64), (64, 64)], torch.bfloat16).uids == mm_uids
        with use_table(table, device="cuda"):
            assert lower("bmm", [(2, 64, 64), (2, 64, 64)], torch.bfloat16).uids == ["triton::bmm"]
    note, autotune = stock_inductor_notes(table)
    assert note.startswith("1 bmm key(s) with a Triton entry") and "NoValidChoicesError" in note
    assert autotune.startswith("1 mm/addmm key(s) with a template entry: stock Inductor reads them only under")
    (_, flag) = stock_inductor_notes(tma)
    assert flag.startswith("1 key(s) with a triton::mm_persistent_tma entry") and "enable_persistent_tma_matmul" in flag


DRY_RUN = {  # op -> (shape, dtype, spaces): a size where decomposeK and Triton mm are both offered for mm
    "mm": ("[64,128,4096]", "bfloat16", "[aten_template,triton_mm,triton_persistent_tma,decompose_k,tf32,fusion]"),
    "addmm": ("[256,256,256]", "bfloat16", "[aten_template,triton_mm,triton_persistent_tma,decompose_k]"),
    "bmm": ("[4,128,128,128]", "bfloat16", "[aten_template,triton_bmm]"),
    "linear_act": ("[64,128,256]", "float32", "[aten_template,triton_mm,triton_persistent_tma,tf32]"),
}


@pytest.mark.parametrize("name", ["H100", "H200", "A100", "L4", "MI300X"])
@pytest.mark.parametrize("op", list(DRY_RUN))
def test_the_cuda_dry_run_on_a_gpu_profile(tune_cfg, name, op):
    """Issue 17, "a CUDA dry run without a GPU": ``python -m zhantune.space ... device_profile=NAME``
    shows every branch's size before and after its constraints and whether Inductor's lowering
    (run against the profile) offers its template; a branch Inductor does not offer has no feasible
    point, and one it offers has some. The persistent TMA template needs compute capability 9.0
    and CUDA (H100 and H200 here); decomposeK only mm at K >= 32 * max(M, N); no Triton template
    and no decomposeK on a GPU of fewer than 68 SMs (the L4: every such trial was not applied)."""
    from rich.console import Console

    from zhantune.inductor.simulate import PROFILES
    from zhantune.space import preview

    shape, dtype, spaces = DRY_RUN[op]
    cfg = tune_cfg([f"+op={op}", f"shape={shape}", f"dtype={dtype}", f"device_profile={name}", f"space={spaces}"])
    console = Console(record=True, width=250)
    preview(cfg, console)
    text = console.export_text()
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                          for line in text.splitlines() if line.count("│") == 7)}
    flat = " ".join(text.split())  # the title wraps at the table's width
    assert f"profile {name}: simulated" in flat and repr(PROFILES[name].gcn_arch_name) in flat
    assert ("ROCm" in text) == (name == "MI300X")
    offered = {}
    for branch, (_, scope, template_id, points, feasible, offer) in rows.items():
        assert int(points) >= int(feasible) >= 0
        if scope == "template":
            offered[template_id] = offer
            assert (offer == "yes") == (int(feasible) > 0), (branch, offer, feasible)
        else:
            assert offer == "-"
    lookup_op = "mm" if op == "linear_act" else op  # float32 linear_act: mm on a GPU (finding 2)
    assert offered[f"aten::{lookup_op}"] == "yes"
    hopper = name in ("H100", "H200")
    assert offered.get("triton::mm_persistent_tma", "no") == ("yes" if hopper and op != "bmm" else "no")
    if name == "L4":
        assert {t: offer for t, offer in offered.items() if not t.startswith("aten::")} == dict.fromkeys(
            {"mm": ["triton::mm", "triton::mm_persistent_tma", "decompose_k"], "bmm": ["triton::bmm"]}.get(
                op, ["triton::mm", "triton::mm_persistent_tma"] + (["decompose_k"] if op == "addmm" else [])), "no")
    elif op in ("mm", "addmm"):
        assert offered["triton::mm"] == "yes" and offered["decompose_k"] == ("yes" if op == "mm" else "no")
    if op == "bmm" and name != "L4":
        assert offered["triton::bmm"] == "yes"


def test_a_gemm_inductor_lowers_without_a_selection_offers_no_template(tune_cfg, caplog):
    """A helper's (session 52): Inductor lowers a bmm with M = N = 1 and K <= 32 on CUDA as a multiply and a
    sum, with no GEMM selection and no lookup (torch/_inductor/kernel/bmm.py). The simulated lowering
    raised, so the dry run and the tune's constraints assumed every template offered, with a warning that
    blamed an Inductor change; each Triton trial would have been not applied. Nothing is offered now."""
    from rich.console import Console

    from zhantune.space import preview

    cfg = tune_cfg(["+op=bmm", "shape=[4,1,1,16]", "dtype=bfloat16", "device_profile=H100",
                    "space=[aten_template,triton_bmm]"])
    console = Console(record=True, width=250)
    preview(cfg, console)
    text = console.export_text()
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.count("│") == 7]
    assert {r[2]: (r[4], r[5]) for r in rows if r[1] == "template"} == {"aten::bmm": ("0", "no"),
                                                                      "triton::bmm": ("0", "no")}, text
    assert "makes no GEMM selection" in " ".join(text.split())
    assert "could not run Inductor's lowering" not in caplog.text
    cfg = tune_cfg(["+op=bmm", "shape=[4,2,1,16]", "dtype=bfloat16", "device_profile=H100",
                    "space=[aten_template,triton_bmm]"])  # M = 2: a GEMM selection again
    console = Console(record=True, width=250)
    preview(cfg, console)
    assert "makes no GEMM selection" not in console.export_text()


def test_gpu_check_refuses_a_machine_without_cuda_in_one_line():
    """scripts/gpu_check.py is for a CUDA machine (it has not run on one yet: the README says so);
    here it says so in one line and exits 2, and the program it runs in a fresh process compiles."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "no CUDA device" in r.stderr
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)  # the module only: main() is not called
    compile(namespace["LOAD"], "gpu_check LOAD", "exec")
    assert set(namespace["PROBLEMS"]) == {"mm", "addmm", "bmm", "linear_act"}


def test_compares_portable_table_is_keyed_and_completed_as_the_export_is(tmp_path):
    """compare's ``table=`` (the portable choice per problem, device-agnostic) wrote entries without
    EVEN_K (Inductor then merges the first heuristic config's) and put an addmm template entry under
    the ATen lookup's key, which its template lookup never asks for. It now keys and completes
    entries as build_table does; the lookups are Inductor's own, recorded on two simulated GPUs."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.portable import portable_table
    from zhantune.inductor.simulate import PROFILES
    from zhantune.problems import GemmProblem
    from zhantune.report.regret import compare
    from zhantune.storage import Recorder, Store

    store = Store(f"sqlite:///{tmp_path}/z.db")
    study_id = store.study_id("s", {})
    cases = {"mm": [(64, 48), (48, 64)], "addmm": [(64,), (64, 48), (48, 64)]}
    slow = {**TRITON_PARAMS, "BLOCK_M": 64}
    trial = 0
    for name in ("H100", "A100"):
        prof = PROFILES[name]
        device_id = store.device_id(prof.gcn_arch_name, prof.name, "cuda", {})
        for op, inputs in cases.items():
            problem = GemmProblem(op, (64, 64, 48), "bfloat16")
            with fake_cuda(prof.properties()), recording() as rec, \
                    inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"):
                lower(op, inputs, torch.bfloat16)
            own = next(e for e in rec.events if e.offered)
            hit = next(e for e in rec.events if "triton::mm" in e.template_hashes)
            r = Recorder(store, problem, study_id, device_id,
                         store.problem_id(problem.key, lookup_key=own.agnostic_key, **problem.row_fields()))
            for params, t in ((TRITON_PARAMS, 10.0), (slow, 12.0 if name == "H100" else 9.0)):
                r.add(Measurement("ok", timing=summarize_us([t, t + 1], "t"), lookup=dataclasses.replace(
                    hit, hit_templates=("triton::mm",))), "candidate", Candidate("b", "template", "triton::mm", params),
                    trial_number=trial)
                trial += 1
    table = portable_table(compare(store), store)
    mm_key = "((torch.bfloat16, [64, 48], [48, 1]), (torch.bfloat16, [48, 64], [64, 1]))+mm"
    aten_key = ("((torch.bfloat16, [64], [1]), (torch.bfloat16, [64, 48], [48, 1]), "
                "(torch.bfloat16, [48, 64], [64, 1]))+alpha=1&beta=1+addmm")
    expanded = aten_key.replace("[64], [1]", "[64, 64], [0, 1]")
    assert set(table) == {mm_key, aten_key, expanded} and table[aten_key] == []
    for key in (mm_key, expanded):
        (entry,) = table[key]
        assert entry["template_id"] == "triton::mm" and entry["EVEN_K"] is False  # 48 % 32
        assert entry["BLOCK_M"] in (32, 64)


def test_the_portable_table_ships_a_choice_only_where_it_may_replace_the_default_on_every_device(tmp_path):
    """compare's ``table=`` shipped the portable choice on regret alone, never asking whether it beat
    Inductor's default anywhere. It now applies the export's rule on every compared device: a claim
    confirmed in paired rounds (at least min_speedup); where a device's tunes settled the problem and
    not that config, or no verdict exists (stored times alone, however fast), the problem's key gets
    Inductor's default choice. So does the export's device-agnostic table."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.errors import ConfigError
    from zhantune.inductor.builder import build_table, table_candidates
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.portable import portable_table, unconfirmed_portable
    from zhantune.report.regret import compare
    from zhantune.storage import Recorder

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    other = "NVIDIA A100-SXM4-80GB"
    rec2 = Recorder(store, rec.problem, store.study_id("s2", {}), store.device_id(other, other, "cuda", {}),
                    rec.problem_id)
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    y = Candidate("triton_mm", "template", "triton::mm", {**TRITON_PARAMS, "BLOCK_N": 32})
    for r, d, times in ((rec, dev, (10.0, 12.0, 20.0)), (rec2, other, (10.0, 9.0, 20.0))):  # x, y, default
        hit = LookupEvent("mm", f"{d}+{key}", key, {"triton::mm": None}, ("triton::mm",))
        r.add(Measurement("ok", timing=summarize_us([times[2], times[2] + 1], "t"), lookup=hit), "default")
        for i, c in enumerate((x, y)):
            r.add(Measurement("ok", timing=summarize_us([times[i], times[i] + 1], "t"), lookup=hit), "candidate", c,
                  trial_number=i)

    def verdict(r, c, ratio):
        store.add_verdict(study_id=r.study_id, device_id=r.device_id, problem_id=r.problem_id, config_hash=c.config_hash,
                          ratio=ratio, ratio_low=ratio, ratio_high=ratio, rounds=3, contended=0, confirmed=True,
                          reason="r")

    def shipped(min_speedup=1.02):
        ((entry,),) = portable_table(compare(store), store, min_speedup).values()
        return entry.get("BLOCK_N"), entry["template_id"]

    (p,) = compare(store).problems
    assert p.portable.config_hash == x.config_hash  # worst regret 1.11 (y: 1.2 on the H100)
    # no verdict anywhere (an interrupted tune, a database from before verdicts): 10 us against 20 us
    # by the stored times on both, never paired with the default: no claim, the default ships
    assert shipped() == (None, "aten::mm") and shipped(None) == (64, "triton::mm")
    assert unconfirmed_portable(compare(store), store, 1.02)[p.problem_key] == {
        dev: "never paired with the default", other: "never paired with the default"}
    verdict(rec, x, 1.9)
    verdict(rec2, y, 2.1)  # the A100's tune settled its own winner: x's speedup there was never paired
    assert unconfirmed_portable(compare(store), store, 1.02) == {p.problem_key: {other: "never paired with the default"}}
    assert shipped() == (None, "aten::mm") and shipped(None) == (64, "triton::mm")
    # the export's device-agnostic key applies on both devices: it shipped the fastest device's
    # (the A100's) confirmed y, never paired on the H100 (a review's finding); now the default
    assert build_table(store, device_agnostic=True, min_speedup=1.02) == {key: [{"template_id": "aten::mm"}]}
    assert build_table(store, min_speedup=1.02)[f"{other}+{key}"][0]["BLOCK_N"] == 32  # its own key: its own claim
    # so it is where the export names one device (the tune's own export does): its key applies on both
    assert build_table(store, dev, device_agnostic=True, min_speedup=1.02) == {key: [{"template_id": "aten::mm"}]}
    verdict(rec2, x, 1.01)  # paired, confirmed, below min_speedup
    assert unconfirmed_portable(compare(store), store, 1.02) == {
        p.problem_key: {other: "confirmed at 1.010x, below min_speedup"}}
    assert shipped() == (None, "aten::mm") and shipped(1.0) == (64, "triton::mm")
    verdict(rec2, x, 1.8)
    assert shipped() == (64, "triton::mm")
    assert build_table(store, device_agnostic=True, min_speedup=1.02)[key][0]["BLOCK_N"] == 64  # x: confirmed on both
    # a CPU that measured the problem too (no claim there) is another kind: a GPU's key is not its,
    # and a key without its device cannot say which kind it is for: refused without device= (a
    # CPU's config patch there failed a GPU's table read), and with a GPU's key the CPU does not count
    cpu = Recorder(store, rec.problem, store.study_id("s3", {}), store.device_id("AMD EPYC", "AMD EPYC", "cpu", {}),
                   rec.problem_id)
    cpu.add(Measurement("ok", timing=summarize_us([50.0, 51.0], "t")), "candidate", x, trial_number=0)
    with pytest.raises(ConfigError, match="device_agnostic=true: the database holds measurements of cpu and cuda"):
        build_table(store, device_agnostic=True, min_speedup=1.02)
    assert build_table(store, dev, device_agnostic=True, min_speedup=1.02)[key][0]["BLOCK_N"] == 64
    # compare table= over the CPU and the GPUs is refused as the export is; over the GPUs a replay of
    # the portable table measures and settles the candidate of the tune's config hash (an entry's
    # EVEN_K, where the table has one, is left out as the measurement adds it again)
    with pytest.raises(ConfigError, match=r"table=: the compared devices are of two kinds \(cpu and cuda\)"):
        portable_table(compare(store), store, None)
    table = portable_table(compare(store, [dev, other]), store, None)
    ((row, (cand,)),) = table_candidates(table, store.problems_by_lookup_key(), "portable.json", "cuda")
    assert cand.config_hash == x.config_hash and row.id == rec.problem_id
    odd = {key: [{**table[key][0], "EVEN_K": False}]}  # an entry that sets EVEN_K against the derived value
    ((_, (cand,)),) = table_candidates(odd, store.problems_by_lookup_key(), "portable.json", "cuda")
    assert cand.params.get("EVEN_K") is False and cand.config_hash != x.config_hash


def test_a_lookup_key_two_problems_share_with_different_choices_ships_the_default(tmp_path):
    """Two problems under one Inductor lookup (a float32 linear_act with relu and with gelu: one addmm
    lookup) whose portable choices (and winners) differ: neither was measured for the other, so the
    key gets Inductor's default entry even without a min_speedup check, in compare's portable table
    and in the export, and both name the key."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.portable import portable_choices
    from zhantune.report.regret import compare
    from zhantune.storage import Recorder

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    twin = Recorder(store, rec.problem, study_id, rec.device_id,
                    store.problem_id(rec.problem.key + ":twin", lookup_key=key, **rec.problem.row_fields()))
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    y = Candidate("triton_mm", "template", "triton::mm", {**TRITON_PARAMS, "BLOCK_N": 32})
    for i, (r, fast) in enumerate(((rec, x), (twin, y))):
        for j, c in enumerate((x, y)):
            t = 10.0 if c is fast else 12.0
            r.add(Measurement("ok", timing=summarize_us([t, t + 1], "t"), lookup=hit), "candidate", c,
                  trial_number=2 * i + j)
    out = portable_choices(compare(store), store, None)
    assert out.table == {key: [{"template_id": "aten::mm"}]} and out.shared == [key] and out.withheld == {}
    # the export too (it shipped the faster problem's entry for both)
    shared: list[str] = []
    assert build_table(store, min_speedup=None, shared=shared) == {f"{dev}+{key}": [{"template_id": "aten::mm"}]}
    assert shared == [f"{dev}+{key}"]
    assert build_table(store, device_agnostic=True, min_speedup=None) == {key: [{"template_id": "aten::mm"}]}


def test_a_problem_tuned_on_cpu_and_on_a_gpu_exports_each_devices_own_key(tmp_path):
    """Finding 2, the table side: a float32 linear_act is looked up as addmm on CPU and as mm on a
    GPU, but the problem row keeps the key of the first device that measured it. Each device's
    entries go under the key its own default compile looked up (stored with its default row)."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

    store = Store(f"sqlite:///{tmp_path}/z.db")
    problem = GemmProblem.from_config("linear_act", [32, 64, 48], "float32", "relu")
    study_id = store.study_id("s", {})
    x, w, b = "(torch.float32, [32, 48], [48, 1])", "(torch.float32, [48, 64], [64, 1])", "(torch.float32, [64], [1])"
    cpu_key, gpu_key = f"({b}, {x}, {w})+alpha=1&beta=1+addmm", f"({x}, {w})+mm"
    for trial, (dev, kind, key, op) in enumerate([("AMD EPYC", "cpu", cpu_key, "addmm"),
                                                   ("NVIDIA H100 80GB HBM3", "cuda", gpu_key, "mm")]):
        rec = Recorder(store, problem, study_id, store.device_id(dev, dev, kind, {}),
                       store.problem_id(problem.key, lookup_key=key, **problem.row_fields()))
        own = LookupEvent(op, f"{dev}+{key}", key, {f"aten::{op}": None}, ())
        rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=own), "default")
        rec.add(Measurement("ok", timing=summarize_us([19.0, 20.0], "t"), lookup=own), "candidate",
                Candidate("aten_template", "template", f"aten::{op}", {}), trial_number=trial)
    table = build_table(store, min_speedup=1e9)  # nothing beats the default: each device's default entry
    assert table == {f"AMD EPYC+{cpu_key}": [{"template_id": "aten::addmm"}],
                     f"NVIDIA H100 80GB HBM3+{gpu_key}": [{"template_id": "aten::mm"}]}


def test_a_confirmed_claim_is_not_hidden_by_a_later_note_or_a_faster_unconfirmed_config(tmp_path):
    """The export follows paired verdicts per config: a later "no claim made" note on the same config
    (a cached winner in another study's space, bench.remeasure_rounds=0) does not undo a confirmed
    claim, and a faster config whose claim failed does not hide a slower one whose claim held."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    y = Candidate("triton_mm", "template", "triton::mm", {**TRITON_PARAMS, "BLOCK_N": 32})
    for i, (c, t) in enumerate([(x, 12.0), (y, 10.0)]):
        rec.add(Measurement("ok", timing=summarize_us([t, t + 1], "t"), lookup=hit), "candidate", c, trial_number=i)

    def verdict(c, rounds, confirmed):
        store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                          config_hash=c.config_hash, ratio=1.6 if rounds else None,
                          ratio_low=1.6 if rounds else None, ratio_high=1.6 if rounds else None, rounds=rounds,
                          contended=0, confirmed=confirmed, reason="r")

    def shipped():
        (entries,) = build_table(store, min_speedup=1.0).values()
        return entries[0].get("BLOCK_N"), entries[0]["template_id"]

    verdict(x, 3, True)
    assert shipped() == (64, "triton::mm")  # y is faster but never paired: x's confirmed claim ships
    verdict(x, 0, False)  # a later study's note: "no claim made" for x
    assert shipped() == (64, "triton::mm")
    verdict(x, 1, False)  # a later replay with bench.remeasure_rounds=1: one round cannot judge a claim
    assert shipped() == (64, "triton::mm")
    verdict(y, 3, False)  # y paired, and not confirmed
    assert shipped() == (64, "triton::mm")
    verdict(y, 3, True)
    assert shipped() == (32, "triton::mm")


def test_a_verdict_stored_under_the_old_rule_is_judged_again_by_the_rule_in_use(tmp_path):
    """Verdicts stored before 2026-11-27 were "confirmed" when the winner was faster in every round,
    one round included. The export (and compare) re-judge a stored verdict as far as its row tells
    (zhantune.bench.decision.claim_holds): two rounds at least, and the smallest round's ratio
    beyond the rounds' spread (ratio_high / ratio_low); else Inductor's default ships."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.report.regret import compare

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([19.6, 20.0], "t"), lookup=hit), "candidate", x, trial_number=0)

    def shipped(rounds, low, high):
        store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                          config_hash=x.config_hash, ratio=low, ratio_low=low, ratio_high=high, rounds=rounds,
                          contended=0, confirmed=True, reason="confirmed in every round")
        (entries,) = build_table(store, min_speedup=1.0).values()
        (problem,) = compare(store).problems
        return entries[0]["template_id"], problem.confirmed_speedup

    assert shipped(1, 1.05, 1.05) == ("aten::mm", {})  # one round
    assert shipped(3, 1.01, 1.03) == ("aten::mm", {})  # 1.01x is within the rounds' spread (1.02x)
    assert shipped(3, 1.04, 1.05) == ("triton::mm", {dev: pytest.approx(1.04)})


def test_a_shipped_entry_carries_the_tables_torchs_template_hash(tmp_path):
    """The export ranked every torch's rows together and built the entry from the config's fastest
    row: a faster row of another torch gave a table stamped with this torch that torch's
    template_hash (Inductor drops such an entry as stale: the confirmed claim never applied). Only
    the table's torch's rows are ranked and shipped."""
    from dataclasses import replace

    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    mine = Measurement("ok", timing=summarize_us([10.0, 10.5], "t"), lookup=hit, template_hash="HASH_OF_THIS_TORCH")
    rec.add(mine, "candidate", x, trial_number=0)
    this_torch = rec.versions
    rec.versions = dict(this_torch, torch="2.12.0")  # as a database tuned with torch 2.12, then this one, holds
    rec.add(replace(mine, timing=summarize_us([8.0, 8.5], "t"), template_hash="HASH_OF_TORCH_2_12"),
            "candidate", x, trial_number=1)
    rec.versions = this_torch
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=x.config_hash, ratio=1.9, ratio_low=1.9, ratio_high=1.92, rounds=3,
                      contended=0, confirmed=True, reason="confirmed in every round")
    (entries,) = build_table(store, min_speedup=1.02).values()
    assert entries[0]["template_id"] == "triton::mm" and entries[0]["template_hash"] == "HASH_OF_THIS_TORCH"
    # that torch's table ships that torch's row (its claim was not confirmed with it: the default)
    assert build_table(store, torch_version="2.12.0")[f"{dev}+{key}"][0]["template_hash"] == "HASH_OF_TORCH_2_12"


def _confirmed_with_torch(tmp_path, version: str):
    """The H100 mm study of :func:`_h100_bf16_mm_study` with a Triton candidate measured and a 1.9x claim
    confirmed, both with torch ``version``; returns the store."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.choices import LookupEvent

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    rec.versions = dict(rec.versions, torch=version)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([10.0, 10.5], "t"), lookup=hit), "candidate", x, trial_number=0)
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=x.config_hash, ratio=1.9, ratio_low=1.9, ratio_high=1.92, rounds=3,
                      contended=0, confirmed=True, reason="confirmed in every round", torch_version=version)
    return store


def test_a_build_of_the_same_torch_release_ships(tmp_path):
    """A GPU database tuned with torch 2.13.0+cu128, merged and exported on a CPU machine
    (2.13.0+cpu): lookup keys and template sources are one release's (use_table compares the
    release), so its rows and its confirmed claims ship; an exact-version match left the GPU's keys
    out of the table (a review)."""
    from zhantune.inductor.builder import build_table, claims_of_other_torch
    from zhantune.provenance import torch_release

    gpu_build = torch_release(torch.__version__) + "+cu128"
    assert gpu_build != torch.__version__
    store = _confirmed_with_torch(tmp_path, gpu_build)
    (entries,) = build_table(store, min_speedup=1.02).values()
    assert entries[0]["template_id"] == "triton::mm" and claims_of_other_torch(store, None, 1.02) == {}
    assert build_table(store, min_speedup=None, torch_version="2.12.0+cu128") == {}  # another release: none


def test_two_source_builds_of_one_development_cycle_are_two_releases(tmp_path):
    """A helper's (session 52): a source build's version ends in its commit ("2.14.0a0+gitaaaaaaa"), which
    was cut as a build flavour (+cpu, +cu128), so every commit of a development cycle was one release: a
    claim confirmed at one commit shipped in a table stamped with another, and use_table served it."""
    from zhantune.inductor.builder import build_table
    from zhantune.provenance import torch_release

    assert torch_release("2.13.0+cu128") == torch_release("2.13.0+cpu") == "2.13.0"
    assert torch_release("2.14.0.dev20261120+cu128") == "2.14.0.dev20261120"
    a, b = "2.14.0a0+gitaaaaaaa", "2.14.0a0+gitbbbbbbb"
    assert torch_release(a) == a != torch_release(b)
    store = _confirmed_with_torch(tmp_path, a)
    dev, key = "NVIDIA H100 80GB HBM3", "((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    (entries,) = build_table(store, min_speedup=1.02, torch_version=a).values()
    assert entries[0]["template_id"] == "triton::mm"
    assert build_table(store, min_speedup=None, torch_version=b) == {}  # nothing measured with b
    assert build_table(store, min_speedup=None, torch_version="2.14.0a0") == {}  # nor with the release itself
    # the database's filter (queries._same_release) agrees with torch_release on every kind of version (a
    # review: it still took '+git...' rows for their release's builds)
    import sqlalchemy as sa

    from zhantune.storage.queries import _same_release

    versions = ["2.13.0", "2.13.0+cpu", "2.13.0+cu128", "2.13.0+rocm6.2", "2.13.0+git1a2b3c4", a, b, "2.14.0a0",
                "2.14.0.dev20261120+cu128", "2.13.1+cpu", "2.13.00+cpu", "2.13.0+GIT1a2b3c4", "2.14.0A0+cpu",
                "2.13.0+", "2.13.0+gi", "2_13%0+cpu"]
    engine = sa.create_engine("sqlite://")
    rows = sa.Table("r", sa.MetaData(), sa.Column("v", sa.String))
    rows.metadata.create_all(engine)
    with engine.begin() as con:
        con.execute(rows.insert(), [{"v": v} for v in versions])
        for asked in versions:
            got = sorted(con.execute(sa.select(rows.c.v).where(_same_release(rows.c.v, asked))).scalars())
            assert got == sorted(v for v in versions if torch_release(v) == torch_release(asked)), asked
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import FORMAT, TableFile

    tf = TableFile({f"{dev}+{key}": entries}, {"format": FORMAT, "format_version": 1, "torch": a})
    with fake_cuda(PROFILES["H100"].properties()), mock.patch.object(torch, "__version__", b), \
            use_table(tf, device="cuda") as installed:
        assert lower("mm", [(64, 64), (64, 64)], torch.bfloat16).uids != ["triton::mm"]
    assert "re-tune" in installed.report.stale[f"{dev}+{key}"], installed.report.as_dict()


def test_a_claim_confirmed_with_another_torch_never_ships_in_this_torchs_table(cli, tmp_path):
    """A speedup holds for the torch its paired rounds ran with (the verdict stores it): a table
    stamped with another torch (this process's, or export's torch_version=) ships Inductor's default
    for it, compare's portable table withholds it, and the export names the torch it was confirmed with."""
    import json

    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table, claims_of_other_torch
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.portable import unconfirmed_portable
    from zhantune.report.regret import compare

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([10.0, 10.5], "t"), lookup=hit), "candidate", x, trial_number=0)
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=x.config_hash, ratio=1.9, ratio_low=1.9, ratio_high=1.92, rounds=3,
                      contended=0, confirmed=True, reason="confirmed in every round", torch_version="9.9.9")

    def template(**kw):
        (entries,) = build_table(store, **kw).values()
        return entries[0]["template_id"]

    assert template(min_speedup=1.02) == "aten::mm"  # this torch's table: the 9.9.9 claim is no claim here
    assert claims_of_other_torch(store, None, 1.02) == {"9.9.9": 1}
    # withheld from compare's table too, saying why
    assert unconfirmed_portable(compare(store), store, 1.02) == {
        "mm[M=64,N=64,K=64]:bfloat16": {dev: f"confirmed with torch 9.9.9, not with this torch {torch.__version__}"}}
    r = cli([f"storage.url=sqlite:///{tmp_path}/z.db", "path=t.json"], tmp_path, module="zhantune.export")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"1 speedup claim(s) confirmed with torch 9.9.9 do not ship in this torch {torch.__version__} table" \
        in " ".join(r.stdout.split()), r.stdout
    # counted only for the table's devices and problems (export's device= and problems=)
    assert claims_of_other_torch(store, None, 1.02, device_key=dev, problem_ids={rec.problem_id}) == {"9.9.9": 1}
    assert claims_of_other_torch(store, None, 1.02, device_key="NVIDIA A100-SXM4-80GB") == {}
    assert claims_of_other_torch(store, None, 1.02, problem_ids=set()) == {}
    assert json.loads((tmp_path / "t.json").read_text())["table"] == {f"{dev}+{key}": [{"template_id": "aten::mm"}]}
    # a table for that torch ships it (its rows filtered by that torch: these were stored with this one)
    assert build_table(store, min_speedup=1.02, torch_version="9.9.9") == {}
    # confirmed again with this torch (add_verdict's default): it ships in this torch's table
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=x.config_hash, ratio=1.9, ratio_low=1.9, ratio_high=1.92, rounds=3,
                      contended=0, confirmed=True, reason="confirmed in every round")
    assert template(min_speedup=1.02) == "triton::mm"
    assert claims_of_other_torch(store, None, 1.02) == {}


def test_the_default_min_speedup_keeps_a_claim_noise_offsets_reach_out_of_the_table(tmp_path):
    """Two copies of one kernel were confirmed 1.002-1.015x apart (docs/timing.md: this CPU, an
    H100): a tune's export (ExportConfig's defaults) ships a tuned entry only for a confirmed claim
    of at least export.min_speedup (1.02), and the summary says why a smaller one did not ship."""
    from types import SimpleNamespace

    from rich.console import Console

    from zhantune.bench.decision import Round, judge_speedup
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.config import ExportConfig
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.exporter import export_table
    from zhantune.report.problems import claim_cell
    from zhantune.report.summary import _print_winner

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([19.0, 20.0], "t"), lookup=hit), "candidate", x, trial_number=0)
    opts = ExportConfig(path=str(tmp_path / "t.json"))
    assert opts.min_speedup == 1.02
    for rounds, ships in [([(202.80, 201.07), (203.28, 201.17), (200.65, 198.74)], "aten::mm"),  # H100 A/A, 1.010x
                          ([(100.0, 97.0), (101.0, 97.5), (100.5, 97.2)], "triton::mm")]:  # 1.03x
        v = judge_speedup([Round(d, w) for d, w in rounds])
        assert v.confirmed
        store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                          config_hash=x.config_hash, ratio=v.ratio, ratio_low=v.ratio_low, ratio_high=v.ratio_high,
                          rounds=v.rounds, contended=0, confirmed=True, reason=v.reason)
        (entries,) = export_table(store, opts, dev)[1].values()
        assert entries[0]["template_id"] == ships
        console = Console(record=True, width=400)
        best = SimpleNamespace(branch="triton_mm", template_id="triton::mm", params={}, min_us=19.0, median_us=19.5,
                               timing_method="cuda:t", id=2, config_hash=x.config_hash)
        _print_winner(console, SimpleNamespace(best=best, claim=v, not_carried=None), 20.0, best, opts)
        text = console.export_text()
        below = ships == "aten::mm"
        assert f"winner: triton_mm, {v.ratio:.{3 if below else 2}f}x faster than inductor default" in text
        assert ("below export.min_speedup (1.02): an exported table does not ship it" in text) == below
        assert claim_cell(SimpleNamespace(claim=v), opts).endswith("(< min_speedup)") == below
    # a run whose table is another torch's (export.torch_version): this torch's claim does not ship there
    other = ExportConfig(path=str(tmp_path / "t.json"), torch_version="9.9.9")
    assert export_table(store, other, dev)[1] == {}
    console = Console(record=True, width=400)
    _print_winner(console, SimpleNamespace(best=best, claim=v, not_carried=None), 20.0, best, other)
    assert ("1.03x faster than inductor default; confirmed with this torch, so the table this run exports for "
            "torch '9.9.9' (export.torch_version) does not ship it") in console.export_text()
    assert claim_cell(SimpleNamespace(claim=v), other) == "1.03x (other torch's table)"
    same = ExportConfig(path=str(tmp_path / "t.json"), torch_version=torch.__version__)
    assert claim_cell(SimpleNamespace(claim=v), same) == "1.03x"
    # an unconfirmed ratio beside the default that ships (a newcomer read "1.20x (unconfirmed)" as shipped)
    from zhantune.inductor.builder import Shipped

    loose = SimpleNamespace(**{**vars(v), "confirmed": False})
    assert claim_cell(SimpleNamespace(claim=loose, shipped=Shipped(None)), same) == "1.03x (unconfirmed) (default ships)"
    off = ExportConfig(path=str(tmp_path / "t.json"), torch_version="9.9.9", enabled=False)  # no table at all
    console = Console(record=True, width=400)
    _print_winner(console, SimpleNamespace(best=best, claim=v, not_carried=None), 20.0, best, off)
    assert "export.torch_version" not in console.export_text()


def test_the_summary_says_what_the_table_ships(tmp_path):
    """The summary said "the table ships Inductor's default" whenever this run confirmed no claim,
    while the export shipped an earlier run's confirmed config, or (min_speedup=null) the fastest
    one unpaired; and it stated a confirmed claim whose key another problem's different choice
    shares, where the default ships (a review's findings). It now says what the run's table ships
    under the problem's key (export_table's ``shipped``), in the summary and the problems table."""
    from types import SimpleNamespace

    from rich.console import Console

    from zhantune.bench.decision import SpeedupVerdict
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.config import ExportConfig
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.exporter import export_table
    from zhantune.problems import GemmProblem
    from zhantune.report.problems import claim_cell
    from zhantune.report.summary import _print_winner
    from zhantune.storage import Recorder

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    y = Candidate("triton_mm", "template", "triton::mm", {**TRITON_PARAMS, "BLOCK_N": 32})
    rec.add(Measurement("ok", timing=summarize_us([12.0, 12.5], "t"), lookup=hit), "candidate", x, trial_number=0)
    best = rec.add(Measurement("ok", timing=summarize_us([10.0, 10.5], "t"), lookup=hit), "candidate", y,
                   trial_number=1)

    def verdict(cand, ratio, confirmed, problem_id=rec.problem_id):
        store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=problem_id,
                          config_hash=cand.config_hash, ratio=ratio, ratio_low=ratio, ratio_high=ratio * 1.01, rounds=3,
                          contended=0, confirmed=confirmed, reason="confirmed" if confirmed else "unconfirmed: a flip")
        return SpeedupVerdict(ratio, ratio, ratio * 1.01, 3, 0, confirmed, "unconfirmed: a flip")

    def summary(claim, opts):
        shipped: dict = {}
        export_table(store, opts, dev, shipped=shipped)
        result = SimpleNamespace(best=best, claim=claim, not_carried=None, shipped=shipped.get((rec.device_id,
                                                                                                rec.problem_id)))
        console = Console(record=True, width=400)
        _print_winner(console, result, 20.0, best, opts)
        return console.export_text(), claim_cell(SimpleNamespace(**vars(result), claimed=best), opts)

    opts = ExportConfig(path=str(tmp_path / "t.json"))
    verdict(x, 1.6, True)  # an earlier run confirmed x; this run's winner y did not confirm
    text, cell = summary(verdict(y, 1.9, False), opts)
    assert "winner in this run: inductor default (20.0 us): no candidate's speedup over it was confirmed in paired " \
           "rounds (triton_mm: 1.90x, unconfirmed: a flip); the table ships" in text, text
    assert "; the table ships triton::mm BLOCK_K=32 BLOCK_M=32 BLOCK_N=64" in text, text
    assert "whose speedup paired rounds of an earlier run confirmed" in text and cell == "1.90x (unconfirmed) (table: another config)"
    text, _ = summary(verdict(y, 1.9, False), ExportConfig(path=str(tmp_path / "t.json"), min_speedup=None))
    assert "; the table ships triton::mm BLOCK_K=32 BLOCK_M=32 BLOCK_N=32" in text and "export.min_speedup=null" in text
    # another problem with the same lookup key and another confirmed choice: neither ships
    twin = GemmProblem("mm", (64, 64, 64), "bfloat16", activation="relu")
    rec2 = Recorder(store, twin, study_id, rec.device_id, store.problem_id(twin.key, lookup_key=key, **twin.row_fields()))
    rec2.add(Measurement("ok", timing=summarize_us([11.0, 11.5], "t"), lookup=hit), "candidate", x, trial_number=2)
    verdict(x, 1.8, True, problem_id=rec2.problem_id)
    text, cell = summary(verdict(y, 1.9, True), opts)
    assert "winner: triton_mm, 1.90x faster than inductor default; the table ships Inductor's default (its lookup key " \
           "is another problem's too" in text, text
    assert cell == "1.90x (default ships: shared key)"


def test_a_tune_that_made_no_claim_exports_the_default(tmp_path):
    """A tune with bench.remeasure_rounds=0 stores a note ("not settled: no paired rounds, no
    claim") and its summary says no candidate beat the default: the export ships the default too,
    even where the stored minimums favour the candidate (it shipped the candidate: 1.17x
    "(unconfirmed)" in the summary, the tuned entry in the table). So it does without any verdict
    (an interrupted tune, a database from before verdicts): stored times were never paired."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"{dev}+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t"), lookup=hit), "candidate", x, trial_number=0)
    # no verdict: 10 us against 20 us by the stored times, never paired
    assert build_table(store, min_speedup=1.0) == {f"{dev}+{key}": [{"template_id": "aten::mm"}]}
    ((entry,),) = build_table(store, min_speedup=None).values()  # the fastest itself, as asked
    assert entry["template_id"] == "triton::mm"
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=x.config_hash, ratio=None, ratio_low=None, ratio_high=None, rounds=0,
                      contended=0, confirmed=False, reason="not settled (bench.remeasure_rounds=0): no paired rounds, no claim")
    assert build_table(store, min_speedup=1.0) == {f"{dev}+{key}": [{"template_id": "aten::mm"}]}


def test_a_renamed_devices_template_rows_go_under_the_key_of_the_device_exported(tmp_path):
    """Rows measured under another device key (a database whose device was renamed, e.g. merged from
    a replay on another machine) still carry the old device in their stored lookup key: the table
    keys every entry, templates too, with the exported device (or none, device-agnostic)."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent

    dev, key, store, study_id, rec = _h100_bf16_mm_study(tmp_path)
    hit = LookupEvent("mm", f"NVIDIA H100 PCIe+{key}", key, {"triton::mm": None}, ("triton::mm",))
    rec.add(Measurement("ok", timing=summarize_us([20.0, 21.0], "t"), lookup=hit), "default")
    x = Candidate("triton_mm", "template", "triton::mm", TRITON_PARAMS)
    rec.add(Measurement("ok", timing=summarize_us([12.0, 13.0], "t"), lookup=hit), "candidate", x, trial_number=0)
    (entries,) = build_table(store, min_speedup=None).values()
    assert list(build_table(store, min_speedup=None)) == [f"{dev}+{key}"] and entries[0]["template_id"] == "triton::mm"
    assert list(build_table(store, device_agnostic=True, min_speedup=None)) == [key]


_ADDMM_KEY = "((torch.bfloat16, {bias}), (torch.bfloat16, [256, 256], [256, 1]), (torch.bfloat16, [256, 512], " \
             "[1, 256]))+alpha=1&beta=1+addmm"
_L4 = dataclasses.replace(PROFILES["A100"], name="NVIDIA L4", gcn_arch_name="NVIDIA L4", sm_count=58)


@pytest.mark.parametrize("gpu, template_id, bias, served", [
    ("H100", "triton::mm_persistent_tma", "1-D", ["triton::mm_persistent_tma"]),
    ("A100", "triton::mm_persistent_tma", "1-D", ["aten::addmm"]),  # no TMA
    ("L4", "triton::mm", "1-D", ["aten::addmm"]),  # 58 SMs: Inductor offers no Triton template
    ("H100", "triton::mm", "2-D", ["triton::mm"]),  # one key for both lookups
    ("L4", "triton::mm", "2-D", ["aten::addmm"]),
])
def test_an_addmm_entry_compiles_itself_alone_or_the_default_never_nothing(gpu, template_id, bias, served):
    """GPU-path review (session 38): a device-agnostic table's addmm entry whose template Inductor does
    not offer on the GPU it is used on (a TMA template on an A100, any Triton template on an L4) left
    the GEMM with no choice (its ATen lookup's "nothing from this lookup" held, NoValidChoicesError)
    and a report of 100% coverage; with a bias of the output's shape (one key for the ATen and the
    templates' lookups) the ATen kernel was compiled beside the entry, for Inductor to autotune.
    Now the GEMM compiles the entry alone, or Inductor's default with the entry reported stale. Either
    way it is one lookup in the report (a review, session 51: a served entry was two hits, the ATen
    key's [] counted too, while a missed addmm was one lookup, so coverage depended on the entry)."""
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table_choices import NOT_OFFERED

    shapes = [(512,) if bias == "1-D" else (256, 512), (256, 256), (256, 512)]
    expanded = _ADDMM_KEY.format(bias="[256, 512], [0, 1]" if bias == "1-D" else "[256, 512], [512, 1]")
    table = {expanded: [{"template_id": template_id, **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}]}
    if bias == "1-D":  # as build_table writes it: the ATen lookup's key gets []
        table[_ADDMM_KEY.format(bias="[512], [1]")] = []
    with fake_cuda(_L4.properties() if gpu == "L4" else PROFILES[gpu].properties()), \
            use_table(table, device="cuda") as installed:
        got = lower("addmm", shapes, torch.bfloat16, [None, None, (1, 256)])
    report = installed.report
    assert got.uids == served
    assert report.lookups == 1, report.as_dict()
    if served == [template_id]:
        assert dict(report.hits) == {expanded: 1} and not report.misses and not report.stale
        assert bias == "2-D" or report.chosen[_ADDMM_KEY.format(bias="[512], [1]")] == "(nothing from this lookup)"
    else:  # the entry said stale, the ATen key's [] no hit: no coverage claimed
        assert report.stale == {expanded: NOT_OFFERED.format(tids=template_id)} and not report.hits
        assert report.coverage == 0.0


def test_an_addmm_the_table_does_not_serve_counts_in_the_gate_as_the_models_own_gemm():
    """A review (session 51): an nn.Linear's addmm (a [N] bias) whose templates' entry was stale, or whose
    ATen key's [] had no templates' entry, was classified by the templates' lookup, whose bias is expanded
    to [M, N]: not tunable, left out of check's gate, which read 100% for a table serving one GEMM of two.
    Its ATen lookup classifies it now: 1 of 2, 50%."""
    from zhantune.inductor.runtime import use_table

    served, other = _ADDMM_KEY, _ADDMM_KEY.replace("[256, 256], [256, 1]", "[128, 256], [256, 1]")
    entry = {"template_id": "triton::mm", **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}
    base = {served.format(bias="[256, 512], [0, 1]"): [entry], served.format(bias="[512], [1]"): []}
    for second in ({other.format(bias="[128, 512], [0, 1]"): [{**entry, "template_hash": "dead"}],
                    other.format(bias="[512], [1]"): []},   # its entry stale (another template source)
                   {other.format(bias="[512], [1]"): []}):  # [] and no templates' entry
        with fake_cuda(PROFILES["H100"].properties()), use_table({**base, **second}, device="cuda") as installed:
            got = [lower("addmm", [(512,), (m, 256), (256, 512)], torch.bfloat16, [None, None, (1, 256)]).uids
                   for m in (256, 128)]
        report = installed.report
        assert got == [["triton::mm"], ["aten::addmm"]], got
        assert report.lookups == 2 and report.tunable_lookups == 2 and report.tunable_coverage == 0.5, report.as_dict()
        assert report.untunable == {}


def test_an_addmm_served_by_its_aten_and_its_templates_entries_is_one_lookup():
    """A helper's (session 52): a top_k=2 table of an addmm whose two fastest were a Triton config and
    ATen's kernel (the ATen entry under the [N]-bias key, the Triton one under the expanded bias's, as
    build_table writes it) is served by both lookups, and Inductor autotunes the two. It counted two
    hits, so with one missed GEMM beside it check's gate read 67% for a table serving one GEMM of two."""
    from zhantune.inductor.runtime import use_table

    served, other = _ADDMM_KEY, _ADDMM_KEY.replace("[256, 256], [256, 1]", "[128, 256], [256, 1]")
    table = {served.format(bias="[256, 512], [0, 1]"): [{"template_id": "triton::mm", **TRITON_PARAMS}],
             served.format(bias="[512], [1]"): [{"template_id": "aten::addmm"}]}
    mm_key = "((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    table[mm_key] = [{"template_id": "triton::mm", **TRITON_PARAMS}]  # another GEMM's hit, first
    with fake_cuda(PROFILES["H100"].properties()), use_table(table, device="cuda") as installed:
        assert lower("mm", [(64, 64), (64, 64)], torch.bfloat16).uids == ["triton::mm"]
        got = [sorted(lower("addmm", [(512,), (m, 256), (256, 512)], torch.bfloat16, [None, None, (1, 256)]).uids)
               for m in (256, 128)]
    report = installed.report
    assert got == [["aten::addmm", "triton::mm"], ["aten::addmm"]], got  # the second: Inductor's default
    assert report.lookups == 3 and dict(report.hits) == {mm_key: 1, served.format(bias="[512], [1]"): 1}, report.as_dict()
    ((missed, n),) = report.misses.items()  # reported under the device's key
    assert report.tunable_coverage == 2 / 3 and n == 1 and missed.endswith("+" + other.format(bias="[512], [1]")), missed
    # what the other lookup served is said, beside the hit it belongs to (check prints it under the hit; a
    # review's: it was left out), and where both lookups share a key (a 2-D bias) what either served, and
    # no entry is called not offered that the other lookup compiled; only the GEMM's own other lookup is
    # named (a second review: every key served before, the mm's too, was named there)
    aten_key, templates_key = served.format(bias="[512], [1]"), served.format(bias="[256, 512], [0, 1]")
    assert report.also == {templates_key: aten_key} and report.chosen[templates_key] == "triton::mm"
    assert report.chosen[aten_key] == "aten::addmm" and not report.dropped
    one_key = served.format(bias="[256, 512], [512, 1]")
    table = {one_key: [{"template_id": "aten::addmm"}, {"template_id": "triton::mm", **TRITON_PARAMS},
                       {"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_M": 64}]}
    with fake_cuda(PROFILES["A100"].properties()), use_table(table, device="cuda") as installed:  # no TMA
        got = sorted(lower("addmm", [(256, 512), (256, 256), (256, 512)], torch.bfloat16, [None, None, (1, 256)]).uids)
    report = installed.report
    assert got == ["aten::addmm", "triton::mm"] and report.lookups == 1 and report.also == {}, got
    assert report.chosen == {one_key: "aten::addmm, triton::mm"}, report.chosen
    assert report.dropped == {one_key: "1 of 3 entries not served: [2] triton::mm_persistent_tma: a template "
                                       "Inductor does not offer here"}, report.dropped


@pytest.mark.parametrize("op, shapes", [("mm", [(256, 256), (256, 512)]), ("bmm", [(2, 64, 32), (2, 32, 64)])])
def test_an_empty_entry_list_no_lookup_follows_compiles_the_default_and_is_stale(op, shapes):
    """A review (session 51): [] ("nothing from this lookup", an addmm's ATen key where its templates'
    lookup follows) under an mm or bmm key left the GEMM with no kernel (no choice: the compile fails)
    and was counted a hit, 100% coverage. The GEMM compiles Inductor's default, and [] is stale."""
    from zhantune.inductor.choices import recording
    from zhantune.inductor.cuda_entries import EMPTY_ALONE
    from zhantune.inductor.runtime import use_table

    with fake_cuda():
        with recording() as rec:
            lower(op, shapes, torch.bfloat16)
        key = rec.events[0].agnostic_key
        with use_table({key: []}, device="cuda") as installed:
            got = lower(op, shapes, torch.bfloat16).uids
    assert got == [f"aten::{op}"], got
    assert installed.report.stale == {key: EMPTY_ALONE} and not installed.report.hits, installed.report.as_dict()


@pytest.mark.parametrize("case", ["config entry, 1-D bias", "config entry, 2-D bias", "zero-size M"])
def test_an_addmm_whose_entry_no_templates_lookup_serves_compiles_the_default_and_says_why(case):
    """A review of the addmm hold-back: a ``zhantune::config`` entry (no templates' lookup can serve
    it) is reported stale as a config patch on CUDA, not as a miss or an unoffered template; and an
    addmm of a size statically zero, for which tuned_addmm makes the ATen lookup alone, still
    compiles ATen (it was held back for a lookup that never came: no choice at all)."""
    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import CONFIG_TEMPLATE_ID

    shapes = {"config entry, 1-D bias": [(512,), (256, 256), (256, 512)],
              "config entry, 2-D bias": [(256, 512), (256, 256), (256, 512)],
              "zero-size M": [(0, 512), (0, 256), (256, 512)]}[case]
    entry = {"template_id": CONFIG_TEMPLATE_ID, "config_patch": {"max_autotune_gemm_backends": "TRITON"}} \
        if case.startswith("config") else {"template_id": "triton::mm", **TRITON_PARAMS}
    with fake_cuda():
        with inductor_config.patch(max_autotune_gemm=True), recording() as rec:
            lower("addmm", shapes, torch.bfloat16)
        own = rec.events[0].agnostic_key  # the ATen lookup's key: the problem's own
        with use_table({own: [entry]}, device="cuda") as installed:
            got = lower("addmm", shapes, torch.bfloat16)
    assert got.uids == ["aten::addmm"] and not installed.report.hits and not installed.report.misses
    (why,) = installed.report.stale.values()
    assert why.startswith("a 'zhantune::config' entry applies on CPU only" if case.startswith("config")
                          else "triton::mm: not among the templates Inductor offers for this GEMM"), why


@pytest.mark.parametrize("op, dtype, setting, served", [
    ("mm", torch.float32, ("fp32_precision", "tf32"), ["aten::mm"]),
    ("mm", torch.float32, ("fp32_precision", "ieee"), ["triton::mm"]),
    ("mm", torch.bfloat16, ("fp32_precision", "tf32"), ["triton::mm"]),  # TF32 rounds float32 inputs only
    ("addmm", torch.float32, ("fp32_precision", "tf32"), ["aten::addmm"]),
    ("mm", torch.float16, ("allow_fp16_reduced_precision_reduction", False), ["aten::mm"]),
    ("mm", torch.float16, ("allow_fp16_accumulation", True), ["aten::mm"]),
    ("mm", torch.bfloat16, ("allow_bf16_reduced_precision_reduction", False), ["aten::mm"]),
    ("mm", torch.bfloat16, ("allow_fp16_reduced_precision_reduction", False), ["triton::mm"]),
])
def test_an_entry_where_the_gemms_math_differs_from_the_measured_compiles_the_default_and_says_why(
        op, dtype, setting, served):
    """Session 39: Inductor's lookup key holds no precision. zhantune measures float32 GEMMs without
    TF32 and half ones under cuBLAS's default math flags (a tuned flag's winner is never exported),
    so in a process with TF32 on (torch.set_float32_matmul_precision('high'), common in training
    scripts) or another half-precision reduction, a table's entry compiled a kernel, against a
    default, that no measurement covered; the report said 100% coverage. Now it is stale with the
    reason, and Inductor's default compiles."""
    from zhantune.inductor.heuristics import TF32_ON, half_math_changed
    from zhantune.inductor.runtime import use_table

    shapes = [(256, 512), (256, 256), (256, 512)] if op == "addmm" else [(256, 256), (256, 512)]
    flag, value = setting
    with fake_cuda():
        with inductor_config.patch(max_autotune_gemm=True), recording() as rec:
            lower(op, shapes, dtype)
        key = rec.events[-1].device_key
        table = {key: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
        before = getattr(torch.backends.cuda.matmul, flag)
        setattr(torch.backends.cuda.matmul, flag, value)
        try:
            with use_table(table, device="cuda") as installed:
                got = lower(op, shapes, dtype)
            why = TF32_ON if flag == "fp32_precision" else half_math_changed([str(dtype).removeprefix("torch.")])
        finally:
            setattr(torch.backends.cuda.matmul, flag, before)
    assert got.uids == served
    report = installed.report
    if served == ["triton::mm"]:
        assert report.hits == {key: 1} and not report.stale
    else:
        assert why and why.startswith(f"torch.backends.cuda.matmul.{flag} is {value}" if flag != "fp32_precision"
                                      else "this process compiles float32 GEMMs with TF32")
        assert report.stale == {key: why} and not report.hits and report.coverage == 0.0


def test_a_change_to_the_table_after_use_table_never_reaches_inductor():
    """Tables are data (session 39 attack): use_table checked the table once and then served the
    caller's own dict, the same object as config.lookup_table.table, so a value written into either
    afterwards (a string num_stages is pasted into the kernel's Python source) reached Inductor's
    template unchecked. Now the handler serves its own checked copy."""
    from zhantune.inductor.runtime import use_table

    key = f"{PROFILES['H100'].name}+((torch.bfloat16, [64, 64], [64, 1]), (torch.bfloat16, [64, 64], [64, 1]))+mm"
    table = {key: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
    with fake_cuda(), use_table(table, device="cuda") as installed:
        table[key][0]["num_stages"] = "__import__('os').system('true') or 2"
        inductor_config.lookup_table.table[key][0]["num_stages"] = "__import__('os').system('true') or 2"
        inductor_config.lookup_table.table[key].append({"template_id": "triton::mm", **TRITON_PARAMS, "BLOCK_K": 8})
        got = lower("mm", [(64, 64), (64, 64)], torch.bfloat16)
    assert got.uids == ["triton::mm"] and got.kwargs()["num_stages"] == TRITON_PARAMS["num_stages"]
    assert installed.report.hits == {key: 1}


@pytest.mark.parametrize("case", ["mm miss", "addmm miss", "addmm entry not offered", "mm stale", "backends TRITON"])
def test_under_the_users_max_autotune_a_gemm_the_table_does_not_decide_autotunes_as_without_it(case):
    """A settings audit (session 39), the CUDA twin of session 38's CPU fix: under the user's own
    max-autotune (torch.compile(mode="max-autotune")), a GEMM the table has no entry for, or whose
    entry is stale or not offered on this GPU, compiled ATen alone with the table installed; without
    it Inductor autotunes ATen against its Triton templates. Now it gets the choices it gets without
    the table (in the user's backends); with no max-autotune of the user's, ATen alone, as before."""
    from collections import Counter

    from zhantune.inductor.runtime import use_table

    op = "addmm" if case.startswith("addmm") else "mm"
    shapes = [(512,), (256, 256), (256, 512)] if op == "addmm" else [(256, 256), (256, 512)]
    profile = PROFILES["A100"] if case == "addmm entry not offered" else PROFILES["H100"]
    user = {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON"} if case == "backends TRITON" \
        else {"max_autotune": True}
    with fake_cuda(profile.properties()):
        with inductor_config.patch(max_autotune_gemm=True), recording() as rec:
            lower(op, shapes, torch.bfloat16)
        keys = {e.device_key for e in rec.events}
        entry = {"template_id": "triton::mm_persistent_tma" if case == "addmm entry not offered" else "triton::mm",
                 **TRITON_PARAMS, "BLOCK_M": 128, "BLOCK_N": 128}
        if case == "mm stale":
            entry["template_hash"] = "0" * 16
        table = {k: [entry] for k in keys} if case in ("addmm entry not offered", "mm stale") else \
            {f"{profile.name}+((torch.bfloat16, [8, 8], [8, 1]), (torch.bfloat16, [8, 8], [8, 1]))+mm": [entry]}
        with inductor_config.patch(user):
            without = Counter(lower(op, shapes, torch.bfloat16).uids)
            with use_table(table, device="cuda") as installed:
                got = Counter(lower(op, shapes, torch.bfloat16).uids)
        with use_table(table, device="cuda"):  # no max-autotune of the user's: Inductor's default, ATen
            plain = Counter(lower(op, shapes, torch.bfloat16).uids)
    assert sum(without.values()) > 1 and got == without, (got, without)
    assert plain == Counter({f"aten::{op}": 1}), plain
    assert not installed.report.hits


@pytest.mark.parametrize("case", ["addmm default entry", "nested install", "a TMA entry elsewhere",
                                  "inside a CPU table"])
def test_what_the_users_max_autotune_does_not_change(case):
    """A review of the fix above (session 39): an addmm the table decides with Inductor's default
    (aten::addmm under its ATen key, as export ships it where no claim clears) compiles ATen alone
    under the user's max-autotune too (its templates' pass had no entry and autotuned 21 Triton
    configs beside it); a table installed inside another reads the user's settings from before the
    first (it read the outer table's max_autotune_gemm and autotuned every miss); a miss beside a
    persistent-TMA entry gets no TMA choices, which use_table turned on for the entry only."""
    from collections import Counter

    from zhantune.inductor.runtime import use_table

    op = "addmm" if case.startswith("addmm") else "mm"
    shapes = [(512,), (256, 256), (256, 512)] if op == "addmm" else [(256, 256), (256, 512)]
    with fake_cuda():
        with inductor_config.patch(max_autotune_gemm=True), recording() as rec:
            lower(op, shapes, torch.bfloat16)
        own = rec.events[0].device_key  # mm: its one lookup; addmm: its ATen lookup (1-D bias)
        other = f"{PROFILES['H100'].name}+((torch.bfloat16, [8, 8], [8, 1]), (torch.bfloat16, [8, 8], [8, 1]))+mm"
        if case == "addmm default entry":
            with inductor_config.patch(max_autotune=True), use_table({own: [{"template_id": "aten::addmm"}]},
                                                                     device="cuda") as installed:
                got = Counter(lower(op, shapes, torch.bfloat16).uids)
            assert got == Counter({"aten::addmm": 1}) and installed.report.hits == {own: 1}, got
        elif case == "nested install":
            table = {other: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
            with use_table(table, device="cuda"), use_table(table, device="cuda"):
                got = Counter(lower(op, shapes, torch.bfloat16).uids)
            assert got == Counter({"aten::mm": 1}), got
        elif case == "inside a CPU table":  # a CPU table patches nothing a CUDA one reads of the user's
            table = {other: [{"template_id": "triton::mm", **TRITON_PARAMS}]}
            with use_table({}, device="cpu"), inductor_config.patch(max_autotune_gemm=True):
                without = Counter(lower(op, shapes, torch.bfloat16).uids)
                with use_table(table, device="cuda"):
                    got = Counter(lower(op, shapes, torch.bfloat16).uids)
            assert sum(without.values()) > 1 and got == without, (got, without)
        else:
            table = {other: [{"template_id": "triton::mm_persistent_tma", **TRITON_PARAMS, "BLOCK_K": 64}]}
            with inductor_config.patch(max_autotune=True):
                without = Counter(lower(op, shapes, torch.bfloat16).uids)
                with use_table(table, device="cuda"):
                    got = Counter(lower(op, shapes, torch.bfloat16).uids)
            assert "triton::mm_persistent_tma" not in without and got == without, (got, without)
