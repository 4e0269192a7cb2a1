"""A CPU's device key names its thread count, ``"AMD EPYC (2 threads)"`` (zhantune.device.cpu_device_key):
a 2-vCPU runner and a 32-core machine with one CPU model were one device, their timings, rankings
and speedup claims pooled. Each CPU device takes the thread count it was first recorded with
(``properties.threads``, else the most common of its rows'); rows measured with another count
(``conditions.threads``) move to a device of that count, with the verdicts settled from them (a
verdict goes with its settle's rows: its config's newest re-measurement in its study stored at or
before it, as 0008 finds them; a study continued with another thread count measures the config
again later, and those rows are not this verdict's rounds: a helper's, 2026-11-30); a
study named ``<problem>@<device key>`` (the tune's default name) and its Optuna study are renamed
after the device its rows are on. A CPU device with no recorded thread count keeps its key.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_DEV = sa.table("zt_device", sa.column("id", sa.Integer), sa.column("key", sa.String), sa.column("name", sa.String),
                sa.column("kind", sa.String), sa.column("properties", sa.JSON))
_MEAS = sa.table("zt_measurement", sa.column("id", sa.Integer), sa.column("device_id", sa.Integer),
                 sa.column("study_id", sa.Integer), sa.column("problem_id", sa.Integer),
                 sa.column("config_hash", sa.String), sa.column("kind", sa.String), sa.column("conditions", sa.JSON),
                 sa.column("created_at", sa.DateTime(timezone=True)))
_VERDICT = sa.table("zt_verdict", sa.column("id", sa.Integer), sa.column("device_id", sa.Integer),
                    sa.column("study_id", sa.Integer), sa.column("problem_id", sa.Integer),
                    sa.column("config_hash", sa.String), sa.column("created_at", sa.DateTime(timezone=True)))
_STUDY = sa.table("zt_study", sa.column("id", sa.Integer), sa.column("name", sa.String))
_OPTUNA = sa.table("studies", sa.column("study_name", sa.String))
#: the key format of this revision (zhantune.device.cpu_device_key, copied: a migration never changes)
_KEYED = re.compile(r"^(?P<model>.*) \((?P<threads>\d+) threads?\)$")


def _key(model: str, threads: int) -> str:
    return f"{model} ({threads} thread{'' if threads == 1 else 's'})"


def _threads(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _move(bind: Any, table: Any, ids: list[int], device_id: int) -> None:
    for i in range(0, len(ids), 500):
        bind.execute(table.update().where(table.c.id.in_(ids[i:i + 500])).values(device_id=device_id))


def _rename_study(bind: Any, study_id: int, old: str, new: str, optuna: bool) -> None:
    """Rename a study (and its Optuna study) unless the new name is taken (in either table)."""
    if bind.execute(sa.select(_STUDY.c.id).where(_STUDY.c.name == new)).first() is not None:
        return
    if optuna and bind.execute(sa.select(_OPTUNA.c.study_name).where(_OPTUNA.c.study_name == new)).first() is not None:
        return
    bind.execute(_STUDY.update().where(_STUDY.c.id == study_id).values(name=new))
    if optuna:
        bind.execute(_OPTUNA.update().where(_OPTUNA.c.study_name == old).values(study_name=new))


def _settled_with(verdict: Any, of_config: list[Any], threads: dict[int, int], own: int) -> int:
    """The thread count of ``verdict``'s settle: among ``of_config`` (the rows of its config in its
    study and problem), the newest re-measurement stored at or before it (else the newest row so
    stored; else ``own``)."""
    same = [r for r in of_config
            if r.created_at is None or verdict.created_at is None or r.created_at <= verdict.created_at]
    settle = [r for r in same if r.kind == "remeasure"] or same
    return threads[max(settle, key=lambda r: r.id).id] if settle else own


def upgrade() -> None:
    bind = op.get_bind()
    optuna = "studies" in sa.inspect(bind).get_table_names()
    taken = {k for (k,) in bind.execute(sa.select(_DEV.c.key))}
    for d in bind.execute(sa.select(_DEV).where(_DEV.c.kind == "cpu").order_by(_DEV.c.id)).all():
        if _KEYED.fullmatch(d.key):
            continue  # keyed by its count already (a database downgraded, then upgraded again)
        rows = bind.execute(sa.select(_MEAS.c.id, _MEAS.c.study_id, _MEAS.c.problem_id, _MEAS.c.config_hash,
                                      _MEAS.c.kind, _MEAS.c.conditions, _MEAS.c.created_at)
                            .where(_MEAS.c.device_id == d.id)
                            .order_by(_MEAS.c.id)).all()
        props = d.properties if isinstance(d.properties, dict) else {}
        recorded = {r.id: _threads((r.conditions or {}).get("threads") if isinstance(r.conditions, dict) else None)
                    for r in rows}
        own = _threads(props.get("threads")) or next(
            (t for t, _ in Counter(t for t in recorded.values() if t).most_common(1)), None)
        if own is None or _key(d.key, own) in taken:
            continue  # no thread count recorded (or the new key is some other device's): left as it is
        threads = {rid: t or own for rid, t in recorded.items()}
        device_of = {own: d.id}
        bind.execute(_DEV.update().where(_DEV.c.id == d.id).values(key=_key(d.key, own)))
        taken.add(_key(d.key, own))
        for t in sorted(set(threads.values()) - {own}):
            if _key(d.key, t) in taken:
                continue  # its rows stay with the device's first count
            device_of[t] = bind.execute(_DEV.insert().values(key=_key(d.key, t), name=d.name, kind="cpu",
                                                             properties={**props, "threads": t})
                                        .returning(_DEV.c.id)).scalar_one()
            taken.add(_key(d.key, t))
            _move(bind, _MEAS, [rid for rid, n in threads.items() if n == t], device_of[t])
        of_config: dict[tuple[int, int, str | None], list[Any]] = {}
        for r in rows:
            of_config.setdefault((r.study_id, r.problem_id, r.config_hash), []).append(r)
        for v in bind.execute(sa.select(_VERDICT).where(_VERDICT.c.device_id == d.id)).all():
            t = _settled_with(v, of_config.get((v.study_id, v.problem_id, v.config_hash), []), threads, own)
            if device_of.get(t, d.id) != d.id:
                _move(bind, _VERDICT, [v.id], device_of[t])
        by_study: dict[int, Counter] = {}
        for r in rows:
            by_study.setdefault(r.study_id, Counter())[threads[r.id] if threads[r.id] in device_of else own] += 1
        for study_id, counts in by_study.items():
            name = bind.execute(sa.select(_STUDY.c.name).where(_STUDY.c.id == study_id)).scalar_one()
            if name.endswith("@" + d.key):
                t = counts.most_common(1)[0][0]
                _rename_study(bind, study_id, name, name[:-len(d.key)] + _key(d.key, t), optuna)
        # default-named studies without rows here (reserved, or interrupted before their first): the device's count
        for study_id, name in bind.execute(sa.select(_STUDY.c.id, _STUDY.c.name)
                                           .where(_STUDY.c.name.endswith("@" + d.key, autoescape=True))).all():
            if study_id not in by_study and name.endswith("@" + d.key):  # SQLite's LIKE ignores case
                _rename_study(bind, study_id, name, name[:-len(d.key)] + _key(d.key, own), optuna)


def downgrade() -> None:
    bind = op.get_bind()
    optuna = "studies" in sa.inspect(bind).get_table_names()
    first: dict[str, int] = {}
    for d in bind.execute(sa.select(_DEV).where(_DEV.c.kind == "cpu").order_by(_DEV.c.id)).all():
        m = _KEYED.fullmatch(d.key)
        if m is None:
            continue
        model = m["model"]
        holder = bind.execute(sa.select(_DEV.c.kind).where(_DEV.c.key == model)).scalar()
        if holder is not None and holder != "cpu":
            continue  # another kind of device has that key: this one stays keyed by its count
        for study_id, name in bind.execute(sa.select(_STUDY.c.id, _STUDY.c.name)
                                           .where(_STUDY.c.name.endswith("@" + d.key, autoescape=True))).all():
            if name.endswith("@" + d.key):  # SQLite's LIKE ignores case
                _rename_study(bind, study_id, name, name[:-len(d.key)] + model, optuna)
        if model not in first:
            plain = bind.execute(sa.select(_DEV.c.id).where(_DEV.c.key == model)).scalar()
            if plain is None:  # the first device of the model takes its name back, the others join it
                bind.execute(_DEV.update().where(_DEV.c.id == d.id).values(key=model))
                first[model] = d.id
                continue
            first[model] = plain  # a device keyed by the model alone (no count recorded): they join it
        for table in (_MEAS, _VERDICT):
            bind.execute(table.update().where(table.c.device_id == d.id).values(device_id=first[model]))
        bind.execute(_DEV.delete().where(_DEV.c.id == d.id))
