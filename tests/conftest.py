from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], cwd: Path, module: str = "zhantune", timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <module> ARGS`` in ``cwd`` (Hydra's output dir inside cwd); ``env``: variables
    set on top of this process's environment.

    The run is a process of its own either way: forked from this worker's fork server
    (tests/forkserver.py, which has the CLI's light imports done) when the run's environment is the
    one the server started with, else a fresh ``python -m`` (``ZHANTUNE_TEST_FORKSERVER=0``: always)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    argv = [*args, f"hydra.run.dir={cwd}/hydra"]
    server = _fork_server(env)
    if server is not None:
        return server.run(module, argv, Path(cwd), env, timeout)
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


#: variables that differ between runs without changing what an import reads
_PER_TEST = ("PYTEST_CURRENT_TEST",)


def _same_env(a: dict[str, str], b: dict[str, str]) -> bool:
    return {k: v for k, v in a.items() if k not in _PER_TEST} == {k: v for k, v in b.items() if k not in _PER_TEST}


class _ForkServer:
    """This worker's client of tests/forkserver.py (one run at a time)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "forkserver.py")], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next reply line, or None when none came within ``timeout`` seconds."""
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                return None
            byte = self.proc.stdout.read(1)
            if not byte:
                raise RuntimeError(f"fork server ended (exit {self.proc.wait()})")
            line += byte
        return json.loads(line)

    def run(self, module: str, argv: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="zt-cli-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            req = {"module": module, "args": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                   "stderr": str(err)}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            pid = self._reply(None)["pid"]
            done = self._reply(timeout)
            if done is None:  # as subprocess.run: kill the child, then raise with what it wrote
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
            text = [io.TextIOWrapper(io.BytesIO(p.read_bytes())).read() if p.exists() else "" for p in (out, err)]
        cmd = [sys.executable, "-m", module, *argv]
        if done is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=text[0], stderr=text[1])
        return subprocess.CompletedProcess(cmd, done["returncode"], text[0], text[1])


#: this worker's fork servers, the most recently used last (one per environment a run had)
_SERVERS: list[_ForkServer] = []


def _fork_server(env: dict[str, str]) -> _ForkServer | None:
    """This worker's fork server for ``env``'s run, started on first use (None: a fresh process)."""
    if env.get("ZHANTUNE_TEST_FORKSERVER") == "0":
        return None
    for s in list(_SERVERS):
        if s.proc.poll() is not None:
            _SERVERS.remove(s)
        elif _same_env(s.env, env):
            _SERVERS.remove(s)
            _SERVERS.append(s)
            return s
    if len(_SERVERS) >= 3:  # end the least recently used one (its stdin closes, it exits)
        _SERVERS.pop(0).proc.stdin.close()
    _SERVERS.append(_ForkServer(env))
    return _SERVERS[-1]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tune_cfg():
    """Compose the tune app's config with Hydra's compose API (overrides as on the command line)."""
    from hydra import compose, initialize_config_module

    from zhantune.config import register

    register()

    def _compose(overrides: list[str]):
        with initialize_config_module("zhantune.conf", version_base="1.3"):
            return compose("config", overrides=overrides)

    return _compose


@pytest.fixture
def existing_db(tmp_path):
    """A zhantune database with one device row, at tmp_path/zhantune.db (the tests check that bad
    input leaves its bytes unchanged)."""
    from zhantune.storage import Store

    store = Store(f"sqlite:///{tmp_path}/zhantune.db")
    store.device_id("some gpu", "some gpu", "cuda", {})
    store.engine.dispose()
    return tmp_path / "zhantune.db"


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL 15 server for the session (tests/pgserver.py); yields the server, .new_database() -> URL."""
    from pgserver import PostgresServer

    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_table_outlives_its_test():
    """A test that fails between a plain ``use_table(...)`` call and its ``remove()`` would leave the
    handler installed for every later test of the same xdist worker: remove what is left, newest first."""
    yield
    runtime = sys.modules.get("zhantune.inductor.runtime")  # never imported: nothing was installed
    for installed in reversed(list(runtime._INSTALLED if runtime else [])):
        installed.remove()

