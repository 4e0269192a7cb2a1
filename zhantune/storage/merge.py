"""Merge zhantune databases from several machines into one, without duplicates, provenance kept.

Rows are matched by their natural keys: device by ``key``, environment by ``fingerprint``, problem by
``key``, study by ``name`` and ``started_at`` (the same study, e.g. a database merged twice or workers
that shared it; a study renamed by an earlier merge, merged back where it ran, by its name before the
`` [from `` suffix and its start), measurement by (study, trial number, created_at, config hash), or,
for a row stored without its clashing trial number, by (study, created_at, config hash, kind, median
time). A study of the same name that started elsewhere is a different run: it is kept under
``<name> [from <source>]``, with its Optuna study copied under that name. Every copied measurement
keeps its created_at, versions and environment; every settled speedup claim (verdict, matched by
study, device, problem, config hash and created_at) is copied too, so that the merged database exports
what each source would (where two sources' verdicts on one config disagree, the newer one).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import optuna
from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from zhantune.quiet import quiet_optuna
from zhantune.storage import orm as m
from zhantune.storage.engine import optuna_reader, optuna_reads
from zhantune.storage.merge_checks import check_device_kinds, check_importable, check_recordings
from zhantune.storage.store import Store

__all__ = ["MergeStats", "merge_into", "check_importable", "check_recordings", "check_device_kinds"]

quiet_optuna()  # copy_study creates studies: Optuna would log each at INFO

_COPIED = [c.key for c in m.MeasurementRow.__table__.columns
           if c.key not in ("id", "study_id", "device_id", "problem_id", "environment_id")]
_VERDICT_COPIED = [c.key for c in m.Verdict.__table__.columns
                   if c.key not in ("id", "study_id", "device_id", "problem_id", "created_at")]


#: the environment columns its fingerprint is computed from (all but id, fingerprint, created_at)
_ENV_FIELDS = [c.key for c in m.Environment.__table__.columns if c.key not in ("id", "fingerprint", "created_at")]


@dataclass
class MergeStats:
    studies_new: int = 0
    studies_renamed: int = 0
    measurements_added: int = 0
    measurements_skipped: int = 0
    verdicts_added: int = 0


def _utc(t: dt.datetime | None) -> dt.datetime | None:
    """A stored time as an aware UTC time: SQLite gives naive ones (zhantune writes UTC), PostgreSQL
    aware ones in the session's time zone (its server's, e.g. Europe/Berlin): copied naive into a
    timestamptz column, a time would be read as that zone's, hours off."""
    if t is None:
        return None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def _as_naive(t: dt.datetime | None) -> dt.datetime | None:
    """A stored time in UTC without its zone: how a study's start and a row's creation are matched."""
    return _utc(t).replace(tzinfo=None) if t is not None else None


def merge_into(target: Store, source: Store, label: str) -> MergeStats:
    """Copy everything of ``source`` that ``target`` lacks; ``label`` names the source in renamed studies."""
    stats = MergeStats()
    has_optuna = "studies" in inspect(source.engine).get_table_names()
    with source.session() as s:
        devices = {d.id: d for d in s.scalars(select(m.Device))}
        envs = {e.id: e for e in s.scalars(select(m.Environment))}
        problems = {p.id: p for p in s.scalars(select(m.Problem))}
        studies = list(s.scalars(select(m.Study).order_by(m.Study.id)))
        rows = list(s.scalars(select(m.MeasurementRow).order_by(m.MeasurementRow.id)))
        verdicts = list(s.scalars(select(m.Verdict).order_by(m.Verdict.id)))
    dev_map = {i: target.device_id(d.key, d.name, d.kind, d.properties) for i, d in devices.items()}
    env_map = {i: target.environment_id({k: getattr(e, k) for k in _ENV_FIELDS}) for i, e in envs.items()}
    prob_map = {i: target.problem_id(p.key, op=p.op, shape=p.shape, dtype=p.dtype, activation=p.activation,
                                     weight_layout=p.weight_layout, lookup_op=p.lookup_op, lookup_key=p.lookup_key, flops=p.flops)
                for i, p in problems.items()}
    study_map: dict[int, int] = {}
    imported: set[int] = set()
    imported_on = {r.study_id: devices[r.device_id].key for r in rows}  # a study's device (an import has one)
    for st in studies:
        with target.session() as t:
            study_map[st.id], name, added = _target_study(t, st, label, imported_on.get(st.id))
            if not added and _imported(st) and _imported(t.get(m.Study, study_map[st.id])):
                imported.add(st.id)  # one file's import: its rows match by trial number and config
        if added and name == st.name:
            stats.studies_new += 1
        elif added:
            stats.studies_renamed += 1
        if has_optuna:  # else Optuna's storage would give the source its tables (a write)
            # every time, not only for a new study: an interrupted merge's half-copied study is completed
            _copy_optuna_study(source, target.url, st.name, name)
    with target.session() as t:
        M = m.MeasurementRow
        stored = list(t.execute(select(M.study_id, M.trial_number, M.created_at, M.config_hash, M.kind, M.median_us)))
        have = {(sid, n, _as_naive(c), h) for sid, n, c, h, _, _ in stored}
        # a row copied before with its trial number taken (stored without one) is the same row: a
        # second merge of that source, or this database merged back, added it again (a review)
        same_run = {(sid, _as_naive(c), h, kind, us) for sid, _, c, h, kind, us in stored}
        taken = {(sid, n) for sid, n, _, _ in have if n is not None}
        numbered = {(sid, n, h) for sid, n, _, h in have if n is not None}
        for r in rows:
            sid = study_map[r.study_id]
            if r.study_id in imported and (sid, r.trial_number, r.config_hash) in numbered:
                stats.measurements_skipped += 1  # the same file's row, imported at another time
                continue
            key = (sid, r.trial_number, _as_naive(r.created_at), r.config_hash)
            if key in have or (sid, key[2], r.config_hash, r.kind, r.median_us) in same_run:
                stats.measurements_skipped += 1
                continue
            fields = {k: getattr(r, k) for k in _COPIED}
            fields["created_at"] = _utc(r.created_at)
            if r.trial_number is not None and (sid, r.trial_number) in taken:
                fields["trial_number"] = None  # the same study diverged on two machines: keep the row
            t.add(m.MeasurementRow(study_id=sid, device_id=dev_map[r.device_id], problem_id=prob_map[r.problem_id],
                                environment_id=env_map.get(r.environment_id), **fields))
            have.add(key)
            same_run.add((sid, key[2], r.config_hash, r.kind, r.median_us))
            if fields["trial_number"] is not None:
                taken.add((sid, fields["trial_number"]))
            stats.measurements_added += 1
    _copy_verdicts(target, verdicts, study_map, dev_map, prob_map, stats)
    return stats


def _target_study(t: Session, st: m.Study, label: str, device_key: str | None = None) -> tuple[int, str, bool]:
    """(target study id, its name, whether it was added) for the source's study ``st``: the target's
    study of the same name and start (the same run, merged before or shared by workers), else one
    renamed ``<name> [from <label>]`` earlier with that start (whatever the label: one source's URL
    has many spellings), or for a Kernel Tuner import the target's import of the same file (sha256)
    on the same device (``device_key``: the source study's rows'), else a new study: ``st``'s name
    where free, else the renamed one (a number added where another run holds that name too; cut to
    the column's 512 characters). A matched study takes the source's end (status, finished_at) where
    the source's is the later."""
    start = _as_naive(st.started_at)
    same = t.scalar(select(m.Study).where(m.Study.name == st.name))
    base = st.name.split(" [from ", 1)[0]  # a copy renamed by an earlier merge: the run it was copied from
    original = t.scalar(select(m.Study).where(m.Study.name == base)) if base != st.name else None
    if original is not None and _as_naive(original.started_at) == start:  # merged back where it ran (a review)
        _take_end(original, st)
        return original.id, original.name, False
    if _imported(st) and device_key is not None:  # the same file imported in both, whatever its name: the same data
        held = list(t.scalars(select(m.MeasurementRow.study_id).distinct()
                              .join(m.Device, m.Device.id == m.MeasurementRow.device_id).where(m.Device.key == device_key)))
        same_file = next((c for c in (t.get(m.Study, i) for i in held)
                          if _imported(c) and c.config.get("sha256") == st.config.get("sha256")), None)
        if same_file is not None:
            _take_end(same_file, st)
            return same_file.id, same_file.name, False
    # a renamed copy starts with the name, or with its first half where the name was cut to fit
    renamed = t.scalars(select(m.Study).where(m.Study.name.startswith(st.name[:_NAME_MAX // 2], autoescape=True),
                                              m.Study.name.contains(" [from ", autoescape=True)))
    match = same if same is not None and _as_naive(same.started_at) == start else \
        next((c for c in renamed if _as_naive(c.started_at) == start), None)
    if match is not None:
        _take_end(match, st)
        return match.id, match.name, False
    name = st.name
    if same is not None:
        taken = set(t.scalars(select(m.Study.name).where(m.Study.name.contains(" [from ", autoescape=True),
                                                         m.Study.name.startswith(st.name[:_NAME_MAX // 2], autoescape=True))))
        for n in range(1, 1000):
            suffix = f" [from {label}]" if n == 1 else f" [from {label} #{n}]"
            name = st.name[:max(0, _NAME_MAX - len(suffix))] + suffix[:_NAME_MAX]
            if name not in taken and name != st.name:
                break
    row = m.Study(name=name, config=st.config, started_at=_utc(st.started_at), finished_at=_utc(st.finished_at),
                  status=st.status)
    t.add(row)
    t.flush()
    return row.id, name, True


def _take_end(match: m.Study, st: m.Study) -> None:
    """The target's study takes the source's end (status, finished_at) where the source's is later."""
    if st.finished_at is not None and (match.finished_at is None or _as_naive(match.finished_at) < _as_naive(st.finished_at)):
        match.status, match.finished_at = st.status, _utc(st.finished_at)


def _imported(st: m.Study | None) -> bool:
    """A Kernel Tuner file's import (zhantune.storage.ingest.import_kerneltuner: its config names the
    file's sha256); its rows are the file's, whenever and wherever it was imported."""
    config = st.config if st is not None else None
    return isinstance(config, dict) and config.get("format") == "kerneltuner" and isinstance(config.get("sha256"), str)


#: zt_study.name's length (and Optuna's study_name's)
_NAME_MAX = m.Study.__table__.c.name.type.length


def _copy_verdicts(target: Store, verdicts: list, study_map: dict[int, int], dev_map: dict[int, int],
                   prob_map: dict[int, int], stats: MergeStats) -> None:
    """The source's settled claims (the exporter ships a tuned entry only where one is confirmed:
    without them a merged database would fall back on unpaired statistics)."""
    with target.session() as t:
        have = {(sid, d, p, h, _as_naive(c)) for sid, d, p, h, c in t.execute(
            select(m.Verdict.study_id, m.Verdict.device_id, m.Verdict.problem_id, m.Verdict.config_hash,
                   m.Verdict.created_at))}
        for v in verdicts:
            ids = (study_map[v.study_id], dev_map[v.device_id], prob_map[v.problem_id])
            key = (*ids, v.config_hash, _as_naive(v.created_at))
            if key in have:
                continue
            t.add(m.Verdict(study_id=ids[0], device_id=ids[1], problem_id=ids[2],
                            **{k: getattr(v, k) for k in _VERDICT_COPIED}, created_at=_utc(v.created_at)))
            have.add(key)
            stats.verdicts_added += 1


def _copy_optuna_study(store: Store, target_url: str, name: str, new_name: str) -> None:
    """Copy the source's (``store``'s) Optuna study ``name`` to the target as ``new_name``; where the
    target holds it already as a prefix of the source's trials (a merge interrupted half way through
    copy_study, or an earlier copy of a study that went on), the missing trials are added. A target
    study whose trials differ from the source's (another lineage) is left as it is. The source's
    study is read whole first (engine.optuna_reads: its errors name the source, never the target's)."""
    with optuna_reads(store):
        reader = optuna_reader(store.url)  # a file this process may not write keeps no side files
        if name not in {s.study_name for s in optuna.get_all_study_summaries(reader, include_best_trial=False)}:
            return  # imported data has no Optuna study
        source = optuna.storages.InMemoryStorage()
        optuna.copy_study(from_study_name=name, from_storage=reader, to_storage=source)
    targets = {s.study_name for s in optuna.get_all_study_summaries(target_url, include_best_trial=False)}
    if new_name not in targets:
        optuna.copy_study(from_study_name=name, from_storage=source, to_storage=target_url,
                          to_study_name=new_name)
        return
    src = optuna.load_study(study_name=name, storage=source)
    dst = optuna.load_study(study_name=new_name, storage=target_url)
    have, want = dst.get_trials(deepcopy=False), src.get_trials(deepcopy=False)
    if len(have) < len(want) and all(_same_trial(a, b) for a, b in zip(have, want, strict=False)):
        system = dst._storage.get_study_system_attrs(dst._study_id)  # as copy_study copies them
        for key, value in src._storage.get_study_system_attrs(src._study_id).items():
            if key not in system:
                dst._storage.set_study_system_attr(dst._study_id, key, value)
        for key, value in src.user_attrs.items():
            if key not in dst.user_attrs:
                dst.set_user_attr(key, value)
        dst.add_trials(want[len(have):])


def _same_trial(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> bool:
    return (a.number, a.state, a.params, a.values, a.datetime_start) == (b.number, b.state, b.params, b.values,
                                                                         b.datetime_start)
