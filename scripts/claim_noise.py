"""How often does noise alone make a speedup claim? Two copies of one kernel, settled as a tune
settles a winner against Inductor's default, many times.

    python scripts/claim_noise.py                                  # CPU, torch.mm 64^3 float32, 60 settles
    python scripts/claim_noise.py --device cuda --shape 4096,4096,4096 --dtype bfloat16
    python scripts/claim_noise.py --winner-k 0.97                  # the winner does 3% less work

Each settle is the protocol of zhantune.bench.settle.settle_speedup: each side measured once (not
judged), then ``--rounds`` paired rounds, their order
alternating (default first, then the winner first, ...), each side's decision statistic (the
minimum of its individually timed runs) per round, judged by
zhantune.bench.decision.judge_speedup. The "default" and the "winner" are eager ``torch.mm`` calls
on the same inputs (an A/A test: every claim is a false one), or, with ``--winner-k F``, the winner
multiplies only the first F of K, rounded to a multiple of 16 (a kernel really faster by about 1/F,
for the rule's power). Timing as a tune times: zhantune.bench.timing.time_cpu with the bench
defaults (no cache flush, SCHED_FIFO where permitted) or time_cuda (Triton's do_bench_cudagraph).
Unlike a tune it does not wait for an idle machine, flag contention, time in a worker process, or
compile between the first pair's two sides.

Prints one line per settle and then how many settles claimed a speedup: by the rule in use, and by
the sign test alone (faster in every round, the rule before 2026-11-27). No torch>=2.13 needed: it
runs no Inductor compile. docs/timing.md has the numbers it gave on this machine and on an H200.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zhantune.bench.decision import Round, judge_speedup  # noqa: E402
from zhantune.bench.timing import time_cpu, time_cuda  # noqa: E402


def _settle(time_one, default, winner, rounds: int) -> tuple[Round, list[Round]]:
    first = Round(time_one(default), time_one(winner))  # not judged (printed)
    paired = []
    for i in range(rounds):
        order = ("default", "winner") if i % 2 == 0 else ("winner", "default")
        got = {side: time_one(default if side == "default" else winner) for side in order}
        paired.append(Round(got["default"], got["winner"]))
    return first, paired


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--shape", default="64,64,64", help="M,N,K")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--settles", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds per settle (bench.remeasure_rounds)")
    ap.add_argument("--winner-k", type=float, default=1.0, help="the winner's share of K (1.0: the same kernel)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--target-ms", type=float, default=100.0,
                    help="timed time per measurement, as bench.target_ms (100); less is faster and noisier")
    args = ap.parse_args(argv)
    if not 0.0 < args.winner_k <= 1.0:
        ap.error(f"--winner-k {args.winner_k}: the winner's share of K must be in (0, 1]")

    import torch

    m, n, k = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    a = torch.randn(m, k, device=args.device, dtype=dtype)
    b = torch.randn(k, n, device=args.device, dtype=dtype)
    # K a multiple of 16 where K allows: on an H200 cuBLAS took 5x longer for K=3973 than for 4096
    kw = k if args.winner_k == 1.0 else max(1, round(k * args.winner_k / 16) * 16 if k >= 32
                                            else round(k * args.winner_k))
    if args.winner_k < 1.0 and kw >= k:
        ap.error(f"--winner-k {args.winner_k} with K={k}: the winner's K rounds to {kw} (a multiple of 16), "
                 "the same work; take a smaller share or a larger K")
    # the same tensors for an A/A test: copies sit at other addresses, which alone moved mm 64^3 on
    # this machine's CPU by 4% in every round
    aw, bw = (a, b) if kw == k else (a[:, :kw].contiguous(), b[:kw].contiguous())

    def default() -> object:
        return torch.mm(a, b)

    def winner() -> object:
        return torch.mm(aw, bw)

    if args.device.startswith("cuda"):
        def time_one(fn):
            return time_cuda(fn, target_ms=args.target_ms).min_us
        what = f"{torch.cuda.get_device_name(a.device)}, time_cuda"
    else:
        def time_one(fn):
            return time_cpu(fn, target_ms=args.target_ms, flush_cache=False).min_us
        what = f"CPU, {torch.get_num_threads()} threads, time_cpu"
    print(f"torch {torch.__version__}; {what}; mm {m}x{n}x{k} {args.dtype}, winner K={kw}; "
          f"{args.settles} settles of {args.rounds} paired rounds, {args.target_ms:g} ms per measurement", flush=True)
    claims = sign_only = 0
    for s in range(args.settles):
        first, paired = _settle(time_one, default, winner, args.rounds)
        v = judge_speedup(paired)
        per_round = [r.default_us / r.winner_us for r in paired]
        claims += v.confirmed
        sign_only += min(per_round) > 1.0
        print(f"{s:3d} {'CLAIM' if v.confirmed else '-    '} {v.claim_text():34s} default_us/winner_us "
              + f"first {first.default_us:.2f}/{first.winner_us:.2f}, rounds "
              + " ".join(f"{r.default_us:.2f}/{r.winner_us:.2f}" for r in paired) + f"  {v.reason}", flush=True)
    print(f"claimed: {claims} of {args.settles} settles with the rule in use (zhantune.bench.decision); "
          f"{sign_only} with the sign test alone (faster in every round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
