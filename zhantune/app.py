"""The tune app: ``python -m zhantune +op=mm shape=[M,N,K] [dtype=...] [device=...] ...``."""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from zhantune import interrupt
from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import UserError

__all__ = ["main", "open_run"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _tune_app(cfg: DictConfig) -> dict | None:
    """Returns what the job did (zhantune.multirun.job_record: a multirun's summary reads it)."""
    mark_task_started(cfg)
    interrupt.install()  # Ctrl-C and SIGTERM stop the study cleanly (exit code 130)
    from zhantune.request import check_request

    try:  # bad input is refused before torch and Inductor are imported (seconds)
        check_request(cfg)
    except UserError as e:
        user_error(e)
        return
    from zhantune.multirun import job_record
    from zhantune.report import TuneProgress, print_summary
    from zhantune.report.console import make_console
    from zhantune.tune import tune

    console = make_console()
    if cfg.problems:
        return _problems(cfg, console)
    try:
        run, store = open_run(cfg)
        result = tune(run, store, TuneProgress(console, run.space) if cfg.progress else None)
    except UserError as e:
        user_error(e)
        return
    except Exception as e:
        from zhantune.storage.rerun import locked_out

        if (msg := locked_out(e, cfg.storage.url)) is None:
            raise
        user_error(msg)
        return
    if result.already_finished:
        print_finished(console, result, run.export, replay=run.replay is not None)
        return job_record([(run, result)], cfg.storage.url)  # a multirun's summary: done, not failed
    print_summary(console, run, result, cfg.storage.url)
    if result.interrupted:
        missing = max(0, result.target - result.done)  # none: the settle was interrupted (it said "the 0 trial(s)")
        console.print("[yellow]interrupted: run the same command again to " + (
            f"resume the study (it measures the {missing} trial(s) still missing)" if missing else
            "settle the speedup (the search is done; the paired rounds run again)") + "[/yellow]")
        sys.exit(130)
    return job_record([(run, result)], cfg.storage.url)


def open_run(cfg: DictConfig) -> tuple[Any, Any]:
    """(RunSpec, Store) of a composed tune config: every check of the request
    (zhantune.runspec.resolve_run), then the database opened (or created). Raises a UserError (the
    app prints it on one line and exits with code 2) before anything is written."""
    from zhantune.runspec import resolve_run
    from zhantune.storage import Store

    run = resolve_run(cfg)
    store = Store(cfg.storage.url)
    store.check_readable()  # transfer and the export read stored times: a bad one is refused now, not half way
    return run, store


def print_finished(console: Console, result: Any, export: Any = None, replay: bool = False) -> None:
    """The study had measured its budget before this run: say so, with its best config, and its
    stored claim, naming the config the claim is about where that is not the best (a compile-wide
    setting no table carries won) and saying where ``export.min_speedup`` keeps it out of a table.
    ``replay``: a Kernel Tuner file's study, which no lookup table carries (no export hint: a helper's)."""
    from zhantune.bench.decision import below_min_speedup, decision_us
    from zhantune.report.console import compact

    why = ("every feasible point of its space is measured" if result.exhausted
           else f"{result.before} of {result.target} trials measured" if result.before <= result.target
           else f"{result.before} trials measured (search.n_trials={result.target})")
    more = "space=[...] with other spaces measures theirs" if result.exhausted else "search.more_trials=N measures N more"
    console.print(f"study {escape(repr(result.study_name))} is finished: {why}; nothing to measure. "
                  f"{more}" + ("" if replay else "; python -m zhantune.export writes the table again"), highlight=False)
    if result.best is not None:
        console.print(f"best config: {result.best.template_id or result.best.branch} {compact(result.best.params)} "
                      f"({decision_us(result.best):,.1f} us)", highlight=False, markup=False)
    claim = result.claim  # its newest stored verdict, judged by the rule in use (zhantune.tune_result.stored_claim)
    if claim is not None and claim.ratio is not None:
        claimed = getattr(result, "claimed", None)
        of = "" if claimed is None or result.best is None or claimed.config_hash == result.best.config_hash else (
            f" of {claimed.template_id or claimed.branch} {compact(claimed.params)} (the best config a table carries)")
        floor = below_min_speedup(claim, export)
        console.print(f"speedup vs default{of}, its stored paired rounds: " + (
            f"confirmed {claim.claim_text()}" if claim.confirmed else f"no claim ({claim.claim_text()}): {claim.reason}")
            + ("" if floor is None else f", below export.min_speedup ({floor:g}): an exported table ships Inductor's default"),
            highlight=False, markup=False)
    if getattr(result, "settle_deferred", None):
        console.print(f"its settles are due again, not run: {result.settle_deferred}", highlight=False, markup=False)


def _problems(cfg: DictConfig, console: Console) -> dict | None:
    from zhantune.multirun import job_record
    from zhantune.problemset import resolve_problems, tune_problems
    from zhantune.report.problems import print_problems_summary
    from zhantune.storage import Store

    try:
        runs = resolve_problems(cfg)  # every problem validated before the database is opened
        store = Store(cfg.storage.url)
        store.check_readable()
        result = tune_problems(cfg, runs, store, console)
    except UserError as e:
        user_error(e)
        return
    print_problems_summary(console, result)
    if result.interrupted:
        console.print("[yellow]interrupted: run the same command again to resume[/yellow]")
        sys.exit(130)
    return job_record([(pr.run, pr.result) for pr in result.runs if pr.result is not None], cfg.storage.url)


def main() -> None:
    run_app(_tune_app)
