"""Where zhantune.bench.decision.CONFIRM_C comes from, and what the claim rule costs in power.

    python scripts/claim_calibration.py                 # 2,000,000 simulated settles per cell (~2 min)
    python scripts/claim_calibration.py --settles 200000

A speedup claim over Inductor's default is confirmed when the winner was faster in every paired
round and ``log(smallest ratio) > c_n * log(largest / smallest ratio)``
(zhantune.bench.decision.beyond_spread). For two kernels of equal speed the statistic
``log(smallest) / log(largest / smallest)`` does not depend on the noise's size, only on its shape
and on n, so c_n is the quantile that leaves 0.5% of equal-kernel settles above it. This script
simulates settles of n rounds, each side's measurement multiplied by (1 + e), e drawn from three
shapes at a 1% scale (Gaussian, exponential: one-sided like preemption, Student-t with 3 degrees
of freedom: heavy-tailed), and prints per n:

1. c_n for a 0.5% false-claim rate under each shape (CONFIRM_C takes the largest, Gaussian's), and
   the false-claim rate of the values in CONFIRM_C;
2. power: how often a true speedup of 1.02-1.5x is confirmed with the CONFIRM_C value, with clean
   noise and with 5% of measurements hit by a one-sided +25% outlier.

For n = 2 and Gaussian noise there is a closed form (the difference and the sum of two normal
log-ratios are independent): P = atan(1 / (2c + 1)) / pi, 0.496% at c = 31.6.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from zhantune.bench.decision import CONFIRM_C, beyond_spread  # noqa: E402

TARGET = 0.005
SHAPES = ("gauss", "exp", "t3")


def _noise(rng: np.random.Generator, shape: str, size: tuple[int, ...], scale: float = 0.01) -> np.ndarray:
    if shape == "gauss":
        return rng.normal(size=size) * scale
    if shape == "exp":
        return rng.exponential(size=size) * scale
    return np.clip(rng.standard_t(3, size=size) * scale, -0.5, None)  # t(3): heavy tails, never a negative time


def _log_ratios(rng, shape: str, n: int, settles: int, speedup: float = 1.0, outliers: float = 0.0) -> np.ndarray:
    sides = 1 + _noise(rng, shape, (settles, 2, n))
    if outliers:
        sides *= np.where(rng.random((settles, 2, n)) < outliers, 1.25, 1.0)
    return np.log(speedup * sides[:, 0]) - np.log(sides[:, 1])


def confirmed(log_r: np.ndarray, c: float) -> np.ndarray:
    """The rule on rows of per-round log-ratios: every round faster, and the margin beyond c times
    the spread; zhantune.bench.decision.beyond_spread vectorized (checked against it on the first
    rows of every cell, so the two cannot drift apart)."""
    low, high = log_r.min(axis=1), log_r.max(axis=1)
    got = (low > 0) & (low > c * (high - low))
    n = log_r.shape[1]
    if c == CONFIRM_C.get(n, 0.0):
        for row in range(min(1000, len(log_r))):
            assert bool(got[row]) == beyond_spread(float(np.exp(low[row])), float(np.exp(high[row])), n), row
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settles", type=int, default=2_000_000)
    ap.add_argument("--rounds", default="2,3,4,5,6,7,8")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{args.settles:,} simulated settles per cell; target false-claim rate {TARGET:.1%}")
    for n in (int(x) for x in args.rounds.split(",")):
        c_used = CONFIRM_C.get(n, 0.0)
        cells = []
        for shape in SHAPES:
            log_r = _log_ratios(rng, shape, n, args.settles)
            low, high = log_r.min(axis=1), log_r.max(axis=1)
            stat = np.where(low > 0, low / np.maximum(high - low, 1e-300), -1.0)
            c = max(float(np.quantile(stat, 1 - TARGET)), 0.0)
            cells.append(f"{shape} c={c:.3f} (rate at CONFIRM_C {confirmed(log_r, c_used).mean():.3%})")
        print(f"n={n} CONFIRM_C={c_used}: " + "; ".join(cells))
        power = []
        for outliers in (0.0, 0.05):
            got = [confirmed(_log_ratios(rng, "gauss", n, args.settles // 10, s, outliers), c_used).mean()
                   for s in (1.02, 1.05, 1.1, 1.2, 1.5)]
            power.append(("clean" if not outliers else "5% +25% outliers") + " "
                         + " ".join(f"{s}x:{p:.0%}" for s, p in zip((1.02, 1.05, 1.1, 1.2, 1.5), got, strict=True)))
        print("    power (Gaussian 1%): " + "; ".join(power))
    return 0


if __name__ == "__main__":
    sys.exit(main())
