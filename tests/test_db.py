"""The results database: migrations, refusals, many workers on SQLite and PostgreSQL, signals, merge."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from disks import fill
from procs import kill_while
from sqlalchemy import create_engine, func, inspect, select

from zhantune.errors import StorageError
from zhantune.storage import Store, make_engine
from zhantune.storage import orm as m
from zhantune.storage.engine import OPTUNA_TABLES, existing_revision
from zhantune.storage.migrate import VERSION_TABLE, current_revision, head_revision

HERE = Path(__file__).resolve().parent
SCHEMA1 = HERE / "data" / "db" / "zhantune_schema1.db"
A100 = HERE / "data" / "kerneltuner" / "convolution_A100.json.gz"
GEMM = HERE / "data" / "kerneltuner" / "gemm_RTX_3090.json.gz"
A100_STUDY = "kerneltuner:convolution_kernel[4096x4096]@NVIDIA A100-PCIE-40GB"
GEMM_STUDY = "kerneltuner:Xgemm[4096x4096]@NVIDIA GeForce RTX 3090"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _worker(url: str, workdir: Path, n_trials: int, path: Path = A100, seed: int = 0,
            more: int | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """``python -m zhantune`` on a replay file: up to ``n_trials`` in the study (every worker's), or
    ``more`` trials more than it holds."""
    workdir.mkdir(parents=True, exist_ok=True)
    budget = f"search.more_trials={more}" if more is not None else f"search.n_trials={n_trials}"
    return subprocess.Popen(
        [sys.executable, "-m", "zhantune", "bench=replay", f"bench.path={path}", budget,
         f"search.seed={seed}", f"storage.url={url}", "progress=false", f"hydra.run.dir={workdir}/hydra", *extra],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"))


def _candidates(url: str, study: str | None = None) -> list[m.MeasurementRow]:
    store = Store(url)
    with store.session() as s:
        q = select(m.MeasurementRow).where(m.MeasurementRow.kind == "candidate")
        if study:
            q = q.join(m.Study).where(m.Study.name == study)
        return list(s.scalars(q))


# -- migrations ------------------------------------------------------------------------------
def test_first_schema_file_is_refused_then_upgraded_with_its_rows_kept(cli, tmp_path):
    db = tmp_path / "old.db"
    shutil.copy(SCHEMA1, db)
    url = f"sqlite:///{db}"
    before = _digest(db)
    with pytest.raises(StorageError, match=rf"schema revision 0001, this zhantune needs {head_revision()}; back it up, then run: "
                                           r"python -m zhantune.db upgrade storage.url=sqlite:///"):
        Store(url)
    assert _digest(db) == before  # refused without a write
    r = cli(["current", f"storage.url={url}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and f"revision 0001; newest {head_revision()}" in r.stdout, r.stderr
    assert _digest(db) == before  # read only: not even switched to WAL mode (it was)
    with sqlite3.connect(SCHEMA1) as con:
        old_rows = con.execute("select id, config_hash, median_us, status from zt_measurement order by id").fetchall()
    r = cli(["upgrade", f"storage.url={url}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0, r.stderr
    assert f"revision 0001 -> {head_revision()}" in r.stdout
    store = Store(url)
    with store.session() as s:
        rows = [(x.id, x.config_hash, x.median_us, x.status) for x in s.scalars(select(m.MeasurementRow).order_by(m.MeasurementRow.id))]
    assert rows == old_rows and len(rows) >= 5
    # the old Optuna study is still there and resumable
    assert optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url).trials


def test_migrations_create_exactly_the_models_schema(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'new.db'}")
    Store(f"sqlite:///{tmp_path / 'new.db'}")
    with engine.connect() as conn:
        # zhantune's tables only: a new database also holds Optuna's (created with it, Store)
        ctx = MigrationContext.configure(conn, opts={
            "include_name": lambda name, type_, parents: (name != VERSION_TABLE and name not in OPTUNA_TABLES)
            if type_ == "table" else parents.get("table_name") not in OPTUNA_TABLES})
        assert compare_metadata(ctx, m.Base.metadata) == []
        assert current_revision(conn) == head_revision()


def test_upgrade_to_0008_gives_each_older_verdict_the_torch_of_its_paired_rounds(tmp_path):
    """Verdicts stored before 0008 have no torch: the upgrade takes it from their config's newest
    paired re-measurement in the same study (stored by the same settle), and leaves it NULL (no torch:
    no claim in any table) where there is none."""
    from alembic import command

    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.candidate import Candidate
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder
    from zhantune.storage.migrate import _config, _transactional, upgrade

    url = f"sqlite:///{tmp_path}/z.db"
    store = Store(url)
    problem = GemmProblem("mm", (64, 64, 64), "float32")
    sid = store.study_id("s", {})
    rec = Recorder(store, problem, sid, store.device_id("cpu x", "cpu x", "cpu", {}),
                   store.problem_id(problem.key, **problem.row_fields()))
    paired, unpaired = (Candidate("aten", "config", "aten::mm", {"i": i}) for i in (0, 1))
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t")), "remeasure", paired)
    for cand in (paired, unpaired):
        store.add_verdict(study_id=sid, device_id=rec.device_id, problem_id=rec.problem_id,
                          config_hash=cand.config_hash, ratio=1.5, ratio_low=1.5, ratio_high=1.5, rounds=3,
                          contended=0, confirmed=True, reason="r")
    # the study settled again later, with another torch: not the older verdict's rounds
    rec.add(Measurement("ok", timing=summarize_us([10.0, 11.0], "t")), "remeasure", paired)
    store.engine.dispose()
    with sqlite3.connect(tmp_path / "z.db") as con:  # the rows' torch, not this process's
        con.execute("update zt_measurement set torch_version = '2.12.0', triton_version = '3.5.0'")
        con.execute("update zt_measurement set torch_version = '2.14.0' where id = (select max(id) from zt_measurement)")
    eng = _transactional(make_engine(url))
    with eng.begin() as conn:
        command.downgrade(_config(conn), "0007")
    eng.dispose()
    with sqlite3.connect(tmp_path / "z.db") as con:  # the premise: 0007 has no such columns
        assert "torch_version" not in {row[1] for row in con.execute("pragma table_info(zt_verdict)")}
    assert upgrade(make_engine(url)) == ("0007", head_revision())
    with sqlite3.connect(tmp_path / "z.db") as con:
        got = dict(con.execute("select config_hash, torch_version || '/' || triton_version from zt_verdict"))
    assert got == {paired.config_hash: "2.12.0/3.5.0", unpaired.config_hash: None}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_to_0009_keys_each_cpu_by_its_thread_count_and_back(tmp_path, request, backend):
    """Before 0009 a CPU was keyed by its model name alone: rows timed with 2 and with 4 threads of
    one model were one device. The upgrade keys the device by its recorded count, moves the rows of
    another count (conditions.threads) to a device of that count with the verdict settled from them,
    and renames a default-named study (and its Optuna study) after its rows' device; a downgrade
    joins them again. A verdict goes with its own settle's rows, not with its config's newest: a
    study continued with another thread count that measures the config again (a helper's,
    2026-11-30: a 2-thread 1.14x claim moved to the 1-thread device, and the export shipped it there)."""
    from alembic import command

    from zhantune.storage.migrate import _config, _transactional, upgrade

    url = f"sqlite:///{tmp_path}/z.db" if backend == "sqlite" else request.getfixturevalue("postgres").new_database()
    store = Store(url)
    dev, sid = store.device_id("M", "M", "cpu", {"threads": 2, "cores": 4}), store.study_id("p@M", {})
    prob = store.problem_id("p", op="mm", shape={"M": 8, "N": 8, "K": 8, "B": 1}, dtype="float32", activation=None,
                            weight_layout="kn", lookup_op="mm", lookup_key=None, flops=1024)
    for i, (threads, kind, config) in enumerate([(2, "default", "d"), (4, "candidate", "c"), (4, "candidate", "e"),
                                                 (4, "remeasure", "c"), (None, "eager", "x")]):
        store.add_measurement(study_id=sid, device_id=dev, problem_id=prob, kind=kind, status="ok", template_id=None,
                              params={}, median_us=1.0, config_hash=config, torch_version="2.13.0",
                              trial_number=i if kind == "candidate" else None,
                              conditions=None if threads is None else {"threads": threads})
    store.add_verdict(study_id=sid, device_id=dev, problem_id=prob, config_hash="c", ratio=1.5, ratio_low=1.4,
                      ratio_high=1.6, rounds=3, contended=0, confirmed=True, reason="r")
    # config f settled with 2 threads, then measured again by the study continued with 4
    store.add_measurement(study_id=sid, device_id=dev, problem_id=prob, kind="remeasure", status="ok", template_id=None,
                          params={}, median_us=1.0, config_hash="f", torch_version="2.13.0", conditions={"threads": 2})
    store.add_verdict(study_id=sid, device_id=dev, problem_id=prob, config_hash="f", ratio=1.14, ratio_low=1.1,
                      ratio_high=1.2, rounds=3, contended=0, confirmed=True, reason="r")
    store.add_measurement(study_id=sid, device_id=dev, problem_id=prob, kind="candidate", status="ok", template_id=None,
                          params={}, median_us=1.0, config_hash="f", torch_version="2.13.0", trial_number=9,
                          conditions={"threads": 4})
    optuna.create_study(study_name="p@M", storage=url)
    store.study_id("q@M", {})  # reserved, no row yet
    store.study_id("z@m", {})  # another device's (SQLite's LIKE ignores case; the rename must not)
    store.device_id("N", "N", "cpu", {})  # no thread count recorded anywhere: keeps its key
    store.engine.dispose()
    eng = _transactional(make_engine(url))
    with eng.begin() as conn:
        command.downgrade(_config(conn), "0008")  # the crafted rows are what 0008 held
    eng.dispose()
    assert upgrade(make_engine(url)) == ("0008", head_revision())

    def state():
        engine = create_engine(url)
        with engine.connect() as con:
            got = (dict(con.exec_driver_sql("select key, id from zt_device").all()),
                   sorted(tuple(r) for r in con.exec_driver_sql("select d.key, m.config_hash from zt_measurement m "
                                                                "join zt_device d on d.id = m.device_id")),
                   [tuple(r) for r in con.exec_driver_sql("select d.key, v.config_hash from zt_verdict v join "
                                                          "zt_device d on d.id = v.device_id order by v.id")],
                   [tuple(r) for r in con.exec_driver_sql("select name from zt_study order by id")],
                   [tuple(r) for r in con.exec_driver_sql("select study_name from studies order by study_id")])
        engine.dispose()
        return got

    upgraded = state()
    devices, rows, verdicts, studies, optuna_studies = upgraded
    assert set(devices) == {"M (2 threads)", "M (4 threads)", "N"} and devices["M (2 threads)"] == dev
    assert rows == [("M (2 threads)", "d"), ("M (2 threads)", "f"), ("M (2 threads)", "x"), ("M (4 threads)", "c"),
                    ("M (4 threads)", "c"), ("M (4 threads)", "e"), ("M (4 threads)", "f")]
    assert verdicts == [("M (4 threads)", "c"), ("M (2 threads)", "f")]
    assert studies == [("p@M (4 threads)",), ("q@M (2 threads)",), ("z@m",)]
    assert optuna_studies == [("p@M (4 threads)",)]
    eng = _transactional(make_engine(url))
    with eng.begin() as conn:
        command.downgrade(_config(conn), "0008")
    eng.dispose()
    devices, rows, verdicts, studies, optuna_studies = state()
    assert devices == {"M": dev, "N": devices["N"]} and {k for k, _ in rows} == {"M"}
    assert verdicts == [("M", "c"), ("M", "f")]
    assert studies == [("p@M",), ("q@M",), ("z@m",)] and optuna_studies == [("p@M",)]
    assert upgrade(make_engine(url)) == ("0008", head_revision())  # and up again: as the first time
    assert state()[1:] == upgraded[1:] and set(state()[0]) == set(upgraded[0])


def test_newer_foreign_and_corrupt_databases_are_refused_untouched(tmp_path):
    newer = tmp_path / "newer.db"
    Store(f"sqlite:///{newer}")
    with sqlite3.connect(newer) as con:
        con.execute("update zt_alembic_version set version_num='9999'")
    digest = _digest(newer)
    with pytest.raises(StorageError, match="schema revision '9999' is newer than this zhantune knows"):
        Store(f"sqlite:///{newer}")
    assert _digest(newer) == digest
    assert existing_revision(f"sqlite:///{newer}", allow_newer=True, writable=False) == "9999"  # `db current`
    # a damaged version table: a revision no zhantune wrote, or two rows (Alembic's "more than one
    # head" traceback in every command before; `db current` printed it and exited 0)
    for statement, message in [("update zt_alembic_version set version_num='deadbeef'", "'deadbeef' is none this"),
                               ("insert into zt_alembic_version values ('0001')", "'<2 revisions in zt_alembic_version")]:
        with sqlite3.connect(newer) as con:
            con.execute(statement)
        digest = _digest(newer)
        with pytest.raises(StorageError, match=re.escape(message)):
            Store(f"sqlite:///{newer}")
        with pytest.raises(StorageError, match=re.escape(message)):
            existing_revision(f"sqlite:///{newer}", allow_newer=True, writable=False)
        assert _digest(newer) == digest
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as con:
        con.execute("create table invoices (id integer)")
    digest = _digest(foreign)
    with pytest.raises(StorageError, match="not a zhantune database .it has tables invoices.; left untouched"):
        Store(f"sqlite:///{foreign}")
    assert _digest(foreign) == digest
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    with pytest.raises(StorageError, match="not an SQLite database"):
        Store(f"sqlite:///{text}")
    assert text.read_text() == "not a database"
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    digest = _digest(corrupt)
    with pytest.raises(StorageError):
        Store(f"sqlite:///{corrupt}")
    assert _digest(corrupt) == digest


# -- many workers ----------------------------------------------------------------------------
def _four_workers_on_one_study(url: str, tmp_path: Path) -> None:
    # four workers split the study's total of 100 (search.n_trials counts the study's measurements)
    procs = [_worker(url, tmp_path / f"w{i}", 100, seed=i) for i in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        # each worker's last log line; a worker that starts after the others measured all 100 (a
        # late start on a busy machine) takes the finished study's path, which says so
        assert ("the study has 100 of 100 measured" in out
                or "is finished: 100 of 100 trials measured" in " ".join(out.split())), out[-2000:]
    rows = _candidates(url)
    assert len(rows) == 100
    assert len({r.trial_number for r in rows}) == 100  # no trial stored twice
    assert len({r.config_hash for r in rows}) == 100   # no configuration measured twice
    assert len({r.study_id for r in rows}) == 1
    study = optuna.load_study(study_name=A100_STUDY, storage=url)
    states = [t.state for t in study.trials]
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]
    assert {r.trial_number for r in rows} <= {t.number for t in done}  # none lost: each row's trial was told
    # the other told trials are cache hits: their values are stored measurements
    medians = {r.median_us for r in rows}
    assert all(t.value in medians for t in done if t.state == optuna.trial.TrialState.COMPLETE)
    assert optuna.trial.TrialState.RUNNING not in states


def test_four_workers_share_one_study_on_sqlite(tmp_path):
    _four_workers_on_one_study(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path)
    assert not list(tmp_path.glob("*.zt-lock"))  # the schema lock leaves no file behind


def _hold_lock(lock: str, log: str, rounds: int) -> None:
    from zhantune.storage.engine import file_lock as _file_lock

    for _ in range(rounds):
        with _file_lock(Path(lock)):
            with open(log, "a") as f:
                f.write(f"in {os.getpid()}\n")
                f.flush()
                time.sleep(0.005)
                f.write(f"out {os.getpid()}\n")


def test_schema_lock_excludes_other_processes_and_leaves_no_file(tmp_path):
    import multiprocessing as mp

    lock, log = tmp_path / "x.db.zt-lock", tmp_path / "log"
    procs = [mp.get_context("fork").Process(target=_hold_lock, args=(str(lock), str(log), 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 4 * 25 * 2
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):  # never two holders at once
        assert enter.startswith("in ") and leave == "out " + enter[3:]
    assert not lock.exists()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_import_beside_another_waits_for_its_writes_before_it_checks(tmp_path, request, backend):
    """A helper's attack: two imports run at once, of two GPUs' files under one device name, both
    passed the check that refuses the second when run one after the other (PostgreSQL and SQLite alike;
    also one recording plain and gzipped, and two merges). An import checks and writes under the database
    lock: one started while another holds it waits, then is refused."""
    import threading

    from zhantune.bench.recorded import load_kerneltuner
    from zhantune.errors import ConfigError
    from zhantune.storage.ingest import import_files
    from zhantune.storage.locks import database_lock

    url = f"sqlite:///{tmp_path / 'z.db'}" if backend == "sqlite" else request.getfixturevalue("postgres").new_database()
    a100 = load_kerneltuner(A100, source="files", device="GPUX")
    a4000 = load_kerneltuner(A100.with_name("convolution_A4000.json.gz"), source="files", device="GPUX")
    mine, theirs = Store(url), Store(url)
    got: list[BaseException | list] = []

    def other_import() -> None:
        try:
            got.append(import_files(theirs, [a4000]))
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            got.append(e)

    with database_lock(url):  # another process's import, between its checks and its writes
        t = threading.Thread(target=other_import)
        t.start()
        t.join(timeout=5)
        assert t.is_alive() and not got, got  # waiting for the lock, nothing checked or written
        assert [added for _, added in import_files(mine, [a100])] == [4362]
    t.join(timeout=120)
    (outcome,) = got
    assert isinstance(outcome, ConfigError), outcome
    assert [d.key for d in mine.devices()] == ["GPUX"] and mine.count_measurements(1) == 4362


def test_a_server_that_closes_the_connection_mid_run_is_one_line_and_a_restart_costs_a_reconnect(postgres):
    """A helper's: the PostgreSQL server stopped or restarted under a tune, an import or a merge gave an
    80-line traceback (exit 1), and a restart between two statements ended the run. A connection the
    server terminates (pg_terminate_backend: what a shutdown sends, SQLSTATE 57P01) is one line saying
    to run the command again, and the next session of the same Store works."""
    from sqlalchemy import text

    from zhantune.storage.rerun import locked_out

    url = postgres.new_database()
    store = Store(url)
    with store.engine.connect() as conn:
        pid = conn.execute(select(func.pg_backend_pid())).scalar()
        with create_engine(url).connect() as admin:
            assert admin.execute(select(func.pg_terminate_backend(pid))).scalar() is True
        with pytest.raises(Exception) as got:
            conn.execute(text("select 1"))
    msg = locked_out(got.value, url)
    assert msg is not None and msg.startswith("storage.url=postgresql"), msg
    assert "the database server closed the connection" in msg and "run the same command again" in msg, msg
    assert "\n" not in msg
    assert [d.key for d in store.devices()] == []  # the pool's dead connection was replaced


def test_four_workers_share_one_study_on_postgresql(tmp_path, postgres):
    _four_workers_on_one_study(postgres.new_database(), tmp_path)


# -- nothing lost ----------------------------------------------------------------------------
def _wait_for_rows(url: str, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    engine = create_engine(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        try:
            with engine.connect() as conn:
                if (conn.scalar(select(func.count()).select_from(m.MeasurementRow.__table__)) or 0) >= n:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rows after {timeout_s} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_leave_a_resumable_study(tmp_path, sig):
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    proc = _worker(url, tmp_path / "w", 5000, path=GEMM)
    _wait_for_rows(url, 30, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: run the same command again to resume" in out
    store = Store(url)
    with store.session() as s:
        assert s.scalar(select(m.Study.status)) == "interrupted"
    study = optuna.load_study(study_name=GEMM_STUDY, storage=url)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    rows = _candidates(url)
    measured = {t.number for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
                and not t.user_attrs.get("zhantune:interrupted")}
    assert {r.trial_number for r in rows} == measured
    again = _worker(url, tmp_path / "w2", 0, path=GEMM, more=10)
    assert again.wait(timeout=300) == 0
    after = _candidates(url)
    assert len(after) == len(rows) + 10 and len({r.config_hash for r in after}) == len(after)


@pytest.fixture
def signals_routed():
    """zhantune.interrupt installed in this process (as the tune app installs it), undone after."""
    from zhantune import interrupt

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupt.install()
    yield interrupt
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    interrupt._State.pending, interrupt._State.depth = False, 0


def test_a_signal_while_a_row_is_stored_waits_for_the_row(signals_routed):
    """A real SIGINT inside an interruptible region aborts it at once; inside deferred() (a row's
    write) it waits: the region ends, then it stops (stop_after) or is left for the loop's next step."""
    interrupt = signals_routed
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt.interruptible():
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("stored")
            done.append("next round")  # never reached: stop_after raised on leaving deferred()
    assert done == ["stored"] and interrupt.requested()
    interrupt._State.pending = False
    try:
        with interrupt.interruptible():
            with interrupt.deferred(stop_after=False):
                os.kill(os.getpid(), signal.SIGINT)
                done.append("told")
            done.append("returned")
    except KeyboardInterrupt:
        pytest.fail("deferred(stop_after=False) raised on leaving")
    assert done == ["stored", "told", "returned"] and interrupt.requested()
    interrupt._State.pending = False
    try:  # a signal after the row's region, before its result is told, does not abort either
        with interrupt.interruptible():
            with interrupt.deferred(stop_after=False):
                done.append("stored again")
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("told again")
    except KeyboardInterrupt:
        pytest.fail("a signal after a stored row aborted the step that tells its result")
    assert done[-2:] == ["stored again", "told again"]
    with pytest.raises(KeyboardInterrupt):
        with interrupt.interruptible():  # the next measurement does not start
            done.append("measured")
    assert "measured" not in done


class _CtrlCAtTrial3:
    """A tune's progress display that sends this process SIGINT from its third update: the moment
    right after trial 3's row is stored, inside the measurement callback."""

    n = 0

    def start(self, *args):
        pass

    def update(self, *args):
        self.n += 1
        if self.n == 3:
            os.kill(os.getpid(), signal.SIGINT)

    def stop(self):
        pass


def test_ctrl_c_right_after_a_row_is_stored_tells_its_trial(tune_cfg, tmp_path, signals_routed):
    """SIGINT in the moment after trial 3's row is written (from the progress update, inside the
    measurement callback): the row's trial is told, not marked interrupted, so every stored row is a
    told trial, the study stops as interrupted, and the resumed study measures only new configs.
    Before, the KeyboardInterrupt abandoned the trial whose row was stored (the flaky SIGINT test)."""
    from zhantune.tune import resolve_run, tune

    url = f"sqlite:///{tmp_path / 'c.db'}"
    cfg = tune_cfg(["bench=replay", f"bench.path={GEMM}", "search.n_trials=8", f"storage.url={url}"])

    result = tune(resolve_run(cfg), Store(url), _CtrlCAtTrial3())
    assert result.interrupted and result.measured == 3
    study = optuna.load_study(study_name=GEMM_STUDY, storage=url)
    told = {t.number for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
            and not t.user_attrs.get("zhantune:interrupted")}
    rows = _candidates(url)
    assert {r.trial_number for r in rows} == told and len(rows) == 3
    signals_routed._State.pending = False
    again = tune(resolve_run(cfg), Store(url))
    after = _candidates(url)
    assert not again.interrupted and len(after) == 8 and len({r.config_hash for r in after}) == 8


def test_ctrl_c_while_the_last_trial_is_stored_still_stops_as_interrupted(tune_cfg, tmp_path, signals_routed):
    """SIGINT while the budget's last row is stored, without heartbeats (the loop then asks nothing
    more): the tune still ends interrupted (no settle, no export, the study marked interrupted), not
    finished as if no signal had come."""
    from zhantune.tune import resolve_run, tune

    url = f"sqlite:///{tmp_path / 'l.db'}"
    cfg = tune_cfg(["bench=replay", f"bench.path={GEMM}", "search.n_trials=3", "storage.heartbeat_interval_s=null",
                    f"storage.url={url}"])

    result = tune(resolve_run(cfg), Store(url), _CtrlCAtTrial3())
    assert result.interrupted and result.measured == 3 and len(_candidates(url)) == 3
    with Store(url).session() as s:
        assert s.scalar(select(m.Study.status)) == "interrupted"


def test_kill_9_loses_at_most_the_in_flight_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    beat = ("storage.heartbeat_interval_s=1", "storage.grace_period_s=3")  # a dead trial is retried after 3 s
    proc = _worker(url, tmp_path / "w", 5000, path=GEMM, extra=beat)
    _wait_for_rows(url, 40, proc)
    proc.kill()
    proc.wait(timeout=60)
    with sqlite3.connect(tmp_path / "kill.db") as con:
        assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    rows = _candidates(url)
    study = optuna.load_study(study_name=GEMM_STUDY, storage=url)
    told = {t.number for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)}
    stored = {r.trial_number for r in rows}
    assert told <= stored and len(stored - told) <= 1  # a row whose tell did not happen yet, at most
    running = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(running) <= 1
    with Store(url).session() as s:  # a trial claimed and not stored: the study holds it (more_trials counts it)
        study_id = s.scalar(select(m.Study.id).where(m.Study.name == GEMM_STUDY))
    measured, in_flight = Store(url).trial_counts(study_id)
    assert measured == len(rows) and in_flight <= len(running)
    again = _worker(url, tmp_path / "w2", 0, path=GEMM, more=10, extra=beat)
    assert again.wait(timeout=300) == 0
    after = _candidates(url)
    # the killed claim's point is measured again, on top of the 10 more
    assert len(after) == len(rows) + in_flight + 10 and len({r.config_hash for r in after}) == len(after)
    # the killed trial, if it was claimed, was failed once its heartbeat was 3 s old and its point
    # measured again: every claim is a stored row's
    with Store(url).session() as s:
        assert s.scalar(select(func.count()).select_from(m.Claim)) == len(after)


def test_a_claimed_trial_without_heartbeat_is_retried_on_resume(tmp_path):
    """A worker that ran with heartbeats off and was killed mid-trial leaves a claimed trial RUNNING
    with no heartbeat: a later run with heartbeats gives it one, fails it once that beat is older
    than the grace period, and measures its point, instead of waiting for it forever."""
    url = f"sqlite:///{tmp_path / 'nobeat.db'}"
    # bench.replay_pace=1: every answer takes the recorded measurement's time (0.48 s or more)
    proc = _worker(url, tmp_path / "w", 50, path=GEMM, extra=("bench.replay_pace=1", "storage.heartbeat_interval_s=null"))
    log = tmp_path / "w" / "hydra" / "app.log"

    def measuring() -> bool:  # after its first trial, in the middle of one: logged, its row not stored
        lines = log.read_text().splitlines() if log.exists() else []
        if sum(": measuring " in ln for ln in lines) < 2 or ": measuring " not in lines[-1]:
            return False
        number = int(lines[-1].split("trial ")[1].split(":")[0])
        return number not in {r.trial_number for r in _candidates(url)}

    kill_while(proc.pid, measuring)  # checked again once stopped: the trial cannot end between check and kill
    proc.wait(timeout=60)
    killed = int(log.read_text().splitlines()[-1].split("trial ")[1].split(":")[0])
    rows = _candidates(url)
    again = _worker(url, tmp_path / "w2", len(rows) + 2, path=GEMM,
                    extra=("storage.heartbeat_interval_s=1", "storage.grace_period_s=2"))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    after = _candidates(url)
    assert len(after) == len(rows) + 2 and len({r.config_hash for r in after}) == len(after)
    # the summary counts the retried trial once (it was in flight before and measured now)
    assert f"the study holds {len(after)} of {len(rows) + 2}" in " ".join(out.split()), out[-1500:]
    study = optuna.load_study(study_name=GEMM_STUDY, storage=url)
    trials = {t.number: t for t in study.trials}
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    (retry,) = [t for t in study.trials if t.user_attrs.get("zhantune:retry_of") == killed]
    assert retry.params == trials[killed].params and retry.number in {r.trial_number for r in after}


# -- merge -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_merge_two_machines_without_duplicates(cli, tmp_path):
    a, b, all_ = (f"sqlite:///{tmp_path / n}" for n in ("a.db", "b.db", "all.db"))
    for url, seed in ((a, 1), (b, 2)):
        p = _worker(url, tmp_path / f"m{seed}", 15, seed=seed)
        assert p.wait(timeout=300) == 0
    r = cli(["merge", f"sources=[{a},{b}]", f"storage.url={all_}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0, r.stderr
    rows = _candidates(all_)
    assert len(rows) == 30
    store = Store(all_)
    with store.session() as s:
        names = sorted(s.scalars(select(m.Study.name)))
        assert names == [A100_STUDY, f"{A100_STUDY} [from {b}]"]
        assert all(x.environment_id is not None and x.torch_version for x in s.scalars(select(m.MeasurementRow)))
    assert {s.study_name for s in optuna.get_all_study_summaries(all_)} == set(names)
    # the created_at of every source row survives
    src = sorted(str(x.created_at) for x in _candidates(a) + _candidates(b))
    assert sorted(str(x.created_at) for x in rows) == src
    r = cli(["merge", f"sources=[{a},{b}]", f"storage.url={all_}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+0 measurement(s), 15 already there" in r.stdout
    assert len(_candidates(all_)) == 30


@pytest.mark.slow
def test_merge_never_joins_two_recordings_of_a_device_named_after_its_file_name(cli, tmp_path, postgres):
    """Two Kernel Tuner files without device_name, one file name (``k_GPUZ``), different data: one
    replayed into a.db, the other imported into b.db (each alone is fine). Merging them would make
    device GPUZ hold both (an import of the second into a.db is refused): refused in one line,
    naming both studies, with the target not even created (an empty PostgreSQL database: left
    without tables, it got zhantune's schema before the check); into an existing target that holds
    the first, refused too, its bytes unchanged. Merging a.db twice is fine."""
    import gzip
    import json

    for sub, scale in (("n1", 1.0), ("n2", 3.0)):
        doc = {"device_name": "", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
               "tune_params": {"x": [1, 2]},
               "cache": {str(x): {"x": x, "time": x * scale, "times": [x * scale]} for x in (1, 2)}}
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "k_GPUZ.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    a, b, out = (f"sqlite:///{tmp_path / n}" for n in ("a.db", "b.db", "all.db"))
    assert cli(["bench=replay", "bench.path=n1/k_GPUZ.json.gz", "search.n_trials=2", "progress=false",
                f"storage.url={a}"], tmp_path).returncode == 0
    assert cli(["files=[n2/k_GPUZ.json.gz]", f"storage.url={b}"], tmp_path, module="zhantune.kerneltuner").returncode == 0
    r = cli(["merge", f"sources=[{a},{b}]", f"storage.url={out}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ("sources[1]: study 'kerneltuner:k_GPUZ.json.gz@GPUZ' holds kerneltuner:k[64] on device 'GPUZ' (named "
            "only after a file name in one of the databases) from another file than study 'kerneltuner:k[64]@GPUZ' "
            "of sources[0]" in r.stderr), r.stderr
    assert not (tmp_path / "all.db").exists()
    empty = postgres.new_database()
    r = cli(["merge", f"sources=[{a},{b}]", f"storage.url={empty}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "from another file than study" in r.stderr, r.stderr
    engine = make_engine(empty)
    with engine.connect() as conn:
        assert inspect(conn).get_table_names() == []
    engine.dispose()
    assert cli(["merge", f"sources=[{a}]", f"storage.url={out}"], tmp_path, module="zhantune.db").returncode == 0
    assert cli(["merge", f"sources=[{a}]", f"storage.url={out}"], tmp_path, module="zhantune.db").returncode == 0
    # a database where the other file names its device GPUZ (device_name): the same refusal
    named = json.loads(gzip.decompress((tmp_path / "n2" / "k_GPUZ.json.gz").read_bytes()))
    (tmp_path / "n3").mkdir()
    (tmp_path / "n3" / "named.json").write_text(json.dumps({**named, "device_name": "GPUZ"}))
    c = f"sqlite:///{tmp_path / 'c.db'}"
    assert cli(["files=[n3/named.json]", f"storage.url={c}"], tmp_path, module="zhantune.kerneltuner").returncode == 0
    r = cli(["merge", f"sources=[{a},{c}]", f"storage.url=sqlite:///{tmp_path / 'ac.db'}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "from another file than study 'kerneltuner:k[64]@GPUZ' of sources[0]" in r.stderr, \
        r.stderr
    before = _digest(tmp_path / "all.db")
    r = cli(["merge", f"sources=[{b}]", f"storage.url={out}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "sources[0]: study 'kerneltuner:k_GPUZ.json.gz@GPUZ'" in r.stderr and \
        "of storage.url" in r.stderr, r.stderr
    assert _digest(tmp_path / "all.db") == before
    # the first file's recording decompressed (another file's bytes, the same JSON): one recording, merged
    # (a review, session 42: the merge compared the files' bytes alone, and refused it as another file)
    (tmp_path / "n4").mkdir()
    (tmp_path / "n4" / "k_GPUZ.json").write_bytes(gzip.decompress((tmp_path / "n1" / "k_GPUZ.json.gz").read_bytes()))
    d = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli(["files=[n4/k_GPUZ.json]", f"storage.url={d}"], tmp_path, module="zhantune.kerneltuner").returncode == 0
    r = cli(["merge", f"sources=[{d}]", f"storage.url={out}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0, r.stderr


def test_one_device_key_is_never_a_cpu_and_a_gpu(cli, tmp_path):
    """A GPU's measurements merged or imported under a key a CPU holds joined the CPU device: its
    verdict on the CPU's rankings, its TRITON backend in a CPU table (the merged database was then
    refused by merge itself). Refused before anything is written: a merge (one line, exit 2, the
    target's bytes unchanged), a Kernel Tuner import naming the CPU (devices=[...]), Store.device_id."""
    import gzip
    import json

    cpu, gpu = Store(f"sqlite:///{tmp_path / 'cpu.db'}"), Store(f"sqlite:///{tmp_path / 'gpu.db'}")
    cpu.device_id("X", "X", "cpu", {})
    gpu.device_id("X", "X", "cuda", {})
    for store in (cpu, gpu):
        store.engine.dispose()
    before = _digest(tmp_path / "cpu.db")
    r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'gpu.db'}]", f"storage.url=sqlite:///{tmp_path / 'cpu.db'}"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ('sources[0]: device "X" is a cuda device there and a cpu device in storage.url: nothing was merged'
            in r.stderr), r.stderr
    assert _digest(tmp_path / "cpu.db") == before
    doc = {"device_name": "A GPU", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
           "tune_params": {"x": [1, 2]}, "cache": {str(x): {"x": x, "time": x, "times": [x]} for x in (1, 2)}}
    (tmp_path / "k.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    (tmp_path / "k2.json.gz").write_bytes(gzip.compress(json.dumps({**doc, "kernel_name": "k2"}).encode()))
    r = cli(["files=[k2.json.gz,k.json.gz]", "devices=[G,X]", f"storage.url=sqlite:///{tmp_path / 'cpu.db'}"],
            tmp_path, module="zhantune.kerneltuner")  # the first file is fine: nothing written all the same
    assert r.returncode == 2 and "device 'X' is a cpu device in sqlite:///" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and _digest(tmp_path / "cpu.db") == before
    with pytest.raises(StorageError, match="device 'X' is a cpu device in .*, not a cuda one"):
        Store(f"sqlite:///{tmp_path / 'cpu.db'}").device_id("X", "X", "cuda", {})


def _one_run(url: str, name: str = "s") -> Store:
    """A database holding one study ``name`` (started now) with one measurement and one verdict."""
    store = Store(url)
    dev, sid = store.device_id("d", "d", "cpu", {}), store.study_id(name, {})
    prob = store.problem_id("mm[M=8,N=8,K=8]:float32", op="mm", shape={"M": 8, "N": 8, "K": 8, "B": 1},
                            dtype="float32", activation=None, weight_layout="kn", lookup_op="mm", lookup_key=None,
                            flops=1024)
    store.add_measurement(study_id=sid, device_id=dev, problem_id=prob, kind="candidate", status="ok",
                          template_id=None, params={}, median_us=1.0, config_hash="c", torch_version="2.13.0",
                          trial_number=0)
    store.add_verdict(study_id=sid, device_id=dev, problem_id=prob, config_hash="c", ratio=1.5, ratio_low=1.4,
                      ratio_high=1.6, rounds=3, contended=0, confirmed=True, reason="r")
    return store


def test_merge_matches_a_run_by_its_start_whatever_the_url_and_keeps_utc(tmp_path, postgres):
    """A renamed study was matched by its label alone: the same source under another spelling of
    its URL was copied again (three copies of every row), and another run under the same label went
    into the first run's study. Merged into PostgreSQL whose time zone is not UTC, SQLite's naive
    UTC times were read as local (an hour off in Europe/Berlin) and a second merge copied everything
    again. And a merged study kept its status when the source's run ended later."""
    from zhantune.storage.merge import merge_into

    target, source = _one_run(f"sqlite:///{tmp_path / 'a.db'}"), _one_run(f"sqlite:///{tmp_path / 'b.db'}")
    stats = merge_into(target, source, label="sqlite:///b.db")
    assert (stats.studies_renamed, stats.measurements_added, stats.verdicts_added) == (1, 1, 1)
    again = merge_into(target, source, label=f"sqlite:///{tmp_path / 'b.db'}")  # the same file, spelt otherwise
    assert (again.studies_renamed, again.measurements_added, again.verdicts_added) == (0, 0, 0)
    other = merge_into(target, _one_run(f"sqlite:///{tmp_path / 'c.db'}"), label="sqlite:///b.db")  # another run
    assert (other.studies_renamed, other.measurements_added) == (1, 1)
    with target.session() as s:
        assert sorted(s.scalars(select(m.Study.name))) == ["s", "s [from sqlite:///b.db #2]", "s [from sqlite:///b.db]"]
    source.finish_study(source.study_id("s", {}), "exhausted")
    merge_into(target, source, label="b")
    with target.session() as s:
        assert s.scalar(select(m.Study.status).where(m.Study.name == "s [from sqlite:///b.db]")) == "exhausted"

    pg = postgres.new_database()
    engine = create_engine(pg, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {pg.rsplit('/', 1)[1]} SET timezone TO 'Europe/Berlin'")
    engine.dispose()
    berlin = Store(pg)
    assert merge_into(berlin, source, label="b").measurements_added == 1
    assert merge_into(berlin, source, label="b").measurements_added == 0
    with source.session() as s, berlin.session() as t:
        (mine,), (theirs,) = s.scalars(select(m.MeasurementRow.created_at)), t.scalars(select(m.MeasurementRow.created_at))
        start = t.scalar(select(m.Study.started_at))
        assert theirs.utcoffset() is not None and theirs.astimezone(datetime.timezone.utc).replace(tzinfo=None) == mine
        assert start.astimezone(datetime.timezone.utc).replace(tzinfo=None) == s.scalar(select(m.Study.started_at))
    berlin.engine.dispose()


def test_merge_reads_its_sources_and_writes_none(cli, tmp_path):
    """A source in journal_mode=DELETE (how a database is sent as one file) came back from a merge in
    WAL mode, its bytes changed: a source is opened without zhantune's switch to WAL mode and
    without the schema lock file, so its bytes stay as they were and nothing is left beside it."""
    source = _one_run(f"sqlite:///{tmp_path / 'b.db'}")
    source.engine.dispose()
    with sqlite3.connect(tmp_path / "b.db") as con:
        assert con.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    before, listing = _digest(tmp_path / "b.db"), sorted(p.name for p in tmp_path.iterdir())
    r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'b.db'}]", f"storage.url=sqlite:///{tmp_path / 'all.db'}"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+1 measurement(s)" in r.stdout, r.stdout + r.stderr
    assert _digest(tmp_path / "b.db") == before
    assert [n for n in sorted(p.name for p in tmp_path.iterdir()) if n.startswith("b.db")] == ["b.db"]
    assert "b.db" in listing
    # a source no one may write (immutable: root ignores permission bits) is merged, and `current` reads it
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(tmp_path / "b.db")]).returncode != 0:
        pytest.skip("chattr +i is not available here (not root, or a file system without it)")
    try:
        r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'b.db'}]", f"storage.url=sqlite:///{tmp_path / 'c.db'}"],
                tmp_path, module="zhantune.db")
        assert r.returncode == 0 and "+1 measurement(s)" in r.stdout, r.stdout + r.stderr
        r = cli(["current", f"storage.url=sqlite:///{tmp_path / 'b.db'}"], tmp_path, module="zhantune.db")
        assert r.returncode == 0 and f"revision {head_revision()}" in r.stdout, r.stderr
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "b.db")])
    assert _digest(tmp_path / "b.db") == before


@contextlib.contextmanager
def _unwritable(path: Path):
    """``path`` (a file or a directory) no one may write: mode 444/555, or for root (who ignores
    modes) the immutable attribute; skips where neither works."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("chattr +i is not available here (a file system without it)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("unwritable", ["file", "directory"])
def test_a_database_this_process_cannot_write_is_read_and_nothing_is_left_beside_it(tmp_path, unwritable):
    """Reading a WAL database this process may not write (a mode-444 file, or one in a read-only
    directory) left -wal and -shm files beside it, which this process could not remove and on which
    the owner's next write failed; in a read-only directory it could not be read at all (a review's
    findings). The checks, a merge from it and its Optuna study's history read it, write nothing
    beside it, and the owner writes to it afterwards."""
    from zhantune.report.studies import load_report_study
    from zhantune.storage.merge import merge_into

    (tmp_path / "ro").mkdir()
    db = tmp_path / "ro" / "b.db"
    url = f"sqlite:///{db}"
    _one_run(url).engine.dispose()
    storage = optuna.storages.RDBStorage(url)
    optuna.create_study(study_name="s", storage=storage).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    storage.engine.dispose()
    with contextlib.closing(sqlite3.connect(db)) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    before = _digest(db)
    assert sorted(p.name for p in db.parent.iterdir()) == ["b.db"]
    with _unwritable(db if unwritable == "file" else db.parent):
        assert existing_revision(url, "sources[0]", writable=False) == head_revision()
        source = Store(url, "sources[0]", read_only=True)
        stats = merge_into(Store(f"sqlite:///{tmp_path / 'all.db'}"), source, label=url)
        assert stats.measurements_added == 1 and stats.verdicts_added == 1
        assert len(load_report_study(source, "s").trials) == 2
        source.engine.dispose()
        assert sorted(p.name for p in db.parent.iterdir()) == ["b.db"]
    assert _digest(db) == before
    store = Store(url)  # the owner writes on
    store.study_id("later", {})
    assert "later" in store.study_names()


def test_a_pending_wal_of_a_database_this_process_cannot_write_is_read_through_a_link(tmp_path):
    """A file this process may not write with a -wal beside it (its writer still open, or killed)
    is opened mode=ro: the WAL's committed rows are read and nothing is added beside it. Through a
    symbolic link in another directory too: the -wal is the target's (a review's finding: the link's
    directory had none, and the reader ignored the WAL's rows)."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "links").mkdir()
    db, link = tmp_path / "ro" / "b.db", tmp_path / "links" / "b.db"
    _one_run(f"sqlite:///{db}").engine.dispose()
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("update zt_study set name = 'renamed'")
    writer.commit()  # in the -wal only
    link.symlink_to(db)
    beside = sorted(p.name for p in db.parent.iterdir())
    assert beside == ["b.db", "b.db-shm", "b.db-wal"]
    try:
        with _unwritable(db):
            for path in (db, link):
                source = Store(f"sqlite:///{path}", "sources[0]", read_only=True)
                assert source.study_names() == {"renamed"}, path
                source.engine.dispose()
            assert sorted(p.name for p in db.parent.iterdir()) == beside and list(link.parent.iterdir()) == [link]
    finally:
        writer.close()


def test_a_database_changed_under_a_lock_free_reader_is_one_line(tmp_path):
    """An immutable read (a file this process may not write) takes no lock: another process's write
    during it can make SQLite report "database disk image is malformed" (a review's reproduction:
    thousands of such errors in a loop). A read-only Store of such a file says the database changed
    while it read it, one line, exit code 2; where it reads with locks (a file it may write), or
    writes, "malformed" is damage: an internal error with its traceback. And reading a database
    without Optuna's tables gives it none (Optuna's reader created them: a review's finding)."""
    from sqlalchemy.exc import DatabaseError

    from zhantune.report.studies import study_names
    from zhantune.storage.engine import users_side

    db = tmp_path / "b.db"
    url = f"sqlite:///{db}"
    _one_run(url).engine.dispose()
    with contextlib.closing(sqlite3.connect(db)) as con:
        for table in OPTUNA_TABLES:
            con.execute(f"drop table if exists {table}")
        con.commit()
        before = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
    e = DatabaseError("SELECT 1", {}, sqlite3.DatabaseError("database disk image is malformed"))
    assert users_side(e, "sources[0]=...", url) is None and users_side(e, "storage.url=...", None) is None
    with _unwritable(db):
        assert users_side(e, f"sources[0]={url}", url) == (
            f"sources[0]={url}: the database changed while this process read it (it may not write the file, so "
            "it reads without SQLite's locks); run the command again")
        assert study_names(Store(url, "sources[0]", read_only=True)) == ["s"]
    assert study_names(Store(url, "sources[0]", read_only=True)) == ["s"]
    # Optuna's reads (compare's history, merge's study copy) say it too: Optuna wraps the error
    import optuna

    from zhantune.errors import StorageError
    from zhantune.report.studies import load_report_study

    def malformed(*args, **kwargs):
        try:
            raise e
        except DatabaseError as cause:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from cause

    other = tmp_path / "c.db"  # with Optuna's tables
    other_url = f"sqlite:///{other}"
    _one_run(other_url).engine.dispose()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(optuna, "get_all_study_summaries", malformed)
        mp.setattr(optuna, "copy_study", malformed)
        with _unwritable(other):
            for read in (study_names, lambda store: load_report_study(store, "s")):
                with pytest.raises(StorageError, match="the database changed while this process read it"):
                    read(Store(other_url, "sources[0]", read_only=True))
        # a file this process may write: "malformed" is damage, not this (Optuna's error, its traceback)
        with pytest.raises(optuna.exceptions.StorageInternalError):
            study_names(Store(other_url, "sources[0]", read_only=True))
    with contextlib.closing(sqlite3.connect(db)) as con:
        assert {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")} == before


def test_a_target_that_refuses_writes_is_one_line(cli, tmp_path, postgres):
    """Merging into a PostgreSQL database as a role allowed only SELECT was a traceback (exit 1,
    "permission denied for table zt_study"): one line naming the target, exit 2, nothing written."""
    url = postgres.new_database()
    Store(url).engine.dispose()
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE ROLE reader LOGIN")
        conn.exec_driver_sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
        count = conn.exec_driver_sql("SELECT count(*) FROM zt_study").scalar()
    _one_run(f"sqlite:///{tmp_path / 'b.db'}").engine.dispose()
    reader = url.replace("postgres@", "reader@")
    r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'b.db'}]", f"storage.url={reader}"], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "storage.url=" in r.stderr and "refuses this user's writes (permission denied for table" in r.stderr
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM zt_study").scalar() == count
    engine.dispose()


def _run(url: str, workdir: Path, **kw) -> None:
    p = _worker(url, workdir, kw.pop("n_trials", 0), **kw)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]


def test_a_study_continued_on_two_machines_merges_once_and_back(tmp_path):
    """A study copied to a second machine and continued on both: merging one into the other stored
    the clashing trials without trial numbers, and every later merge of the same source (or of the
    merged database back) added them again, 3 more rows each time; and a hub's renamed copy of a
    spoke's run, merged back into the spoke, became a second study of that run (a review's findings).
    Real replay tunes; the merges in process (the CLI's merge is tested above)."""
    from zhantune.storage.merge import merge_into

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    _run(a, tmp_path / "w", n_trials=5)
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    _run(a, tmp_path / "w", more=3, seed=1)
    _run(b, tmp_path / "w", more=3, seed=2)

    def merge(source: str, target: str) -> tuple[int, int, int, int]:
        st = merge_into(Store(target), Store(source, "sources[0]", read_only=True), label=source)
        return st.measurements_added, st.measurements_skipped, st.studies_new, st.studies_renamed

    assert merge(b, a)[:2] == (3, 5)
    assert merge(b, a)[:2] == (0, 8)   # again: nothing
    assert merge(a, b)[:2] == (3, 8)   # back: a's own 3 only
    assert merge(a, b)[0] == 0 and merge(b, a)[0] == 0
    for url in (a, b):
        rows = _candidates(url)
        assert len(rows) == 11 and len({(r.created_at, r.config_hash) for r in rows}) == 11
    # a hub: two machines' runs of one study name; the hub merged back into one of them
    laptop, desktop, team = (f"sqlite:///{tmp_path / n}.db" for n in ("laptop", "desktop", "team"))
    _one_run(laptop).engine.dispose()
    _one_run(desktop).engine.dispose()
    merge(laptop, team)
    assert merge(desktop, team)[3] == 1  # renamed: s [from ...desktop.db]
    assert merge(team, desktop) == (1, 1, 0, 1)  # the laptop's run new (renamed), its own matched
    with Store(desktop).session() as s:
        names = sorted(s.scalars(select(m.Study.name)))
    assert len(names) == 2 and sum(" [from " not in n for n in names) == 1, names  # its own run once, the laptop's


def test_one_kernel_tuner_file_imported_into_two_databases_merges_once(cli, tmp_path):
    """Importing a file again into one database adds nothing ("already imported"); imported into two
    databases that are then merged, it was stored twice (the second study renamed, started at
    another time). The same file's import (its sha256) is one study, its rows matched by trial."""
    import gzip
    import json

    doc = {"device_name": "A GPU", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["x"],
           "tune_params": {"x": [1, 2, 3]}, "cache": {str(x): {"x": x, "time": x, "times": [x]} for x in (1, 2, 3)}}
    (tmp_path / "k.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    a, b = (f"sqlite:///{tmp_path / n}" for n in ("a.db", "b.db"))
    for url in (a, b):
        assert cli(["files=[k.json.gz]", f"storage.url={url}"], tmp_path, module="zhantune.kerneltuner").returncode == 0
    r = cli(["merge", f"sources=[{b}]", f"storage.url={a}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+0 measurement(s), 3 already there; 0 verdict(s); 0 new stud(y/ies), 0 renamed" \
        in r.stdout, r.stdout + r.stderr
    assert len(_candidates(a)) == 3
    # in c.db another file named k.json.gz came first: this one's study is kerneltuner:k.json.gz[sha256:...]@A GPU
    (tmp_path / "other").mkdir()
    other = {**doc, "cache": {str(x): {"x": x, "time": 2 * x, "times": [2 * x]} for x in (1, 2, 3)}}
    (tmp_path / "other" / "k.json.gz").write_bytes(gzip.compress(json.dumps(other).encode()))
    c = f"sqlite:///{tmp_path / 'c.db'}"
    for f in ("other/k.json.gz", "k.json.gz"):
        assert cli([f"files=[{f}]", f"storage.url={c}"], tmp_path, module="zhantune.kerneltuner").returncode == 0
    r = cli(["merge", f"sources=[{b}]", f"storage.url={c}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+0 measurement(s), 3 already there" in r.stdout and "0 renamed" in r.stdout, r.stdout


@pytest.mark.parametrize("sources, message", [
    ("sources=sqlite:///{d}/a.db", "sources=sqlite:///{d}/a.db: expected a list of database URLs"),
    ("sources=[sqlite:///{d}/notes.db]", "sources[0]=sqlite:///{d}/notes.db: {d}/notes.db is not an SQLite database"),
    ("sources=[sqlite:///{d}/a.db,bogus:///x]", "sources[1]='bogus:///x': the 'bogus' backend is not supported"),
    # an older database as a source: named as sources[0] (it said storage.url=<the source>)
    ("sources=[sqlite:///{d}/old.db]", "sources[0]=sqlite:///{d}/old.db: the database has schema revision"),
])
def test_merge_names_the_bad_source_and_leaves_the_target_untouched(cli, tmp_path, existing_db, sources, message):
    """A bad source is named by its place in sources=[...] (not as storage.url, which is fine)."""
    Store(f"sqlite:///{tmp_path / 'a.db'}")
    (tmp_path / "notes.db").write_text("not a database")
    shutil.copy(SCHEMA1, tmp_path / "old.db")
    before = _digest(existing_db)
    r = cli(["merge", sources.format(d=tmp_path), f"storage.url=sqlite:///{existing_db}"], tmp_path,
            module="zhantune.db")
    assert r.returncode == 2 and message.format(d=tmp_path) in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert _digest(existing_db) == before


def test_a_kernel_name_over_32_characters_fits_once_upgraded_to_0007_on_postgresql(cli, tmp_path, postgres):
    """Real Kernel Tuner kernels have longer names than revision 0006's zt_problem.op (32): PostgreSQL
    refused one there (SQLite would not have, and a later merge would); after ``zhantune.db upgrade``
    (0007) the same file imports and replays, its name whole in the problem and template rows."""
    from sqlalchemy.exc import DataError
    from sqlalchemy.orm import Session
    from test_bad_input import _kt_file

    from zhantune.storage.migrate import upgrade

    url = postgres.new_database()
    upgrade(make_engine(url), "0006")
    name = "convolution_kernel_shared_mem_tiled"  # 35 characters
    with Session(make_engine(url)) as s, pytest.raises(DataError, match="value too long"):  # the premise
        s.add(m.Problem(key="p", op=name, shape={}, dtype="float32", lookup_op=name, flops=0))
        s.commit()
    r = cli(["upgrade", f"storage.url={url}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and f"revision 0006 -> {head_revision()}" in r.stdout, r.stdout + r.stderr
    path = _kt_file(tmp_path, "k35.json.gz", 4.0, kernel_name=name)
    r = cli([f"files=[{path}]", f"storage.url={url}"], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli(["bench=replay", f"bench.path={path}", "search.n_trials=2", "progress=false", f"storage.url={url}"],
            tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    with Store(url).session() as s:
        assert {(p.op, p.lookup_op) for p in s.scalars(select(m.Problem))} == {(name, name)}
        assert set(s.scalars(select(m.MeasurementRow.template_id).where(m.MeasurementRow.kind == "candidate"))) \
            == {f"kerneltuner::{name}"}


def test_merge_takes_a_rocm_device_key_and_writes_nothing_to_a_source(cli, tmp_path):
    """A ROCm GPU's device key is its gcnArchName, which holds "+" ("gfx90a:sramecc+:xnack-"): the
    lookup-key format (tables, merge's check) took the device part to end at the first "+" and
    refused such keys. And a source without Optuna's tables (zhantune's only) is read, never
    written: merge_into's copy of Optuna studies gave it all 13 tables."""
    import sqlite3

    from test_bad_input import KEY, _one_row_db

    from zhantune.inductor.table import read_table

    rocm = "gfx90a:sramecc+:xnack-"
    assert read_table({f"{rocm}+{KEY}": [{"template_id": "aten::mm"}]}).table
    _one_row_db(tmp_path / "a.db", "a", 4, {"max_autotune_gemm_backends": "ATEN"}, KEY)
    with sqlite3.connect(tmp_path / "a.db") as con:
        con.execute("update zt_device set key = ?, name = ?, kind = 'cuda'", (rocm, rocm))
        con.execute("update zt_measurement set kind = 'default', lookup_key = ?", (f"{rocm}+{KEY}",))
        con.execute("""update zt_problem set shape = '{"M": 32, "N": 128, "K": 64, "B": 1}'""")  # KEY's GEMM
        for table in OPTUNA_TABLES:
            con.execute(f"drop table if exists {table}")
    con.close()
    before = _digest(tmp_path / "a.db")
    r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'a.db'}]", f"storage.url=sqlite:///{tmp_path / 'all.db'}"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+1 measurement(s)" in r.stdout, r.stdout + r.stderr
    assert _digest(tmp_path / "a.db") == before


def test_merge_takes_a_kernel_tuner_kernel_named_like_a_gemm(cli, tmp_path):
    """A Kernel Tuner kernel named ``mm`` is stored with problem op "mm" and its own parameters: the
    merge's checks (knobs, GEMM shapes) are for Inductor's rows and let it through (it was refused:
    its parameter x is no tuning knob)."""
    from test_bad_input import _kt_file

    path = _kt_file(tmp_path, "mm_GPU.json.gz", 4.0, kernel_name="mm")
    a, b = (f"sqlite:///{tmp_path / n}" for n in ("a.db", "b.db"))
    r = cli([f"files=[{path}]", f"storage.url={a}"], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli(["merge", f"sources=[{a}]", f"storage.url={b}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "+2 measurement(s)" in r.stdout, r.stdout + r.stderr


def test_a_password_in_a_database_url_is_never_shown(cli, tmp_path, postgres):
    """PostgreSQL URLs with a password (the test server trusts any), after ``user:`` (one with a
    '/' in it, set by ``++``) or as libpq's ``?password=``: a replay, a multirun, db current and a
    db merge refusing the database as a source (a row that sets cpp.march) name the database without
    it; so do a user error that echoes the override and a multirun whose first job does not compose.
    The password appears nowhere in any command's output, the stored config, or a file Hydra saved
    (.hydra/ of each run, a multirun's multirun.yaml)."""
    from test_bad_input import _kt_file

    base = postgres.new_database()
    url, slash = base.replace("postgres@", "postgres:s3cret@"), base.replace("postgres@", "postgres:s3cret/2@")
    shown = url.replace(":s3cret@", ":***@")
    path = _kt_file(tmp_path, "k_GPU.json.gz", 4.0)
    replay = ["bench=replay", f"bench.path={path}", "progress=false"]
    r = cli([*replay, "search.n_trials=2", f"storage.url={url}"], tmp_path)
    assert r.returncode == 0 and f"database: {shown}" in " ".join(r.stdout.split()), r.stdout[-2000:] + r.stderr[-2000:]
    _saved_without_password(tmp_path / "hydra", [r], shown)
    r = cli([*replay, "search.n_trials=2", f"storage.url={url}", f"+storage.uri={url}"], tmp_path)  # and a typo
    assert r.returncode == 2 and "'storage.uri' is not an option of storage" in r.stderr, r.stderr
    _saved_without_password(tmp_path / "hydra", [r], shown)  # Hydra saved the config before the check
    r = cli(["-m", *replay, "search.n_trials=3,4", f"++storage.url={slash}", "hydra.sweep.dir=sweep"], tmp_path)
    assert r.returncode == 0 and f"storage of the jobs: {shown}" in " ".join(r.stdout.split()), r.stdout[-2000:]
    _saved_without_password(tmp_path / "sweep", [r], shown, runs=2)
    assert "s3cret" not in (tmp_path / "sweep" / "0" / "zhantune_job.json").read_text()
    store = Store(url)
    with store.session() as s:  # nor in the composed config stored with the study (merges copy it)
        assert "s3cret" not in repr([st.config for st in s.scalars(select(m.Study))])
    r = cli(["current", f"storage.url='{base}?password=s3cret'"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and f"{base}?password=***: revision" in r.stdout, r.stdout + r.stderr
    _saved_without_password(tmp_path / "hydra", [r], f"{base}?password=***")
    r = cli(["current", f"storage.uri={url}"], tmp_path, module="zhantune.db")  # the typo named, not its value
    assert r.returncode == 2 and "override storage.uri=...: 'storage.uri' is not an option of storage; did you mean " \
        "storage.url?" in r.stderr and "s3cret" not in r.stderr, r.stderr
    # a sweep over URLs whose first job does not compose: refused before any job ran (every job is checked first;
    # Hydra had saved multirun.yaml before, which must not hold the password either where it is written)
    r = cli(["-m", *replay, "search.n_trials=abc,1", f"storage.url=sqlite:///a.db,{url}", "hydra.sweep.dir=nojob"],
            tmp_path)
    assert r.returncode == 2 and not list((tmp_path / "nojob").glob("*/.hydra")), r.stdout + r.stderr
    assert "sweep job #0 (search.n_trials=abc storage.url=sqlite:///a.db): Error merging override" in r.stderr
    saved = tmp_path / "nojob" / "multirun.yaml"
    assert "s3cret" not in r.stdout + r.stderr + (saved.read_text() if saved.exists() else "")
    r = cli(["-m", *replay, "search.n_trials=1,abc", f"storage.url={url}", "hydra.sweep.dir=nojob2"], tmp_path)
    assert r.returncode == 2 and "search.n_trials=abc" in r.stderr and "s3cret" not in r.stdout + r.stderr, r.stderr
    # a password from the environment (an interpolation) in an error; one with a quote, unparsable
    r = cli(["current", "storage.url=sqlite://me:${oc.env:ZT_PW}@/nowhere/x.db"], tmp_path, module="zhantune.db",
            env={"ZT_PW": "s3cret"})
    assert r.returncode == 2 and "sqlite://me:***@/nowhere/x.db: directory" in r.stderr and "s3cret" not in r.stderr
    quoted = base.replace("postgres@", 'postgres:a"s3cret@')
    r = cli(["current", f'storage.url="{quoted}"'], tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "not valid in Hydra's override grammar" in r.stderr and "s3cret" not in r.stderr
    dev = store.device_id("cpu0", "cpu0", "cpu", {})
    prob = store.problem_id("mm[M=4,N=4,K=4]:float32", op="mm", shape={"M": 4, "N": 4, "K": 4, "B": 1},
                            dtype="float32", activation=None, weight_layout="kn", lookup_op="mm", lookup_key=None,
                            flops=128)
    store.add_measurement(study_id=store.study_id("evil", {}), device_id=dev, problem_id=prob, kind="candidate",
                          status="ok", template_id=None, params={"cpp.march": "native"}, median_us=1.0,
                          torch_version="2.13.0")
    store.engine.dispose()
    r = cli(["merge", f"sources=[{url}]", f"storage.url=sqlite:///{tmp_path / 'all.db'}"], tmp_path,
            module="zhantune.db")
    assert r.returncode == 2 and r.stderr.startswith(f"zhantune: sources[0]={shown}: measurement "), r.stderr
    _saved_without_password(tmp_path / "hydra", [r], shown)


def test_a_lock_held_past_the_busy_timeout_is_one_line_with_what_to_do(tmp_path):
    """Another writer holding SQLite's lock past the busy timeout ended a tune or a merge in a
    traceback (Optuna's StorageInternalError around "database is locked"; a review held it 30 s):
    the apps print this line instead (the CLI path takes the 30 s timeout, so it is not run here)."""
    import optuna

    from zhantune.storage.rerun import locked_out

    db = tmp_path / "l.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("create table t (x)")
    holder.execute("begin exclusive")
    try:
        sqlite3.connect(db, timeout=0).execute("insert into t values (1)")
    except sqlite3.OperationalError as e:
        try:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
        except optuna.exceptions.StorageInternalError as wrapped:
            msg = locked_out(wrapped, "sqlite://me:s3cret@/l.db")
    finally:
        holder.execute("rollback")
        holder.close()
    assert msg.startswith("storage.url=sqlite://me:***@/l.db: the database (or, for a merge, one of its sources) stayed locked")
    assert msg.endswith("run the same command again to continue") and "s3cret" not in msg
    assert locked_out(RuntimeError("something else"), "sqlite:///l.db") is None
    # two merges or imports into one database at once (a helper's, 0.2 s apart): the second's row was
    # there already (UNIQUE); a rerun skips what is there. Only for them: in a tune it is a bug's
    from sqlalchemy.exc import IntegrityError

    race = IntegrityError("INSERT ...", {}, sqlite3.IntegrityError("UNIQUE constraint failed: zt_measurement.study_id"))
    assert locked_out(race, "sqlite:///l.db", concurrent=True) == (
        "storage.url=sqlite:///l.db: another merge or import wrote the same rows at the same time; nothing stored was "
        "lost: run the same command again to finish this one")
    assert locked_out(race, "sqlite:///l.db") is None
    broken = IntegrityError("INSERT ...", {}, sqlite3.IntegrityError("NOT NULL constraint failed: zt_measurement.kind"))
    assert locked_out(broken, "sqlite:///l.db", concurrent=True) is None  # the same every time: not a race


def test_a_full_disk_under_a_tune_or_a_merge_is_one_line_and_the_rerun_continues(cli, tmp_path, small_disk):
    """A helper's: on a full disk a tune ended in Optuna's traceback saying "invalid data in the
    commit, e.g. exceeding max length" (the cause, SQLite's "database or disk is full", further down
    the chain), and a merge in zhantune's StorageInternalError. One line now, exit 2, and once space
    is freed the same command continues to the budget."""
    url = f"sqlite:///{small_disk}/z.db"
    replay = ["bench=replay", f"bench.path={GEMM}", f"storage.url={url}", "progress=false"]
    r = cli([*replay, "search.n_trials=2"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    Store(f"sqlite:///{tmp_path / 'src.db'}").engine.dispose()
    assert cli(["files=[" + str(A100) + "]", f"storage.url=sqlite:///{tmp_path / 'src.db'}"], cwd=tmp_path,
               module="zhantune.kerneltuner").returncode == 0
    filler = fill(small_disk)
    for args, module in (([*replay, "search.n_trials=8"], "zhantune"),
                         (["merge", f"sources=[sqlite:///{tmp_path / 'src.db'}]", f"storage.url={url}"], "zhantune.db")):
        r = cli(args, cwd=tmp_path, module=module)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert lines[0] == (f"zhantune: storage.url={url}: the disk holding the database is full; nothing stored was "
                            "lost: free some space and run the same command again to continue"), lines
    filler.unlink()
    r = cli([*replay, "search.n_trials=8"], cwd=tmp_path)
    assert r.returncode == 0 and "the study holds 8 of 8" in " ".join(r.stdout.split()), r.stdout[-2000:]


def test_merging_into_a_damaged_database_is_one_line_and_leaves_it(cli, tmp_path):
    """A target whose schema page is damaged ("malformed database schema", a DatabaseError that is not
    an OperationalError) was a traceback from the probe (a review's finding)."""
    Store(f"sqlite:///{tmp_path / 'src.db'}").engine.dispose()
    Store(f"sqlite:///{tmp_path / 'bad.db'}").engine.dispose()
    with open(tmp_path / "bad.db", "r+b") as f:
        f.seek(100)  # past the file header: the first page's b-tree of sqlite_schema
        f.write(b"\x0d\x00\x00\x00\x05\x0f\x00" + b"\xee" * 3000)
    before = _digest(tmp_path / "bad.db")
    r = cli(["merge", f"sources=[sqlite:///{tmp_path / 'src.db'}]", f"storage.url=sqlite:///{tmp_path / 'bad.db'}"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not a readable database" in r.stderr and "left untouched" in r.stderr
    assert _digest(tmp_path / "bad.db") == before


def test_a_password_the_override_grammar_splits_is_refused_before_anything_is_saved(cli, tmp_path):
    """``sources=[postgresql+psycopg://u:Se,cRET9@h/db]`` unquoted: Hydra's list grammar splits it at
    the comma, and the tail ``cRET9@h/db`` was saved in .hydra/config.yaml, masked nowhere (a
    review's finding). Refused before Hydra runs, naming no part of the password; quoted, it passes."""
    r = cli(["merge", "sources=[postgresql+psycopg://tuner:Se,cRET9@127.0.0.1:1/zt]", "storage.url=sqlite:///t.db"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "grammar splits" in r.stderr and "cRET9" not in r.stdout + r.stderr
    assert not (tmp_path / "hydra").exists()  # nothing saved
    r = cli(["merge", "sources=['postgresql+psycopg://tuner:Se,cRET9@127.0.0.1:1/zt']", "storage.url=sqlite:///t.db"],
            tmp_path, module="zhantune.db")
    assert r.returncode == 2 and "cannot open the database" in r.stderr and "grammar" not in r.stderr, r.stderr
    assert not [p for p in (tmp_path / "hydra").rglob("*") if p.is_file() and "cRET9" in p.read_text()]
    # not split: escaped (Hydra keeps it whole), and two URLs with passwords in one list
    from zhantune.cli import check_group_overrides  # what the CLI runs first

    for sources in ("sources=[postgresql+psycopg://tuner:Se\\,cRET9@127.0.0.1:1/zt]",
                    "sources=[postgresql+psycopg://u:pw1@127.0.0.1:1/a,postgresql+psycopg://u:pw2@127.0.0.1:1/b]"):
        assert check_group_overrides(["merge", sources, "storage.url=sqlite:///t.db"]) is None, sources
    assert "grammar splits" in check_group_overrides(["sources=[postgresql+psycopg://u:a,b@127.0.0.1:1/zt]"])


def _saved_without_password(root: Path, results: list, shown: str, runs: int = 1) -> None:
    """No password in the commands' output, nor in Hydra's saved files under ``root`` (a multirun job's
    overrides escape colons); the ``runs`` runs saved under ``root`` (a run directory is re-used by
    the next run) name the database as ``shown`` in their saved overrides and config."""
    assert all("s3cret" not in r.stdout + r.stderr for r in results)
    saved = {p.relative_to(root).as_posix(): p.read_text().replace("\\:", ":") for p in root.rglob("*.yaml")}
    assert [name for name, text in saved.items() if "s3cret" in text] == []
    overrides = [name for name in saved if name.endswith(".hydra/overrides.yaml")]
    assert len(overrides) == runs and all(shown in saved[name] for name in overrides), saved
    assert all(shown in saved[name.replace("overrides", "config")] for name in overrides), saved


@pytest.mark.parametrize("url, password, shown", [
    ("postgresql+psycopg://me:pa/ss w'rd\"@h:5432/db", "pa/ss w'rd\"", "postgresql+psycopg://me:***@h:5432/db"),
    ("postgresql+psycopg://me:p%40ss@h/db", "p@ss", "postgresql+psycopg://me:***@h/db"),
    ("postgresql+psycopg://me@h/db?sslmode=require&password=p%26w", "p&w",
     "postgresql+psycopg://me@h/db?password=***&sslmode=require"),
    ("sqlite://me:gpu@", "gpu", "sqlite://me:***@"),
    ("postgresql+psycopg://me:p@ss@h/db", "p@ss", "postgresql+psycopg://me:***@h/db"),  # check_url refuses it
    ("postgresql+psycopg://me:pw@h:port/db", "pw", "postgresql+psycopg://me:***@h:port/db"),  # SQLAlchemy refuses it
    ("postgresql+psycopg://me@corp@h.example/db", None, "postgresql+psycopg://me%40corp@h.example/db"),
])
def test_redact_url_hides_any_password_and_nothing_else(url, password, shown):
    """A password after ``user:`` holding '/', a blank, quotes or a raw '@', URL-quoted, or libpq's
    ``?password=``: hidden in the URL as SQLAlchemy renders it (as given where it does not parse it),
    and in the override's escaped form (a multirun's); text where the password stands elsewhere than
    in a URL (a study name, a longer query value) is left alone. A user name holding '@' (Azure's
    user@server) and no password is a valid URL; a password with a raw '@' is refused."""
    from hydra._internal.grammar.utils import escape_special_characters

    from zhantune.errors import StorageError
    from zhantune.redact import mask, override_secrets, url_secrets
    from zhantune.storage import redact_url
    from zhantune.storage.engine import check_url

    assert redact_url(url) == shown
    secrets = url_secrets([url])
    assert password in secrets if password else secrets == set()
    override = f"storage.url={escape_special_characters(url)}"
    assert mask(override, override_secrets([override])) == f"storage.url={escape_special_characters(mask(url, secrets))}"
    assert "***" in mask(override, override_secrets([override])) or not password
    other = f"kerneltuner:{password}@GPU, {password}: @{password}, ?password={password}x"
    assert mask(other, secrets) == other
    if "@" in url.split("://")[1].split("/")[0].rsplit("@", 1)[0]:  # two '@' before the host
        if password:  # SQLAlchemy would connect to host "ss@h"
            with pytest.raises(StorageError, match="an '@' in the host; write an '@' in the password as %40"):
                check_url(url)
        else:
            check_url(url)


@pytest.mark.parametrize("override, shown", [
    ("storage.url='postgresql+psycopg://me:a\\'b@h/db'", "storage.url='postgresql+psycopg://me:***@h/db'"),
    ("storage.url=postgresql+psycopg://me@h/db?password=pw", "storage.url=postgresql+psycopg://me@h/db?password=***"),
    ("storage_url=postgresql+psycopg://me:pw@h/db", "storage_url=postgresql+psycopg://me:***@h/db"),  # a misspelt key
    ("sources=[postgresql+psycopg://me:a,b@h/db]", "sources=[postgresql+psycopg://me:***@h/db]"),
    ("storage.url=postgresql+psycopg://me@h/db?password=${oc.env:PW}", None),  # an interpolation: no password
    ("bench.path=http://host:8080/a@b.json", None),  # not a URL option, not a database URL
])
def test_an_override_shows_no_password_in_any_form(override, shown):
    """As the command line's overrides are echoed in errors and saved by Hydra: a password quoted with
    an escaped quote, a ?password= (followed by a message's colon), under a misspelt key, cut by an
    unquoted comma (Hydra splits it; the error names the first piece alone); an interpolation and a
    file URL are no password."""
    from zhantune.redact import mask, override_secrets

    secrets = override_secrets([override])
    assert mask(override, secrets) == (shown or override)
    assert mask(f"override {override}: not valid", secrets) == f"override {shown or override}: not valid"
    if "a,b" in override:
        assert mask("sources[0]='postgresql+psycopg://me:a' is not a database URL", secrets) == \
            "sources[0]='postgresql+psycopg://me:***' is not a database URL"


def test_a_failed_jobs_overrides_are_printed_without_the_password(capsys):
    """Hydra prints a failed job's overrides ("Error executing job with overrides") when its return
    value is read; zhantune's callback, listed last in the tune app's callbacks so that Hydra calls
    its on_job_end first, hides the password before."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from zhantune.config import CONF_DIR
    from zhantune.redact import HidePasswords

    callbacks = OmegaConf.load(CONF_DIR / "config.yaml").hydra.callbacks
    assert list(callbacks)[-1] == "hide_passwords" and callbacks.hide_passwords._target_ == "zhantune.redact.HidePasswords"
    url = "postgresql+psycopg://me:s3cr%40t@db.example:5432/z"
    ret = JobReturn(overrides=[f"storage.url={url}", "+op=mm"], status=JobStatus.FAILED, _return_value=RuntimeError("x"))
    HidePasswords().on_job_end(config=OmegaConf.create({"storage": {"url": url}}), job_return=ret)
    with pytest.raises(RuntimeError):
        _ = ret.return_value  # Hydra reads it so: the print, then the raise
    err = capsys.readouterr().err
    assert "storage.url=postgresql+psycopg://me:***@db.example:5432/z" in err and "s3cr" not in err, err
    # submitit pickles the whole JobReturn (<job>_result.pkl): its configs keep no password either
    import pickle

    ret = JobReturn(overrides=[f"storage.url={url}"], status=JobStatus.COMPLETED, _return_value={"x": 1})
    ret.cfg = OmegaConf.create({"storage": {"url": url}, "op": {"name": "mm"}})
    ret.hydra_cfg = OmegaConf.create({"hydra": {"overrides": {"task": [f"storage.url={url}"]}}})
    HidePasswords().on_job_end(config=OmegaConf.create({"storage": {"url": url}}), job_return=ret)
    assert b"s3cr" not in pickle.dumps(ret) and ret.cfg.storage.url == "postgresql+psycopg://me:***@db.example:5432/z"
    assert ret.cfg.op.name == "mm" and ret.return_value == {"x": 1}


def test_merge_into_postgresql(tmp_path, postgres):
    a = f"sqlite:///{tmp_path / 'a.db'}"
    assert _worker(a, tmp_path / "m", 10).wait(timeout=300) == 0
    target = postgres.new_database()
    from zhantune.storage.merge import merge_into

    stats = merge_into(Store(target), Store(a), label="a")
    assert stats.measurements_added == 10 and len(_candidates(target)) == 10


def test_a_json_value_of_the_wrong_kind_on_postgresql_is_refused_by_readers_and_merge(tmp_path, postgres):
    """PostgreSQL's json type holds any valid JSON: a device's properties edited to a string reached
    merge as a str and raised AttributeError (a review's finding); it is refused in one line, as on SQLite."""
    from sqlalchemy import text

    from zhantune.storage.merge import check_importable

    url = postgres.new_database()
    store = Store(url)
    store.device_id("cpu-x", "cpu-x", "cpu", {"threads": 2})
    store.check_readable()  # what a run writes reads
    with store.engine.begin() as conn:
        conn.execute(text("""update zt_device set properties = '"x"'"""))
    with pytest.raises(StorageError, match=r"device 1: properties '\"x\"' is not a JSON object; no zhantune run"):
        store.check_readable()
    with pytest.raises(StorageError, match=r"sources\[0\]=.*: device 1: properties '\"x\"' is not a JSON object; "
                                           r"nothing was merged"):
        check_importable(store, "sources[0]")
    store.engine.dispose()


def test_merge_keeps_the_settled_claims_so_the_merged_export_ships_what_the_source_did(cli, tmp_path):
    """A tune's paired rounds did not confirm its best config's speedup (verdict), so its database
    exports Inductor's default although the config's stored time is lower. The merged database
    must export the same: without the verdicts it fell back on the unpaired statistics and shipped
    the config as a tuned entry."""
    from zhantune.bench.measurement import Measurement
    from zhantune.bench.timing import summarize_us
    from zhantune.candidate import Candidate
    from zhantune.inductor.builder import build_table
    from zhantune.inductor.choices import LookupEvent
    from zhantune.problems import GemmProblem
    from zhantune.storage import Recorder

    src, merged = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'merged.db'}"
    store, problem = Store(src), GemmProblem("mm", (64, 64, 64), "float32")
    key = "((torch.float32, [64, 64], [64, 1]), (torch.float32, [64, 64], [64, 1]))+mm"
    study_id = store.study_id("s", {})
    rec = Recorder(store, problem, study_id, store.device_id("cpu-x", "cpu-x", "cpu", {}),
                   store.problem_id(problem.key, lookup_key=key, **problem.row_fields()))
    lookup = LookupEvent("mm", f"cpu-x+{key}", key, {"aten::mm": None}, ())
    cpp = Candidate("cpp_gemm", "config", None, {"max_autotune_gemm_backends": "CPP"})
    rec.add(Measurement("ok", timing=summarize_us([100.0, 101.0], "t"), lookup=lookup), "default")
    rec.add(Measurement("ok", timing=summarize_us([50.0, 51.0], "t"), lookup=lookup), "candidate", cpp, trial_number=0)
    store.add_verdict(study_id=study_id, device_id=rec.device_id, problem_id=rec.problem_id,
                      config_hash=cpp.config_hash, ratio=1.01, ratio_low=0.6, ratio_high=1.9, rounds=3,
                      contended=2, confirmed=False, reason="not faster in every round")
    shipped = build_table(store, min_speedup=1.0)
    assert shipped == {f"cpu-x+{key}": [{"template_id": "aten::mm"}]}

    r = cli(["merge", f"sources=[{src}]", f"storage.url={merged}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "1 verdict(s)" in r.stdout, r.stdout + r.stderr
    assert build_table(Store(merged), min_speedup=1.0) == shipped
    r = cli(["merge", f"sources=[{src}]", f"storage.url={merged}"], tmp_path, module="zhantune.db")
    assert r.returncode == 0 and "0 verdict(s)" in r.stdout  # merged twice: nothing copied again


def test_a_worker_interrupted_while_waiting_to_create_never_removes_the_database_another_created(tmp_path):
    """Two workers start on one new SQLite file: the second saw no file, waits for the schema lock
    while the first creates the database, and is interrupted (Ctrl-C) while it waits. The database
    the first created, rows included, is left as it is (it used to be removed as "half-created")."""
    from zhantune.storage.engine import file_lock

    db = tmp_path / "new.db"
    url = f"sqlite:///{db}"
    # Ctrl-C as in a terminal: a shell's background job (nohup ... &) starts with SIGINT ignored, and
    # this process's children inherit that (seen: the waiter slept on in flock, SIGINT in SigIgn)
    waiter_code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                   "from zhantune.storage import Store; Store(sys.argv[1])")
    with file_lock(Path(f"{db}.zt-lock")):  # this test is the first worker, creating the database
        waiter = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", waiter_code, url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _has_open(waiter.pid, f"{db}.zt-lock"):
            assert waiter.poll() is None, waiter.communicate()
            time.sleep(0.1)  # until the waiter has opened the lock file: it waits for the lock
        time.sleep(0.5)
        assert waiter.poll() is None and _has_open(waiter.pid, f"{db}.zt-lock")
        src = tmp_path / "made.db"
        made = Store(f"sqlite:///{src}")
        made.device_id("cpu-x", "cpu-x", "cpu", {})  # a database with one row
        made.engine.dispose()  # the WAL checkpointed into the file
        shutil.copy(src, db)
        waiter.send_signal(signal.SIGINT)
        try:
            waiter.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # say where the waiter was (this is how SigIgn showed up)
            state = _proc_state(waiter.pid)
            waiter.send_signal(signal.SIGABRT)  # faulthandler writes its Python stack to stderr
            _, err = waiter.communicate(timeout=60)
            raise AssertionError(f"the interrupted waiter did not exit in 120 s: {state}; "
                                 f"its stack: {err[-2000:]}") from None
    assert waiter.returncode != 0  # interrupted, not finished
    assert db.exists() and [d.key for d in Store(url).devices()] == ["cpu-x"]


def _proc_state(pid: int) -> str:
    """A stuck process's scheduling state, signal masks and kernel wait channel (/proc/PID)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        keep = [line for line in status if line.split(":")[0] in ("State", "Threads", "SigPnd", "ShdPnd",
                                                                   "SigBlk", "SigIgn", "SigCgt")]
        return "; ".join(keep + [f"wchan {Path(f'/proc/{pid}/wchan').read_text()}",
                                 f"policy {os.sched_getscheduler(pid)}"])
    except OSError as e:
        return f"unreadable: {e}"


def _has_open(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` open (/proc/PID/fd)."""
    try:
        return any(os.readlink(fd) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.mark.parametrize("change, message", [
    (f"update zt_measurement set min_us = {bad} where id = (select min(id) from zt_measurement "
     "where status = 'ok')", "min_us ") for bad in ("0",)] + [  # every column and value: the next test
    ("update zt_device set key = key || char(27) || '[31mRED' || char(10) || '2nd line'", "device 1: key "),
])
def test_a_stored_value_no_run_writes_is_refused_in_one_line_by_every_reader(cli, tmp_path, change, message):
    """A received database with min_us 0 (or negative, text, infinite) crashed compare and export
    (ZeroDivisionError, StatisticsError, TypeError), transfer, and was merged as it was; a device key
    with a terminal escape and a newline reached the console: each reader now names the row in one
    line, exit 2, and nothing is written (the tune refuses before its study)."""
    db, good = tmp_path / "bad.db", tmp_path / "good.db"
    r = cli(["files=[" + str(GEMM) + "]", f"storage.url=sqlite:///{db}"], tmp_path, module="zhantune.kerneltuner")
    assert r.returncode == 0, r.stderr
    shutil.copy(db, good)
    con = sqlite3.connect(db)
    con.execute(change)
    con.commit()
    con.close()  # checkpointed: the file's bytes are the database's
    before = {p: _digest(p) for p in (db, good)}
    for module, args in [("zhantune.compare", [f"storage.url=sqlite:///{db}"]),
                         ("zhantune.export", [f"storage.url=sqlite:///{db}", f"path={tmp_path}/t.json"]),
                         ("zhantune.db", ["merge", f"sources=[sqlite:///{db}]", f"storage.url=sqlite:///{good}"]),
                         ("zhantune", ["bench=replay", f"bench.path={A100}", "search.n_trials=2", "progress=false",
                                       f"storage.url=sqlite:///{db}"])]:
        r = cli(args, tmp_path, module=module)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], (module, r.stderr[-2000:])
        assert "Traceback" not in r.stdout + r.stderr and "\x1b" not in r.stdout + r.stderr
        assert lines[0].startswith(f"zhantune: {'sources[0]' if module == 'zhantune.db' else 'storage.url'}=")
    assert {p: _digest(p) for p in (db, good)} == before and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("bad", ["X'1b5b33316d'", "'2.13' || char(27) || '[31m' || char(10)"])
@pytest.mark.parametrize("row", ["verdict", "measurement"])
def test_a_torch_version_no_run_writes_is_refused_by_readers_and_merge(tmp_path, bad, row):
    """The export prints a claim's torch, and names the torch releases a database's candidates were
    measured with (where none is the table's): a verdict's or a measurement's torch version that is not
    one line of printable text (a blob, a terminal escape) is refused by every reader and by merge (a
    measurement's merged, and would have reached the terminal)."""
    from zhantune.storage.merge import check_importable

    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    sid, dev = store.study_id("s", {}), store.device_id("d", "d", "cpu", {})
    pid = store.problem_id("p", op="mm", shape={"M": 4, "N": 4, "K": 4}, dtype="float32", activation=None,
                           lookup_op="mm", flops=128)
    store.add_verdict(study_id=sid, device_id=dev, problem_id=pid, config_hash="h", ratio=1.5, ratio_low=1.5,
                      ratio_high=1.5, rounds=3, contended=0, confirmed=True, reason="r")
    for _ in range(2):
        store.add_measurement(study_id=sid, device_id=dev, problem_id=pid, kind="candidate", status="ok",
                              template_id=None, params={}, median_us=2.0, min_us=1.0, trial_number=None,
                              torch_version="2.13.0+cpu")
    store.check_readable()
    rid = 1 if row == "verdict" else 2
    with sqlite3.connect(tmp_path / "v.db") as con:
        con.execute(f"update zt_{row} set torch_version = {bad} where id = {rid}")
    with pytest.raises(StorageError, match=rf"{row} {rid}: torch_version .* is not one line of printable text"):
        store.check_readable()
    with pytest.raises(StorageError, match=rf"{row} {rid}: torch_version .* not one line of printable text; nothing"):
        check_importable(store, "sources[0]")


def test_a_gemm_row_named_like_a_kernel_tuner_template_is_still_allow_listed(tmp_path):
    """merge skipped the tuning-knob allow-list for any row whose template_id started with
    ``kerneltuner::``: a GEMM row relabelled so carried ``cpp.march`` into the target (a review's
    finding). Only a Kernel Tuner problem's rows skip it."""
    from zhantune.bench.recorded import load_kerneltuner
    from zhantune.storage.ingest import import_kerneltuner
    from zhantune.storage.merge import check_importable

    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    import_kerneltuner(store, load_kerneltuner(A100))  # its rows: kerneltuner:: templates, its own parameters
    check_importable(store, "sources[0]")
    sid, dev = store.study_id("s", {}), store.device_id("d", "d", "cpu", {})
    pid = store.problem_id("mm[M=4,N=4,K=4]:float32", op="mm", shape={"M": 4, "N": 4, "K": 4, "B": 1},
                           dtype="float32", activation=None, lookup_op="mm", flops=128)
    store.add_measurement(study_id=sid, device_id=dev, problem_id=pid, kind="candidate", status="ok",
                          template_id="kerneltuner::x", params={"cpp.march": "native"}, median_us=1.0,
                          torch_version="2.13.0")
    with pytest.raises(StorageError, match=r"measurement \d+: params.cpp.march: .*nothing was merged"):
        check_importable(store, "sources[0]")


@pytest.mark.parametrize("change, refused", [
    ("update zt_device set key = key || '{x300}'", r"device 1: key of 301 characters; the column holds 256"),
    ("update zt_study set name = '{x600}'", r"study 1: name of 600 characters; the column holds 512"),
    ("update zt_verdict set reason = 'a' || char(0) || 'b'", r"verdict 1: reason \"a\\u0000b\" holds a NUL character"),
    ("update zt_device set name = 'line1' || char(10) || 'line2'", r"device 1: name \"line1\\nline2\" is not one line"),
])
def test_merge_refuses_what_another_database_could_not_store_or_a_reader_read(tmp_path, change, refused):
    """A helper's attack (session 46): an SQLite source holding values no zhantune run writes and
    PostgreSQL's columns refuse (a 301-character device key, a NUL in a verdict's reason) failed with
    a traceback half way through a merge into PostgreSQL, the sources before it written; a device
    name with a newline merged, then every reader refused the target. Refused before anything is
    written, whatever the target."""
    from zhantune.storage.merge import check_importable

    _one_run(f"sqlite:///{tmp_path / 'src.db'}").engine.dispose()
    con = sqlite3.connect(tmp_path / "src.db")
    con.execute(change.format(x300="x" * 300, x600="n" * 600))
    con.commit()
    con.close()
    with pytest.raises(StorageError, match=rf"^sources\[1\]=sqlite:///.*src.db: {refused}.*; nothing was merged$"):
        check_importable(Store(f"sqlite:///{tmp_path / 'src.db'}"), "sources[1]")


def test_merge_refuses_a_postgresql_sources_infinite_date_or_number_in_one_line(tmp_path, postgres):
    """A helper's attack (session 46): a PostgreSQL source's 'infinity' timestamp (or a date BC) made
    a merge end in a traceback (psycopg: timestamp too large), and a JSON number 1e400 merged into
    SQLite as Infinity, which is not JSON: every reader then refused the target."""
    from zhantune.storage.merge import check_importable

    url = postgres.new_database()
    _one_run(url).engine.dispose()
    engine = create_engine(url)
    for change, refused in (("update zt_study set started_at = 'infinity'",
                             r"table zt_study: a stored value does not decode \(timestamp too large"),
                            ("""update zt_device set properties = '{"n": 1e400}'""",
                             r"device 1: properties.n is inf, a number JSON cannot write")):
        with engine.begin() as conn:
            conn.exec_driver_sql(change)
        with pytest.raises(StorageError, match=rf"^sources\[0\]=postgresql.*: {refused}.*nothing was merged$"):
            check_importable(Store(url), "sources[0]")
        with engine.begin() as conn:
            conn.exec_driver_sql("update zt_study set started_at = now()")
    engine.dispose()


def test_a_problem_measured_on_a_cpu_and_a_gpu_merges_though_their_lookups_differ(tmp_path):
    """A review's finding: merge's new check refused a database zhantune writes itself. One problem
    row serves every device (its lookup key is the first device's), and a float32 linear_act is an
    addmm lookup on CPU and an mm on a GPU. A row's lookup key is checked against the problem's shape;
    one of another GEMM's shape (an edited row: its config would ship under that GEMM's key) is refused."""
    from zhantune.storage.merge import check_importable

    store = Store(f"sqlite:///{tmp_path / 'two.db'}")
    sid = store.study_id("s", {})
    cpu, gpu = store.device_id("cpu0", "cpu0", "cpu", {}), store.device_id("NVIDIA H100", "NVIDIA H100", "cuda", {})
    addmm = ("((torch.float32, [64], [1]), (torch.float32, [32, 48], [48, 1]), (torch.float32, [48, 64], [64, 1]))"
             "+alpha=1&beta=1+addmm")
    mm = "((torch.float32, [32, 48], [48, 1]), (torch.float32, [48, 64], [64, 1]))+mm"
    pid = store.problem_id("linear_act[M=32,N=64,K=48]:float32:relu", op="linear_act",
                           shape={"M": 32, "N": 64, "K": 48, "B": 1}, dtype="float32", activation="relu",
                           lookup_op="addmm", lookup_key=addmm, flops=2 * 32 * 64 * 48)
    other = mm.replace("[48, 64], [64, 1]", "[48, 128], [128, 1]")  # N=128: another GEMM
    for dev, key in ((cpu, f"cpu0+{addmm}"), (gpu, f"NVIDIA H100+{mm}"), (gpu, f"NVIDIA H100+{other}")):
        store.add_measurement(study_id=sid, device_id=dev, problem_id=pid, kind="default", status="ok",
                              template_id=None, params={}, median_us=1.0, torch_version="2.13.0", lookup_key=key)
        if key.endswith(other):
            with pytest.raises(StorageError, match=r"measurement 3: lookup_key .* is not a lookup of its problem's "
                                                   r"GEMM \(B=1, M=32, N=64, K=48\); nothing was merged"):
                check_importable(store, "sources[0]")
        else:
            check_importable(store, "sources[0]")


def test_a_cpu_key_of_another_vector_isa_is_refused_and_a_misspelt_column_too(tmp_path):
    """A review's findings: a CPU's key is its model name and thread count, one name ("AMD EPYC") covers
    AVX2 and AVX-512 machines, and a tune into a shared database joined the other machine's device row
    (merge refused it, the tune did not). And the bulk insert of many rows dropped a misspelt column."""
    store = Store(f"sqlite:///{tmp_path / 'z.db'}")
    dev = store.device_id("AMD EPYC (2 threads)", "AMD EPYC", "cpu", {"isa": "AVX2"})
    assert store.device_id("AMD EPYC (2 threads)", "AMD EPYC", "cpu", {"isa": "AVX2"}) == dev
    assert store.device_id("AMD EPYC (2 threads)", "AMD EPYC", "cpu", {}) == dev  # not stored: not compared
    with pytest.raises(StorageError, match=r"is a CPU with vector ISA 'AVX2'; this one's is 'AVX512' \(another machine"):
        store.device_id("AMD EPYC (2 threads)", "AMD EPYC", "cpu", {"isa": "AVX512"})
    assert len(store.devices()) == 1
    # a row stored without its ISA (an older database's, a merge's target) gets this machine's, so another
    # machine's is refused from then on (a helper merged AVX2 and AVX-512 databases into one without it)
    old = store.device_id("Intel Xeon (2 threads)", "Intel Xeon", "cpu", {})
    assert store.device_id("Intel Xeon (2 threads)", "Intel Xeon", "cpu", {"isa": "AVX2"}) == old
    with pytest.raises(StorageError, match=r"vector ISA 'AVX2'; this one's is 'AVX512'"):
        store.device_id("Intel Xeon (2 threads)", "Intel Xeon", "cpu", {"isa": "AVX512"})
    # a merge compares every ISA stored for a key, whichever database's row comes first and stores none
    from zhantune.storage.merge import check_device_kinds

    stores = []
    for name, props in (("t", {}), ("a", {"isa": "AVX2"}), ("b", {"isa": "AVX512"})):
        stores.append((name, Store(f"sqlite:///{tmp_path / name}.db")))
        stores[-1][1].device_id("AMD EPYC (2 threads)", "AMD EPYC", "cpu", props)
    with pytest.raises(StorageError, match=r"^b: device .* vector ISA 'AVX512' there and 'AVX2' in a \(one model"):
        check_device_kinds(stores)
    check_device_kinds(stores[:2])
    check_device_kinds([stores[0], stores[2]])
    # one model name, one ISA, two generations (Zen 4 and Zen 5 are both "AMD EPYC" in a VM): the cpuid
    # (zhantune.device.cpuid) tells them apart, in a tune's device row and in a merge alike (session 53)
    zen4, zen5 = {"isa": "AVX512", "cpuid": "AuthenticAMD family 25 model 17"}, \
        {"isa": "AVX512", "cpuid": "AuthenticAMD family 26 model 2"}
    dev = store.device_id("AMD EPYC (4 threads)", "AMD EPYC", "cpu", {"isa": "AVX512"})  # stored before the field
    assert store.device_id("AMD EPYC (4 threads)", "AMD EPYC", "cpu", zen4) == dev  # given this machine's
    with pytest.raises(StorageError, match=r"is a CPU with identity \(vendor, family and model in /proc/cpuinfo\) "
                                           r"'AuthenticAMD family 25 model 17'; this one's is 'AuthenticAMD family 26 model 2'"):
        store.device_id("AMD EPYC (4 threads)", "AMD EPYC", "cpu", zen5)
    gens = []
    for name, props in (("t4", {"isa": "AVX512"}), ("zen4", zen4), ("zen5", zen5)):
        gens.append((name, Store(f"sqlite:///{tmp_path / name}.db")))
        gens[-1][1].device_id("AMD EPYC (4 threads)", "AMD EPYC", "cpu", props)
    with pytest.raises(StorageError, match=r"^zen5: device .* identity .* 'AuthenticAMD family 26 model 2' there and "
                                           r"'AuthenticAMD family 25 model 17' in zen4"):
        check_device_kinds(gens)
    check_device_kinds(gens[:2])
    with pytest.raises(TypeError, match="not a measurement column: median_usec"):
        store.add_measurements([{"study_id": 1, "device_id": dev, "problem_id": 1, "kind": "candidate",
                                 "status": "ok", "median_usec": 3.0, "torch_version": "2.13.0"}])


def test_every_stored_time_column_is_checked(tmp_path):
    """Store.check_readable over each time column and kind of bad value (the readers' check, tested
    through them above): 0, negative, text, NaN as text, SQLite's Inf (9e999)."""
    from zhantune.bench.recorded import load_kerneltuner
    from zhantune.storage.ingest import import_kerneltuner

    store = Store(f"sqlite:///{tmp_path / 'k.db'}")
    import_kerneltuner(store, load_kerneltuner(A100))
    store.check_readable()
    for row, (column, bad) in enumerate([("min_us", "0"), ("median_us", "-3.5"), ("max_us", "'NaN'"),
                                         ("p20_us", "9e999"), ("mean_us", "'abc'")], start=7):
        con = sqlite3.connect(tmp_path / "k.db")
        con.execute(f"update zt_measurement set {column} = {bad} where id = ?", (row,))
        con.commit()
        con.close()
        with pytest.raises(StorageError, match=rf"measurement {row}: {column} .* is not a positive, finite number"):
            store.check_readable()
        con = sqlite3.connect(tmp_path / "k.db")
        con.execute(f"update zt_measurement set {column} = 1.0 where id = ?", (row,))
        con.commit()
        con.close()
    store.check_readable()


def test_a_merge_interrupted_while_copying_an_optuna_study_is_completed_by_the_next_merge(cli, tmp_path, monkeypatch):
    """Ctrl-C during copy_study left the target's Optuna study with 40 of 100 trials, and merging
    again skipped it (its zt_study row was committed first): the next merge now adds the missing
    trials, as a prefix of the source's, and adds no study or measurement twice."""
    from optuna.storages import RDBStorage

    from zhantune.storage.merge import merge_into

    src_url, dst_url = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    r = cli(["bench=replay", f"bench.path={A100}", "search.n_trials=12", "progress=false", f"storage.url={src_url}"],
            tmp_path)
    assert r.returncode == 0, r.stderr
    source, target = Store(src_url), Store(dst_url)
    real, calls = RDBStorage._create_new_trial, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RDBStorage, "_create_new_trial", interrupted)
    with pytest.raises(KeyboardInterrupt):
        merge_into(target, source, "src")
    monkeypatch.setattr(RDBStorage, "_create_new_trial", real)
    assert len(optuna.load_study(study_name=A100_STUDY, storage=dst_url).trials) == 5
    stats = merge_into(target, source, "src")
    assert stats.studies_new == 0 and stats.measurements_added > 0
    want = optuna.load_study(study_name=A100_STUDY, storage=src_url).trials
    have = optuna.load_study(study_name=A100_STUDY, storage=dst_url).trials
    assert len(want) >= 12 and [(t.number, t.params, t.values, t.state) for t in have] == [
        (t.number, t.params, t.values, t.state) for t in want]
    again = merge_into(target, source, "src")  # nothing left to add
    assert (again.measurements_added, again.studies_new, again.verdicts_added) == (0, 0, 0)
    assert len(optuna.load_study(study_name=A100_STUDY, storage=dst_url).trials) == len(want)
