"""How long each app takes to refuse bad input (target: under 3 s on the project's 2-core machine).

    python scripts/bad_input_timing.py [--repeat 3]

Runs every case in a temporary directory (nothing is written there but Hydra's output folder),
``--repeat`` times, and prints per case the exit code, the fastest and the median wall time in
seconds, and the message. A benchmark, not a test: a busy machine makes every number larger.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

#: (app module, arguments): each must exit with code 2
CASES = [
    ("zhantune", ["shape=[4,4,4]"]),
    ("zhantune", ["+op=mm", "shape=[4,4]"]),
    ("zhantune", ["+op=mm", "shape=[4,4,4]", "dtype=int8"]),
    ("zhantune", ["+op=mm", "shape=[4,4,4]", "device=tpu"]),
    ("zhantune", ["+op=mm", "shape=[4,4,4]", "search.n_trials=0"]),
    ("zhantune", ["+op=mm", "shape=[4,4,4]", "bench.target_ms=-1"]),
    ("zhantune", ["+op=mm", "shape=[4,4,4]", "storage.url=mysql://u@localhost/db"]),
    ("zhantune", ["+op=nope", "shape=[4,4,4]"]),
    ("zhantune", ["problems=missing.yaml"]),
    ("zhantune", ["bench=replay"]),
    ("zhantune.space", ["shape=[4,4,4]"]),
    ("zhantune.export", ["storage.url=sqlite:///missing.db"]),
    ("zhantune.compare", ["storage.url=sqlite:///missing.db"]),
    ("zhantune.collect", ["input_shapes=[[64,256]]"]),
    ("zhantune.check", ["model=zhantune.models:mlp", "input_shapes=[[64,256]]"]),
    ("zhantune.replay", ["table=missing.json"]),
    ("zhantune.kerneltuner", ["files=[missing.json.gz]"]),
    ("zhantune.db", []),
]

TARGET_S = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="zhantune-bad-input-") as tmp:
        print(f"{'app and arguments':62s} {'rc':>3s} {'min s':>6s} {'median s':>8s}  message")
        for module, argv in CASES:
            times, rc, message = [], None, ""
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                # Hydra's output folder under tmp (not for zhantune.db without a command: no Hydra run)
                hydra = [f"hydra.run.dir={tmp}/hydra"] if argv or module != "zhantune.db" else []
                r = subprocess.run([sys.executable, "-m", module, *argv, *hydra], cwd=tmp, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                rc, message = r.returncode, (r.stderr.strip().splitlines() or [""])[0]
            worst = max(worst, statistics.median(times))
            what = f"{module} {' '.join(argv)}"
            print(f"{what[:62]:62s} {rc:>3d} {min(times):6.2f} {statistics.median(times):8.2f}  {message[:70]}")
    print(f"slowest median: {worst:.2f} s (target under {TARGET_S:.0f} s)")


if __name__ == "__main__":
    main()
