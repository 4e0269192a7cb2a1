"""Open a zhantune HTML report in headless Chromium, check its charts rendered, save a screenshot.

    python scripts/render_report.py report.html report.png

Prints each chart and whether Plotly drew it; exits 1 when one is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zhantune.report.browser import render_dom, rendered_charts, screenshot  # noqa: E402
from zhantune.report.html import CHART_IDS  # noqa: E402


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    html, png = sys.argv[1], sys.argv[2]
    drawn = rendered_charts(render_dom(html), CHART_IDS)
    for chart in CHART_IDS:
        print(f"{chart:24s} {'rendered' if chart in drawn else 'MISSING'}")
    print(f"screenshot: {screenshot(html, png)}")
    sys.exit(0 if drawn == set(CHART_IDS) else 1)


if __name__ == "__main__":
    main()
