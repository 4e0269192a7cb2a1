"""What Hydra's launchers say, in zhantune's words: how to get the submitit launcher where a command
names it and it is not installed, and a submitit job's failure as one line instead of Hydra's
traceback (zhantune.cli.run_app calls both), and a local submitit job's failure without submitit's wait
for a shared file system (zhantune.multirun)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["check_launcher_options", "launcher_hint", "launcher_option_problem", "report_local_failures_at_once", "submitit_failure",
           "submitit_parameter_error"]


def launcher_option_problem(launcher: dict) -> str | None:
    """The one-line message for a key of the composed ``hydra.launcher`` (``launcher``: it as a plain
    dict, with its ``_target_``) that the launcher's class does not take, else None. Hydra instantiates
    the launcher with every key as a keyword argument after the sweep's callbacks start: a
    ``+hydra.launcher.foo=5`` with the basic launcher was Hydra's "Error in call to target" text, exit 1,
    and a summary of "a job's failure" (no job had started). A launcher that takes any keyword (the
    submitit ones: submitit itself refuses what it does not know, :func:`submitit_parameter_error`,
    once the sweep's directory is made; their config dataclasses are no list of what submitit takes:
    ``setup`` is not in LocalQueueConf) or a class that cannot be imported here is left to Hydra."""
    import inspect

    from hydra._internal.utils import _locate

    target = str(launcher.get("_target_") or "")
    try:
        params = inspect.signature(_locate(target).__init__).parameters
    except Exception:
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    names = [n for n in params if n != "self"]
    for key in launcher:
        if not str(key).startswith("_") and key not in names:
            return (f"hydra.launcher.{key}: not an option of the launcher ({target}); it takes "
                    + (", ".join(names) if names else "no option (hydra/launcher=submitit_local or "
                       "submitit_slurm take the submitit options: docs/cluster.md)"))
    return None


def check_launcher_options(launcher: object) -> None:
    """:func:`launcher_option_problem` of the composed ``hydra.launcher`` node (an OmegaConf node) as
    a user error (exit code 2), before the sweep starts (zhantune.multirun's on_multirun_start)."""
    from omegaconf import OmegaConf

    from zhantune.cli import user_error

    if msg := launcher_option_problem(OmegaConf.to_container(launcher, resolve=False)):
        user_error(msg)


def launcher_hint(hydra_message: str) -> str:
    """How to get Hydra's submitit launcher when a command names it and it is not installed."""
    import importlib.util

    if "Could not find 'hydra/launcher/submitit_" not in hydra_message:
        return ""
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
        return ""
    return "; the submitit launcher comes with zhantune's cluster extra: pip install 'zhantune[cluster]' (docs/cluster.md)"


def submitit_failure(text: str) -> tuple[str, int] | None:
    """One line and an exit code for Hydra's traceback of a submitit job that returned no result
    (``text``: what Hydra wrote), None for any other text: the job's own one-line error (``zhantune:
    ...``, a user error: exit 2), else which job and where its log is (exit 1). A helper's: a bad
    shape in a submitit sweep printed a 45-line traceback with the job's line at its end."""
    marker = "submitit.core.utils.UncompletedJobError: "
    if marker not in text:
        return None
    first, _, rest = text.split(marker, 1)[1].partition("\n")
    job = re.match(r"Job (\S+) \(task: (\d+)\) with path (.+)$", first.strip())  # a folder may hold spaces
    where = f"submitit job {job[1]}, log in {Path(job[3]).parent}" if job else "a submitit job"
    stream = [line for line in rest.partition("-" * 40)[2].splitlines() if line.strip()]
    if stream and stream[-1].startswith("zhantune: "):
        return f"zhantune: a sweep job ({where}): {stream[-1].removeprefix('zhantune: ')}", 2
    state = re.search(r"\(state: ([^)]*)\)", text)
    return (f"zhantune: a sweep job ({where}) ended without a result (state: {state[1] if state else 'unknown'})"
            + (f"; its last error line: {stream[-1].strip()[:300]}" if stream else ""), 1)


def report_local_failures_at_once() -> None:
    """A submitit job that ended without a result file waits ``Job._results_timeout_s`` (15 s,
    submitit/core/core.py) for the file to appear before its failure is raised: time for a
    cluster's shared file system to show what a job wrote on another node. A ``submitit_local`` job
    runs on this machine and writes its result before its process ends (its state is read from that
    process), so none appears later: its failure (a user error, a killed job) is reported as soon as
    its process has ended, not 15 s later. Slurm jobs keep the wait."""
    from submitit.local.local import LocalJob

    LocalJob._results_timeout_s = 0


def submitit_parameter_error(text: str) -> tuple[str, int] | None:
    """One line (exit code 2) for submitit's refusal of a launcher parameter it does not know (``text``:
    what Hydra wrote: ``NameError: Unknown argument 'timeout_mn' for executor 'local' ...``, a
    traceback and exit 1 after the sweep had started: a newcomer's, who had followed Hydra's hint to
    add ``+hydra.launcher.timeout_mn``); None for any other text."""
    got = re.search(r"NameError: Unknown argument '([^']+)' for executor '([^']+)' in parameter '[^']*'\. "
                    r"Valid arguments: ([^\n]*)", text)
    if got is None:
        return None
    arg, executor, own = got[1], got[2], [a.strip() for a in got[3].split(",") if a.strip()]
    shared = re.search(r"shared/generic \(non-prefixed\) parameters are: \{([^}]*)\}", text)
    names = re.findall(r"'(\w+)':", shared[1]) if shared else []
    return (f"zhantune: hydra.launcher.{arg}: submitit's {executor} executor has no parameter {arg!r}; "
            f"it takes: {', '.join(names + own) or 'see submitit'}", 2)
