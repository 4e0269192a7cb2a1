"""Bad input on the command line: one clear line, exit code 2, no traceback, database unchanged."""

from __future__ import annotations

import hashlib
import re

import pytest

#: refused by the tune app's own checks (zhantune.cli.check_group_overrides, then zhantune.app.open_run)
BAD_INPUTS = [
    (["+op=mm", "shape=[0,1,1]"], "shape=[0,1,1]: M=0 must be a positive integer"),
    (["+op=mm", "shape=[a,b,c]"], "M='a' is not an integer"),
    (["+op=bmm", "shape=[4,4,4]"], "does not fit op bmm: expected 4 positive integers [B,M,N,K]"),
    (["+op=mm", "shape=[4,4]"], "does not fit op mm"),
    (["+op=nope", "shape=[4,4,4]"], "unknown op 'nope' (from override +op=nope); allowed: addmm, bmm, linear_act, mm"),
    (["+op=mm", "shape=[4,4,4]", "dtype=int8"], "unknown dtype 'int8' (from dtype); allowed: float32, bfloat16, float16"),
    (["+op=mm", "shape=[4,4,4]", "device=cuda"], "device=cuda: CUDA is not available"),
    (["+op=mm", "shape=[4,4,4]", "device=tpu"], "unknown device 'tpu'"),
    (["+op=mm", "shape=[4,4,4]", "storage.url=sqlite:////nonexistent/dir/z.db"], "directory /nonexistent/dir does not exist"),
    (["+op=mm", "shape=[4,4,4]", "search=nope"], "unknown search 'nope'"),
    (["+op=mm", "shape=[4,4,4]", "space=[nope]"], "unknown space 'nope'"),
    (["+op=mm", "shape=[4,4,4]", "search.n_trials=0"], "search.n_trials=0 must be at least 1"),
    (["+op=mm", "shape=[4,4,4]", "bench.compile_workers=-1"], "bench.compile_workers=-1 must be 0 (off)"),
    (["shape=[4,4,4]"], "no op given; use +op=<name>"),
]
#: Hydra's own composition errors, joined into one line by zhantune.cli.run_app (a real process)
HYDRA_ERRORS = [
    (["+op=mm", "shape=[4,4,4]", "bench.compile_workers=abc"],
     "bench.compile_workers=abc; Value 'abc' of type 'str' could not be converted to Integer"),
    # Hydra's message for a key that is not an option advises a '+' (refused next): the options instead
    (["+op=mm", "shape=[4,4,4]", "bench.nope=1"], "override bench.nope=...: 'bench.nope' is not an option of bench "
                                                  "(options of bench: name,"),
    (["+op=mm", "shape=[4,4,4]", "search.n_trials=[1"], "override search.n_trials=[1: no viable alternative"),
]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_bad_input_is_refused_with_its_message(tune_cfg, tmp_path, existing_db, monkeypatch, args, message):
    """In this process, the checks the tune app makes before anything is written: a UserError (one
    line, exit code 2 in the app) naming the value; the existing database is unchanged."""
    from zhantune.app import open_run
    from zhantune.cli import check_group_overrides
    from zhantune.errors import UserError
    from zhantune.request import check_request

    monkeypatch.chdir(tmp_path)  # the default storage.url is relative: the existing database
    before = _digest(existing_db)
    said = check_group_overrides(args)
    if said is None:
        cfg = tune_cfg(args + ["progress=false"])
        with pytest.raises(UserError) as e:
            check_request(cfg)  # the app's first check, before torch is imported
            open_run(cfg)
        said = str(e.value)
    assert message in said and "\n" not in said
    assert _digest(existing_db) == before


@pytest.mark.parametrize("space, message", [
    ("triton_mm", "space triton_mm: branches.triton_mm: template branches (triton::mm) apply on CUDA only"),
    ("tf32", "space tf32: branches.tf32: backend-flag branches (tf32) apply on CUDA only"),
])
def test_a_cuda_space_on_an_explicit_cpu_is_refused_before_torch(tune_cfg, space, message):
    """device=cpu is on the command line: a CUDA-only branch is refused by the first check, before
    torch is imported (a newcomer measured 6 s for it, against 1-2 s for every other bad input);
    with device=auto it waits for the device (zhantune.runspec)."""
    from zhantune.errors import SpaceError
    from zhantune.request import check_request

    with pytest.raises(SpaceError, match=re.escape(message)):
        check_request(tune_cfg(["+op=mm", "shape=[8,8,8]", "device=cpu", f"space=[aten,{space}]"]))
    check_request(tune_cfg(["+op=mm", "shape=[8,8,8]", "device=auto", f"space=[aten,{space}]"]))
    check_request(tune_cfg(["+op=mm", "shape=[8,8,8]", "device=cpu", "space=[aten,cpp_gemm]"]))


@pytest.mark.parametrize("args,message", HYDRA_ERRORS)
def test_bad_input_is_one_clear_line(cli, tmp_path, existing_db, args, message):
    before = _digest(existing_db)
    r = cli(args + ["progress=false"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("zhantune: "), r.stderr
    assert message in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert _digest(existing_db) == before


def test_unwritable_storage_file_is_refused(cli, tmp_path, existing_db):
    # a directory where the database file should be: not writable as a file, whoever runs the test
    (tmp_path / "dir.db").mkdir()
    r = cli(["+op=mm", "shape=[4,4,4]", f"storage.url=sqlite:///{tmp_path}/dir.db"], cwd=tmp_path)
    assert r.returncode == 2
    assert "is not a writable file" in r.stderr


def test_a_tune_with_the_other_cache_flushing_than_the_stored_rows_is_refused(cli, tmp_path):
    """A helper's (session 48): a tune with bench.flush_cache=true answered a trial from a warm-cache
    row another study stored (24.9 us) and ranked it beside its cold-cache rows (100-157 us):
    "4.04x". Rows of the problem on this device timed the other way refuse the tune, one line, exit
    2, nothing stored; the same flushing as the stored rows tunes."""
    import sqlite3

    from stored import warm_default_row

    db = tmp_path / "z.db"
    cpu, problem = warm_default_row(db)
    with sqlite3.connect(db) as con:
        before = con.execute("select count(*) from zt_measurement").fetchone()
    args = ["+op=mm", "shape=[16,16,16]", "device=cpu", "search.n_trials=1", f"storage.url=sqlite:///{db}",
            "export.enabled=false", "progress=false", "space=[aten]", "bench.remeasure_rounds=0"]
    r = cli([*args, "bench.flush_cache=true"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"zhantune: bench.flush_cache=true: 1 measurement(s) of {problem.key} on {cpu.key} in this database were "
        "timed without flushing the cache before each run; its rankings and cached trials would mix the two: use "
        "bench.flush_cache=false, or another storage.url"), r.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from zt_measurement").fetchone() == before
    r = cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


def test_export_without_database(cli, tmp_path):
    r = cli(["storage.url=sqlite:///missing.db"], cwd=tmp_path, module="zhantune.export")
    assert r.returncode == 2
    assert r.stderr.strip() == ("zhantune: storage.url=sqlite:///missing.db: no database at missing.db (a tune, "
                                "python -m zhantune ..., writes one; or give the storage.url of yours)")


def test_space_dry_run_prints_sizes_before_and_after_constraints(cli, tmp_path):
    import math

    import torch
    from omegaconf import OmegaConf

    from zhantune.config import CONF_DIR

    r = cli(["+op=mm", "shape=[512,512,512]", "device=cpu"], cwd=tmp_path, module="zhantune.space")
    assert r.returncode == 0, r.stderr
    # independent count from the YAML: thread factors must multiply to the thread count, and K-slicing
    # only varies when Inductor picks the thread factors
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "space" / "cpp_gemm.yaml"))["branches"]["cpp_gemm"]["params"]
    n_k, n_cache = len(spec["k_slices"]["choices"]), len(spec["cache_blocking"]["choices"])
    factors = [f for f in spec["thread_factors"]["choices"]
               if f is not None and math.prod(int(x) for x in f.split(",")) == torch.get_num_threads()]
    total = n_k * n_cache * len(spec["thread_factors"]["choices"])
    feasible = n_k * n_cache + len(factors) * n_cache
    row = next(line for line in r.stdout.splitlines() if "cpp_gemm" in line and "config" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[-3:] == [str(total), str(feasible), "-"]  # no Inductor template lookup on CPU
    assert "sample candidates:" in r.stdout
    assert not (tmp_path / "zhantune.db").exists()  # a dry run writes nothing


# -- help, commands, quoting (issue 21) -----------------------------------------------------------
APPS = ["zhantune", "zhantune.space", "zhantune.export", "zhantune.compare", "zhantune.collect", "zhantune.check",
        "zhantune.replay", "zhantune.kerneltuner", "zhantune.db"]


@pytest.mark.parametrize("module", APPS)
def test_help_says_what_the_app_does_with_options_and_an_example(cli, tmp_path, module):
    from zhantune.config import CONF_DIR

    r = cli(["--help"], tmp_path, module=module)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"python -m {module}")
    assert "Common options:" in r.stdout and "Example" in r.stdout
    assert "_schema" not in r.stdout and "powered by Hydra" not in r.stdout.lower()
    if module in ("zhantune", "zhantune.space"):  # every shipped space, with its description
        for space in sorted(CONF_DIR.glob("space/*.yaml")):
            assert f"    {space.stem}:" in r.stdout, space.stem
        assert "addmm, bmm, linear_act, mm" in r.stdout


def test_db_without_a_command_lists_the_commands(cli, tmp_path):
    from zhantune.db import COMMANDS

    r = cli([], tmp_path, module="zhantune.db")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("zhantune: no command given; usage: python -m zhantune.db {current|upgrade|merge}")
    for name, what in COMMANDS.items():
        assert f"{name}: {what}" in line


def test_export_device_by_quoted_key_number_or_kind_and_unknown_lists_them(cli, tmp_path, existing_db):
    from zhantune.storage import Store

    xeon = "Intel(R) Xeon(R) Processor"
    Store(f"sqlite:///{existing_db}").device_id(xeon, xeon, "cpu", {})
    url = f"storage.url=sqlite:///{existing_db}"
    # the shell took the quotes of device="..." away: Hydra cannot parse it; the message says how to quote
    r = cli([url, f"device={xeon}"], tmp_path, module="zhantune.export")
    assert r.returncode == 2
    assert f"""quote the value inside the shell's quotes: 'device="{xeon}"'""" in r.stderr
    # quoted as the README shows, by its number in the list, by its kind: the device is found (the
    # database holds no measurement to export for it)
    for spec, key in ((f'device="{xeon}"', xeon), ("device=0", xeon), ("device=cpu", xeon), ("device=cuda", "some gpu")):
        r = cli([url, spec], tmp_path, module="zhantune.export")
        assert r.returncode == 2 and f"no correct measured candidate for device '{key}'" in r.stderr, (spec, r.stderr)
    r = cli([url, "device=Xeon"], tmp_path, module="zhantune.export")
    assert r.returncode == 2
    assert f"device='Xeon': no such device in sqlite:///{existing_db}; its devices: 0: '{xeon}' (cpu); 1: 'some gpu' (cuda)" \
        in r.stderr


@pytest.mark.parametrize("value", ["plain.json.gz", "sqlite:////tmp/x/k.db", "A100 (run 1).json.gz", "a,b", 'x"y',
                                   "postgresql+psycopg://u:***@h/db?sslmode=require&connect_timeout=5", "C:\\p\\x",
                                   "x\\", 'a\\"b', "it's", "[1]", "sqlite:////tmp/a b/k.db"])
def test_a_printed_override_reads_back_through_the_shell_and_hydra(value):
    """zhantune.cli.override_arg, which the hints' commands use (a review pasted an import's hint for
    ``A100 (run 1).json.gz``: Hydra refused it): the shell's word, parsed by Hydra's override
    grammar, is the value again."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from zhantune.cli import override_arg

    (word,) = shlex.split(override_arg("study", value))
    assert OverridesParser.create().parse_override(word).value() == value


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_in_an_app_without_its_own_handler_is_one_line_and_exit_130(tmp_path, sig):
    """Ctrl-C in collect (check and db are the same: no handler of their own) printed a 200-line
    KeyboardInterrupt traceback; zhantune.cli.run_app ends it with one line and exit code 130.
    SIGTERM killed it without a word (exit -15, no cleanup); now it stops the same way."""
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "slowmodel.py").write_text("import time\n\ndef make():\n    print('ready', flush=True)\n"
                                           "    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "zhantune.collect", "model=slowmodel:make", "input_shapes=[[4,4]]",
                             f"out={tmp_path}/p.yaml", f"hydra.run.dir={tmp_path}/hydra"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"),
                            # as from a shell: an xdist worker ignores SIGINT, and its children inherit that
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "ready"  # inside the model's factory: collect is working
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and [line for line in err.splitlines() if line.strip()] == [
        "zhantune: interrupted (" + ("Ctrl-C" if sig == "SIGINT" else "SIGTERM") + ")"], err
    assert not (tmp_path / "p.yaml").exists()


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback(tmp_path):
    """``python -m zhantune.kerneltuner files=[A,B] | head -1`` ended in a BrokenPipeError traceback
    (Hydra's report of any exception); now it stops as a Unix tool does: exit 1, nothing on stderr,
    and what was stored before the pipe closed (A's import, one transaction) is kept."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sqlalchemy import func, select

    from zhantune.storage import Store
    from zhantune.storage import orm as m

    url = f"sqlite:///{tmp_path}/kt.db"
    data = Path(__file__).resolve().parent / "data" / "kerneltuner"
    files = ",".join(str(data / f"{name}.json.gz") for name in ("convolution_A4000", "gemm_RTX_3090"))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    proc = subprocess.run([sys.executable, "-m", "zhantune.kerneltuner", f"files=[{files}]", f"storage.url={url}",
                           f"hydra.run.dir={tmp_path}/hydra"], stdout=write, stderr=subprocess.PIPE, text=True,
                          cwd=tmp_path, timeout=300)
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    with Store(url, read_only=True).session() as s:  # the first file's import is stored whole, the second not begun
        assert s.scalar(select(func.count()).select_from(m.MeasurementRow)) == 4362
    # a tune's log lines go to stdout too (Hydra's console handler): it stops as on Ctrl-C, no
    # "--- Logging error ---" traceback per line, and the same command then completes the study
    tune = [sys.executable, "-m", "zhantune", "bench=replay", f"bench.path={data / 'gemm_RTX_3090.json.gz'}",
            "search.n_trials=5", "progress=false", f"storage.url=sqlite:///{tmp_path}/r.db",
            f"hydra.run.dir={tmp_path}/hydra2"]
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(tune, stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    done = subprocess.run(tune, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and "the study holds 5 of 5" in done.stdout, done.stderr[-2000:]
    # before the task: Hydra prints an app's --help itself (python -m zhantune.export --help | head -1)
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "zhantune.export", "--help"], stdout=write, stderr=subprocess.PIPE,
                          text=True, cwd=tmp_path, timeout=300)
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr


def test_checks_miss_hint_names_collect_with_the_models_own_arguments():
    """check printed a miss as a bare key (a newcomer checking nn.Linear against the demo's mm table
    could not tell why); it now says what a key must match and prints the collect command for the
    model, whose words the shell and Hydra read back as the check's own values."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from zhantune.check import _miss_hint

    cfg = OmegaConf.create({"model": "torch.nn:Linear", "model_kwargs": {"in_features": 64, "out_features": 64},
                            "input_shapes": [[8, 64]]})
    hint = _miss_hint(cfg)
    assert "nn.Linear's weight is transposed, weight_layout=nk" in hint
    command = hint.split("python -m zhantune.collect ", 1)[1].split(", then", 1)[0]
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(shlex.split(command))}
    assert parsed["model"] == "torch.nn:Linear" and parsed["input_shapes"] == [[8, 64]]
    assert parsed["model_kwargs"] == {"in_features": 64, "out_features": 64} and parsed["out"] == "problems.yaml"
