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
  or every entry of a table made with another torch release, is dropped, reported, and the GEMM
  compiles as a miss.

On CPU (where Inductor itself makes no lookup) the table's entries are config patches of
Inductor's C++ GEMM template; the handler applies each GEMM's patch while that GEMM is lowered (the
template reads ``cpp.gemm_*`` when its choice is created, in the same lowering), and the compile
runs under the settings the measurements were taken with: ``freezing`` (constant weights, so the
template applies), ``max_autotune`` with ``max_autotune_gemm_backends="ATEN,CPP"``, and oneDNN off
(zhantune.bench.inductor explains why). The handler is per thread, like Inductor's.

``table_report()`` returns what was seen since the table was installed. Loading a table never
executes code from it: it is JSON, checked by :func:`zhantune.inductor.table.read_table`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V

from zhantune.inductor.choices import RecordingChoices
from zhantune.inductor.knobs import CONFIG_KNOBS
from zhantune.inductor.table import CONFIG_TEMPLATE_ID, TableFile, check_table, read_table

__all__ = ["TableChoices", "TableReport", "InstalledTable", "use_table", "table_report", "release", "stale_reason"]

#: CPU compile settings a CPU table's measurements were taken with (zhantune.bench.inductor)
CPU_TABLE_PATCH: dict[str, Any] = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP"}
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
    patch: dict[str, Any] = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
    if any(e.get("template_id") == "triton::mm_persistent_tma" for entries in table.values() for e in entries):
        patch["triton.enable_persistent_tma_matmul"] = True
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

    def __init__(self, tf: TableFile):
        super().__init__(table=tf.table)
        self.tf = tf
        self.report = TableReport(tf.source)
        self.version_mismatch: str | None = None
        if tf.torch_version is not None and release(tf.torch_version) != release(torch.__version__):
            self.version_mismatch = (f"table made with torch {tf.torch_version}, this is torch "
                                     f"{torch.__version__}: lookup keys and templates may differ; re-tune")
        keys = set(_CPU_GEMM_KEYS)
        for entries in tf.table.values():
            for e in entries:
                keys.update((e.get("config_patch") or {}).keys())
        self._cpu_baseline = {k: _get_config(k) for k in sorted(keys)}

    def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides=None):
        if not templates:  # a pass with nothing to choose from (addmm's expanded-bias pass)
            return []
        hashes = {t.uid: getattr(t, "src_hash", None) for t in templates}
        event = self.event(kernel_inputs, op_name, hashes, ())
        self.events.append(event)
        key, entries = None, None
        for k in (event.device_key, event.agnostic_key):
            if k is not None and k in self.tf.table:
                key, entries = k, self.tf.table[k]
                break
        report_key = key or event.device_key or event.agnostic_key or op_name
        cpu = kernel_inputs.device().type == "cpu"
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
        for k, base in self._cpu_baseline.items():
            _set_config(k, values.get(k, base))

    def restore(self) -> None:
        for k, v in self._cpu_baseline.items():
            _set_config(k, v)


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
        self._patch = inductor_config.patch({**(CPU_TABLE_PATCH if device == "cpu" else cuda_table_patch(tf.table)),
                                             "lookup_table.table": tf.table})
        self._patch.__enter__()
        self.handler = TableChoices(tf)  # its per-GEMM baseline is the config under the table's settings
        self._mkldnn = torch.backends.mkldnn.enabled
        if device == "cpu":
            torch.backends.mkldnn.enabled = False
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
        self.handler.restore()
        torch.backends.mkldnn.enabled = self._mkldnn
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
