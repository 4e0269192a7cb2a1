"""The fields a zhantune table file wraps its lookup table in (format, versions, devices, options),
and their checks (zhantune.inductor.table reads the file; zhantune.inductor.builder writes them);
:func:`plain_copy`, the copy of a table given from Python that is checked and served."""

from __future__ import annotations

import json
import re
from typing import Any

from zhantune.errors import SHOWN_KEY, TableError, shown, shown_json
from zhantune.inductor.knobs import DEVICE_KINDS

__all__ = ["FORMAT", "FORMAT_VERSION", "FORMAT_VERSIONS", "WRAPPER_FIELDS", "MAX_WRAPPER_BYTES", "VERSION", "check_meta", "device_kinds", "plain_copy",
           "version_for"]

FORMAT = "zhantune-lookup-table"
#: the version written: 2 adds ``activations`` (key -> the activation its entries were measured
#: fused with: a linear_act's relu or gelu, or a list of them and null where one key's equal entries
#: were tuned for problems of each; keys not listed were measured with none)
FORMAT_VERSION = 2
#: the versions read (1: no ``activations``, so use_table does not compare a GEMM's epilogue; 3: a
#: key's activations may be a list, written only where one is: :func:`version_for`)
FORMAT_VERSIONS = (1, 2, 3)
#: the fields of a table file (zhantune.inductor.exporter.table_metadata writes them all)
WRAPPER_FIELDS = ("format", "format_version", "zhantune", "torch", "triton", "created_at", "source", "devices",
                  "options", "activations", "table")
#: the most the fields besides ``table`` take as JSON: a device is about a hundred bytes, the
#: export options a few hundred; kept in memory while the table is installed (64 MiB of padding was)
MAX_WRAPPER_BYTES = 1 << 20
#: a version string in the wrapper (PEP 440 with a local part: "2.13.0+cpu", "2.13.0a0+git1234abc")
VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}", re.ASCII)
_DEVICE_FIELDS = ("key", "name", "kind", "isa", "cpuid")


def check_meta(where: str, meta: dict[str, Any]) -> None:
    """Check a wrapped table's fields besides ``table`` (format, versions, devices, options); raises
    TableError naming the field: one this format does not have (WRAPPER_FIELDS), a wrong format or
    format_version, a version that is not one, no ``torch`` (a wrapped table names the release its
    entries were measured with: under another one they are stale; without one it would pass as this
    release's), a field over MAX_WRAPPER_BYTES in all."""
    if meta.get("format") != FORMAT:
        raise TableError(f"{where}: format: expected {FORMAT!r}, got {shown(meta.get('format'))}")
    version = meta.get("format_version")
    if type(version) is not int or version not in FORMAT_VERSIONS:  # not 1.0, not true
        raise TableError(f"{where}: format_version: this zhantune reads versions 1, 2 and 3, got {shown(version)}")
    fields = [f for f in WRAPPER_FIELDS if version > 1 or f != "activations"]
    if unknown := sorted(set(meta) - set(fields)):
        raise TableError(f"{where}: {shown_json(unknown[0])[:80]}: not a field of a table file (version "
                         f"{version} has {', '.join(fields)})")
    try:
        size = len(json.dumps(meta, allow_nan=False))  # NaN and Infinity: no JSON (an attack put NaN in options)
    except (TypeError, ValueError, RecursionError) as e:  # a dict from Python holding what JSON cannot
        raise TableError(f"{where}: the fields besides table are not JSON data ({str(e)[:80]})") from None
    if size > MAX_WRAPPER_BYTES:
        raise TableError(f"{where}: the fields besides table take {size:,} bytes as JSON; a table file's take at most "
                         f"{MAX_WRAPPER_BYTES:,} (its devices, export options and activations)")
    if meta.get("torch") is None:
        raise TableError(f"{where}: torch: missing or null; a table file names the torch release its entries were "
                         "measured with (the export writes it; under another release they are stale). Export it "
                         "again, or give the table object alone (Inductor's format, no release check)")
    for name in ("zhantune", "torch", "triton", "created_at", "source"):
        if name in meta and not isinstance(meta[name], (str, type(None))):
            raise TableError(f"{where}: {name}: expected a string{'' if name == 'torch' else ' or null'}, "
                             f"got {type(meta[name]).__name__}")
    # printed by check and in stale reasons: a version, never lines or markup of its own
    for name in ("zhantune", "torch", "triton"):
        if meta.get(name) is not None and not VERSION.fullmatch(meta[name]):
            raise TableError(f"{where}: {name}: expected a version such as '2.13.0+cpu' (letters, digits, . + _ -), "
                             f"got {json.dumps(meta[name])[:80]}")
    for name in ("created_at", "source"):
        if meta.get(name) is not None and not (meta[name].isprintable() and len(meta[name]) <= 1024):
            raise TableError(f"{where}: {name}: expected one line of printable text, got {json.dumps(meta[name])[:80]}")
    devices = meta.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, dict) and isinstance(d.get("key"), str) for d in devices):
        raise TableError(f"{where}: devices: expected a list of objects with a string key")
    for i, d in enumerate(devices):  # a device part of a lookup key: its entries are checked for its kind
        if not (d["key"].strip() and d["key"].isprintable() and len(d["key"]) <= SHOWN_KEY and "+((" not in d["key"]):
            raise TableError(f"{where}: devices[{i}].key={shown_json(d['key'])}: expected a device key, the part of "
                             "a lookup key before '+((' (one line of printable text, not empty)")
        if unknown := sorted(set(d) - set(_DEVICE_FIELDS)):
            raise TableError(f"{where}: devices[{i}].{shown_json(unknown[0])[:80]}: not a field of a device "
                             f"(a device has {', '.join(_DEVICE_FIELDS)})")
        if bad := next((f for f in _DEVICE_FIELDS[1:] if d.get(f) is not None and not (
                isinstance(d[f], str) and d[f].isprintable() and len(d[f]) <= SHOWN_KEY)), None):
            raise TableError(f"{where}: devices[{i}].{bad}: expected one line of printable text or null, "
                             f"got {json.dumps(d[bad], default=str)[:80]}")
    if not isinstance(meta.get("options", {}), dict):
        raise TableError(f"{where}: options: expected an object")
    acts = meta.get("activations", {})
    if not isinstance(acts, dict):
        raise TableError(f"{where}: activations: expected an object of lookup keys to relu or gelu (the activation "
                         "a key's entries were measured fused with)")
    if bad := next((k for k, v in acts.items() if not _activation(v, version)), None):
        raise TableError(f"{where}: activations[{shown_json(bad)[:SHOWN_KEY]}]: "
                         f"{json.dumps(acts[bad], default=str)[:80]}; allowed: relu, gelu, or a list of two or more "
                         "of relu, gelu and null (the activations the key's entries were measured fused with: null, none)")


def _activation(value: Any, version: int) -> bool:
    """A table's ``activations`` value: ``relu`` or ``gelu``, or a list of two or more distinct ones of
    relu, gelu and null (no activation: one key's equal entries, tuned for problems of each), written
    as version 3 (:func:`version_for`) and read in version 2 too (a few hours of 2026-11-30 wrote it so)."""
    if isinstance(value, list):  # the items first: a nested list is not hashable (a review's traceback)
        return (version >= 2 and len(value) >= 2 and all(v in ("relu", "gelu", None) for v in value)
                and len(set(value)) == len(value))
    return value in ("relu", "gelu")


def version_for(activations: dict[str, Any]) -> int:
    """The format_version a table with these ``activations`` is written with: 3 where a key lists
    several (a zhantune that reads 1 and 2 then refuses it by its version, not as a bad value), else 2."""
    return 3 if any(isinstance(v, list) for v in activations.values()) else FORMAT_VERSION


def plain_copy(value: Any, where: str) -> Any:
    """A copy of ``value`` made of plain JSON types only (dict, list, str, int, float, bool, None;
    a tuple becomes a list, a dict keeps its scalar keys for the table's checks to name): a later change to the
    caller's dict, or a subclass's own copy or lookup, never reaches what is checked and served.
    Raises TableError for anything else (a lock, an object) or nesting too deep."""
    def copy_of(v: Any) -> Any:  # the base types' own items and iteration, never a subclass's
        if isinstance(v, dict):
            return {(k if k is None or type(k) in (str, bytes, int, float, bool) else refuse(k)): copy_of(x)
                    for k, x in dict.items(v)}
        if isinstance(v, (list, tuple)):
            return [copy_of(x) for x in (list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v))]
        if v is None or type(v) in (str, int, float, bool):
            return v
        return refuse(v)

    def refuse(v: Any) -> Any:
        raise TableError(f"{where}: a value of type {type(v).__name__} is not JSON data (a table holds objects, "
                         "lists, strings, numbers, booleans and null)")

    try:
        return copy_of(value)
    except RecursionError:
        raise TableError(f"{where}: nested too deeply; a table is key -> list of flat entries") from None


def device_kinds(meta: dict[str, Any]) -> dict[str | None, str]:
    """device key -> kind (``cpu``, ``cuda``) from a checked wrapper's ``devices`` (kinds zhantune
    tunes only; two entries of one key with different kinds: neither); None -> the kind of every device
    listed where they are of one kind: a device-agnostic key's (a helper found a table exported from CPUs
    alone served as hits on CUDA, where its ``aten::mm`` entry stopped Inductor's Triton autotuning)."""
    out: dict[str, str] = {}
    for d in meta.get("devices", []):
        kind = d.get("kind")
        if kind in DEVICE_KINDS:
            out[d["key"]] = kind if out.get(d["key"], kind) == kind else ""
    kinds: dict[str | None, str] = {k: v for k, v in out.items() if v}
    if len(set(kinds.values())) == 1:
        kinds[None] = next(iter(kinds.values()))
    return kinds
