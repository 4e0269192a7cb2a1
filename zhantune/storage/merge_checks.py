"""The checks a merge makes before it writes anything (zhantune.storage.merge.merge_into copies):
each source's rows hold only what a zhantune run writes (:func:`check_importable`), no device key
joins a CPU and a GPU or two instruction sets (:func:`check_device_kinds`), no device named after a
file name gets two recordings and no device recordings of two GPUs (:func:`check_recordings`). Each raises StorageError naming the
database and the row; nothing is merged."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import NoReturn

import optuna
from sqlalchemy import inspect, select
from sqlalchemy.exc import DataError

from zhantune.errors import StorageError, StorageInternalError, shown
from zhantune.storage import orm as m
from zhantune.storage.engine import first_line, optuna_reader, optuna_reads, redact_url
from zhantune.storage.store import Store

__all__ = ["check_importable", "check_device_kinds", "check_recordings"]


def check_importable(source: Store, where: str) -> None:
    """Refuse, before anything is written, a source that merge_into could not copy whole or whose rows
    hold what no zhantune run writes; raises StorageError naming the source and the row:

    * a stored value that does not decode (a JSON column, a timestamp), by table, in zhantune's
      tables or in the Optuna studies it copies; a device kind other than cpu or cuda;
    * a measurement or verdict naming a device, problem, study or environment row that is not there;
    * a time or ratio that is not a positive, finite number (zhantune.storage.reads.TIME_COLUMNS);
    * an Inductor measurement (any row but a Kernel Tuner replay's: template_id ``kerneltuner::...``
      on a Kernel Tuner problem)
      that sets anything but allow-listed tuning knobs (zhantune.inductor.knobs: what a table
      exported from the merged database may ship);
    * what export writes into a table's keys that is not one line of Inductor's key format: a
      device key, a measurement's lookup key, a problem's (device-agnostic) lookup key; a
      measurement's lookup key that is not a lookup of its problem's GEMM (:func:`_lookup_of`: the
      export ships the row's config under it); a GEMM
      problem (op mm, addmm, bmm, ...; not a Kernel Tuner kernel of that name) whose shape is not
      positive integer dims.

    The source's URL is named with its password hidden (zhantune.storage.engine.redact_url)."""
    from zhantune.bench.recorded import TEMPLATE_PREFIX
    from zhantune.inductor.knobs import stored_params_problem

    def refuse(what: str) -> NoReturn:
        raise StorageError(f"{where}={redact_url(source.url)}: {what}; nothing was merged")

    bad = source.bad_stored_value()  # a JSON value of the wrong kind decodes, then fails where it is used
    if bad:
        refuse(bad)
    rows: dict[type, list] = {}
    for cls in (m.Device, m.Environment, m.Problem, m.Study, m.MeasurementRow, m.Verdict):
        try:
            with source.session() as s:
                rows[cls] = list(s.scalars(select(cls)))
        except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            refuse(f"table {cls.__tablename__}: a stored value does not decode ({first_line(e)})")
        except StorageInternalError as e:  # PostgreSQL's 'infinity' timestamp, which Python's datetime cannot hold
            if not isinstance(e.__cause__, DataError):
                raise
            refuse(f"table {cls.__tablename__}: a stored value does not decode ({first_line(e.__cause__.orig)})")
        _check_storable(cls, rows[cls], refuse)
    for d in rows[m.Device]:
        if d.kind not in ("cpu", "cuda"):
            refuse(f"device {d.id}: kind {json.dumps(d.kind, default=repr)[:40]} is not cpu or cuda")
        for what, value in (("key", d.key), ("name", d.name)):  # a key is the device part of exported keys
            if not (isinstance(value, str) and value.isprintable()):  # as Store.check_readable: what readers refuse
                refuse(f"device {d.id}: {what} {json.dumps(value, default=repr)[:120]} is not one line of printable text")
    kinds = {d.id: d.kind for d in rows[m.Device]}
    ids = {"device_id": kinds, "problem_id": {p.id for p in rows[m.Problem]},
           "study_id": {st.id for st in rows[m.Study]}, "environment_id": {e.id for e in rows[m.Environment]}}
    _check_keys(rows, refuse)
    for what, table in (("measurement", rows[m.MeasurementRow]), ("verdict", rows[m.Verdict])):
        for r in table:
            for column, known in ids.items():
                value = getattr(r, column, None)
                if (value is not None or column != "environment_id") and value not in known:
                    refuse(f"{what} {r.id}: {column} {value} names no row")
    bad = source.bad_time()
    if bad is not None:
        refuse(f"{bad} is not a positive, finite number")
    bad = source.bad_recorded_version()
    if bad is not None:
        refuse(f"{bad} is not one line of printable text")
    _check_optuna_studies(source, {st.name for st in rows[m.Study]}, refuse)
    # a Kernel Tuner kernel's parameters (its template id on its problem, which has no lookup key):
    # never an Inductor table's; the prefix alone let any GEMM row skip the allow-list (a review)
    recorded = {p.id for p in rows[m.Problem] if p.key.startswith("kerneltuner:") and p.lookup_key is None}
    for r in rows[m.MeasurementRow]:
        if str(r.template_id or "").startswith(TEMPLATE_PREFIX) and r.problem_id in recorded:
            continue
        bad = stored_params_problem(r.template_id, r.params, kinds[r.device_id])
        if bad:
            refuse(f"measurement {r.id}: params.{bad[0]}: {bad[1]}")


def _check_storable(cls: type, rows: list, refuse: Callable[[str], NoReturn]) -> None:
    """Refuse a row of ``cls`` that another database could not store as it is (a helper's attack: an
    SQLite source's 300-character device key, or a NUL in a verdict's reason, failed in PostgreSQL
    half way through a merge): a string longer than its column (PostgreSQL enforces the length, SQLite
    does not) or holding a NUL (PostgreSQL's text holds none; its json type, which the JSON columns
    are, does), a JSON value with a number JSON cannot write (PostgreSQL's 1e400 reads as infinity,
    which SQLite then holds as invalid JSON)."""
    from sqlalchemy import JSON, String

    for col in cls.__table__.columns:
        if not isinstance(col.type, (String, JSON)):
            continue
        for r in rows:
            value = getattr(r, col.key)
            what = f"{cls.__tablename__.removeprefix('zt_')} {r.id}: {col.key}"
            if isinstance(value, str) and isinstance(col.type, String):
                if col.type.length and len(value) > col.type.length:
                    refuse(f"{what} of {len(value):,} characters; the column holds {col.type.length}")
                if "\0" in value:
                    refuse(f"{what} {json.dumps(value)[:120]} holds a NUL character, which PostgreSQL's text cannot")
            elif isinstance(col.type, JSON) and value is not None:
                if (at := _not_finite(value)) is not None:
                    refuse(f"{what}{at[0]} is {at[1]!r}, a number JSON cannot write (only finite numbers)")


def _not_finite(value: object, at: str = "") -> tuple[str, float] | None:
    """(path, value) of the first infinite or NaN number in a JSON value, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return at, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if (found := _not_finite(v, f"{at}.{k}" if isinstance(k, str) else f"{at}[{k}]")) is not None:
            return found
    return None


def _check_keys(rows: dict[type, list], refuse: Callable[[str], NoReturn]) -> None:
    """check_importable's checks of the problems' lookup keys and shapes, then of the measurements'
    lookup keys (``rows``: the source's rows by ORM class)."""
    from zhantune.inductor.table import parse_key
    from zhantune.problems.gemm import OPS

    for p in rows[m.Problem]:
        key = p.lookup_key
        if key is not None and not (isinstance(key, str) and key.isprintable() and (parsed := parse_key(key))
                                    and parsed["device"] is None):
            refuse(f"problem {p.id}: lookup_key {json.dumps(key, default=repr)[:120]} is not a device-agnostic Inductor lookup key")
        shape, recorded = p.shape, p.key.startswith("kerneltuner:") and key is None  # a Kernel Tuner kernel's size
        if p.op in OPS and not recorded and not (isinstance(shape, dict) and shape and set(shape) <= {"M", "N", "K", "B"} and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape.values())):
            refuse(f"problem {p.id}: shape {json.dumps(shape)[:120]} is not positive integer dims M, N, K, B")
    shapes = {p.id: p.shape for p in rows[m.Problem] if p.op in OPS and isinstance(p.lookup_key, str)}
    for r in rows[m.MeasurementRow]:  # a default row's key is the one export looks its GEMM up under
        shown = json.dumps(r.lookup_key, default=repr)[:120]
        if r.lookup_key is not None and not (isinstance(r.lookup_key, str) and r.lookup_key.isprintable()
                                             and parse_key(r.lookup_key)):
            refuse(f"measurement {r.id}: lookup_key {shown} is not an Inductor lookup key")
        if r.lookup_key is not None and (shape := shapes.get(r.problem_id)) and not _lookup_of(r.lookup_key, shape):
            dims = ", ".join(f"{d}={shape[d]}" for d in ("B", "M", "N", "K") if d in shape)
            refuse(f"measurement {r.id}: lookup_key {shown} is not a lookup of its problem's GEMM ({dims})")


def _lookup_of(key: str, shape: dict) -> bool:
    """Whether a measurement's lookup key is a lookup of a GEMM of its problem's ``shape`` (M, N, K,
    B): its last two inputs' sizes are [..., M, K] and [..., K, N], the leading ones B's. Not the
    problem's own key: one problem row serves every device, and a float32 linear_act is an addmm
    lookup on CPU and an mm on a GPU (a review), an addmm template's sees the bias expanded. A key
    without two inputs of numeric sizes is not one."""
    from zhantune.inductor.knobs import key_inputs
    from zhantune.inductor.table import parse_key

    found = key_inputs((parse_key(key) or {}).get("inputs") or "")
    if len(found) < 2:
        return False
    (_, a), (_, b) = found[-2:]
    return (len(a) >= 2 and len(b) >= 2 and (a[-2], a[-1], b[-2], b[-1]) == (shape.get("M"), shape.get("K"),
            shape.get("K"), shape.get("N")) and a[:-2] in ([], [shape.get("B", 1)]))


def _check_optuna_studies(source: Store, names: set[str], refuse: Callable[[str], NoReturn]) -> None:
    """Read every trial of the Optuna studies merge_into copies (those named like a zhantune study),
    so that one that does not decode is refused before anything is written (copy_study failed half
    way). A source without Optuna's tables has none (and is not given them: nothing is written)."""
    if "studies" not in inspect(source.engine).get_table_names():
        return
    try:
        storage = optuna_reader(source.url)
        with optuna_reads(source):
            for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
                if summary.study_name in names:
                    optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
    except (ValueError, TypeError, KeyError) as e:  # json.JSONDecodeError is a ValueError
        refuse(f"Optuna's tables: a stored value does not decode ({first_line(e)})")


def check_device_kinds(stores: list[tuple[str, Store]]) -> None:
    """Refuse a merge that would join a CPU and a GPU, or two CPUs of different vector ISAs or cpuids
    (zhantune.device.CPU_IDENTITY: Zen 4 and Zen 5 are both "AMD EPYC" in a cloud VM), under one
    device key (Store.device_id keeps a key's first kind and properties: the other's rows, verdicts
    and knobs would join its rankings and tables; a CPU's key is its model name and threads, and one
    name such as "AMD EPYC" covers AVX2 and AVX-512 machines, whose C++ kernels differ: an attack's
    finding). ``stores``: (where, store), the target first when it exists. Raises StorageError
    naming both; a device stored without its ISA (cpuid) is compared with none, but every one stored for a key
    with each other (a helper's attack: a target without one let an AVX2 and an AVX-512 source merge)."""
    from zhantune.device import CPU_IDENTITY

    seen: dict[str, tuple[str, str]] = {}  # key -> (kind, where) of its first row
    idents: dict[tuple[str, str], tuple[str, str]] = {}  # (key, field) -> (value, where) of its first row storing one
    for where, store in stores:
        with store.session() as s:
            rows = s.execute(select(m.Device.key, m.Device.kind, m.Device.properties).order_by(m.Device.key))
            for key, kind, props in rows:
                first = seen.setdefault(key, (kind, where))
                if first[0] != kind:
                    raise StorageError(f"{where}: device {json.dumps(key)[:120]} is a {kind} device there and a "
                                       f"{first[0]} device in {first[1]}: nothing was merged (one key, one device)")
                for f, what in CPU_IDENTITY.items():  # the ISA, the cpuid (zhantune.device)
                    value = props.get(f) if kind == "cpu" and isinstance(props, dict) else None
                    other = idents.setdefault((key, f), (value, where)) if value else None
                    if other and value != other[0]:
                        raise StorageError(f"{where}: device {json.dumps(key)[:120]} is a CPU with {what} "
                                           f"{shown(value)} there and {shown(other[0])} in {other[1]} (one model name, "
                                           "two kinds of machine): nothing was merged (one key, one device)")


def check_recordings(stores: list[tuple[str, Store]]) -> None:
    """Refuse a merge that would put two Kernel Tuner recordings of one problem on one device that is
    named only after its file name in any of the databases (no ``device_name``: the two could be
    different GPUs; zhantune.storage.ingest.refuse_merge refuses it for an import or a replay).
    ``stores``: (where, store) for the target (when it exists) and every source; a study's file is
    its stored sha256 (an import's ``sha256``, a replay's ``replay_sha256``) and, where stored, that
    of its JSON decompressed (zhantune.storage.ingest.recording_digests: a gzipped copy of one
    recording is that recording). Unlike refuse_merge, a
    study stored without one is not compared (refusing every merge of an old database would leave no
    way to merge it). Raises StorageError naming both studies."""
    from zhantune.storage.ingest import recording_digests

    named: set[str] = set()  # named after a file name in any of the databases (another may name it otherwise)
    for _, store in stores:
        with store.session() as s:
            named |= {d.key for d in s.scalars(select(m.Device)) if (d.properties or {}).get("named_by") == "file name"}
    first: dict[tuple[str, str], tuple[set[str], str, str]] = {}  # (device, problem) -> (digests, where, study)
    for where, store in stores:
        with store.session() as s:
            pairs = set(s.execute(select(m.Device.key, m.Problem.key).distinct()
                                  .join(m.MeasurementRow, m.MeasurementRow.device_id == m.Device.id)
                                  .join(m.Problem, m.MeasurementRow.problem_id == m.Problem.id)
                                  .where(m.Device.key.in_(sorted(named))))) if named else set()
        for dev, prob in sorted(pairs):
            for name, config in store.studies_holding(dev, prob):
                digests = recording_digests(config)  # the file's bytes, and its JSON decompressed where stored
                if not digests:
                    continue
                prev = first.setdefault((dev, prob), (digests, where, name))
                if not prev[0] & digests:
                    raise StorageError(f"{where}: study {name!r} holds {prob} on device {dev!r} (named only after "
                                       f"a file name in one of the databases) from another file than study {prev[2]!r} of "
                                       f"{prev[1]}; they could be different GPUs: nothing was merged (name the "
                                       "devices apart: devices=[...] at import, bench.device_name=NAME at replay)")
    _check_recorded_names(stores)


def _check_recorded_names(stores: list[tuple[str, Store]]) -> None:
    """Refuse a merge that would leave, on one device, Kernel Tuner recordings made on two GPUs (for
    any problems; zhantune.storage.ingest.other_gpu, the rule an import and a replay follow: a helper
    merged an A100's and an A4000's imports, each named G, into one device G), whether they come from
    two of the databases or one already holds both (stored before the rule: the first merge passed
    it and a second refused it, blaming "another database", a review found). Raises StorageError
    naming both studies and their databases."""
    from zhantune.storage.ingest import RECORDED_DEVICE, other_gpu, recording_digests, with_recorded_name

    held: dict[str, list[tuple[str, str, dict | None]]] = {}  # device key -> (where, study, config)
    for where, store in stores:
        with store.session() as s:
            keys = list(s.scalars(select(m.Device.key)))
        for key in keys:
            held.setdefault(key, []).extend((where, n, with_recorded_name(c)) for n, c in store.studies_holding(key, None)
                                            if recording_digests(c))
    for key, studies in held.items():
        for where, name, config in studies:
            own = str((config or {}).get(RECORDED_DEVICE) or "")
            theirs = [(f"{n!r} of {w}", c) for w, n, c in studies if (w, n) != (where, name)]
            found = other_gpu(own, key, theirs, recording_digests(config))
            if found is not None:
                raise StorageError(
                    f"{where}: study {name!r} holds a Kernel Tuner recording made on {own!r} on device {key!r}, "
                    f"where study {found[0]} holds one "
                    + (f"made on {found[1]!r}" if found[1] else "stored before zhantune kept the device name a file "
                       "records (2026-11-30: it may be another GPU)")
                    + ": two GPUs in one device; nothing was merged (name the devices apart: devices=[...] at import, "
                    "bench.device_name=NAME at replay)")
