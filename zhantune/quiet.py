"""Known, harmless warnings of the compiles zhantune makes on purpose, silenced in every process that
compiles (the apps and the isolated benchmark workers)."""

from __future__ import annotations

import warnings

__all__ = ["quiet_known_warnings"]


def quiet_known_warnings() -> None:
    warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")
    warnings.filterwarnings("ignore", message=".*dynamo_pgo force disabled.*")
    warnings.filterwarnings("ignore", message="Argument ``group`` is an experimental feature.*")
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated.*")
