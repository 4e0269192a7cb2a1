"""Lookup tables in the exact format ``torch._inductor.config.lookup_table.table`` takes, and the file
zhantune ships them in.

A table is ``{key: [entry, ...]}``; keys are the ones Inductor asked for while compiling the problem
(recorded by :class:`zhantune.inductor.choices.RecordingChoices`), entries are
``{"template_id": "triton::mm", "BLOCK_M": 64, ..., "template_hash": "..."}``
(format from torch/_inductor/lookup_table/choices.py). A config-patch candidate (the CPU path)
becomes ``{"template_id": "zhantune::config", "config_patch": {...}}``: stock Inductor skips entries
whose template_id it does not offer, and zhantune's runtime (:mod:`zhantune.inductor.runtime`)
applies the patch. Inductor's default choice is the ATen entry ``{"template_id": "aten::<op>"}``.

The file (``format=zhantune``, the default) wraps the table with its provenance::

    {"format": "zhantune-lookup-table", "format_version": 2, "zhantune": "0.1.0",
     "torch": "2.13.0+cpu", "triton": "3.9.0", "created_at": "2026-11-22T05:00:00+00:00",
     "source": "sqlite:///zhantune.db", "devices": [{"key": ..., "name": ..., "kind": "cpu"}],
     "options": {"top_k": 1, "device_agnostic": false, "min_speedup": 1.02},
     "activations": {"<key>": "gelu"}, "table": {...}}

``activations`` (version 2): the keys measured with a linear_act's activation fused (a list of them
and null, none, where one key's equal entries were tuned for problems of each); use_table reports an
entry stale where its GEMM feeds another (zhantune.inductor.epilogue.activation_stale).

``format=inductor`` writes the bare dict. Both load with :func:`read_table`. Tables are JSON, never
pickle, and loading one never executes code from it. Building a table from measurements is
zhantune.inductor.builder's job.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zhantune.errors import SHOWN_KEY, TableError, shown, shown_json
from zhantune.inductor.knobs import (
    FUSION_KNOBS,
    config_patch_problem,
    key_entry_problem,
    template_entry_problem,
    triton_resources_problem,
)
from zhantune.inductor.table_meta import FORMAT, FORMAT_VERSION, check_meta, device_kinds, plain_copy

__all__ = ["CONFIG_TEMPLATE_ID", "FORMAT", "FORMAT_VERSION", "TableFile", "entry_for", "default_entry", "table_key",
           "agnostic_key", "write_table", "read_table", "recheck_table", "check_table", "check_meta", "entry_problem", "not_carried", "carried",
           "CONFIG_ENTRY_ON_CUDA", "FUSION_ENTRY_ON_CPU", "load_table", "read_table_option", "parse_key", "MAX_TABLE_BYTES",
           "MAX_ENTRIES"]

CONFIG_TEMPLATE_ID = "zhantune::config"

#: Inductor's key: "[device+]((dtype, size, stride), ...)[+alpha=1&beta=1]+op"
#: (torch/_inductor/lookup_table/choices.py make_lookup_key)
#: (the device part ends at the first "+((": a ROCm device key, gcnArchName, holds "+", e.g.
#: "gfx90a:sramecc+:xnack-")
#: (a device part never holds "+((": the pattern then matches in time linear in the key's length;
#: with ".+?" a crafted 180 KB key took two minutes to refuse)
_KEY = re.compile(r"^(?:(?P<device>(?:(?!\+\(\().)+?)\+(?=\(\())?(?P<inputs>\(\(.*\),?\))(?:\+(?P<scalars>[^+]*))?\+(?P<op>[A-Za-z_][\w]*)$")
#: the largest table file read (tables hold a few entries per GEMM; this is thousands of models' worth)
MAX_TABLE_BYTES = 64 << 20
#: the most '[' and '{' characters read (lookup keys hold a few each): 64 MiB of "[]," would take
#: about 1.7 GB as Python lists; a table of 100,000 GEMMs has well under a million
MAX_TABLE_BRACKETS = 2_000_000
#: the longest lookup key read (Inductor's are a few hundred characters: device, three tensors' dtype,
#: sizes and strides, the scalars, the op)
MAX_KEY_CHARS = 4096
#: the most entries a key holds (export's top_k at most): each is a kernel Inductor compiles and times
MAX_ENTRIES = 64


@dataclass
class TableFile:
    """A loaded table: ``table`` as Inductor takes it, ``meta`` the wrapper's fields (empty for a bare
    Inductor dict), ``source`` the file it came from (None for a dict)."""

    table: dict[str, list[dict[str, Any]]]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    #: keys of devices the wrapper's ``devices`` lists with another kind than the one read for (a
    #: table exported from a database of CPU and GPU measurements), and keys without a device where
    #: every device listed is of another kind (a device-agnostic export of CPUs): checked against their
    #: own kind's allow-list and left out of ``table`` (never looked up on this kind of device); key -> kind
    other_kind: dict[str, str] = field(default_factory=dict)

    @property
    def torch_version(self) -> str | None:
        return self.meta.get("torch")

    @property
    def activations(self) -> dict[str, str] | None:
        """Key -> the activation its entries were measured fused with (a key not listed: none, in a
        version 2 file without the field too); None for a table that does not say (Inductor's format,
        a wrapper of version 1, a dict)."""
        return self.meta.get("activations", {}) if self.meta.get("format_version", 1) > 1 else None


def parse_key(key: str) -> dict[str, str | None] | None:
    """Split an Inductor lookup key into device, inputs, scalars and op; None when it is not one."""
    m = _KEY.fullmatch(key)  # not match: its ``$`` lets a trailing newline through
    return m.groupdict() if m else None


def agnostic_key(key: str) -> str:
    """A lookup key without its device part (``device+inputs+op`` -> ``inputs+op``); the stored key of
    a database renamed on another machine still names the device it was measured on."""
    parsed = parse_key(key)
    return key[len(parsed["device"]) + 1:] if parsed and parsed.get("device") else key


def entry_for(template_id: str | None, params: dict[str, Any], template_hash: str | None) -> dict[str, Any]:
    """The lookup-table entry for one measured candidate."""
    if template_id is None:
        return {"template_id": CONFIG_TEMPLATE_ID, "config_patch": dict(sorted(params.items()))}
    entry: dict[str, Any] = {"template_id": template_id, **params}
    if template_hash:
        entry["template_hash"] = template_hash
    return entry


def default_entry(lookup_op: str) -> dict[str, Any]:
    """Inductor's default choice for a GEMM: its ATen kernel (template uid ``aten::<op>``)."""
    return {"template_id": f"aten::{lookup_op}"}


def table_key(device_key: str, problem_key: str | None, best: Any, device_agnostic: bool) -> str | None:
    """The key a measured candidate's entries go under.

    A template candidate: the key of the lookup its template hit (stored with the measurement; addmm
    looks templates up with the expanded bias, its ATen kernel with the 1-D bias). Anything else
    (config patches, the default): the problem's key, the one Inductor's ATen lookup makes. The
    device-specific form is Inductor's join, ``device_key + "+" + agnostic key`` (make_lookup_key).
    """
    if best is not None and best.template_id is not None and best.lookup_key:
        hit = agnostic_key(best.lookup_key)  # a renamed device's rows still name the old device
        return hit if device_agnostic else f"{device_key}+{hit}"
    if problem_key is None:
        return None
    return problem_key if device_agnostic else f"{device_key}+{problem_key}"


def write_table(path: str | os.PathLike[str], table: dict[str, list[dict[str, Any]]],
                meta: dict[str, Any] | None = None, option: str = "export.path") -> Path:
    """Write the table as JSON, atomically (zhantune.paths.write_atomic: a reader never sees half a
    file, a failed write leaves the old one); wrapped in ``meta`` (zhantune.inductor.exporter.table_metadata) when
    given, else the bare dict Inductor takes. Raises TableError, and writes nothing, when the table
    or its wrapper is one :func:`read_table` would refuse (a key or value from a database edited
    elsewhere: a device key with a newline or a terminal escape; a source URL over 1,024
    characters); ConfigError naming ``option`` when the file
    cannot be written (a full disk)."""
    from zhantune.paths import write_atomic

    path = Path(path)
    check_table(table, f"{path} (not written)")
    if meta is not None:  # what read_table would refuse (a torch_version that is not a version)
        check_meta(f"{path} (not written)", meta)
    data: dict[str, Any] = table if meta is None else {**meta, "table": table}
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", option)


def read_table(source: str | os.PathLike[str] | dict[str, Any], device_kind: str | None = None) -> TableFile:
    """Read and check a table (a file path, or an already-parsed dict), wrapped or bare.

    A table is data: every ``config_patch`` key must be an allow-listed tuning knob for
    ``device_kind`` ("cpu", "cuda"; None: a knob of any kind) and every template entry key an
    allow-listed template kwarg, each with a checked value (:mod:`zhantune.inductor.knobs`).
    Raises TableError naming the file and the key path: not a regular file, over MAX_TABLE_BYTES,
    not JSON (or nested too deeply), wrong format or format_version, a key not in Inductor's format,
    entries that are not objects with a string ``template_id``, a knob or kwarg not allowed.
    """
    if isinstance(source, dict):  # a plain copy, then checked: what is checked is what is served
        data, where = plain_copy(source, "<dict>"), "<dict>"
    else:
        where = str(source) if str(source).isprintable() and str(source) else json.dumps(str(source))  # one line
        data = _read_json(str(source), where)
    if not isinstance(data, dict):
        raise TableError(f"{where}: expected a JSON object, got {type(data).__name__}")
    meta: dict[str, Any] = {}
    prefix = ""
    if "format" in data or "format_version" in data or "table" in data:
        meta = {k: v for k, v in data.items() if k != "table"}
        check_meta(where, meta)
        table = data.get("table")
        prefix = "table"
        if not isinstance(table, dict):
            raise TableError(f"{where}: table: expected an object of key -> list of entries, "
                             f"got {type(table).__name__}")
    else:
        table = data
    return _checked(table, meta, where, device_kind, prefix, None if isinstance(source, dict) else where)


def recheck_table(tf: TableFile, device_kind: str | None) -> TableFile:
    """A TableFile (read for another kind, or built in Python) checked for ``device_kind`` as
    :func:`read_table` checks a file: its wrapper's fields, each device's keys against its kind's
    allow-list, the other kind's keys left out. Raises TableError naming its source."""
    where = tf.source or "<table>"
    if device_kind is not None and device_kind in tf.other_kind.values():  # those keys were left out
        raise TableError(f"{where}: read for another kind of device than {device_kind}; read it again for {device_kind}")
    table, meta = plain_copy(tf.table, where), plain_copy(tf.meta, where)  # checked and served: the copies
    if meta:  # the wrapper's fields too (its torch version decides staleness)
        check_meta(where, meta)
    out = _checked(table, meta, where, device_kind, "table" if meta else "", tf.source)
    return TableFile(out.table, out.meta, out.source, {**tf.other_kind, **out.other_kind})  # those left out before too


def _checked(table: Any, meta: dict[str, Any], where: str, device_kind: str | None, prefix: str,
             source: str | None) -> TableFile:
    if isinstance(table, dict) and (stray := next((k for k in meta.get("activations") or {} if k not in table), None)):
        raise TableError(f"{where}: activations[{shown_json(stray)[:SHOWN_KEY]}]: not a key of the table")
    kinds = device_kinds(meta)
    check_table(table, where, device_kind, prefix, kinds)
    other = {k: kinds[d] for k in table if (d := (parse_key(k) or {}).get("device")) in kinds
             and device_kind is not None and kinds[d] != device_kind}
    if other:  # and their activations: a recheck of the kept keys (use_table(tf)) found them stray (a review)
        table = {k: v for k, v in table.items() if k not in other}
        meta = {**meta, "activations": {k: a for k, a in meta["activations"].items() if k not in other}} \
            if meta.get("activations") else meta
    return TableFile(table, meta, source, other)


def _amd(device: str | None) -> bool:
    """Whether a key's device part is an AMD GPU's (its gcnArchName "gfx90a:...", or a name with AMD)."""
    return device is not None and (device.startswith("gfx") or "AMD" in device)


def _read_json(path: str, where: str) -> Any:
    """The JSON document in file ``path`` (named ``where`` in errors): a regular file of at most
    MAX_TABLE_BYTES (a FIFO or a device such as /dev/zero is refused before it is read)."""
    import stat

    if "\0" in path:
        raise TableError(f"{where}: cannot read: a path has no NUL character")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise TableError(f"{where}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory itself
        os.close(fd)
        raise TableError(f"{where}: not a regular file (a table is a JSON file)")
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_TABLE_BYTES + 1)
    except OSError as e:  # a failing disk or network file system; /proc/self/mem
        raise TableError(f"{where}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_TABLE_BYTES:
        raise TableError(f"{where}: larger than {MAX_TABLE_BYTES >> 20} MiB; a lookup table is far smaller")
    if raw.count(b"[") + raw.count(b"{") > MAX_TABLE_BRACKETS:
        raise TableError(f"{where}: more than {MAX_TABLE_BRACKETS:,} '[' and '{{' characters; a lookup table has "
                         "a few per GEMM")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """An object whose keys are all different: with a duplicate, which one counts depends on
        the reader (Python's json keeps the last), so a reviewer may read another table than the one loaded."""
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            dup = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise TableError(f"{where}: key {shown_json(dup)} appears twice in one JSON object; "
                             "a table names each key once")
        return obj

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=unique)
    except UnicodeDecodeError:
        raise TableError(f"{where}: not a UTF-8 text file; a table is JSON (python -m zhantune.export writes one)") from None
    except json.JSONDecodeError as e:
        raise TableError(f"{where}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise TableError(f"{where}: JSON nested too deeply; a table is key -> list of flat entries") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise TableError(f"{where}: not a table: an integer of over {sys.get_int_max_str_digits():,} digits (a "
                         "tuning knob's value is at most a few)") from None


def read_table_option(path: str | os.PathLike[str], device_kind: str | None, option: str = "table") -> TableFile:
    """:func:`read_table` of a command's option: its errors start with ``option=`` (where the value
    came from), e.g. "table=zhantune.db: not a UTF-8 text file" (it read "zhantune.db: ...")."""
    try:
        return read_table(path, device_kind)
    except TableError as e:
        raise TableError(f"{option}={e}") from None


def load_table(path: str | os.PathLike[str], device_kind: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The bare table of a file (wrapped or bare); see :func:`read_table` for the checks and errors."""
    return read_table(path, device_kind).table


def check_table(table: dict[str, Any], where: str = "<dict>", device_kind: str | None = None,
                prefix: str = "", kinds: dict[str | None, str] | None = None) -> None:
    """Check a bare table's keys and entries (see :func:`read_table`); raises TableError.
    ``kinds``: device key -> kind (a wrapper's ``devices``, table_meta.device_kinds; None: a key
    without a device): a key of such a device is checked against that kind's allow-list instead of
    ``device_kind``'s."""
    def path(*parts: str) -> str:
        return (prefix + "".join(parts)) if prefix else "".join(parts).removeprefix(".")

    if not isinstance(table, dict):
        raise TableError(f"{where}: {prefix or 'the table'}: expected an object of key -> list of entries, "
                         f"got {type(table).__name__}")
    for key, entries in table.items():
        k = f"[{shown_json(key)}]"
        if isinstance(key, str) and len(key) > MAX_KEY_CHARS:
            raise TableError(f"{where}: {path(k)}: a key of {len(key):,} characters is not an Inductor lookup key "
                             f"(those are a few hundred; at most {MAX_KEY_CHARS:,} are read)")
        parsed = parse_key(key) if isinstance(key, str) and key.isprintable() else None
        if parsed is None:
            raise TableError(f"{where}: {path(k)}: not an Inductor lookup key "
                             "(expected '[device+]((dtype, size, stride), ...)[+scalars]+op')")
        if not isinstance(entries, list):
            raise TableError(f"{where}: {path(k)}: expected a list of entries, got {type(entries).__name__}")
        if len(entries) > MAX_ENTRIES:  # each one a kernel Inductor compiles and benchmarks at every compile
            raise TableError(f"{where}: {path(k)}: {len(entries):,} entries; a key holds at most {MAX_ENTRIES} "
                             "(export's top_k)")
        device = parsed["device"]  # a key without one: its devices' one kind (device_kinds), else the kind read for
        kind = (kinds or {}).get(device, device_kind)
        for i, entry in enumerate(entries):
            at = path(k, f"[{i}]")
            if not isinstance(entry, dict) or not isinstance(entry.get("template_id"), str):
                raise TableError(f"{where}: {at}: an entry must be an object with a string template_id")
            for obj, inside in ((entry, ""), (entry.get("config_patch"), ".config_patch")):  # a Python dict's
                if isinstance(obj, dict) and (name := next((n for n in obj if not isinstance(n, str)), None)) is not None:
                    raise TableError(f"{where}: {at}{inside}: the key {shown(name)} is not a string (JSON's keys are)")
            bad = entry_problem(entry, kind) or key_entry_problem(entry, parsed["inputs"], parsed["op"],
                                                                  amd=_amd(device))
            if bad:
                name, why = bad
                if not name.isprintable() or len(name) > SHOWN_KEY:  # one line, no terminal escapes
                    name = shown_json(name)
                raise TableError(f"{where}: {at}{'.' + name if name else ''}: {why}")


#: why a table cannot carry a ``zhantune::config`` entry on CUDA (TableChoices reports it stale)
CONFIG_ENTRY_ON_CUDA = (f"a {CONFIG_TEMPLATE_ID!r} entry applies on CPU only: on CUDA Inductor's config (fusion "
                        "limits, backends, TF32) is compile-wide, not a per-GEMM choice a table can carry; "
                        "set it in the compile (torch._inductor.config / torch.backends) instead")


#: why a table cannot carry a CPU ``zhantune::config`` entry that sets a fusion limit (TableChoices
#: reports it stale): the entry's patch holds while its GEMM is lowered, and Inductor reads the
#: fusion limits later, when it schedules the graph (measured: tests/test_fusion.py)
FUSION_ENTRY_ON_CPU = ("Inductor's fusion limits ({keys}) are read when it schedules the whole graph, after each "
                       "GEMM's lowering (torch/_inductor/scheduler.py), so a per-GEMM table entry cannot apply "
                       "them; set them in the compile (torch._inductor.config) instead")


def not_carried(entry: dict[str, Any], device_kind: str | None) -> str | None:
    """Why an allow-listed entry takes no effect through a table on ``device_kind``, or None:
    ``zhantune::config`` entries are applied per GEMM on CPU only (zhantune.inductor.runtime); on
    CUDA the knobs a config branch tunes are compile-wide (CONFIG_ENTRY_ON_CUDA), and on CPU so are
    the fusion limits (FUSION_ENTRY_ON_CPU)."""
    if entry.get("template_id") != CONFIG_TEMPLATE_ID:
        return None
    if device_kind == "cuda":
        return CONFIG_ENTRY_ON_CUDA
    patch = entry.get("config_patch")
    fusion = sorted(FUSION_KNOBS.intersection(patch)) if isinstance(patch, dict) else []
    if device_kind == "cpu" and fusion:
        return FUSION_ENTRY_ON_CPU.format(keys=", ".join(fusion))
    return None


def carried(entry: dict[str, Any], device_kind: str) -> bool:
    """An entry a table on ``device_kind`` may carry (allow-listed) and that takes effect there."""
    return entry_problem(entry, device_kind) is None and not_carried(entry, device_kind) is None


def entry_problem(entry: dict[str, Any], device_kind: str | None) -> tuple[str, str] | None:
    """(key path inside the entry, why) when an entry sets anything but allow-listed knobs with
    checked values (zhantune.inductor.knobs) for ``device_kind`` (None: any kind); else None."""
    if entry.get("template_id") == CONFIG_TEMPLATE_ID:
        extra = sorted(set(entry) - {"template_id", "config_patch", "template_hash"})
        if extra:
            return extra[0], f"a {CONFIG_TEMPLATE_ID!r} entry has only template_id and config_patch"
        if "template_hash" in entry:  # checked as in a template entry, never an unread blob
            bad = template_entry_problem({"template_id": CONFIG_TEMPLATE_ID, "template_hash": entry["template_hash"]})
            if bad:
                return bad
        bad = config_patch_problem(entry.get("config_patch"), device_kind)
        if bad:
            name, why = bad
            return "config_patch" + ("." + name if name else ""), why
        return None
    bad = template_entry_problem(entry)
    if bad is None and str(entry.get("template_id")).startswith("triton::"):
        bad = triton_resources_problem(entry)  # a table's, not a stored row's (zhantune.inductor.knobs)
    return bad
