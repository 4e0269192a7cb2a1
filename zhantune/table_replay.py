"""Measure a lookup table's entries on this device (``python -m zhantune.replay``).

Configs tuned elsewhere (another GPU, a colleague's table) are measured here and stored like any
candidate, with the same config hashes, so that ``python -m zhantune.compare`` gives their regret on
this device. Inductor's default is measured too, as the baseline of each problem, and each entry's
speedup over it is settled in paired rounds as a tune settles its winner (stored verdicts: the
export and compare's portable table ship an entry only where its claim was confirmed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zhantune import interrupt
from zhantune.bench.conditions import contention_count
from zhantune.bench.measurement import Measurement
from zhantune.candidate import Candidate
from zhantune.device import DeviceInfo
from zhantune.storage import Recorder, Store

__all__ = ["measure_table"]

#: called after each measurement: (problem key, candidate or None for Inductor's default, measurement)
Report = Callable[[str, Candidate | None, Measurement], None]


def measure_table(store: Store, device: DeviceInfo, work: list[tuple[Any, list[Candidate]]], bench: Any,
                  seed: int, study_name: str, config: dict[str, Any], report: Report,
                  say: Callable[[str], None] = print) -> None:
    """For each (problem row, candidates) of ``work`` (zhantune.inductor.builder.table_candidates):
    Inductor's default, then each candidate, compiled and timed on ``device`` (``bench``: a
    BenchConfig) and stored in the study ``study_name`` (created with ``config``); each candidate
    measured ok is then settled against the default in ``bench.remeasure_rounds`` paired rounds
    (:func:`_settle`; none for the default's own kernel or with 0 rounds), its verdict stored and its
    sentence passed to ``say`` (with a warning where the default's own kernel measured beyond
    noise, 1.2x, from the default, and at the end where timed measurements were taken on a busy
    machine, as a tune's summary warns). Ctrl-C or SIGTERM marks the study interrupted
    and raises SystemExit(130); a finished run marks it finished."""
    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.problems import GemmProblem
    from zhantune.problems.gemm import OPS

    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    study_id = store.study_id(study_name, config)
    earlier = len(store.timed_conditions(study_id))  # an earlier replay of a table of this name, this device
    try:
        for row, cands in work:
            problem = GemmProblem.from_config(row.op, [row.shape[d] for d in OPS[row.op]], row.dtype, row.activation,
                                              weight_layout=row.weight_layout)
            bench_ = InductorBenchmarker(problem, device, bench, seed=seed)
            rec = Recorder(store, problem, study_id, device_id, row.id, device)
            with interrupt.interruptible():
                default = bench_.inductor_default()
            default_row = rec.add(default, "default")
            report(problem.key, None, default)
            for cand in cands:
                with interrupt.interruptible():
                    meas = bench_.measure(cand)
                row = rec.add(meas, "candidate", cand)
                report(problem.key, cand, meas)
                if meas.ok and default.ok:
                    _settle(store, study_id, device_id, row, default_row, cand, bench_, rec, bench.remeasure_rounds,
                            say)
    except KeyboardInterrupt:
        store.finish_study(study_id, "interrupted")
        say(f"interrupted: study {study_name} marked interrupted; what was measured is stored, "
            "run the same command again to measure the table again")
        raise SystemExit(130) from None
    store.finish_study(study_id)
    busy = contention_count(store.timed_conditions(study_id)[earlier:]).text()
    if busy:  # as a tune's summary warns: the times above were taken so
        say(f"warning: {busy}")


def _settle(store: Store, study_id: int, device_id: int, row: Any, default_row: Any, cand: Candidate, bench: Any,
            rec: Recorder, rounds: int, say: Callable[[str], None]) -> None:
    """Settle one entry's speedup over the default (zhantune.bench.settle.settle_speedup) and store
    its verdict, the newest of that config on this device: the export and compare follow it, as they
    follow a rerun tune's. No verdict where no rounds ran (the default's own kernel, ``rounds`` 0):
    a replay that claims nothing leaves what the tunes settled as it was."""
    from zhantune.bench.decision import DEFAULT_MIN_SPEEDUP, claim_holds, decision_us
    from zhantune.bench.settle import is_default_kernel, settle_speedup
    from zhantune.provenance import software_versions
    from zhantune.report.summary import within_noise
    from zhantune.storage.queries import judged

    settled = settle_speedup(row, default_row, (), bench, rec.add, rounds, cand, earlier=(row, default_row),
                             other_runs=lambda method: rec.other_runs(row, method))
    v = settled.verdict
    before = None
    if v.rounds:
        before = store.latest_verdicts(software_versions()["torch"]).get((device_id, row.problem_id, cand.config_hash))
        store.add_verdict(study_id=study_id, device_id=device_id, problem_id=row.problem_id,
                          config_hash=cand.config_hash, ratio=v.ratio, ratio_low=v.ratio_low, ratio_high=v.ratio_high,
                          rounds=v.rounds, contended=v.contended, confirmed=v.confirmed, reason=v.reason)
    floor = DEFAULT_MIN_SPEEDUP  # as a tune's summary says it: a confirmed claim under the floor does not ship
    below = (f"; below export.min_speedup ({floor} by default): the export ships Inductor's default for it"
             if v.confirmed and v.ratio is not None and v.ratio < floor else "")
    say(f"    {settled.text or v.reason}{below}")
    if judged(before) and claim_holds(before) and not v.confirmed:
        say(f"    the claim stored before ({before.ratio:.2f}x confirmed in {before.rounds} rounds) "
            + ("stands: rounds of fewer than two or on a busy machine neither confirm nor refute it"
               if not judged(v) else "is replaced by this one, which the export and compare follow"))
    if is_default_kernel(row):  # one kernel twice: a gap beyond noise is not a speedup (a tune's summary says so too)
        default_us, entry_us = decision_us(settled.default), decision_us(row)
        if not within_noise(default_us / entry_us):
            say(f"    warning: this entry is the default's own kernel, yet the default's fastest run took "
                f"{default_us:,.1f} us and this entry's {entry_us:,.1f} us (default / entry {default_us / entry_us:.2f}x); "
                "the timing was disturbed, or this entry's compile does not run what the default's runs; not a speedup")
