"""Hydra multirun (``python -m zhantune -m ...``, e.g. with the submitit launcher): a record per job and a
summary in the launcher's log once every job has ended.

:class:`MultirunSummary` is a Hydra callback, listed in the tune app's config (``hydra.callbacks``).
In each job (on the launcher's machine or a cluster node) it writes what the job did, the tune app's
return value, to ``zhantune_job.json`` in the job's output directory; in the launcher, after the
last job, it reads those files from the sweep directory (a shared file system, as the submitit
launcher needs anyway) and prints one row per job and one per study. A job that died wrote no record:
its row says so, and its log is in the launcher's folder (``.submitit/<job id>/`` with submitit).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from zhantune.launcher import check_launcher_options

__all__ = ["MultirunSummary", "job_record", "JOB_RECORD"]

#: the file each job of a multirun writes in its output directory
JOB_RECORD = "zhantune_job.json"
#: the file in the sweep directory naming this sweep (a token each job's record carries): a sweep
#: directory reused (``hydra.sweep.dir=...`` twice) holds the earlier sweep's records too, which a helper
#: found in the summary, with its database named as the jobs' storage
SWEEP_TOKEN = ".zhantune_sweep"
#: the sweep this launcher runs, (sweep directory, jobs), from its start until its summary is printed
_RUNNING: list[tuple[Path, int | None]] = []


def job_record(runs: list[tuple[Any, Any]], storage_url: str) -> dict[str, Any]:
    """What a job did, for the launcher's summary: per (RunSpec, TuneResult) the study, its total
    (``search.n_trials``, or what ``search.more_trials`` made it), the trials this job measured (and
    how many of them were dead workers' points measured again), the dead workers' trials it failed,
    the study's measured candidates when it ended, whether the study was finished before the job
    started (a late job of a sweep: nothing to do, not a failure), whether it only settled the
    finished study's speedup again (``resettled``: its last paired rounds were disturbed), and the
    best so far."""
    from zhantune.bench.decision import decision_us
    from zhantune.provenance import worker_name
    from zhantune.storage import redact_url

    studies = []
    for run, result in runs:
        best = result.best
        finished = bool(getattr(result, "already_finished", False))  # nothing left when this job started
        studies.append({
            "study": run.study_name, "n_trials": int(result.target or run.search.n_trials), "measured": result.measured,
            "retried": result.retried, "reaped": result.reaped, "cached": result.cached,
            "study_measured": result.before if finished else result.study_measured,
            "waited_s": round(result.waited_s, 1), "interrupted": result.interrupted, "already_finished": finished,
            "resettled": bool(getattr(result, "resettled", False)),
            "best_us": decision_us(best) if best is not None else None,
            "best": _describe(best) if best is not None else None,
            "claim": _claim(result, run.cfg.export.get("min_speedup"), getattr(run, "export", None)),
        })
    return {"zhantune_job": 1, "worker": worker_name(), "storage": redact_url(storage_url),
            "ended_at": dt.datetime.now(dt.timezone.utc).isoformat(), "studies": studies}


def _claim(result: Any, min_speedup: float | None, export: Any = None) -> str:
    """The study's speedup claim over Inductor's default (a TuneResult's ``claim``, about its
    ``claimed`` config, the best a table can carry) and whether an export at ``min_speedup`` ships
    it: the best config's time alone is not a claim (a sweep's summary listed only that); where the
    job's table (``result.shipped``; ``export``: the run's export options) ships something else under
    the problem's key (Inductor's default for a shared key or another device's claim, an earlier
    run's config), it says what (zhantune.report.summary.what_ships). A claimed config that is the
    default's own kernel claims nothing ("none: ..."), and its key ships the default (or what the
    table ships instead, said so)."""
    v = result.claim
    if v is None:
        return "not settled"
    claimed, shipped = result.claimed, getattr(result, "shipped", None)  # what this job's table ships
    # the claim is about the best a table carries, not the best (a faster config no table can carry)
    best_carried = claimed is not None and result.best is not None and claimed.config_hash != result.best.config_hash
    if getattr(result, "same_kernel_as_default", False):  # as the tune's summary: no speedup, nothing unconfirmed
        text = f"none: the best{' a table carries' if best_carried else ''} is the default's own kernel"
        from zhantune.report.summary import same_kernel_gap, what_ships

        if gap := same_kernel_gap(result):  # as the tune's summary warns
            text += (f", yet measured {gap[1]:,.1f} us against the default's {gap[0]:,.1f} us (default / entry "
                     f"{gap[0] / gap[1]:.2f}x): its compile may not run what the default runs, or the timing was disturbed")
        if shipped is not None and shipped.row is not None:  # what the table ships instead, said so
            return text + what_ships(shipped, export)
        return text + "; Inductor's default ships"
    if v.confirmed:
        text = f"confirmed {v.claim_text()}"
        if best_carried:
            text += f" for {_describe(claimed)}, the best a table carries"
        none_ships = min_speedup is not None and v.ratio < min_speedup
        text += f"; below export.min_speedup={min_speedup:g}" if none_ships else ""
    else:
        none_ships = min_speedup is not None
        text = "unconfirmed" + ("" if none_ships else " (export.min_speedup=null: the fastest ships, claimed or not)")
    if none_ships and (shipped is None or shipped.row is None and not shipped.shared):
        return text + ": Inductor's default ships"
    if shipped is None or (shipped.row is not None and claimed is not None and not none_ships
                           and shipped.row.config_hash == claimed.config_hash):
        return text
    from zhantune.report.summary import what_ships

    return text + what_ships(shipped, export)


def _describe(row: Any) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted((row.params or {}).items()))
    return f"{row.template_id or row.branch} {{{params}}}"


def _check_every_job(config: DictConfig) -> None:
    """Compose and check every job of a sweep (Hydra's basic sweeper) before the first one runs, so
    that a bad value in a later job (``search.seed=0,abc``, ``search.seed=0,-1``, ``dtype=float32,${nope}``)
    is one line with exit code 2 before anything is measured or stored, not Hydra's multi-line error
    (exit code 1) or a refusal after the earlier jobs' work. Each job is set up as the launcher sets
    it up (:func:`_check_job`), and Hydra's global config is put back as it was."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    _check_sweep_dir(config)
    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith(".BasicSweeper"):
        return
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    parsed = OverridesParser.create().parse_overrides(task)
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    loader, hydra_config = GlobalHydra.instance().config_loader(), HydraConfig.instance()
    before = hydra_config.cfg
    checked: set[tuple[str, str]] = set()  # the files and databases checked so far (each distinct one once)
    studies: dict[str, tuple[int, str]] = {}  # search.study_name -> (first job, its problem)
    try:
        for i, job in enumerate(jobs if len(jobs) > 1 else []):  # a single job checks itself, as a plain run
            task = _check_job(config, loader, hydra_config, i, job, swept, checked)
            name = None if task is None else OmegaConf.select(task, "search.study_name", default=None)
            if name is not None:  # one study tunes one problem (a helper's job #1 refused after job #0 tuned)
                problem = str([OmegaConf.select(task, k, default=None) for k in ("op.name", "shape", "dtype",
                                                                                 "op.activation", "weight_layout",
                                                                                 "bench.path")])
                first = studies.setdefault(str(name), (i, problem))
                if first[1] != problem:
                    from zhantune.cli import user_error

                    user_error(f"sweep job #{i}: search.study_name={name!r} is also job #{first[0]}'s, of another "
                               "problem: one study tunes one problem; drop search.study_name or sweep it with the problem")
    finally:
        hydra_config.cfg = before


def _check_sweep_dir(config: DictConfig) -> None:
    """The sweep's directory (hydra.sweep.dir), which the sweeper creates once this callback returns,
    must be one this user can create: under a file it was a NotADirectoryError traceback (exit 1)."""
    import os

    from zhantune.cli import one_line, user_error

    try:
        sweep_dir = Path(str(config.hydra.sweep.dir))
    except Exception as e:  # an interpolation that does not resolve
        user_error(f"hydra.sweep.dir: {one_line(str(e))}")
    parent = sweep_dir
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        user_error(f"hydra.sweep.dir={sweep_dir}: {parent} is not a directory this user can write in; give "
                   "hydra.sweep.dir=DIR")


#: a character Hydra's sweeper escapes in each job's overrides, with its backslash (the ESC token of
#: hydra/_internal/grammar/utils.py: backslash, ()[]{}:=, space and tab)
_UNESCAPE = re.compile(r"\\([\\{}():=,\[\] \t])")


def _check_job(config: DictConfig, loader: Any, hydra_config: Any, i: int, job: list[str], swept: set[str],
               checked: set[tuple[str, str]]) -> DictConfig | None:
    """One job of :func:`_check_every_job`: composed, with hydra.job.num and id and
    hydra.runtime.output_dir set as the launcher sets them (``${hydra:job.num}``,
    ``${hydra:runtime.cwd}`` resolve), then checked as the job's task function checks it, and the
    files and database it names (:func:`_check_job_inputs`); a failure other than a user error is left
    to the job itself. Returns the job's task config (None where it could not be made)."""
    from omegaconf import open_dict

    from zhantune.cli import one_line, user_error
    from zhantune.composed import unresolved_problem
    from zhantune.errors import UserError
    from zhantune.request import check_request

    # the job's swept values, as typed (the sweeper escapes what the grammar would read: '$\{', ':')
    shown = " ".join(_UNESCAPE.sub(r"\1", o) for o in job if o.lstrip("+~").split("=", 1)[0] in swept)
    where = f"sweep job #{i} ({shown})"
    try:
        cfg = loader.load_sweep_config(config, list(job))
    except Exception as e:  # Hydra's own: a value of the wrong type, an unknown key
        cause = f"; {one_line(str(e.__cause__))}" if e.__cause__ is not None else ""
        user_error(f"{where}: {one_line(str(e))}{cause}")
    try:
        with open_dict(cfg):
            cfg.hydra.job.num, cfg.hydra.job.id = i, str(i)
            cfg.hydra.runtime.output_dir = str(Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir))
        hydra_config.set_config(cfg)
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # as the task function gets it
    except Exception:
        return None
    msg = unresolved_problem(task)
    if msg:  # its override as typed, not as the sweeper escaped it ($\{nope\})
        user_error(where + ": " + _UNESCAPE.sub(r"\1", msg))
    try:
        check_request(task)
        _check_job_inputs(task, checked)
        from zhantune.runspec import check_task_fits

        check_task_fits(task)  # a shape beyond memory (shape=, a problems file's rows): before job #0 runs
    except UserError as e:
        user_error(f"{where}: {e}")
    except Exception:  # not the input's fault, or not seen until the job runs: the job reports it
        pass
    return task


def _check_job_inputs(task: DictConfig, checked: set[tuple[str, str]]) -> None:
    """The files and database a sweep's job names, each distinct one once (``checked``), read as the
    job reads them: a replayed Kernel Tuner file (bench.path), a problems file (problems=), an existing
    SQLite database (another program's, a newer schema, a damaged file). Raises the job's UserError,
    so that a bad one in a later job stops the sweep before the first job measures (an attack, session
    42: job #0 tuned and stored, then job #1 was refused)."""
    from zhantune.storage import sqlite_path

    inputs = [("bench.path", str(task.bench.path)) if task.bench.name == "replay" and task.bench.path else None,
              ("problems", str(task.problems)) if task.get("problems") else None,
              ("storage.url", str(task.storage.url))]
    for item in inputs:
        if item is None or item in checked:
            continue
        option, value = item
        if option == "bench.path":
            from zhantune.bench.recorded import load_kerneltuner

            load_kerneltuner(value, option)
        elif option == "problems":
            from zhantune.problems.file import read_problems

            read_problems(value)
        elif (path := sqlite_path(value)) is not None and path.is_file():
            from zhantune.storage.engine import existing_revision

            existing_revision(value, option)
        checked.add(item)
    trials = ("trials", str(task.get("problems")), f"{task.search.total_trials} {task.search.n_trials}")
    if task.get("problems") and trials not in checked:  # a helper's total_trials=2,1: job #1 refused after job #0 tuned
        from zhantune.problems.file import read_problems, total_trials

        total_trials(task, read_problems(str(task.problems)))
        checked.add(trials)


class MultirunSummary(Callback):
    """Hydra callback of the tune app: job records in multirun jobs, a summary in the launcher."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # composition succeeded: from here on a failure (a job's) is reported as Hydra reports it,
        # not reworded as a one-line user error (zhantune.cli.run_app)
        from zhantune.cli import mark_task_started

        check_launcher_options(config.hydra.launcher)
        _check_every_job(config)
        sweep = Path(str(config.hydra.sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        (sweep / SWEEP_TOKEN).write_text(uuid.uuid4().hex)
        _RUNNING[:] = [(sweep, _job_count(config))]
        mark_task_started()
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if "submitit" in launcher:
            from zhantune.cli import hold_stderr_for_launcher

            hold_stderr_for_launcher()  # a job's failure: its one line, not Hydra's traceback of it
        if launcher.endswith("submitit_launcher.LocalLauncher"):
            from zhantune.launcher import report_local_failures_at_once

            report_local_failures_at_once()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return
        try:
            value = job_return.return_value
        except Exception:  # the job failed: no record (the launcher's summary says so)
            return
        if isinstance(value, dict) and value.get("zhantune_job"):
            from zhantune.redact import hide_overrides

            token = Path(hc.sweep.dir, SWEEP_TOKEN)
            record = {**value, "job": hc.job.num, "overrides": hide_overrides(hc.overrides.task, config),
                      "sweep": token.read_text() if token.is_file() else None}
            Path(hc.runtime.output_dir, JOB_RECORD).write_text(json.dumps(record, indent=1))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _RUNNING.clear()
        print_multirun_summary(Path(str(config.hydra.sweep.dir)), _job_count(config))


def summary_of_an_ended_sweep() -> None:
    """The summary of a sweep that ended on a job's failure (a job's user error ends a sweep of Hydra's
    basic launcher, a job killed under submitit raises in the launcher: Hydra then skips on_multirun_end,
    and the summary was missing when a job had died, a helper found); nothing where none ran."""
    if _RUNNING:
        sweep, jobs = _RUNNING.pop()
        print("the sweep ended on a job's failure; what its jobs recorded (a job not started wrote no record "
              "either):", flush=True)
        print_multirun_summary(sweep, jobs)


def _job_count(config: DictConfig) -> int | None:
    """Jobs the sweep launched (Hydra's basic sweeper: the product of the swept values); None if unknown."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    except Exception:
        return None
    n = 1
    for o in parsed:
        if o.is_sweep_override():
            n *= len(list(o.sweep_string_iterator()))
    return n


def read_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """The job records of the sweep that last started in a sweep directory (its :data:`SWEEP_TOKEN`;
    a directory without one: every record), by job number."""
    token = sweep_dir / SWEEP_TOKEN
    sweep = token.read_text() if token.is_file() else None
    records = []
    for path in sweep_dir.glob(f"*/{JOB_RECORD}"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if sweep is None or record.get("sweep") == sweep:
            records.append(record)
    return sorted(records, key=lambda r: r.get("job", 0))


def print_multirun_summary(sweep_dir: Path, n_jobs: int | None = None) -> None:
    """One row per job (what it measured), one per study (its state when its last job ended)."""
    from rich.console import Console
    from rich.table import Table

    from zhantune.report.console import print_table

    console = Console()
    if not console.is_terminal:  # a launcher's log file: wide rows rather than wrapped cells
        console = Console(width=200)
    records = read_records(sweep_dir)
    jobs = Table(title=escape(f"zhantune multirun: {len(records)} job record(s) in {sweep_dir}"))
    for col in ("job", "worker", "study", "measured", "retried", "dead trials failed", "waited for workers s",
                "study measured"):  # waited: for other workers' trials (not the busy-machine back-off)
        jobs.add_column(col, justify="left" if col in ("worker", "study") else "right")
    last: dict[str, dict[str, Any]] = {}
    claims: dict[str, tuple[str, str]] = {}
    for r in records:
        for s in r["studies"]:
            jobs.add_row(str(r.get("job")), escape(r["worker"]), escape(s["study"]), str(s["measured"]), str(s["retried"]),
                         str(s["reaped"]), f"{s['waited_s']:.0f}",
                         f"{s['study_measured']}/{s['n_trials']}" + (" (interrupted)" if s["interrupted"] else "")
                         + (" (finished before the job)" if s.get("already_finished") else ""))
            if s["study"] not in last or r["ended_at"] >= last[s["study"]]["ended_at"]:
                last[s["study"]] = {**s, "ended_at": r["ended_at"]}
            # the newest job that settled the study's claim (a job that measured none of it settled nothing)
            if s.get("claim") not in (None, "not settled") and r["ended_at"] >= claims.get(s["study"], ("",))[0]:
                claims[s["study"]] = (r["ended_at"], s["claim"])
    console.print(jobs)
    # which: a helper's sweep interrupted in job #0 said "2 job(s) wrote no record", job #1 never started
    missing = [] if n_jobs is None else sorted(set(range(n_jobs)) - {r.get("job") for r in records})
    if missing:
        console.print(f"[yellow]{len(missing)} job(s) wrote no record ({', '.join(f'#{j}' for j in missing)}: failed, "
                      "killed, interrupted, or never started): see their logs (with submitit: .submitit/<job id>/ in "
                      "the sweep directory)[/yellow]")
    studies = Table(title="studies (as their last job left them)")
    for col in ("study", "measured", "best us", "best config", "speedup vs default (paired)"):
        studies.add_column(col, justify="right" if col in ("measured", "best us") else "left")
    for name, s in sorted(last.items()):
        studies.add_row(escape(name), f"{s['study_measured']}/{s['n_trials']}",
                        f"{s['best_us']:,.1f}" if s["best_us"] is not None else "-", escape(s["best"] or "-"),
                        escape(claims.get(name, ("", s.get("claim") or "-"))[1]))
    print_table(console, studies)  # as wide as its cells: a claim is never wrapped
    if records:
        console.print(f"one table from every problem: python -m zhantune.export storage.url=... "
                      f"(storage of the jobs: {records[-1]['storage']})", markup=False)
