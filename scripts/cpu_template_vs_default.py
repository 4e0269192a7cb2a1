"""Inductor's C++ GEMM template against Inductor's real CPU default (issue 18), per shape and dtype.

    python scripts/cpu_template_vs_default.py                      # fp32 and bf16, the three shapes below
    python scripts/cpu_template_vs_default.py --dtypes bfloat16 --shapes 1,4096,4096 --rounds 11

Each case is an inference ``nn.Linear(K, N)`` on an [M, K] input, compiled two ways in this process:

- **default**: what a user's compile runs: ``torch._inductor.config.freezing = True`` under
  ``no_grad``, oneDNN on (Inductor prepacks the weight: ``mkl._mkl_linear`` in fp32,
  ``mkldnn._linear_pointwise`` in bf16);
- **template**: the same compile with a zhantune table whose one entry selects the C++ template for
  this GEMM (``max_autotune_gemm_backends: CPP``, Inductor's own blocking), served per GEMM by
  ``zhantune.use_table`` (the key is the one Inductor's lowering makes, recorded from the default).

Each side compiles its own copy of the module (Dynamo keeps compiled code per code object, so a
second compile of one module replaces what the first handle runs: until 2026-11-28 this script
timed the template against itself). The counters confirm what each compiled, and a profiled call of
each side what it runs (the prepacked op on the default side only). Timing: ``--rounds`` rounds,
each timing the two sides back to back (order alternating), ``--reps`` calls per side per round;
per side the median of each round, then the minimum over rounds (noise on a shared machine only adds
time), microseconds per call, to read; the ratio is the paired one, the median of the per-round
ratios with their range (zhantune.bench.decision.paired_ratio, as a tune's claim: until 2026-11-29
the ratio of the two sides' minimums, which may come from different rounds). A measurement, not a
claim: a tune settles one (docs/timing.md). Prints one row per case and the machine's CPU and ISA flags.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402

from zhantune.bench.decision import paired_ratio  # noqa: E402
from zhantune.inductor.choices import recording  # noqa: E402
from zhantune.inductor.runtime import use_table  # noqa: E402
from zhantune.quiet import quiet_known_warnings  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_summary() -> str:
    name, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "?":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16") if f in flags]
    return f"{name}; {', '.join(isa) or 'no AVX-512'}; torch threads {torch.get_num_threads()}"


def compile_linear(model: torch.nn.Module, x: torch.Tensor):
    """torch.compile with freezing (the caller installs a table or not); returns (compiled, counts).
    Give each compile its own module: the compiled code is kept per code object, guarded by the
    module, so two compiles of one module leave both handles running the last one's code."""
    packs = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    templated = counters["inductor"]["cpp_templated_kernel_counter"]
    with torch.no_grad(), inductor_config.patch(freezing=True, force_disable_caches=True):
        compiled = torch.compile(model)
        compiled(x)
    return compiled, (counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] - packs,
                      counters["inductor"]["cpp_templated_kernel_counter"] - templated)


def median_call_us(fn, x: torch.Tensor, reps: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def ops_run(fn, x: torch.Tensor) -> set[str]:
    """The names of the ops one call of ``fn`` runs (torch.profiler; its start and stop lines on
    stderr are dropped)."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    try:
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(x)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return {e.name for e in prof.events()}


PACKED_OPS = {"mkl::_mkl_linear", "mkldnn::_linear_pointwise"}


def run_case(dtype: str, m: int, n: int, k: int, rounds: int, reps: int) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(k, n).to(DTYPES[dtype]).eval()
    x = torch.randn(m, k, dtype=DTYPES[dtype])
    with recording() as rec:
        default, (packed, templated) = compile_linear(model, x)
    assert packed == 1 and templated == 0, (packed, templated)
    (key,) = [e.device_key for e in rec.events if e.offered]
    table = {key: [{"template_id": "zhantune::config", "config_patch": {"max_autotune_gemm_backends": "CPP"}}]}
    with use_table(table):
        template, (_, templated) = compile_linear(copy.deepcopy(model), x)
    assert templated == 1, templated
    ran = {side: ops_run(fn, x) & PACKED_OPS for side, fn in (("default", default), ("template", template))}
    assert ran["default"] and not ran["template"], f"each side must run its own kernel: {ran}"
    with torch.no_grad():
        ref = model(x).float()
        err = ((template(x).float() - ref).abs().max() / ref.abs().max()).item()
    sides = {"default": default, "template": template}
    per_round: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            per_round[side].append(median_call_us(sides[side], x, reps))
    best = {s: min(v) for s, v in per_round.items()}
    ratios = [t / d for t, d in zip(per_round["template"], per_round["default"], strict=True)]
    return {"dtype": dtype, "shape": f"{m}x{n}x{k}", **best, "ratio": paired_ratio(ratios), "low": min(ratios),
            "high": max(ratios), "err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="64,1024,1024;1,4096,4096;16,4096,4096", help="M,N,K;M,N,K;...")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    quiet_known_warnings()
    print(cpu_summary())
    print(f"{'dtype':9} {'M x N x K':>16} {'default us':>11} {'template us':>12} "
          f"{'template/default, paired (rounds)':>34}  max rel err")
    for dtype in args.dtypes.split(","):
        for shape in args.shapes.split(";"):
            m, n, k = (int(v) for v in re.split(r"[,x]", shape))
            row = run_case(dtype, m, n, k, args.rounds, args.reps)
            print(f"{row['dtype']:9} {row['shape']:>16} {row['default']:11,.1f} {row['template']:12,.1f} "
                  f"{row['ratio']:16.2f}x ({row['low']:.2f}-{row['high']:.2f}x)  {row['err']:.1e}", flush=True)


if __name__ == "__main__":
    main()
