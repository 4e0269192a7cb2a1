"""Lookup tables in the exact format ``torch._inductor.config.lookup_table.table`` takes.

A table is ``{key: [entry, ...]}``; keys are the ones Inductor asked for while compiling the problem
(recorded by :class:`zhantune.inductor.choices.RecordingChoices`), entries are
``{"template_id": "triton::mm", "BLOCK_M": 64, ..., "template_hash": "..."}``
(format from torch/_inductor/lookup_table/choices.py). A config-patch candidate (the CPU path)
becomes ``{"template_id": "zhantune::config", "config_patch": {...}}``: stock Inductor skips entries
whose template_id it does not offer, and zhantune's runtime applies the patch. Tables are JSON, never
pickle.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from zhantune.errors import TableError

__all__ = ["CONFIG_TEMPLATE_ID", "entry_for", "build_table", "write_table", "load_table"]

CONFIG_TEMPLATE_ID = "zhantune::config"


def entry_for(template_id: str | None, params: dict[str, Any], template_hash: str | None) -> dict[str, Any]:
    """The lookup-table entry for one measured candidate."""
    if template_id is None:
        return {"template_id": CONFIG_TEMPLATE_ID, "config_patch": dict(sorted(params.items()))}
    entry: dict[str, Any] = {"template_id": template_id, **params}
    if template_hash:
        entry["template_hash"] = template_hash
    return entry


def build_table(store: Any, device_key: str | None = None, device_agnostic: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Best correct candidate per (device, problem) from a Store, as a one-entry-per-key table.

    ``device_agnostic`` uses the device-agnostic key; then, where several devices share a problem,
    the fastest device's winner is kept (cross-device choices are the compare command's job).
    """
    table: dict[str, list[dict[str, Any]]] = {}
    for _device, problem, meas in store.best_candidates(device_key):
        key = problem.lookup_key if device_agnostic else meas.lookup_key
        if not key or key in table:
            continue
        table[key] = [entry_for(meas.template_id, meas.params, meas.template_hash)]
    return dict(sorted(table.items()))


def write_table(path: str | os.PathLike[str], table: dict[str, list[dict[str, Any]]]) -> Path:
    """Write the table as JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # an ordinary file, not mkstemp's private 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load_table(path: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Read and check a table file. Raises TableError naming the file and the key path."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise TableError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise TableError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise TableError(f"{path}: expected a JSON object of key -> list of entries, got {type(data).__name__}")
    for key, entries in data.items():
        if "+" not in key:
            raise TableError(f"{path}: [{key!r}]: not a lookup key (expected '[device+]inputs+op')")
        if not isinstance(entries, list):
            raise TableError(f"{path}: [{key!r}]: expected a list of entries, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("template_id"), str):
                raise TableError(f"{path}: [{key!r}][{i}]: an entry must be an object with a string template_id")
    return data
