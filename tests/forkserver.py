"""A fork server for the tests' CLI runs (``tests/conftest.py run_cli``).

A CLI run as ``python -m zhantune ...`` spends about 0.55 s importing Hydra, OmegaConf, SQLAlchemy,
Alembic and zhantune's entry modules before it reads its first argument; the suite makes a few
hundred such runs. This server imports those modules once (never torch, numpy or optuna: each starts
a thread or reads the environment at import, and nothing is forked from a process with a second
thread), then forks one child per run. The child becomes what ``python -m MODULE ARGS`` would be in
a fresh process:

- its working directory, environment (``os.environ`` and the C environment), ``sys.argv`` and
  ``sys.path[0]`` (the working directory, as ``-m`` sets it) are the run's;
- stdin is /dev/null, stdout and stderr are the files the caller names;
- it runs the module as ``-m`` does (``runpy._run_module_as_main``) in a fresh ``__main__`` module,
  then leaves through the interpreter's own shutdown: an uncaught exception prints its traceback and
  exits 1, ``SystemExit`` gives its code, atexit handlers and finalizers run.

Protocol (one client per server, one run at a time): the client writes a JSON request line to the
server's stdin ``{"module", "args", "cwd", "env", "stdout", "stderr"}``; the server answers
``{"pid": N}`` once the child exists and ``{"returncode": R}`` when it has ended (R negative: killed
by signal -R, as ``subprocess`` reports it). The server ends when its stdin closes.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import types

PRELOAD = ("zhantune.app", "zhantune.storage", "zhantune.collect", "zhantune.cli")
#: modules a forked child must not inherit (threads at import, or environment read at import)
NEVER = ("torch", "numpy", "optuna", "triton")


def _serve() -> dict | None:
    """Answer requests until stdin closes (None); in a forked child, return the child's request."""
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return req
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    return None


def _become(req: dict) -> None:
    """Make this forked child the process ``python -m`` would start for ``req``."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
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
    req = _serve()
    if req is not None:
        _become(req)
        runpy._run_module_as_main(req["module"], alter_argv=True)


if __name__ == "__main__":
    main()
