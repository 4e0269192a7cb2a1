"""Compile a problem with exactly one candidate through Inductor, check it ran, check it, time it.

CUDA: the candidate is one template choice, installed as a one-entry
``torch._inductor.config.lookup_table.table`` under max-autotune; the recording handler must report
a hit for that template, else the trial is ``not_applied`` (never a silent measurement of the
default).

CPU: every compile is the inference compile a user gets: ``freezing=True`` under ``no_grad``, oneDNN
on, weight prepack on (nothing here changes ``torch.backends.mkldnn``). Inductor's default then runs
a GEMM with a constant weight as oneDNN's / MKL's prepacked linear: that is the "default" baseline,
and the ``aten`` config candidate is the same compile. A C++-template candidate is a config patch
(``max_autotune_gemm_backends``, ``cpp.gemm_*``) served, like a table entry, by
:class:`zhantune.inductor.table_choices.TableChoices` under whatever key the GEMM makes, through the
per-GEMM lowering hook (zhantune.inductor.cpu_gemm): what is measured is what ``use_table`` compiles.
The C++ GEMM template must show up in Inductor's ``cpp_templated_kernel_counter`` exactly when the
patch selects it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V

from zhantune.bench.conditions import conditions, run_queue_wait, wait_until_idle
from zhantune.bench.kept import RESET_EVERY, Kept, KeptCompiles, compile_key, forget, own_entry
from zhantune.bench.measurement import Measurement, tolerance
from zhantune.bench.timing import Timing, time_cpu, time_cuda
from zhantune.candidate import Candidate
from zhantune.config import BenchConfig
from zhantune.device import DeviceInfo
from zhantune.inductor import cpu_gemm
from zhantune.inductor.choices import LookupEvent, RecordingChoices, recording
from zhantune.inductor.heuristics import derived_kwargs
from zhantune.inductor.knobs import CONFIG_KNOBS, FUSION_KNOBS
from zhantune.inductor.settings import MAX_AUTOTUNE, backend_flags, base_patch, template_patch
from zhantune.problems import GemmProblem

__all__ = ["InductorBenchmarker", "candidate_entry", "relative_error"]


@contextlib.contextmanager
def _serving(handler: RecordingChoices) -> Iterator[RecordingChoices]:
    """``handler`` as Inductor's choices handler, with the CPU lowering hooks, inside the block."""
    with V.set_choices_handler(handler), cpu_gemm.installed():
        yield handler


@contextlib.contextmanager
def _no_graph_caches() -> Iterator[None]:
    """With the kernel cache on (zhantune.inductor.settings.KERNEL_CACHE_PATCH): AOTAutograd's cache
    (a hit skips the lowering) and Dynamo's profile-guided dynamic shapes (state kept in the cache
    directory) off, as ``force_disable_caches`` does."""
    with torch._functorch.config.patch(enable_autograd_cache=False), \
            torch._dynamo.config.patch(automatic_dynamic_local_pgo=False):
        yield


def candidate_entry(candidate: Candidate, dims: dict[str, int]) -> dict[str, Any]:
    """The one-entry lookup-table entry of a template candidate for a problem of ``dims``: its
    params plus the kwargs Inductor derives from them (zhantune.inductor.heuristics.derived_kwargs)."""
    assert candidate.template_id is not None
    return {"template_id": candidate.template_id, **candidate.params,
            **derived_kwargs(candidate.template_id, candidate.params, dims)}


class InductorBenchmarker:
    """Benchmarks one problem on one device: baselines first, then candidates.

    ``lookup`` is the GEMM lookup Inductor made while compiling the default baseline: the problem's
    Inductor input key comes from it (never built by hand).
    """

    name = "inductor"

    def __init__(self, problem: GemmProblem, device: DeviceInfo, cfg: BenchConfig, seed: int = 0):
        self.problem = problem
        self.device = device
        self.cfg = cfg
        self.module, self.inputs = problem.build(device.torch_device, seed=seed)
        self.reference = problem.reference(self.module, self.inputs)
        self.lookup: LookupEvent | None = None
        #: called once a candidate compiled (zhantune.bench.isolated switches to the run time limit)
        self.on_compiled: Callable[[], None] | None = None
        #: the last compiles that measured ok: a re-measurement (close call, paired round) times the
        #: same compiled code again instead of compiling anew (zhantune.bench.kept)
        self._kept = KeptCompiles()
        self._compiles = 0

    # -- baselines ---------------------------------------------------------------------------
    def baselines(self) -> list[tuple[str, Measurement]]:
        """Eager, then Inductor's default (which records the lookup key): (kind, measurement). On
        CPU also the default compile without freezing (kind ``default_unfrozen``): what a user who
        does not set ``freezing = True`` gets (no weight prepack, no C++ GEMM template), shown beside
        the frozen default that every claim and the table are measured against."""
        out = [("eager", self.eager()), ("default", self.inductor_default())]
        if self.device.kind == "cpu":
            out.append(("default_unfrozen", self._run({**self.base_patch(), "freezing": False}, table=None, expect=None)))
        return out

    @property
    def lookup_key(self) -> str | None:
        """The device-agnostic Inductor input key of the problem's GEMM (after the baselines)."""
        return self.lookup.agnostic_key if self.lookup else None

    def eager(self) -> Measurement:
        """Eager PyTorch, no compile."""
        with torch.no_grad():
            out = self.module(*self.inputs)
        return self._check_and_time(lambda: self.module(*self.inputs), out, compile_s=0.0, lookup=None)

    def inductor_default(self) -> Measurement:
        """torch.compile with Inductor's defaults (no max-autotune; on CPU ``freezing=True`` with
        oneDNN on: the prepacked linear a user's compile runs); records the lookup key."""
        m = self._run(self.base_patch(), table=None, expect=None)
        if m.lookup is not None:
            self.lookup = m.lookup
        return m

    def record_lookup(self) -> Measurement:
        """Compile Inductor's default once, untimed, only to record the problem's GEMM lookup (a
        resumed study that re-uses its stored baselines: template candidates are served under the
        key it records). ``ok`` without a timing, or the compile's failure."""
        m = self._run(self.base_patch(), table=None, expect=None, time_it=False)
        if m.lookup is not None:
            self.lookup = m.lookup
        return m

    def measure_default(self) -> Measurement:
        """Inductor's default compile again (zhantune.bench.settle.settle_speedup re-measures it)."""
        return self.inductor_default()

    def close(self) -> None:
        """Drop the kept compiles (their Dynamo cache entries)."""
        self._kept.clear()

    # -- candidates --------------------------------------------------------------------------
    def measure(self, candidate: Candidate) -> Measurement:
        """Compile with exactly this candidate, confirm it applied, check the output, time it."""
        return self._candidate(candidate, time_it=True)

    def precompile(self, candidate: Candidate) -> Measurement:
        """Compile only (a compile-ahead worker, zhantune.bench.compile_pool.CompilePool), so that the
        candidate's kernels are in Inductor's on-disk kernel cache when the timing worker compiles it.
        Status ``ok`` without a timing (and ``compile_s``, seconds) when it compiled and applied;
        else the failure (``compile_error``, ``not_applied``, ``invalid``) as :meth:`measure` gives it."""
        return self._candidate(candidate, time_it=False)

    def _candidate(self, candidate: Candidate, time_it: bool) -> Measurement:
        base = self.base_patch()
        if self.device.kind == "cpu":
            if candidate.scope != "config":
                return Measurement("invalid", error_text=f"{candidate.describe()}: only config-scope "
                                   "candidates apply on CPU (Inductor's CPU GEMM has no template lookup)")
            from zhantune.inductor.table import TableFile, entry_for
            from zhantune.inductor.table_choices import TableChoices

            # the GEMM's knobs served under every key, as use_table serves them: only the GEMM's own
            # lowering changes. A fusion limit is read when Inductor schedules the graph, after the
            # lowering (no table carries it on CPU: FUSION_ENTRY_ON_CPU), and any other config key (a
            # test space's fault injection) is no table knob: both apply to the whole compile, as on
            # CUDA (served per GEMM, a fusion limit measured the default compile)
            gemm = {k: v for k, v in candidate.params.items() if k in CONFIG_KNOBS["cpu"] and k not in FUSION_KNOBS}
            rest = {k: v for k, v in candidate.params.items() if k not in gemm}
            handler = TableChoices(TableFile({}, source="<candidate>"), any_key=[entry_for(None, gemm, None)])
            return self._run({**base, **rest}, table=None, expect=candidate, time_it=time_it, handler=handler)
        if candidate.scope == "backend":  # Inductor's default choice under these backend flags
            with backend_flags(candidate.params):  # TF32 rounds float32 inputs: its own tolerance
                return self._run(dict(base), table=None, expect=None, time_it=time_it,
                                 tol=tolerance(self.problem.dtype, candidate.params))
        patch = dict(base)
        patch[MAX_AUTOTUNE[self.device.kind]] = True  # the GEMM's choices; on CUDA nothing else autotuned
        entries = None
        if candidate.scope == "template":
            if self.lookup is None or self.lookup.device_key is None:
                return Measurement("not_applied", error_text="no lookup key recorded for this problem")
            # served under the key Inductor asks with; the event that hits records it
            entries = [candidate_entry(candidate, self.problem.dims)]
            patch.update(template_patch(candidate.template_id, self.device.kind))
        else:
            patch.update(candidate.params)
        return self._run(patch, table=None, expect=candidate, any_key=entries, time_it=time_it)

    def base_patch(self) -> dict[str, Any]:
        """Inductor config under every compile of this benchmarker (zhantune.inductor.settings.base_patch)."""
        return base_patch(self.device.kind)

    # -- the shared path ---------------------------------------------------------------------
    def _run(self, patch: dict[str, Any], table: dict | None, expect: Candidate | None,
             any_key: list[dict[str, Any]] | None = None, time_it: bool = True,
             handler: RecordingChoices | None = None, tol: float | None = None) -> Measurement:
        key = compile_key(patch, table, expect, any_key, tol)
        kept = self._kept.get(key) if time_it else None
        if kept is not None:  # compiled before, unchanged: time the same code again
            # the first call may not compile: a compile now would be under no config (after a
            # torch._dynamo.reset() elsewhere, or failing guards). The timed calls run as a fresh
            # compile's do, without the stance (it costs ~2.5 us per call)
            try:
                with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
                    out = kept.fn()
                self._synchronize()
            except Exception:  # its compiled code is gone (or its guards fail): compile anew
                self._kept.drop(key)
            else:
                if self.on_compiled is not None:
                    self.on_compiled()
                return self._check_and_time(kept.fn, out, kept.compile_s, kept.lookup, kept.template_hash, tol)
        self._compiles += 1
        if self._compiles % RESET_EVERY == 1:  # Dynamo's global state bounded: the kept compiles go too
            self._kept.clear()
            torch._dynamo.reset()
        templated_before = counters["inductor"]["cpp_templated_kernel_counter"]
        served = recording(table, any_key) if handler is None else _serving(handler)
        entry = own_entry(self.module)
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), served as rec, inductor_config.patch(patch), \
                    _no_graph_caches():
                compiled = torch.compile(entry, fullgraph=True, dynamic=False)
                out = compiled(*self.inputs)
            self._synchronize()
        except Exception as e:  # Inductor raises many types; the text is stored with the trial
            forget(entry)
            return Measurement("compile_error", error_text=_one_line(e), compile_s=time.perf_counter() - t0)
        compile_s = time.perf_counter() - t0
        if self.on_compiled is not None:
            self.on_compiled()
        # every lookup is this problem's GEMM, under whatever op Inductor lowered it as: on a GPU a
        # post-grad pass rewrites float32 addmm + pointwise (linear_act) into mm + add
        # (torch/_inductor/fx_passes/post_grad.py unfuse_bias_add_to_pointwise), so it looks up "mm"
        events = rec.events
        # the lookup that hit the candidate's template (its key goes into the table); else the first
        # that offered something (addmm's ATen lookup or a packed linear: the problem's key); else any
        hit = [e for e in events if expect is not None and expect.template_id in e.hit_templates]
        offered = [e for e in events if e.offered]
        lookup = (hit or offered or events or [None])[0]
        templated = counters["inductor"]["cpp_templated_kernel_counter"] - templated_before
        why_not = self._not_applied(expect, lookup, templated)
        stale = getattr(getattr(rec, "report", None), "stale", None)  # the handler said why (TableChoices)
        if why_not and stale:
            why_not = f"the candidate's entry was not used: {next(iter(stale.values()))}"
        if why_not or not time_it:
            forget(entry)
            if why_not:
                return Measurement("not_applied", error_text=why_not, compile_s=compile_s, lookup=lookup)
            return Measurement("ok", compile_s=compile_s, lookup=lookup)
        template_hash = None
        if expect is not None and expect.template_id and lookup is not None:
            template_hash = lookup.template_hashes.get(expect.template_id)
        inputs = self.inputs

        def run() -> Any:
            return compiled(*inputs)

        meas = self._check_and_time(run, out, compile_s, lookup, template_hash, tol)
        if meas.status == "ok":
            self._kept.put(key, Kept(run, entry, compile_s, lookup, template_hash))
        else:
            forget(entry)
        return meas

    def _not_applied(self, expect: Candidate | None, lookup: LookupEvent | None, templated: int) -> str | None:
        if lookup is None:
            return ("Inductor made no GEMM lookup while compiling: the GEMM did not reach Inductor's GEMM lowering"
                    + (" nor a lowering zhantune hooks (zhantune.inductor.cpu_gemm: mm, addmm, bmm, the packed "
                       "linears, oneDNN's fused linear)" if self.device.kind == "cpu" else ""))
        if expect is None:
            return None
        if expect.scope == "template":
            if expect.template_id not in lookup.hit_templates:
                return f"lookup table miss for {expect.template_id} under key {lookup.device_key!r}"
            return None
        backends = str(expect.params.get("max_autotune_gemm_backends", "")).upper()
        if self.device.kind == "cpu" and backends:
            wants_cpp = backends == "CPP"
            if wants_cpp and templated == 0:
                return "the C++ GEMM template was not used (Inductor found it inapplicable)"
            if not wants_cpp and "CPP" not in backends and templated > 0:
                return "a C++ template kernel was generated although the patch excludes CPP"
        return None

    def _check_and_time(self, fn: Callable[[], torch.Tensor], out: torch.Tensor, compile_s: float,
                        lookup: LookupEvent | None, template_hash: str | None = None,
                        tol: float | None = None) -> Measurement:
        """Check the output against the reference (max relative error at most ``tol``, default the
        problem dtype's, zhantune.bench.measurement.tolerance), then time ``fn``."""
        error = relative_error(out, self.reference)
        # a busy machine first gets up to bench.busy_wait_s to calm down (zhantune.bench.conditions)
        waited = wait_until_idle(getattr(self.cfg, "busy_wait_s", 0.0) or 0.0, self.device.kind, self.device.index)
        try:
            with torch.no_grad(), run_queue_wait() as wait:  # what descheduled the timed runs themselves
                timing = self._time(fn)
        except Exception as e:
            return Measurement("runtime_error", error=error, error_text=_one_line(e), compile_s=compile_s,
                               template_hash=template_hash, lookup=lookup)
        seen = {**conditions(self.device.kind, self.device.index), **waited,
                **(wait if self.device.kind == "cpu" else {})}
        tol = tolerance(self.problem.dtype) if tol is None else tol
        if not math.isfinite(error) or error > tol:
            return Measurement("incorrect", timing=timing, error=error, compile_s=compile_s,
                               error_text=f"max relative error {error:.3g} > tolerance {tol:g}",
                               template_hash=template_hash, lookup=lookup, conditions=seen)
        return Measurement("ok", timing=timing, error=error, compile_s=compile_s,
                           template_hash=template_hash, lookup=lookup, conditions=seen)

    def _time(self, fn: Callable[[], object]) -> Timing:
        c = self.cfg
        if self.device.kind == "cuda":  # pragma: no cover - needs a GPU
            with torch.cuda.device(self.device.index):
                return time_cuda(fn, warmup_ms=c.warmup_ms, target_ms=c.target_ms, cuda_graph=c.cuda_graph)
        return time_cpu(fn, warmup_ms=c.warmup_ms, target_ms=c.target_ms, min_reps=c.min_reps,
                        max_reps=c.max_reps, flush_cache=c.flush_cache, nice=getattr(c, "nice", None), fifo=getattr(c, "fifo", False))

    def _synchronize(self) -> None:
        if self.device.kind == "cuda":  # pragma: no cover - needs a GPU
            torch.cuda.synchronize(self.device.index)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in float64 (inf when out has NaN/Inf or the wrong shape)."""
    if out.shape != reference.shape:
        return math.inf
    out64 = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf
    scale = reference.abs().max().item() or 1.0
    return (out64 - reference.cpu()).abs().max().item() / scale


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(e).__name__}: {first}"[:500]
