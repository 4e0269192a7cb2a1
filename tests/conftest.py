from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], cwd: Path, module: str = "zhantune", timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <module> ARGS`` in ``cwd`` (Hydra's output dir inside cwd); ``env``: variables
    set on top of this process's environment."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", module, *args, f"hydra.run.dir={cwd}/hydra"],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )


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

