"""Isolated benchmark workers: a candidate that kills its worker or hangs costs one trial, not the study."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from zhantune.bench.isolated import FAULTS_ENV

A100 = Path(__file__).resolve().parent / "data" / "kerneltuner" / "convolution_A100.json.gz"


def test_crashing_and_hanging_candidates_are_stored_and_the_study_goes_on(tmp_path):
    db = tmp_path / "iso.db"
    faults = [{"match": {"use_padding": 1}, "action": "abort"},
              {"match": {"use_padding": 0, "tile_size_x": 4}, "action": "sleep", "seconds": 600}]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **{FAULTS_ENV: json.dumps(faults)})
    r = subprocess.run(
        [sys.executable, "-m", "zhantune", "bench=replay", f"bench.path={A100}", "bench.isolate=true",
         "bench.compile_timeout_s=3", "bench.run_timeout_s=3", "search=random", "search.n_trials=24",
         f"storage.url=sqlite:///{db}", "progress=false", f"hydra.run.dir={tmp_path}/h"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trials: 24 measured" in r.stdout
    con = sqlite3.connect(db)
    rows = con.execute("select status, error_text, params, median_us from zt_measurement where kind='candidate'").fetchall()
    con.close()
    assert len(rows) == 24
    by_status: dict[str, list] = {}
    for status, text, params, median in rows:
        p = json.loads(params)
        by_status.setdefault(status, []).append((text, p, median))
        if p["use_padding"] == 1:
            assert status == "crashed" and "SIGABRT" in text, (status, text)
        elif p["tile_size_x"] == 4:
            assert status == "timeout" and "exceeded 3 s" in text, (status, text)
        else:  # every other row intact: the file's own answer
            assert status in ("ok", "runtime_error", "compile_error") and (median is not None) == (status == "ok")
    assert by_status.get("crashed") and by_status.get("timeout") and by_status.get("ok")
