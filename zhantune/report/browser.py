"""Open an HTML report in headless Chromium: the rendered DOM (to check charts) and a screenshot.

Chromium is Debian's ``chromium`` package (``/usr/bin/chromium``); it is started with a fresh
profile and without background networking, so it never reaches out of this machine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["chromium_path", "render_dom", "screenshot", "rendered_charts", "chart_status"]

_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--virtual-time-budget=15000"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("headless Chromium not found; install Debian's chromium package")
    with tempfile.TemporaryDirectory(prefix="zhantune-chromium-") as profile:
        return subprocess.run([exe, *_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout_s, check=True)


def render_dom(html_path: str | Path, timeout_s: float = 120) -> str:
    """The DOM after the page's scripts ran (Plotly draws its charts into it)."""
    return _run(["--dump-dom", Path(html_path).resolve().as_uri()], timeout_s).stdout


def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1400, height: int = 3000,
               timeout_s: float = 120) -> Path:
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)  # Chromium writes nothing into a missing one, and says nothing
    before = out.stat().st_mtime_ns if out.exists() else None
    _run([f"--screenshot={out}", f"--window-size={width},{height}", Path(html_path).resolve().as_uri()], timeout_s)
    if not out.is_file() or out.stat().st_mtime_ns == before:
        raise RuntimeError(f"Chromium wrote no screenshot to {out}")
    return out


#: class names of the SVG groups Plotly draws a chart's data into (a scatter, a bar trace, a heatmap)
_DATA_CLASSES = {"trace", "hm"}


class _ChartFinder(HTMLParser):
    def __init__(self, ids: tuple[str, ...] | None):
        super().__init__()
        self.ids = set(ids) if ids is not None else None
        self.seen: set[str] = set()
        self.rendered: set[str] = set()
        self.with_data: set[str] = set()
        self._open: list[str | None] = []  # chart id of each open div, innermost last
        self._inside: str | None = None

    def _is_chart(self, a: dict) -> bool:
        if self.ids is not None:
            return a.get("id") in self.ids
        return "plotly-graph-div" in (a.get("class") or "").split() and bool(a.get("id"))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            cid = a.get("id") if self._is_chart(a) else None
            if cid is not None:
                self._inside = cid
                self.seen.add(cid)
            self._open.append(cid)
        if self._inside is None:
            return
        classes = set((a.get("class") or "").split())
        if tag == "svg" and "main-svg" in classes:
            self.rendered.add(self._inside)
        if tag == "g" and classes & _DATA_CLASSES:
            self.with_data.add(self._inside)

    def handle_endtag(self, tag):
        if tag == "div" and self._open:
            if self._open.pop() is not None:
                self._inside = next((c for c in reversed(self._open) if c), None)


def rendered_charts(dom: str, ids: tuple[str, ...]) -> set[str]:
    """The chart ids whose div holds a drawn Plotly SVG in ``dom``."""
    finder = _ChartFinder(ids)
    finder.feed(dom)
    return finder.rendered


def chart_status(dom: str, ids: tuple[str, ...] | list[str] | None = None) -> dict[str, str]:
    """Per chart: ``drawn`` (a Plotly SVG with at least one trace or heatmap in it), ``empty`` (an
    SVG without data: axes and a title only) or ``missing`` (no SVG). ``ids``: the charts expected
    (None: every Plotly chart div in ``dom``)."""
    finder = _ChartFinder(tuple(ids) if ids is not None else None)
    finder.feed(dom)
    names = list(ids) if ids is not None else sorted(finder.seen)
    return {c: "drawn" if c in finder.with_data and c in finder.rendered else "empty" if c in finder.rendered
            else "missing" for c in names}
