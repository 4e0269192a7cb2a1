"""A self-contained HTML report (Plotly, with plotly.js inlined once): no network needed to open it.

Charts: the device x device regret heatmap; per problem and device, the speedup of the best config
over Inductor's default (where the default was measured); best time against problem size (FLOPs);
and, for a chosen Optuna study, its optimisation history and parameter importances.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import optuna
import plotly.graph_objects as go

from zhantune.report.compare import Comparison

__all__ = ["write_html_report", "CHART_IDS"]

#: element id of each chart (a test checks they render)
CHART_IDS = ("regret-heatmap", "speedup-over-default", "best-time-vs-size", "optuna-history", "optuna-importance")


def _regret_heatmap(cmp: Comparison) -> go.Figure:
    z = [[cmp.matrix[(a, b)] for b in cmp.devices] for a in cmp.devices]
    text = [["-" if v is None else ("fails" if math.isinf(v) else f"{v:.3f}x") for v in row] for row in z]
    zz = [[None if v is None or math.isinf(v) else v for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=zz, x=cmp.devices, y=cmp.devices, text=text, texttemplate="%{text}",
                               colorscale="Reds", zmin=1.0, colorbar={"title": "regret"}))
    fig.update_layout(title="Geometric-mean regret: winners of (row) run on (column)",
                      xaxis_title="run on", yaxis_title="winners of", yaxis_autorange="reversed", height=420)
    return fig


def _speedup(cmp: Comparison) -> go.Figure:
    fig = go.Figure()
    for d in cmp.devices:
        probs = [p for p in cmp.problems if d in p.default_us and d in p.best_us]
        if probs:
            fig.add_bar(name=d, x=[p.problem_key for p in probs], y=[p.default_us[d] / p.best_us[d] for p in probs])
    title = "Speedup of the best config over Inductor's default"
    if not fig.data:
        title += " (no Inductor default measured for these problems: imported or replayed data)"
    fig.update_layout(title=title, yaxis_title="speedup (x)", barmode="group", height=420)
    return fig


def _best_vs_size(cmp: Comparison) -> go.Figure:
    fig = go.Figure()
    for d in cmp.devices:
        probs = [p for p in cmp.problems if d in p.best_us]
        fig.add_scatter(name=d, mode="markers", x=[p.flops or None for p in probs],
                        y=[p.best_us[d] for p in probs], text=[p.problem_key for p in probs])
    fig.update_layout(title="Best time against problem size", xaxis_title="FLOPs per run", xaxis_type="log",
                      yaxis_title="best median time (us)", yaxis_type="log", height=420)
    return fig


def _optuna_figures(study: optuna.Study | None) -> list[go.Figure]:
    if study is None:
        note = go.Figure().update_layout(title="No Optuna study chosen (compare.study=NAME)", height=200)
        return [note, go.Figure().update_layout(title="No Optuna study chosen", height=200)]
    history = optuna.visualization.plot_optimization_history(study)
    history.update_layout(title=f"Optimisation history: {study.study_name}", height=420)
    try:
        importance = optuna.visualization.plot_param_importances(study)
        importance.update_layout(title=f"Parameter importances: {study.study_name}", height=420)
    except (RuntimeError, ValueError) as e:  # too few completed trials, or a single parameter
        importance = go.Figure().update_layout(title=f"Parameter importances unavailable: {e}", height=200)
    return [history, importance]


def write_html_report(path: str | Path, cmp: Comparison, study: optuna.Study | None = None) -> Path:
    """Write the report; plotly.js is embedded once so the file opens offline."""
    figures = [_regret_heatmap(cmp), _speedup(cmp), _best_vs_size(cmp), *_optuna_figures(study)]
    parts = []
    for i, (chart_id, fig) in enumerate(zip(CHART_IDS, figures, strict=True)):
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False, div_id=chart_id))
    rows = "".join(
        f"<tr><td>{html.escape(p.problem_key)}</td><td>{html.escape(', '.join(sorted(p.best_us)))}</td>"
        f"<td>{p.disagreement:.3f}x</td><td>{'-' if p.portable is None else f'{p.portable.worst_regret:.3f}x'}</td></tr>"
        for p in cmp.problems)
    devices = ", ".join(f"{html.escape(d)} ({html.escape(cmp.device_names[d])})" for d in cmp.devices)
    doc = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>zhantune compare</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head>
<body><h1>zhantune: configs across devices</h1><p>Devices: {devices}</p>
<table><tr><th>problem</th><th>devices</th><th>largest regret</th><th>portable choice, worst regret</th></tr>{rows}</table>
{''.join(parts)}
</body></html>"""
    out = Path(path)
    out.write_text(doc, encoding="utf-8")
    return out
