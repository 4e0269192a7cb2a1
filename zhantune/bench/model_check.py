"""The model check behind ``python -m zhantune.check``: compile a model with a table, with Inductor's
default and with max-autotune, and time the three ways in interleaved rounds.

Each way is a cold compile (Inductor's caches off, in a temporary cache directory deleted at the
end: ``force_disable_caches`` leaves a directory per compile there) of its own copy in this process, after an
untimed warm-up compile of every way, under zhantune.inductor.settings.model_patch (on CPU the inference compile a
user gets: ``freezing=True`` under ``no_grad``, oneDNN on). Timing is zhantune's protocol
(zhantune.bench.timing), a busy machine waited for and reported as in a tune
(zhantune.bench.conditions); every run time is the decision statistic (the fastest run).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

from zhantune.bench.decision import DEFAULT_MIN_SPEEDUP

__all__ = ["CompileFailed", "check_model", "time_interleaved", "versus"]


class CompileFailed(Exception):
    """A way's compile raised an error of Inductor's (not the user's input): ``way`` ("table",
    "default", "max-autotune"), ``what`` (one line: the error's type, its first line and where it was
    raised) and, for the table's way, the TableReport of the lookups made before it (``report``)."""

    def __init__(self, way: str, what: str, report: Any = None):
        super().__init__(f"{way}: {what}")
        self.way, self.what, self.report = way, what, report


def _failure(e: BaseException) -> str:
    """One line for a compile's error: "InductorError: AssertionError: (raised at ir.py:2186)"."""
    import traceback
    from pathlib import Path

    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {first}"[:300] + at


def _compile(model: Any, inputs: tuple, device: Any, patch: dict[str, Any], table: Any = None,
             way: str = "default") -> dict[str, Any]:
    """Compile a copy of ``model`` under ``patch`` (zhantune.inductor.settings.model_patch: Inductor's
    caches off; ``table`` served through use_table while it compiles) and run it once: {"fn", "compile_s", "out", "report"}. Each way
    compiles its own copy with a ``forward`` of its own code object (zhantune.bench.kept.own_entry),
    so that Dynamo keeps one graph per way and calling one never recompiles another (copies share
    a code object: a model without parameters gave Dynamo no guard, and every way ran the first's code).
    Raises CompileFailed naming ``way`` when the compile raises anything but a UserError."""
    import copy
    from unittest import mock

    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    from zhantune.bench.kept import own_entry
    from zhantune.errors import UserError
    from zhantune.inductor.runtime import use_table

    codes: list[str] = []
    mine = copy.deepcopy(model)
    mine = own_entry(mine) if isinstance(mine, torch.nn.Module) else mine
    installed = use_table(table, device.kind) if table is not None else None
    try:
        with torch.no_grad(), inductor_config.patch(patch):
            compiled = torch.compile(mine)
            t0 = time.perf_counter()
            # the code Inductor writes (is it the default's?), as run_and_get_code takes it but without its
            # torch._dynamo.reset(), which dropped the ways compiled before: their timed calls recompiled
            with mock.patch.object(GraphLowering, "save_output_code", codes.append):
                out = compiled(*inputs)
            if device.kind == "cuda":  # pragma: no cover - needs a GPU
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
    except UserError:
        raise
    except Exception as e:  # Inductor's own failure (found 2026-11-30: a table made a model that compiles fail)
        raise CompileFailed(way, _failure(e), installed.report if installed is not None else None) from e
    finally:
        if installed is not None:
            installed.remove()

    def fn() -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    return {"fn": fn, "compile_s": compile_s, "out": out, "code": _comparable(codes) if codes else None,
            "report": installed.report if installed is not None else None}


def _comparable(code: list[str]) -> str:
    """Inductor's output code less what differs between two compiles of one graph: the AOT id and
    the frozen parameters' addresses in their comments (``_frozen_param3 = None  # device(...) ... 7f2e...``)."""
    import re

    text = "\n".join(code)
    text = re.sub(r"(?m)^# AOT ID: .*$", "", text)
    return re.sub(r"(?m)^(_frozen_param\d+ = None  # .*) [0-9a-f]+$", r"\1", text)


def _time_once(fn: Any, device: Any, bench: Any) -> tuple[Any, dict[str, Any]]:
    """One timed measurement of ``fn`` (zhantune's protocol, microseconds) after the busy-machine
    back-off; returns (Timing, the conditions it was taken in)."""
    from zhantune.bench.conditions import conditions, run_queue_wait, wait_until_idle
    from zhantune.bench.timing import time_cpu, time_cuda

    waited = wait_until_idle(getattr(bench, "busy_wait_s", 0.0) or 0.0, device.kind, device.index)
    wait: dict[str, float] = {}
    if device.kind == "cuda":  # pragma: no cover - needs a GPU
        timing = time_cuda(fn, warmup_ms=bench.warmup_ms, target_ms=bench.target_ms, cuda_graph=bench.cuda_graph)
    else:
        with run_queue_wait() as wait:  # what descheduled the timed runs themselves
            timing = time_cpu(fn, warmup_ms=bench.warmup_ms, target_ms=bench.target_ms, min_reps=bench.min_reps,
                              max_reps=bench.max_reps, flush_cache=bench.flush_cache,
                              nice=getattr(bench, "nice", None), fifo=getattr(bench, "fifo", False))
    return timing, {**conditions(device.kind, device.index), **waited, **wait}


def time_interleaved(fns: dict[str, Any], device: Any, bench: Any, rounds: int) -> tuple[dict[str, dict[str, Any]], Any]:
    """Time every way in ``rounds`` interleaved rounds (round r starts at way r mod n, so no way is
    always first). Per way: ``run_us`` the fastest run over all rounds (the decision statistic, as
    in a tune: one-sided noise cannot make it smaller), ``median_us`` the median of the per-round
    medians, ``rounds_us`` each round's fastest run, ``disturbed_rounds`` how many of its rounds a
    paired comparison cannot vouch for (begun busy, or contended and not shielded by SCHED_FIFO:
    zhantune.bench.conditions.disturbs_claim, a tune's claim's rule), ``recompiles`` how many frames
    Dynamo converted while it was timed (``counters["frames"]["total"]``: a compiled way that a
    call compiles again runs other code than its compile's). Returns (per way, ContentionCount)."""
    import statistics
    import sys

    from zhantune.bench.conditions import ContentionCount, disturbs_claim, is_contended

    dynamo = sys.modules.get("torch._dynamo.utils")
    frames = (lambda: dynamo.counters["frames"]["total"]) if dynamo is not None else (lambda: 0)
    names = list(fns)
    timings: dict[str, list[Any]] = {n: [] for n in names}
    busy = dict.fromkeys(names, 0)
    recompiles = dict.fromkeys(names, 0)
    contention = ContentionCount()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = frames()
            timing, seen = _time_once(fns[name], device, bench)
            recompiles[name] += frames() - before
            timings[name].append(timing)
            contended = is_contended(seen)
            busy[name] += disturbs_claim(seen, contended, timing.method)  # a tune's claim's rule
            contention = contention.add(seen, contended, timing.method)
    out = {}
    for name, ts in timings.items():
        out[name] = {"run_us": min(t.min_us for t in ts), "median_us": statistics.median(t.median_us for t in ts),
                     "rounds_us": [t.min_us for t in ts], "n": sum(t.n for t in ts), "method": ts[0].method,
                     "disturbed_rounds": busy[name], "recompiles": recompiles[name]}
    return out, contention


#: a difference check calls one only from this factor either way: export.min_speedup's default, for
#: the offsets two copies of one kernel showed in paired rounds (up to 1.015x: docs/timing.md)
CHECK_FLOOR = DEFAULT_MIN_SPEEDUP


def versus(way: dict[str, Any], default: dict[str, Any], same_code: bool = False) -> dict[str, Any]:
    """The paired comparison of a way with the default: ``ratio`` = the median over the rounds of
    default / way (each side's fastest run in the round; > 1: the way is faster; one round's ways
    run one after another, so a slow phase of the machine inflates them alike, as in a tune's claim:
    zhantune.bench.decision.judge_speedup), the per-round ratios' range, and ``consistent``: every
    round agrees on which is faster, by a margin the rounds' disagreement cannot explain (the rule of
    a tune's claim, zhantune.bench.decision.beyond_spread, either way, so up to 1% of equal ways are
    marked consistent; check's rounds rotate three ways, so a way and the default are not always
    back to back; never with one round, nor where a round of either side was disturbed, by a tune's
    claim's rule: zhantune.bench.conditions.disturbs_claim), within :data:`CHECK_FLOOR` of 1, or where
    the way compiled the very code of the default (``same_code``: a table of the default's kernels; a
    helper saw "1.01x" printed for it under bursty load). Where not consistent, ``ratio`` is None
    (the terminal shows "~"), the median is ``unconfirmed_ratio`` and ``reason`` says why."""
    from zhantune.bench.decision import beyond_spread, paired_ratio

    per_round = [d / w for d, w in zip(default["rounds_us"], way["rounds_us"], strict=True)]
    n, low, high, ratio = len(per_round), min(per_round), max(per_round), paired_ratio(per_round)
    reason = None
    if way.get("recompiles") or default.get("recompiles"):
        reason = ("Dynamo compiled the model again while it was timed (a forward that changes its own state, or "
                  "inputs its guards fail on): the timed code is not the compile checked")
    elif same_code:
        reason = "the same code as the default compile: any difference is noise"
    elif n < 2:
        reason = "one round: no difference can be shown"
    elif way.get("disturbed_rounds") or default.get("disturbed_rounds"):
        reason = "a round began on a busy machine or ran contended without SCHED_FIFO: noise could have made it"
    elif not (beyond_spread(low, high, n) or beyond_spread(1 / high, 1 / low, n)):
        reason = "the rounds disagree on which is faster, or by too little for their spread"
    elif 1 / CHECK_FLOOR < ratio < CHECK_FLOOR:
        reason = (f"within {CHECK_FLOOR - 1:.0%} of the default: two copies of one kernel measured up to 1.015x apart "
                  "in paired rounds (export.min_speedup's floor)")
    if reason is None:
        return {"ratio": ratio, "ratio_low": low, "ratio_high": high, "consistent": True, "reason": None}
    return {"ratio": None, "unconfirmed_ratio": ratio, "ratio_low": low, "ratio_high": high, "consistent": False,
            "reason": reason}


def check_model(model: Any, inputs: tuple, device: Any, table: Any, bench: Any,
                max_autotune: bool = True, rounds: int = 5) -> dict[str, Any]:
    """Compile ``model`` with ``table`` (a TableFile), by default, and with max-autotune, then time
    the compiled ways in ``rounds`` interleaved rounds (:func:`time_interleaved`).

    Returns {"report": TableReport, "ways": {name: {compile_s, run_us, median_us, rounds_us, error,
    vs_default}}, "contention": ContentionCount, "failed": {"max-autotune": why} where its compile
    failed (left out)}; run times in microseconds (``run_us``: the fastest run), compile times in
    seconds; ``error`` is the max relative error vs eager. Compiles in a temporary cache directory
    (zhantune.inductor.settings.scratch_cache_dir). Raises CompileFailed where the table's or the
    default's compile fails.
    """
    from zhantune.inductor.settings import scratch_cache_dir

    with scratch_cache_dir("zhantune-check-"):
        return _check_model(model, inputs, device, table, bench, max_autotune, rounds)


def _check_model(model: Any, inputs: tuple, device: Any, table: Any, bench: Any,
                 max_autotune: bool, rounds: int) -> dict[str, Any]:
    import torch

    from zhantune.bench.inductor import relative_error
    from zhantune.inductor.settings import model_patch

    torch._dynamo.reset()
    with torch.no_grad():
        reference = [t.double() for t in _tensors(model(*inputs))]  # a tuple or dict too (it was a traceback)
    if not reference:
        from zhantune.errors import ConfigError

        raise ConfigError("returns no tensor; check compares the model's tensors (one, or a tuple, list or dict "
                          "of them) with its eager output")
    # max-autotune's AUTOTUNE tables on stderr off (zhantune prints its own report)
    base = model_patch(device.kind)
    patches = {"table": (base, table), "default": (base, None)}
    if max_autotune:
        patches["max-autotune"] = (model_patch(device.kind, max_autotune=True), None)
    with _limit_hits() as hits:
        # each way compiled twice: a submodule's code, shared by every copy, gets an entry per copy and
        # compile, so the user's recompile limit times the compiles (a review hit it before the timing)
        with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit * 2 * len(patches)):
            # an untimed compile of each way first, so that the process's one-time costs (Dynamo, Inductor's
            # imports, the C++ toolchain's first run, the C++ GEMM template's first use: a helper saw a C++
            # table's compile take 9.0 s against max-autotune's 0.4 s, and 1.0 s against 8.6 s with the
            # default's entries) land on no way's compile time
            failed: dict[str, str] = {}

            def compile_way(name: str) -> dict[str, Any] | None:
                """The way's compile; None where max-autotune's fails, untimed or timed (a review's):
                Inductor's own choices, the check goes on without them."""
                try:
                    return _compile(model, inputs, device, *patches[name], way=name)
                except CompileFailed as e:
                    if name != "max-autotune":
                        raise
                    failed[name] = e.what
                    return None

            for name in sorted(patches, key=lambda n: n != "default"):  # the default's failure first: the model's
                if compile_way(name) is None:
                    del patches[name]
            compiled = {name: c for name in list(patches) if (c := compile_way(name)) is not None}
        times, contention = time_interleaved({n: c["fn"] for n, c in compiled.items()}, device, bench, rounds)
    ways: dict[str, dict[str, Any]] = {}
    for name, c in compiled.items():
        same = name != "default" and c["code"] is not None and c["code"] == compiled["default"]["code"]
        vs = versus(times[name], times["default"], same_code=same)
        if name == "default":
            vs["reason"] = "the default itself"
        elif hits and not (times[name]["recompiles"] or times["default"]["recompiles"]):  # that reason first
            vs = {**vs, "ratio": None, "consistent": False, "reason": LIMIT_HIT}
        outs = _tensors(c["out"])
        error = max(map(relative_error, outs, reference)) if len(outs) == len(reference) else math.inf
        ways[name] = {"compile_s": c["compile_s"], **times[name], "error": error,
                      "vs_default": vs}
    return {"report": compiled["table"]["report"], "ways": ways, "contention": contention, "recompile_limit": hits,
            "failed": failed}


def _tensors(out: Any) -> list[Any]:
    """The tensors a model returned: itself, or those in its tuple, list or dict, in order."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


#: why no way is compared where Dynamo hit its recompile limit during the check
LIMIT_HIT = ("Dynamo hit its recompile limit during the check: part of the model ran uncompiled in some way, so "
             "the timed code is not the compiled model's")


@contextlib.contextmanager
def _limit_hits() -> Iterator[list[str]]:
    """The functions Dynamo gave up compiling while inside (its "hit config.recompile_limit" warning,
    torch/_dynamo/convert_frame.py: such a frame runs uncompiled from then on), as "name (file:line)"."""
    import logging

    hits: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if str(record.msg).startswith("torch._dynamo hit config.") and len(record.args or ()) > 2:
                hits.append(str(record.args[2]))

    seen, logger = Seen(logging.WARNING), logging.getLogger("torch._dynamo.convert_frame")
    logger.addHandler(seen)
    try:
        yield hits
    finally:
        logger.removeHandler(seen)
