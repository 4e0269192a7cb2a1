"""The store API: every write goes through one session scope, committed per trial.

SQLite files get WAL mode and a busy timeout so that several workers can share one file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, event, exists, func, inspect, select, text, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zhantune.errors import StorageError
from zhantune.storage import models as m
from zhantune.storage.migrate import current_revision, head_revision, known_revisions, upgrade

__all__ = ["Store", "ClaimLost", "check_url", "redact_url", "sqlite_path", "make_engine", "OPTUNA_TABLES", "decision_us", "decision_value", "median_row"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: database backends zhantune is tested on (SQLite: one machine; PostgreSQL: many)
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
_PG_LOCK_KEY = 0x7A68616E  # "zhan"

#: the tables Optuna's RDB storage keeps in the same database (optuna/storages/_rdb/models.py)
OPTUNA_TABLES = {
    "studies", "study_directions", "study_user_attributes", "study_system_attributes", "trials",
    "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
    "trial_intermediate_values", "trial_heartbeats", "version_info", "alembic_version",
}


def redact_url(url: str) -> str:
    """The URL without its password (for logs and shipped tables; credentials are not shipped)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other engines and in-memory SQLite)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def check_url(url: str) -> None:
    """Check a storage URL before anything is written. Raises StorageError (exit code 2).

    SQLite: the directory must exist and be writable, and an existing file must be an SQLite
    database (a corrupt or foreign file is left untouched).
    """
    try:
        u = make_url(url)
    except ArgumentError:
        raise StorageError(f"storage.url={url!r} is not a database URL; e.g. sqlite:///zhantune.db or "
                           "postgresql+psycopg://user@host/db") from None
    if u.get_backend_name() not in SUPPORTED_BACKENDS:
        raise StorageError(f"storage.url={url!r}: the {u.get_backend_name()!r} backend is not supported; "
                           "use sqlite:///FILE or postgresql+psycopg://user@host/db")
    if u.get_backend_name() == "postgresql" and u.get_driver_name() != "psycopg":
        raise StorageError(f"storage.url={url!r}: PostgreSQL through psycopg 3: postgresql+psycopg://user@host/db")
    if u.get_backend_name() != "sqlite":
        return
    path = sqlite_path(url)
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise StorageError(f"storage.url={url}: directory {parent} does not exist")
    if path.exists():
        if not path.is_file() or not os.access(path, os.W_OK):
            raise StorageError(f"storage.url={url}: {path} is not a writable file")
        _check_sqlite_file(path, url)
    elif not os.access(parent, os.W_OK):
        raise StorageError(f"storage.url={url}: directory {parent} is not writable")


def _check_sqlite_file(path: Path, url: str) -> None:
    """Refuse a file that is not a readable SQLite database, through SQLite alone: opening and
    closing the file with plain I/O would drop the POSIX locks that this process's open connections
    hold on it (SQLite's "how to corrupt a database", section 2.2), after which another process may
    checkpoint and remove the WAL under them. The connection only reads; it is not opened read-only
    because a read-only connection to a WAL database leaves its -wal and -shm files behind."""
    try:
        con = sqlite3.connect(path)
        try:
            con.execute("PRAGMA schema_version").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise StorageError(f"storage.url={url}: {path} is not an SQLite database; left untouched") from None
        raise StorageError(f"storage.url={url}: {path} is not a readable SQLite database ({e}); "
                           "left untouched") from None


def check_sqlite_integrity(path: Path, where: str) -> None:
    """Refuse an SQLite file that fails SQLite's ``PRAGMA quick_check``; raises StorageError naming
    ``where`` (e.g. ``storage.url=sqlite:///x.db``). Read through a plain connection, as
    :func:`_check_sqlite_file` explains."""
    try:
        con = sqlite3.connect(path)
        try:
            result = [r[0] for r in con.execute("PRAGMA quick_check").fetchall()]
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        result = [str(e)]
    if result != ["ok"]:
        raise StorageError(f"{where}: {path} fails SQLite's integrity check ({result[0]}); "
                           "left untouched, restore it from a backup")


def refuse_foreign_or_newer(where: str, tables: set[str], rev: str | None) -> None:
    """Refuse a database that holds tables other than zhantune's and Optuna's but no zhantune
    schema, or a zhantune schema newer than this zhantune knows; raises StorageError naming
    ``where``. ``rev`` is zhantune's schema revision (zhantune.storage.migrate.current_revision)."""
    if rev is None and tables - OPTUNA_TABLES:
        raise StorageError(f"{where}: not a zhantune database (it has tables "
                           f"{', '.join(sorted(tables - OPTUNA_TABLES)[:3])}); left untouched")
    if rev is not None and rev not in known_revisions():
        raise StorageError(f"{where}: schema revision {rev!r} is newer than this zhantune knows "
                           f"(newest {head_revision()}); use a newer zhantune. The database was left untouched")


def _optuna_script() -> Any:
    """Optuna's own Alembic scripts (optuna/storages/_rdb/alembic), which version its tables."""
    import optuna.storages._rdb as rdb
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(rdb.__file__).resolve().parent / "alembic"))


def _optuna_head() -> str:
    return _optuna_script().get_current_head()


def _optuna_revisions() -> set[str]:
    return {r.revision for r in _optuna_script().walk_revisions()}


def _optuna_version() -> str:
    import optuna

    return optuna.__version__


def _remove_sqlite_files(path: Path) -> None:
    """Remove an SQLite database this process just failed to create, with its WAL, shared-memory and
    schema-lock files."""
    for suffix in ("", "-wal", "-shm", "-journal", ".zt-lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextlib.contextmanager
def _file_lock(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock`` that leaves no file behind: the holder unlinks the file
    while it still holds the lock. A process that was waiting on the old file then holds a lock on
    a file no longer at ``lock``; it sees so (the inode at the path differs or is gone) and retries."""
    while True:
        f = open(lock, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                same = os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # the previous holder removed this file: lock the one at the path now
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)
            return
        finally:
            f.close()  # closing the file releases the lock


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine with zhantune's JSON serializer (and WAL + busy timeout on SQLite)."""
    engine = create_engine(url, json_serializer=_canonical_json)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", sqlite_pragmas)
    return engine


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL (readers never block the writer), a busy timeout (writers wait instead of failing),
    synchronous=NORMAL (WAL's usual setting: a commit survives a crashed process; only a power cut
    can lose the last commits, never consistency), foreign keys on."""
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class ClaimLost(Exception):
    """A measurement whose claim this worker no longer holds: another worker failed its trial (no
    heartbeat for the grace period), released the claim and measures the point itself. Not stored."""


class Store:
    """Measurements in a SQLAlchemy database. Raises StorageError when it cannot be opened."""

    def __init__(self, url: str):
        check_url(url)
        self.url = url
        path = sqlite_path(url)
        new_file = path is not None and not path.exists()
        try:
            self.engine: Engine = make_engine(url)
            with self.schema_lock():
                self._check_schema()
        except BaseException as e:
            if new_file:  # a database that could not be created (disk full) leaves no file behind
                self.engine.dispose()
                _remove_sqlite_files(path)
            if isinstance(e, (SQLAlchemyError, OSError)):
                raise StorageError(f"storage.url={url}: cannot open the database: {_first_line(e)}") from None
            raise
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _check_schema(self) -> None:
        """Create a new database at the newest revision; refuse older, newer or foreign ones."""
        head = head_revision()
        path = sqlite_path(self.url)
        # an existing SQLite file is read through a plain connection first (zhantune's engine would
        # switch it to WAL mode, a write); it only reads
        probe = (create_engine(f"sqlite:///{path}")
                 if path is not None and path.exists() and path.stat().st_size else self.engine)
        try:
            with probe.connect() as conn:
                tables = set(inspect(conn).get_table_names())
                rev = current_revision(conn)
                optuna_rev = (conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                              if "alembic_version" in tables else None)
        finally:
            if probe is not self.engine:
                probe.dispose()
        if optuna_rev is not None and optuna_rev != _optuna_head():
            # Optuna refuses such a storage only when the study is opened, after a tune has written
            # its study row and baselines: refuse it here, before anything is written
            raise StorageError(f"storage.url={self.url}: Optuna's tables are at schema {optuna_rev!r}, this "
                               f"Optuna ({_optuna_version()}) uses {_optuna_head()!r}; "
                               + ("upgrade them: optuna storage upgrade --storage URL" if optuna_rev in
                                  _optuna_revisions() else "use a newer Optuna") + ". Left untouched")
        refuse_foreign_or_newer(f"storage.url={self.url}", tables, rev)
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
            raise StorageError(f"storage.url={self.url}: the database has schema revision {rev}, this zhantune "
                               f"needs {head}; back it up, then run: python -m zhantune.db upgrade "
                               f"storage.url={self.url}")

    @contextlib.contextmanager
    def schema_lock(self) -> Iterator[None]:
        """Serialise schema creation between processes: a lock file beside an SQLite database,
        an advisory lock on PostgreSQL (so N workers can start on one new database at once).

        The lock file (``<database>.zt-lock``) exists only while a process holds or waits for the
        lock: the holder removes it before it lets go, and a waiter that then gets the lock on the
        removed file tries again on a fresh one (it compares the file it locked with the path)."""
        path = sqlite_path(self.url)
        if path is not None:
            with _file_lock(Path(f"{path}.zt-lock")):
                yield
        elif self.engine.dialect.name == "postgresql":
            with self.engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                    conn.commit()
        else:
            yield

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on error; database errors become StorageError."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as e:
            s.rollback()
            raise StorageError(f"storage.url={self.url}: {_first_line(e)}") from e
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def tables(self) -> list[str]:
        return inspect(self.engine).get_table_names()

    # -- identity rows ----------------------------------------------------------------------
    def _get_or_create(self, model: type, where: dict[str, Any], fields: dict[str, Any],
                       update: Callable[[Any], None] | None = None) -> int:
        """Row id by its unique ``where`` columns, inserted when absent. Safe between processes: a
        concurrent insert of the same row (IntegrityError) is answered by reading the winner's row."""
        for attempt in range(2):
            try:
                with self.session() as s:
                    row = s.scalar(select(model).filter_by(**where))
                    if row is None:
                        row = model(**where, **fields)
                        s.add(row)
                        s.flush()
                    elif update is not None:
                        update(row)
                    return row.id
            except StorageError as e:
                if attempt or not isinstance(e.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def device_id(self, key: str, name: str, kind: str, properties: dict[str, Any]) -> int:
        return self._get_or_create(m.Device, {"key": key}, dict(name=name, kind=kind, properties=properties))

    def devices(self) -> list[m.Device]:
        """Every device in the database, by key (the order ``python -m zhantune.export`` numbers
        them in)."""
        with self.session() as s:
            return list(s.scalars(select(m.Device).order_by(m.Device.key)))

    def environment_id(self, fields: dict[str, Any]) -> int:
        """The environment row for these fields (torch, triton, cuda, hip, driver, python, zhantune, host)."""
        fingerprint = hashlib.sha256(_canonical_json(fields).encode()).hexdigest()
        return self._get_or_create(m.Environment, {"fingerprint": fingerprint}, dict(fields))

    def problem_id(self, key: str, **fields: Any) -> int:
        """Get or create the problem row; fills ``lookup_key`` when it was unknown."""
        def fill(row: m.Problem) -> None:
            if fields.get("lookup_key") and not row.lookup_key:
                row.lookup_key = fields["lookup_key"]
        return self._get_or_create(m.Problem, {"key": key}, fields, fill)

    def study_id(self, name: str, config: dict[str, Any]) -> int:
        def reopen(row: m.Study) -> None:
            row.status = "running"
            row.finished_at = None
        return self._get_or_create(m.Study, {"name": name}, dict(config=config), reopen)

    def problems_by_key(self) -> dict[str, m.Problem]:
        """Every problem row by its key."""
        with self.session() as s:
            return {p.key: p for p in s.scalars(select(m.Problem))}

    def config_lookup(self, problem_id: int, config_hash: str) -> tuple[m.Device, m.Measurement] | None:
        """A correct measurement of this config for this problem that recorded Inductor's lookup
        key (the key its template hit), with its device; None when there is none."""
        with self.session() as s:
            row = s.execute(select(m.Device, m.Measurement).join(m.Device, m.Device.id == m.Measurement.device_id)
                            .where(m.Measurement.problem_id == problem_id, m.Measurement.config_hash == config_hash,
                                   m.Measurement.status == "ok", m.Measurement.lookup_key.is_not(None))
                            .order_by(m.Measurement.id).limit(1)).first()
            return None if row is None else (row[0], row[1])

    def find_study(self, name: str) -> m.Study | None:
        """The study row named ``name``, or None (reads only)."""
        with self.session() as s:
            return s.scalars(select(m.Study).where(m.Study.name == name)).first()

    def finish_study(self, study_id: int, status: str = "finished") -> None:
        with self.session() as s:
            row = s.get(m.Study, study_id)
            row.status = status
            row.finished_at = dt.datetime.now(dt.timezone.utc)

    def study(self, name: str) -> m.Study | None:
        """The study row called ``name``, if any (read only: :meth:`study_id` reopens it)."""
        with self.session() as s:
            return s.scalar(select(m.Study).where(m.Study.name == name))

    def trials_used(self, study_id: int) -> int:
        """How much of a study's trial budget (``search.n_trials``) is used: its measured plus
        in-flight candidates, every worker's (:meth:`trial_counts`; the claim checks the same sum)."""
        return sum(self.trial_counts(study_id))

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
        try:
            with self.session() as s:
                if limit is not None:
                    s.execute(update(m.Study).where(m.Study.id == study_id).values(status=m.Study.status))
                    measured, in_flight = self._trial_counts(s, study_id)
                    if measured + in_flight >= limit:
                        return "spent"
                s.add(m.Claim(study_id=study_id, config_hash=config_hash, trial_number=trial_number))
            return "claimed"
        except StorageError as e:
            if isinstance(e.__cause__, IntegrityError):
                return "taken"
            raise

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
            if not held or s.scalar(select(exists().where(m.Measurement.study_id == study_id,
                                                          m.Measurement.trial_number == trial_number))):
                return False
            s.execute(delete(m.Claim).where(m.Claim.study_id == study_id, m.Claim.trial_number == trial_number))
            return True

    def trial_counts(self, study_id: int) -> tuple[int, int]:
        """(measured, in flight) candidates of a study, every worker's: candidate rows stored for its
        trials, and claims whose trial has no row yet. ``search.n_trials`` is their total's limit."""
        with self.session() as s:
            return self._trial_counts(s, study_id)

    @staticmethod
    def _trial_counts(s: Session, study_id: int) -> tuple[int, int]:
        stored = (select(m.Measurement.id).where(m.Measurement.study_id == study_id, m.Measurement.kind == "candidate",
                                                 m.Measurement.trial_number.is_not(None)))
        unstored = ~exists().where(m.Measurement.study_id == m.Claim.study_id,
                                   m.Measurement.trial_number == m.Claim.trial_number)
        row = s.execute(select(select(func.count()).select_from(stored.subquery()).scalar_subquery(),
                               select(func.count()).select_from(m.Claim)
                               .where(m.Claim.study_id == study_id, unstored).scalar_subquery())).one()
        return int(row[0] or 0), int(row[1] or 0)

    def in_flight(self, study_id: int) -> list[int]:
        """Trial numbers of the study's claims that have no measurement row yet."""
        with self.session() as s:
            return list(s.scalars(select(m.Claim.trial_number).where(
                m.Claim.study_id == study_id,
                ~exists().where(m.Measurement.study_id == m.Claim.study_id,
                                m.Measurement.trial_number == m.Claim.trial_number)).order_by(m.Claim.trial_number)))

    # -- measurements -----------------------------------------------------------------------
    def add_measurement(self, *, claimed: bool = False, **fields: Any) -> int:
        """Insert one measurement row; returns its id. ``claimed``: the row of a claimed candidate
        (``study_id``, ``config_hash``, ``trial_number``), stored only while this worker still holds
        that claim, else ClaimLost (another worker released it: it measures the point itself)."""
        with self.session() as s:
            if claimed:
                held = s.execute(update(m.Claim).where(
                    m.Claim.study_id == fields["study_id"], m.Claim.config_hash == fields["config_hash"],
                    m.Claim.trial_number == fields["trial_number"]).values(trial_number=m.Claim.trial_number)).rowcount
                if not held:
                    raise ClaimLost(f"trial {fields['trial_number']}: claim released by another worker")
            row = m.Measurement(**fields)
            s.add(row)
            s.flush()
            return row.id

    def add_measurements(self, rows: list[dict[str, Any]]) -> int:
        """Insert many measurement rows in one transaction; returns how many."""
        with self.session() as s:
            s.add_all([m.Measurement(**fields) for fields in rows])
        return len(rows)

    def count_measurements(self, study_id: int) -> int:
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(m.Measurement)
                            .where(m.Measurement.study_id == study_id)) or 0

    def stored_baselines(self, study_id: int, device_id: int, problem_key: str, torch_version: str,
                         triton_version: str | None) -> dict[str, m.Measurement]:
        """The newest baselines a study stored for this device and problem, measured with these
        torch and triton versions: {kind: row} with the newest ``eager`` row and the first row of
        each other baseline kind after it (``default``, on CPU ``default_unfrozen``: they are stored
        together, before any speedup re-measurement of the default). Empty when there is no such
        set or its eager or default measurement is not ``ok`` (zhantune.tune then measures them)."""
        with self.session() as s:
            mine = (select(m.Measurement).join(m.Problem, m.Measurement.problem_id == m.Problem.id)
                    .where(m.Measurement.study_id == study_id, m.Measurement.device_id == device_id,
                           m.Problem.key == problem_key, m.Measurement.trial_number.is_(None),
                           m.Measurement.torch_version == torch_version,
                           m.Measurement.triton_version.is_not_distinct_from(triton_version)))
            eager = s.scalar(mine.where(m.Measurement.kind == "eager").order_by(m.Measurement.id.desc()).limit(1))
            if eager is None:
                return {}
            rows = {"eager": eager}
            later = mine.where(m.Measurement.id > eager.id,
                               m.Measurement.kind.not_in(("eager", "candidate", "remeasure")))
            for row in s.scalars(later.order_by(m.Measurement.id)):
                rows.setdefault(row.kind, row)
        if rows.get("default") is None or any(r.status != "ok" for r in (rows["eager"], rows["default"])):
            return {}
        return rows

    def measurements(self, study_id: int | None = None) -> list[m.Measurement]:
        with self.session() as s:
            q = select(m.Measurement).order_by(m.Measurement.id)
            if study_id is not None:
                q = q.where(m.Measurement.study_id == study_id)
            return list(s.scalars(q))

    def cached(self, device_id: int, problem_id: int, config_hash: str, torch_version: str,
               triton_version: str | None) -> m.Measurement | None:
        """A finished measurement of the same candidate, device, problem and software versions."""
        with self.session() as s:
            return s.scalar(
                select(m.Measurement).where(
                    m.Measurement.device_id == device_id,
                    m.Measurement.problem_id == problem_id,
                    m.Measurement.config_hash == config_hash,
                    m.Measurement.kind == "candidate",
                    m.Measurement.torch_version == torch_version,
                    m.Measurement.triton_version == triton_version,
                ).order_by(m.Measurement.id)
            )

    def best_candidates(self, device_key: str | None = None) -> list[tuple[m.Device, m.Problem, m.Measurement]]:
        """Fastest config per (device, problem), ranked as :meth:`ranked_candidates` ranks them."""
        return [(dev, prob, rows[0]) for dev, prob, rows in self.ranked_candidates(device_key)]

    def ranked_candidates(self, device_key: str | None = None, torch_version: str | None = None,
                          top_k: int = 1) -> list[tuple[m.Device, m.Problem, list[m.Measurement]]]:
        """Per (device, problem): the ``top_k`` fastest distinct configs, fastest first.

        Rows are ``ok`` candidates and close-call re-measurements (kind ``remeasure``), ranked by
        the decision statistic (:func:`decision_us`: the minimum of a measurement's individually
        timed runs, which one-sided noise cannot make smaller than the truth). A config measured
        several times is represented by its row with the lowest decision statistic (the minimum over
        rounds; docs/timing.md). ``torch_version`` keeps only rows measured with that torch version
        (exact string, e.g. "2.13.0+cpu").
        """
        with self.session() as s:
            q = (select(m.Measurement, m.Device, m.Problem)
                 .join(m.Device, m.Measurement.device_id == m.Device.id)
                 .join(m.Problem, m.Measurement.problem_id == m.Problem.id)
                 .where(m.Measurement.kind.in_(("candidate", "remeasure")), m.Measurement.status == "ok",
                        m.Measurement.median_us.is_not(None))
                 .order_by(m.Measurement.median_us, m.Measurement.id))
            if device_key is not None:
                q = q.where(m.Device.key == device_key)
            if torch_version is not None:
                q = q.where(m.Measurement.torch_version == torch_version)
            groups: dict[tuple[int, int], tuple[m.Device, m.Problem, dict[str | None, list[m.Measurement]]]] = {}
            for meas, dev, prob in s.execute(q):
                _, _, by_config = groups.setdefault((dev.id, prob.id), (dev, prob, {}))
                by_config.setdefault(meas.config_hash, []).append(meas)  # in median_us order
            ranked = []
            for dev, prob, by_config in groups.values():
                reps = [min(rows, key=lambda r: (decision_us(r), r.id)) for rows in by_config.values()]
                reps.sort(key=lambda r: (decision_us(r), r.id))
                ranked.append((dev, prob, reps[:top_k]))
            return ranked

    def devices_with_candidates(self, device_key: str | None = None) -> list[m.Device]:
        """Devices that have at least one ``ok`` candidate (optionally only ``device_key``), by key."""
        with self.session() as s:
            has_ok = (select(m.Measurement.id)
                      .where(m.Measurement.device_id == m.Device.id, m.Measurement.status == "ok",
                             m.Measurement.kind.in_(("candidate", "remeasure"))).exists())
            q = select(m.Device).where(has_ok).order_by(m.Device.key)
            if device_key is not None:
                q = q.where(m.Device.key == device_key)
            return list(s.scalars(q))

    def timed_conditions(self, study_id: int) -> list[tuple[dict[str, Any] | None, bool | None, str | None]]:
        """(conditions, contended, timing_method) of every timed row of a study, oldest first
        (zhantune.bench.conditions.ContentionCount sums them)."""
        with self.session() as s:
            rows = s.execute(select(m.Measurement.conditions, m.Measurement.contended, m.Measurement.timing_method)
                             .where(m.Measurement.study_id == study_id, m.Measurement.timing_method.is_not(None))
                             .order_by(m.Measurement.id))
            return [tuple(r) for r in rows]

    def default_times_us(self, torch_version: str | None = None) -> dict[tuple[int, int], float]:
        """(device id, problem id) -> Inductor's default compile time in us: the decision statistic
        (:func:`decision_us`) of its ``ok`` rows, minimum over rows, as Store.ranked_candidates
        represents a config measured several times (zhantune.tune.settle_speedup adds rows)."""
        with self.session() as s:
            q = (select(m.Measurement.device_id, m.Measurement.problem_id, m.Measurement.min_us,
                        m.Measurement.median_us, m.Measurement.timing_method)
                 .where(m.Measurement.kind == "default", m.Measurement.status == "ok",
                        m.Measurement.median_us.is_not(None))
                 .order_by(m.Measurement.median_us, m.Measurement.id))
            if torch_version is not None:
                q = q.where(m.Measurement.torch_version == torch_version)
            times: dict[tuple[int, int], list[float]] = {}
            for d, p, lo, med, method in s.execute(q):
                times.setdefault((d, p), []).append(decision_value(lo, med, method))
            return {key: min(ts) for key, ts in times.items()}

    # -- verdicts ---------------------------------------------------------------------------
    def default_lookup_keys(self) -> dict[tuple[int, int], str]:
        """(device id, problem id) -> the device-specific key of the lookup Inductor's default compile
        made there (newest default row that recorded one): the problem's own key on that device."""
        with self.session() as s:
            rows = s.execute(select(m.Measurement.device_id, m.Measurement.problem_id, m.Measurement.lookup_key)
                             .where(m.Measurement.kind == "default", m.Measurement.lookup_key.is_not(None))
                             .order_by(m.Measurement.id))
            return {(d, p): key for d, p, key in rows}

    def add_verdict(self, **fields: Any) -> int:
        """Store a settled speedup claim (zhantune.storage.models.Verdict); returns its id."""
        with self.session() as s:
            row = m.Verdict(**fields)
            s.add(row)
            s.flush()
            return row.id

    def latest_verdicts(self) -> dict[tuple[int, int, str | None], m.Verdict]:
        """(device id, problem id, config hash) -> the newest verdict on that config's speedup over
        Inductor's default (a tune settles the best config a table can carry): the newest settled in
        paired rounds (``rounds > 0``) where there is one, so that a later "no claim made" (a cached
        winner, ``bench.remeasure_rounds=0``) never hides a confirmed claim; else the newest."""
        with self.session() as s:
            out: dict[tuple[int, int, str | None], m.Verdict] = {}
            for v in s.scalars(select(m.Verdict).order_by(m.Verdict.id)):
                key = (v.device_id, v.problem_id, v.config_hash)
                if v.rounds or key not in out or not out[key].rounds:
                    out[key] = v
            return out


def decision_us(row: Any) -> float:
    """The statistic every decision uses (rank, close call, speedup, min_speedup), microseconds: the
    minimum of a measurement's individually timed runs (``min_us``; ``median_us`` where a row has no
    minimum). Noise on a shared machine only adds time (a descheduled thread costs a scheduler
    slice), so it cannot make this smaller than the kernel's own time; docs/timing.md has the
    measurements behind the choice. The median and the other statistics stay for people to read.
    Recorded data (a Kernel Tuner file replayed, timing method ``kerneltuner:...``) keeps its own
    objective, the median of its recorded times (docs/search.md)."""
    return decision_value(row.min_us, row.median_us, row.timing_method)


def decision_value(min_us: float | None, median_us: float | None, method: str | None) -> float | None:
    """:func:`decision_us` from a row's columns (microseconds)."""
    if min_us is None or (method or "").startswith("kerneltuner"):
        return median_us
    return min_us


def median_row(items: list[Any], key: Callable[[Any], Any] | None = None) -> Any:
    """The representative of several measurements of one config: the lower middle by ``key``
    (measuring a config more often never makes it look faster). Used by the exporter's ranking,
    the default's time, compare and the speedup settle alike."""
    ordered = sorted(items, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _canonical_json(value: Any) -> str:
    """JSON columns (params, configs) are stored canonically: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
