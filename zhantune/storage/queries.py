"""The reads behind a tune, an export and a resume: rankings, baselines, cache hits, verdicts.

Mixed into :class:`zhantune.storage.Store`, which gives the session. Every ranking follows one
rule (zhantune.bench.decision.best_per_config): rows are ranked by the decision statistic and a
config measured several times counts with its row with the lowest one.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from zhantune.bench.conditions import disturbs_claim
from zhantune.bench.decision import best_per_config, decision_us, decision_value, rank_key, timing_kind
from zhantune.errors import StorageError, shown
from zhantune.provenance import torch_release
from zhantune.storage import orm as m
from zhantune.storage.engine import redact_url
from zhantune.storage.reads import ReportQueries

__all__ = ["Queries"]


#: a config's own failures (Store.incorrect_configs): not "crashed" (its worker was killed) nor
#: "not_applied" (the template is not offered there: a table's entry is reported stale)
FAILED_STATUSES = ("compile_error", "runtime_error", "timeout")


class Queries(ReportQueries):
    """Read queries of a Store (each in its own session; rows come back detached)."""

    url: str
    session: Callable[[], AbstractContextManager[Session]]

    def refuse_other_kind(self, key: str, kind: str) -> None:
        """Raise StorageError as :meth:`device_id` would (without writing) for a key of another kind."""
        with self.session() as s:
            stored = s.scalar(select(m.Device.kind).where(m.Device.key == key))
        if stored is not None and stored != kind:
            raise StorageError(self._other_kind(key, stored, kind))

    def _other_kind(self, key: str, stored: str, kind: str) -> str:
        return (f"device {shown(key, 120)} is a {stored} device in {redact_url(self.url)}, not a {kind} one; give the "
                "device another name (a Kernel Tuner import's devices=[...], a replay's bench.device_name=NAME)")

    def devices(self) -> list[m.Device]:
        """Every device in the database, by key (the order ``python -m zhantune.export`` numbers
        them in)."""
        with self.session() as s:
            return list(s.scalars(select(m.Device).order_by(m.Device.key)))

    def study(self, name: str) -> m.Study | None:
        """The study row called ``name``, if any (read only: Store.study_id reopens it)."""
        with self.session() as s:
            return s.scalar(select(m.Study).where(m.Study.name == name))

    def problems_by_key(self) -> dict[str, m.Problem]:
        """Every problem row by its key."""
        with self.session() as s:
            return {p.key: p for p in s.scalars(select(m.Problem))}

    def config_lookup(self, problem_id: int, config_hash: str, torch_version: str | None = None,
                      device_ids: list[int] | None = None) -> tuple[m.Device, m.MeasurementRow] | None:
        """A correct measurement of this config for this problem that recorded Inductor's lookup
        key (the key its template hit), with its device; None when there is none. ``torch_version``:
        of a build of that release (a key is a release's); ``device_ids``: on one of those devices."""
        r = m.MeasurementRow
        q = (select(m.Device, r).join(m.Device, m.Device.id == r.device_id)
             .where(r.problem_id == problem_id, r.config_hash == config_hash, r.status == "ok", r.lookup_key.is_not(None)))
        if torch_version is not None:
            q = q.where(_same_release(r.torch_version, torch_version))
        if device_ids is not None:
            q = q.where(r.device_id.in_(device_ids))
        with self.session() as s:
            row = s.execute(q.order_by(r.id).limit(1)).first()
            return None if row is None else (row[0], row[1])

    def config_best(self, device_id: int, problem_id: int, config_hash: str | None) -> m.MeasurementRow | None:
        """The fastest correct row (candidate or re-measurement; zhantune.bench.decision.rank_key) of
        one config for one problem on one device; None when there is none."""
        with self.session() as s:
            rows = list(s.scalars(select(m.MeasurementRow).where(
                m.MeasurementRow.device_id == device_id, m.MeasurementRow.problem_id == problem_id,
                m.MeasurementRow.config_hash == config_hash, m.MeasurementRow.status == "ok",
                m.MeasurementRow.kind.in_(("candidate", "remeasure")), m.MeasurementRow.median_us.is_not(None))))
            return min(rows, key=rank_key, default=None)

    def other_runs_of_pair(self, device_id: int, problem_id: int, environment_id: int, config_hash: str | None,
                           timing_method: str | None, run: str) -> list[tuple[float, float, dt.datetime, str]]:
        """Each other run that measured both Inductor's default compile (kind ``default``) and the config
        ``config_hash`` (kinds ``candidate``, ``remeasure``) ok and undisturbed (not taken on a busy
        machine, zhantune.bench.conditions.disturbs_claim: the rounds do not trust such a row either), for
        this problem on this device, with ``environment_id`` (the same host and software,
        zhantune.provenance.environment_fields) and ``timing_method``'s kind
        (zhantune.bench.decision.timing_kind: FIFO or not, a CUDA graph's batch aside), any study: (the
        default's fastest, the config's fastest, in microseconds, zhantune.bench.decision.decision_value;
        when that run stored its first of them; its study's name). A run is a Recorder's
        (``conditions.run``, zhantune.storage.Recorder; rows stored before 2026-11-30 have none and are
        left out), ``run`` is this one's. Oldest first (zhantune.bench.decision.against_other_runs)."""
        r = m.MeasurementRow
        run_of = r.conditions["run"].as_string()
        with self.session() as s:
            rows = s.execute(select(run_of, r.kind, r.min_us, r.median_us, r.timing_method, r.created_at, r.conditions,
                                    r.contended, m.Study.name).join(m.Study, r.study_id == m.Study.id).where(
                r.device_id == device_id, r.problem_id == problem_id, r.environment_id == environment_id,
                r.status == "ok", r.median_us.is_not(None),
                or_(r.kind == "default", (r.config_hash == config_hash) & r.kind.in_(("candidate", "remeasure"))),
                run_of.is_not(None), run_of != run).order_by(r.id)).all()
        runs: dict[str, list[Any]] = {}
        for row in rows:
            if timing_kind(row.timing_method) != timing_kind(timing_method) or disturbs_claim(
                    row.conditions, row.contended, row.timing_method):
                continue
            us = decision_value(row.min_us, row.median_us, row.timing_method)
            got = runs.setdefault(row[0], [math.inf, math.inf, row.created_at, row.name])
            side = 0 if row.kind == "default" else 1
            got[side] = min(got[side], us)
        return [(d, w, at, study) for d, w, at, study in runs.values() if d < math.inf and w < math.inf]

    def count_measurements(self, study_id: int) -> int:
        """How many measurement rows a study holds (every kind)."""
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(m.MeasurementRow)
                            .where(m.MeasurementRow.study_id == study_id)) or 0

    def stored_baselines(self, study_id: int, device_id: int, problem_key: str, torch_version: str,
                         triton_version: str | None) -> dict[str, m.MeasurementRow]:
        """The newest baselines a study stored for this device and problem, measured with these
        torch and triton versions: {kind: row} with the newest ``eager`` row and the first row of
        each other baseline kind after it (``default``, on CPU ``default_unfrozen``: they are stored
        together, before any speedup re-measurement of the default), except that ``default`` is the
        fastest ok one of every run's (zhantune.bench.decision.rank_key: the paired rounds of earlier
        runs too, as the summary's "its fastest run" says; a rerun showed a slower default than the
        run before it, a newcomer's finding). Empty when there is no such set or its eager or first
        default measurement is not ``ok`` (zhantune.tune then measures them)."""
        from zhantune.bench.decision import rank_key

        with self.session() as s:
            mine = (select(m.MeasurementRow).join(m.Problem, m.MeasurementRow.problem_id == m.Problem.id)
                    .where(m.MeasurementRow.study_id == study_id, m.MeasurementRow.device_id == device_id,
                           m.Problem.key == problem_key, m.MeasurementRow.trial_number.is_(None),
                           m.MeasurementRow.torch_version == torch_version,
                           m.MeasurementRow.triton_version.is_not_distinct_from(triton_version)))
            eager = s.scalar(mine.where(m.MeasurementRow.kind == "eager").order_by(m.MeasurementRow.id.desc()).limit(1))
            if eager is None:
                return {}
            rows = {"eager": eager}
            later = mine.where(m.MeasurementRow.id > eager.id,
                               m.MeasurementRow.kind.not_in(("eager", "candidate", "remeasure")))
            for row in s.scalars(later.order_by(m.MeasurementRow.id)):
                first = rows.setdefault(row.kind, row)
                if row.kind == "default" and "ok" == first.status == row.status and rank_key(row) < rank_key(first):
                    rows["default"] = row
        if rows.get("default") is None or any(r.status != "ok" for r in (rows["eager"], rows["default"])):
            return {}
        return rows

    def measurements(self, study_id: int | None = None) -> list[m.MeasurementRow]:
        """Every measurement row (of one study), oldest first."""
        with self.session() as s:
            q = select(m.MeasurementRow).order_by(m.MeasurementRow.id)
            if study_id is not None:
                q = q.where(m.MeasurementRow.study_id == study_id)
            return list(s.scalars(q))

    def cached(self, device_id: int, problem_id: int, config_hash: str, torch_version: str,
               triton_version: str | None, study_id: int | None = None) -> m.MeasurementRow | None:
        """A finished measurement of the same candidate, device, problem and software versions (of
        one study only where ``study_id`` is given: a replay's rows are its file's)."""
        with self.session() as s:
            q = select(m.MeasurementRow).where(
                m.MeasurementRow.device_id == device_id,
                m.MeasurementRow.problem_id == problem_id,
                m.MeasurementRow.config_hash == config_hash,
                m.MeasurementRow.kind == "candidate",
                m.MeasurementRow.torch_version == torch_version,
                m.MeasurementRow.triton_version == triton_version,
            )
            if study_id is not None:
                q = q.where(m.MeasurementRow.study_id == study_id)
            return s.scalar(q.order_by(m.MeasurementRow.id))

    def best_candidates(self, device_key: str | None = None,
                        study_id: int | None = None) -> list[tuple[m.Device, m.Problem, m.MeasurementRow]]:
        """Fastest config per (device, problem), ranked as :meth:`ranked_candidates` ranks them."""
        return [(dev, prob, rows[0]) for dev, prob, rows in self.ranked_candidates(device_key, study_id=study_id)]

    def ranked_candidates(self, device_key: str | None = None, torch_version: str | None = None,
                          top_k: int = 1, study_id: int | None = None) -> list[tuple[m.Device, m.Problem, list[m.MeasurementRow]]]:
        """Per (device, problem): the ``top_k`` fastest distinct configs, fastest first.

        Rows are ``ok`` candidates and close-call re-measurements (kind ``remeasure``), ranked by
        the decision statistic (zhantune.bench.decision.decision_us: the minimum of a measurement's individually
        timed runs, which one-sided noise cannot make smaller than the truth). A config measured
        several times is represented by its row with the lowest decision statistic (the minimum over
        rounds; docs/timing.md). A config with an ``incorrect`` row on the device (a wrong output
        there once, in any run or merged database: :meth:`incorrect_configs`) is never ranked, however
        many ``ok`` rows it has. ``torch_version`` keeps only rows measured with a build of that torch
        release (e.g. "2.13.0+cpu": "2.13.0", "2.13.0+cu128", ...; zhantune.provenance.torch_release),
        and only that release's ``incorrect`` rows exclude a config. ``study_id`` keeps only that study's rows (a replay's best
        is its own file's, not another recording's of the same device and problem).
        """
        wrong = self.incorrect_configs(torch_version)
        with self.session() as s:
            q = (select(m.MeasurementRow, m.Device, m.Problem)
                 .join(m.Device, m.MeasurementRow.device_id == m.Device.id)
                 .join(m.Problem, m.MeasurementRow.problem_id == m.Problem.id)
                 .where(m.MeasurementRow.kind.in_(("candidate", "remeasure")), m.MeasurementRow.status == "ok",
                        m.MeasurementRow.median_us.is_not(None))
                 .order_by(m.MeasurementRow.median_us, m.MeasurementRow.id))
            if device_key is not None:
                q = q.where(m.Device.key == device_key)
            if torch_version is not None:
                q = q.where(_same_release(m.MeasurementRow.torch_version, torch_version))
            if study_id is not None:
                q = q.where(m.MeasurementRow.study_id == study_id)
            groups: dict[tuple[int, int], tuple[m.Device, m.Problem, list[m.MeasurementRow]]] = {}
            for meas, dev, prob in s.execute(q):
                if dev.id in wrong.get((prob.id, meas.config_hash), {}):
                    continue
                groups.setdefault((dev.id, prob.id), (dev, prob, []))[2].append(meas)
            return [(dev, prob, best_per_config(rows)[:top_k]) for dev, prob, rows in groups.values()]

    def incorrect_configs(self, torch_version: str | None = None,
                          failed_too: bool = False) -> dict[tuple[int, str], dict[int, str]]:
        """(problem id, config hash) -> {device id: device kind} of every device where that config's
        output was wrong at least once (a candidate or re-measurement row, a table replay's too, of
        status ``incorrect``: a mismatch with the float64 reference, or NaN/Inf; zhantune.bench.inductor);
        ``failed_too``: also where it failed otherwise (:data:`FAILED_STATUSES`: a compile or runtime
        error, a timeout; not a killed worker's ``crashed`` nor a template ``not_applied``) and was
        never measured ``ok``. ``torch_version``: only rows measured with a build of that torch release
        (None: every row)."""
        r = m.MeasurementRow
        q = (select(r.problem_id, r.config_hash, r.device_id, m.Device.kind, r.status)
             .join(m.Device, r.device_id == m.Device.id)
             .where(r.config_hash.is_not(None), r.kind.in_(("candidate", "remeasure"))))
        if torch_version is not None:
            q = q.where(_same_release(r.torch_version, torch_version))
        q = q.where(r.status.in_(("incorrect", "ok", *FAILED_STATUSES) if failed_too else ("incorrect",)))
        seen: dict[tuple[int, str, int], tuple[str, set[str]]] = {}
        with self.session() as s:
            for pid, chash, dev, kind, status in s.execute(q):
                seen.setdefault((pid, chash, dev), (kind, set()))[1].add(status)
        out: dict[tuple[int, str], dict[int, str]] = {}
        for (pid, chash, dev), (kind, statuses) in seen.items():
            if "incorrect" in statuses or "ok" not in statuses:
                out.setdefault((pid, chash), {})[dev] = kind
        return out

    def has_candidates(self, device_key: str, problem_key: str, torch_version: str) -> bool:
        """Whether the device holds a candidate row of the problem (any status) measured with a build
        of ``torch_version``'s release."""
        r = m.MeasurementRow
        with self.session() as s:
            return s.scalar(select(r.id).join(m.Device, r.device_id == m.Device.id).join(m.Problem, r.problem_id == m.Problem.id)
                            .where(m.Device.key == device_key, m.Problem.key == problem_key, r.kind == "candidate",
                                   _same_release(r.torch_version, torch_version)).limit(1)) is not None

    def devices_with_candidates(self, device_key: str | None = None, torch_version: str | None = None) -> list[m.Device]:
        """Devices that have at least one ``ok`` candidate (optionally only ``device_key``; measured with a
        build of ``torch_version``'s release, as :meth:`ranked_candidates` ranks them), by key."""
        with self.session() as s:
            has_ok = (select(m.MeasurementRow.id)
                      .where(m.MeasurementRow.device_id == m.Device.id, m.MeasurementRow.status == "ok",
                             m.MeasurementRow.kind.in_(("candidate", "remeasure")),
                             *([_same_release(m.MeasurementRow.torch_version, torch_version)] if torch_version else []))
                      .exists())
            q = select(m.Device).where(has_ok).order_by(m.Device.key)
            if device_key is not None:
                q = q.where(m.Device.key == device_key)
            return list(s.scalars(q))

    def candidate_torch_releases(self, device_key: str | None = None) -> list[str]:
        """The torch releases (zhantune.provenance.torch_release) of the ``ok`` candidates measured
        for problems with an Inductor lookup key (not imports or replays; on ``device_key``; None: any
        device), sorted: what an export's ``torch_version`` can name."""
        with self.session() as s:
            q = (select(m.MeasurementRow.torch_version).distinct()
                 .join(m.Problem, m.MeasurementRow.problem_id == m.Problem.id)
                 .where(m.MeasurementRow.status == "ok", m.MeasurementRow.kind.in_(("candidate", "remeasure")),
                        m.MeasurementRow.torch_version.is_not(None), m.Problem.lookup_key.is_not(None)))
            if device_key is not None:
                q = q.join(m.Device, m.MeasurementRow.device_id == m.Device.id).where(m.Device.key == device_key)
            return sorted({torch_release(v) for v in s.scalars(q)})

    def timed_conditions(self, study_id: int) -> list[tuple[dict[str, Any] | None, bool | None, str | None]]:
        """(conditions, contended, timing_method) of every timed row of a study, oldest first
        (zhantune.bench.conditions.ContentionCount sums them)."""
        with self.session() as s:
            rows = s.execute(select(m.MeasurementRow.conditions, m.MeasurementRow.contended, m.MeasurementRow.timing_method)
                             .where(m.MeasurementRow.study_id == study_id, m.MeasurementRow.timing_method.is_not(None))
                             .order_by(m.MeasurementRow.id))
            return [tuple(r) for r in rows]

    def default_times_us(self, torch_version: str | None = None) -> dict[tuple[int, int], float]:
        """(device id, problem id) -> Inductor's default compile time in us: the decision statistic
        (zhantune.bench.decision.decision_us) of its lowest ``ok`` row, as :meth:`ranked_candidates`
        represents a config measured several times (zhantune.bench.settle.settle_speedup adds rows)."""
        with self.session() as s:
            q = (select(m.MeasurementRow.device_id, m.MeasurementRow.problem_id, m.MeasurementRow.min_us,
                        m.MeasurementRow.median_us, m.MeasurementRow.timing_method, m.MeasurementRow.id,
                        m.MeasurementRow.config_hash)
                 .where(m.MeasurementRow.kind == "default", m.MeasurementRow.status == "ok",
                        m.MeasurementRow.median_us.is_not(None)))
            if torch_version is not None:
                q = q.where(m.MeasurementRow.torch_version == torch_version)
            rows: dict[tuple[int, int], list[Any]] = {}
            for row in s.execute(q):
                rows.setdefault((row.device_id, row.problem_id), []).append(row)
        return {key: decision_us(best_per_config(rs)[0]) for key, rs in rows.items()}

    # -- verdicts ---------------------------------------------------------------------------
    def default_lookup_keys(self, torch_version: str | None = None) -> dict[tuple[int, int], str]:
        """(device id, problem id) -> the device-specific key of the lookup Inductor's default compile
        made there (newest default row that recorded one): the problem's own key on that device.
        ``torch_version``: the newest row of a build of that release where there is one (a lookup key
        is a release's), else the newest of any."""
        r = m.MeasurementRow
        with self.session() as s:
            rows = s.execute(select(r.device_id, r.problem_id, r.lookup_key,
                                    _same_release(r.torch_version, torch_version) if torch_version else r.id < 0)
                             .where(r.kind == "default", r.lookup_key.is_not(None)).order_by(r.id))
            any_torch, same = {}, {}
            for d, p, key, this in rows:
                any_torch[(d, p)] = key
                if this:
                    same[(d, p)] = key
            return {**any_torch, **same}

    def study_verdict(self, study_id: int) -> m.Verdict | None:
        """The newest verdict a study's tunes stored (paired or a note that no claim was made), or None."""
        with self.session() as s:
            return s.scalars(select(m.Verdict).where(m.Verdict.study_id == study_id)
                             .order_by(m.Verdict.created_at.desc(), m.Verdict.id.desc()).limit(1)).first()

    def rounds_unchecked_for_waiting(self, verdict: m.Verdict) -> bool:
        """Whether a verdict's rounds (the newest ``rounds`` CPU-timed paired-round measurements of its
        config in its study, kind ``remeasure``, stored no later than the verdict) include one timed
        before zhantune read how long the timed runs' threads waited for a core (2026-11-29: its
        conditions have no ``timed_ms``, zhantune.bench.conditions.run_queue_wait), so that a claim
        confirmed from them was not checked for a real-time busy loop sharing the cores. CUDA rows
        are never read so (their timing waits on the GPU), and rows of a later, interrupted settle
        are not the verdict's."""
        r = m.MeasurementRow
        with self.session() as s:
            rows = s.scalars(select(r.conditions).where(
                r.study_id == verdict.study_id, r.config_hash == verdict.config_hash, r.kind == "remeasure",
                r.timing_method.like("cpu:%"), r.created_at <= verdict.created_at)
                .order_by(r.created_at.desc(), r.id.desc()).limit(verdict.rounds or 0))
            return any(not c or "timed_ms" not in c for c in rows)

    def latest_verdicts(self, torch_version: str | None = None) -> dict[tuple[int, int, str | None], m.Verdict]:
        """(device id, problem id, config hash) -> the newest verdict on that config's speedup over
        Inductor's default (a tune or a table's replay settles it): the newest judged one, settled in at
        least two paired rounds (what a claim needs, zhantune.bench.decision) none of them contended,
        where there is one, so that a later verdict of fewer rounds (a cached winner's "no claim
        made", ``bench.remeasure_rounds`` 0 or 1: one round can neither confirm a speedup nor refute
        one, one-sided noise makes a round slow) or of rounds on a busy machine (which say nothing
        either way: a helper's replay under load withdrew a confirmed claim from the export) never
        hides a judged claim; else the newest. Newest by
        created_at (a merged database's copied verdicts keep theirs), then id. ``torch_version``:
        only verdicts whose paired rounds ran with a build of that torch release (None: every verdict)."""
        query = select(m.Verdict).order_by(m.Verdict.created_at, m.Verdict.id)
        if torch_version is not None:
            query = query.where(_same_release(m.Verdict.torch_version, torch_version))
        with self.session() as s:
            out: dict[tuple[int, int, str | None], m.Verdict] = {}
            for v in s.scalars(query):
                key = (v.device_id, v.problem_id, v.config_hash)
                if judged(v) or key not in out or not judged(out[key]):
                    out[key] = v
            return out


def judged(v: m.Verdict | None) -> bool:
    """Whether a verdict judged its claim: two paired rounds or more, none contended (a confirmed one
    never is: zhantune.bench.decision), or none of which measured both sides (the entry failed: a
    review found such rounds, one side disturbed, counted as busy)."""
    return v is not None and (v.rounds or 0) >= 2 and (not v.contended or bool(v.confirmed) or v.ratio is None)


def _same_release(column: Any, version: str) -> Any:
    """``column`` (a torch version) names a build of ``version``'s release: the release itself or
    ``release+local``, never a source build's ``release+git...``, which is a release of its own
    (zhantune.provenance.torch_release)."""
    rel = torch_release(version)
    if "+" in rel:
        return column == rel
    # substr and =, not LIKE: SQLite's LIKE ignores case ('2.14.0A0+cpu', '+GIT...'; a review's)
    local = func.substr(column, len(rel) + 2, 3)
    return or_(column == rel, and_(func.substr(column, 1, len(rel) + 1) == rel + "+", local != "git"))
