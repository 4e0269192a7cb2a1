"""Is this machine at rest? A fixed pure-Python chunk timed over and over on each core, alone.

On a machine at rest every chunk takes about the same time. On a shared virtual machine whose
physical cores another tenant also uses, the chunk switches between its fast time and a slower one
within fractions of a millisecond, which no kernel timing can average away (docs/timing.md,
"Measured stability"). Prints, per core: the fastest chunk (us), the share of chunks over
``--slow`` times the fastest chunk seen on any core, and the median length of fast and slow runs of
chunks (ms); then the CPU steal time over the probe and whether the kernel exposes a hardware
performance-counter unit (without one, cycle counts cannot replace wall time).

    python scripts/core_noise.py                   # 1 s per core
    python scripts/core_noise.py --seconds 5 --repeat 3 --pause 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path


def _chunk() -> None:
    x = 0
    for i in range(2000):
        x += i


def _steal_ticks() -> int | None:
    """Total steal time of all CPUs in USER_HZ ticks (/proc/stat's 8th field), None where unreadable."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return None


def probe(seconds: float) -> dict[int, list[int]]:
    """Chunk times (ns) per core, each core probed alone (pinned) for ``seconds``."""
    cores = sorted(os.sched_getaffinity(0))
    out: dict[int, list[int]] = {}
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            times, end = [], time.perf_counter() + seconds
            while time.perf_counter() < end:
                start = time.perf_counter_ns()
                _chunk()
                times.append(time.perf_counter_ns() - start)
            out[core] = times
    finally:
        os.sched_setaffinity(0, set(cores))
    return out


def _runs_ms(times: list[int], slow: list[bool]) -> tuple[float | None, float | None]:
    """Median length (ms) of the runs of consecutive fast chunks and of slow chunks."""
    lengths: dict[bool, list[float]] = {False: [], True: []}
    current, total = slow[0], 0
    for t, s in zip(times, slow, strict=True):
        if s != current:
            lengths[current].append(total / 1e6)
            current, total = s, 0
        total += t
    lengths[current].append(total / 1e6)
    return tuple(statistics.median(v) if v else None for v in (lengths[False], lengths[True]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="probe length per core")
    ap.add_argument("--slow", type=float, default=1.25, help="a chunk over this many times the fastest is slow")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between repeats")
    args = ap.parse_args()
    pmu = Path("/sys/bus/event_source/devices/cpu").exists()
    print(f"hardware performance counters (a 'cpu' PMU in /sys/bus/event_source/devices): {'yes' if pmu else 'no'}")
    for i in range(args.repeat):
        if i:
            time.sleep(args.pause)
        steal0, load = _steal_ticks(), os.getloadavg()[0]
        times = probe(args.seconds)
        steal1 = _steal_ticks()
        fastest = min(min(v) for v in times.values())
        parts = []
        for core, ts in times.items():
            slow = [t > args.slow * fastest for t in ts]
            fast_ms, slow_ms = _runs_ms(ts, slow)
            parts.append(f"core {core}: fastest {min(ts) / 1e3:.1f} us, slow share {sum(slow) / len(ts):5.1%}, "
                         f"runs fast {fast_ms or 0:.2f} ms / slow {slow_ms or 0:.2f} ms")
        steal = "?" if steal0 is None or steal1 is None else steal1 - steal0
        print(f"{time.strftime('%H:%M:%S')} load {load:.2f} steal {steal} ticks | " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
