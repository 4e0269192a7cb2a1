"""Problems, timing statistics, the store and the table file: real components, known inputs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from zhantune.bench.inductor import relative_error
from zhantune.bench.timing import time_cpu
from zhantune.errors import ConfigError, TableError
from zhantune.inductor.table import FORMAT, load_table, write_table
from zhantune.problems import GemmProblem
from zhantune.storage import Store


@pytest.mark.parametrize("op,shape,flops", [("mm", [2, 3, 4], 48), ("bmm", [5, 2, 3, 4], 240),
                                             ("addmm", [8, 8, 8], 1024)])
def test_problem_flops_and_key(op, shape, flops):
    p = GemmProblem.from_config(op, shape, "float32")
    assert p.flops() == flops
    assert p.key.startswith(f"{op}[")
    assert p.tflops(1.0) == pytest.approx(flops / 1e-6 / 1e12)


@pytest.mark.parametrize("shape,message", [([0, 1, 1], "M=0 must be a positive integer"),
                                           (["a", "b", "c"], "M='a' is not an integer"),
                                           ([1, 2], "expected 3 positive integers"),
                                           ([1.5, 2, 2], "is not an integer"),
                                           (8, "expected 3 positive integers")])
def test_problem_bad_shapes(shape, message):
    with pytest.raises(ConfigError, match=message):
        GemmProblem.from_config("mm", shape, "float32")


def test_problem_reference_matches_eager_for_every_op():
    for op, shape in [("mm", [4, 5, 6]), ("addmm", [4, 5, 6]), ("bmm", [2, 4, 5, 6])]:
        p = GemmProblem.from_config(op, shape, "float32")
        module, inputs = p.build(torch.device("cpu"))
        with torch.no_grad():
            out = module(*inputs)
        assert out.shape == p.reference(module, inputs).shape
        assert relative_error(out, p.reference(module, inputs)) < 1e-6
    act = GemmProblem.from_config("linear_act", [4, 5, 6], "float32", "relu")
    module, inputs = act.build(torch.device("cpu"))
    assert (act.reference(module, inputs) >= 0).all()


def test_relative_error_flags_nan_and_shape():
    ref = torch.ones(2, 2, dtype=torch.float64)
    assert relative_error(torch.full((2, 2), float("nan")), ref) == float("inf")
    assert relative_error(torch.ones(3, 2), ref) == float("inf")
    assert relative_error(torch.full((2, 2), 1.5), ref) == pytest.approx(0.5)


def test_time_cpu_measures_a_real_sleep():
    import time

    t = time_cpu(lambda: time.sleep(0.002), warmup_ms=1, target_ms=20, min_reps=3, max_reps=20, flush_cache=False)
    assert t.n >= 3
    assert t.min_us >= 2000  # a 2 ms sleep never takes less
    assert t.min_us <= t.p20_us <= t.median_us <= t.p80_us <= t.max_us


def test_checking_a_database_keeps_this_processs_locks_on_it(tmp_path):
    """Store() checks an existing file before using it. Closing a plain file handle on the database
    would drop every POSIX lock this process's open connections hold on it: another process that
    then closes its connection believes it is the last one, checkpoints and deletes the WAL under
    them (the cause of a "database disk image is malformed" seen in the compare tests)."""
    import subprocess
    import sys

    path = tmp_path / "z.db"
    store = Store(f"sqlite:///{path}")
    store.device_id("cpu-a", "A", "cpu", {})  # a write: the WAL has frames; the pool keeps the connection
    wal = tmp_path / "z.db-wal"
    assert wal.exists()
    Store(f"sqlite:///{path}")  # the check, in a process holding a connection to the file
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                    "c.execute('select count(*) from zt_device').fetchone(); c.close()", str(path)], check=True)
    assert wal.exists()  # the other process knew it was not the last connection
    assert store.device_id("cpu-a", "A", "cpu", {}) == store.device_id("cpu-a", "A", "cpu", {})


def test_store_uses_wal(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/z.db")
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert {"zt_device", "zt_problem", "zt_study", "zt_measurement"} <= set(store.tables())


def test_table_round_trip_and_malformed(tmp_path):
    key = "dev+((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"
    table = {key: [{"template_id": "triton::mm", "BLOCK_M": 64, "num_warps": 4}]}
    path = write_table(tmp_path / "t.json", table)
    assert load_table(path) == table
    agnostic = key.split("+", 1)[1]
    for text, message in [("{", "not valid JSON"), ("[]", "expected a JSON object"),
                          ('{"nokey": []}', "not an Inductor lookup key"),
                          ('{"a+mm": []}', "not an Inductor lookup key"),
                          (json.dumps({key: [{"BLOCK_M": 1}]}), "string template_id"),
                          (json.dumps({key: [{"template_id": 3}]}), "string template_id"),
                          (json.dumps({key: {}}), "expected a list"),
                          (json.dumps({"format": FORMAT, "format_version": 4, "table": {}}),
                           "format_version: this zhantune reads versions 1, 2 and 3, got 4"),
                          (json.dumps({"format": FORMAT, "format_version": 1.0, "table": {}}),
                           "format_version: this zhantune reads versions 1, 2 and 3, got 1.0"),
                          (json.dumps({"format": FORMAT, "format_version": 1, "torch": "2.13.0",
                                       "table": {"mm[64,64,64]": []}}),
                           'table["mm[64,64,64]"]: not an Inductor lookup key'),
                          (json.dumps({"format": FORMAT, "format_version": 1, "torch": "2.13.0",
                                       "table": {agnostic: [{"template_id": "triton::mm", "BLOCK_M": [64]}]}}),
                           f"table[{json.dumps(agnostic)}][0].BLOCK_M: BLOCK_M=[64] is not allowed"),
                          # a tl.arange extent: 48 passed the allow-list and failed the user's compile
                          (json.dumps({key: [{"template_id": "triton::mm", "BLOCK_M": 48}]}),
                           "BLOCK_M=48 is not allowed")]:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(TableError, match=re.escape(message)) as e:
            load_table(tmp_path / "bad.json")
        assert "bad.json" in str(e.value)
    assert json.loads(path.read_text()) == table


def test_a_wrapper_the_reader_would_refuse_is_not_written(tmp_path):
    """An attack's finding: the export wrote (exit 0, replacing the old file) a wrapper its own reader
    refused, e.g. a source URL over 1,024 characters: write_table checked the table, not its wrapper."""
    key = "((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"
    table, meta = {key: [{"template_id": "aten::mm"}]}, {"format": FORMAT, "format_version": 1, "torch": torch.__version__}
    path = write_table(tmp_path / "t.json", table, meta)
    before = path.read_bytes()
    for bad, match in (({"source": "sqlite:///" + "./" * 600 + "a.db"}, "source: expected one line of printable text"),
                       ({"torch": "2.13.0+cpu x"}, "torch: expected a version such as"), ({"torch": None}, "torch: missing")):
        with pytest.raises(TableError, match=r"t\.json \(not written\): " + match):
            write_table(path, table, {**meta, **bad})
    assert path.read_bytes() == before and load_table(path) == table


def test_a_table_of_cpu_and_gpu_devices_loads_on_each_kind(tmp_path):
    """An export of a database with a CPU and a GPU device (export's default: every device) holds a
    CPU key with a C++-template config patch: read for CUDA it was refused whole ("CPP is not
    allowed"). Each device's keys are checked against its own kind's allow-list (the wrapper's
    ``devices``) and those of the other kind are left out; anything allowed on neither is refused."""
    from zhantune.inductor.table import read_table

    inputs = "((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"
    cpu_key, gpu_key = f"Intel Xeon+{inputs}", f"NVIDIA H100+{inputs}"
    cpp = {"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}
    table = {cpu_key: [cpp], gpu_key: [{"template_id": "triton::mm", "BLOCK_M": 64}]}
    meta = {"format": FORMAT, "format_version": 1, "torch": torch.__version__,
            "devices": [{"key": "Intel Xeon", "kind": "cpu"}, {"key": "NVIDIA H100", "kind": "cuda"}]}
    path = write_table(tmp_path / "mixed.json", table, meta)
    on_cuda, on_cpu, anywhere = read_table(path, "cuda"), read_table(path, "cpu"), read_table(path)
    assert on_cuda.table == {gpu_key: table[gpu_key]} and on_cuda.other_kind == {cpu_key: "cpu"}
    assert on_cpu.table == {cpu_key: table[cpu_key]} and on_cpu.other_kind == {gpu_key: "cuda"}
    assert anywhere.table == table and not anywhere.other_kind
    # use_table takes a TableFile as read (for any kind) and checks it again for its own: the same
    from zhantune.inductor.table import recheck_table

    assert recheck_table(anywhere, "cuda") == on_cuda and recheck_table(on_cpu, "cpu") == on_cpu
    # version 2: the keys left out take their activations with them, so a recheck of what was kept
    # (use_table(tf)) finds no stray key (a review: "activations[...]: not a key of the table")
    v2 = write_table(tmp_path / "v2.json", table, {**meta, "format_version": 2,
                                                    "activations": {cpu_key: "gelu", gpu_key: "relu"}})
    kept = read_table(v2, "cuda")
    assert kept.activations == {gpu_key: "relu"} and recheck_table(kept, "cuda").activations == {gpu_key: "relu"}
    assert recheck_table(read_table(v2), "cpu").activations == {cpu_key: "gelu"}
    with pytest.raises(TableError, match="read for another kind of device than cuda; read it again for cuda"):
        recheck_table(on_cpu, "cuda")  # its GPU keys were left out: it would install an empty table
    for patch in ({"cpp.march": "native"}, {"max_autotune_gemm_backends": "TRITON"}):
        bad = {**table, cpu_key: [{**cpp, "config_patch": patch}]}
        (tmp_path / "bad.json").write_text(json.dumps({**meta, "table": bad}))
        with pytest.raises(TableError, match="not a tuning knob|is not allowed"):
            read_table(tmp_path / "bad.json", "cuda")  # the CPU key, checked as a CPU key
    # a device the wrapper does not list: its keys are checked for the kind read for, as before
    write_table(tmp_path / "bare.json", table)
    with pytest.raises(TableError, match="max_autotune_gemm_backends='CPP' is not allowed"):
        read_table(tmp_path / "bare.json", "cuda")
    # a device-free key is checked for the kind it is kept for: a devices entry of an empty key made it
    # checked as the other kind's and kept (TRITON reached a CPU compile)
    triton = {inputs: [{"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "TRITON"}}]}
    for key in ("", " ", "a\nb", "x+((y"):
        (tmp_path / "dev.json").write_text(json.dumps({**meta, "devices": [{"key": key, "kind": "cuda"}], "table": triton}))
        with pytest.raises(TableError, match=re.escape(f"devices[0].key={json.dumps(key)}: expected a device key")):
            read_table(tmp_path / "dev.json", "cpu")
    (tmp_path / "dev.json").write_text(json.dumps({**meta, "devices": [{"key": "NVIDIA H100", "kind": "cuda"}],
                                                   "table": triton}))
    # the wrapper lists GPUs only: a device-free key is a GPU's (a device-agnostic export's), left out here
    gpus_only = read_table(tmp_path / "dev.json", "cpu")
    assert gpus_only.table == {} and gpus_only.other_kind == {inputs: "cuda"}
    (tmp_path / "dev.json").write_text(json.dumps({**meta, "devices": [{"key": "NVIDIA H100", "kind": "cuda"},
                                                                       {"key": "Intel Xeon", "kind": "cpu"}],
                                                   "table": triton}))
    with pytest.raises(TableError, match="max_autotune_gemm_backends='TRITON' is not allowed"):
        read_table(tmp_path / "dev.json", "cpu")  # of both kinds: the kind read for


def test_a_crafted_long_key_is_refused_at_once():
    """Reading a key took time quadratic in its length (a 180 KB key of "+((" took two minutes to
    refuse): the pattern now runs in linear time and a key longer than any of Inductor's is refused."""
    import time

    from zhantune.inductor.table import MAX_KEY_CHARS, check_table, parse_key

    n = 30_000
    for key in ("x" + "+((" * n + "))+" * n, "((" * n + "))+" * n, "((" + "))+((" * n + "+mm+"):
        start = time.process_time()
        assert parse_key(key) is None
        assert time.process_time() - start < 5  # was minutes; a regression is not a slower machine
    long = "cpu+((torch.float32," + " " * MAX_KEY_CHARS + "[8], [1]),)+mm"
    assert parse_key(long) is not None
    with pytest.raises(TableError, match=f"a key of {len(long):,} characters is not an Inductor lookup key"):
        check_table({long: []}, "t.json")


def test_a_cpu_model_at_two_thread_counts_is_two_devices_of_one_name(tmp_path):
    """device= (export) and devices= (compare) take a device's key or its name; one CPU model at
    two thread counts gives two devices of one name, and the name then picked one of them silently."""
    from zhantune.errors import ConfigError
    from zhantune.inductor.exporter import resolve_device_key
    from zhantune.report.regret import CompareError, _pick_devices

    store = Store(f"sqlite:///{tmp_path}/z.db")
    for threads in (2, 4):
        store.device_id(f"M ({threads} threads)", "M", "cpu", {"threads": threads})
    store.device_id("G", "NVIDIA G", "cuda", {})
    with pytest.raises(ConfigError, match=r"device='M' names 2 devices in .*: 1: 'M \(2 threads\)'; 2: 'M \(4 threads\)'"):
        resolve_device_key(store, "M")
    assert resolve_device_key(store, "M (4 threads)") == "M (4 threads)" and resolve_device_key(store, "NVIDIA G") == "G"
    with pytest.raises(ConfigError, match=r"device='cpu' names 2 devices"):  # a kind, where two devices have it
        resolve_device_key(store, "cpu")
    assert resolve_device_key(store, "cuda") == "G" and resolve_device_key(store, "2") == "M (4 threads)"
    with pytest.raises(CompareError, match=r"device 'M' \(from devices\) names several devices"):
        _pick_devices(store, ["M"])
    assert [d.key for d in _pick_devices(store, ["M (2 threads)", "NVIDIA G"])] == ["M (2 threads)", "G"]
    # a device named "2" (an import's devices=['2']) and device number 2: the key's was taken silently
    store.device_id("2", "2", "cuda", {})
    assert [d.key for d in store.devices()] == ["2", "G", "M (2 threads)", "M (4 threads)"]  # numbered so
    assert [d.key for d in _pick_devices(store, ["0", "3"])] == ["2", "M (4 threads)"]
    with pytest.raises(CompareError, match=r"device '2' \(from devices\) is the name of '2' and the number of "
                                           r"'M \(2 threads\)'; give a key"):
        _pick_devices(store, ["2"])


def test_a_table_error_stays_one_short_line_for_huge_or_odd_values(tmp_path):
    """A value read from a table shows at most about 80 characters in an error (a 1 MB string, a
    4,000-digit number, a list nested 900 deep: the whole value was repeated, megabytes in one
    line); odd Python inputs to read_table are TableErrors too, not tracebacks."""
    from zhantune.inductor.table import check_table, read_table

    key = "((torch.float32, [8, 8], [8, 1]), (torch.float32, [8, 8], [8, 1]))+mm"
    nested: list = []
    for _ in range(900):
        nested = [nested]
    for entry in ({"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "A" * 1_000_000}},
                  {"template_id": "x" * 1_000_000},
                  {"template_id": "triton::mm", "BLOCK_M": nested}):
        (tmp_path / "t.json").write_text(json.dumps({key: [entry]}))
        with pytest.raises(TableError) as e:
            read_table(tmp_path / "t.json", "cpu")
        assert len(str(e.value)) < 400 and "characters)" in str(e.value), str(e.value)[:500]
    (tmp_path / "t.json").write_text('{"format": "zhantune-lookup-table", "format_version": ' + "9" * 4000 + "}")
    with pytest.raises(TableError, match=r"got 9999.*\(4000 characters\)"):
        read_table(tmp_path / "t.json")
    with pytest.raises(TableError, match="not an Inductor lookup key"):
        read_table({b"x": []}, "cpu")
    with pytest.raises(TableError, match="expected an object of key -> list of entries, got list"):
        check_table(["x"])
    with pytest.raises(TableError, match="no NUL character"):
        read_table(str(tmp_path / "a\0b.json"))


@pytest.mark.parametrize("best_us, within", [(2.95, True), (3.3, True), (4.66, False), (2.2, False)])
def test_the_defaults_own_kernel_is_called_noise_only_within_1_2x(best_us, within):
    """A winner named as the default's own kernel is never a speedup; measured outside 1.2x of the
    default (the H200 under torch 2.11: aten::addmm at 4.66 us against the default's 2.95 us) the
    summary says the compile may differ instead of calling it noise (zhantune.report.summary)."""
    from types import SimpleNamespace

    from rich.console import Console

    from zhantune.report.summary import _print_winner, _table

    def row(kind, us, id_):
        return SimpleNamespace(kind=kind, status="ok", id=id_, config_hash=f"h{id_}", min_us=us, median_us=us, timing_method="cuda:t",
                               tflops=None, branch="aten_template", template_id="aten::addmm", params={})

    default, best = row("default", 2.95, 1), row("candidate", best_us, 2)
    result = SimpleNamespace(default=default, eager=None, best=best, default_unfrozen=None, claim=None,
                             same_kernel_as_default=True, not_carried=None)
    run = SimpleNamespace(problem=SimpleNamespace(key="addmm[M=256,N=256,K=256]:bfloat16"),
                          device=SimpleNamespace(name="NVIDIA H200", kind="cuda"))
    console = Console(record=True, width=300)
    console.print(_table(run, result, 2.95, best))
    _print_winner(console, result, 2.95, best)
    text = console.export_text()
    ratio = f"{2.95 / best_us:.2f}x"
    assert f"{ratio} (noise)" in text if within else f"{ratio} (same kernel: differs)" in text
    assert ("measurement noise" in text) == within and ("a gap this large" in text) != within
    assert "faster than inductor default" not in text and "not a speedup" in text


def test_scratch_cache_dir_is_used_inside_then_deleted_and_inductor_points_back(tmp_path, monkeypatch):
    """A tune's kernel cache (zhantune.inductor.settings.scratch_cache_dir): Inductor's cache paths
    point into it inside, back to the user's afterwards (its in-memory path caches cleared both ways),
    and it is deleted with what was written there."""
    from torch._inductor.codecache import CacheBase
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch._inductor.utils import clear_caches

    from zhantune.inductor.settings import scratch_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    clear_caches()  # an earlier test's compile in this worker cached its own directory's path
    users = CacheBase.get_local_cache_path()  # cached by Inductor (functools.cache)
    with scratch_cache_dir() as scratch:
        assert cache_dir() == scratch and os.environ["TRITON_CACHE_DIR"] == os.path.join(scratch, "triton")
        assert str(CacheBase.get_local_cache_path()).startswith(scratch + os.sep)
        (Path(scratch) / "kernel.so").write_bytes(b"x")
    assert not os.path.exists(scratch) and "TRITON_CACHE_DIR" not in os.environ
    assert cache_dir() == str(tmp_path / "users") and CacheBase.get_local_cache_path() == users
    monkeypatch.undo()  # later tests of this process: Inductor's paths back to its own directory
    clear_caches()


def test_a_table_printed_off_a_terminal_cuts_no_cell():
    """Off a terminal (a log file, CI) zhantune.report.console.print_table prints a table as wide as
    its widest row, however narrow the console: a newcomer's review found a problem key cut to
    ``addmm[M=64,N=256,K=1024]:flo…`` in a log (the width was measured capped at the console's)."""
    import io

    from rich.console import Console
    from rich.table import Table

    from zhantune.report.console import print_table

    key = "addmm[M=64,N=256,K=1024]:float32@Intel(R) Xeon(R) Processor (Sapphire Rapids)+relu"
    table = Table(title="6 trials, 2 problems (share of the model's GEMM time)")
    for name in ("problem", "share", "trials", "best us"):
        table.add_column(name)
    table.add_row(key, "0.61", "6", "154.6")
    out = io.StringIO()
    print_table(Console(file=out, width=60, force_terminal=False), table)
    text = out.getvalue()
    assert key in text and "154.6" in text and "(share of the model's GEMM time)" in text and "…" not in text
    # a title wider than the cells (compare's, a problem key) is one line, not broken mid-word
    title = "linear_act[M=64,N=1024,K=256]:float32:gelu:weight_nk"
    table = Table(title=title)
    table.add_column("device")
    table.add_column("best us")
    table.add_row("AMD EPYC (2 threads)", "233.6")
    out = io.StringIO()
    print_table(Console(file=out, width=100, force_terminal=False), table)
    assert title in out.getvalue(), out.getvalue()


def test_weights_that_do_not_fit_on_the_device_are_one_line(monkeypatch):
    """Copying the built model to a GPU without room for it raised torch.OutOfMemoryError, a
    traceback (collect and check); it is one line naming the model, the device and the dtype. (On
    CPU: the copy fails as CUDA's caching allocator fails it.) Any other error is not hidden."""
    from zhantune.models import build_model

    kwargs = {"d_model": 64, "hidden": 128, "layers": 1}

    def oom(self, *args, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                     "of 79.19 GiB of which 1.2 GiB is free.\nSee documentation for Memory Management")

    monkeypatch.setattr(torch.nn.Module, "to", oom)
    with pytest.raises(ConfigError, match=re.escape(
            f"model='zhantune.models:mlp' with model_kwargs={kwargs}: its weights do not fit in the memory of cuda:0 "
            "in torch.bfloat16 (CUDA out of memory. Tried to allocate 2.00 GiB.")) as e:
        build_model("zhantune.models:mlp", kwargs, dtype=torch.bfloat16, device="cuda:0")
    assert "\n" not in str(e.value)

    def other(self, *args, **kw):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(torch.nn.Module, "to", other)
    with pytest.raises(RuntimeError, match="same device"):
        build_model("zhantune.models:mlp", kwargs, dtype=torch.bfloat16, device="cuda:0")


def test_a_sweeps_summary_names_the_claim_its_table_ships():
    """The multirun summary listed each study's best time and config alone; its claim column says
    whether the paired claim was confirmed, for which config (the best a table carries, where the
    best is not), and whether an export at min_speedup ships it (a review's finding)."""
    from types import SimpleNamespace

    from zhantune.bench.decision import SpeedupVerdict
    from zhantune.multirun import _claim

    best = SimpleNamespace(config_hash="a", template_id=None, branch="fusion", params={"epilogue_fusion": False})
    carried = SimpleNamespace(config_hash="b", template_id="triton::mm", branch="triton", params={"BLOCK_M": 64})
    confirmed = SpeedupVerdict(1.01, 1.005, 1.02, 5, 0, True, "r")
    result = SimpleNamespace(claim=confirmed, claimed=carried, best=best)
    assert _claim(result, 1.02) == ("confirmed 1.01x (rounds 1.00-1.02x, n=5) for triton::mm {BLOCK_M=64}, the best a "
                                    "table carries; below export.min_speedup=1.02: Inductor's default ships")
    assert _claim(SimpleNamespace(claim=confirmed, claimed=carried, best=carried), None) == \
        "confirmed 1.01x (rounds 1.00-1.02x, n=5)"
    unconfirmed = SpeedupVerdict(1.3, 0.9, 1.5, 3, 0, False, "rounds disagree")
    assert _claim(SimpleNamespace(claim=unconfirmed, claimed=carried, best=carried), 1.02) == \
        "unconfirmed: Inductor's default ships"
    assert _claim(SimpleNamespace(claim=unconfirmed, claimed=carried, best=carried), None) == \
        "unconfirmed (export.min_speedup=null: the fastest ships, claimed or not)"
    assert _claim(SimpleNamespace(claim=None, claimed=None, best=None), 1.02) == "not settled"
    # the default's own kernel best: no claim to confirm (it was "unconfirmed", as if a speedup might be)
    same = SimpleNamespace(claim=unconfirmed, claimed=None, best=best, same_kernel_as_default=True)
    for floor in (1.02, None):
        assert _claim(same, floor) == ("none: the best is the default's own kernel; "
                                       "Inductor's default ships")
    # ... measured beyond 1.2x from the default: said, as the tune's summary and the problems table warn
    timed = lambda us: SimpleNamespace(status="ok", min_us=us, median_us=us, timing_method="cpu:perf_counter:fifo")  # noqa: E731
    apart = SimpleNamespace(**{**vars(same), "best": timed(319.8), "default": timed(232.8)})
    assert _claim(apart, 1.02) == ("none: the best is the default's own kernel, yet measured 319.8 us against the "
                                   "default's 232.8 us (default / entry 0.73x): its compile may not run what the "
                                   "default runs, or the timing was disturbed; Inductor's default ships")
    # ... unless the table ships an earlier run's confirmed config under the key all the same; and a
    # job that settled nothing says so, whatever the study's best
    confirmed_before = SimpleNamespace(row=SimpleNamespace(config_hash="x", template_id=None, branch="cpp_gemm",
                                                           params={"k_slices": 2}), shared=False)
    assert _claim(SimpleNamespace(**vars(same), shipped=confirmed_before), 1.02) == (
        "none: the best is the default's own kernel; the table ships cpp_gemm k_slices=2, whose speedup paired "
        "rounds of an earlier run confirmed")
    assert _claim(SimpleNamespace(claim=None, claimed=None, best=best, same_kernel_as_default=True), 1.02) == \
        "not settled"
    # the claimed config (the fastest a table carries) is the default's kernel, a faster one no table carries
    assert _claim(SimpleNamespace(claim=unconfirmed, claimed=carried, best=best, same_kernel_as_default=True), 1.02) \
        == "none: the best a table carries is the default's own kernel; Inductor's default ships"
    from zhantune.report.problems import claim_cell

    assert claim_cell(SimpleNamespace(same_kernel_as_default=True, shipped=None), None) == "- (same kernel)"
    assert claim_cell(SimpleNamespace(same_kernel_as_default=True, shipped=confirmed_before), None) == \
        "- (same kernel) (table: another config)"
    # a newcomer's finding: the problems table said "- (same kernel)" for 232.8 us against 319.8 us
    ok = lambda us: SimpleNamespace(status="ok", min_us=us, median_us=us, timing_method="cpu:perf_counter:fifo")  # noqa: E731
    for entry_us, cell in ((319.8, "- (same kernel: differs)"), (250.0, "- (same kernel)")):
        r = SimpleNamespace(same_kernel_as_default=True, shipped=None, default=ok(232.8), claimed=None, best=ok(entry_us))
        assert claim_cell(r, None) == cell
    # confirmed, but the job's table ships something else under the problem's key: said, as the tune's summary says
    strong = SpeedupVerdict(1.3, 1.25, 1.35, 3, 0, True, "r")
    shared = SimpleNamespace(row=None, shared=True)
    assert _claim(SimpleNamespace(claim=strong, claimed=carried, best=carried, shipped=shared), 1.02) == (
        "confirmed 1.30x (rounds 1.25-1.35x, n=3); the table ships Inductor's default (its lookup key is another "
        "problem's too, whose choice differs: neither was measured for the other)")
    earlier = SimpleNamespace(row=SimpleNamespace(config_hash="c", template_id="triton::mm", branch="t",
                                                  params={"BLOCK_M": 32}), shared=False)
    assert _claim(SimpleNamespace(claim=strong, claimed=carried, best=carried, shipped=earlier), 1.02,
                  SimpleNamespace(min_speedup=1.02)).endswith(
        "; the table ships triton::mm BLOCK_M=32, whose speedup paired rounds of an earlier run confirmed")
    # unconfirmed, or below the floor, while the table ships an earlier run's confirmed config: said
    for claim, start in ((unconfirmed, "unconfirmed; "), (confirmed, "confirmed 1.01x (rounds 1.00-1.02x, n=5) for "
                                                           "triton::mm {BLOCK_M=64}, the best a table carries; below "
                                                           "export.min_speedup=1.02; ")):
        got = _claim(SimpleNamespace(claim=claim, claimed=carried, best=best, shipped=earlier), 1.02)
        assert got == start + "the table ships triton::mm BLOCK_M=32, whose speedup paired rounds of an earlier run " \
                              "confirmed", got
    # no claim ships and the key is shared: the shared key said, with or without a floor
    for floor, start in ((1.02, "unconfirmed; "), (None, "unconfirmed (export.min_speedup=null: the fastest ships, "
                                                           "claimed or not); ")):
        got = _claim(SimpleNamespace(claim=unconfirmed, claimed=carried, best=carried, shipped=shared), floor)
        assert got.startswith(start + "the table ships Inductor's default (its lookup key is another problem's"), got
    same = SimpleNamespace(row=carried, shared=False)
    assert _claim(SimpleNamespace(claim=strong, claimed=carried, best=carried, shipped=same), 1.02) == \
        "confirmed 1.30x (rounds 1.25-1.35x, n=3)"


@pytest.mark.parametrize("torch_version, rounds, low, confirmed, reason", [
    (None, 3, 1.14, True, "r"),
    ("2.12.0+cpu", 3, 1.14, False, "confirmed with torch 2.12.0+cpu, not with this torch"),
    (None, 1, 1.14, False, "confirmed by a rule zhantune no longer uses"),  # one round: never a claim now
    (None, 3, 0.9, False, "confirmed by a rule zhantune no longer uses"),  # slower in a round
])
def test_a_finished_studys_claim_is_its_stored_verdict_judged_as_the_export_judges_it(
        tmp_path, torch_version, rounds, low, confirmed, reason):
    """A run that finds its study finished measures nothing; its result (the multirun job record,
    a problems file's table) carries the study's newest stored verdict, confirmed only where the
    export would ship it, and the config it is about."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.candidate import Candidate
    from zhantune.storage import Recorder
    from zhantune.tune_result import stored_claim

    store = Store(f"sqlite:///{tmp_path}/z.db")
    device_id = store.device_id("dev", "dev", "cpu", {})
    study_id = store.study_id("s", {})
    problem = GemmProblem("mm", (64, 64, 64), "float32")
    rec = Recorder(store, problem, study_id, device_id, store.problem_id(problem.key, **problem.row_fields()))
    assert stored_claim(store, study_id) == (None, None)
    cand = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"})
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t")), "candidate", cand, trial_number=0)
    store.add_verdict(study_id=study_id, device_id=device_id, problem_id=rec.problem_id, config_hash=cand.config_hash,
                      ratio=1.15, ratio_low=low, ratio_high=1.16, rounds=rounds, contended=0, confirmed=True,
                      reason="r", **({"torch_version": torch_version} if torch_version else {}))
    claim, claimed = stored_claim(store, study_id)
    assert claim.confirmed is confirmed and claim.reason.startswith(reason) and claim.ratio == 1.15, claim
    assert claimed.config_hash == cand.config_hash
    # a later run's "no claim made" (no rounds: a cached winner) hides no judged claim, as in the export
    store.add_verdict(study_id=study_id, device_id=device_id, problem_id=rec.problem_id, config_hash=cand.config_hash,
                      ratio=None, ratio_low=None, ratio_high=None, rounds=0, contended=0, confirmed=False,
                      reason="no claim made")
    again, _ = stored_claim(store, study_id)
    if torch_version is None and rounds >= 2:
        assert again.ratio == 1.15 and again.confirmed is confirmed, again
    else:  # the note is the newest: one round judges nothing, another torch's claim does not ship here
        assert again.ratio is None and not again.confirmed, again
    if torch_version is not None or rounds < 2:
        return
    # a later replay on a busy machine (a helper's attack, session 46: it withdrew the confirmed claim
    # from the export and compare): contended rounds neither confirm nor refute it
    later = dict(study_id=study_id, device_id=device_id, problem_id=rec.problem_id, config_hash=cand.config_hash,
                 ratio=1.5, ratio_low=1.3, ratio_high=1.6, rounds=3, confirmed=False)
    store.add_verdict(**later, contended=6, reason="not confirmed: 6 paired measurement(s) taken on a busy machine")
    again, _ = stored_claim(store, study_id)
    assert again.ratio == 1.15 and again.confirmed is confirmed, again
    # quiet rounds that fail to confirm it do judge it: the newest judged verdict
    store.add_verdict(**later, contended=0, reason="not confirmed: a round was slower")
    again, _ = stored_claim(store, study_id)
    assert again.ratio == 1.5 and not again.confirmed, again
    # rounds none of which measured both sides judge it too, though one side was disturbed (a review)
    store.add_verdict(**later, contended=0, reason="r")
    store.add_verdict(**{**later, "ratio": None, "ratio_low": None, "ratio_high": None}, contended=2,
                      reason="no round measured both sides")
    again, _ = stored_claim(store, study_id)
    assert again.ratio is None and not again.confirmed, again


def test_same_kernel_as_default_is_about_the_claimed_config_else_the_best():
    """The summary's "(noise)", the problems table's "- (same kernel)" and a multirun's "none" are
    about the config the claim is about: a carried template claimed while the fastest row is the
    default's own kernel (a not-carried point, or another study's aten row) is not "the same kernel";
    where nothing was settled, the best decides (a finished study read back from the database too)."""
    from types import SimpleNamespace

    from zhantune.tune_result import TuneResult

    aten = SimpleNamespace(template_id=None, params={"max_autotune_gemm_backends": "ATEN"})
    cpp = SimpleNamespace(template_id=None, params={"max_autotune_gemm_backends": "CPP", "cpp.gemm_max_k_slices": 2})
    assert TuneResult("s", 1, None, None, aten).same_kernel_as_default
    assert not TuneResult("s", 1, None, None, cpp).same_kernel_as_default
    assert not TuneResult("s", 1, None, None, None).same_kernel_as_default
    assert not TuneResult("s", 1, None, None, aten, claimed=cpp).same_kernel_as_default
    assert TuneResult("s", 1, None, None, cpp, claimed=aten).same_kernel_as_default


def test_an_output_path_that_is_a_pipe_is_refused_without_reading_it(tmp_path):
    """A helper's attack (session 48): compare json=FIFO (or csv=/dev/stdout into a pipe) hung for
    good: the SQLite-header check read the pipe before the "not a regular file" refusal. A pipe is
    refused at once, in one line, unread."""
    import os
    import threading

    from zhantune.errors import ConfigError
    from zhantune.paths import check_output_path

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    got: list[BaseException] = []

    def check() -> None:
        try:
            check_output_path(fifo, "json")
        except ConfigError as e:
            got.append(e)

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():
        with open(fifo, "wb"):  # a writer unblocks the reader, so that the test ends
            pass
        worker.join(5)
        pytest.fail("check_output_path opened the pipe to read it")
    assert [str(e) for e in got] == [f"json={fifo}: exists and is not a regular file"]


def test_write_atomic_keeps_a_files_mode_replaces_a_link_and_fits_any_name(tmp_path):
    """zhantune.paths.write_atomic (reports, tables, problems files): a review found it reset a 0600
    file to 0644, wrote through a link whose directory check_output_path had not checked, and named
    its temporary file after the target (a 250-byte name then failed after the work was done)."""
    from zhantune.errors import ConfigError
    from zhantune.paths import write_atomic

    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    write_atomic(private, "new", "json")
    assert private.read_text() == "new" and (private.stat().st_mode & 0o777) == 0o600
    (tmp_path / "link.html").symlink_to(private)
    write_atomic(tmp_path / "link.html", "report", "html")
    assert not (tmp_path / "link.html").is_symlink() and private.read_text() == "new"
    long = tmp_path / ("x" * 250 + ".html")
    write_atomic(long, "ok", "html")
    assert long.read_text() == "ok"
    with pytest.raises(ConfigError, match=r"^json=.*bad.json: cannot write: .*surrogates not allowed; nothing was written"):
        write_atomic(tmp_path / "bad.json", "\udcff", "json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["private.json", "link.html", long.name])


def test_an_addmm_with_float_scalars_is_not_taken_for_the_problem_of_integer_ones():
    """GPU-path review (session 38): Inductor writes addmm's scalars into the lookup key as text, so
    ``alpha=1.0, beta=1.0`` makes "alpha=1.0&beta=1.0", a key the problem's own compile (alpha=1)
    never makes; collect took it for that problem (1.0 == 1), and a problems file written without
    measuring held a problem whose table entry never matches the model."""
    from zhantune.device import resolve_device
    from zhantune.inductor.gemms import collect

    class Two(torch.nn.Module):
        def forward(self, b, x, w, y):
            return torch.addmm(b, x, w, alpha=1.0, beta=1.0), torch.addmm(b, y, w)

    b, x, w, y = torch.randn(8), torch.randn(4, 16), torch.randn(16, 8), torch.randn(6, 16)
    found = collect(Two(), (b, x, w, y), resolve_device("cpu"))
    floats = next(p for p in found if "alpha=1.0&beta=1.0" in p.lookup_key)
    assert floats.problem is None and "(tunable: the integers 1 and 1)" in floats.reason, floats
    ints = next(p for p in found if "+alpha=1&beta=1+" in p.lookup_key)
    # its weight is an input, computed at run time for the compile: on CPU no entry applies (session 49)
    assert ints.problem is None and ints.reason.startswith("addmm whose second operand is computed at run time")


def test_table_report_is_this_threads_as_the_table_is():
    """A table is installed per thread; its report was process-wide: in thread A, table_report()
    returned the report of the table thread B installed last (a runtime attack, session 41)."""
    import threading

    from zhantune.inductor.runtime import table_report, use_table

    got: dict[str, bool] = {}
    ready, done = threading.Barrier(2), threading.Barrier(2)

    def worker(name: str) -> None:
        installed = use_table({})
        ready.wait()  # both installed: the later one was the process-wide "last"
        got[name] = table_report() is installed.report
        done.wait()
        installed.remove()

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"a": True, "b": True}


def test_a_problem_whose_default_did_not_run_says_why_in_the_summaries():
    """A helper's: a bfloat16 linear_act relu on CPU (oneDNN's fused linear_pointwise: no GEMM lookup)
    showed "-" in every cell of the problems table and "no candidate measured ok" in the tune's
    summary, the reason only in the trial lines. Both now give the default's status and error text."""
    from types import SimpleNamespace

    from rich.console import Console

    from zhantune.bench.conditions import ContentionCount
    from zhantune.problemset import ProblemRun, ProblemsResult
    from zhantune.report.problems import print_problems_summary
    from zhantune.report.summary import default_failure

    why = "Inductor made no GEMM lookup while compiling"
    default = SimpleNamespace(status="not_applied", error_text=why)
    result = SimpleNamespace(default=default, best=None, claimed=None, claim=None, done=2, contention=ContentionCount(),
                             same_kernel_as_default=False, shipped=None)
    assert default_failure(result) == f"; inductor default not_applied: {why}"
    assert default_failure(SimpleNamespace(default=SimpleNamespace(status="ok", error_text=None))) is None
    run = SimpleNamespace(problem=SimpleNamespace(key="linear_act[M=32,N=64,K=64]:bfloat16:relu:weight_nk"), export=None)
    console = Console(record=True, width=300)
    print_problems_summary(console, ProblemsResult(runs=[ProblemRun({}, 2, run, result)]))
    assert (f"linear_act[M=32,N=64,K=64]:bfloat16:relu:weight_nk: no config measured ok; inductor default "
            f"not_applied: {why}") in console.export_text()
