"""Inductor integration: what zhantune asks of Inductor and gives back to it.

- the recording choices handler (choices.py) and the CPU per-GEMM lowering hook (cpu_gemm.py);
- Inductor's heuristics, template ids and a GPU's lowering simulated on CPU (heuristics.py,
  templates.py, simulate.py); the allow-list of tuning knobs a table may set (knobs.py);
- the compile settings every zhantune compile uses (settings.py);
- lookup tables: the format (table.py), building and exporting them from measurements
  (builder.py), serving one while a model compiles (table_choices.py, runtime.py: ``use_table``);
- a model's GEMMs as problems (gemms.py).

Names are imported on first use: the modules that need torch load it then, so that the command
line's checks (the allow-list, the table format) stay light.
"""

from typing import Any

__all__ = ["LookupEvent", "RecordingChoices", "recording", "use_table", "table_report", "build_table",
           "read_table", "write_table"]

_LAZY = {"LookupEvent": "choices", "RecordingChoices": "choices", "recording": "choices", "use_table": "runtime",
         "table_report": "runtime", "build_table": "builder", "read_table": "table", "write_table": "table"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"zhantune.inductor.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'zhantune.inductor' has no attribute {name!r}")
