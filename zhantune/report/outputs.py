"""A Comparison as terminal tables (Rich), CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from zhantune.paths import write_atomic
from zhantune.report.console import compact, print_table
from zhantune.report.regret import Choice, Claim, Comparison

__all__ = ["STORED_TIMES", "other_torch_text", "left_out_text", "claim_text", "print_comparison", "comparison_records", "write_csv", "write_json"]


#: what compare's times and ratios are (printed above its tables, written into its HTML report)
STORED_TIMES = ("times: each config's stored time on each device, its fastest run (a Kernel Tuner import's: the "
                "median of its recorded runs), from its tunes' and imports' own runs, never paired with one another; "
                "regrets are ratios of these stored times, not paired measurements. A speedup over Inductor's "
                "default is claimed only by a tune's or a replay's paired rounds")


def other_torch_text(cmp: Comparison) -> str:
    """What compare left out for being measured with another torch release (``cmp.other_torch``)."""
    return (f"{sum(cmp.other_torch.values())} measurement(s) made with another torch release than this {cmp.torch} ("
            + ", ".join(f"{d}: {n}" for d, n in cmp.other_torch.items())
            + "); a config's time and its claim hold for the release they were measured with")


def left_out_text(cmp: Comparison) -> str:
    """What compare left out for being measured correctly on one compared device only (``cmp.left_out``)."""
    return (f"{sum(cmp.left_out.values())} problem(s) with a correct measurement on one device only ("
            + ", ".join(f"{d}: {n}" for d, n in cmp.left_out.items()) + "); devices=[KEY] compares one device's own")


def _x(v: float | None) -> str:
    if v is None:
        return "-"
    return "fails" if math.isinf(v) else f"{v:.3f}x"


def _params(c: Choice | None) -> str:
    return "-" if c is None else compact(c.params)


def _differing(choices: list[Choice]) -> list[str]:
    """Param names whose values differ between the choices (none when there is one)."""
    names = set().union(*(c.params for c in choices))
    return sorted(k for k in names if len({repr(c.params.get(k)) for c in choices}) > 1)


def print_comparison(console: Console, cmp: Comparison, top: int = 5, history: bool = False) -> None:
    """Per problem: each device's best time and its winner's regret elsewhere (a table), each
    winner's config in full and the portable choice (lines of compact ``k=v``); then the matrix.
    Off a terminal a table is as wide as its cells and a config line is never wrapped or cut.
    ``history``: this command draws a study's history (html= and study=): no hint to do so."""
    several = len(cmp.devices) > 1
    console.print(STORED_TIMES, soft_wrap=True, highlight=False, markup=False)
    for p in cmp.problems:
        t = Table(title=escape(p.problem_key))
        t.add_column("device")
        t.add_column("best us", justify="right")
        if several:
            for d in cmp.devices:
                t.add_column(escape(f"its winner on {d}"), justify="right")  # the row device's winner
        for a in cmp.devices:
            if a not in p.best_us:
                continue
            row = [escape(a), f"{p.best_us[a]:,.1f}"] + ([_x(p.regret.get((a, b))) for b in cmp.devices] if several else [])
            t.add_row(*row)
        print_table(console, t)
        for a in cmp.devices:
            if a in p.winner:
                console.print(f"winner of {a}: {_params(p.winner[a])}", soft_wrap=True, highlight=False, markup=False)
            if a in p.claims and p.claims[a].ratio is not None:  # a tune or a replay paired it with the default
                console.print(f"speedup of {a}'s winner over Inductor's default there: {claim_text(p.claims[a])}",
                              soft_wrap=True, highlight=False, markup=False)
        if several:
            differ = _differing(list(p.winner.values()))
            console.print("params that differ between the winners: " + (", ".join(differ) or "none"),
                          soft_wrap=True, highlight=False, markup=False)
        else:
            console.print("one device: no cross-device regret" + ("" if history else " (python -m zhantune.compare "
                          "html=report.html study=NAME draws a study's search history)"))
            continue
        for label, c in (("portable (min worst regret)", p.portable), ("portable (min geomean regret)", p.portable_geomean)):
            if c is None:
                console.print(f"{label}: no config was measured correct on every device")
            else:
                regrets = ", ".join(f"{d} {_x(r)}" for d, r in c.regret.items())
                console.print(f"{label}: worst {_x(c.worst_regret)}, geomean {_x(c.geomean_regret)} "
                              f"({regrets}) {_params(c)}", soft_wrap=True, highlight=False, markup=False)
    if cmp.left_out:  # compared: problems measured on two or more of the devices
        console.print(f"left out: {left_out_text(cmp)}", soft_wrap=True, highlight=False, markup=False)
    if cmp.other_torch:  # as the export ranks: one torch release's rows
        console.print(f"left out: {other_torch_text(cmp)}", soft_wrap=True, highlight=False, markup=False)
    if not several:
        return
    m = Table(title="geometric-mean regret: winners of (row) run on (column)")
    m.add_column("winners of")
    for d in cmp.devices:
        m.add_column(escape(d), justify="right")
    for a in cmp.devices:
        m.add_row(escape(a), *[_x(cmp.matrix[(a, b)]) for b in cmp.devices])
    print_table(console, m)
    if top > 0:  # top=0: none asked for (it printed "most disagreement: " and nothing)
        console.print("most disagreement: " + "; ".join(f"{p.problem_key} {_x(p.disagreement)}"
                                                         for p in cmp.most_disagreeing(top)), highlight=False, markup=False)


def claim_text(c: Claim) -> str:
    """A :class:`Claim` in one phrase: "confirmed 1.149x (3 paired round(s), 1.140-1.170x)", or
    "no claim (R.RRRx in N paired round(s), L-Hx): REASON", or "no claim: REASON"."""
    if c.ratio is None:
        return f"no claim: {c.reason}"
    spread = f"{c.rounds} paired round(s), {c.ratio_low:.3f}-{c.ratio_high:.3f}x" if c.ratio_low and c.ratio_high \
        else f"{c.rounds} paired round(s)"
    if c.confirmed:
        return f"confirmed {c.ratio:.3f}x ({spread})"
    return f"no claim ({c.ratio:.3f}x in {spread}): {c.reason}"


def _claim(c: Claim | None) -> dict[str, Any] | None:
    return None if c is None else {
        "confirmed": c.confirmed, "reason": c.reason, "ratio": c.ratio, "ratio_low": c.ratio_low,
        "ratio_high": c.ratio_high, "rounds": c.rounds, "torch_version": c.torch_version}


def comparison_records(cmp: Comparison) -> list[dict[str, Any]]:
    """One flat record per (problem, device A's winner, device B): the CSV rows. Times in
    microseconds, stored and never paired with one another (:data:`STORED_TIMES`); ``regret`` is
    their ratio. The ``claim_*`` columns, on the row where B is A, are the winner's speedup claim over
    Inductor's default there (:class:`zhantune.report.regret.Claim`: paired rounds; ``claim_confirmed``
    is what the export ships at ``min_speedup``), empty elsewhere. ``torch`` is the release whose rows were
    compared; ``other_torch_left_out``, the rows of device B measured with another release and left out
    (the JSON's ``other_torch``; the console's "left out" line)."""
    rows = []
    for p in cmp.problems:
        for a, w in p.winner.items():
            for b in cmp.devices:
                if b not in p.best_us:
                    continue
                r = p.regret.get((a, b))
                c = p.claims.get(a) if a == b else None
                rows.append({
                    "problem": p.problem_key, "winner_of": a, "run_on": b, "best_us_on": p.best_us[b],
                    "winner_us_on": None if r is None or math.isinf(r) else r * p.best_us[b],
                    "regret": None if r is None else (r if math.isfinite(r) else "inf"),
                    "config_hash": w.config_hash, "template_id": w.template_id,
                    "params": json.dumps(w.params, sort_keys=True),
                    "claim_confirmed": None if c is None else c.confirmed,
                    "claim_ratio": None if c is None else c.ratio,
                    "claim_reason": None if c is None else c.reason,
                    "torch": cmp.torch, "other_torch_left_out": cmp.other_torch.get(b, 0),
                })
    return rows


def write_csv(path: str | Path, cmp: Comparison) -> Path:
    rows = comparison_records(cmp)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return write_atomic(path, text.getvalue(), "csv")


def _choice(c: Choice | None, devices: Any = ()) -> dict[str, Any] | None:
    """A choice as JSON; ``devices``: the problem's compared devices. Its worst and geomean regret
    are null where it was not run on every one of them (a helper found a winner never run on the other
    device given a worst regret of 1.0, its own device's; the console and the HTML show "-")."""
    if c is None:
        return None
    everywhere = set(devices) <= set(c.regret)
    return {"config_hash": c.config_hash, "template_id": c.template_id, "params": c.params,
            "regret": {d: (r if math.isfinite(r) else "inf") for d, r in c.regret.items()},
            "measured_on_every_device": everywhere,
            "worst_regret": None if not everywhere else c.worst_regret if math.isfinite(c.worst_regret) else "inf",
            "geomean_regret": None if not everywhere else c.geomean_regret if math.isfinite(c.geomean_regret) else "inf"}


def write_json(path: str | Path, cmp: Comparison) -> Path:
    """Everything in the comparison; infinite regrets are written as the string "inf". ``times``
    says what the times (microseconds) and regrets are: stored, never paired with one another;
    ``claims``: per device, its winner's speedup over Inductor's default from paired rounds, judged
    at ``min_speedup`` (:class:`zhantune.report.regret.Claim`); ``confirmed_speedup``: the ratios of
    the confirmed ones, what the export ships."""
    doc = {
        "times": STORED_TIMES,
        "min_speedup": cmp.min_speedup,
        "devices": [{"key": d, "name": cmp.device_names[d]} for d in cmp.devices],
        "left_out": cmp.left_out,  # device key -> problems measured on it alone (not compared)
        "torch": cmp.torch,  # the release whose rows were compared (and Kernel Tuner imports)
        "other_torch": cmp.other_torch,  # device key -> rows of other torch releases left out
        "matrix": [{"winner_of": a, "run_on": b, "geomean_regret": v if v is None or math.isfinite(v) else "inf"}
                   for (a, b), v in cmp.matrix.items()],
        "problems": [{
            "problem": p.problem_key, "flops": p.flops, "best_us": p.best_us, "default_us": p.default_us,
            "confirmed_speedup": p.confirmed_speedup,
            "claims": {d: _claim(c) for d, c in p.claims.items()},
            "winners": {d: _choice(c, p.best_us) for d, c in p.winner.items()},
            "portable": _choice(p.portable), "portable_geomean": _choice(p.portable_geomean),
            "disagreement": p.disagreement if p.disagreement is None or math.isfinite(p.disagreement) else "inf",
        } for p in cmp.problems],
    }
    return write_atomic(path, json.dumps(doc, indent=1, sort_keys=True), "json")
