"""The store: one session scope for every statement, committed per trial.

SQLite files get WAL mode and a busy timeout so that several workers can share one file
(zhantune.storage.engine). The writes are here; the reads live in zhantune.storage.queries
(:class:`Store` inherits them), so that no SQL is written outside this package."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import create_engine, delete, exists, func, insert, inspect, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zhantune.errors import StorageError, StorageInternalError, shown
from zhantune.storage import orm as m
from zhantune.storage.engine import (
    canonical_json,
    check_url,
    first_line,
    make_engine,
    redact_url,
    refuse_foreign_or_newer,
    refuse_other_optuna_schema,
    remove_sqlite_files,
    sqlite_path,
    sqlite_reader,
    table_names,
    users_side,
)
from zhantune.storage.locks import database_lock
from zhantune.storage.migrate import current_revision, head_revision, upgrade
from zhantune.storage.queries import Queries

__all__ = ["Store", "ClaimLost"]


class ClaimLost(Exception):
    """A measurement whose claim this worker no longer holds: another worker failed its trial (no
    heartbeat for the grace period), released the claim and measures the point itself. Not stored."""


class Store(Queries):
    """Measurements in a SQLAlchemy database (``url``: ``sqlite:///FILE`` or ``postgresql+psycopg://...``).
    Opening it creates a new database at the newest schema revision; raises StorageError (a UserError,
    exit code 2) when it cannot be opened or holds an older, newer or foreign schema. A failing
    statement afterwards raises StorageInternalError, except a unique-constraint violation (a race
    another worker won): SQLAlchemy's IntegrityError. ``option``: where the URL came from, as the errors
    name it (``sources[0]`` for a merge's source). ``read_only``: a database this process only reads (a
    merge's source): it must hold zhantune's schema at the newest revision, may be a read-only file, and
    is never written to (no schema lock file, no switch to WAL mode)."""

    def __init__(self, url: str, option: str = "storage.url", read_only: bool = False):
        check_url(url, option, writable=not read_only)
        self.url, self.option, self.read_only = url, option, read_only
        path = sqlite_path(url)
        #: set under the schema lock when this process found no database there: the file is its own
        self._creating = False
        try:
            self.engine: Engine = make_engine(url, wal=not read_only)
            with contextlib.nullcontext() if read_only else self.database_lock():
                self._check_schema()
        except BaseException as e:
            # one this process could not create (disk full) leaves no file; another process's is never touched
            if self._creating:
                self.engine.dispose()
                remove_sqlite_files(path)
            if isinstance(e, (SQLAlchemyError, OSError)):
                raise StorageError(f"{option}={redact_url(url)}: cannot open the database: {first_line(e)}") from None
            raise
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _check_schema(self) -> None:
        """Create a new database at the newest revision; refuse older, newer or foreign ones."""
        head = head_revision()
        path = sqlite_path(self.url)
        self._creating = path is not None and not path.exists()  # under the lock: no one else is creating it
        # an existing SQLite file is only read first (zhantune's engine would switch it to WAL mode)
        probe = (create_engine(f"sqlite:///{path}", creator=sqlite_reader(path))
                 if path is not None and path.exists() and path.stat().st_size else self.engine)
        try:
            with probe.connect() as conn:
                tables = table_names(conn)
                rev = current_revision(conn)
                optuna_rev = (conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                              if "alembic_version" in tables else None)
        finally:
            if probe is not self.engine:
                probe.dispose()
        refuse_other_optuna_schema(f"{self.option}={redact_url(self.url)}", optuna_rev)
        refuse_foreign_or_newer(f"{self.option}={redact_url(self.url)}", tables, rev)
        if rev is None and self.read_only:
            raise StorageError(f"{self.option}={redact_url(self.url)}: holds no zhantune tables")
        if rev is None:
            upgrade(self.engine)
            if "version_info" not in tables:
                # Optuna's tables too, now: a database that cannot be created (a full disk) fails
                # here, before a tune has measured anything, not when its study is opened
                import optuna

                storage = optuna.storages.RDBStorage(self.url)
                storage.remove_session()
                storage.engine.dispose()
        elif rev != head:  # an older revision (refuse_foreign_or_newer refused a newer one)
            raise StorageError(f"{self.option}={redact_url(self.url)}: the database has schema revision {rev}, this zhantune "
                               f"needs {head}; back it up, then run: python -m zhantune.db upgrade "
                               f"storage.url={redact_url(self.url)}")

    def check_readable(self) -> None:
        """Raise StorageError naming the row when a stored time or ratio is not a positive, finite
        number (:meth:`bad_time`), or a device's key or name is not one line of printable text (a
        newline or a terminal escape would reach the console and the table's keys): what a
        database edited or crafted elsewhere may hold, and no zhantune run writes (``db merge``
        refuses it too). The readers (compare, export, a tune) call it first, so that one bad row
        is one line, not a crash or a forged line of output."""
        bad = self.bad_time()
        if bad is not None:
            raise StorageError(f"{self.option}={redact_url(self.url)}: {bad} is not a positive, finite number; "
                               "no zhantune run writes it (an edited database?): nothing was read")
        bad = self.bad_stored_value() or ((v := self.bad_recorded_version()) and f"{v} is not one line of printable text")
        if bad:
            raise StorageError(f"{self.option}={redact_url(self.url)}: {bad}; no zhantune run writes it (an edited "
                               "database?): nothing was read")
        for d in self.devices():
            for what, value in (("key", d.key), ("name", d.name)):
                if not (isinstance(value, str) and value.isprintable()):
                    raise StorageError(f"{self.option}={redact_url(self.url)}: device {d.id}: {what} "
                                       f"{json.dumps(value, default=repr)[:120]} is not one line of printable text; no zhantune run "
                                       "writes it (an edited database?): nothing was read")

    def database_lock(self) -> contextlib.AbstractContextManager[None]:
        """Serialise schema creation, and an import's or a merge's checks with its writes, between
        processes (zhantune.storage.locks.database_lock: a lock file beside an SQLite database, an
        advisory lock on PostgreSQL, so N workers can start on one new database at once)."""
        return database_lock(self.url, self.engine, self.option)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on error (Optuna's scoped session): an IntegrityError is
        re-raised as it is (a race: the caller decides), any other database error becomes
        StorageInternalError ``from`` it."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except IntegrityError:
            s.rollback()
            raise
        except SQLAlchemyError as e:
            s.rollback()
            if (msg := users_side(e, f"{self.option}={redact_url(self.url)}", self.url if self.read_only else None)):
                raise StorageError(msg) from None  # the user's database or role, not a bug: exit code 2
            raise StorageInternalError(f"storage.url={redact_url(self.url)}: {first_line(e)}") from e
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def tables(self) -> list[str]:
        """The database's table names (zhantune's ``zt_*`` and Optuna's)."""
        return inspect(self.engine).get_table_names()

    def _insert(self, model: type) -> Any:
        """``INSERT`` for ``model`` in this database's dialect (``ON CONFLICT DO NOTHING`` needs it;
        a statement that inserted returns the new row's id, one that did nothing returns no row)."""
        return (postgresql if self.engine.dialect.name == "postgresql" else sqlite).insert(model)

    # -- identity rows ----------------------------------------------------------------------
    def _get_or_create(self, model: type, where: dict[str, Any], fields: dict[str, Any],
                       update: Callable[[Any], None] | None = None) -> int:
        """Row id by its unique ``where`` columns, inserted when absent (``ON CONFLICT DO NOTHING``:
        a concurrent insert of the same row by another process makes this one read the winner's
        row); ``update`` is applied to a row that was there already."""
        with self.session() as s:
            row = s.scalar(select(model).filter_by(**where))
            if row is None:
                inserted = s.execute(self._insert(model).values(**where, **fields)
                                     .on_conflict_do_nothing(index_elements=list(where)).returning(model.id)).first()
                if inserted is not None:
                    return inserted[0]
                row = s.scalar(select(model).filter_by(**where))
            if update is not None:
                update(row)
            return row.id

    def device_id(self, key: str, name: str, kind: str, properties: dict[str, Any]) -> int:
        """The device row's id by its key (CUDA: gcnArchName; CPU: model name and thread count), created
        when absent. Raises StorageError, before anything is written, when the key is stored as another
        kind of device (``devices=[NAME]`` of an import naming a CPU, a merged database) or as a CPU of
        another vector ISA or cpuid (zhantune.device.CPU_IDENTITY: one model name, two kinds of machine):
        its rows would join the other's. A CPU row stored without either (an older database's, a merge's
        target) is given this one's."""
        from zhantune.device import CPU_IDENTITY, cpu_identity_mismatch

        def same_kind(row: m.Device) -> None:
            stored = row.properties if isinstance(row.properties, dict) else {}
            other = cpu_identity_mismatch(stored, properties) if kind == "cpu" else None
            if row.kind != kind or other:
                raise StorageError(self._other_kind(key, row.kind, kind) if row.kind != kind else (
                    f"device {shown(key, 120)} in {redact_url(self.url)} is a CPU with {CPU_IDENTITY[other[0]]} "
                    f"{shown(other[1])}; this one's is {shown(other[2])} (another machine of one model name"
                    + (", or ATEN_CPU_CAPABILITY set" if other[0] == "isa" else "") + "): tune into another database"))
            # a helper merged an AVX2 and an AVX-512 source into a row without an ISA
            if kind == "cpu" and (missing := {f: properties[f] for f in CPU_IDENTITY if properties.get(f) and not stored.get(f)}):
                row.properties = {**stored, **missing}
        return self._get_or_create(m.Device, {"key": key}, dict(name=name, kind=kind, properties=properties), same_kind)

    def environment_id(self, fields: dict[str, Any]) -> int:
        """The environment row for these fields (torch, triton, cuda, hip, driver, python, zhantune, host)."""
        fingerprint = hashlib.sha256(canonical_json(fields).encode()).hexdigest()
        return self._get_or_create(m.Environment, {"fingerprint": fingerprint}, dict(fields))

    def problem_id(self, key: str, **fields: Any) -> int:
        """Get or create the problem row; fills ``lookup_key`` when it was unknown."""
        def fill(row: m.Problem) -> None:
            if fields.get("lookup_key") and not row.lookup_key:
                row.lookup_key = fields["lookup_key"]
        return self._get_or_create(m.Problem, {"key": key}, fields, fill)

    def study_id(self, name: str, config: dict[str, Any]) -> int:
        """The study row's id by name, created with ``config`` (the composed config) when absent; an
        existing study is reopened (status ``running``) with ``config``, the latest run's (so that
        its ``space`` is the one an ``exhausted`` status refers to)."""
        def reopen(row: m.Study) -> None:
            row.status = "running"
            row.finished_at = None
            row.config = config
        return self._get_or_create(m.Study, {"name": name}, dict(config=config), reopen)

    def reserve_study(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """The config of the study called ``name``, which is created with ``config`` when absent
        (``INSERT ... ON CONFLICT DO NOTHING``: of concurrent callers exactly one creates it, and the
        others read its config); an existing study is left as it is."""
        self._get_or_create(m.Study, {"name": name}, dict(config=config))
        return self.study_config(name) or {}

    def study_config(self, name: str) -> dict[str, Any] | None:
        """The config stored with the study of this name ({} when it has none); None when no such study."""
        with self.session() as s:
            row = s.scalars(select(m.Study).where(m.Study.name == name)).one_or_none()
            return None if row is None else dict(row.config or {})

    def finish_study(self, study_id: int, status: str = "finished") -> None:
        """Mark a study ended: ``status`` finished, exhausted or interrupted, with the time (UTC)."""
        with self.session() as s:
            row = s.get(m.Study, study_id)
            row.status = status
            row.finished_at = dt.datetime.now(dt.timezone.utc)

    # -- claims ---------------------------------------------------------------------------
    # A claim row (study, config) is taken before a point is measured and kept once its row is
    # stored; a point whose measurement ended without a row (interrupted, its worker dead) has its
    # claim released. The statements that decide (claim within the budget, store a row under a claim,
    # release a dead worker's claim) each begin with a write on the row they depend on: SQLite then
    # holds its write lock for the whole transaction (and waits for it with the busy timeout), and
    # PostgreSQL holds that row's lock, so each decision reads what the others committed.
    def claim(self, study_id: int, config_hash: str, trial_number: int, limit: int | None = None) -> str:
        """Claim a config of a study for measuring. Returns "claimed"; "taken" when another worker holds
        it; "spent" when ``limit`` is given and the study's measured plus claimed candidates
        (:meth:`trial_counts`) already reach it (checked and claimed in one transaction, under the
        study row's lock, so N workers never claim more than ``limit`` between them)."""
        with self.session() as s:
            if limit is not None:
                s.execute(update(m.Study).where(m.Study.id == study_id).values(status=m.Study.status))
                measured, in_flight = self._trial_counts(s, study_id)
                if measured + in_flight >= limit:
                    return "spent"
            added = s.execute(self._insert(m.Claim).values(study_id=study_id, config_hash=config_hash,
                                                           trial_number=trial_number)
                              .on_conflict_do_nothing(index_elements=["study_id", "config_hash"])
                              .returning(m.Claim.id)).first()
        return "taken" if added is None else "claimed"

    def release(self, study_id: int, config_hash: str) -> None:
        """Drop a claim (an interrupted measurement: a resumed study measures the config again)."""
        with self.session() as s:
            s.execute(delete(m.Claim).where(m.Claim.study_id == study_id, m.Claim.config_hash == config_hash))

    def release_trial(self, study_id: int, trial_number: int) -> bool:
        """Drop the claim of trial ``trial_number`` unless its measurement row was stored (a dead
        worker's trial: its point is measured again). True when a claim was dropped."""
        with self.session() as s:
            held = s.execute(update(m.Claim).where(m.Claim.study_id == study_id, m.Claim.trial_number == trial_number)
                             .values(trial_number=m.Claim.trial_number)).rowcount
            if not held or s.scalar(select(exists().where(m.MeasurementRow.study_id == study_id,
                                                          m.MeasurementRow.trial_number == trial_number))):
                return False
            s.execute(delete(m.Claim).where(m.Claim.study_id == study_id, m.Claim.trial_number == trial_number))
            return True

    def study_problem_keys(self, study_id: int) -> set[str]:
        """The keys of the problems a study's rows measured (one, for a study zhantune made)."""
        with self.session() as s:
            return set(s.scalars(select(m.Problem.key).join(m.MeasurementRow, m.MeasurementRow.problem_id == m.Problem.id)
                                 .where(m.MeasurementRow.study_id == study_id).distinct()))

    def trials_used(self, study_id: int) -> int:
        """How much of a study's trial budget (``search.n_trials``) is used: its measured plus
        in-flight candidates, every worker's (:meth:`trial_counts`; the claim checks the same sum)."""
        return sum(self.trial_counts(study_id))

    def trial_counts(self, study_id: int) -> tuple[int, int]:
        """(measured, in flight) candidates of a study, every worker's: candidate rows stored for its
        trials, and claims whose trial has no row yet. ``search.n_trials`` is their total's limit."""
        with self.session() as s:
            return self._trial_counts(s, study_id)

    @staticmethod
    def _trial_counts(s: Session, study_id: int) -> tuple[int, int]:
        stored = (select(m.MeasurementRow.id).where(m.MeasurementRow.study_id == study_id, m.MeasurementRow.kind == "candidate",
                                                 m.MeasurementRow.trial_number.is_not(None)))
        unstored = ~exists().where(m.MeasurementRow.study_id == m.Claim.study_id,
                                   m.MeasurementRow.trial_number == m.Claim.trial_number)
        row = s.execute(select(select(func.count()).select_from(stored.subquery()).scalar_subquery(),
                               select(func.count()).select_from(m.Claim)
                               .where(m.Claim.study_id == study_id, unstored).scalar_subquery())).one()
        return int(row[0] or 0), int(row[1] or 0)

    def in_flight(self, study_id: int) -> list[int]:
        """Trial numbers of the study's claims that have no measurement row yet."""
        with self.session() as s:
            return list(s.scalars(select(m.Claim.trial_number).where(
                m.Claim.study_id == study_id,
                ~exists().where(m.MeasurementRow.study_id == m.Claim.study_id,
                                m.MeasurementRow.trial_number == m.Claim.trial_number)).order_by(m.Claim.trial_number)))

    # -- measurements -----------------------------------------------------------------------
    def add_measurement(self, *, claimed: bool = False, **fields: Any) -> int:
        """Insert one measurement row; returns its id. ``claimed``: the row of a claimed candidate
        (``study_id``, ``config_hash``, ``trial_number``), stored only while this worker still holds
        that claim, else ClaimLost (another worker released it: it measures the point itself). A row
        for a trial that already has one (another worker stored it first) raises IntegrityError.
        ``fields``: the columns, as zhantune.storage.rows.measurement_row gives them."""
        with self.session() as s:
            if claimed:
                held = s.execute(update(m.Claim).where(
                    m.Claim.study_id == fields["study_id"], m.Claim.config_hash == fields["config_hash"],
                    m.Claim.trial_number == fields["trial_number"]).values(trial_number=m.Claim.trial_number)).rowcount
                if not held:
                    raise ClaimLost("claim released by another worker")
            row = m.MeasurementRow(**fields)
            s.add(row)
            s.flush()
            return row.id

    def add_measurements(self, rows: list[dict[str, Any]]) -> int:
        """Insert many measurement rows in one transaction (an ORM bulk insert); returns how many."""
        if unknown := set().union(*rows) - set(m.MeasurementRow.__table__.columns.keys()):
            raise TypeError(f"not a measurement column: {', '.join(sorted(unknown))}")  # the bulk insert drops it
        if rows:
            with self.session() as s:
                s.execute(insert(m.MeasurementRow), rows)
        return len(rows)

    # -- verdicts ---------------------------------------------------------------------------
    def add_verdict(self, **fields: Any) -> int:
        """Store a settled speedup claim (zhantune.storage.orm.Verdict), with this process's torch and
        triton versions unless given (the paired rounds ran in it or in its worker); returns its id."""
        from zhantune.provenance import software_versions

        versions = software_versions()
        fields.setdefault("torch_version", versions["torch"])
        fields.setdefault("triton_version", versions["triton"])
        with self.session() as s:
            row = m.Verdict(**fields)
            s.add(row)
            s.flush()
            return row.id
