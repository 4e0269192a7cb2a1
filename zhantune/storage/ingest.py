"""Kernel Tuner cache files into the store: one study of one measurement per configuration.

``python -m zhantune.kerneltuner`` calls :func:`import_kerneltuner` for each file. Rows are mapped
as every other writer maps them (zhantune.storage.rows.measurement_row), with the config hashes a
``bench=replay`` tune of the same file stores (the file is answered by
zhantune.bench.recorded.ReplayBenchmarker), so that compare and transfer work on real GPU data.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING

from zhantune.bench.recorded_checks import MAX_KEY
from zhantune.errors import ConfigError
from zhantune.storage.rows import measurement_row

if TYPE_CHECKING:
    from zhantune.bench.recorded import KernelTunerFile
    from zhantune.storage.store import Store

__all__ = ["import_files", "import_kerneltuner", "check_import", "refuse_merge", "other_gpu", "with_recorded_name", "replay_study", "file_digest", "recording_digests",
           "same_recording", "IMPORTED_VERSION"]

#: torch_version of imported rows: they were measured by Kernel Tuner, not through torch
IMPORTED_VERSION = "kerneltuner"
#: a study config's key for the device name its Kernel Tuner file records (its ``device_name``,
#: stripped; "" for none), stored since 2026-11-30 by imports and replays (:func:`refuse_merge`)
RECORDED_DEVICE = "recorded_device"


def import_kerneltuner(store: Store, file: KernelTunerFile) -> tuple[str, int]:
    """Store every configuration of ``file`` (a loaded Kernel Tuner cache file) as one study named
    ``kerneltuner:<file name>@<device key>`` (``<file name>[sha256:<first 12 hex digits>]`` when a
    study of that name holds another file's data: never merged into it nor overwriting its
    provenance); returns (study name, rows added; 0 when the study already holds this file's).
    Raises ConfigError when a file without a device name would add a problem to a device that holds
    it from another file (:func:`refuse_merge`). The same recording under another file name (a copy,
    gzipped or decompressed: :func:`same_recording`) already imported for this device adds nothing
    either: (that study's name, 0)."""
    from zhantune.bench.recorded import ReplayBenchmarker

    device = file.device()
    problem = file.problem()
    digest = file.sha256
    refuse_merge(store, file)
    for held_name, config in store.studies_holding(device.key, problem.key):
        if "sha256" in (config or {}) and same_recording(config, file):  # an import of this recording
            return held_name, 0
    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    problem_id = store.problem_id(problem.key, lookup_key=None, **problem.row_fields())
    name = f"kerneltuner:{file.path.name}@{device.key}"
    held = store.study_config(name)
    if held is not None and held.get("sha256") != digest:  # another file of that name (another folder)
        name = f"kerneltuner:{file.path.name}[sha256:{digest[:12]}]@{device.key}"
    study_id = store.study_id(name, {"source": str(file.path), "sha256": digest, "content_sha256": file.content_digest,
                                     "format": "kerneltuner", RECORDED_DEVICE: file.device_name.strip()})
    if store.count_measurements(study_id):
        store.finish_study(study_id)
        return name, 0
    (branch,) = file.space().branches
    bench = ReplayBenchmarker(file)
    tuned = [p.name for p in branch.params if p.distribution is not None]
    rows = []
    for number, entry in enumerate(file.cache.values()):
        cand = branch.candidate({n: entry[n] for n in tuned})
        rows.append(measurement_row(bench.measure(cand), "candidate", cand, study_id=study_id, device_id=device_id,
                                    problem_id=problem_id, trial_number=number, torch_version=IMPORTED_VERSION,
                                    triton_version=None, problem=problem))
    added = store.add_measurements(rows)
    store.finish_study(study_id)
    return name, added


def adopt_recorded_device(store: Store, file: KernelTunerFile) -> KernelTunerFile:
    """``file``, or where its device would be named after its file name (it records no device_name,
    and no name was given) and another device already holds its recording for its problem (an import
    or a replay: :func:`same_recording`), ``file`` with that device: a renamed or decompressed copy of
    it is the same GPU's recording. A helper's: a copy of dedispersion_MI250X.json.gz under another
    name imported 11,130 measurements as a second device, which compare then ranked as another GPU."""
    import dataclasses

    if file.device_named_by != "file name":
        return file
    key = file.problem().key

    def holds(device_key: str) -> bool:
        return any(file_digest(c) and same_recording(c, file) for _, c in store.studies_holding(device_key, key))

    if holds(file.device_key):  # its own device first: never moved off it (a review's)
        return file
    for device in store.devices():
        if device.key != file.device_key and holds(device.key):
            return dataclasses.replace(file, device_label=device.key, adopted=True)
    return file


def import_files(store: Store, files: list[KernelTunerFile],
                 imported: Callable[[KernelTunerFile, str, int], None] | None = None) -> list[tuple[str, int]]:
    """Import ``files`` (:func:`import_kerneltuner` each; (study name, rows added) each, in order)
    after checking every one against what the database holds (:func:`check_import`: no file is
    written when one is refused), the checks and the writes under the database lock
    (zhantune.storage.locks): an import or a merge run beside this one waits, then checks what this
    one wrote (two run at once both passed the checks that refuse one run after the other).
    ``imported(file, study name, rows added)`` is called after each file's import (its line)."""
    out = []
    with store.database_lock():
        files = [adopt_recorded_device(store, f) for f in files]
        for f in files:
            check_import(store, f)
        for f in files:  # adopted again: a copy of a file this import has just stored (a review's)
            f = adopt_recorded_device(store, f)
            out.append(import_kerneltuner(store, f))
            if imported is not None:
                imported(f, *out[-1])
    return out


def check_import(store: Store, file: KernelTunerFile) -> None:
    """What :func:`import_kerneltuner` refuses (ConfigError), checked without writing: run it for
    every file of an import before the first is written (a device stored as another kind:
    StorageError, as Store.device_id raises it)."""
    refuse_merge(store, file)
    device = file.device()
    store.refuse_other_kind(device.key, device.kind)


def refuse_merge(store: Store, file: KernelTunerFile, option: str = "files",
                 naming: str = "devices=[...] (one name per file)", adopt: str | None = None) -> None:
    """A file whose device is named after its file name (no ``device_name``) may not add its
    measurements to a device that already holds this problem from another file (the file's sha256:
    an import's study stores it as ``sha256``, a replay's as ``replay_sha256``, from
    the moment a replay names its study, measured or not; :func:`same_recording`): the two could be
    different GPUs; nor may a file whose device is named (its ``device_name``, ``devices=[...]``,
    ``bench.device_name``) add them to a device named after another file's name (stored as
    ``named_by: file name``). A study stored without a digest (a replay from before digests were
    stored) may hold another file, so it counts as one, unless it is ``adopt`` (the replay's
    ``search.study_name``, taken as this file's). Nor may a file that records its GPU's name add to a
    device (named by ``devices=[...]`` or ``bench.device_name``) that holds the problem from a file
    recorded on another, for any problem (:func:`other_gpu`; a helper's attacks put an A100's replay into
    an A4000's device, and ``devices=[GPU,GPU]`` made one device of the two). Raises ConfigError naming
    the file (``option``), the study and how to name the device (``naming``)."""
    studies = dict(store.studies_holding(file.device_key, file.problem().key))
    plain = f"{file.problem().key}@{file.device_key}"  # a replay's study, reserved before its first row
    reserved = store.study_config(plain)
    if reserved is not None and reserved.get("replay_sha256"):
        studies[plain] = reserved
    own = file.device_name.strip()
    every = {**dict(store.studies_holding(file.device_key, None)), **studies}  # each study once: its file hashed once
    held = [(n, with_recorded_name(c)) for n, c in every.items()]
    found = other_gpu(own, file.device_key, held, file.digests)
    if found is not None:  # two GPUs that recorded their names, under one name given
        name, other = found
        raise ConfigError(f"{option}={file.path}: recorded on {own!r}, gives device {file.device_key!r}, which holds "
                          f"study {name!r}, " + (f"recorded on {other!r}: two GPUs in one device" if other else
                                                 "of a Kernel Tuner file stored before zhantune kept the device name "
                                                 "a file records (2026-11-30): it may be another GPU")
                          + f"; name them apart with {naming}")
    if file.device_named_by != "file name" and store.device_properties(file.device_key).get("named_by") != "file name":
        return
    for name, config in studies.items():
        if not same_recording(config, file) and not (name == adopt and _adoptable(config)):
            _refuse(file, name, config, option, naming)


def with_recorded_name(config: dict | None) -> dict | None:
    """A study's config, with :data:`RECORDED_DEVICE` read from its Kernel Tuner file where it was stored
    before that name was kept: the file its config names (an import's ``source``, a replay's
    ``bench.path``; a relative path is the current directory's), if it is still there, a regular file
    of at most MAX_KT_BYTES whose bytes have the stored digest (hashed before it is parsed: a merged-in
    database's path may name any file). Otherwise as it is (a name unknown: :func:`other_gpu` counts it
    as another GPU where a file is renamed; a review found a second file of the same GPU refused with no
    way to add it)."""
    import hashlib
    from pathlib import Path

    from zhantune.bench.recorded import MAX_KT_BYTES, load_kerneltuner

    c = config or {}
    path = c.get("source") or (c.get("bench") if isinstance(c.get("bench"), dict) else {}).get("path")
    if RECORDED_DEVICE in c or not recording_digests(c) or not isinstance(path, str):
        return config
    try:
        p = Path(path)
        if not p.is_file() or p.stat().st_size > MAX_KT_BYTES or \
                hashlib.sha256(p.read_bytes()).hexdigest() != file_digest(c):
            return config
        return {**c, RECORDED_DEVICE: load_kerneltuner(path).device_name.strip()}
    except (ConfigError, OSError, ValueError):  # gone or changed meanwhile, or not a Kernel Tuner file
        return config


def other_gpu(own: str, device_key: str, studies: list[tuple[str, dict | None]],
              digests: frozenset[str] | set[str]) -> tuple[str, str | None] | None:
    """The first of ``studies`` ((name, config) of studies on device ``device_key``, any problem) that
    holds a Kernel Tuner recording made on another GPU than a file recorded on ``own`` (its
    ``device_name``, stripped): (its name, the name its file records), else None. A recording
    made on another name is another GPU, and so may be one stored before that name was kept
    (2026-11-30: no :data:`RECORDED_DEVICE`; the name is None) where ``own`` is not ``device_key``
    itself (the device was named by ``devices=[...]`` or ``bench.device_name``: a helper's attack renamed
    an A4000's file after an A100 in a database of the day before). The recording ``digests`` names (a
    copy of the file), studies of no recording (a tune) and a file that records no name (``own`` "",
    or a study's "": the name given is taken) are not compared."""
    if not own:
        return None
    for name, config in studies:
        held = recording_digests(config)
        if not held or held & set(digests):
            continue
        other = (config or {}).get(RECORDED_DEVICE)
        other = unicodedata.normalize("NFC", other) if isinstance(other, str) else other  # as the loader's names
        if (other is None and own != device_key) or (other and other != own):
            return name, other
    return None


def replay_study(store: Store, file: KernelTunerFile, problem_key: str, device_key: str,
                 explicit: str | None) -> str:
    """The study a ``bench=replay`` tune of ``file`` stores into, created here when absent with the
    file's sha256 as ``replay_sha256`` (an insert that concurrent jobs cannot both win, so two jobs
    replaying two files never share a study): ``explicit`` (``search.study_name``) when given, else
    ``<problem key>@<device key>``, or ``<problem key>[sha256:<first 12 hex digits>]@<device key>``
    when that study replays another file or was stored without a digest (a second recording of one
    device, kernel and problem size is searched from its own data, never answered from the first's).
    A device named after the file name (no ``device_name``) belongs to the first file that reserved
    ``<problem key>@<device key>`` (that study is reserved even when ``explicit`` names another):
    another file is refused. ``explicit`` may name a replay study stored without a digest (it is
    taken as this file's), not another file's replay, an import's study or a tune's. Raises
    ConfigError (one line)."""
    digest = file.sha256
    reserve = {"replay_sha256": digest, "content_sha256": file.content_digest, RECORDED_DEVICE: file.device_name.strip()}
    plain = f"{problem_key}@{device_key}"
    if file.device_named_by == "file name" or not explicit:
        held = store.reserve_study(plain, reserve)
        if (file.device_named_by == "file name" and not _replays(held, file)
                and not (explicit == plain and _adoptable(held))):
            _refuse(file, plain, held, "bench.path", "bench.device_name=NAME")
    if explicit:
        held = store.reserve_study(explicit, reserve)
        if _replays(held, file) or _adoptable(held):
            return explicit
        other = held.get("replay_sha256")
        raise ConfigError(f"search.study_name={explicit!r} holds "
                          + ("an import's measurements" if "sha256" in held else
                             f"another file's replay (sha256 {other[:12]}...)" if other else "a tune, not a replay")
                          + f", not bench.path={file.path} (sha256 {digest[:12]}...): one study replays one "
                          "file; choose another name or drop search.study_name")
    if _replays(held, file):
        return plain
    name = f"{problem_key}[sha256:{digest[:12]}]@{device_key}"
    if len(name) > MAX_KEY:
        raise ConfigError(f"bench.path={file.path}: the study of its problem and device replays another file, and "
                          f"this file's own study name would be {len(name)} characters (the database holds "
                          f"{MAX_KEY}): name it with search.study_name=NAME")
    held = store.reserve_study(name, reserve)
    if not _replays(held, file):  # 48 bits of the digest agree: never seen, but never merge
        raise ConfigError(f"bench.path={file.path}: study {name!r} replays another file; "
                          "name this replay's study with search.study_name=NAME")
    return name


def _replays(config: dict | None, file: KernelTunerFile) -> bool:
    """Whether a study of ``config`` is a replay of ``file``'s recording (:func:`same_recording`)."""
    return bool((config or {}).get("replay_sha256")) and same_recording(config, file)


def _adoptable(config: dict | None) -> bool:
    """A replay's study stored before digests were recorded: no digest, its config a replay's."""
    c = config or {}
    return not file_digest(c) and isinstance(c.get("bench"), dict) and c["bench"].get("name") == "replay"


def _refuse(file: KernelTunerFile, name: str, config: dict | None, option: str, naming: str) -> None:
    """ConfigError: ``file``'s device holds this problem from study ``name`` of another file (or of
    a file it did not record), and one of the two names the device after its file name."""
    if file.device_named_by == "file name":
        why = f"records no device_name and its file name gives device {file.device_key!r}, which already holds"
    else:  # this file names the device; the stored one was named after another file's name
        source = naming.split("=")[0] if file.device_named_by == "devices" else "its device_name"
        why = (f"gives device {file.device_key!r} (from {source}), a device named after another "
               "Kernel Tuner file's name (that file records no device_name: it may be another GPU) that holds")
    raise ConfigError(
        f"{option}={file.path}: {why} {file.problem().key} from study {name!r}"
        + ("" if file_digest(config) else " (stored without its file's sha256: it may be another file)")
        + f"; name the device with {naming}")


def recording_digests(config: dict | None) -> set[str]:
    """The digests of the Kernel Tuner recording a study holds: :func:`file_digest` and, where stored,
    ``content_sha256`` (of its JSON decompressed)."""
    return {d for d in (file_digest(config), (config or {}).get("content_sha256")) if d}


def same_recording(config: dict | None, file: KernelTunerFile) -> bool:
    """Whether the study of ``config`` holds ``file``'s recording: one of its digests is one of the
    file's (KernelTunerFile.digests: the bytes as stored, the JSON decompressed), so a copy gzipped,
    decompressed or renamed is the same recording."""
    return bool(recording_digests(config) & file.digests)


def file_digest(config: dict | None) -> str | None:
    """The sha256 of the Kernel Tuner file a study holds: an import's ``sha256`` or a replay's
    ``replay_sha256``; None when the study did not record one."""
    return (config or {}).get("sha256") or (config or {}).get("replay_sha256")
