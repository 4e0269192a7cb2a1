"""Does zhantune see another process on the GPU? The CUDA half of its busy-machine rules, on a real GPU.

    python scripts/gpu_contention.py [--device cuda:0] [--shape 4096,4096,4096] [--dtype bfloat16]

A tune's CUDA row is *contended* when other compute processes use the GPU (NVML, through
nvidia-ml-py: zhantune.bench.conditions), its own processes (the tune, its timing worker and its
compile workers, each holding a CUDA context) left out; before each timed measurement it backs off
while the GPU is busy (``wait_until_idle``). docs/timing.md said this had never run on a GPU, and
that inside a container's PID namespace NVML reports pids that are not ours (then the count is
unknown and counts as not contended). This script checks each part on the GPU it is given:

1. idle, this process holding a CUDA context: NVML's raw pids, ``own_pids()``, ``other_processes``
   (expected 0), ``is_contended`` (expected False), ``wait_until_idle(1 s)`` (expected no wait);
2. a child of this process holding a context (as a timing worker does): still 0, not contended;
3. an outside process (double-forked, so not below this one) running ``torch.mm`` in a loop:
   ``other_processes`` (expected 1), contended, ``wait_until_idle`` waits its full second and says
   ``busy_at_start``; and ``time_cuda`` of the problem idle and beside it (how much the outside
   process moves a timing);
4. after the outside process is stopped: 0 again.

Prints one line per step and a verdict line per expectation; exits 1 when one fails, 2 without
CUDA. No Inductor compile: torch 2.11 runs it. Output recorded in docs/gpu_runs/.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zhantune.bench.conditions import conditions, is_contended, mark_tune_root, own_pids, wait_until_idle  # noqa: E402
from zhantune.bench.timing import time_cuda  # noqa: E402

HOLD = textwrap.dedent("""
    import sys, time, torch
    x = torch.ones(1024, device=sys.argv[1])
    torch.cuda.synchronize()
    open(sys.argv[2], "w").write("ready")
    time.sleep(float(sys.argv[3]))
""")

HOG = textwrap.dedent("""
    import sys, time, torch
    n = int(sys.argv[3])
    a = torch.randn(n, n, device=sys.argv[1], dtype=torch.bfloat16)
    torch.mm(a, a)
    torch.cuda.synchronize()
    open(sys.argv[2], "w").write("ready")
    end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        for _ in range(20):
            torch.mm(a, a)
        torch.cuda.synchronize()
""")


def _raw_nvml_pids(index: int) -> list[int] | str:
    try:
        import pynvml
    except ImportError:
        return "no nvidia-ml-py"
    from zhantune.bench.conditions import _nvml_handle

    try:
        pynvml.nvmlInit()
        h = _nvml_handle(pynvml, index)
        if h is None:
            return "no NVML handle"
        return sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    except pynvml.NVMLError as e:
        return f"NVMLError: {e}"


def _wait_ready(path: Path, proc_desc: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > end:
            raise SystemExit(f"{proc_desc} did not start in {timeout_s:g} s")
        time.sleep(0.05)
    time.sleep(0.5)  # NVML lists a process once its context is made; give it a moment


def _step(name: str, device: str, index: int) -> dict:
    c = conditions("cuda", index)
    gpu = c.get("gpu") or {}
    waited = wait_until_idle(1.0, "cuda", index)
    row = {"step": name, "nvml_pids": _raw_nvml_pids(index), "own_pids": sorted(own_pids()),
           "other_processes": gpu.get("other_processes"), "contended": is_contended(c),
           "waited_s": round(waited["waited_s"], 3), "busy_at_start": waited["busy_at_start"],
           "sm_clock_mhz": gpu.get("sm_clock_mhz"), "utilization_pct": gpu.get("utilization_pct")}
    print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def _times(fn, n: int, target_ms: float) -> list[float]:
    return [round(time_cuda(fn, target_ms=target_ms).min_us, 2) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--shape", default="4096,4096,4096", help="M,N,K of the timed torch.mm")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hog-n", type=int, default=8192, help="the outside process's square mm size")
    ap.add_argument("--timings", type=int, default=5, help="time_cuda calls per side")
    ap.add_argument("--target-ms", type=float, default=20.0)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_contention: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    index = dev.index or 0
    mark_tune_root()
    m, n, k = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    a = torch.randn(m, k, device=dev, dtype=dtype)
    b = torch.randn(k, n, device=dev, dtype=dtype)
    torch.cuda.synchronize()

    def mm() -> object:
        return torch.mm(a, b)

    print(f"torch {torch.__version__}; {torch.cuda.get_device_name(dev)}; pid {os.getpid()}; "
          f"mm {m}x{n}x{k} {args.dtype}; outside process: bf16 mm {args.hog_n}^2 in a loop", flush=True)
    rows, failures = {}, []
    tmp = Path(tempfile.mkdtemp(prefix="gpu_contention-"))

    rows["idle"] = _step("idle", args.device, index)
    idle_us = _times(mm, args.timings, args.target_ms)
    print(f"time_cuda idle min_us: {idle_us}", flush=True)

    ready = tmp / "child.ready"
    child = subprocess.Popen([sys.executable, "-c", HOLD, args.device, str(ready), "30"])
    try:
        _wait_ready(ready, "the child holding a context")
        rows["own_child"] = _step("own_child", args.device, index)
    finally:
        child.kill()
        child.wait()

    ready = tmp / "hog.ready"
    # double fork: the hog is reparented away from this process, as another user's job would be
    launch = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" "$2" "$3" "$4" "$5" >/dev/null 2>&1 & echo $!',
         sys.executable, HOG, args.device, str(ready), str(args.hog_n), "300"],
        capture_output=True, text=True, check=True)
    hog_pid = int(launch.stdout.split()[0])
    try:
        _wait_ready(ready, "the outside process")
        print(f"outside process pid {hog_pid}", flush=True)
        rows["outside"] = _step("outside", args.device, index)
        busy_us = _times(mm, args.timings, args.target_ms)
        print(f"time_cuda beside the outside process min_us: {busy_us}", flush=True)
    finally:
        try:
            os.kill(hog_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(100):  # NVML drops a process a little after it exits
        time.sleep(0.1)
        if not (isinstance(p := _raw_nvml_pids(index), list) and len(p) > 1):
            break
    rows["after"] = _step("after", args.device, index)

    expect = [
        ("idle: other_processes == 0", rows["idle"]["other_processes"] == 0),
        ("idle: not contended", not rows["idle"]["contended"]),
        ("idle: no back-off", not rows["idle"]["busy_at_start"]),
        ("own child: other_processes == 0", rows["own_child"]["other_processes"] == 0),
        ("own child: not contended", not rows["own_child"]["contended"]),
        ("outside: other_processes == 1", rows["outside"]["other_processes"] == 1),
        ("outside: contended", rows["outside"]["contended"]),
        ("outside: backed off and still busy", rows["outside"]["busy_at_start"]
         and rows["outside"]["waited_s"] >= 0.9),
        ("after: other_processes == 0", rows["after"]["other_processes"] == 0),
    ]
    for what, ok in expect:
        print(f"{'PASS' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)
    print(f"timing beside the outside process / idle (min of {args.timings} each): "
          f"{min(busy_us) / min(idle_us):.2f}x")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
