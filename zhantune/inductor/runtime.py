"""Use a shipped lookup table when compiling: ``zhantune.use_table`` and ``zhantune.table_report``.

``use_table(path_or_dict)`` installs :class:`TableChoices` as Inductor's choices handler (the hook
torch/_inductor/lookup_table/__init__.py documents: ``V.set_choices_handler``) and puts the bare
table in ``torch._inductor.config.lookup_table.table`` (so Inductor's FX graph cache keys differ per
table). Every GEMM lowering then goes through the table:

- **hit**: the key's entries are compiled, nothing else (one entry: no autotuning; several:
  Inductor autotunes among them, Inductor's own lookup-table semantics). An empty list means
  "nothing from this lookup": addmm looks its ATen kernel up with the 1-D bias and its templates
  with the expanded bias, so a Triton winner is stored under the expanded key and the ATen key gets
  ``[]`` (zhantune.inductor.builder.build_table); where that lookup then serves nothing (its template
  is not offered on this GPU: a TMA template without TMA, any Triton template under 68 SMs) the
  addmm compiles Inductor's default and the entry is reported stale, never with no choice at all;
- **miss**: Inductor's default choice, and the key is reported: what Inductor compiles under the
  user's own settings, as without the table: on CUDA its ATen kernel, or under their max-autotune
  the templates of their backends, autotuned; on CPU ATen, or under their max-autotune ATen against
  its C++ template;
- **stale**: an entry whose ``template_hash`` differs from the template's ``src_hash`` in this torch,
  every entry of a table made with another torch release, on CUDA a ``zhantune::config`` entry
  (compile-wide Inductor config, which a per-GEMM table cannot apply there), or on CPU a GPU
  template entry (``triton::mm``, ``decompose_k``, ...), and on CUDA a key none of whose entries'
  templates Inductor offers for the GEMM on this device, is dropped, reported, and the GEMM compiles
  as a miss (with ``top_k`` > 1, a key some of whose entries are offered compiles those: a hit).

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

import contextlib
import copy
import os
import threading
from typing import Any

from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V

from zhantune.inductor import cpu_gemm
from zhantune.inductor.cuda_entries import gemm_settings
from zhantune.inductor.settings import cuda_table_patch
from zhantune.inductor.table import TableFile, read_table, recheck_table
from zhantune.inductor.table_choices import TableChoices, TableReport
from zhantune.torch_support import check_torch

__all__ = ["InstalledTable", "use_table", "table_report", "TableChoices", "TableReport"]


class InstalledTable:
    """The result of :func:`use_table`: installed on creation; ``remove()`` (or leaving the ``with``
    block) restores the previous handler and settings. ``report`` is the live TableReport."""

    def __init__(self, tf: TableFile, device: str):
        self.tf = tf
        self.device = device
        # the table in Inductor's config, so that Inductor's FX graph cache keys differ per table;
        # on CPU nothing else (the hooks act per GEMM), on CUDA the table's compile settings
        self.handler = TableChoices(tf)  # first: a handler that cannot be made leaves nothing set
        # the user's own GEMM autotuning, before a CUDA table's patch turns it on (the first CUDA table's
        # of this thread, for a table installed inside another): what a GEMM the table does not decide
        # compiles under (TableChoices._cuda_users_own)
        outer = [t for t in _installed() if t.device != "cpu"]  # a CPU table patches none of them: live
        self.handler.user_gemm = None if device == "cpu" else outer[0].handler.user_gemm if outer else gemm_settings()
        self._install()
        self._removed, self._thread = False, threading.get_ident()
        # installed until remove(), whether or not the caller keeps this object: the handler's
        # context manager is a generator that would restore the previous handler when collected
        _installed().append(self)

    def _install(self) -> None:
        # a copy in the config: the handler serves its own, checked one (a value written into
        # config.lookup_table.table after use_table reached Inductor's template unchecked)
        self._patch = inductor_config.patch({**({} if self.device == "cpu" else cuda_table_patch(self.tf.table)),
                                             "lookup_table.table": copy.deepcopy(self.tf.table)})
        with contextlib.ExitStack() as undo:  # an install that fails part-way undoes what it did
            self._patch.__enter__()
            undo.callback(self._patch.__exit__, None, None, None)
            cpu_gemm.install()
            undo.callback(cpu_gemm.uninstall)
            self._choices = V.set_choices_handler(self.handler)
            self._choices.__enter__()
            undo.pop_all()

    def _uninstall(self) -> None:
        self._choices.__exit__(None, None, None)
        cpu_gemm.uninstall()
        self._patch.__exit__(None, None, None)

    @property
    def report(self) -> TableReport:
        return self.handler.report

    def remove(self) -> None:
        """Restore what was in effect before this table. Tables installed after it stay in effect:
        Inductor's handler and config patches restore last in, first out, so those are taken off
        first and put back after (removing the first of two installs left it in effect, a review found)."""
        if self._removed:
            return
        if threading.get_ident() != self._thread:  # Inductor's handler is per thread: another's would be undone
            raise RuntimeError("remove() a table in the thread that installed it (use_table is per thread)")
        stack = _installed()
        at = stack.index(self)
        later = stack[at + 1:]
        for table in reversed(later):
            table._uninstall()
        self._uninstall()
        del stack[at]
        self._removed = True
        for table in later:
            table._install()

    def __enter__(self) -> InstalledTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


#: per thread, the tables installed and not yet removed, in order (a plain ``use_table(...)`` call keeps
#: working), and the report of the newest ``use_table`` (``last_report``)
_LOCAL = threading.local()


def _installed() -> list[InstalledTable]:
    if not hasattr(_LOCAL, "tables"):
        _LOCAL.tables = []
    return _LOCAL.tables


def use_table(table: str | os.PathLike[str] | dict[str, Any] | TableFile, device: str = "cpu") -> InstalledTable:
    """Install a lookup table (a file path, a dict in either format, or a TableFile already read) for
    the compiles that follow.

    Use it as a plain call (installed for the rest of the process, in this thread, until
    ``.remove()``) or as a context manager. ``device`` is the kind the model compiles for ("cpu" or
    "cuda"): it picks the compile settings (module docstring) and the allow-list of tuning knobs the
    table may set (zhantune.inductor.knobs). Raises TableError (a UserError) for a malformed table
    or one that sets anything else, naming the file and the key path, and UnsupportedTorchError (a
    UserError) under torch older than 2.13 (zhantune.torch_support); nothing is installed then.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; allowed: cpu, cuda")
    if not isinstance(table, (str, os.PathLike, dict, TableFile)):  # use_table(None) read a file named "None"
        raise TypeError(f"use_table: expected a path, a dict or a TableFile, got {type(table).__name__}")
    check_torch(what="zhantune.use_table")
    if isinstance(table, TableFile):  # read for another kind, or built in Python: checked again for this one
        table = recheck_table(table, device)
    else:
        table = read_table(table, device)
    installed = InstalledTable(table, device)
    _LOCAL.last_report = installed.report
    return installed


def table_report() -> TableReport | None:
    """Hits, misses (with keys) and stale drops since this thread's last :func:`use_table` (a table is
    installed per thread, and so is its report); None before any in this thread."""
    return getattr(_LOCAL, "last_report", None)
