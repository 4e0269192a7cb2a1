"""Lookup tables from measurements, and back: build a store's table (zhantune.inductor.exporter
writes it with its options), and a table's entries as candidates to measure again (the portable table of a comparison:
zhantune.inductor.portable).

The table format itself (keys, entries, files) is zhantune.inductor.table's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zhantune.bench.decision import claim_holds, decision_us
from zhantune.errors import SHOWN_KEY, ConfigError, TableError, shown, two_kinds
from zhantune.inductor.epilogue import merged_activation
from zhantune.inductor.knobs import BACKEND_FLAGS
from zhantune.inductor.table import (
    CONFIG_TEMPLATE_ID,
    agnostic_key,
    carried,
    default_entry,
    entry_for,
    entry_problem,
    not_carried,
    parse_key,
    table_key,
)
from zhantune.inductor.templates import is_default_kernel

if TYPE_CHECKING:
    from zhantune.candidate import Candidate
    from zhantune.storage import Store

__all__ = ["build_table", "not_carried_reason", "table_candidates", "claim_clears", "table_torch", "Shipped"]

def not_carried_reason(row: Any, device_kind: str) -> str | None:
    """Why a lookup table cannot carry this measured config (a measurement row, or None) on
    ``device_kind`` (so the export skips it: :func:`build_table`), or None: a torch.backends flag
    (TF32) is process-wide, and on CUDA a config patch is compile-wide
    (zhantune.inductor.table.not_carried)."""
    if row is None:
        return None
    if row.template_id is None and row.params and all(k in BACKEND_FLAGS for k in row.params):
        flags = ", ".join(f"torch.backends.{k} = {v}" for k, v in sorted(row.params.items()))
        return (f"torch.backends flags are process-wide, not a per-GEMM choice a table can carry; set {flags} yourself "
                "(every float32 GEMM then runs with it, and Inductor's lookup key holds no precision: the table's float32 "
                "entries were measured without it)")
    entry = entry_for(row.template_id, row.params, row.template_hash)
    why = not_carried(entry, device_kind)
    if why is None and (bad := entry_problem(entry, device_kind)):
        name, problem = bad
        why = f"{name}: {problem}"
    return why


def table_candidates(table: dict, problems: dict[str, Any], source: str, device_kind: str = "cuda",
                     activations: dict[str, Any] | None = None) -> list[tuple[Any, list[Candidate]]]:
    """(problem row, [Candidate, ...]) for each problem of each key of ``table``; ``problems``: problem
    rows (a row, or a list of those sharing the key) by their device-agnostic lookup key
    (Store.problems_by_lookup_key). ``activations`` (a table file's, None: it does not say): a key's
    entries are measured on the problems of the activation(s) they were tuned with, else on every
    problem of the key (a helper's: the replay took whichever problem was stored last, and settled a
    gelu entry's claim on a plain addmm); Inductor's default entry (or none: ``[]``) on every problem of
    the key, whatever the table says (a shared key's default, untagged: a review's). Raises TableError naming ``source`` and the key for a key
    with no problem, or none of the table's activation.

    On CPU an ``aten::<op>`` entry (Inductor's default choice) is measured as the config candidate
    that selects ATen (``max_autotune_gemm_backends=ATEN``, the ``aten`` space's point, same config
    hash), since Inductor's CPU GEMM has no template lookup. A template entry's kwargs that zhantune
    derives from the problem (``EVEN_K``, zhantune.inductor.heuristics.derived_kwargs) are left out
    of its params where they hold the derived value, so that it has the config hash of the tune's
    candidate it was exported from (the measurement adds them again)."""
    out = []
    for key, entries in table.items():
        rows = next(([ps] if not isinstance(ps, list) else ps for agnostic, ps in problems.items()
                     if key == agnostic or key.endswith("+" + agnostic)), [])
        if not rows:
            raise TableError(f"{source}: [{shown(key, SHOWN_KEY)}]: no problem with this Inductor input key in the database; "
                             "use the database the table was exported from (or merge it: python -m zhantune.db merge)")
        op = (parse_key(key) or {}).get("op")
        if activations is not None and not all(e == default_entry(op) for e in entries):  # a default (or []) serves all
            want = activations.get(key)
            wants = want if isinstance(want, list) else [want]
            if not (rows := [r for r in rows if getattr(r, "activation", None) in wants]):
                raise TableError(f"{source}: [{shown(key, SHOWN_KEY)}]: its entries were measured with "
                                 f"{' or '.join(w or 'no activation' for w in wants)} fused; no problem of this key in "
                                 "the database was: use the database the table was exported from")
        out.extend((row, _candidates(key, entries, row, source, device_kind)) for row in rows)
    return out


def _candidates(key: str, entries: list[dict[str, Any]], row: Any, source: str, device_kind: str) -> list[Candidate]:
    """:func:`table_candidates`' candidates of one key's entries for one problem ``row``."""
    from zhantune.candidate import Candidate
    from zhantune.inductor.heuristics import derived_kwargs

    cands = []
    for i, entry in enumerate(entries):
        entry = dict(entry)
        template_id = entry.pop("template_id")
        entry.pop("template_hash", None)
        if template_id == CONFIG_TEMPLATE_ID:
            patch = entry.get("config_patch")
            if not isinstance(patch, dict):
                raise TableError(f"{source}: [{shown(key, SHOWN_KEY)}][{i}].config_patch: expected an object")
            cands.append(Candidate("table", "config", None, dict(patch)))
        elif device_kind == "cpu" and template_id.startswith("aten::"):
            cands.append(Candidate("table", "config", None, {"max_autotune_gemm_backends": "ATEN"}))
        else:  # without the kwargs zhantune derives and adds where it measures (EVEN_K): the tune's hash
            derived = derived_kwargs(template_id, entry, row.shape or {})
            cands.append(Candidate("table", "template", template_id,
                                   {k: v for k, v in entry.items() if k not in derived or v != derived[k]}))
    return cands


#: what export and compare print for a table written with min_speedup=null
NO_CLAIM_NOTE = ("min_speedup=null: each key's fastest stored config ships as it was measured, never paired "
                 "with Inductor's default: the table claims no speedup")


def build_table(store: Store, device_key: str | None = None, device_agnostic: bool = False, top_k: int = 1,
                min_speedup: float | None = None, torch_version: str | None = None,
                shared: list[str] | None = None, problem_ids: set[int] | None = None,
                shipped: dict[tuple[int, int], Shipped] | None = None,
                activations: dict[str, Any] | None = None, devices: set[int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Best correct candidates per (device, problem) from a Store, as a lookup table.

    ``top_k`` entries per key, fastest first (1: Inductor compiles that one, no autotuning; more:
    Inductor autotunes among them). Each entry goes under the key of the lookup it hit
    (:func:`table_key`); where none is under the problem's own key, that key maps to ``[]``.
    ``min_speedup`` (None: no check): a tuned entry ships only where its claim (a Verdict: paired,
    interleaved rounds, zhantune.bench.decision) was confirmed with a ratio of at least this (the
    fastest config whose claim was, in any run with the table's torch: a faster one never paired or
    unconfirmed does not hide it); elsewhere Inductor's default choice (:func:`default_entry`): where
    the tunes settled a config no table carries there (:func:`not_carried`), made no claim or left no
    verdict, stored times alone were never paired with the default. Verdicts, rows and keys count only
    where measured with the table's torch release (``torch_version``, else this process's).
    ``device_agnostic`` keys entries without the device: the fastest device's ranking, a tuned entry
    only where its claim cleared on every device of its kind that measured the problem (the key applies
    on each), never a config wrong on one of them (:func:`_carried_ranked`). Two problems of one lookup
    key with different entries (a float32 linear_act with relu and one with gelu: one addmm lookup on
    CPU) both get the default, appended to ``shared`` (a list, where given). ``problem_ids``: only these problems (a problems
    file's), None: every problem measured. ``shipped`` (a dict, where given) gets (device id,
    problem id) -> :class:`Shipped` for each problem placed; ``activations`` key -> a linear_act's
    (zhantune.inductor.epilogue.merged_activation where equal entries of one key were tuned for several);
    ``devices`` the ids of the devices whose measurements placed a key (a device-agnostic key's: every
    device of its kind that measured the problem), which the table's wrapper lists."""
    verdicts = store.latest_verdicts(table_torch(torch_version)) if min_speedup is not None else {}  # its release's
    own_keys = store.default_lookup_keys(table_torch(torch_version))
    acts = activations if activations is not None else {}
    table: dict[str, list[dict[str, Any]]] = {}
    seen: set[int] = set()
    owners: dict[str, tuple[str | None, str]] = {}  # key -> (own key, lookup op) of the problem that placed it
    clashes: list[tuple[str | None, str, list[str]]] = []
    placed_rows: dict[tuple[int, int], tuple[Any, str | None]] = {}
    ranked, measured_on = _carried_ranked(store, device_key, torch_version, problem_ids, device_agnostic)
    for device, problem, rows in ranked:
        if problem.id in seen or device.key != (device_key or device.key):  # seen: a faster device placed it
            continue
        keys = [(d, problem.id) for d, kind in measured_on.get(problem.id, []) if kind == device.kind] or [(device.id, problem.id)]
        rows, keep = _tuned_rows(rows, keys, verdicts, min_speedup)
        rows = rows[:max(1, top_k)]
        if keep and is_default_kernel(rows[0].template_id, rows[0].params):
            keep = False  # the default's own kernel: Inductor's default entry, never a "tuned" one
        # the problem's own lookup on this device (a float32 linear_act is an addmm on CPU and an mm
        # on a GPU: the problem row keeps the first device's), from its default compile there
        own_key = own_keys.get((device.id, problem.id))
        problem_key = agnostic_key(own_key) if own_key else problem.lookup_key
        lookup_op = (parse_key(problem_key) or {}).get("op") or problem.lookup_op if problem_key else problem.lookup_op
        own, mine = _entries(device.key, problem, problem_key, lookup_op, rows if keep else None, device_agnostic)
        placed_rows[(device.id, problem.id)] = (rows[0] if keep else None, own)
        if devices is not None and mine:
            devices.update(d for d, _ in keys)
        clash = [key for key in mine if key in table]
        if clash:  # another problem's lookup: the same entries ship for both, or the default for each
            if any(table[key] != mine[key] for key in clash):
                clashes.append((own, lookup_op, clash))
            else:  # tuned for both: the key serves both activations (a helper's: it was tagged with the first's)
                for key in clash:
                    _tag(acts, key, merged_activation(acts.get(key), problem.activation))
            continue
        seen.update([problem.id] if device_agnostic else [])
        table.update(mine)
        acts.update(dict.fromkeys(mine, problem.activation) if problem.activation else {})
        owners.update((key, (own, lookup_op)) for key in mine)
    found = _default_for_clashes(table, owners, clashes)
    if shared is not None:
        shared.extend(found)
    for key in found:  # Inductor's default there: measured with neither
        acts.pop(key, None)
    if shipped is not None:
        shipped.update({k: Shipped(None if own in found else row, own in found) for k, (row, own) in placed_rows.items()})
    return dict(sorted(table.items()))


def _tag(acts: dict[str, Any], key: str, activation: Any) -> None:
    """Set a key's ``activations`` tag (None: not listed, measured with none)."""
    if activation is None:
        acts.pop(key, None)
    else:
        acts[key] = activation


def _entries(device_key: str, problem: Any, problem_key: str | None, lookup_op: str, rows: list[Any] | None,
             agnostic: bool) -> tuple[str | None, dict[str, list[dict[str, Any]]]]:
    """(the problem's own key, key -> entries) that :func:`build_table` places for one problem on one
    device: ``rows`` (None: Inductor's default entry) each under the key its own lookup makes."""
    from zhantune.inductor.heuristics import with_derived_kwargs

    if rows is None:
        placed = [(table_key(device_key, problem_key, None, agnostic), default_entry(lookup_op))]
    else:  # each entry under the key its own lookup makes (addmm: templates and ATen differ)
        placed = [(table_key(device_key, problem_key, r, agnostic), entry_for(r.template_id, r.params, r.template_hash))
                  for r in rows]
    own = table_key(device_key, problem_key, None, agnostic)
    mine: dict[str, list[dict[str, Any]]] = {}
    for key, entry in placed:
        if key:  # with the kwargs Inductor would otherwise take from another config (EVEN_K)
            mine.setdefault(key, []).append(with_derived_kwargs(entry, problem.shape))
    # every entry under another key (addmm's Triton templates use the expanded bias): the
    # problem's own (ATen) lookup gets "nothing from this lookup", so the GEMM compiles only them
    if own and own not in mine:
        mine[own] = []
    return own, mine


@dataclass(frozen=True)
class Shipped:
    """What a table's key ships for one (device, problem): ``row`` the measurement row of the tuned
    config (its fastest; None: Inductor's default choice), ``shared`` True where the default ships
    because another problem's different choice has the same lookup key."""

    row: Any
    shared: bool = False


def _measured_on(ranked: list[tuple[Any, Any, list[Any]]]) -> dict[int, list[tuple[int, str]]]:
    """problem id -> (device id, kind) of every device whose carried configs rank it
    (:func:`_carried_ranked` of every device, whatever device an export names: a device-agnostic
    key applies on each device of its kind)."""
    out: dict[int, list[tuple[int, str]]] = {}
    for d, p, rows in ranked:
        if rows:
            out.setdefault(p.id, []).append((d.id, d.kind))
    return out


def _carried_ranked(store: Store, device_key: str | None, torch_version: str | None,
                    problem_ids: set[int] | None, agnostic: bool = False) -> tuple[list[tuple[Any, Any, list[Any]]], dict]:
    """(device, problem, rows) for :func:`build_table`, fastest problem first by the ranking rule's
    statistic: every distinct config a table may carry on the device (a tf32 backend flag, zhantune.
    inductor.knobs, or a config patch on CUDA, not_carried, makes way for the next ones), measured
    with a build of the table's torch release (an entry's template_hash and lookup key are that
    release's: a faster row of another torch, the config's representative over all, carried its).
    ``agnostic`` (keys that apply on every device of a kind): every device's, ``device_key`` or not,
    without a config that failed (never ok) or whose output was wrong on one device of the kind
    (Store.incorrect_configs), with :func:`_measured_on` of the devices before that (a device whose
    only configs failed elsewhere measured the problem all the same: a claim must clear there);
    raises ConfigError where, with no ``device_key``, devices of two kinds rank configs (a key
    without its device has no kind to be checked against: a CPU's config patch fails a GPU's table read),
    and leaves out the devices of another kind whose configs no table carries (they place no key: a
    Inductor default entry from them would be one kind's choice under a key of the other's)."""
    torch = table_torch(torch_version)
    ranked = [(d, p, [r for r in rows if carried(entry_for(r.template_id, r.params, r.template_hash), d.kind)])
              for d, p, rows in store.ranked_candidates(None if agnostic else device_key, torch, 1 << 30)
              if problem_ids is None or p.id in problem_ids]
    measured_on: dict = {}
    if agnostic:
        # the kinds of the devices with configs a table carries (none: of every device, each a default entry)
        kinds = sorted({d.kind for d, _, rows in ranked if rows}) or sorted({d.kind for d, _, _ in ranked})
        if device_key is None and len(kinds) > 1:
            raise ConfigError(two_kinds(f"device_agnostic=true: the database holds measurements of {' and '.join(kinds)} "
                                        "devices", "pick one device's kind with device=KEY"))
        if device_key is None:
            ranked = [(d, p, rows) for d, p, rows in ranked if d.kind in kinds]
        measured_on, wrong = _measured_on(ranked), store.incorrect_configs(torch, failed_too=True)
        ranked = [(d, p, [r for r in rows if d.kind not in wrong.get((p.id, r.config_hash), {}).values()])
                  for d, p, rows in ranked]
    return sorted(ranked, key=lambda r: decision_us(r[2][0]) if r[2] else float("inf")), measured_on



def _tuned_rows(rows: list[Any], keys: list[tuple[int, int]], verdicts: dict,
                min_speedup: float | None) -> tuple[list[Any], bool]:
    """(rows from the one to ship, whether a tuned entry ships) for one problem's (device id,
    problem id) ``keys`` (one device; or each device a device-agnostic key covers, all of which must
    have confirmed the claim), by :func:`build_table`'s rule."""
    if min_speedup is None:
        return rows, bool(rows)
    # the fastest carried config whose claim was confirmed in paired rounds (a faster one whose
    # claim failed, or that was never paired, does not hide it)
    first = next((i for i, r in enumerate(rows)
                  if all(claim_clears(verdicts.get((*k, r.config_hash)), min_speedup) for k in keys)), None)
    if first is not None:
        return rows[first:], True
    # none confirmed: the tunes settled configs and none cleared (no paired rounds, a claim that
    # failed, or the one settled cannot be carried, e.g. a fusion limit on CUDA), or nothing was ever
    # paired with the default (an interrupted tune, a database from before verdicts): stored times
    # alone are no claim, the default ships
    return rows, False


def _default_for_clashes(table: dict[str, list[dict[str, Any]]], owners: dict[str, tuple[str | None, str]],
                         clashes: list[tuple[str | None, str, list[str]]]) -> list[str]:
    """For each clash (own key and lookup op of a problem whose entries differ from those another
    problem placed under ``keys``): both problems' keys give way to Inductor's default choice under
    each one's own key. Returns those own keys."""
    out: set[str] = set()
    for own, op, keys in clashes:
        for o, o_op in {(own, op)} | {owners[k] for k in keys if k in owners}:
            if o is None:
                continue
            for key in [k for k, (ok, _) in owners.items() if ok == o]:
                table.pop(key, None)
            table[o] = [default_entry(o_op)]
            out.add(o)
    return sorted(out)


def table_torch(torch_version: str | None) -> str:
    """The torch a table is built for: ``torch_version`` where given, else this process's (what
    zhantune.inductor.exporter.table_metadata stamps, and what a speedup claim must have been confirmed with)."""
    from zhantune.provenance import software_versions

    return torch_version or software_versions()["torch"]


def claims_of_other_torch(store: Store, torch_version: str | None, min_speedup: float | None,
                          device_key: str | None = None, problem_ids: set[int] | None = None) -> dict[str | None, int]:
    """torch version (None: not recorded, a verdict from before revision 0008) -> how many (device,
    problem, config) claims of the table's devices and problems (``device_key``, ``problem_ids`` as
    :func:`build_table`'s; problems with a lookup key) clear ``min_speedup`` with that torch but not
    with the table's (:func:`table_torch`): they do not ship, and the export says so."""
    if min_speedup is None:
        return {}
    devices = {d.id for d in store.devices() if device_key is None or d.key == device_key}
    problems = {p.id for p in store.problems_by_key().values()
                if p.lookup_key and (problem_ids is None or p.id in problem_ids)}
    mine = store.latest_verdicts(table_torch(torch_version))
    out: dict[str | None, int] = {}
    for key, v in store.latest_verdicts().items():
        if key[0] in devices and key[1] in problems and claim_clears(v, min_speedup) \
                and not claim_clears(mine.get(key), min_speedup):
            out[v.torch_version] = out.get(v.torch_version, 0) + 1
    return out


def claim_clears(verdict: Any, min_speedup: float) -> bool:
    """A verdict settled in paired rounds whose claim holds under the rule in use
    (zhantune.bench.decision.claim_holds), with a ratio of at least ``min_speedup``."""
    return claim_holds(verdict) and verdict.ratio >= min_speedup
