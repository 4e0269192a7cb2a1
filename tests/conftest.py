from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Inductor's cache for this test run, shared by its workers (they inherit the controller's environment)
# and every process they start, deleted at its end: a kernel the tests build is reused within the run
# (tests/compiles.py), never by a later run or the user's own compiles (a review's: a build cut short,
# or another run's state, in the user's /tmp/torchinductor_<user>). `make test` gives its two pytest
# runs one (ZHANTUNE_TESTS_CACHE_DIR), and deletes it.
if os.environ.get("ZHANTUNE_TESTS_CACHE_DIR"):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["ZHANTUNE_TESTS_CACHE_DIR"]
else:
    import atexit
    import shutil
    import tempfile

    os.environ["ZHANTUNE_TESTS_CACHE_DIR"] = tempfile.mkdtemp(prefix="zhantune-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["ZHANTUNE_TESTS_CACHE_DIR"]
    atexit.register(shutil.rmtree, os.environ["ZHANTUNE_TESTS_CACHE_DIR"], ignore_errors=True)


def run_cli(args: list[str], cwd: Path, module: str = "zhantune", timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <module> ARGS`` in ``cwd`` (Hydra's output dir inside cwd); ``env``: variables
    set on top of this process's environment.

    The run is a process of its own either way: forked from this worker's fork server for the run's
    environment (tests/forkserver.py, which has the CLI's light imports done), else a fresh
    ``python -m`` (``ZHANTUNE_TEST_FORKSERVER=0`` in ``env``: always; runs forked from one server
    share its hash seed, so of two runs compared for an order that could depend on it, one runs
    fresh)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    argv = [*args, f"hydra.run.dir={cwd}/hydra"]
    server = _fork_server(env)
    done = None if server is None else server.run(module, argv, Path(cwd), env, timeout)
    if done is not None:
        return done
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


#: variables that differ between runs without changing what an import reads
_PER_TEST = ("PYTEST_CURRENT_TEST",)


def _same_env(a: dict[str, str], b: dict[str, str]) -> bool:
    return {k: v for k, v in a.items() if k not in _PER_TEST} == {k: v for k, v in b.items() if k not in _PER_TEST}


class _ForkServer:
    """This worker's client of tests/forkserver.py (one run at a time), started for ``env``."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "forkserver.py"), str(theirs.fileno())],
                                     cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     pass_fds=(theirs.fileno(),))
        theirs.close()
        self.replies = b""

    def close(self) -> None:
        self.sock.close()  # the server ends once its run has
        self.proc.kill()
        self.proc.wait()

    def _reply(self) -> dict:
        while b"\n" not in self.replies:
            got = self.sock.recv(4096)
            if not got:
                raise RuntimeError(f"fork server ended (exit {self.proc.wait()})")
            self.replies += got
        line, self.replies = self.replies.split(b"\n", 1)
        return json.loads(line)

    def run(self, module: str, argv: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess | None:
        """The run's result as subprocess.run(capture_output=True, text=True) gives it, or None when
        the server cannot fork it (a module it has imported: run it fresh)."""
        umask = os.umask(0o022)
        os.umask(umask)
        req = {"module": module, "args": argv, "cwd": str(cwd), "env": env, "umask": umask}
        pipes = [os.pipe(), os.pipe()]
        try:
            socket.send_fds(self.sock, [json.dumps(req).encode()], [w for _, w in pipes])
        finally:
            for _, w in pipes:
                os.close(w)
        try:
            first = self._reply()
            if first.get("fresh"):
                return None
            out, late = _read_to_end([r for r, _ in pipes], timeout)
            if late:  # as subprocess.run: kill the child (only), then raise with what it wrote
                with contextlib.suppress(ProcessLookupError):
                    os.kill(first["pid"], signal.SIGKILL)
            done = self._reply()
        except BaseException:  # the protocol is mid-run: this server is done with
            if self in _SERVERS:
                _SERVERS.remove(self)
            self.close()
            raise
        finally:
            for r, _ in pipes:
                os.close(r)
        cmd = [sys.executable, "-m", module, *argv]
        if late:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out[0] or None, stderr=out[1] or None)
        text = [io.TextIOWrapper(io.BytesIO(b)).read() for b in out]
        return subprocess.CompletedProcess(cmd, done["returncode"], text[0], text[1])


def _read_to_end(fds: list[int], timeout: float) -> tuple[list[bytes], bool]:
    """Everything written to ``fds`` until every writer has closed them, and whether ``timeout``
    seconds passed first (subprocess.run's communicate)."""
    got, live = {fd: b"" for fd in fds}, list(fds)
    deadline = time.monotonic() + timeout
    while live:
        left = deadline - time.monotonic()
        ready = select.select(live, [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            return [got[fd] for fd in fds], True
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                got[fd] += chunk
            else:
                live.remove(fd)
    return [got[fd] for fd in fds], False


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
    if len(_SERVERS) >= 3:  # end the least recently used one
        _SERVERS.pop(0).close()
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
def existing_db(tmp_path, _existing_db_bytes):
    """A zhantune database with one device row, at tmp_path/zhantune.db (the tests check that bad
    input leaves its bytes unchanged): a copy of one the real Store made for this worker (creating a
    database runs every migration, about 0.3 s, and 180 bad-input cases use one)."""
    path = tmp_path / "zhantune.db"
    path.write_bytes(_existing_db_bytes)
    return path


@pytest.fixture(scope="session")
def _existing_db_bytes(tmp_path_factory) -> bytes:
    from zhantune.storage import Store

    path = tmp_path_factory.mktemp("existing_db") / "zhantune.db"
    store = Store(f"sqlite:///{path}")
    store.device_id("some gpu", "some gpu", "cuda", {})
    store.engine.dispose()
    assert not path.with_name("zhantune.db-wal").exists()  # every page is in the file copied
    return path.read_bytes()


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
    for installed in reversed(list(runtime._installed() if runtime else [])):
        installed.remove()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 100 KiB tmpfs: too small for a new zhantune database (needs mount, i.e. root)."""
    from disks import tmpfs

    with tmpfs(tmp_path / "tiny", "100k") as mnt:
        yield mnt


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (needs mount, i.e. root): room for a database, then filled (disks.fill)."""
    from disks import tmpfs

    with tmpfs(tmp_path / "disk", "8m") as mnt:
        yield mnt


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` run first, the rest after them, each part in its files' order. `make
    test` hands the tests to its two workers in this order, each worker holding the test it runs and
    at most one more (``--dist load --maxschedchunk 1``; pytest-xdist's load scheduler keeps two
    pending), so the last tests are short ones: a worker that ran out waited for the other's long
    test before (test_ship's 61 s end-to-end test ran last, 2026-11-30)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
