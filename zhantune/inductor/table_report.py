"""What an installed lookup table did while Inductor compiled (zhantune.table_report, the report of
zhantune.use_table): hits, misses and stale entries per lookup key, and the coverage they give."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TableReport"]


@dataclass
class TableReport:
    """What the installed table did: per GEMM lookup Inductor made (one per GEMM lowering).

    ``hits`` / ``misses`` / ``stale`` count lookups by key; ``stale`` also gives the reason per key.
    ``coverage`` is the share of lookups that hit, None when there was none (``note`` says why:
    nothing compiled since the table was installed, or a compile served from Inductor's cache);
    ``tunable_coverage`` the share of the lookups a table can serve (``untunable`` misses left out:
    check's min_coverage gate), None when there is none.
    """

    source: str | None
    hits: Counter = field(default_factory=Counter)
    misses: Counter = field(default_factory=Counter)
    stale: dict[str, str] = field(default_factory=dict)
    stale_count: Counter = field(default_factory=Counter)
    #: key -> the template_id (or config patch) that was compiled
    chosen: dict[str, str] = field(default_factory=dict)
    #: key -> which of its entries a hit did not serve, and why (a top_k table's entry stale here or a
    #: template Inductor does not offer here, the others served: a helper found its first entry, the
    #: one confirmed against the default, dropped without a word)
    dropped: dict[str, str] = field(default_factory=dict)
    #: key -> the key its GEMM is counted under: a second lookup of the GEMM that served entries too
    #: (an addmm's templates' lookup beside its ATen lookup's hit, :meth:`uncounted`)
    also: dict[str, str] = field(default_factory=dict)
    #: key -> what a hit's GEMM feeds here that its template entry was not measured with
    #: (zhantune.inductor.epilogue.unmeasured_epilogue)
    notes: dict[str, str] = field(default_factory=dict)
    #: key -> why zhantune cannot tune a missed GEMM at all (collect's reason: a transposed operand,
    #: attention's bmm on CPU): no table serves it, and collect does not list it (a helper's)
    untunable: dict[str, str] = field(default_factory=dict)
    #: key -> its missed and stale lookups whose own GEMM no table can serve: one key may be looked up by
    #: a GEMM that can be tuned and by one that cannot (a bmm of a frozen weight and one of a run-time
    #: operand, a review's), so the gate leaves out lookups, not keys
    untunable_count: Counter = field(default_factory=Counter)
    _tunable: set[str] = field(default_factory=set, repr=False)
    #: key -> (entries, served, whys) of its last hit (:meth:`drop`)
    _served: dict[str, tuple] = field(default_factory=dict, repr=False)

    def miss(self, key: str, event: Any = None) -> None:
        """Count a miss of ``key``; where collect would not list its GEMM (``event``: the lookup's
        LookupEvent; zhantune.inductor.gemms.problem_from_event), record why in ``untunable``."""
        self.misses[key] += 1
        self._classify(key, event)

    def stale_at(self, key: str, why: str, event: Any = None) -> None:
        """Count a lookup of ``key`` whose entry is stale here (``why``), its GEMM classified as for a
        miss (a review's: an entry for a GEMM no table can serve counted against the gate, its absence
        not)."""
        self.stale[key] = why
        self.stale_count[key] += 1
        self._classify(key, event)

    def _classify(self, key: str, event: Any) -> None:
        """Count this lookup as untunable where its own GEMM is; ``untunable`` (what check prints)
        names a key only while none of its GEMMs is tunable, as collect lists it (a review's)."""
        if event is None:
            return
        from zhantune.inductor.gemms import dtype_names, problem_from_event

        problem, why = problem_from_event(event, dtype_names())
        if problem is None and why:
            self.untunable_count[key] += 1
            if key not in self._tunable:
                self.untunable.setdefault(key, why)
        else:
            self._tunable.add(key)
            self.untunable.pop(key, None)

    def hit(self, key: str, event: Any = None, entries: list[dict[str, Any]] = ()) -> None:
        """Count a hit of ``key``; where a served entry is a template's (a C++ template's config patch,
        ``triton::*``, ``decompose_k``: ATen's kernels fuse nothing), note an epilogue it was not
        measured with (``event``: the lookup's LookupEvent)."""
        from zhantune.inductor.cpu_entries import wants_cpp
        from zhantune.inductor.epilogue import unmeasured_epilogue

        self.hits[key] += 1
        template = any(wants_cpp(e) or not str(e.get("template_id")).startswith(("aten::", "zhantune::config"))
                       for e in entries)
        if template and (note := unmeasured_epilogue(event)):
            self.notes[key] = note

    def drop(self, key: str, entries: list[dict[str, Any]], served: list[dict[str, Any]], whys: dict[int, str]) -> None:
        """Record the entries of ``key`` a hit left out (``served``: the ones it kept; ``whys``: entry
        index -> why it is stale here, else its template is not offered here), or that it left none out."""
        self._served[key] = (entries, list(served), whys)
        left = [i for i, e in enumerate(entries) if not any(e is s for s in served)]
        if not left:
            self.dropped.pop(key, None)
            return
        self.dropped[key] = (f"{len(left)} of {len(entries)} entries not served"
                             + (" (the first is the one a claim confirmed against the default)" if 0 in left else "")
                             + ": " + "; ".join(f"[{i}] {entries[i].get('template_id')}: "
                                                + whys.get(i, "a template Inductor does not offer here") for i in left))

    @contextlib.contextmanager
    def uncounted(self, counted: str) -> Iterator[None]:
        """Inside the block no lookup is counted (hits, misses, stale counts and their GEMMs'
        classification): a second lookup of a GEMM whose first lookup hit and was counted under
        ``counted`` (an addmm's templates' lookup after its ATen lookup served an entry,
        torch/_inductor/kernel/mm.py tuned_addmm; a helper's: a top_k=2 table's addmm counted two hits).
        What it served is said under its own key, in ``also``, or merged into ``counted``'s where the
        two lookups share the key (a 2-D bias): what either served, and what neither did (a review's:
        the second lookup's said ATen's entry was not offered, though the first compiled it)."""
        counters = (self.hits, self.misses, self.stale_count, self.untunable_count)
        saved, untunable, tunable = [Counter(c) for c in counters], dict(self.untunable), set(self._tunable)
        before = dict(self._served)
        first, chosen = before.get(counted), self.chosen.get(counted)
        try:
            yield
        finally:
            for counter, kept in zip(counters, saved, strict=True):
                counter.clear()
                counter.update(kept)
            self.untunable, self._tunable = untunable, tunable
            for key, now in list(self._served.items()):
                if now is before.get(key):  # not served in the block
                    continue
                if key != counted:
                    self.also[key] = counted
                elif first is not None and now[0] is first[0]:  # one key for both lookups (a 2-D bias)
                    self.drop(counted, first[0], first[1] + now[1], {**first[2], **now[2]})
                    self.chosen[counted] = ", ".join(dict.fromkeys(f"{chosen}, {self.chosen[counted]}".split(", ")))

    @property
    def lookups(self) -> int:
        return sum(self.hits.values()) + sum(self.misses.values()) + sum(self.stale_count.values())

    @property
    def coverage(self) -> float | None:
        return sum(self.hits.values()) / self.lookups if self.lookups else None

    @property
    def untunable_lookups(self) -> int:
        """Misses and stale lookups of GEMMs no table can serve (``untunable_count``)."""
        return sum(self.untunable_count.values())

    @property
    def tunable_lookups(self) -> int:
        """The lookups a table can serve (``untunable_lookups`` left out)."""
        return self.lookups - self.untunable_lookups

    @property
    def tunable_coverage(self) -> float | None:
        return sum(self.hits.values()) / self.tunable_lookups if self.tunable_lookups else None

    @property
    def note(self) -> str | None:
        """Why coverage is None, else None."""
        if self.lookups:
            return None
        return "no GEMM lookup seen: served from Inductor's cache or not compiled yet"

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "lookups": self.lookups, "coverage": self.coverage,
                "tunable_lookups": self.tunable_lookups, "tunable_coverage": self.tunable_coverage,
                "note": self.note,
                "hits": dict(self.hits), "misses": dict(self.misses), "stale": dict(self.stale),
                "chosen": dict(self.chosen), "dropped": dict(self.dropped), "notes": dict(self.notes),
                "also": dict(self.also),
                "untunable": dict(self.untunable)}
