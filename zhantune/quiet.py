"""Known, harmless warnings of the compiles zhantune makes on purpose, silenced in every process that
compiles (the apps and the isolated benchmark workers)."""

from __future__ import annotations

import warnings

__all__ = ["quiet_known_warnings", "quiet_optuna", "NO_AUTOTUNE_REPORT"]

#: Inductor config that keeps max-autotune from writing its ``AUTOTUNE mm(...)`` tables,
#: ``SingleProcess AUTOTUNE benchmarking takes ...`` lines and ``Autotune Choices Stats:`` JSON to
#: stderr (torch/_inductor/select_algorithm.py: ``log_results`` returns early when the first is 0,
#: ``_log_autotune_choices_stats`` runs only with the second)
NO_AUTOTUNE_REPORT = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def quiet_known_warnings() -> None:
    warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")
    warnings.filterwarnings("ignore", message=".*dynamo_pgo force disabled.*")
    warnings.filterwarnings("ignore", message="Argument ``group`` is an experimental feature.*")
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated.*")


def quiet_optuna() -> None:
    """Optuna's INFO lines (``[I ...] A new study created in RDB with name: ...``) off: zhantune
    reports studies itself."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
