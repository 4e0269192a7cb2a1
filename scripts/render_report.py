"""Open a zhantune HTML report in headless Chromium, check its charts drew data, save a screenshot.

    python scripts/render_report.py report.html report.png

Prints each chart the report says it holds (its ``zhantune-charts`` meta element, and any other
Plotly chart in the page) and whether Plotly drew data into it; exits 1 when a chart is missing
or empty (axes and a title without a trace).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zhantune.report.browser import chart_status, render_dom, screenshot  # noqa: E402
from zhantune.report.html import charts_in  # noqa: E402


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    html, png = sys.argv[1], sys.argv[2]
    try:
        declared = charts_in(Path(html).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        print(f"render_report: {html}: cannot read the report: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        sys.exit(2)
    dom = render_dom(html)
    status = chart_status(dom, declared)
    status.update({c: s for c, s in chart_status(dom).items() if c not in status})
    for chart, state in status.items():
        print(f"{chart:24s} {state}")
    if not status:
        print("no chart in the report")
    try:
        print(f"screenshot: {screenshot(html, png)}")
    except RuntimeError as e:  # Chromium wrote no file (a path it cannot write)
        print(f"render_report: {e}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if status and all(s == "drawn" for s in status.values()) else 1)


if __name__ == "__main__":
    main()
