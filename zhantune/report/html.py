"""A self-contained HTML report (Plotly, with plotly.js inlined once): no network needed to open it.

Per problem, the configurations: each device's best config and the portable choice, every
parameter in full. Charts, each only where it has data: the device x device regret heatmap (two
devices or more); per problem and device, the speedup of the best config over Inductor's default
(where the default was measured: a claim confirmed in paired rounds; else hatched: paired rounds'
ratio without a claim, or the unpaired ratio, unconfirmed);
best time against problem size (FLOPs); and, for a chosen study, its optimisation history and
parameter importances. The charts the report holds are listed in ``<meta name="zhantune-charts">``
(scripts/render_report.py checks that each drew data).
"""

from __future__ import annotations

import html
import math
import warnings
from pathlib import Path

import optuna
import plotly.graph_objects as go

from zhantune.paths import write_atomic
from zhantune.report.outputs import STORED_TIMES, left_out_text, other_torch_text
from zhantune.report.regret import Choice, Comparison

__all__ = ["write_html_report", "CHART_IDS", "charts_in"]

#: element id of each chart a report can hold, in the report's order
CHART_IDS = ("regret-heatmap", "speedup-over-default", "best-time-vs-size", "optuna-history", "optuna-importance")


def _regret_heatmap(cmp: Comparison) -> go.Figure | None:
    if len(cmp.devices) < 2:
        return None  # one device: no cross-device regret
    z = [[cmp.matrix[(a, b)] for b in cmp.devices] for a in cmp.devices]
    text = [["-" if v is None else ("fails" if math.isinf(v) else f"{v:.3f}x") for v in row] for row in z]
    zz = [[None if v is None or math.isinf(v) else v for v in row] for row in z]
    # the darkest red at 1.5x or the largest regret: a scale from 1.0 to the largest alone drew 1.00025x
    # darkest and an all-1.000x matrix orange (a helper's, session 48)
    top = max([1.5, *(v for row in zz for v in row if v is not None)])
    fig = go.Figure(go.Heatmap(z=zz, x=cmp.devices, y=cmp.devices, text=text, texttemplate="%{text}",
                               colorscale="Reds", zmin=1.0, zmax=top, colorbar={"title": "regret"}))
    fig.update_layout(title="Geometric-mean regret: winners of (row) run on (column)",
                      xaxis_title="run on", yaxis_title="winners of", yaxis_autorange="reversed", height=420)
    return fig


def _speedup(cmp: Comparison) -> go.Figure | None:
    """Per problem and device: the speedup over Inductor's default confirmed in paired rounds (solid
    bars: the verdict's ratio, a claim the export ships); else, where paired rounds judged it
    without a claim (not confirmed, below ``min_speedup``, another torch's), their ratio, hatched
    "x", with the reason on hover; else the unpaired ratio of the fastest runs, hatched "/" and named
    "unconfirmed" (noise could have made it). No bar where the winner is the very kernel Inductor's
    default compile runs (zhantune.inductor.templates.is_default_kernel): its ratio is noise, never a
    speedup, as the tune's summary says ("same kernel"). None where no default was measured."""
    from zhantune.inductor.templates import is_default_kernel

    fig = go.Figure()
    for d in cmp.devices:
        confirmed, paired, unpaired = [], [], []
        for p in (p for p in cmp.problems if d in p.default_us and d in p.best_us):
            claim = p.claims.get(d)
            winner = p.winner.get(d)
            if winner is not None and is_default_kernel(winner.template_id, winner.params):
                continue
            (confirmed if d in p.confirmed_speedup else paired if claim is not None and claim.ratio is not None
             else unpaired).append(p)
        if confirmed:
            fig.add_bar(name=f"{d}: confirmed in paired rounds", x=[p.problem_key for p in confirmed],
                        y=[p.confirmed_speedup[d] for p in confirmed])
        if paired:
            fig.add_bar(name=f"{d}: paired rounds, no claim", x=[p.problem_key for p in paired],
                        y=[p.claims[d].ratio for p in paired], hovertext=[p.claims[d].reason for p in paired],
                        marker_pattern_shape="x")
        if unpaired:
            fig.add_bar(name=f"{d}: unconfirmed (unpaired fastest runs)", x=[p.problem_key for p in unpaired],
                        y=[p.default_us[d] / p.best_us[d] for p in unpaired], marker_pattern_shape="/")
    if not fig.data:
        return None  # no Inductor default measured (imported or replayed data)
    fig.update_layout(title="Speedup of the best config over Inductor's default (hatched: unconfirmed)",
                      yaxis_title="speedup (x)", barmode="group", height=420)
    return fig


def _best_vs_size(cmp: Comparison) -> go.Figure | None:
    fig = go.Figure()
    for d in cmp.devices:
        probs = [p for p in cmp.problems if d in p.best_us]
        if probs:
            fig.add_scatter(name=d, mode="markers", x=[p.flops or None for p in probs],
                            y=[p.best_us[d] for p in probs], text=[p.problem_key for p in probs])
    if not fig.data:
        return None
    fig.update_layout(title="Best time against problem size", xaxis_title="FLOPs per run", xaxis_type="log",
                      yaxis_title="best time (us)", yaxis_type="log", height=420)
    return fig


def _optuna_figures(study: optuna.Study | None) -> tuple[go.Figure | None, go.Figure | None, str | None]:
    """(history, importances, why importances are missing)."""
    if study is None:
        return None, None, None
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        return None, None, f"study {study.study_name}: no completed trial"
    history = optuna.visualization.plot_optimization_history(study)
    history.update_layout(title=f"Optimisation history: {study.study_name}", yaxis_title="time (us)", height=420)
    try:
        with warnings.catch_warnings():  # Optuna's PED-ANOVA warns per parameter value of few trials
            warnings.simplefilter("ignore", UserWarning)  # (a raw traceback-style line in compare's output)
            importance = optuna.visualization.plot_param_importances(study)
        importance.update_layout(title=f"Parameter importances: {study.study_name}", height=420)
    except (RuntimeError, ValueError) as e:  # too few completed trials, or a single parameter
        return history, None, f"parameter importances of {study.study_name} unavailable: {e}"
    if not importance.data:
        return history, None, f"parameter importances of {study.study_name}: no parameter varies"
    return history, importance, None


def _disagreement(v: float | None) -> str:
    if v is None:
        return "none measured (no device's winner was measured on another device)"
    return "fails elsewhere" if math.isinf(v) else f"{v:.3f}x"


def _params(c: Choice | None) -> str:
    if c is None:
        return "-"
    return " ".join(f"{k}={v}" for k, v in sorted(c.params.items()))


def _configs_table(cmp: Comparison) -> str:
    """Per problem: each device's best config (time, worst regret elsewhere) and the portable choices."""
    e = html.escape
    parts = []
    for p in cmp.problems:
        rows = []
        for d in cmp.devices:
            if d not in p.best_us:
                continue
            w = p.winner[d]
            elsewhere = [r for other, r in w.regret.items() if other != d]
            worst = "-" if not elsewhere else ("fails" if math.isinf(max(elsewhere)) else f"{max(elsewhere):.3f}x")
            rows.append(f"<tr><td>best on {e(d)}</td><td>{p.best_us[d]:,.1f}</td><td>{worst}</td>"
                        f"<td>{e(w.template_id or '-')}</td><td class=\"config\">{e(_params(w))}</td></tr>")
        for label, c in (("portable (min worst regret)", p.portable), ("portable (min geomean regret)",
                                                                       p.portable_geomean)):
            if len(cmp.devices) < 2:
                break  # one device: its best is the portable choice
            if c is None:
                rows.append(f"<tr><td>{label}</td><td colspan=\"4\">no config was measured correct on every "
                            "device</td></tr>")
                continue
            worst = "fails" if math.isinf(c.worst_regret) else f"{c.worst_regret:.3f}x"
            rows.append(f"<tr><td>{label}</td><td>-</td><td>{worst}</td><td>{e(c.template_id or '-')}</td>"
                        f"<td class=\"config\">{e(_params(c))}</td></tr>")
        parts.append(f"<h3>{e(p.problem_key)}</h3><p>largest regret between devices: {_disagreement(p.disagreement)}</p>"
                     "<table><tr><th>config</th><th>best us</th><th>worst regret elsewhere</th>"
                     f"<th>template_id</th><th>parameters</th></tr>{''.join(rows)}</table>")
    other = f"<p>Left out: {e(other_torch_text(cmp))}.</p>" if cmp.other_torch else ""
    if cmp.left_out:  # as the console says it (a helper's, session 48: the report did not)
        other += f"<p>Left out: {e(left_out_text(cmp))}.</p>"
    return f"<p>{e(STORED_TIMES)}.</p>" + other + "".join(parts)


def write_html_report(path: str | Path, cmp: Comparison, study: optuna.Study | None = None,
                      studies: list[str] | None = None) -> Path:
    """Write the report; plotly.js is embedded once so the file opens offline. ``studies``: the
    study names the database holds (listed when no study was chosen)."""
    history, importance, note = _optuna_figures(study)
    figures = dict(zip(CHART_IDS, (_regret_heatmap(cmp), _speedup(cmp), _best_vs_size(cmp), history, importance),
                       strict=True))
    charts = [(cid, fig) for cid, fig in figures.items() if fig is not None]
    parts = [fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False, div_id=cid)
             for i, (cid, fig) in enumerate(charts)]
    e = html.escape
    notes = []
    if figures["speedup-over-default"] is None:
        notes.append("No speedup chart: no Inductor default was measured for these problems (imported or "
                     "replayed data).")
    if study is None:
        notes.append("No optimisation history: choose a study with study=NAME"
                     + (f" (this database: {', '.join(e(s) for s in studies)})." if studies else "."))
    if note:
        notes.append(e(note) + ".")
    devices = ", ".join(f"{e(d)} ({e(cmp.device_names[d])})" for d in cmp.devices)
    doc = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>zhantune compare</title>
<meta name="zhantune-charts" content="{' '.join(cid for cid, _ in charts)}">
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin-bottom:1em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}} td.config{{font-family:monospace}}</style></head>
<body><h1>zhantune: configs across devices</h1><p>Devices: {devices}</p>
<h2>Configurations</h2>{_configs_table(cmp)}
{''.join(f'<p class="note">{n}</p>' for n in notes)}
{''.join(parts)}
</body></html>"""
    return write_atomic(path, doc, "html")


def charts_in(html_text: str) -> list[str]:
    """The chart ids a report says it holds (its ``zhantune-charts`` meta element)."""
    import re

    m = re.search(r'<meta name="zhantune-charts" content="([^"]*)">', html_text)
    return m.group(1).split() if m else []
