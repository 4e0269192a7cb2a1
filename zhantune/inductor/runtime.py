"""Use a shipped lookup table when compiling: ``zhantune.use_table`` and ``zhantune.table_report``.

``use_table(path_or_dict)`` installs :class:`TableChoices` as Inductor's choices handler (the hook
torch/_inductor/lookup_table/__init__.py documents: ``V.set_choices_handler``) and puts the bare
table in ``torch._inductor.config.lookup_table.table`` (so Inductor's FX graph cache keys differ per
table). Every GEMM lowering then goes through the table:

- **hit**: the key's entries are compiled, nothing else (one entry: no autotuning; several:
  Inductor autotunes among them, Inductor's own lookup-table semantics). An empty list means
  "nothing from this lookup": addmm looks its ATen kernel up with the 1-D bias and its templates
  with the expanded bias, so a Triton winner is stored under the expanded key and the ATen key gets
  ``[]`` (zhantune.inductor.table.build_table);
- **miss**: Inductor's default choice (its ATen kernel), no autotuning, and the key is reported;
- **stale**: an entry whose ``template_hash`` differs from the template's ``src_hash`` in this torch,
  every entry of a table made with another torch release, or on CUDA a ``zhantune::config`` entry
  (compile-wide Inductor config, which a per-GEMM table cannot apply there), is dropped, reported,
  and the GEMM compiles as a miss.

On CPU (where Inductor itself makes no lookup) the table's entries are config patches of
Inductor's C++ GEMM template, applied per GEMM through Inductor's ``user_lowerings`` hook
(:mod:`zhantune.inductor.cpu_gemm`), with every global setting left as the user has it: oneDNN stays
on, and neither ``freezing`` nor ``max_autotune`` is set for the compile. A GEMM that Inductor's
freezing pass prepacked (``mkl._mkl_linear`` / ``mkldnn._linear_pointwise``: what a user's
``freezing=True`` compile runs) is lowered, on a hit whose entry selects the C++ template, under
``max_autotune`` and the entry's ``cpp.gemm_*`` knobs (the template is built, and its blocking fixed,
in that lowering); on a miss, or an entry that keeps Inductor's default (``aten``), its lowering is
Inductor's own. An unpacked GEMM (a bmm, a dtype oneDNN does not pack) is lowered under
max-autotune with ATen and CPP when the table has a C++-template entry, and its lookup picks the
backend; the values are restored when its lowering returns. The C++ template needs a constant
weight: users set ``torch._inductor.config.freezing = True`` and compile under ``torch.no_grad()``
(``options={"freezing": True}`` did not freeze in torch 2.13); without it a C++-template entry
compiles Inductor's default and is reported stale, saying so. The handler is per thread, like
Inductor's.

``table_report()`` returns what was seen since the table was installed. Loading a table never
executes code from it: it is JSON, checked by :func:`zhantune.inductor.table.read_table`.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V

from zhantune.inductor import cpu_gemm
from zhantune.inductor.choices import LookupEvent, RecordingChoices
from zhantune.inductor.knobs import CONFIG_KNOBS, config_patch_problem
from zhantune.inductor.table import CONFIG_TEMPLATE_ID, TableFile, check_table, not_carried, read_table

__all__ = ["TableChoices", "TableReport", "InstalledTable", "use_table", "table_report", "release", "stale_reason"]

#: why a C++-template entry compiled Inductor's default instead (TableReport.stale)
NOT_FROZEN = ("the C++ template needs a frozen constant weight: set torch._inductor.config.freezing = True and "
              "compile under torch.no_grad() (in torch 2.13 torch.compile(options={'freezing': True}) does not freeze)")
#: config keys the CPU handler sets per GEMM (plus any key a table's config_patch names)
_CPU_GEMM_KEYS = ("max_autotune_gemm_backends", "cpp.gemm_max_k_slices", "cpp.gemm_thread_factors",
                  "cpp.gemm_cache_blocking")


def release(version: str | None) -> str | None:
    """The release part of a torch version ("2.13.0+cpu" -> "2.13.0"): lookup keys and template
    sources are the same across builds of one release."""
    return None if version is None else version.split("+")[0]


def cuda_table_patch(table: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Inductor config a CUDA table compiles under: max-autotune over ATen and Triton (a miss
    compiles the ATen kernel, TableChoices), and ``triton.enable_persistent_tma_matmul`` when an
    entry names ``triton::mm_persistent_tma`` (Inductor offers that template only then:
    ``use_triton_tma_template`` in torch/_inductor/utils.py)."""
    from zhantune.inductor.templates import TEMPLATE_CONFIG

    patch: dict[str, Any] = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
    for entries in table.values():
        for e in entries:
            patch.update(TEMPLATE_CONFIG.get(e.get("template_id"), {}))
    return patch


def stale_reason(entry: dict[str, Any], template_hashes: dict[str, str | None]) -> str | None:
    """Why an entry is stale for the templates Inductor offers (uid -> ``src_hash``), or None.

    Stale: the entry carries a ``template_hash`` and the offered template's source hash differs (the
    template's code changed since the table was made). Entries without a hash, and templates without
    one (ATen kernels), are never stale; ``lookup_table.check_src_hash=False`` turns the check off,
    as it does in Inductor (torch/_inductor/lookup_table/choices.py ``_entry_is_valid``).
    """
    tid = entry["template_id"]
    want, have = entry.get("template_hash"), template_hashes.get(tid)
    if want and have and want != have and inductor_config.lookup_table.check_src_hash:
        return f"template_hash of {tid} is {want}, this torch's template has {have}"
    return None


@dataclass
class TableReport:
    """What the installed table did: per GEMM lookup Inductor made (one per GEMM lowering).

    ``hits`` / ``misses`` / ``stale`` count lookups by key; ``stale`` also gives the reason per key.
    ``coverage`` is the share of lookups that hit, None when there was none (``note`` says why:
    nothing compiled since the table was installed, or a compile served from Inductor's cache).
    """

    source: str | None
    hits: Counter = field(default_factory=Counter)
    misses: Counter = field(default_factory=Counter)
    stale: dict[str, str] = field(default_factory=dict)
    stale_count: Counter = field(default_factory=Counter)
    #: key -> the template_id (or config patch) that was compiled
    chosen: dict[str, str] = field(default_factory=dict)

    @property
    def lookups(self) -> int:
        return sum(self.hits.values()) + sum(self.misses.values()) + sum(self.stale_count.values())

    @property
    def coverage(self) -> float | None:
        return sum(self.hits.values()) / self.lookups if self.lookups else None

    @property
    def note(self) -> str | None:
        """Why coverage is None, else None."""
        if self.lookups:
            return None
        return "no GEMM lookup seen: served from Inductor's cache or not compiled yet"

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "lookups": self.lookups, "coverage": self.coverage, "note": self.note,
                "hits": dict(self.hits), "misses": dict(self.misses), "stale": dict(self.stale),
                "chosen": dict(self.chosen)}


class TableChoices(RecordingChoices):
    """Inductor choices handler serving a zhantune table (see the module docstring)."""

    def __init__(self, tf: TableFile, any_key: list[dict[str, Any]] | None = None):
        super().__init__(table=tf.table)
        self.tf = tf
        self.report = TableReport(tf.source)
        self.version_mismatch: str | None = None
        if tf.torch_version is not None and release(tf.torch_version) != release(torch.__version__):
            self.version_mismatch = (f"table made with torch {tf.torch_version}, this is torch "
                                     f"{torch.__version__}: lookup keys and templates may differ; re-tune")
        #: entries served under every key (a one-candidate compile, zhantune.bench.inductor: the
        #: key is only known when Inductor lowers the GEMM; the event records it)
        self.any_key = any_key
        entries = [e for es in tf.table.values() for e in es] + list(any_key or [])
        keys = set(_CPU_GEMM_KEYS)
        for e in entries:
            keys.update((e.get("config_patch") or {}).keys())
        self._cpu_keys = tuple(sorted(keys))
        #: some entry selects the C++ template: unpacked CPU GEMMs are lowered under max-autotune
        self._cpu_template = any(_wants_cpp(e) for e in entries)
        #: the config values at the start of the unpacked CPU GEMM lowering in progress (None: none)
        self._scope_base: dict[str, Any] | None = None

    def _find(self, event: LookupEvent) -> tuple[str | None, list[dict[str, Any]] | None]:
        """(key, entries) the table has for a lookup: device key first, then the agnostic one."""
        if self.any_key is not None:
            return event.device_key or event.agnostic_key, self.any_key
        for k in (event.device_key, event.agnostic_key):
            if k is not None and k in self.tf.table:
                return k, self.tf.table[k]
        return None, None

    # -- CPU: the lowering hooks (zhantune.inductor.cpu_gemm) -----------------------------------
    def cpu_packed_gemm(self, kernel_inputs, op_name: str, packed_op: str) -> dict[str, Any] | None:
        """A prepacked linear (Inductor's default for a frozen GEMM with oneDNN on): on a hit whose
        entry selects the C++ template, the config patch to lower it under (max-autotune, the
        entry's backends and ``cpp.gemm_*`` knobs); anything else (a miss, an ``aten`` entry, a
        stale table): None, Inductor's own packed lowering."""
        event = self.event(kernel_inputs, op_name, {}, (), packed=packed_op)
        key, entries = self._find(event)
        report_key = key or event.device_key or event.agnostic_key or op_name
        patch = None
        if entries is None:
            self.report.misses[report_key] += 1
        elif self.version_mismatch:
            self.report.stale[report_key] = self.version_mismatch
            self.report.stale_count[report_key] += 1
        else:
            self.report.hits[report_key] += 1
            entry = entries[0] if entries else {}
            if _wants_cpp(entry):
                # only allow-listed knobs reach Inductor's config (read_table checked them; a bug otherwise)
                bad = config_patch_problem(entry["config_patch"], "cpu")
                if bad:
                    raise ValueError(f"config_patch {bad[0]!r}: {bad[1]}")
                patch = {"max_autotune": True, **entry["config_patch"]}
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
        only then) and the lookup restricts the backends to the entry's, or to ATen on a miss; a CPP
        hit where Inductor would not offer the template (not frozen) compiles the default and is
        reported stale (NOT_FROZEN)."""
        base = {k: _get_config(k) for k in self._cpu_keys}
        extra: dict[str, Any] = {}
        if self._cpu_template:
            extra = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP"}
        outer = self._scope_base
        with inductor_config.patch({**base, **extra}):
            self._scope_base = {**base, **extra}
            try:
                yield
            finally:
                self._scope_base = outer

    def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides=None):
        if not templates:  # a pass with nothing to choose from (addmm's expanded-bias pass)
            return []
        hashes = {t.uid: getattr(t, "src_hash", None) for t in templates}
        event = self.event(kernel_inputs, op_name, hashes, ())
        self.events.append(event)
        key, entries = self._find(event)
        report_key = key or event.device_key or event.agnostic_key or op_name
        cpu = kernel_inputs.device().type == "cpu"
        if not cpu and not any(uid.startswith("aten::") for uid in hashes) \
                and not any(e.get("template_id") in hashes for e in entries or ()):
            # a secondary pass of the GEMM's lowering with nothing in the table for it (addmm's
            # expanded-bias template lookup under a default entry, its contiguous rewrite under the
            # ATen key): nothing from it; the GEMM's own lookup decides and is the one reported
            return []
        if entries is not None and self.version_mismatch:
            return self._stale(report_key, self.version_mismatch, template_choices, kernel_inputs,
                               templates, op_name, kwarg_overrides, cpu)
        if entries is None:
            self.report.misses[report_key] += 1
            return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)
        if not entries:  # "nothing from this lookup": the GEMM's choice is under its other key (addmm)
            self.report.hits[report_key] += 1
            self.report.chosen[report_key] = "(nothing from this lookup)"
            if cpu:
                return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)
            return []
        fresh, why = [], None
        for e in entries:
            reason = stale_reason(e, hashes)
            if reason:
                why = reason
                continue
            fresh.append(e)
        if not fresh and why:
            return self._stale(report_key, why, template_choices, kernel_inputs, templates, op_name,
                               kwarg_overrides, cpu)
        if cpu:
            return self._cpu_hit(report_key, fresh, template_choices, kernel_inputs, templates, op_name,
                                 kwarg_overrides)
        from zhantune.inductor.heuristics import with_derived_kwargs

        results: dict[str, list[dict[str, Any]]] = {}
        k_dim = {"K": int(kernel_inputs.mnk_hinted()[2])} if hasattr(kernel_inputs, "mnk_hinted") else {}
        for e in fresh:
            if e["template_id"] in hashes:  # EVEN_K from the entry's own BLOCK_K, never another config's
                cfg = {k: v for k, v in with_derived_kwargs(e, k_dim).items() if k not in ("template_id", "template_hash")}
                results.setdefault(e["template_id"], []).append(cfg)
        if not results:
            why = next((r for r in (not_carried(e, "cuda") for e in fresh) if r), None)
            if why:  # a config patch on CUDA: said so, never a silent miss
                return self._stale(report_key, why, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides, cpu)
            self.report.misses[report_key] += 1
            return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)
        self.report.hits[report_key] += 1
        self.report.chosen[report_key] = ", ".join(results)
        return self._create_lookup_choices(results, templates, kernel_inputs, op_name)

    # -- helpers -----------------------------------------------------------------------------
    def _stale(self, key, why, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu):
        self.report.stale[key] = why
        self.report.stale_count[key] += 1
        return self._default(template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu)

    def _default(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, cpu):
        """Inductor's default choice: its ATen kernel only (on CPU: no C++ template either)."""
        if cpu:
            self._set_cpu({"max_autotune_gemm_backends": "ATEN"})
        return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    def _aten_only(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """The choices Inductor's own fallback makes from this lookup's ATen templates alone."""
        aten = [t for t in templates if t.uid.startswith("aten::")]
        return self._fallback({t.uid: template_choices[t.uid] for t in aten if t.uid in template_choices},
                              kernel_inputs, aten, op_name, kwarg_overrides)

    def _cpu_hit(self, key, entries, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        entry = entries[0]  # a CPU GEMM compiles one config; top_k > 1 applies on CUDA
        if _wants_cpp(entry) and not _cpp_template_applies(kernel_inputs, op_name):
            # Inductor would not offer the template here (a weight that is not a frozen constant,
            # a dtype it has no micro-kernel for): the default ATen kernel is compiled, and said so
            self.report.stale[key] = NOT_FROZEN
            self.report.stale_count[key] += 1
            self._set_cpu({"max_autotune_gemm_backends": "ATEN"})
            return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        self.report.hits[key] += 1
        if entry["template_id"] == CONFIG_TEMPLATE_ID:
            patch = dict(entry.get("config_patch") or {})
            backends = str(patch.get("max_autotune_gemm_backends", "ATEN")).upper()
            self.report.chosen[key] = f"{CONFIG_TEMPLATE_ID} {patch}"
            if "CPP" in backends:
                # the C++ template choice is created right after this lookup, under these values;
                # ATen stays in the backends so that the next GEMM's ATen lookup still happens
                self._set_cpu({**patch, "max_autotune_gemm_backends": "ATEN,CPP"})
                return []
            self._set_cpu({**patch, "max_autotune_gemm_backends": "ATEN"})
        else:
            self.report.chosen[key] = entry["template_id"]
            self._set_cpu({"max_autotune_gemm_backends": "ATEN"})
        return self._aten_only(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    def _set_cpu(self, values: dict[str, Any]) -> None:
        """This GEMM's knobs, inside cpu_gemm_lowering only (which restores them); outside one (a
        GEMM lowering zhantune does not hook) nothing is changed."""
        if self._scope_base is None:
            return
        for k in self._cpu_keys:
            _set_config(k, values.get(k, self._scope_base[k]))


def _cpp_template_applies(kernel_inputs: Any, op_name: str) -> bool:
    """Whether Inductor offers its C++ GEMM (or BMM) template for this GEMM in this lowering: its own
    ``use_cpp_gemm_template`` / ``use_cpp_bmm_template`` (torch/_inductor/utils.py: max-autotune on,
    CPP in the backends, a constant second operand, a supported dtype)."""
    from torch._inductor.utils import use_cpp_bmm_template, use_cpp_gemm_template

    check = use_cpp_bmm_template if op_name == "bmm" else use_cpp_gemm_template
    try:
        with inductor_config.patch(max_autotune_gemm_backends="ATEN,CPP"):
            return bool(check(kernel_inputs.output_layout(), *kernel_inputs.mat1mat2()))
    except Exception:  # an input Inductor's check does not expect: not offered
        return False


def _wants_cpp(entry: dict[str, Any]) -> bool:
    """A config entry whose backend list includes Inductor's C++ GEMM template."""
    if entry.get("template_id") != CONFIG_TEMPLATE_ID:
        return False
    return "CPP" in str((entry.get("config_patch") or {}).get("max_autotune_gemm_backends", "")).upper()


def _get_config(key: str) -> Any:
    return inductor_config.get_config_copy().get(key)


def _set_config(key: str, value: Any) -> None:
    """Set an allow-listed Inductor config knob (zhantune.inductor.knobs); anything else is a bug."""
    if not any(key in knobs for knobs in CONFIG_KNOBS.values()):
        raise ValueError(f"{key!r} is not an allow-listed tuning knob")
    *path, attr = key.split(".")
    obj: Any = inductor_config
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, attr, value)


class InstalledTable:
    """The result of :func:`use_table`: installed on creation; ``remove()`` (or leaving the ``with``
    block) restores the previous handler and settings. ``report`` is the live TableReport."""

    def __init__(self, tf: TableFile, device: str):
        self.tf = tf
        self.device = device
        # the table in Inductor's config, so that Inductor's FX graph cache keys differ per table;
        # on CPU nothing else (the hooks act per GEMM), on CUDA the table's compile settings
        self._patch = inductor_config.patch({**({} if device == "cpu" else cuda_table_patch(tf.table)),
                                             "lookup_table.table": tf.table})
        self._patch.__enter__()
        self.handler = TableChoices(tf)
        cpu_gemm.install()
        self._choices = V.set_choices_handler(self.handler)
        self._choices.__enter__()
        self._removed = False
        # installed until remove(), whether or not the caller keeps this object: the handler's
        # context manager is a generator that would restore the previous handler when collected
        _INSTALLED.append(self)

    @property
    def report(self) -> TableReport:
        return self.handler.report

    def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        _INSTALLED.remove(self)
        self._choices.__exit__(None, None, None)
        cpu_gemm.uninstall()
        self._patch.__exit__(None, None, None)

    def __enter__(self) -> InstalledTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


_last_report: list[TableReport] = []
#: tables installed and not yet removed (a plain ``use_table(...)`` call keeps working)
_INSTALLED: list[InstalledTable] = []


def use_table(table: str | os.PathLike[str] | dict[str, Any] | TableFile, device: str = "cpu") -> InstalledTable:
    """Install a lookup table (a file path, a dict in either format, or a TableFile already read) for
    the compiles that follow.

    Use it as a plain call (installed for the rest of the process, in this thread, until
    ``.remove()``) or as a context manager. ``device`` is the kind the model compiles for ("cpu" or
    "cuda"): it picks the compile settings (module docstring) and the allow-list of tuning knobs the
    table may set (zhantune.inductor.knobs). Raises TableError (a UserError) for a malformed table
    or one that sets anything else, naming the file and the key path; nothing is installed then.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; allowed: cpu, cuda")
    if isinstance(table, TableFile):
        check_table(table.table, table.source or "<table>", device)
    else:
        table = read_table(table, device)
    installed = InstalledTable(table, device)
    _last_report[:] = [installed.report]
    return installed


def table_report() -> TableReport | None:
    """Hits, misses (with keys) and stale drops since the last :func:`use_table`; None before any."""
    return _last_report[0] if _last_report else None
