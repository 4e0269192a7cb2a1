"""From a benchmark's Measurement to a measurement row: one mapping, used by every writer (the
tune, the table replay, the Kernel Tuner import), so that every row carries the same columns.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Any

from zhantune import interrupt
from zhantune.storage import orm as m

if TYPE_CHECKING:
    from zhantune.bench.measurement import Measurement
    from zhantune.candidate import Candidate
    from zhantune.device import DeviceInfo
    from zhantune.storage.store import Store

__all__ = ["measurement_row", "Recorder"]


def measurement_row(meas: Measurement, kind: str, candidate: Candidate | None = None, *, study_id: int,
                    device_id: int, problem_id: int, torch_version: str, triton_version: str | None,
                    environment_id: int | None = None, trial_number: int | None = None, problem: Any = None,
                    conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The columns of one measurement row (zhantune.storage.orm.MeasurementRow) for ``meas``.

    ``kind``: eager, default, default_unfrozen, candidate or remeasure; ``candidate`` None for a
    baseline. Timings (microseconds: median, min, max, 20th/80th percentiles, mean, std, IQR, CV and
    the number of runs) are set where ``meas`` has a timing, with TFLOP/s from ``problem.tflops``
    when a ``problem`` is given. ``conditions`` (the machine while it was timed,
    zhantune.bench.conditions) is stored with its contended flag where given (None: recorded data,
    measured elsewhere). A non-finite error (NaN output) is stored as NULL."""
    t = meas.timing
    fields: dict[str, Any] = dict(
        study_id=study_id, device_id=device_id, problem_id=problem_id, environment_id=environment_id,
        trial_number=trial_number, kind=kind, status=meas.status,
        branch=candidate.branch if candidate else None,
        template_id=candidate.template_id if candidate else None,
        params=candidate.params if candidate else {},
        config_hash=candidate.config_hash if candidate else None,
        template_hash=meas.template_hash,
        lookup_key=meas.lookup.device_key if meas.lookup else None,
        error=meas.error if meas.error is not None and math.isfinite(meas.error) else None,
        error_text=meas.error_text, compile_s=meas.compile_s,
        torch_version=torch_version, triton_version=triton_version,
    )
    if t is not None:
        fields.update(median_us=t.median_us, min_us=t.min_us, max_us=t.max_us, p20_us=t.p20_us,
                      p80_us=t.p80_us, n=t.n, timing_method=t.method, mean_us=t.mean_us, std_us=t.std_us,
                      iqr_us=t.iqr_us, cv=t.cv,
                      tflops=problem.tflops(t.median_us) if problem is not None and t.median_us > 0 else None)
        if conditions is not None:
            from zhantune.bench.conditions import is_contended

            fields.update(conditions=conditions, contended=is_contended(conditions))
    return fields


class Recorder:
    """Stores a run's Measurements as rows of one (study, device, problem), one commit per row, with
    this process's software versions and environment (zhantune.provenance)."""

    def __init__(self, store: Store, problem: Any, study_id: int, device_id: int, problem_id: int,
                 device: DeviceInfo | None = None):
        """``problem``: a GemmProblem or a replayed problem (its ``tflops``); ``device``: the device
        measured on here (its conditions are recorded with every timed row); None for recorded data
        (replay), which was measured elsewhere."""
        from zhantune.provenance import environment_fields, software_versions

        self.store, self.problem, self.study_id = store, problem, study_id
        self.device_kind = device.kind if device is not None else None
        self.device_index = device.index if device is not None else None
        self.device_id, self.problem_id = device_id, problem_id
        self.versions = software_versions()
        self.environment_id = store.environment_id(environment_fields())
        #: the ids of the rows stored through this Recorder: this run's own measurements
        self.stored_ids: set[int] = set()
        #: this run, in every timed row's conditions (``run``): Store.other_runs_of_pair tells runs apart by it
        self.run_id = uuid.uuid4().hex

    def add(self, meas: Measurement, kind: str, candidate: Candidate | None = None,
            trial_number: int | None = None, claimed: bool = False) -> m.MeasurementRow:
        """Store one row and return it (with its id). ``claimed``: a claimed candidate's row, stored
        only while the claim is still this worker's (Store.add_measurement; else ClaimLost)."""
        seen = None
        if self.device_kind is not None and meas.timing is not None:
            from zhantune.bench.conditions import conditions

            # as the timing process saw it (with the back-off's wait), else a snapshot here
            seen = {**(meas.conditions or conditions(self.device_kind, self.device_index)), "run": self.run_id}
        fields = measurement_row(meas, kind, candidate, study_id=self.study_id, device_id=self.device_id,
                                 problem_id=self.problem_id, environment_id=self.environment_id,
                                 trial_number=trial_number, torch_version=self.versions["torch"],
                                 triton_version=self.versions["triton"], problem=self.problem, conditions=seen)
        with interrupt.deferred():  # Ctrl-C never cuts a row's write in half
            row_id = self.store.add_measurement(claimed=claimed, **fields)
        self.stored_ids.add(row_id)
        return m.MeasurementRow(id=row_id, **fields)

    def other_runs(self, winner: Any, timing_method: str | None) -> list[tuple[float, float, Any, str]]:
        """Each other run on this machine with this software and ``timing_method`` that measured both
        Inductor's default and ``winner``'s config (a row) for this problem and device: (the default's
        fastest us, the config's fastest us, when, its study); Store.other_runs_of_pair."""
        return self.store.other_runs_of_pair(self.device_id, self.problem_id, self.environment_id,
                                             winner.config_hash, timing_method, self.run_id)
