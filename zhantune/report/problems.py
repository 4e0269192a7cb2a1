"""The problems summary of ``python -m zhantune problems=FILE`` (zhantune.problemset): one row per
problem with its default's and best config's time and the settled speedup claim, as the single
tune's summary (zhantune.report.summary) states them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from zhantune.bench.conditions import ContentionCount
from zhantune.bench.decision import below_min_speedup, decision_us, other_torch_table
from zhantune.report.console import print_table
from zhantune.report.summary import default_failure, same_kernel_gap

__all__ = ["print_problems_summary", "claim_cell"]


def print_problems_summary(console: Console, result: Any) -> None:
    """One row per problem: the default's and the best config's time (microseconds, the decision
    statistic: fastest run, zhantune.bench.decision.decision_us) and the settled, paired speedup claim
    (zhantune.bench.decision; "unconfirmed" ones ship the default); then the machine's contention
    over all problems' timed measurements (``result``: a zhantune.problemset.ProblemsResult)."""
    t = Table(title="problems")
    for col in ("problem", "count", "trials", "default min us", "best min us", "speedup (paired)"):
        t.add_column(col, justify="left" if col == "problem" else "right")
    contention = ContentionCount()
    for pr in result.runs:
        r = pr.result
        if r is None:
            continue
        d = decision_us(r.default) if r.default is not None and r.default.status == "ok" else None
        b = decision_us(r.best) if r.best is not None else None
        t.add_row(escape(pr.run.problem.key), str(pr.row.get("count", 1)), str(r.done),
                  f"{d:,.1f}" if d else "-", f"{b:,.1f}" if b else "-", claim_cell(r, getattr(pr.run, "export", None)))
        contention += r.contention
    print_table(console, t)
    for pr in result.runs:  # why a row is all "-": the default itself did not run (a helper's)
        if pr.result is not None and pr.result.best is None and (why := default_failure(pr.result)):
            console.print(f"{pr.run.problem.key}: no config measured ok{why}", markup=False, soft_wrap=True)
    for pr in result.runs:  # as the tune's summary warns (report.summary): "(same kernel: differs)"
        if pr.result is not None and (gap := same_kernel_gap(pr.result)):
            r = pr.result  # the claim is about the best a table carries (the best unless a compile-wide setting)
            same = r.claimed is None or r.best is None or r.claimed.config_hash == r.best.config_hash
            what = "its best config" if same else "the best config a table carries"
            console.print(f"[yellow]warning: {escape(pr.run.problem.key)}: {what} is the kernel Inductor's default "
                          f"compile runs, yet the default's fastest run took {gap[0]:,.1f} us and this one's "
                          f"{gap[1]:,.1f} us (default / entry {gap[0] / gap[1]:.2f}x): the candidate's compile may not "
                          "run what the default runs (or the timing was disturbed)[/yellow]")
    of = "the studies' (every run's) "  # each study's rows, not only this run's
    if contention.text(of=of):
        console.print(f"[yellow]warning: {contention.text(of=of)}[/yellow]")
    for key, theirs, own in result.other_keys:  # a helper's hand-edited row: op mm, the model's addmm key
        console.print(f"warning: {key}: the problems file's lookup_key {theirs!r} (the model's lookup, where it was "
                      f"collected) is not the key this problem's own compile made (stored with the problem by the first "
                      f"run that measured it), {own!r}: its table entry is under the latter, which that model does not "
                      "look up (collect the model again on this device, or fix the row)", soft_wrap=True, markup=False, highlight=False)
    if result.table_path is not None:
        placed = [pr.result.shipped for pr in result.runs if pr.result is not None and pr.result.shipped is not None]
        defaults = sum(1 for s in placed if s.row is None)
        console.print(f"lookup table: {result.table_path} ({len(result.table_keys)} key(s)"
                      + (f"; {defaults} of its {len(placed)} problem(s) get Inductor's default choice (each row's "
                         "speedup cell says why)" if defaults else "") + ")", markup=False)


def claim_cell(r: Any, export: Any) -> str:
    """The speedup as the tune's summary states it: confirmed ratio, "(unconfirmed)", or "-"; "(<
    min_speedup)" where ``export.min_speedup`` keeps a confirmed claim out of the table, "(other
    torch's table)" where ``export.torch_version`` names another torch (the claim does not ship),
    "(default ships[: shared key])" where the table ships Inductor's default all the same, "(table:
    another config)" where it ships a config other than the claimed one (an earlier run's claim);
    "(same kernel[: differs])" where the claimed config is the default's own kernel (differs: beyond
    zhantune.report.summary.NOISE_RATIO, with a warning below the table). "(of the best a table
    carries)" follows where the claim is about another config than the best (a compile-wide setting
    no table carries was fastest), whose time the row's best column shows."""
    cell = _claim_cell(r, export)
    claimed, best = getattr(r, "claimed", None), getattr(r, "best", None)
    if cell != "-" and claimed is not None and best is not None and claimed.config_hash != best.config_hash:
        cell += " (of the best a table carries)"
    return cell


def _claim_cell(r: Any, export: Any) -> str:
    if getattr(r, "same_kernel_as_default", False):
        shipped = getattr(r, "shipped", None)  # an earlier run's config ships all the same: said
        return ("- (same kernel: differs)" if same_kernel_gap(r) else "- (same kernel)") + (
            " (table: another config)" if shipped is not None and shipped.row is not None else "")
    claim = r.claim
    if claim is None or claim.ratio is None:
        return "-"
    if below_min_speedup(claim, export) is not None:  # 3 decimals: 1.017x shows as 1.02x with 2
        return f"{claim.ratio:.3f}x (< min_speedup)"
    if claim.confirmed and other_torch_table(export) is not None:
        return f"{claim.ratio:.2f}x (other torch's table)"
    cell = f"{claim.ratio:.2f}x" + ("" if claim.confirmed else " (unconfirmed)")
    shipped = getattr(r, "shipped", None)  # what the table ships under the problem's key
    if shipped is not None and shipped.row is None:  # an unconfirmed one's too (a newcomer read 1.20x as shipped)
        return cell + (" (default ships: shared key)" if shipped.shared else " (default ships)")
    if shipped is not None and shipped.row is not None and shipped.row.config_hash != getattr(r.claimed or r.best, "config_hash", None):
        return cell + " (table: another config)"
    return cell
