"""The portable table of a comparison (``python -m zhantune.compare table=FILE``): each problem's
portable choice (zhantune.report.regret) as a device-agnostic lookup-table entry, only where it may
replace Inductor's default on every compared device by the export's rule
(zhantune.inductor.builder.build_table), else Inductor's default choice, with the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zhantune.bench.decision import claim_status
from zhantune.errors import ConfigError, two_kinds
from zhantune.inductor.builder import table_torch
from zhantune.inductor.epilogue import merged_activation
from zhantune.inductor.table import agnostic_key, carried, default_entry, entry_for, parse_key, table_key
from zhantune.inductor.templates import is_default_kernel

if TYPE_CHECKING:
    from zhantune.report.regret import Comparison
    from zhantune.storage import Store

__all__ = ["PortableTable", "portable_table", "portable_choices", "unconfirmed_portable"]


@dataclass
class PortableTable:
    """What :func:`portable_choices` wrote and why: the ``table``; ``withheld``: problem key ->
    device key -> why its portable choice may not replace Inductor's default there
    (:func:`unconfirmed_portable`); ``shared``: the lookup keys that problems with different
    portable choices map to (Inductor's default entry there); ``activations``: key -> the activation of
    the linear_act problem whose choice it holds (the table file's field, as the export writes it)."""

    table: dict[str, list[dict[str, Any]]]
    withheld: dict[str, dict[str, str]] = field(default_factory=dict)
    shared: list[str] = field(default_factory=list)
    activations: dict[str, Any] = field(default_factory=dict)


#: why a portable choice is withheld on a device it was not compared on (the table's key applies there)
FAILED_THERE = "failed there or gave a wrong output (not compared: devices=[...]), and the table's key applies there"


def portable_table(comparison: Comparison, store: Store,
                   min_speedup: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """:func:`portable_choices`' table."""
    return portable_choices(comparison, store, min_speedup).table


def portable_choices(comparison: Comparison, store: Store, min_speedup: float | None = None) -> PortableTable:
    """The portable choice of each compared problem (zhantune.report.regret: correct on every
    device, least worst regret) as device-agnostic lookup-table entries, keyed as zhantune.inductor.builder.build_table
    keys them (a template entry under the key of the lookup its template hit) and with the kwargs
    Inductor would otherwise take from another config (``EVEN_K``). Problems without an Inductor key
    (imported or replayed data) and choices a table cannot carry on one of the compared devices
    (zhantune.inductor.table.not_carried) are left out. ``min_speedup`` as build_table's, on every compared device:
    where the choice may not replace the default on one of them (:func:`unconfirmed_portable`), the
    problem's key gets Inductor's default choice (:func:`default_entry`); None: no check. So does a
    choice that is the default's own kernel (:func:`is_default_kernel`), and, whatever
    ``min_speedup``, a key two problems map to with different choices (a float32 linear_act with
    relu and with gelu: one addmm lookup), since neither choice was measured for the other."""
    entries = _portable_entries(comparison, store)
    devices = store.devices()
    torch, ids, kind = table_torch(None), {d.key: d.id for d in devices}, {d.key: d.kind for d in devices}
    compared = [ids[d] for d in comparison.devices]
    if len(kinds := sorted({kind[dev] for p, _, _ in entries for dev in p.best_us})) > 1:
        raise ConfigError(two_kinds(f"table=: the compared devices are of two kinds ({' and '.join(kinds)})",
                                    "compare one kind's devices (devices=[...]) for a table"))
    out = PortableTable({}, _withheld(entries, store, min_speedup))
    table = out.table
    # a problem's key as this torch's release looked it up on a compared device (the problem row
    # keeps the first ever recorded, of any release and device)
    lookups = store.default_lookup_keys(torch)
    for p, problem, entry in entries:
        own = next((agnostic_key(lookups[(d, problem.id)]) for d in compared if (d, problem.id) in lookups),
                   problem.lookup_key)
        before = set(table)  # keys another problem placed: a tag there is merged, never replaced
        choice, key = p.portable, own
        default = default_entry((parse_key(key) or {}).get("op") or problem.lookup_op)
        if p.problem_key in out.withheld or is_default_kernel(choice.template_id, choice.params):
            entry = default
        elif choice.template_id is not None:
            found = store.config_lookup(problem.id, choice.config_hash, torch, compared)
            if found is None:
                continue
            key = table_key(found[0].key, own, found[1], device_agnostic=True)
            if key != own:  # addmm: the problem's own (ATen) lookup gets "nothing"
                table.setdefault(own, [])
        if table.get(key, [entry]) != [entry]:  # another problem's different choice: the default
            entry = default
            out.shared.append(key)
        table[key] = [entry]
        act = getattr(problem, "activation", None)
        for k in {key, own}:  # the default's keys too, and the ATen key of a template's
            tag = merged_activation(out.activations.get(k), act) if k in before else act
            if tag is None:
                out.activations.pop(k, None)
            else:
                out.activations[k] = tag
    out.table, out.shared = dict(sorted(table.items())), sorted(set(out.shared))
    out.activations = {k: a for k, a in out.activations.items() if k not in out.shared}
    return out


def unconfirmed_portable(comparison: Comparison, store: Store,
                         min_speedup: float | None) -> dict[str, dict[str, str]]:
    """Problem key -> device key (a compared one, or another of their kinds) -> why its portable choice (one a table can hold, as
    :func:`portable_choices` writes) may not replace Inductor's default there, by build_table's
    rule, on every compared device and on every other device of their kinds that measured the problem
    (the key applies there too; a config whose output was wrong there never was confirmed). It may where a claim over the default was confirmed in paired rounds
    (zhantune.bench.decision.claim_holds) with a ratio of at least ``min_speedup``; else not
    ("never paired with the default", also where nothing left a verdict: an interrupted tune, a
    database from before verdicts; "not confirmed: ..."; "confirmed at R.RRRx, below min_speedup").
    With ``min_speedup`` None only the devices of those kinds where the choice failed or gave a
    wrong output (:data:`FAILED_THERE`; a compared device never has: the choice is correct on each)."""
    return _withheld(_portable_entries(comparison, store), store, min_speedup)


def _withheld(entries: list[tuple[Any, Any, dict[str, Any]]], store: Store,
              min_speedup: float | None) -> dict[str, dict[str, str]]:
    """:func:`unconfirmed_portable` over ``entries`` (:func:`_portable_entries`)."""
    torch = table_torch(None)  # the table is for this torch
    verdicts, any_torch = (store.latest_verdicts(torch), store.latest_verdicts()) if min_speedup is not None else ({}, {})
    devices = store.devices()
    device_ids, kinds, keys = {d.key: d.id for d in devices}, {d.key: d.kind for d in devices}, {d.id: d.key for d in devices}
    # a device-agnostic key applies on every device of its kind, compared or not (devices=[...]): the
    # choice must not have failed on one (whatever min_speedup), and each that measured the problem
    # with this torch's release must confirm it
    measured: dict[int, set[str]] = {}
    for d, prob, rows in store.ranked_candidates(None, torch, 1 << 30):  # as the export: configs it can carry there
        if any(carried(entry_for(r.template_id, r.params, r.template_hash), d.kind) for r in rows):
            measured.setdefault(prob.id, set()).add(d.key)
    wrong = store.incorrect_configs(torch, failed_too=True)
    out: dict[str, dict[str, str]] = {}
    for p, problem, _ in entries:
        if is_default_kernel(p.portable.template_id, p.portable.params):
            continue  # the default's own kernel: its key gets the default's entry, nothing to confirm
        compared = {kinds[dev] for dev in p.portable.regret}
        failed = {keys[d] for d, kind in wrong.get((problem.id, p.portable.config_hash), {}).items() if kind in compared}
        for dev in sorted(failed - set(p.portable.regret)):
            out.setdefault(p.problem_key, {})[dev] = FAILED_THERE
        if min_speedup is None:
            continue
        others = measured.get(problem.id, set()) - set(p.portable.regret) - failed
        for dev in [*p.portable.regret, *sorted(d for d in others if kinds[d] in compared)]:
            key = (device_ids[dev], problem.id, p.portable.config_hash)
            # never paired: settled without this config, or never settled (an interrupted tune)
            why = claim_status(verdicts.get(key), any_torch.get(key), min_speedup, torch)
            if why is not None:
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
