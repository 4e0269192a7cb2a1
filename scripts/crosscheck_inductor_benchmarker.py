"""Cross-check zhantune's ATen-vs-C++-template ranking against Inductor's own autotuning benchmark.

    .venv/bin/python scripts/crosscheck_inductor_benchmarker.py [--tokens 64] [--rounds 5] [--repeats 3]

For the three GEMMs of a small MLP (Linear 256->512, 512->1024, 1024->256 on ``tokens`` rows, fp32,
inference with freezing, as zhantune's CPU default):

- **Inductor**: the MLP compiled with max-autotune and ``max_autotune_gemm_backends="ATEN,CPP"``;
  Inductor's AlgorithmSelectorCache times every choice of each GEMM with
  ``torch._inductor.runtime.benchmarking.benchmarker.benchmark_cpu`` (median of back-to-back runs of
  the kernel alone, milliseconds) and reports them through its feedback-saver hook. Compiled
  ``--repeats`` times (a fresh autotune each), so its own spread shows.
- **zhantune**: each GEMM as a problem (zhantune.collect finds them with Inductor's keys), the
  ``aten`` config and the C++ template with Inductor's own blocking measured in ``--rounds`` paired
  interleaved rounds through zhantune's protocol (the whole compiled call, fastest run).

Prints one row per GEMM: each side's ATen / C++ ratio and which it ranks first, and whether they agree.
Numbers go to docs/timing.md; this is a benchmark, not a test (no timing is asserted).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn


class ThreeLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(256, 512), nn.Linear(512, 1024), nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


#: K -> N of the three layers
LAYERS = {256: 512, 512: 1024, 1024: 256}


def _kind(choice_name: str) -> str:
    return "cpp" if "cpp" in choice_name.lower() else "aten"


def inductor_ratios(model: nn.Module, x: torch.Tensor, repeats: int) -> dict[tuple[int, int], list[float]]:
    """(K, N) of each GEMM -> ATen time / C++ template time, one per repeat (Inductor's benchmarker)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.select_algorithm import add_feedback_saver, clear_feedback_savers

    seen: dict[tuple[int, int], list[float]] = {}

    def saver(timings, name, input_nodes, choices, profiled, precompile) -> None:
        best: dict[str, float] = {}
        for choice, ms in timings.items():
            k = _kind(choice.name)
            best[k] = min(best.get(k, float("inf")), ms)
        # the activation [M, K] names the GEMM (K differs between the three layers; the weight may
        # be a prepacked blob whose size says nothing)
        m_k = next(tuple(int(s) for s in n.get_size()) for n in input_nodes if int(n.get_size()[0]) == x.shape[0])
        key = (m_k[1], LAYERS[m_k[1]])
        if "aten" in best and "cpp" in best:
            seen.setdefault(key, []).append(best["aten"] / best["cpp"])

    add_feedback_saver(saver)
    try:
        for _ in range(repeats):
            torch._dynamo.reset()
            patch = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP",
                     "force_disable_caches": True}
            with torch.no_grad(), inductor_config.patch(patch):
                torch.compile(model)(x)
    finally:
        clear_feedback_savers()
    return seen


def zhantune_ratios(model: nn.Module, x: torch.Tensor, rounds: int) -> dict[tuple[int, int], float]:
    """(K, N) of each GEMM -> ATen / C++ template over paired rounds: the median of the per-round
    ratios of the two sides' fastest runs (zhantune.bench.decision.paired_ratio, as a tune's claim;
    until 2026-11-29 the ratio of each side's fastest over all rounds, which may come from different
    rounds). A ranking to compare with Inductor's, not a claim."""
    from omegaconf import OmegaConf

    from zhantune.bench.decision import paired_ratio
    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.candidate import Candidate
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device
    from zhantune.inductor.gemms import collect

    device = resolve_device("cpu")
    bench_cfg = OmegaConf.structured(BenchConfig)
    out = {}
    for p in collect(model, (x,), device):
        if p.problem is None:
            continue
        dims = p.problem.dims
        b = InductorBenchmarker(p.problem, device, bench_cfg)
        b.inductor_default()
        aten = Candidate("aten", "config", "zhantune::config", {"max_autotune_gemm_backends": "ATEN"})
        cpp = Candidate("cpp_gemm", "config", "zhantune::config", {"max_autotune_gemm_backends": "CPP"})
        a, c = [], []
        for _ in range(rounds):
            a.append(b.measure(aten).timing.min_us)
            c.append(b.measure(cpp).timing.min_us)
        out[(dims["K"], dims["N"])] = paired_ratio(x / y for x, y in zip(a, c, strict=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = ThreeLayer().eval()
    x = torch.randn(args.tokens, 256)
    ind = inductor_ratios(model, x, args.repeats)
    zt = zhantune_ratios(model, x, args.rounds)
    print(f"{'GEMM (M,K,N)':>18} | {'Inductor ATen/C++ (repeats)':>30} | {'zhantune ATen/C++':>18} | agree")
    for key in sorted(set(ind) | set(zt)):
        i = ind.get(key, [])
        z = zt.get(key)
        i_med = statistics.median(i) if i else None
        agree = "-" if i_med is None or z is None else ("yes" if (i_med > 1) == (z > 1) else "NO")
        i_txt = " ".join(f"{r:.2f}" for r in i) or "-"
        print(f"{str((args.tokens, *key)):>18} | {i_txt:>30} | {'-' if z is None else f'{z:.2f}':>18} | {agree}")
    print("ratio > 1: the C++ template is faster; < 1: ATen is faster")


if __name__ == "__main__":
    main()
