"""Ship a table with a model: collect, tune the problems, export, use_table in a fresh process, check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from compiles import lookups_seen
from omegaconf import OmegaConf

from zhantune.inductor.table import CONFIG_TEMPLATE_ID, FORMAT, read_table
from zhantune.inductor.table_choices import stale_reason
from zhantune.problemset import allocate_trials

MLP = ["model=zhantune.models:mlp", "model_kwargs={d_model:64,hidden:128,layers:1}", "input_shapes=[[32,64]]"]

USE_TABLE = textwrap.dedent("""
    import json, sys, torch
    from torch._dynamo.utils import counters
    import zhantune
    from zhantune.models import build_model, example_inputs

    model = build_model("zhantune.models:mlp", {"d_model": 64, "hidden": 128, "layers": 1})
    x = example_inputs([[32, 64]], torch.float32)
    torch._inductor.config.freezing = True   # the README's inference compile (the C++ template needs it)
    with zhantune.use_table(sys.argv[1]), torch.no_grad():
        out = torch.compile(model)(*x)
    report = zhantune.table_report()
    err = ((out - model(*x)).abs().max() / model(*x).abs().max()).item()
    print(json.dumps({"report": report.as_dict(), "error": err,
                      "cpp_kernels": counters["inductor"]["cpp_templated_kernel_counter"]}))
""")


@pytest.mark.slow
def test_collect_tune_export_then_every_key_hits_in_a_fresh_process(cli, tmp_path):
    r = cli([*MLP, "out=problems.yaml"], tmp_path, module="zhantune.collect")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = yaml.safe_load((tmp_path / "problems.yaml").read_text())
    problems = doc["problems"]
    # Linear(64,128) + GELU and Linear(128,64): linear_act:gelu and addmm with nn.Linear's [N, K] weight,
    # each once (tests/test_collect.py: the activation's problem makes the same lookup)
    assert sorted((p["op"], p.get("activation"), tuple(p["shape"])) for p in problems) == [
        ("addmm", None, (32, 64, 128)), ("linear_act", "gelu", (32, 128, 64))]
    assert all(p["weight_layout"] == "nk" and p["count"] == 1 for p in problems)
    assert all(p["default_us"] > 0 for p in problems)
    assert sum(p["share"] for p in problems) == pytest.approx(1.0)

    # the database already holds another problem: it stays out of the model's table (keys asserted below)
    r = cli(["+op=mm", "shape=[16,16,16]", "device=cpu", "search.n_trials=1", "bench.remeasure_rounds=0",
             "bench.isolate=false", "progress=false", "storage.url=sqlite:///z.db", "export.enabled=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # two re-measure rounds (close calls, speedup over the default: the fewest that can confirm a claim)
    # bound the test's compiles; the rounds themselves are tested in test_timing.py and test_noise.py
    r = cli(["problems=problems.yaml", "search.n_trials=2", "bench.isolate=false", "progress=false",
             "bench.remeasure_rounds=2", "storage.url=sqlite:///z.db", "export.path=table.json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # each problem's header whole off a terminal (a rule cut it to "... 6 tri…")
    assert re.search(r"problem 2/2 \S+ x1 \(\d+% of the model's GEMM time\): \d+ trials; \d+/\d+ done overall",
                     r.stdout), r.stdout[:3000]
    tf = read_table(tmp_path / "table.json")
    assert tf.meta["format"] == FORMAT and tf.meta["torch"] == torch.__version__
    assert [d["kind"] for d in tf.meta["devices"]] == ["cpu"]
    assert len(tf.table) == 2
    # the table's keys are the model's own keys (device key + the collected device-agnostic key)
    device_key = doc["device"]["key"]
    assert sorted(tf.table) == sorted(f"{device_key}+{p['lookup_key']}" for p in problems)
    # the export app: the whole database, or with problems= the model's table again
    for extra, keys in (([], 3), (["problems=problems.yaml"], 2)):
        r = cli(["storage.url=sqlite:///z.db", "path=exported.json", *extra], tmp_path, module="zhantune.export")
        assert r.returncode == 0 and f"wrote {keys} key(s)" in r.stdout, r.stdout + r.stderr
    assert read_table(tmp_path / "exported.json").table == tf.table
    other = dict(doc, problems=[dict(problems[0], shape=[8, 8, 8])])
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    r = cli(["storage.url=sqlite:///z.db", "path=other.json", "problems=other.yaml"], tmp_path, module="zhantune.export")
    assert r.returncode == 2 and "problems=other.yaml: none of its 1 problem(s) is in sqlite:///z.db" in r.stderr
    assert not (tmp_path / "other.json").exists()

    # the run's Inductor cache (tests/conftest.py), the FX graph and AOTAutograd caches off: the compile
    # makes its lookups (tests/compiles.py), and the kernels (and the ISA probe's) built before load
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    out = subprocess.run([sys.executable, "-c", USE_TABLE, str(tmp_path / "table.json")], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    report = got["report"]
    assert report["misses"] == {} and report["stale"] == {}
    assert sorted(report["hits"]) == sorted(tf.table) and report["coverage"] == 1.0
    assert got["error"] < 1e-4
    # each C++-template entry really compiled the C++ template, and only those
    cpp_entries = sum(1 for entries in tf.table.values() if entries[0]["template_id"] == CONFIG_TEMPLATE_ID
                      and entries[0]["config_patch"].get("max_autotune_gemm_backends") == "CPP")
    assert got["cpp_kernels"] == cpp_entries

    check_cache = tmp_path / "check_cache"
    r = cli([*MLP, "table=table.json", "json=check.json", "bench.target_ms=20"],
            tmp_path, module="zhantune.check", env={"TORCHINDUCTOR_CACHE_DIR": str(check_cache)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # its cold compiles (force_disable_caches) ran in a scratch directory: nothing left in Inductor's
    assert not list(check_cache.glob("tmp*")) and not list(check_cache.rglob("*.so"))
    check = json.loads((tmp_path / "check.json").read_text())
    assert set(check["ways"]) == {"table", "default", "max-autotune"}
    for way in check["ways"].values():
        assert way["compile_s"] > 0 and way["run_us"] > 0 and way["error"] < 1e-4
        # timed in interleaved rounds: the fastest run of check's 5 rounds, with the paired ratio
        assert len(way["rounds_us"]) == check["rounds"] == 5 and way["run_us"] == min(way["rounds_us"])
        v = way["vs_default"]  # the ratio only where the rounds show it, else why not ("~" on the terminal)
        assert (v["ratio"] is None) is (not v["consistent"]) is (v["reason"] is not None)
        assert v["ratio_low"] <= (v["ratio"] or v["unconfirmed_ratio"]) * 1.0001
    assert check["contention"]["timed"] == 15
    assert check["report"]["coverage"] == 1.0
    assert "compile s" in r.stdout and "coverage 100%" in r.stdout
    # not a terminal: the table's cells whole (no "max-autot..."), no Inductor autotuning report
    assert "│ max-autotune │" in r.stdout and "…" not in r.stdout
    assert "AUTOTUNE" not in r.stdout + r.stderr and "Autotune Choices Stats" not in r.stdout + r.stderr

    # a table made with another torch release is reported stale, not used, and fails check's gate (here
    # in this process: a check run takes 15 s; an all-stale table's "same code" is test_noise.py's)
    data = json.loads((tmp_path / "table.json").read_text())
    data["torch"] = "2.1.0"
    (tmp_path / "old.json").write_text(json.dumps(data))
    from rich.console import Console

    from zhantune import use_table
    from zhantune.check import _verdict
    from zhantune.models import build_model, example_inputs

    model, x = build_model("zhantune.models:mlp", {"d_model": 64, "hidden": 128, "layers": 1}), \
        example_inputs([[32, 64]], torch.float32)
    torch._dynamo.reset()
    with use_table(tmp_path / "old.json") as installed, torch.no_grad(), \
            lookups_seen(freezing=True):
        torch.compile(model)(*x)
    old = installed.report
    assert sorted(old.stale) == sorted(tf.table) and all("torch 2.1.0" in why for why in old.stale.values())
    assert old.hits == {} and old.coverage == 0.0
    console = Console(record=True, width=300)
    assert _verdict(console, OmegaConf.create({"min_coverage": 1.0}), {"report": old, "ways": {}}, 1e-4) == 1
    assert "coverage 0% is below min_coverage 100%" in console.export_text()


@pytest.mark.slow
def test_collect_counts_repeated_gemms_of_a_transformer_block(cli, tmp_path):
    r = cli(["model=zhantune.models:transformer_block",
             "model_kwargs={d_model:32,heads:2,hidden:64}", "input_shapes=[[2,8,32]]", "measure=false"],
            tmp_path, module="zhantune.collect")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = yaml.safe_load((tmp_path / "problems.yaml").read_text())
    counts = {tuple(p["shape"]): p["count"] for p in doc["problems"]}
    # q, k, v and the output projection share one key; the MLP's two layers one each
    assert counts == {(16, 32, 32): 4, (16, 64, 32): 1, (16, 32, 64): 1}


def test_template_hash_mismatch_is_stale_with_inductors_real_template_hash():
    from torch._inductor.kernel.mm import mm_template

    offered = {mm_template.uid: mm_template.src_hash, "aten::mm": None}
    entry = {"template_id": "triton::mm", "BLOCK_M": 64}
    assert stale_reason(entry, offered) is None  # no hash in the entry: kept, as Inductor does
    assert stale_reason({**entry, "template_hash": mm_template.src_hash}, offered) is None
    why = stale_reason({**entry, "template_hash": "0" * 64}, offered)
    assert why and mm_template.src_hash in why
    assert stale_reason({"template_id": "aten::mm", "template_hash": "x"}, offered) is None
    with torch._inductor.config.patch({"lookup_table.check_src_hash": False}):
        assert stale_reason({**entry, "template_hash": "0" * 64}, offered) is None


KEY = "((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"


@pytest.mark.parametrize("content, message", [  # every malformed table: tests/test_units.py
    (json.dumps({"format": FORMAT, "format_version": 1, "torch": "2.13.0",
                 "table": {KEY: [{"template_id": "triton::mm", "BLOCK_M": [64]}]}}),
     f'table[{json.dumps(KEY)}][0].BLOCK_M: BLOCK_M=[64] is not allowed; expected one of 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096'),
])
def test_malformed_table_is_one_line_exit_2_naming_file_and_key_path(cli, tmp_path, content, message):
    (tmp_path / "bad.json").write_text(content)
    r = cli([*MLP, "table=bad.json"], tmp_path, module="zhantune.check")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "bad.json" in r.stderr and message in r.stderr


@pytest.mark.parametrize("edit, message", [
    ({"format_version": 9}, "format_version: this zhantune reads versions 1 and 2, got 9"),
    ({"format_version": "1"}, "format_version: this zhantune reads versions 1 and 2, got '1'"),
    ({"dtype": "int8"}, "problems[0].dtype: 'int8'; allowed: float32, bfloat16, float16"),
    ({"weight_layout": "zz"}, "problems[0].weight_layout: 'zz' for op addmm; allowed: kn, nk"),
    ({"bogus": 1}, "problems[0].bogus: not a key of a problem (a typo?); allowed: op, shape, dtype"),
    ({"twice": True}, "problems[1]: the same problem as problems[0]: it would be tuned once and counted twice"),
    ({"twice": "another key"}, "problems[1]: the same problem as problems[0]: it would be tuned once and counted twice"),
    ({"twice": "shares"}, "problems[].share: they add up to 1.8; each is the problem's part of the model's GEMM time"),
    ({"activation": "gelu"}, "problems[0].activation: 'gelu' for op addmm: only linear_act takes an activation"),
    ({"op": "linear_act", "activation": "swish"}, "problems[0].activation: 'swish'; allowed: relu, gelu"),
    ({"op": "linear_act", "activation": None}, "problems[0].activation: null for op linear_act; give one of relu, gelu"),
    ({"shape": [10**9, 10**9, 64]}, "problems[0].shape=[1000000000,1000000000,64]: addmm in float32 needs at least"),
])
def test_malformed_problems_file_is_one_line_naming_file_and_key_path(cli, tmp_path, existing_db, edit, message):
    """A problems file of another format version, or a problem whose dtype or layout is not allowed,
    or whose shape cannot fit in memory (named as a shape= override before), is refused naming the
    file and the key; the database is left as it was."""
    row = {"op": "addmm", "shape": [64, 64, 64], "dtype": "float32", "weight_layout": "nk", "count": 1}
    doc = {"format": "zhantune-problems", "format_version": 1, "problems": [row]}
    if "format_version" in edit:
        doc.update(edit)
    elif "twice" in edit:  # a second row of another lookup key too (a helper's: it tuned nothing, counted twice)
        doc["problems"] = [row, {**row, **({"lookup_key": "((torch.float32, [64], [1]))+addmm"}
                                           if edit["twice"] == "another key" else {})}]
        if edit["twice"] == "shares":
            doc["problems"] = [{**row, "share": 0.9}, {**row, "shape": [32, 64, 64], "share": 0.9}]
    else:
        row.update(edit)
    path = tmp_path / "problems.yaml"
    path.write_text(yaml.safe_dump(doc))
    before = existing_db.read_bytes()
    r = cli([f"problems={path}", f"storage.url=sqlite:///{existing_db}", "search.total_trials=2",
             "export.enabled=false"], tmp_path)
    assert r.returncode == 2 and f"{path}: {message}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert existing_db.read_bytes() == before


def test_problems_file_fields_are_typed_and_aliases_counted_unexpanded(tmp_path):
    """read_problems (the CLI's one-line path is the test above): a bool count and a mapping lookup
    key were tracebacks; anchors nested ten wide expand 10^depth-fold when loaded (a 330-byte file
    ran an export for minutes): counted on the composed graph and refused, while PyYAML's own
    anchors for a shared value still read."""
    from zhantune.errors import ConfigError
    from zhantune.problemset import read_problems

    row = {"op": "addmm", "shape": [64, 64, 64], "dtype": "float32", "weight_layout": "nk", "count": 1}
    path = tmp_path / "p.yaml"
    for edit, message in [({"count": True}, "problems[0].count: True; a positive integer of at most"),
                          ({"lookup_key": {"a": 1}}, "problems[0].lookup_key: {'a': 1} must be one line of text")]:
        path.write_text(yaml.safe_dump({"format": "zhantune-problems", "problems": [{**row, **edit}]}))
        with pytest.raises(ConfigError, match=re.escape(message)):
            read_problems(path)
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path.write_text("format: zhantune-problems\n" + "\n".join(lines) + "\nproblems: *a8\n")
    with pytest.raises(ConfigError, match=r"its YAML aliases expand to [\d,]+ values, over the 1,000,000"):
        read_problems(path)
    shared = {"inputs": [[64, 64]]}  # one object twice: PyYAML writes an anchor and an alias
    path.write_text(yaml.safe_dump({"format": "zhantune-problems", "problems": [
        {**row, "inputs": shared["inputs"]}, {**row, "shape": [32, 64, 64], "inputs": shared["inputs"]}]}))
    assert "&id001" in path.read_text() and len(read_problems(path)) == 2
    # a linear_act row takes conf/op/linear_act.yaml's activation, as its tune does (it was refused: "op
    # linear_act needs op.activation", which a row cannot give; a helper's finding)
    from zhantune.problems.file import problem_keys

    path.write_text(yaml.safe_dump({"format": "zhantune-problems", "problems": [{"op": "linear_act", "shape": [16, 16, 16]}]}))
    assert len(read_problems(path)) == 1 and problem_keys(path) == ["linear_act[M=16,N=16,K=16]:float32:relu"]
    # collect writes the model's own activation (tests/test_collect.py), which the tune of the row takes
    from zhantune.problemset import _problem_cfg

    gelu = {"op": "linear_act", "shape": [16, 16, 16], "activation": "gelu", "note": "a note"}
    path.write_text(yaml.safe_dump({"format": "zhantune-problems", "problems": [gelu, {**gelu, "activation": "relu"}]}))
    assert problem_keys(path) == ["linear_act[M=16,N=16,K=16]:float32:gelu", "linear_act[M=16,N=16,K=16]:float32:relu"]
    assert _problem_cfg(OmegaConf.create({"search": {}, "export": {}}), gelu, 2).op.activation == "gelu"


def test_allocate_trials_follows_shares_with_a_floor():
    rows = [{"shape": [8, 8, 8], "share": 0.7}, {"shape": [8, 8, 8], "share": 0.2}, {"shape": [8, 8, 8], "share": 0.1}]
    assert allocate_trials(rows, 20, 2) == [14, 4, 2]
    assert sum(allocate_trials(rows, 21, 2)) == 21
    assert allocate_trials(rows, 3, 2) == [1, 1, 1]  # the total wins over the floor
    assert allocate_trials(rows, 7, 2) == [3, 2, 2]
    # a helper's: a large problem and nine small ones, 12 trials: the floor was added on top (29 ran)
    big_and_small = [{"shape": [1024, 1024, 1024]}] + [{"shape": [8, 8, 8]}] * 9
    assert allocate_trials(big_and_small, 12, 2) == [3, *[1] * 9]
    assert allocate_trials(big_and_small, 30, 2) == [12, *[2] * 9]
    for total in range(10, 60):
        assert sum(allocate_trials(big_and_small, total, 2)) == total
    no_shares = [{"shape": [64, 64, 64], "count": 1}, {"shape": [64, 64, 64], "count": 3}]
    assert allocate_trials(no_shares, 8, 1) == [2, 6]  # count x FLOPs where shares are missing


def test_replay_measures_a_cpu_default_entry_as_the_aten_config():
    from types import SimpleNamespace

    from zhantune.candidate import Candidate
    from zhantune.inductor.builder import table_candidates

    key = "AMD EPYC+((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"
    row = SimpleNamespace(shape={"M": 8, "N": 8, "K": 8})  # a problem row
    problems = {key.split("+", 1)[1]: row}
    ((got_row, (cpu,)),) = table_candidates({key: [{"template_id": "aten::mm"}]}, problems, "t.json", "cpu")
    aten_point = Candidate("aten", "config", None, {"max_autotune_gemm_backends": "ATEN"})
    assert got_row is row and cpu.scope == "config" and cpu.config_hash == aten_point.config_hash
    ((_, (cuda,)),) = table_candidates({key: [{"template_id": "aten::mm"}]}, problems, "t.json", "cuda")
    assert cuda.scope == "template" and cuda.template_id == "aten::mm"


def test_a_replay_measures_a_keys_entries_on_the_problems_of_the_activations_they_were_tuned_with():
    """A helper's: an addmm and a linear_act gelu of one shape share a CPU lookup key, and the replay
    measured a gelu-tagged entry on whichever problem was stored last (the plain addmm), settling its
    claim there. The table's activations now pick the problems (each of a list's; every problem of
    the key where the table does not say), and none of them in the database is refused."""
    from types import SimpleNamespace

    from zhantune.errors import TableError
    from zhantune.inductor.builder import table_candidates

    agnostic = "((torch.float32, [64], [1]), (torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 64], [1, 8]))+addmm"
    key = f"AMD EPYC (2 threads)+{agnostic}"
    plain, gelu = (SimpleNamespace(shape={"M": 8, "N": 64, "K": 8}, activation=a) for a in (None, "gelu"))
    tuned = {"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}
    problems, table = {agnostic: [gelu, plain]}, {key: [tuned]}

    def measured_on(activations):
        return [row for row, _ in table_candidates(table, problems, "t.json", "cpu", activations)]

    assert measured_on({key: "gelu"}) == [gelu] and measured_on({}) == [plain]
    assert measured_on({key: ["gelu", None]}) == [gelu, plain] and measured_on(None) == [gelu, plain]
    with pytest.raises(TableError, match=r"\]: its entries were measured with relu fused; no problem of this key in "
                                         "the database was: use the database the table was exported from"):
        measured_on({key: "relu"})
    # Inductor's default (a key two problems' different choices share: untagged) on each of them (a review's)
    for default in ([{"template_id": "aten::addmm"}], []):
        table = {key: default}
        assert measured_on({}) == [gelu, plain] and measured_on({key: "relu"}) == [gelu, plain]


@pytest.mark.slow
def test_export_options_on_a_real_cpu_tune(tune_cfg, cli, tmp_path):
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.table import default_entry
    from zhantune.storage import Store
    from zhantune.tune import resolve_run, tune

    url = f"sqlite:///{tmp_path}/z.db"
    cfg = tune_cfg(["+op=mm", "shape=[48,32,16]", "device=cpu", "search.n_trials=4", "bench.isolate=false",
                    "bench.target_ms=10", "bench.warmup_ms=2", "space=[cpp_gemm]", f"storage.url={url}",
                    "export.enabled=false"])
    # space=[cpp_gemm]: two tuned entries whatever the timings (with ATen in the space, a slow phase
    # during the template's trials can rank ATen first, and a table whose fastest entry is Inductor's
    # own kernel ships the default entry alone)
    result = tune(resolve_run(cfg), Store(url))
    store = Store(url)
    ok = sorted((r for r in store.measurements(result.study_id) if r.kind in ("candidate", "remeasure")
                 and r.status == "ok"), key=lambda r: r.median_us)
    assert len({r.config_hash for r in ok}) >= 2

    (key, entries), = build_table(store, top_k=2).items()
    assert len(entries) == 2  # the two fastest distinct configs, fastest first
    ranked = store.ranked_candidates(top_k=2)[0][2]
    assert [e["config_patch"] for e in entries] == [dict(sorted(r.params.items())) for r in ranked]
    # a tuned entry must beat the default by 1000x: the key gets Inductor's default choice instead
    assert build_table(store, min_speedup=1000.0) == {key: [default_entry("mm")]}
    assert build_table(store, device_agnostic=True) == {key.split("+", 1)[1]: entries[:1]}
    assert build_table(store, torch_version="0.0.0") == {}

    r = cli([f"storage.url={url}", "path=bare.json", "format=inductor", "top_k=2", "min_speedup=null"], tmp_path,
            module="zhantune.export")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "bare.json").read_text()) == build_table(store, top_k=2)
    # min_speedup=null claims nothing, and says so, as top_k=2's second entries do (a review's
    # finding: nothing said so); a CPU table: stock Inductor makes no lookup on CPU (no GPU note)
    notes = [" ".join(line.split()) for line in r.stdout.split("\nnote: ")[1:]]
    assert notes == ["min_speedup=null: each key's fastest stored config ships as it was measured, never paired "
                     "with Inductor's default: the table claims no speedup",
                     "top_k=2: a key's entries after the first are the next fastest stored configs, never paired "
                     "with Inductor's default; Inductor autotunes among them when it compiles (CUDA; a CPU GEMM "
                     "compiles the first entry only)",
                     f"format=inductor: the bare table names no torch release, device kind or CPU ISA: zhantune.use_table "
                     f"cannot report its entries stale under a torch other than {torch.__version__} or on a CPU of "
                     "another ISA or cpuid, and serves them as hits (format=zhantune keeps them)",
                     "1 CPU key(s): stock Inductor makes no lookup on CPU; they apply through "
                     "zhantune.use_table only"], r.stdout
    r = cli([f"storage.url={url}", "path=none.json", "torch_version=0.0.0"], tmp_path, module="zhantune.export")
    assert r.returncode == 2 and "with torch 0.0.0" in r.stderr and not (tmp_path / "none.json").exists()
    for bad in ("0", "65"):  # a table holds at most 64 entries per key (each a kernel Inductor compiles)
        r = cli([f"storage.url={url}", f"top_k={bad}"], tmp_path, module="zhantune.export")
        assert r.returncode == 2 and f"top_k={bad} must be 1 to 64 (entries per key)" in r.stderr
    for bad in ("nan", "0.99"):  # nan < 1.0 is false: it passed, and shipped the default everywhere
        r = cli([f"storage.url={url}", f"min_speedup={bad}"], tmp_path, module="zhantune.export")
        assert r.returncode == 2 and f"min_speedup={bad} must be a number of at least 1.0" in r.stderr, r.stderr


def test_addmm_template_winner_goes_under_the_key_its_template_hit(tmp_path):
    """Inductor looks addmm's ATen kernel up with the 1-D bias and its Triton templates with the
    expanded bias (torch/_inductor/kernel/mm.py tuned_addmm): the winner is exported under the key
    its template hit, and the ATen key gets [] ("nothing from this lookup")."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.candidate import Candidate
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.inductor.table import read_table
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder, Store

    dev = "NVIDIA H100 80GB HBM3"
    aten_key = ("((torch.bfloat16, [64], [1]), (torch.bfloat16, [32, 16], [16, 1]), "
                "(torch.bfloat16, [16, 64], [64, 1]))+alpha=1&beta=1+addmm")
    expanded_key = ("((torch.bfloat16, [32, 64], [0, 1]), (torch.bfloat16, [32, 16], [16, 1]), "
                    "(torch.bfloat16, [16, 64], [64, 1]))+alpha=1&beta=1+addmm")
    store = Store(f"sqlite:///{tmp_path}/z.db")
    problem = GemmProblem("addmm", (32, 64, 16), "bfloat16")
    device_id = store.device_id(dev, dev, "cuda", {})
    problem_id = store.problem_id(problem.key, lookup_key=aten_key, **problem.row_fields())
    study_id = store.study_id("s", {})
    rec = Recorder(store, problem, study_id, device_id, problem_id)
    hit = LookupEvent("addmm", f"{dev}+{expanded_key}", expanded_key, {"triton::mm": "abc"}, ("triton::mm",))
    cand = Candidate("triton_mm", "template", "triton::mm", {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16})
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t"), template_hash="abc", lookup=hit),
            "candidate", cand, trial_number=0)
    table = build_table(store)
    assert table == {f"{dev}+{expanded_key}": [{"template_id": "triton::mm", "BLOCK_M": 32, "BLOCK_N": 64,
                                                 "BLOCK_K": 16, "template_hash": "abc"}],  # 16 | K: no EVEN_K
                     f"{dev}+{aten_key}": []}
    assert read_table(table).table == table


def _linear_and_bmm():
    """``compile_with(table)``: compiles a module with a prepacked linear (frozen weight) and an
    unpacked bmm under ``use_table(table)`` (caches off), checks both outputs against eager and
    returns the table's report."""
    from zhantune.inductor.runtime import use_table

    w, b1, b2 = torch.randn(48, 32), torch.randn(2, 16, 24), torch.randn(2, 24, 8)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w)

        def forward(self, x, a, b):
            return x @ self.w, torch.bmm(a, b)

    def compile_with(table):
        torch._dynamo.reset()
        with use_table(table) as installed, torch.no_grad(), \
                lookups_seen(freezing=True):
            out = torch.compile(Two())(torch.ones(16, 48), b1, b2)
        assert torch.allclose(out[0], torch.ones(16, 48) @ w, rtol=1e-4, atol=1e-4)
        assert torch.allclose(out[1], torch.bmm(b1, b2), rtol=1e-4, atol=1e-4)
        return installed.report

    return compile_with


def test_an_entry_measured_with_one_activation_is_stale_on_a_gemm_that_feeds_another():
    """A helper's attack (session 45): a table tuned on a Linear + GELU (linear_act, GELU fused into
    the C++ template) hit, coverage 100%, on the same Linear followed by relu, silu or nothing, which
    no one measured. A table file of version 2 names each key's activation (none where not listed):
    an entry is stale where the GEMM feeds another one, and Inductor's default compiles; a table that
    does not say (version 1, Inductor's format) is not compared."""
    import torch.nn.functional as F

    from zhantune.inductor.runtime import use_table
    from zhantune.inductor.table import FORMAT

    lin = torch.nn.Linear(32, 48)
    residual = torch.randn(16, 48)
    acts = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu, None: lambda t: t, "add": lambda t: t + residual}

    class LinearAct(torch.nn.Module):
        def __init__(self, act):
            super().__init__()
            self.lin, self.act = lin, acts[act]

        def forward(self, x):
            return self.act(self.lin(x))

    def compile_with(table, act):
        torch._dynamo.reset()
        x = torch.randn(16, 32)
        with use_table(table) as installed, torch.no_grad(), \
                lookups_seen(freezing=True):
            out = torch.compile(LinearAct(act).eval())(x)
        assert torch.allclose(out, LinearAct(act)(x), rtol=1e-4, atol=1e-4)
        return installed.report

    (key,) = compile_with({}, "gelu").misses
    entry = [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": {"max_autotune_gemm_backends": "CPP",
              "cpp.gemm_max_k_slices": 1, "cpp.gemm_cache_blocking": None, "cpp.gemm_thread_factors": None}}]

    def wrapped(version, activations):
        return {"format": FORMAT, "format_version": version, "torch": str(torch.__version__), "table": {key: entry},
                **({"activations": activations} if version > 1 else {})}

    assert compile_with(wrapped(2, {key: "gelu"}), "gelu").hits == {key: 1}
    for act, feeds in (("relu", "relu"), ("silu", "no relu or gelu alone"), (None, "no relu or gelu alone")):
        report = compile_with(wrapped(2, {key: "gelu"}), act)
        assert report.hits == {} and report.stale[key].startswith(
            f"measured with gelu fused after the GEMM, and this GEMM's output feeds {feeds}: never measured so"), report
    report = compile_with(wrapped(2, {}), "relu")  # measured bare
    assert report.stale[key].startswith("measured with no activation fused after the GEMM, and this GEMM's output "
                                        "feeds relu"), report.as_dict()
    silu = compile_with(wrapped(2, {}), "silu")  # not modelled: collect tunes it bare, noted
    assert silu.hits == {key: 1} and silu.notes[key].startswith(  # and the hit says so (a helper's, session 46)
        "its output feeds silu here, which the entry was not measured with"), silu.as_dict()
    added = compile_with(wrapped(2, {}), "add")  # a residual add, which the C++ template fuses: noted too
    assert added.hits == {key: 1} and added.notes[key].startswith(
        "its output feeds a residual add here, which the entry was not measured with"), added.as_dict()
    assert compile_with(wrapped(1, None), "relu").hits == {key: 1}  # the table does not say
    assert not compile_with(wrapped(2, {key: "gelu"}), "gelu").notes  # measured with it: nothing to note
    # one key's equal entries tuned for problems of several activations: each of them hits, others are stale
    for act in ("gelu", None):
        assert compile_with(wrapped(3, {key: ["gelu", None]}), act).hits == {key: 1}
    assert compile_with(wrapped(3, {key: ["gelu", None]}), "relu").stale[key].startswith(
        "measured with gelu or no activation fused after the GEMM, and this GEMM's output feeds relu")
    from types import SimpleNamespace

    from zhantune.inductor.epilogue import Epilogue, unmeasured_epilogue

    hand = SimpleNamespace(op_name="mm", epilogue=Epilogue(None, False, "relu", hand_bias=True))  # relu(x @ w + b)
    assert unmeasured_epilogue(hand).startswith("its output feeds a 1-D tensor added by the model's own add, then relu")
    no_field = {k: v for k, v in wrapped(2, {}).items() if k != "activations"}  # version 2: none recorded
    assert compile_with(no_field, "gelu").stale[key].startswith("measured with no activation fused")
    # Inductor's default entry compiles what Inductor would anyway: never stale (a helper saw compare's
    # portable table report its own defaults stale)
    assert compile_with({**wrapped(2, {}), "table": {key: [{"template_id": "aten::addmm"}]}}, "gelu").hits == {key: 1}


def test_a_gpu_template_entry_on_cpu_is_stale_not_a_hit():
    """A table made on a GPU (device-agnostic keys, triton::mm entries) used on CPU: Inductor's CPU
    GEMM cannot run the entry, so the lookup is stale (it was a hit at 100% coverage, with
    Inductor's default compiled), for a prepacked linear and for an unpacked bmm alike."""
    compile_with = _linear_and_bmm()
    keys = list(compile_with({}).misses)  # the keys Inductor asks with, device-agnostic
    assert len(keys) == 2
    gpu = {k.split("+", 1)[1] if not k.startswith("((") else k:
           [{"template_id": "triton::mm", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4,
             "num_stages": 2}] for k in keys}
    report = compile_with(gpu)
    assert report.hits == {} and report.coverage == 0.0, report.as_dict()
    assert sorted(report.stale_count.values()) == [1, 1]
    assert all(why.startswith("triton::mm is not a CPU choice (a GPU template") for why in report.stale.values())


def test_thread_factors_for_another_thread_count_or_a_bmm_are_stale_and_the_default_compiles():
    """A tune picks ``cpp.gemm_thread_factors`` whose product is its machine's thread count, and
    Inductor asserts that product equals the count it compiles for: the same table on a machine
    (or process, torch.set_num_threads) with another count crashed the user's compile with
    Inductor's AssertionError. On a bmm, Inductor's C++ BMM template aborted the whole process
    ("Not all partitions are assigned") with factors for this very count. Now each such entry is
    stale (the reason says which) and Inductor's default compiles; a linear's factors for this
    process's count still hit."""
    from torch._inductor.utils import parallel_num_threads

    compile_with = _linear_and_bmm()
    keys = list(compile_with({}).misses)
    linear, bmm = sorted(keys, key=lambda k: k.endswith("+bmm"))
    assert bmm.endswith("+bmm") and not linear.endswith("+bmm"), keys
    n = parallel_num_threads()
    if n == 1:
        pytest.skip("one thread: the BMM template aborts only with factors for more than one")

    def table(factors: str) -> dict:
        return {k: [{"template_id": CONFIG_TEMPLATE_ID, "config_patch": {
            "max_autotune_gemm_backends": "CPP", "cpp.gemm_thread_factors": factors, "cpp.gemm_max_k_slices": 1,
            "cpp.gemm_cache_blocking": None}}] for k in keys}

    report = compile_with(table(f"1,1,{n + 1}"))
    assert report.hits == {} and set(report.stale) == {linear, bmm}, report.as_dict()
    assert report.stale[linear] == (f"cpp.gemm_thread_factors=1,1,{n + 1} is for {n + 1} thread(s), this process "
                                    f"compiles for {n} (torch.get_num_threads()); Inductor's default compiled")
    report = compile_with(table(f"1,1,{n}"))
    assert report.hits == {linear: 1} and set(report.stale) == {bmm}, report.as_dict()
    assert report.stale[bmm].startswith(f"cpp.gemm_thread_factors=1,1,{n} on a bmm: Inductor's C++ BMM template")
