"""The reads behind the reports, transfer and the importers: measured configs across devices,
neighbouring problems, studies by name.

Mixed into :class:`zhantune.storage.Store` (through zhantune.storage.queries.Queries). Rows come
back as SQLAlchemy rows with named columns (``row.min_us``), which
zhantune.bench.decision.decision_us and best_per_config read as they read measurement rows.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from zhantune.storage import orm as m

__all__ = ["ReportQueries", "MEASURED_KINDS", "TIME_COLUMNS"]

#: the measurement kinds that rank configs: search candidates and their re-measurements
MEASURED_KINDS = ("candidate", "remeasure")
_M = m.MeasurementRow
#: the columns that hold a time (microseconds) or a ratio of times: a positive, finite number or null
TIME_COLUMNS = (_M.median_us, _M.min_us, _M.max_us, _M.p20_us, _M.p80_us, _M.mean_us,
                m.Verdict.ratio, m.Verdict.ratio_low, m.Verdict.ratio_high)
#: above any time a run gives (microseconds: 30 years), below any float overflow
_MAX_TIME = 1e15


class ReportQueries:
    """Read queries for compare, transfer, the report's studies and the importers."""

    url: str
    session: Callable[[], AbstractContextManager[Session]]

    def bad_time(self) -> str | None:
        """The first stored time or ratio (:data:`TIME_COLUMNS`) that no zhantune run writes: zero,
        negative, infinite, NaN or text (a database edited or crafted elsewhere), as ``measurement
        12: min_us 0.0``; None when every one is a positive, finite number or null. One query per
        column: the readers (decision statistics, geometric means) need not check each row."""
        with self.session() as s:
            for col in TIME_COLUMNS:
                table = col.class_
                found = s.execute(select(table.id, col).where(col.is_not(None), ~((col > 0) & (col < _MAX_TIME)))
                                  .order_by(table.id).limit(1)).first()
                if found is not None:
                    what = "measurement" if table is _M else "verdict"
                    return f"{what} {found[0]}: {col.key} {found[1]!r}"
        return None

    def bad_stored_value(self) -> str | None:
        """The first JSON value that is not an object (or null) and, on SQLite, whose columns keep
        any value, that does not parse, or date that does not read as one, as ``measurement 1:
        params 'not json' is not a JSON object``; None when every one reads. No zhantune run writes
        them; an edited database did, and SQLAlchemy raised JSONDecodeError or ValueError, or a
        string in place of a mapping raised AttributeError, in the middle of a tune (after its study
        had been marked running) or a merge (a helper's finding). PostgreSQL's json type holds only
        valid JSON and its timestamps only dates: there the kind of each JSON value is checked."""
        from sqlalchemy import JSON, DateTime, String, cast, func, or_
        from sqlalchemy.exc import OperationalError

        sqlite = self.url.startswith("sqlite")
        with self.session() as s:
            for cls in (m.Device, m.Environment, m.Problem, m.Study, m.Claim, m.Verdict, _M):
                for col in cls.__table__.columns:
                    if isinstance(col.type, JSON) and sqlite:
                        bad, holds = or_(func.json_valid(col) == 0, func.json_type(col).not_in(("object", "null"))), \
                            "a JSON object"
                    elif isinstance(col.type, JSON):
                        bad, holds = func.json_typeof(col).not_in(("object", "null")), "a JSON object"
                    elif isinstance(col.type, DateTime) and sqlite:
                        bad, holds = func.julianday(col).is_(None), "a date"
                    else:
                        continue
                    try:
                        found = s.execute(select(cls.__table__.c.id, cast(col, String))
                                          .where(col.is_not(None), bad).order_by(cls.__table__.c.id).limit(1)).first()
                    except OperationalError:  # an SQLite built without its JSON functions: not checked
                        s.rollback()
                        continue
                    if found is not None:
                        what = cls.__tablename__.removeprefix("zt_")
                        return f"{what} {found[0]}: {col.key} {found[1]!r:.120} is not {holds}"
        return None

    def bad_recorded_version(self) -> str | None:
        """The first verdict whose torch or triton version is neither null nor one line of printable
        text (what no zhantune run writes; the export prints a claim's torch), as ``verdict 3:
        torch_version 5``; then the first measurement's (the export names the torch releases its
        candidates were measured with: a helper's, 2026-11-30); None when every one is."""
        import json

        def bad(value: Any) -> bool:
            return value is not None and not (isinstance(value, str) and value.isprintable())

        with self.session() as s:
            for vid, *values in s.execute(select(m.Verdict.id, m.Verdict.torch_version, m.Verdict.triton_version)
                                          .order_by(m.Verdict.id)):
                for name, value in zip(("torch_version", "triton_version"), values, strict=True):
                    if bad(value):
                        return f"verdict {vid}: {name} {json.dumps(value, default=repr)[:120]}"
            for name in ("torch_version", "triton_version"):  # each distinct value once: a large database
                column = getattr(_M, name)
                for value in s.scalars(select(column).distinct()):
                    if bad(value):
                        first = s.scalar(select(func.min(_M.id)).where(column == value))
                        return f"measurement {first}: {name} {json.dumps(value, default=repr)[:120]}"
        return None

    def config_rows(self, device_ids: list[int], kinds: tuple[str, ...]) -> list[Row[Any]]:
        """Every measurement of ``kinds`` on the devices ``device_ids``, one row each with
        ``problem_id``, ``device_id``, ``kind``, ``status``, ``config_hash``, ``template_id``,
        ``params``, ``median_us``, ``min_us`` (microseconds), ``timing_method``, ``torch_version`` and ``id``."""
        with self.session() as s:
            return list(s.execute(
                select(_M.problem_id, _M.device_id, _M.kind, _M.status, _M.config_hash, _M.template_id, _M.params,
                       _M.median_us, _M.min_us, _M.timing_method, _M.torch_version, _M.id)
                .where(_M.device_id.in_(device_ids), _M.kind.in_(kinds))))

    def problems(self, ids: list[int]) -> dict[int, m.Problem]:
        """The problem rows with these ids, by id."""
        with self.session() as s:
            return {p.id: p for p in s.scalars(select(m.Problem).where(m.Problem.id.in_(ids)))}

    def problems_by_lookup_key(self) -> dict[str, list[m.Problem]]:
        """Problem rows that recorded Inductor's device-agnostic lookup key, by that key (several
        problems share one: an addmm and a linear_act of its shape on CPU), oldest first."""
        out: dict[str, list[m.Problem]] = {}
        with self.session() as s:
            for p in s.scalars(select(m.Problem).order_by(m.Problem.id)):
                if p.lookup_key:
                    out.setdefault(p.lookup_key, []).append(p)
        return out

    def branch_names(self, problem_id: int) -> dict[str, str]:
        """The branch of the space each config of this problem was measured under, by config hash
        (candidates, first measured first): a search's name (``aten``, ``cpp_gemm``) over a table
        replay's (``table``), which has the same config hash."""
        with self.session() as s:
            rows = s.execute(select(_M.config_hash, _M.branch)
                             .where(_M.problem_id == problem_id, _M.kind == "candidate", _M.branch.is_not(None))
                             .order_by(_M.id))
            out: dict[str, str] = {}
            for config_hash, branch in rows:
                if out.get(config_hash) in (None, "table"):
                    out[config_hash] = branch
            return out

    def study_names(self) -> set[str]:
        """The names of zhantune's studies (Optuna's own are listed by Optuna)."""
        with self.session() as s:
            return set(s.scalars(select(m.Study.name)))

    def study_candidates(self, name: str) -> list[m.MeasurementRow]:
        """The candidate rows of the study called ``name``, by trial number (a Kernel Tuner import:
        the file's order), rows without one (merged from a diverged study) last on every database."""
        with self.session() as s:
            return list(s.scalars(select(_M).join(m.Study, _M.study_id == m.Study.id)
                                  .where(m.Study.name == name, _M.kind == "candidate")
                                  .order_by(_M.trial_number.is_(None), _M.trial_number, _M.id)))

    def device_properties(self, key: str) -> dict[str, Any]:
        """The stored properties of the device with this key ({} when there is none), e.g. a Kernel
        Tuner file's device's ``named_by`` (zhantune.bench.recorded.KernelTunerFile.device)."""
        with self.session() as s:
            return dict(s.scalar(select(m.Device.properties).where(m.Device.key == key)) or {})

    def timing_methods(self, device_key: str, problem_key: str) -> dict[str | None, int]:
        """Timing method -> how many ok rows of this problem on this device (any study) rank configs
        or the default (kinds ``candidate``, ``remeasure``, ``default``) were timed with it."""
        with self.session() as s:
            rows = s.execute(select(_M.timing_method, func.count()).join(m.Device, _M.device_id == m.Device.id)
                             .join(m.Problem, _M.problem_id == m.Problem.id)
                             .where(m.Device.key == device_key, m.Problem.key == problem_key, _M.status == "ok",
                                    _M.kind.in_((*MEASURED_KINDS, "default")))
                             .group_by(_M.timing_method)).all()
        return {method: n for method, n in rows}

    def studies_holding(self, device_key: str, problem_key: str | None) -> list[tuple[str, dict[str, Any] | None]]:
        """(name, config) of every study with measurements of this problem (None: of any problem) on
        this device."""
        with self.session() as s:
            # a subquery: PostgreSQL has no DISTINCT over the JSON config column
            ids = (select(_M.study_id).join(m.Device, _M.device_id == m.Device.id)
                   .join(m.Problem, _M.problem_id == m.Problem.id)
                   .where(m.Device.key == device_key, *([] if problem_key is None else [m.Problem.key == problem_key])))
            return [(name, config) for name, config in
                    s.execute(select(m.Study.name, m.Study.config).where(m.Study.id.in_(ids)))]

    # -- transfer (zhantune.search.transfer) ---------------------------------------------------
    def measured_configs(self, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], list[Row[Any]]]:
        """Candidate and re-measure rows with a config of each (device id, problem id) in ``pairs``:
        ``config_hash``, ``status``, ``min_us``, ``median_us``, ``timing_method``, ``id``."""
        out: dict[tuple[int, int], list[Row[Any]]] = {}
        if not pairs:
            return out
        wanted = set(pairs)
        with self.session() as s:
            q = (select(_M.device_id, _M.problem_id, _M.config_hash, _M.status, _M.min_us, _M.median_us,
                        _M.timing_method, _M.id)
                 .where(_M.device_id.in_({d for d, _ in pairs}), _M.problem_id.in_({p for _, p in pairs}),
                        _M.kind.in_(MEASURED_KINDS), _M.config_hash.is_not(None)))
            for row in s.execute(q):
                if (row.device_id, row.problem_id) in wanted:
                    out.setdefault((row.device_id, row.problem_id), []).append(row)
        return out

    def other_devices(self, problem_key: str, device_key: str,
                      kind: str | None = None) -> tuple[int | None, list[tuple[int, str]]]:
        """(the problem's id, [(device id, key), ...] of the other devices of ``kind`` (None: any)
        that measured it, by key); devices with an empty key (an older import of files without a
        device name) are left out."""
        with self.session() as s:
            problem = s.scalar(select(m.Problem).where(m.Problem.key == problem_key))
            if problem is None:
                return None, []
            q = (select(m.Device.id, m.Device.key)
                 .join(_M, _M.device_id == m.Device.id)
                 .where(_M.problem_id == problem.id, m.Device.key != device_key, m.Device.key != "")
                 .distinct().order_by(m.Device.key))
            if kind is not None:
                q = q.where(m.Device.kind == kind)
            return problem.id, [(did, key) for did, key in s.execute(q)]

    def neighbour_problems(self, device_key: str, fields: dict[str, Any],
                           problem_key: str) -> tuple[int | None, list[m.Problem]]:
        """(the device's id, the problems other than ``problem_key`` measured on it with the same op,
        dtype, weight layout and activation as ``fields``, a problem row's columns)."""
        with self.session() as s:
            device = s.scalar(select(m.Device).where(m.Device.key == device_key))
            if device is None:
                return None, []
            # problems with measurements here (a subquery: PostgreSQL has no DISTINCT over a JSON column)
            measured = select(_M.problem_id).where(_M.device_id == device.id, _M.kind.in_(MEASURED_KINDS))
            q = select(m.Problem).where(m.Problem.id.in_(measured), m.Problem.key != problem_key,
                                        m.Problem.op == fields["op"], m.Problem.dtype == fields["dtype"],
                                        m.Problem.weight_layout == fields["weight_layout"])
            if fields["activation"] is None:
                q = q.where(m.Problem.activation.is_(None))
            else:
                q = q.where(m.Problem.activation == fields["activation"])
            return device.id, list(s.scalars(q))
