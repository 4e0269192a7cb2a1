"""Terminal and log-file output: one Rich console per app, tables that never cut a value, configs as
compact ``k=v`` text.

In a terminal Rich does what it does (colours, the terminal's width, a live progress bar). Anywhere
else (a log file, a pipe, CI) the console is ``LOG_WIDTH`` columns wide unless ``COLUMNS`` says
otherwise, prose wraps there, and a table is printed as wide as its cells need: a log keeps every
config, key and number whole, where a terminal-sized table would shorten them to ``max-autot...``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["LOG_WIDTH", "make_console", "print_table", "compact"]

#: columns of the output when stdout is not a terminal
LOG_WIDTH = 100


def make_console(**kwargs: Any) -> Console:
    """Rich's console on stdout; ``LOG_WIDTH`` columns when stdout is not a terminal (and the
    environment sets no ``COLUMNS``)."""
    console = Console(**kwargs)
    if not console.is_terminal and "COLUMNS" not in os.environ and "width" not in kwargs:
        console = Console(width=LOG_WIDTH, **kwargs)
    return console


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; off a terminal as wide as its widest row, or its title, needs, so that no cell
    is cut and the title (compare's: a problem key) is not broken mid-word (a newcomer's, session 48:
    ``linear_act[...]:floa`` / ``t32:gelu:weight_nk``)."""
    if console.is_terminal:
        console.print(table)
        return
    if isinstance(table.title, str):
        table.min_width = max(table.min_width or 0, Text.from_markup(table.title).cell_len)
    need = Measurement.get(console, console.options.update(max_width=10**6), table).maximum  # uncapped
    if need <= console.width:
        console.print(table)
        return
    width = console.width  # Console.print caps a width= argument at the console's: widen the console
    console.width = need
    try:
        console.print(table, crop=False)
    finally:
        console.width = width


def compact(params: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    """A config as ``k=v k=v`` (keys sorted, ``skip`` left out): one token per parameter, so a line
    break never falls inside one."""
    skipped = set(skip)
    return " ".join(f"{k}={_value(v)}" for k, v in sorted(params.items()) if k not in skipped)


def _value(v: Any) -> str:
    text = str(v)
    return text.replace(" ", "") if isinstance(v, (list, tuple, dict)) else text
