"""A fork server for the tests' CLI runs (``tests/conftest.py run_cli``).

A CLI run as ``python -m zhantune ...`` spends about 0.55 s importing Hydra, OmegaConf, SQLAlchemy,
Alembic and zhantune's entry modules before it reads its first argument; the suite makes a few
hundred such runs. This server imports those modules once (never torch, numpy or optuna: each starts
a thread or reads the environment at import, and nothing is forked from a process with a second
thread), then forks one child per run. The child becomes what ``python -m MODULE ARGS`` would be in
a fresh process:

- its working directory, umask, environment (``os.environ`` and the C environment), ``sys.argv``
  and ``sys.path[0]`` (the working directory, as ``-m`` sets it) are the run's;
- stdin is /dev/null; stdout and stderr are the write ends of the client's pipes, which the client
  reads to their end as subprocess.run does (a process the run leaves behind holding them is waited
  for, and what it writes is read);
- it runs the module as ``-m`` does (``runpy._run_module_as_main``) in a fresh ``__main__`` module,
  then leaves through the interpreter's own shutdown: an uncaught exception prints its traceback and
  exits 1, ``SystemExit`` gives its code, atexit handlers and finalizers run.

What differs from a fresh process: the hash seed is the server's for every run it forks (a test
that compares two runs for an order that could depend on it runs one of them fresh), a traceback has
the server's frames above runpy's, and the limits and scheduling the server started with apply.
A module the server has imported is never run as ``__main__`` (it would run twice): the server
answers ``{"fresh": true}`` and the client starts a fresh ``python -m``.

Protocol (one client per server, one run at a time, over a Unix socket whose fd is the server's
argument): the client sends a JSON request ``{"module", "args", "cwd", "env", "umask"}`` with two file descriptors
(stdout's and stderr's write ends, ``socket.send_fds``); the server answers ``{"pid": N}`` once the
child exists and ``{"returncode": R}`` when it has ended (R negative: killed by signal -R, as
subprocess reports it), each a JSON line. The server ends when the socket closes.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import socket
import sys
import types

PRELOAD = ("zhantune.app", "zhantune.storage", "zhantune.cli")
#: modules a forked child must not inherit (threads at import, or environment read at import)
NEVER = ("torch", "numpy", "optuna", "triton")


def _serve(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """Answer requests until the socket closes (None); in a forked child, its request and fds."""
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        if not msg:
            return None
        req = json.loads(msg)
        if req["module"] in sys.modules:
            for fd in fds:
                os.close(fd)
            sock.sendall(b'{"fresh": true}\n')
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            return req, fds
        for fd in fds:
            os.close(fd)
        sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        sock.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _become(req: dict, fds: list[int]) -> None:
    """Make this forked child the process ``python -m`` would start for ``req`` (``fds``: stdout's
    and stderr's write ends)."""
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, out in zip((1, 2), fds, strict=True):
        os.dup2(out, fd)
        os.close(out)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, never closed
    sys.argv = [req["module"], *req["args"]]
    sys.path[0] = os.getcwd()
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    main.__dict__["__annotations__"] = {}  # as the interpreter's own __main__ starts


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = [m for m in NEVER if m in sys.modules]
    if leaked or len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit(f"forkserver: cannot fork safely: imported {leaked}, "
                         f"{len(os.listdir('/proc/self/task'))} threads")
    got = _serve(socket.socket(fileno=int(sys.argv[1])))
    if got is not None:
        _become(*got)
        runpy._run_module_as_main(got[0]["module"], alter_argv=True)


if __name__ == "__main__":
    main()
