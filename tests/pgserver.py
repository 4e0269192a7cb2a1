"""A real PostgreSQL 15 server for the tests, started by the test suite itself.

The server binaries come from Debian's postgresql-15 package (/usr/lib/postgresql/15/bin;
scripts/system_deps.sh installs them). initdb refuses to run as root, so as root the server runs as
the ``postgres`` user. The cluster lives in a temporary directory, listens on 127.0.0.1 on a free
port with trust authentication, and is stopped and removed at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("ZHANTUNE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL server binaries not found in {PG_BIN}; run scripts/system_deps.sh")
        self.root = Path(tempfile.mkdtemp(prefix="zhantune-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                   "-E", "UTF8", "--no-sync"])
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start",
                   "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
                         "-c max_connections=100"])
        self._databases = 0

    def _run(self, args: list[str]) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120)

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL (psycopg 3)."""
        self._databases += 1
        name = f"zt{self._databases}"
        self._run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name])
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        finally:
            time.sleep(0.2)
            shutil.rmtree(self.root, ignore_errors=True)


class FreshDatabases:
    """For the benchmark scripts: ``new(backend)`` is the URL of a fresh, empty database, ``sqlite``
    (a file in a new temporary folder) or ``postgresql`` (a database on one PostgreSQL server,
    started at the first such call); ``close()`` stops that server."""

    def __init__(self, prefix: str = "zt-bench-") -> None:
        self.prefix = prefix
        self.server: PostgresServer | None = None

    def new(self, backend: str) -> str:
        if backend == "sqlite":
            return f"sqlite:///{tempfile.mkdtemp(prefix=self.prefix)}/bench.db"
        if self.server is None:
            self.server = PostgresServer()
        return self.server.new_database()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
