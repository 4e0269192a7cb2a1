"""Lookup tables from measurements, and back: build a store's table, export it with its options,
the portable table of a comparison, and a table's entries as candidates to measure again.

The table format itself (keys, entries, files) is zhantune.inductor.table's.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zhantune.bench.decision import claim_holds, decision_us
from zhantune.errors import ConfigError, TableError
from zhantune.inductor.knobs import BACKEND_FLAGS
from zhantune.inductor.table import (
    CONFIG_TEMPLATE_ID,
    FORMAT,
    FORMAT_VERSION,
    agnostic_key,
    carried,
    default_entry,
    entry_for,
    entry_problem,
    not_carried,
    parse_key,
    table_key,
    write_table,
)
from zhantune.inductor.templates import is_default_kernel

if TYPE_CHECKING:
    from zhantune.candidate import Candidate
    from zhantune.report.regret import Comparison
    from zhantune.storage import Store

__all__ = ["FORMATS", "build_table", "export_table", "check_export_options", "resolve_device_key",
           "portable_table", "portable_choices", "PortableTable", "unconfirmed_portable", "table_metadata",
           "not_carried_reason", "table_candidates"]

#: ``export.format`` values: zhantune wraps the table with its provenance, inductor writes the bare dict
FORMATS = ("zhantune", "inductor")


def check_export_options(opts: Any, prefix: str = "") -> None:
    """Raise ConfigError naming the option (``export.top_k=0``) when a value is out of range.
    ``opts``: an ExportConfig (zhantune.config) or the export app's config."""
    from zhantune.paths import check_output_path

    if opts.format not in FORMATS:
        raise ConfigError(f"{prefix}format={opts.format!r}; allowed: {', '.join(FORMATS)}")
    if opts.top_k < 1:
        raise ConfigError(f"{prefix}top_k={opts.top_k} must be at least 1")
    if opts.min_speedup is not None and not 1.0 <= opts.min_speedup < math.inf:
        raise ConfigError(f"{prefix}min_speedup={opts.min_speedup} must be a number of at least 1.0 "
                          "(1.0: the tuned entry unless it is slower than the default; null: always the tuned entry)")
    if getattr(opts, "enabled", True) and opts.path:
        check_output_path(opts.path, f"{prefix}path")


def export_table(store: Store, opts: Any, device_key: str | None = None) -> tuple[Path | None, dict]:
    """Build the table with ``opts`` (an ExportConfig: top_k, min_speedup, device_agnostic,
    torch_version, format, path) and write it to ``opts.path``; returns (path, table). An empty
    table is not written (path None), so an existing file is never replaced by it."""
    from zhantune.storage import redact_url

    table = build_table(store, device_key=device_key, device_agnostic=opts.device_agnostic, top_k=opts.top_k,
                        min_speedup=opts.min_speedup, torch_version=opts.torch_version)
    meta = None
    if opts.format == "zhantune":
        options = {"top_k": opts.top_k, "min_speedup": opts.min_speedup, "device_agnostic": opts.device_agnostic,
                   "device": device_key, "torch_version": opts.torch_version}
        meta = table_metadata(store, table, options, redact_url(store.url))
    if not table:
        return None, table
    return write_table(opts.path, table, meta), table


def resolve_device_key(store: Store, spec: Any, option: str = "device") -> str | None:
    """The key of the database device that ``device=`` names: its key or name, its number in the
    list of the database's devices (sorted by key, from 0), or its kind (``cpu``, ``cuda``) when
    exactly one device has it. None for None. Raises ConfigError listing the devices otherwise."""
    if spec is None:
        return None
    want = str(spec).strip()
    devices = store.devices()
    for d in devices:
        if want in (d.key, d.name):
            return d.key
    if want.isdigit() and int(want) < len(devices):
        return devices[int(want)].key
    of_kind = [d for d in devices if d.kind == want.lower()]
    if len(of_kind) == 1:
        return of_kind[0].key
    from zhantune.storage.engine import redact_url

    listed = "; ".join(f"{i}: {d.key!r} ({d.kind})" for i, d in enumerate(devices)) or "none"
    raise ConfigError(f"{option}={want!r}: no such device in {redact_url(store.url)}; it has {listed}. Give the number "
                      f"({option}=0), or the key in quotes inside the shell's: '{option}=\"KEY\"'")


def not_carried_reason(row: Any, device_kind: str) -> str | None:
    """Why a lookup table cannot carry this measured config (a measurement row, or None) on
    ``device_kind`` (so the export skips it: :func:`build_table`), or None: a torch.backends flag
    (TF32) is process-wide, and on CUDA a config patch is compile-wide
    (zhantune.inductor.table.not_carried)."""
    if row is None:
        return None
    if row.template_id is None and row.params and all(k in BACKEND_FLAGS for k in row.params):
        flags = ", ".join(f"torch.backends.{k} = {v}" for k, v in sorted(row.params.items()))
        return f"torch.backends flags are process-wide, not a per-GEMM choice a table can carry; set {flags} yourself"
    entry = entry_for(row.template_id, row.params, row.template_hash)
    why = not_carried(entry, device_kind)
    if why is None and entry_problem(entry, device_kind) is not None:
        name, problem = entry_problem(entry, device_kind)
        why = f"{name}: {problem}"
    return why


def table_candidates(table: dict, problems: dict[str, Any], source: str,
                     device_kind: str = "cuda") -> list[tuple[Any, list[Candidate]]]:
    """(problem row, [Candidate, ...]) for each key of ``table``; ``problems``: problem rows by
    their device-agnostic lookup key (Store.problems_by_lookup_key). Raises TableError naming
    ``source`` and the key for a key with no problem.

    On CPU an ``aten::<op>`` entry (Inductor's default choice) is measured as the config candidate
    that selects ATen (``max_autotune_gemm_backends=ATEN``, the ``aten`` space's point, same config
    hash), since Inductor's CPU GEMM has no template lookup. A template entry's kwargs that zhantune
    derives from the problem (``EVEN_K``, zhantune.inductor.heuristics.derived_kwargs) are left out
    of its params where they hold the derived value, so that it has the config hash of the tune's
    candidate it was exported from (the measurement adds them again)."""
    from zhantune.candidate import Candidate
    from zhantune.inductor.heuristics import derived_kwargs

    out = []
    for key, entries in table.items():
        row = next((p for agnostic, p in problems.items() if key == agnostic or key.endswith("+" + agnostic)), None)
        if row is None:
            raise TableError(f"{source}: [{key!r}]: no problem with this Inductor input key in the database; "
                             "use the database the table was exported from (or merge it: python -m zhantune.db merge)")
        cands = []
        for i, entry in enumerate(entries):
            entry = dict(entry)
            template_id = entry.pop("template_id")
            entry.pop("template_hash", None)
            if template_id == CONFIG_TEMPLATE_ID:
                patch = entry.get("config_patch")
                if not isinstance(patch, dict):
                    raise TableError(f"{source}: [{key!r}][{i}].config_patch: expected an object")
                cands.append(Candidate("table", "config", None, dict(patch)))
            elif device_kind == "cpu" and template_id.startswith("aten::"):
                cands.append(Candidate("table", "config", None, {"max_autotune_gemm_backends": "ATEN"}))
            else:  # without the kwargs zhantune derives and adds where it measures (EVEN_K): the tune's hash
                derived = derived_kwargs(template_id, entry, row.shape or {})
                cands.append(Candidate("table", "template", template_id,
                                       {k: v for k, v in entry.items() if k not in derived or v != derived[k]}))
        out.append((row, cands))
    return out


def build_table(store: Store, device_key: str | None = None, device_agnostic: bool = False, top_k: int = 1,
                min_speedup: float | None = None, torch_version: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Best correct candidates per (device, problem) from a Store, as a lookup table.

    ``top_k`` entries per key, fastest first (1: Inductor compiles that one, no autotuning; more:
    Inductor autotunes among them). Each entry goes under the key of the lookup it hit
    (:func:`table_key`); where none is under the problem's own key, that key maps to ``[]``.
    ``min_speedup``: where the best candidate is not at least this many times faster than
    Inductor's default compile, the key gets Inductor's default choice (:func:`default_entry`)
    instead; None: no check. Where the tune settled the winner's claim (a Verdict: paired,
    interleaved rounds, zhantune.bench.decision) the claim must be confirmed with a ratio of at
    least ``min_speedup``; where it settled another config (one a table cannot carry on that device:
    :func:`not_carried`) or made no claim (a verdict without rounds: ``bench.remeasure_rounds=0``),
    the default ships; where no tune left a verdict (imported data) the stored decision statistics
    (minimum of the runs) decide. ``torch_version`` keeps only rows
    measured with that torch. ``device_agnostic`` keys entries without the device; where several
    devices share a problem the fastest device's winners are kept (cross-device choices are the
    compare command's job).
    """
    from zhantune.inductor.heuristics import with_derived_kwargs

    defaults = store.default_times_us(torch_version) if min_speedup is not None else {}
    verdicts = store.latest_verdicts() if min_speedup is not None else {}
    # problems a tune settled: in paired rounds, or with a note that it made no claim (rounds 0:
    # bench.remeasure_rounds=0, a winner from another space); its summary said so, the default ships
    settled = {(d, p) for (d, p, _) in verdicts}
    own_keys = store.default_lookup_keys()
    # every distinct config, so that rows a table may not carry (a tf32 backend flag, zhantune.
    # inductor.knobs; a config patch on CUDA, not_carried) make way for the next ones
    ranked = [(d, p, [r for r in rows if carried(entry_for(r.template_id, r.params, r.template_hash), d.kind)])
              for d, p, rows in store.ranked_candidates(device_key, torch_version, 1 << 30)]
    ranked.sort(key=lambda r: decision_us(r[2][0]) if r[2] else float("inf"))  # the ranking rule's statistic
    table: dict[str, list[dict[str, Any]]] = {}
    seen: set[int] = set()
    for device, problem, rows in ranked:
        if problem.id in seen:  # another device was faster on this problem (device-agnostic keys)
            continue
        default_us = defaults.get((device.id, problem.id))

        # the fastest carried config whose claim was confirmed in paired rounds (a faster one whose
        # claim failed, or that was never paired, does not hide it)
        first = next((i for i, r in enumerate(rows)
                      if _confirmed(verdicts.get((device.id, problem.id, r.config_hash)), min_speedup)),
                     None) if min_speedup is not None else None
        if first is not None:
            rows, keep = rows[first:], True
        elif rows and (device.id, problem.id) in settled:
            # the tunes settled configs and none was confirmed (no paired rounds, a claim that failed,
            # or the one settled cannot be carried, e.g. a fusion limit on CUDA): no claim, the default ships
            keep = False
        else:  # no verdict at all (imported data, a database from before verdicts): the stored statistics
            keep = bool(rows) and (default_us is None or decision_us(rows[0]) * min_speedup <= default_us) \
                if min_speedup is not None else bool(rows)
        rows = rows[:max(1, top_k)]
        if keep and is_default_kernel(rows[0].template_id, rows[0].params):
            keep = False  # the default's own kernel: Inductor's default entry, never a "tuned" one
        # the problem's own lookup on this device (a float32 linear_act is an addmm on CPU and an mm
        # on a GPU: the problem row keeps the first device's), from its default compile there
        own_key = own_keys.get((device.id, problem.id))
        problem_key = agnostic_key(own_key) if own_key else problem.lookup_key
        lookup_op = (parse_key(problem_key) or {}).get("op") or problem.lookup_op if problem_key else problem.lookup_op
        if not keep:
            placed = [(table_key(device.key, problem_key, None, device_agnostic), default_entry(lookup_op))]
        else:  # each entry under the key its own lookup makes (addmm: templates and ATen differ)
            placed = [(table_key(device.key, problem_key, r, device_agnostic),
                       entry_for(r.template_id, r.params, r.template_hash)) for r in rows]
        if any(key in table for key, _ in placed if key):
            continue
        if device_agnostic:
            seen.add(problem.id)
        for key, entry in placed:
            if key:  # with the kwargs Inductor would otherwise take from another config (EVEN_K)
                table.setdefault(key, []).append(with_derived_kwargs(entry, problem.shape))
        # every entry under another key (addmm's Triton templates use the expanded bias): the
        # problem's own (ATen) lookup gets "nothing from this lookup", so the GEMM compiles only them
        own = table_key(device.key, problem_key, None, device_agnostic)
        if own and own not in table and all(key != own for key, _ in placed):
            table[own] = []
    return dict(sorted(table.items()))


@dataclass
class PortableTable:
    """What :func:`portable_choices` wrote and why: the ``table``; ``withheld``: problem key ->
    device key -> why its portable choice may not replace Inductor's default there
    (:func:`unconfirmed_portable`); ``shared``: the lookup keys that problems with different
    portable choices map to (Inductor's default entry there)."""

    table: dict[str, list[dict[str, Any]]]
    withheld: dict[str, dict[str, str]] = field(default_factory=dict)
    shared: list[str] = field(default_factory=list)


def portable_table(comparison: Comparison, store: Store,
                   min_speedup: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """:func:`portable_choices`' table."""
    return portable_choices(comparison, store, min_speedup).table


def portable_choices(comparison: Comparison, store: Store, min_speedup: float | None = None) -> PortableTable:
    """The portable choice of each compared problem (zhantune.report.regret: correct on every
    device, least worst regret) as device-agnostic lookup-table entries, keyed as :func:`build_table`
    keys them (a template entry under the key of the lookup its template hit) and with the kwargs
    Inductor would otherwise take from another config (``EVEN_K``). Problems without an Inductor key
    (imported or replayed data) and choices a table cannot carry on one of the compared devices
    (:func:`not_carried`) are left out. ``min_speedup`` as build_table's, on every compared device:
    where the choice may not replace the default on one of them (:func:`unconfirmed_portable`), the
    problem's key gets Inductor's default choice (:func:`default_entry`); None: no check. So does a
    choice that is the default's own kernel (:func:`is_default_kernel`), and, whatever
    ``min_speedup``, a key two problems map to with different choices (a float32 linear_act with
    relu and with gelu: one addmm lookup), since neither choice was measured for the other."""
    entries = _portable_entries(comparison, store)
    out = PortableTable({}, _withheld(entries, store, min_speedup))
    table = out.table
    for p, problem, entry in entries:
        choice, key = p.portable, problem.lookup_key
        default = default_entry((parse_key(key) or {}).get("op") or problem.lookup_op)
        if p.problem_key in out.withheld or is_default_kernel(choice.template_id, choice.params):
            entry = default
        elif choice.template_id is not None:
            found = store.config_lookup(problem.id, choice.config_hash)
            if found is None:
                continue
            key = table_key(found[0].key, problem.lookup_key, found[1], device_agnostic=True)
            if key != problem.lookup_key:  # addmm: the problem's own (ATen) lookup gets "nothing"
                table.setdefault(problem.lookup_key, [])
        if table.get(key, [entry]) != [entry]:  # another problem's different choice: the default
            entry = default
            out.shared.append(key)
        table[key] = [entry]
    out.table, out.shared = dict(sorted(table.items())), sorted(set(out.shared))
    return out


def unconfirmed_portable(comparison: Comparison, store: Store,
                         min_speedup: float | None) -> dict[str, dict[str, str]]:
    """Problem key -> compared device key -> why its portable choice (one a table can hold, as
    :func:`portable_choices` writes) may not replace Inductor's default there, by build_table's
    rule. It may where a claim over the default was confirmed in paired rounds
    (zhantune.bench.decision.claim_holds) with a ratio of at least ``min_speedup``; else not where
    the device's tunes settled the problem ("never paired with the default", "not confirmed: ...",
    "confirmed at R.RRRx, below min_speedup"); where nothing left a verdict (a database from before
    verdicts), where its time (the decision statistic) times ``min_speedup`` is at most the
    default's, or no default was measured. Empty for ``min_speedup`` None."""
    return _withheld(_portable_entries(comparison, store), store, min_speedup)


def _withheld(entries: list[tuple[Any, Any, dict[str, Any]]], store: Store,
              min_speedup: float | None) -> dict[str, dict[str, str]]:
    """:func:`unconfirmed_portable` over ``entries`` (:func:`_portable_entries`)."""
    if min_speedup is None:
        return {}
    verdicts = store.latest_verdicts()
    settled = {(d, p) for (d, p, _) in verdicts}
    device_ids = {d.key: d.id for d in store.devices()}
    out: dict[str, dict[str, str]] = {}
    for p, problem, _ in entries:
        if is_default_kernel(p.portable.template_id, p.portable.params):
            continue  # the default's own kernel: its key gets the default's entry, nothing to confirm
        for dev, regret in p.portable.regret.items():
            key = (device_ids[dev], problem.id)
            v = verdicts.get((*key, p.portable.config_hash))
            default_us = p.default_us.get(dev)
            if _confirmed(v, min_speedup):
                continue
            if v is not None and claim_holds(v):
                why = f"confirmed at {v.ratio:.3f}x, below min_speedup"
            elif v is not None and v.rounds:
                why = f"not confirmed: {v.reason}"
            elif key in settled or v is not None:
                why = "never paired with the default"
            elif default_us is not None and p.best_us[dev] * regret * min_speedup > default_us:
                why = f"{default_us / (p.best_us[dev] * regret):.3f}x by the stored times, below min_speedup"
            else:
                continue
            out.setdefault(p.problem_key, {})[dev] = why
    return out


def _portable_entries(comparison: Comparison, store: Store) -> list[tuple[Any, Any, dict[str, Any]]]:
    """(problem comparison, problem row, entry) for each portable choice a table can hold: the
    problem has an Inductor key and every compared device can carry the entry (with its derived
    kwargs)."""
    from zhantune.inductor.heuristics import with_derived_kwargs

    problems = store.problems_by_key()
    kinds = {d.key: d.kind for d in store.devices_with_candidates()}
    out = []
    for p in comparison.problems:
        problem, choice = problems.get(p.problem_key), p.portable
        if choice is None or problem is None or not problem.lookup_key:
            continue
        entry = with_derived_kwargs(entry_for(choice.template_id, choice.params, None), problem.shape or {})
        if all(carried(entry, kinds.get(dev, "cuda")) for dev in p.best_us):
            out.append((p, problem, entry))
    return out


def _confirmed(verdict: Any, min_speedup: float) -> bool:
    """A verdict settled in paired rounds whose claim holds under the rule in use
    (zhantune.bench.decision.claim_holds), with a ratio of at least ``min_speedup``."""
    return claim_holds(verdict) and verdict.ratio >= min_speedup


def table_metadata(store: Store, table: dict[str, list[dict[str, Any]]], options: dict[str, Any],
                   source: str) -> dict[str, Any]:
    """The wrapper fields for a table built from ``store``: format, this zhantune's version and this
    process's torch and triton (zhantune.provenance; ``options["torch_version"]`` where given), the
    creation time (UTC), ``source`` (the database URL without its password), the devices it holds
    configs of, and the export ``options``."""
    import zhantune
    from zhantune.provenance import software_versions

    versions = software_versions()
    devices = [{"key": d.key, "name": d.name, "kind": d.kind}
               for d in store.devices_with_candidates(options.get("device"))]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "zhantune": zhantune.__version__,
            "torch": options.get("torch_version") or versions["torch"], "triton": versions["triton"],
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "source": source, "devices": devices,
            "options": options}
