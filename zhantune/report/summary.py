"""Terminal output of a tune: the Rich progress bar and the closing summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zhantune.bench.decision import DEFAULT_MIN_SPEEDUP, below_min_speedup, decision_us, other_torch_table
from zhantune.report.console import compact
from zhantune.storage.engine import redact_url

__all__ = ["NOISE_RATIO", "TuneProgress", "print_summary", "what_ships", "within_noise", "same_kernel_gap"]


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


class TuneProgress:
    """Trial n/N of the study (all runs: a resumed study goes on from what it holds), the study's
    best so far (us, the ranking's statistic: the best stored when the run began, then this run's
    results; other workers' meanwhile show in the summary) and this run's counts by status and cache
    hits (infeasible points: in the summary); one line per measured trial, in a terminal above the bar."""

    def __init__(self, console: Console, space: Any = None):
        """``space``: the run's Space; a trial line then leaves out each branch's fixed params."""
        self.console = console
        self._fixed = {b.name: set(b.fixed) for b in space.branches} if space is not None else {}
        self._progress: Progress | None = None
        self._task: Any = None

    def start(self, total: int, completed: int = 0, best: Any = None) -> None:
        """``best``: the study's best row so far (a resumed study), or None."""
        self._progress = Progress(
            TextColumn("[bold]trial"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self.console, transient=False,
        )
        self._progress.start()
        # the ranking's statistic of the best config (README); a trial line gives each trial's median
        description = f"best {_us(decision_us(best))} us" if best is not None else ""
        self._task = self._progress.add_task(description, total=total, completed=completed)

    def update(self, result: Any, candidate: Any, meas: Any) -> None:
        assert self._progress is not None
        counts = " ".join(f"{k}={v}" for k, v in sorted(result.statuses.items()))
        best = decision_us(result.best) if result.best is not None else None  # the ranking's statistic
        done = getattr(result, "done", result.measured)
        self._progress.update(self._task, completed=done,
                              description=f"best {_us(best)} us | {counts} | cached={result.cached}")
        total = self._progress.tasks[0].total
        line = (f"trial {done}/{total:.0f} {meas.status}"
                + (f" {meas.timing.median_us:,.1f} us" if meas.timing else "")  # the median of its runs
                + f" {candidate.branch}"
                + (f" {compact(candidate.params, self._fixed.get(candidate.branch, ()))}" if candidate.params else "")
                + (f" ({meas.error_text})" if meas.error_text and not meas.ok else ""))
        self.console.print(line.rstrip(), soft_wrap=True, highlight=False, markup=False)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_summary(console: Console, run: Any, result: Any, db: str) -> None:
    """Baselines vs best (us, TFLOP/s, speedup), the best config, the database and table paths.

    Every "best" is the one ranking (zhantune.bench.decision: the minimum of individually timed
    runs, shown as "min us" beside the median); the speedup claim is the settled, paired one
    (``result.claim``, zhantune.bench.decision): the winner line says "R.RRx faster than inductor
    default" only for a confirmed claim, else "no candidate's speedup over it was confirmed" with the
    paired ratio and the reason.
    ``result``: a zhantune.tune.TuneResult; ``db``: the database URL shown."""
    ok_default = result.default is not None and result.default.status == "ok"
    default_us = decision_us(result.default) if ok_default else None
    # the claim is about the best config a table can carry (result.claimed; the best unless that one
    # is a compile-wide setting, result.not_carried)
    claimed = getattr(result, "claimed", None) or result.best
    if result.best is not None and (claimed is None or claimed.id == result.best.id):
        claimed = result.best
    console.print(_table(run, result, default_us, claimed))  # at most LOG_WIDTH columns off a terminal
    if result.best is not None:
        _print_winner(console, result, default_us, claimed, getattr(run, "export", None))
    else:
        console.print(f"[yellow]no candidate measured ok{escape(default_failure(result) or '')}[/yellow]")
    _print_notes(console, result)
    console.print(f"database: {escape(redact_url(str(db)))}  study: {escape(result.study_name)}")
    if result.table_path is not None:
        # how it is used: a CPU entry (a config patch) is applied by zhantune's handler, not by stock Inductor
        n = len(result.table_keys)  # a newcomer's (session 48): a one-shape tune's table of 3 keys, unexplained
        console.print(f"lookup table: {result.table_path} ({n} key(s)"
                      + ("" if n < 2 else ", from every problem in the database, not only this run's") + "); use it: "
                      f"zhantune.use_table({str(result.table_path)!r}) before torch.compile (README: Ship a table "
                      "with a model)" + _other_key_hint(run.problem), markup=False)


def _other_key_hint(problem: Any) -> str:
    """Where a tuned GEMM is not the one an nn.Linear makes: which is (a newcomer's, session 51: the
    demo's x @ W table used on an nn.Linear hit nothing, and nothing said why)."""
    if getattr(problem, "op", None) != "mm" or getattr(problem, "weight_layout", "kn") != "kn":
        return ""
    return ("; it serves x @ W with W stored [K, N]: an nn.Linear's GEMM (its weight [N, K], a bias) is another "
            "key, +op=addmm weight_layout=nk (python -m zhantune.collect lists a model's)")


def _table(run: Any, result: Any, default_us: float | None, claimed: Any) -> Table:
    """One row per baseline and for the best candidate (and the best a table can carry, where that
    is another): status, median and minimum (us), TFLOP/s at the minimum, speedup over the default.
    A replay's rows have no minimum column: its times were recorded by another tuner (the title says
    so), and its decision statistic is the recorded median (decision_us), the median column."""
    p = run.problem
    replay = getattr(run, "replay", None)
    source = f", recorded in {Path(str(replay.path)).name} and replayed, not measured here" if replay is not None else ""
    t = Table(title=escape(f"{p.key} on {run.device.name} ({run.device.kind}{source})"))
    t.add_column("what")
    t.add_column("status")
    t.add_column("median us", justify="right")
    if replay is None:
        t.add_column("min us", justify="right")
    t.add_column("TFLOP/s", justify="right")  # at the decision statistic, as "min us"
    t.add_column("speedup vs default", justify="right")
    unfrozen = getattr(result, "default_unfrozen", None)
    rows = [(label, r) for label, r in (("eager", result.eager), ("inductor default", result.default),
                                        ("inductor default, no freezing", unfrozen)) if r is not None]
    if result.best is not None:
        rows.append((f"best candidate: {result.best.branch}", result.best))
        if claimed is not None and claimed.config_hash != result.best.config_hash:
            rows.append((f"best in the table: {claimed.branch}", claimed))
    same_kernel = getattr(result, "same_kernel_as_default", False)
    claim = getattr(result, "claim", None)
    for label, r in rows:
        mine = decision_us(r) if r.status == "ok" else None
        speed = f"{default_us / mine:.2f}x" if default_us and mine else "-"
        # the claimed config's row (its fastest may be a later re-measurement: the same config)
        is_claimed = claimed is not None and r.kind != "default" and r.config_hash == claimed.config_hash
        if not is_claimed and r.kind != "default" and speed != "-":
            # eager, the unfrozen default, a best config not in the table: never paired against the default
            # (a ratio of two measurements taken apart; "(unconfirmed)" is for paired rounds that did not confirm)
            speed += " (unpaired)"
        elif is_claimed and speed != "-":
            if same_kernel:  # the default compile runs this very kernel: never a speedup
                speed += " (noise)" if within_noise(default_us / mine) else " (same kernel: differs)"
            elif claim is not None and claim.ratio is not None:
                speed = f"{claim.ratio:.2f}x" + ("" if claim.confirmed else " (unconfirmed)")
            elif claim is None or not claim.confirmed:
                speed += " (unpaired)"
        # at the decision statistic, as every comparison (one-sided noise inflates the median; the
        # stored column is at the median: zhantune.storage.rows)
        tflops = f"{r.tflops * r.median_us / mine:.3f}" if r.tflops and r.median_us and mine else "-"
        # a config's row is its fastest measurement: after a settle, a paired round's (not the search's)
        label += " (a re-measurement)" if r.kind == "remeasure" else ""
        mins = [_us(mine)] if replay is None else []  # a replay's decision statistic is its median
        t.add_row(escape(label), r.status, _us(r.median_us), *mins, tflops, speed)
    return t


#: a same-kernel ratio outside [1 / NOISE_RATIO, NOISE_RATIO] is reported as a difference, not as noise
NOISE_RATIO = 1.2


def within_noise(ratio: float) -> bool:
    """Whether a ratio between two measurements of one kernel is noise (within 1.2x either way,
    :data:`NOISE_RATIO`), not a difference worth a warning."""
    return 1 / NOISE_RATIO <= ratio <= NOISE_RATIO


def same_kernel_gap(result: Any) -> tuple[float, float] | None:
    """(default's, entry's) decision statistic in microseconds where the config a tune's claim is
    about (``result.claimed``, else ``result.best``) is the kernel Inductor's default compile runs
    and the two measured beyond :data:`NOISE_RATIO` apart either way; else None (``result``: a
    zhantune.tune.TuneResult)."""
    default, same = getattr(result, "default", None), getattr(result, "claimed", None) or getattr(result, "best", None)
    if not getattr(result, "same_kernel_as_default", False) or default is None or same is None:
        return None
    if default.status != "ok" or same.status != "ok":
        return None
    d, e = decision_us(default), decision_us(same)
    return None if within_noise(d / e) else (d, e)


def _print_winner(console: Console, result: Any, default_us: float | None, claimed: Any,
                  run_export: Any = None) -> None:
    """The best config, why a table cannot carry it (if so), and the winner line (``run_export``:
    the run's export options, for a claim below ``min_speedup``)."""
    claim, shipped = getattr(result, "claim", None), getattr(result, "shipped", None)
    console.print(f"best config: {result.best.template_id or result.best.branch} {compact(result.best.params)}",
                  highlight=False, markup=False)
    if getattr(result, "not_carried", None):
        console.print(f"[yellow]not in the lookup table: {escape(result.not_carried)}[/yellow]")
    if default_us and getattr(result, "same_kernel_as_default", False):  # of the claimed config (else the best)
        same = claimed or result.best
        ratio = default_us / decision_us(same)
        line = f"winner: {same.branch}, the kernel Inductor's default compile runs too: its {ratio:.2f}x here is "
        # the table ships Inductor's default for it, unless an earlier run's config all the same (said)
        ships = what_ships(shipped, run_export) if shipped is not None and shipped.row is not None else ""
        if within_noise(ratio):
            console.print(line + "measurement noise, not a speedup" + ships, markup=False)
        else:  # seen on an H200 under torch 2.11: aten::addmm compiled with the expanded bias, 0.63x
            console.print(f"[yellow]{escape(line)}not a speedup, and a gap this large says the candidate's compile may not "
                          "run what the default runs (or the timing was disturbed)"
                          + escape(ships or "; an exported table ships Inductor's default") + "[/yellow]")
    elif default_us and claim is not None and claim.confirmed:
        floor = below_min_speedup(claim, run_export)
        line = f"winner: {claimed.branch}, {claim.ratio:.{2 if floor is None else 3}f}x faster than inductor default"
        if floor is not None:  # confirmed, yet below the floor (the default's: what noise offsets reached)
            line += f", below export.min_speedup ({floor:g}): an exported table does not ship it" + (
                " (offsets that small were confirmed between two copies of one kernel: docs/timing.md)"
                if floor == DEFAULT_MIN_SPEEDUP else "")
        elif (other := other_torch_table(run_export)) is not None:  # the run's table is another torch's
            line += (f"; confirmed with this torch, so the table this run exports for torch {other!r} "
                     "(export.torch_version) does not ship it")
        elif shipped is not None and (shipped.row is None or shipped.row.config_hash != claimed.config_hash):
            line += what_ships(shipped, run_export)
        console.print(line, markup=False)
    elif default_us:
        # the reason from the paired rounds when there were any (never the unpaired ratio of the
        # fastest runs as if it were a speedup: the rounds may say the opposite)
        why = claim.reason if claim is not None else "not settled in paired rounds"
        # "in this run": a config an earlier run confirmed may still ship (what_ships says so); the
        # paired ratio named with its reason, where it was above 1x: "winner: the default" beside a
        # table row of 2.38x read as a contradiction (a newcomer's, session 48)
        ratio = f"{claim.ratio:.2f}x, " if claim is not None and claim.ratio is not None and claim.ratio > 1 else ""
        console.print(f"winner in this run: inductor default ({_us(default_us)} us): no candidate's speedup over it was "
                      f"confirmed in paired rounds ({claimed.branch if claimed is not None else result.best.branch}: "
                      f"{ratio}{why})" + ("" if shipped is None else what_ships(shipped, run_export)), markup=False)


def what_ships(shipped: Any, run_export: Any) -> str:
    """"; the table ships ..." for the run's table under this problem's key (``shipped``: a
    zhantune.inductor.builder.Shipped), said where it is not this run's confirmed winner."""
    if shipped.row is None:
        return "; the table ships Inductor's default" + (
            " (its lookup key is another problem's too, whose choice differs: neither was measured for the other)"
            if shipped.shared else "")
    row = shipped.row
    what = f"{row.template_id or row.branch} {compact(row.params)}"
    if getattr(run_export, "min_speedup", 1.0) is None:
        return f"; the table ships {what} all the same (export.min_speedup=null: the fastest stored config, no claim)"
    return f"; the table ships {what}, whose speedup paired rounds of an earlier run confirmed"


def _print_notes(console: Console, result: Any) -> None:
    """The settles' sentences, contention, transfer, the trial counts, re-used baselines."""
    if getattr(result, "speedup_text", None):
        console.print(result.speedup_text, markup=False)
    if getattr(result, "verdict_text", None):
        console.print(("[yellow]" if result.verdict != "clear" else "") + escape(result.verdict_text)
                      + ("[/yellow]" if result.verdict != "clear" else ""))
    contention = getattr(result, "contention", None)
    of = "the study's (every run's) "  # the rows counted: every run's, not only this one's
    if contention is not None and contention.text(of=of):
        console.print(f"[yellow]warning: {contention.text(of=of)}[/yellow]")
    if getattr(result, "transfer_text", None):
        console.print(result.transfer_text, markup=False)
    if getattr(result, "carried_text", None):
        console.print(result.carried_text, markup=False)
    if getattr(result, "held_text", None):
        console.print(f"[yellow]note: {escape(result.held_text)}[/yellow]")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items())) or "none"
    done, target = getattr(result, "done", result.measured), getattr(result, "target", 0)
    console.print(f"trials: {result.measured} measured ({counts}), {result.cached} cached, "
                  f"{result.infeasible} infeasible" + (" [interrupted]" if result.interrupted else "")
                  + ((f"; the study holds {done} of {target}" if done <= target else
                      f"; the study holds {done}, more than this run's budget of {target}") if target else "")
                  + (", every feasible point" if getattr(result, "exhausted", False) else ""), markup=False)
    if getattr(result, "resettled", False):
        console.print("the study was finished: its last paired rounds against the default were taken on a busy "
                      "machine, with another torch, or confirmed by a rule zhantune no longer uses (docs/timing.md), so its settles "
                      "(close call, paired rounds) ran again, without a search")
    if getattr(result, "baselines_reused", False) and result.eager is not None:
        console.print(f"baselines: stored ones re-used (measured {result.eager.created_at:%Y-%m-%d %H:%M} "
                      "with this torch; bench.remeasure_baselines=true measures them again); the default's row "
                      "above is its fastest run, every run's paired rounds included")


def default_failure(result: Any) -> str | None:
    """"; inductor default not_applied: REASON" where the default's own measurement did not run ok
    (its status and error text: a bfloat16 linear + relu on CPU, fused into oneDNN's linear_pointwise,
    makes no GEMM lookup), else None. A helper's: the summaries said "no candidate measured ok" and
    "-" with the reason in the trial lines alone."""
    d = getattr(result, "default", None)
    if d is None or d.status == "ok":
        return None
    return f"; inductor default {d.status}" + (f": {d.error_text}" if d.error_text else "")
