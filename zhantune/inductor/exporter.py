"""Writing a table file: the export's options checked (:func:`check_export_options`), the table built
from a database (zhantune.inductor.builder.build_table) and written with its wrapper
(:func:`export_table`, :func:`table_metadata`), and the device an export's ``device=`` names
(:func:`resolve_device_key`)."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zhantune.errors import ConfigError, shown
from zhantune.inductor.builder import build_table, table_torch
from zhantune.inductor.table import FORMAT, FORMAT_VERSION, MAX_ENTRIES, parse_key, write_table
from zhantune.inductor.table_meta import version_for

if TYPE_CHECKING:
    from zhantune.storage import Store

__all__ = ["FORMATS", "export_table", "check_export_options", "resolve_device_key", "table_metadata"]

#: ``export.format`` values: zhantune wraps the table with its provenance, inductor writes the bare dict
FORMATS = ("zhantune", "inductor")

#: what ``export.torch_version`` accepts: a torch version as torch.__version__ writes one (PEP 440:
#: release, pre-release, post, dev, local label), e.g. 2.13.0, 2.13.0+cpu, 2.14.0a0+git5f3c2a1, 2.14.0.dev20261101+cu128
TORCH_VERSION = re.compile(r"\d+(\.\d+)+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?", re.ASCII)


def check_export_options(opts: Any, prefix: str = "", inputs: dict[str, Any] | None = None) -> None:
    """Raise ConfigError naming the option (``export.top_k=0``) when a value is out of range, or when
    the path is one of the command's ``inputs`` (option -> file: a problems file it reads).
    ``opts``: an ExportConfig (zhantune.config) or the export app's config."""
    from zhantune.paths import check_output_path

    if opts.format not in FORMATS:
        raise ConfigError(f"{prefix}format={opts.format!r}; allowed: {', '.join(FORMATS)}")
    if not 1 <= opts.top_k <= MAX_ENTRIES:
        raise ConfigError(f"{prefix}top_k={opts.top_k} must be 1 to {MAX_ENTRIES} (entries per key)")
    if opts.min_speedup is not None and not 1.0 <= opts.min_speedup < math.inf:
        raise ConfigError(f"{prefix}min_speedup={opts.min_speedup} must be a number of at least 1.0 "
                          "(1.0: the tuned entry unless it is slower than the default; null: always the tuned entry)")
    if (version := getattr(opts, "torch_version", None)) is not None and not TORCH_VERSION.fullmatch(str(version)):
        raise ConfigError(f"{prefix}torch_version={shown(version)}: expected a torch release such as '2.13.0+cpu'")
    if getattr(opts, "enabled", True) and opts.path is not None:  # '' too: refused before the tune, not after it
        check_output_path(opts.path, f"{prefix}path", inputs)


def export_table(store: Store, opts: Any, device_key: str | None = None, shared: list[str] | None = None,
                 problem_ids: set[int] | None = None, shipped: dict | None = None,
                 option: str = "export.path") -> tuple[Path | None, dict]:
    """Build the table with ``opts`` (an ExportConfig: top_k, min_speedup, device_agnostic,
    torch_version, format, path) and write it to ``opts.path`` (named ``option`` in errors: a full
    disk); returns (path, table). An empty table is not written (path None), so an existing file is
    never replaced by it. Raises ConfigError, writing nothing, for format=inductor with keys of CPU and
    CUDA devices (:func:`_refuse_two_kinds`). ``shared``, ``problem_ids``, ``shipped``: as :func:`build_table`'s."""
    from zhantune.storage import redact_url

    activations: dict[str, Any] = {}  # the keys of linear_act problems: use_table compares the GEMM's epilogue
    used: set[int] = set()  # the devices whose measurements placed a key: the wrapper lists those only
    shipped = {} if shipped is None else shipped  # the tuned rows placed: their Triton is the table's
    table = build_table(store, device_key=device_key, device_agnostic=opts.device_agnostic, top_k=opts.top_k,
                        min_speedup=opts.min_speedup, torch_version=opts.torch_version, shared=shared,
                        problem_ids=problem_ids, shipped=shipped, activations=activations, devices=used)
    meta = None
    if opts.format == "inductor":
        _refuse_two_kinds(store, table, option)
    if opts.format == "zhantune":
        options = {"top_k": opts.top_k, "min_speedup": opts.min_speedup, "device_agnostic": opts.device_agnostic,
                   "device": device_key, "torch_version": opts.torch_version}
        meta = {**table_metadata(store, table, options, redact_url(store.url), used), "activations": activations,
                "format_version": version_for(activations)}
        if tuned := [s.row for s in shipped.values() if s.row is not None]:  # else: Inductor's defaults only
            tritons = {r.triton_version for r in tuned}  # one version, or null (none recorded, or several)
            meta["triton"] = tritons.pop() if len(tritons) == 1 else None
    if not table:
        return None, table
    return write_table(opts.path, table, meta, option), table


def _refuse_two_kinds(store: Store, table: dict[str, Any], option: str) -> None:
    """Inductor's format names no key's kind of device: a table of CPU and CUDA keys, read for either
    kind, refuses the other's entries (a CPU config patch is no CUDA knob), so no load could use it
    (format=zhantune's ``devices`` keep them apart). Raises ConfigError naming the format option."""
    kinds = {d.key: d.kind for d in store.devices()}
    found: dict[str, int] = {}
    for key in table:
        if (kind := kinds.get((parse_key(key) or {}).get("device"))) is not None:
            found[kind] = found.get(kind, 0) + 1
    if len(found) > 1:
        prefix = option.rpartition(".")[0]
        raise ConfigError(f"{prefix + '.' if prefix else ''}format=inductor: the table holds keys of "
                          + " and ".join(f"{n} {kind}" for kind, n in sorted(found.items()))
                          + " device(s), and Inductor's format names no key's kind: a load for either kind refuses "
                          "the other's entries; nothing written. Export one device (device=...), or format=zhantune")


def resolve_device_key(store: Store, spec: Any, option: str = "device") -> str | None:
    """The key of the database device that ``device=`` names: its key or name, its number in the
    list of the database's devices (sorted by key, from 0), or its kind (``cpu``, ``cuda``) when
    exactly one device has it. None for None. Raises ConfigError listing the devices otherwise."""
    if spec is None:
        return None
    want = str(spec).strip()
    devices = store.devices()
    named = [d for d in devices if d.key == want] or [d for d in devices if d.name == want] or (
        [d for d in devices if d.kind == want.lower()] if not want.isdigit() else [])
    if len(named) == 1:
        return named[0].key
    from zhantune.storage.engine import redact_url

    if named:  # one CPU model at several thread counts: one name (or kind), several devices
        raise ConfigError(f"{option}={want!r} names {len(named)} devices in {redact_url(store.url)}: "
                          + "; ".join(f"{devices.index(d)}: {d.key!r}" for d in named)
                          + f". Give the number ({option}={devices.index(named[0])}), or the key in quotes inside the "
                          f"shell's: '{option}=\"KEY\"'")
    if want.isdigit() and int(want) < len(devices):
        return devices[int(want)].key
    listed = "; ".join(f"{i}: {d.key!r} ({d.kind})" for i, d in enumerate(devices)) or "none"
    raise ConfigError(f"{option}={want!r}: no such device in {redact_url(store.url)}; its devices: {listed}. Give the number "
                      f"({option}=0), or the key in quotes inside the shell's: '{option}=\"KEY\"'")


def table_metadata(store: Store, table: dict[str, list[dict[str, Any]]], options: dict[str, Any],
                   source: str, device_ids: set[int] | None = None) -> dict[str, Any]:
    """The wrapper fields for a table built from ``store``: format, this zhantune's version and this
    process's torch and triton (zhantune.provenance; ``options["torch_version"]`` where given;
    :func:`export_table` writes the Triton its tuned entries were measured with, null where they
    recorded none or several: another machine's export of a merged database wrote its own), the
    creation time (UTC), ``source`` (the database URL without its password), the devices it holds
    configs of (key, name, kind; a CPU's vector ISA where stored: use_table reports its entries
    stale on a CPU of another; for a device-agnostic or portable table only those measured with the table's torch
    release, which the table ranks: its keys without a device are of their one kind, and another
    release's device of the other kind listed made them of neither: a review; ``device_ids``: only these,
    the devices that placed the export's keys: a problems file's CPU problems, exported device-agnostic
    from a database that also held a GPU's, were listed with that GPU and served on CUDA, a helper found),
    and the export ``options``."""
    import zhantune
    from zhantune.device import CPU_IDENTITY
    from zhantune.provenance import software_versions

    versions = software_versions()
    wanted = options.get("devices")  # compare's devices= (keys or names); None: every device
    devices = [{"key": d.key, "name": d.name, "kind": d.kind,  # a CPU's ISA and cpuid: one model name covers several
                **{f: (d.properties or {})[f] for f in CPU_IDENTITY if d.kind == "cpu" and (d.properties or {}).get(f)}}
               for d in store.devices_with_candidates(options.get("device"), table_torch(options.get("torch_version"))
                                                      if options.get("device_agnostic") or options.get("portable") else None)
               if (not wanted or d.key in wanted or d.name in wanted) and (device_ids is None or d.id in device_ids)]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "zhantune": zhantune.__version__,
            "torch": table_torch(options.get("torch_version")), "triton": versions["triton"],
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "source": source, "devices": devices,
            "options": options}
