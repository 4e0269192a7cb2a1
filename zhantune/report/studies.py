"""The study a report's history and importance charts show, chosen by name.

A tune keeps an Optuna study beside its zhantune study (same name). A Kernel Tuner import
(python -m zhantune.kerneltuner) stores measurements only: its study is rebuilt as an in-memory
Optuna study from them (one trial per configuration, in the file's order; failed configurations
as failed trials), so that Optuna's own plots draw it.
"""

from __future__ import annotations

from typing import Any

import optuna

from zhantune.bench.decision import decision_us
from zhantune.errors import ConfigError
from zhantune.quiet import quiet_optuna
from zhantune.storage import Store
from zhantune.storage.engine import optuna_reader, optuna_reads, redact_url

__all__ = ["study_names", "load_report_study"]

quiet_optuna()


class ReportStorage(optuna.storages.InMemoryStorage):
    """The in-memory copy a report's charts read: its trials are handed out as stored, never deep
    copied. Optuna's importance chart reads every trial once per parameter (``study.trials`` deep
    copies each by default): a 4,362-trial Kernel Tuner study took 30 s to draw, 26 of them copying.
    Nothing writes to this storage once the study is loaded; it is dropped with the report."""

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: tuple[optuna.trial.TrialState, ...] | None = None) -> list[optuna.trial.FrozenTrial]:
        return super().get_all_trials(study_id, deepcopy=False, states=states)


def study_names(store: Store) -> list[str]:
    """Every study in the database: zhantune's and Optuna's (a tune has both under one name)."""
    names = store.study_names()
    if "studies" in store.tables():  # Optuna's: a database of imports only has none
        with optuna_reads(store):
            names |= {x.study_name for x in optuna.get_all_study_summaries(optuna_reader(store.url),
                                                                           include_best_trial=False)}
    return sorted(names)


def load_report_study(store: Store, name: str, option: str = "study") -> optuna.Study:
    """The study called ``name``, or else the one study whose name contains it. Raises ConfigError
    listing the studies when none or several match."""
    names = study_names(store)
    if name not in names:
        hits = [n for n in names if name in n]
        if len(hits) != 1:
            what = "no such study" if not hits else f"{len(hits)} studies match"
            raise ConfigError(f"{option}={name!r}: {what} in {redact_url(store.url)}; allowed: "
                              f"{', '.join(map(repr, hits or names)) or 'none'}")
        name = hits[0]
    try:
        if "studies" not in store.tables():  # no Optuna tables at all: a database of imports only
            raise KeyError(name)
        with optuna_reads(store):  # every trial read here, once: the report's charts read them again and again
            memory = ReportStorage()
            optuna.copy_study(from_study_name=name, from_storage=optuna_reader(store.url), to_storage=memory)
            return optuna.load_study(study_name=name, storage=memory)
    except KeyError:  # a zhantune study without an Optuna study (a Kernel Tuner import)
        return _study_from_measurements(store, name)


def _study_from_measurements(store: Store, name: str) -> optuna.Study:
    rows = store.study_candidates(name)
    values: dict[str, set[Any]] = {}
    for r in rows:
        for k, v in (r.params or {}).items():
            values.setdefault(k, set()).add(_choice(v))
    # a parameter with one value explains nothing (and Optuna's importance needs a spread)
    dists = {k: optuna.distributions.CategoricalDistribution(_sorted(vs)) for k, vs in values.items() if len(vs) > 1}
    study = optuna.create_study(study_name=name, direction="minimize", storage=ReportStorage())
    trials = []
    for r in rows:
        params = {k: _choice(v) for k, v in (r.params or {}).items() if k in dists}
        value = decision_us(r) if r.status == "ok" else None
        trials.append(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params},
            value=value, state=optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL))
    study.add_trials(trials)
    return study


def _choice(v: Any) -> Any:
    """A value Optuna takes as a categorical choice (None, bool, int, float, str)."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _sorted(values: set[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types
        return sorted(values, key=repr)
