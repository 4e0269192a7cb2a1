"""The tests' fork server (tests/forkserver.py) gives a CLI run what a fresh ``python -m`` gives: the
same output, exit code, traceback, atexit output, ``sys.path[0]``, subprocess.run's timeout, and its
wait for a process left holding the output."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time

import pytest

FRESH = {"ZHANTUNE_TEST_FORKSERVER": "0"}

PROBE = textwrap.dedent("""
    import atexit, os, sys
    atexit.register(lambda: print("atexit ran", flush=True))
    print("argv", sys.argv[1:], "path0", sys.path[0] == os.getcwd(), "main", __name__, sorted(globals()))
    print("stdin", sys.stdin.read() == "", "env", os.environ.get("PROBE_VALUE"))
    sys.stdout.write("unflushed at exit")
    if sys.argv[1] == "raise":
        raise ValueError("boom")
    if sys.argv[1] == "exit":
        sys.exit("a message")
    if sys.argv[1] == "sleep":
        open("pid", "w").write(str(os.getpid()))
        print("sleeping", flush=True)
        import time; time.sleep(120)
    if sys.argv[1] == "leave":  # a process left behind that holds stderr and writes to it later
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5); print('late line', file=__import__('sys').stderr)"])
""")


@pytest.mark.parametrize("how", ["ok", "raise", "exit"])
def test_a_forked_run_is_what_a_fresh_python_dash_m_gives(cli, tmp_path, how):
    (tmp_path / "probe.py").write_text(PROBE)
    forked = cli([how], cwd=tmp_path, module="probe", env={"PROBE_VALUE": how})  # a server per environment
    fresh = cli([how], cwd=tmp_path, module="probe", env={**FRESH, "PROBE_VALUE": how})
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.returncode == {"ok": 0, "raise": 1, "exit": 1}[how]
    assert "atexit ran" in forked.stdout and "unflushed at exit" in forked.stdout and "path0 True" in forked.stdout
    assert f"stdin True env {how}" in forked.stdout
    # the traceback names the probe's line either way (the forked one has the server's frames above it)
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] if how != "ok" else forked.stderr == ""


def test_the_cli_says_the_same_either_way(cli, tmp_path):
    for args in (["--help"], ["+op=mm", "shape=[a]"]):
        forked, fresh = cli(args, cwd=tmp_path), cli(args, cwd=tmp_path, env=FRESH)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does(cli, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        cli(["sleep"], cwd=tmp_path, module="probe", timeout=3)
    assert time.monotonic() - start < 60
    assert b"sleeping" in e.value.output  # bytes, as subprocess.run gives them
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert cli(["ok"], cwd=tmp_path, module="probe").returncode == 0  # the server serves on


def test_a_process_the_run_leaves_behind_is_waited_for_as_subprocess_run_does(cli, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    forked, fresh = cli(["leave"], cwd=tmp_path, module="probe"), cli(["leave"], cwd=tmp_path, module="probe", env=FRESH)
    assert forked.stderr == fresh.stderr == "late line\n"


def test_a_module_the_server_imported_runs_fresh(cli, tmp_path):
    # zhantune.cli is imported by the server: run as __main__ in a fork it would run twice
    r = cli([], cwd=tmp_path, module="zhantune.cli", env={"PYTHONWARNINGS": "default"})
    assert "found in sys.modules" not in r.stderr and r.returncode == 0
