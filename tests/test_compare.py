"""Compare across devices on real GPU data (two Kernel Tuner files imported as two devices)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics
from pathlib import Path

import pytest

from zhantune.bench.replay import load_kerneltuner
from zhantune.kerneltuner import import_kerneltuner
from zhantune.report.browser import render_dom, rendered_charts, screenshot
from zhantune.report.compare import CompareError, compare
from zhantune.report.html import CHART_IDS, write_html_report
from zhantune.storage import Store

DATA = Path(__file__).resolve().parent / "data" / "kerneltuner"
A100, A4000 = DATA / "convolution_A100.json.gz", DATA / "convolution_A4000.json.gz"
A100_KEY, A4000_KEY = "NVIDIA A100-PCIE-40GB", "NVIDIA RTX A4000"


def _times(path: Path, stat) -> dict[str, float]:
    """config key -> time (ms) of every configuration that ran, straight from the file."""
    with gzip.open(path, "rt") as f:
        cache = json.load(f)["cache"]
    return {k: stat(e) for k, e in cache.items() if not isinstance(e["time"], str)}


def _median(e):
    return statistics.median(e["times"])


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cmp') / 'cmp.db'}"
    store = Store(url)
    for path in (A100, A4000):
        import_kerneltuner(store, load_kerneltuner(path))
    return url


def test_regrets_and_portable_choice_match_an_independent_computation(db):
    a, b = _times(A100, _median), _times(A4000, _median)
    win_a, win_b = min(a, key=a.get), min(b, key=b.get)
    regret_a_on_b = b[win_a] / min(b.values())
    regret_b_on_a = a[win_b] / min(a.values())
    both = set(a) & set(b)
    worst = {k: max(a[k] / min(a.values()), b[k] / min(b.values())) for k in both}
    portable = min(worst, key=worst.get)

    cmp = compare(Store(db))
    (p,) = cmp.problems
    assert p.regret[(A100_KEY, A4000_KEY)] == pytest.approx(regret_a_on_b)
    assert p.regret[(A4000_KEY, A100_KEY)] == pytest.approx(regret_b_on_a)
    assert p.portable.worst_regret == pytest.approx(worst[portable])
    key_order = load_kerneltuner(A100).param_names
    assert ",".join(str(p.portable.params[n]) for n in key_order) == portable
    assert cmp.matrix[(A100_KEY, A4000_KEY)] == pytest.approx(regret_a_on_b)  # one problem: geomean = it
    # the issue's numbers: A4000's winner ~1.49x on the A100, the portable choice <= ~1.27x. The
    # A100 winner costs 1.59x on the A4000 by the median of its 32 runs, 1.66x by Kernel Tuner's mean
    # `time` (its runs on the A4000 are bimodal, 1.58 and 1.85 ms): zhantune compares medians.
    assert regret_b_on_a == pytest.approx(1.49, abs=0.01)
    assert p.portable.worst_regret <= 1.27
    assert regret_a_on_b == pytest.approx(1.59, abs=0.01)
    mean_a, mean_b = _times(A100, lambda e: e["time"]), _times(A4000, lambda e: e["time"])
    assert mean_b[min(mean_a, key=mean_a.get)] / min(mean_b.values()) == pytest.approx(1.66, abs=0.01)
    # the geometric-mean alternative is optimal for its own criterion
    geo = {k: math.sqrt(a[k] / min(a.values()) * b[k] / min(b.values())) for k in both}
    assert p.portable_geomean.geomean_regret == pytest.approx(min(geo.values()))


def test_import_is_idempotent(db):
    store = Store(db)
    name, added = import_kerneltuner(store, load_kerneltuner(A100))
    assert added == 0 and name.startswith("kerneltuner:convolution_A100.json.gz")


def test_bad_input_is_a_clear_error(tmp_path, db):
    empty = Store(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(CompareError, match="holds no devices"):
        compare(empty)
    one = Store(f"sqlite:///{tmp_path / 'one.db'}")
    import_kerneltuner(one, load_kerneltuner(A100))
    with pytest.raises(CompareError, match="at least two devices; found only 'NVIDIA A100-PCIE-40GB'"):
        compare(one)
    with pytest.raises(CompareError, match="unknown device 'H100' .from devices.; allowed: 'NVIDIA A100"):
        compare(Store(db), ["H100", A100_KEY])


def test_cli_writes_csv_json_and_an_html_report_that_renders_in_chromium(cli, tmp_path, db):
    r = cli([f"storage.url={db}", f"csv={tmp_path}/c.csv", f"json={tmp_path}/c.json", f"html={tmp_path}/c.html"],
            tmp_path, module="zhantune.compare")
    assert r.returncode == 0, r.stderr
    assert "1.587x" in r.stdout and "1.488x" in r.stdout and "portable (min worst regret): worst 1.247x" in r.stdout
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 4
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["problems"][0]["portable"]["worst_regret"] == pytest.approx(compare(Store(db)).problems[0].portable.worst_regret)
    dom = render_dom(tmp_path / "c.html")
    assert rendered_charts(dom, CHART_IDS) == set(CHART_IDS)
    png = screenshot(tmp_path / "c.html", tmp_path / "c.png")
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["devices=[H100,A100]"], "unknown device 'H100' (from devices)"),
    (["study=nope"], "study='nope': no such Optuna study"),
])
def test_cli_bad_input(cli, tmp_path, db, args, message):
    r = cli([f"storage.url={db}", *args], tmp_path, module="zhantune.compare")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_cli_no_database(cli, tmp_path):
    r = cli([f"storage.url=sqlite:///{tmp_path}/none.db"], tmp_path, module="zhantune.compare")
    assert r.returncode == 2 and "no database at" in r.stderr
    assert not (tmp_path / "none.db").exists()


def test_html_report_without_a_study_still_has_every_chart(tmp_path, db):
    out = write_html_report(tmp_path / "r.html", compare(Store(db)))
    drawn = rendered_charts(render_dom(out), CHART_IDS)
    assert drawn == set(CHART_IDS)


@pytest.mark.parametrize("files, message", [
    ("files=[]", "no files given"),
    ("files=[/nonexistent.json.gz]", "files=/nonexistent.json.gz: no such file"),
])
def test_import_cli_bad_input(cli, tmp_path, files, message):
    r = cli([files, f"storage.url=sqlite:///{tmp_path}/i.db"], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "i.db").exists()
