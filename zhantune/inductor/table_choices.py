"""The choices handler that serves a zhantune lookup table while Inductor compiles
(:func:`zhantune.use_table` installs it; zhantune.inductor.runtime has the rules: hits, misses,
stale entries, the CPU per-GEMM knobs), and its report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._inductor import config as inductor_config

from zhantune.inductor.choices import LookupEvent, RecordingChoices, legacy_cpu_key
from zhantune.inductor.cpu_entries import (
    EMPTY_ON_CPU,
    GPU_ENTRY_ON_CPU,
    LEGACY_CPU_KEY,
    REDUCED_FLOAT32,
    UNHOOKED_LOWERING,
    bmm_stale,
    cpp_entry_stale,
    cpp_knobs,
    cpp_template_applies,
    cpp_unoffered,
    cpu_entry,
    frozen_compile,
    other_isa,
    reduced_float32,
    wants_cpp,
)
from zhantune.inductor.cuda_entries import (
    EMPTY_ALONE,
    NOT_OFFERED,
    gemm_settings,
    held_back,
    no_choice,
    resources_stale,
    stale_reason,
    users_template,
)
from zhantune.inductor.epilogue import activation_stale
from zhantune.inductor.heuristics import TF32_ON, even_k, half_math_changed, tf32_float32
from zhantune.inductor.knobs import config_patch_problem
from zhantune.inductor.settings import get_config, set_knob
from zhantune.inductor.table import CONFIG_TEMPLATE_ID, TableFile, not_carried, parse_key
from zhantune.inductor.table_report import TableReport
from zhantune.provenance import torch_release

__all__ = ["TableChoices", "TableReport", "stale_reason", "release", "GPU_ENTRY_ON_CPU", "NOT_OFFERED"]

#: config keys the CPU handler sets per GEMM (plus any key a table's config_patch names)
_CPU_GEMM_KEYS = ("max_autotune_gemm_backends", "cpp.gemm_max_k_slices", "cpp.gemm_thread_factors",
                  "cpp.gemm_cache_blocking")


release = torch_release  # lookup keys and template sources are the same across builds of one release


class TableChoices(RecordingChoices):
    """Inductor choices handler serving a zhantune table (see the module docstring)."""

    def __init__(self, tf: TableFile, any_key: list[dict[str, Any]] | None = None):
        super().__init__(table=tf.table)
        self.tf = tf
        self.report = TableReport(tf.source)
        self.version_mismatch: str | None = None
        self._cpus = {d["key"]: d for d in tf.meta.get("devices", []) if d.get("kind") in ("cpu", None)}  # by key
        if tf.torch_version is not None and release(tf.torch_version) != release(torch.__version__):
            self.version_mismatch = (f"table made with torch {tf.torch_version}, this is torch "
                                     f"{torch.__version__}: lookup keys and templates may differ; re-tune")
        #: entries served under every key (a one-candidate compile, zhantune.bench.inductor: the key is only known when Inductor lowers the GEMM; the event records it)
        self.any_key = any_key
        entries = [e for es in tf.table.values() for e in es] + list(any_key or [])
        self._cpu_keys = tuple(sorted(set(_CPU_GEMM_KEYS).union(*(e.get("config_patch") or {} for e in entries))))
        #: some entry selects the C++ template: unpacked CPU GEMMs are lowered under max-autotune
        self._cpu_template = any(wants_cpp(e) for e in entries)
        #: an addmm's ATen default held back for its templates' lookup (:meth:`_addmm_lookup`)
        self._held: tuple[Any, ...] | None = None
        #: while an addmm's templates' lookup is served: its ATen lookup's event, by which the report
        #: classifies the GEMM (the templates' event has the bias expanded to [M, N], which no model's
        #: addmm is: a review found such a miss left out of check's gate as untunable)
        self._gemm_event: Any = None
        #: the user's own GEMM max-autotune, backends and persistent TMA before use_table set its own
        #: (CUDA: :meth:`_cuda_users_own`); the GEMM whose addmm ATen lookup hit, and its key (:meth:`_addmm_lookup`)
        self.user_gemm: dict[str, Any] | None = None  # None: the config as set at the lookup
        self._decided: tuple[tuple[int, ...], str] | None = None
        #: the config values at the start of the unpacked CPU GEMM lowering in progress (None: none),
        #: and the user's own before zhantune's (max-autotune for a C++-template entry)
        self._scope_base: dict[str, Any] | None = None
        self._scope_user: dict[str, Any] | None = None

    def _find(self, event: LookupEvent) -> tuple[str | None, list[dict[str, Any]] | None]:
        """(key, entries) the table has for a lookup: device key first, then the agnostic one, then a
        CPU key of the model alone (a table from before database revision 0009: :meth:`_key_stale`)."""
        if self.any_key is not None:
            return event.device_key or event.agnostic_key, self.any_key
        for k in (event.device_key, event.agnostic_key):
            if k is not None and k in self.tf.table:
                return k, self.tf.table[k]
        legacy = legacy_cpu_key(event.device_key, event.agnostic_key)  # only where neither is in the table
        return (legacy, self.tf.table[legacy]) if legacy in self.tf.table else (None, None)

    def _key_stale(self, key: str | None, event: LookupEvent, cuda: bool = False) -> str | None:
        """Why every entry under ``key`` is stale here, or None: the table's torch is another release, a GEMM's math differs from
        the one measured (TF32_ON, HALF_MATH_CHANGED; CPU: REDUCED_FLOAT32), the key's CPU is another machine (OTHER_ISA, OTHER_CPU),
        ``key`` is a CPU key of a table of before revision 0009 (LEGACY_CPU_KEY), or another activation was fused in its measurement
        (epilogue.activation_stale; not in an unfrozen CPU compile, whose GEMM output autograd keeps too: GRAD_ON says why)."""
        if self.version_mismatch:
            return self.version_mismatch
        dtypes = [dtype for dtype, _, _ in event.inputs]
        if cuda and self.any_key is None and (why := TF32_ON if tf32_float32(dtypes) else half_math_changed(dtypes)):
            return why
        if not cuda and self.any_key is None and (precision := reduced_float32(dtypes, bool(event.packed))):
            return REDUCED_FLOAT32.format(precision=precision)
        if not cuda and key is not None and (why := other_isa(self._cpus.get((parse_key(key) or {}).get("device")))):
            return why
        if key is not None and key == legacy_cpu_key(event.device_key, event.agnostic_key):
            return LEGACY_CPU_KEY.format(key=event.device_key.partition("+((")[0])
        return activation_stale(self.tf.activations, key, event, self.tf.table.get(key) if key else None) if cuda or frozen_compile() else None

    # -- CPU: the lowering hooks (zhantune.inductor.cpu_gemm) -----------------------------------
    def cpu_packed_gemm(self, kernel_inputs, op_name: str, packed_op: str, epilogue=None) -> dict[str, Any] | None:
        """A prepacked linear (Inductor's default for a frozen GEMM with oneDNN on; ``epilogue``: a fused
        one's, zhantune.inductor.cpu_gemm): on a hit whose entry selects the C++ template, the config patch
        to lower it under (max-autotune, the entry's backends and ``cpp.gemm_*`` knobs); anything else
        (a miss, an ``aten`` entry, a stale table): None, Inductor's own packed lowering."""
        event = self.event(kernel_inputs, op_name, {}, (), packed=packed_op, epilogue=epilogue)
        key, entries = self._find(event)
        report_key = key or event.device_key or event.agnostic_key or op_name
        patch = None
        if entries is None:
            self.report.miss(report_key, event)
        elif why := self._key_stale(key, event):
            self.report.stale_at(report_key, why, event)
        elif not entries:
            self.report.stale_at(report_key, EMPTY_ON_CPU, event)
        elif not cpu_entry(entries[0], op_name):
            self.report.stale_at(report_key, GPU_ENTRY_ON_CPU.format(tid=entries[0]["template_id"]), event)
        elif why := cpp_entry_stale(entries[0], kernel_inputs, op_name, True, self.any_key is None):
            self.report.stale_at(report_key, why, event)
        else:
            entry = entries[0]
            self.report.hit(report_key, event, [entry])
            if wants_cpp(entry):
                # only allow-listed knobs reach Inductor's config (read_table checked them; a bug otherwise)
                bad = config_patch_problem(entry["config_patch"], "cpu")
                if bad:
                    raise ValueError(f"config_patch {bad[0]!r}: {bad[1]}")
                patch = {"max_autotune": True, **cpp_knobs(entry["config_patch"])}
                self.report.chosen[report_key] = f"{CONFIG_TEMPLATE_ID} {entry['config_patch']}"
                event = dataclasses.replace(event, hit_templates=(CONFIG_TEMPLATE_ID,))
            else:
                self.report.chosen[report_key] = f"Inductor's default ({packed_op})"
        self.events.append(event)
        return patch

    @contextmanager
    def cpu_gemm_lowering(self) -> Iterator[None]:
        """Around an unpacked CPU GEMM's lowering: its lookup (below) may set the template's knobs
        for this GEMM; every value is restored when the lowering returns. When some entry selects the
        C++ template the lowering runs under max-autotune with ATen and CPP (the template is offered
        only then) and the lookup restricts the backends to the entry's, or the user's own on a miss; a CPP
        hit where Inductor would not offer the template (not frozen) compiles the default and is
        reported stale (cpu_entries.cpp_unoffered). A miss, a stale entry or an entry of Inductor's default is
        lowered under the user's own settings (:meth:`_users_own`)."""
        user = {**{k: get_config(k) for k in self._cpu_keys}, "max_autotune": inductor_config.max_autotune}
        extra: dict[str, Any] = {}
        if self._cpu_template:
            extra = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP"}
        outer = self._scope_base, self._scope_user
        with inductor_config.patch({**user, **extra}):
            self._scope_base, self._scope_user = {**user, **extra}, user
            try:
                yield
            finally:
                self._scope_base, self._scope_user = outer

    def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides=None):
        args = (template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        if op_name == "addmm" and kernel_inputs.device().type != "cpu":
            return self._addmm_lookup(*args)
        return self._serve(*args)

    def _addmm_lookup(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """addmm on CUDA under max-autotune is three lookups (torch/_inductor/kernel/mm.py tuned_addmm):
        its ATen kernels with the 1-D bias, its contiguous rewrite with the same inputs, then its
        templates with the expanded bias. Where the table's entry for the GEMM is a template's, the
        ATen lookup's default is held back until the templates' lookup: dropped when that lookup serves
        the entry, served when it serves nothing. Returning nothing at once, an entry whose template
        Inductor does not offer on this device (TMA without TMA, Triton under 68 SMs) left the GEMM
        no choice (NoValidChoicesError); with a bias of the output's shape both lookups have one
        key, and the ATen kernel was compiled beside the entry (Inductor autotuned the two)."""
        args = (template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        gemm = tuple(id(node) for node in kernel_inputs.nodes()[1:])
        uids = {t.uid: getattr(t, "src_hash", None) for t in templates}
        if uids and all(uid.startswith("aten::") for uid in uids) and not no_choice(uids):  # the ATen lookup
            event = self.event(kernel_inputs, op_name, uids, ())
            key, entries = self._find(event)
            self._held = None
            if entries is None or self._key_stale(key, event, True) or not held_back(entries, uids, kernel_inputs):
                before = dict(self.report.hits)
                served = self._serve(*args)
                counted = [k for k, n in self.report.hits.items() if n != before.get(k)]
                self._decided = (gemm, counted[0]) if counted else None  # its templates' lookup: uncounted
                return served
            self.events.append(event)
            if not entries:  # "nothing from this lookup": the entry is under the templates' key, whose lookup is the
                # GEMM's one in the report (a review's: counted here too, a served Triton addmm was two lookups)
                self.report.chosen[key] = "(nothing from this lookup)"
            self._held = (gemm, kernel_inputs, key if not entries else None, self._aten_only(*args), event)
            return []
        held = self._held
        if held is None or held[0] != gemm or held[1] is kernel_inputs:  # not its templates' lookup
            if self._decided is None or self._decided[0] != gemm:
                return self._serve(*args)
            with self.report.uncounted(self._decided[1]):  # its ATen lookup served an entry, counted (top_k >= 2)
                return self._serve(*args, decided=True)
        self._held = None
        before, hits = self.report.lookups, sum(self.report.hits.values())
        self._gemm_event = held[4]
        try:
            served = self._serve(*args)
        finally:
            self._gemm_event = None
        if served and sum(self.report.hits.values()) != hits:  # the entry
            return served
        said = self.report.lookups != before
        if held[2] is not None:  # its "nothing from this lookup" did not hold
            self.report.chosen.pop(held[2], None)
        if not said:  # no template offered here serves the entry
            event = self.event(kernel_inputs, op_name, uids, ())
            key, entries = self._find(event)
            report_key = key or event.device_key or event.agnostic_key or op_name
            tids = sorted({e["template_id"] for e in entries or ()} - set(uids))
            if tids:
                self.report.stale_at(report_key, NOT_OFFERED.format(tids=", ".join(tids)), held[4])
            else:
                self.report.miss(report_key, held[4])
        return held[3] + (served if said else self._cuda_users_own(*args))

    def _serve(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, decided=False):
        if not templates:  # a pass with nothing to choose from (addmm's expanded-bias pass)
            return []
        hashes = {t.uid: getattr(t, "src_hash", None) for t in templates}
        event = self.event(kernel_inputs, op_name, hashes, ())
        self.events.append(event)
        key, entries = self._find(event)
        report_key = key or event.device_key or event.agnostic_key or op_name
        cpu = kernel_inputs.device().type == "cpu"
        if not cpu and no_choice(hashes):
            # a GEMM Inductor lowers without max-autotune and with ATen only, e.g. decompose_k's
            # inner bmm (its subgraph is lowered under max_autotune=False, backends ATEN: ir.py
            # SubgraphBuffer): no table can change it, so it is neither a hit nor a miss
            return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        if not cpu and not any(uid.startswith("aten::") for uid in hashes) \
                and not any(e.get("template_id") in hashes for e in entries or ()):
            # a secondary pass of the GEMM's lowering with nothing in the table for it (addmm's
            # expanded-bias template lookup under a default entry, its contiguous rewrite under the
            # ATen key): nothing from it; the GEMM's own lookup decides and is the one reported (a
            # miss under the user's max-autotune: its templates, as without the table)
            return [] if entries is not None or decided else self._cuda_users_own(
                template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        if entries is not None and (why := self._key_stale(key, event, not cpu)):
            return self._stale(report_key, why, template_choices, kernel_inputs,
                               templates, op_name, kwarg_overrides, cpu)
        if entries is None:
            self.report.miss(report_key, self._gemm_event or event)
            return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)
        if not entries:  # "nothing from this lookup" is an addmm's ATen lookup's, held (:meth:`_addmm_lookup`)
            return self._stale(report_key, EMPTY_ON_CPU if cpu else EMPTY_ALONE, template_choices, kernel_inputs,
                               templates, op_name, kwarg_overrides, cpu)
        fresh, whys = [], {}  # entry index -> why it is stale here
        for i, e in enumerate(entries):
            if reason := stale_reason(e, hashes) or (not cpu and self.any_key is None
                                                     and resources_stale(e, kernel_inputs, templates, op_name, self)):
                whys[i] = reason
            else:
                fresh.append(e)
        if not fresh and whys:
            return self._stale(report_key, whys[max(whys)], template_choices, kernel_inputs, templates, op_name,
                               kwarg_overrides, cpu)
        if cpu:
            return self._cpu_hit(report_key, event, fresh, template_choices, kernel_inputs, templates, op_name,
                                 kwarg_overrides)
        results: dict[str, list[dict[str, Any]]] = {}
        for e in fresh:
            if e["template_id"] in hashes:
                cfg = {k: v for k, v in e.items() if k not in ("template_id", "template_hash")}
                if e["template_id"].startswith("triton::") and "BLOCK_K" in cfg and hasattr(kernel_inputs, "mnk_symbolic"):
                    # EVEN_K from the entry's own BLOCK_K (never another config's), by Inductor's rule on
                    # this compile's K (false for a dynamic K), and never true where the entry says false
                    cfg["EVEN_K"] = even_k(kernel_inputs, cfg["BLOCK_K"]) and cfg.get("EVEN_K") is not False
                results.setdefault(e["template_id"], []).append(cfg)
        if not results:
            why = next((r for r in (not_carried(e, "cuda") for e in fresh) if r), None) or (
                NOT_OFFERED.format(tids=", ".join(sorted({e["template_id"] for e in fresh}))) if fresh else None)
            if why:  # a config patch on CUDA: said so, never a silent miss
                return self._stale(report_key, why, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides, cpu)
            self.report.miss(report_key, self._gemm_event or event)
            return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)
        served = [e for e in fresh if e["template_id"] in hashes]
        self.report.hit(report_key, event, served)
        self.report.chosen[report_key] = ", ".join(results)
        self.report.drop(report_key, entries, served, whys)
        return self._create_lookup_choices(results, templates, kernel_inputs, op_name)

    # -- helpers -----------------------------------------------------------------------------
    def _stale(self, key, why, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu):
        self.report.stale_at(key, why, self._gemm_event or (self.events[-1] if self.events else None))  # (_serve)
        return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)

    def _default(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu):
        """Inductor's default choice, what it compiles under the user's own settings: on CUDA
        :meth:`_cuda_users_own`, on CPU :meth:`_users_own` (under max-autotune ATen and its C++ template)."""
        if cpu:
            return self._users_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        return self._cuda_users_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    def _cuda_users_own(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """This CUDA lookup's choices as Inductor makes them without the table: under the user's own
        max-autotune (``max_autotune``, or ``max_autotune_gemm`` before use_table) every template
        offered in their backends, which Inductor autotunes; else its ATen kernel (a settings audit,
        session 39: every GEMM the table did not decide lost the user's autotuning to ATen alone)."""
        user = self.user_gemm or gemm_settings()  # None: as set now
        if not (inductor_config.max_autotune or user["max_autotune_gemm"]):
            return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        own = [t for t in templates if users_template(t.uid, user)]  # not a TMA one a table's entry turned on
        return self._fallback({t.uid: template_choices[t.uid] for t in own if t.uid in template_choices},
                              kernel_inputs, own, op_name, kwarg_overrides)

    def _aten_only(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """The choices Inductor's own fallback makes from this lookup's ATen templates alone."""
        aten = [t for t in templates if t.uid.startswith("aten::")]
        return self._fallback({t.uid: template_choices[t.uid] for t in aten if t.uid in template_choices},
                              kernel_inputs, aten, op_name, kwarg_overrides)

    def _cpu_hit(self, key, event, entries, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        entry = entries[0]  # a CPU GEMM compiles one config; top_k > 1 applies on CUDA
        if not cpu_entry(entry, op_name):  # a table made on a GPU (or a name Inductor has not): said so
            return self._stale(key, GPU_ENTRY_ON_CPU.format(tid=entry["template_id"]), template_choices,
                               kernel_inputs, templates, op_name, kwarg_overrides, True)
        if why := cpp_entry_stale(entry, kernel_inputs, op_name, False, self.any_key is None):
            return self._stale(key, why, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, True)
        if wants_cpp(entry) and not cpp_template_applies(kernel_inputs, op_name):
            # Inductor would not offer the template here (a weight that is not a frozen constant,
            # a dtype it has no micro-kernel for): the default ATen kernel is compiled, and said so
            self.report.stale_at(key, cpp_unoffered(kernel_inputs, op_name), event)
            return self._users_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        if wants_cpp(entry) and op_name == "bmm" and (why := bmm_stale(kernel_inputs)):  # attacks' findings
            return self._stale(key, why, template_choices, kernel_inputs, templates, op_name,
                               kwarg_overrides, True)
        if entry["template_id"] == CONFIG_TEMPLATE_ID and self._scope_base is None:  # not cpu_gemm_lowering's
            return self._stale(key, UNHOOKED_LOWERING.format(op=op_name), template_choices, kernel_inputs, templates,
                               op_name, kwarg_overrides, True)
        self.report.hit(key, event, [entry])
        # this lookup's event records the hit, as a packed GEMM's does (cpu_packed_gemm): where oneDNN
        # does not pack the dtype (bf16 without AVX-512) the C++-template candidate is served here
        at = next(i for i in range(len(self.events) - 1, -1, -1) if self.events[i] is event)
        self.events[at] = dataclasses.replace(event, hit_templates=(entry["template_id"],))
        if entry["template_id"] == CONFIG_TEMPLATE_ID:
            patch = dict(entry.get("config_patch") or {})
            backends = str(patch.get("max_autotune_gemm_backends", "ATEN")).upper()
            self.report.chosen[key] = f"{CONFIG_TEMPLATE_ID} {patch}"
            if "CPP" in backends:
                # the C++ template choice is created right after this lookup, under these values;
                # ATen stays in the backends so that the next GEMM's ATen lookup still happens
                self._set_cpu({**cpp_knobs(patch), "max_autotune_gemm_backends": "ATEN,CPP"})
                return []
            self._set_cpu({**patch, "max_autotune_gemm_backends": "ATEN"})
        else:  # Inductor's default (aten::*): what it compiles without the table
            self.report.chosen[key] = entry["template_id"]
            return self._users_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    def _users_own(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """This CPU GEMM under the user's own settings, as Inductor compiles it without the table: a
        max-autotune compile autotunes ATen against the C++ template (ATen only where their backends
        have it). The ATen kernel alone was forced (a CPU audit, session 38: a bf16 addmm without
        prepacking, not in the table, ran 2.5-3.7x slower under max-autotune with the table installed)."""
        user = self._scope_user
        if user is not None:
            self._set_cpu(user)
            inductor_config.max_autotune = user["max_autotune"]  # restored by cpu_gemm_lowering
            autotuned = user["max_autotune"] or inductor_config.max_autotune_gemm  # ATen is offered without it
            if autotuned and "ATEN" not in str(user.get("max_autotune_gemm_backends", "ATEN")).upper():
                return []
        return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    def _set_cpu(self, values: dict[str, Any]) -> None:
        """This GEMM's knobs, inside cpu_gemm_lowering only (which restores them); outside one (a
        GEMM lowering zhantune does not hook) nothing is changed."""
        if self._scope_base is None:
            return
        for k in self._cpu_keys:
            set_knob(k, values.get(k, self._scope_base[k]))
