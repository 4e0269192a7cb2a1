"""``python -m zhantune.compare``: per-device winners, cross-device regret and portable choices.

Reads every device in ``storage.url`` (or ``devices=[...]``, by key, name or number) and prints, per problem,
each device's best config, the regret of each device's winner on the others, and the config that
loses least everywhere; then the device x device regret matrix. One device works too (its winners;
with ``study=``, the report draws the search history), and each winner's speedup claim over
Inductor's default where paired rounds judged one (zhantune.report.regret.Claim, at
``min_speedup``). ``json=`` writes the whole comparison, ``csv=`` its regret rows, ``html=`` the
report with charts (zhantune.report.outputs, zhantune.report.html); ``table=`` writes the portable
choices as device-agnostic lookup-table entries, each only where it may replace Inductor's default
on every compared device (``min_speedup``, the export's rule; else the default's entry). Definitions in :mod:`zhantune.report.regret`; the portable table:
zhantune.inductor.portable.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, StorageError, UserError

__all__ = ["main"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="compare")
def _compare_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    from zhantune.paths import check_output_path
    from zhantune.redact import hide_password
    from zhantune.storage import Store, sqlite_path

    try:  # the command line first: the report's modules (Plotly, Optuna) take a while to import
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={hide_password(cfg.storage.url)}: no database at {path} (a tune, "
                               "python -m zhantune ..., writes one; or give the storage.url of yours)")
        if cfg.min_speedup is not None and not 1.0 <= cfg.min_speedup < math.inf:
            raise ConfigError(f"min_speedup={cfg.min_speedup} must be a number of at least 1.0 (1.0: a portable "
                              "entry where confirmed not slower than the default on every device; null: always "
                              "the portable choice)")
        if cfg.study and not cfg.html:  # it was checked, then nothing was drawn (a helper's, session 48)
            raise ConfigError(f"study={cfg.study}: a study's history is drawn into the HTML report: give html=PATH "
                              "too")
        if cfg.top < 0:
            raise ConfigError(f"top={cfg.top} must be at least 0 (how many of the most-disagreeing problems to list)")
        if cfg.devices is not None and not OmegaConf.is_list(cfg.devices):
            raise ConfigError(f"devices={cfg.devices!r} must be a list of device keys, names or numbers, e.g. devices=[A,B]")
        devices = OmegaConf.to_container(cfg.devices, resolve=True) if cfg.devices is not None else None
        if devices == []:  # it compared every device, as if devices= had not been given
            raise ConfigError("devices=[]: no device named; give device keys, names or numbers (devices=[A,B]), or drop "
                              "devices= to compare every device")
        given: dict[Path, str] = {}
        for option in ("csv", "json", "html", "table"):
            if cfg[option]:
                check_output_path(cfg[option], option)
                if (same := given.setdefault(Path(str(cfg[option])).resolve(), option)) != option:  # one lost
                    raise ConfigError(f"{same}={cfg[same]} and {option}={cfg[option]} name one file: the second would "
                                      "overwrite the first; give each output its own file")
    except UserError as e:
        user_error(e)
        return
    from zhantune.report.console import make_console
    from zhantune.report.outputs import print_comparison
    from zhantune.report.regret import compare
    from zhantune.report.studies import load_report_study

    console = make_console()
    try:
        store = Store(cfg.storage.url, read_only=True)  # only read: a read-only file is fine
        store.check_readable()
        cmp = compare(store, [str(d) for d in devices] if devices else None, cfg.min_speedup)
        # a tune's study, or one a Kernel Tuner import printed (by its name or a part only it has)
        study = load_report_study(store, str(cfg.study)) if cfg.study else None
    except UserError as e:
        user_error(e)
        return
    print_comparison(console, cmp, cfg.top, history=study is not None and bool(cfg.html))  # no hint to do it again
    try:  # a full disk: one line (the old file is left as it was: zhantune.paths.write_atomic)
        _write_outputs(cfg, console, store, cmp, study)
    except UserError as e:
        user_error(e)


def _write_outputs(cfg: DictConfig, console: Any, store: Any, cmp: Any, study: Any) -> None:
    """The files compare was asked for: csv, json, html (with ``study``'s history), the portable table."""
    from zhantune.report.html import write_html_report
    from zhantune.report.outputs import write_csv, write_json
    from zhantune.report.studies import study_names

    portable = None
    if cfg.table:  # decided before any file is written: a refused table= leaves the other outputs as they were
        from zhantune.inductor.portable import portable_choices

        portable = portable_choices(cmp, store, cfg.min_speedup)
        if not portable.table:  # asked for and not written: an error, as export's (it exited 0)
            raise ConfigError(f"table={cfg.table}: no table written: no portable choice a lookup table can carry "
                              "(imported or replayed problems have no Inductor lookup key; a CPU's config is not a "
                              "GPU's; or no problem was compared); no other file written")
    if cfg.csv:
        console.print(f"csv: {write_csv(cfg.csv, cmp)}", soft_wrap=True, markup=False)
    if cfg.json:
        console.print(f"json: {write_json(cfg.json, cmp)}", soft_wrap=True, markup=False)
    if cfg.html:
        out = write_html_report(cfg.html, cmp, study, studies=study_names(store))
        console.print(escape(f"html: {out}") + (f" (history and importances of study {escape(repr(study.study_name))})" if study else
                                         " (study=NAME adds a study's optimisation history)"), soft_wrap=True)
    if portable is not None:  # stamped with this torch, as export's: its claims were confirmed with it
        from zhantune.inductor.builder import NO_CLAIM_NOTE
        from zhantune.inductor.exporter import table_metadata
        from zhantune.inductor.table import write_table
        from zhantune.inductor.table_meta import version_for
        from zhantune.storage.engine import redact_url

        meta = table_metadata(store, portable.table, {"portable": True, "min_speedup": cfg.min_speedup,
                                                      "devices": list(cmp.devices) if cfg.devices else None}, redact_url(store.url))
        meta["activations"] = portable.activations  # use_table compares them with each GEMM's epilogue
        meta["format_version"] = version_for(portable.activations)
        console.print(f"lookup table: {write_table(cfg.table, portable.table, meta, 'table')} ({len(portable.table)} key(s))",
                      markup=False)
        _print_withheld(console, portable)
        if cfg.min_speedup is None:
            console.print(f"note: {NO_CLAIM_NOTE}", markup=False, soft_wrap=True)


def _print_withheld(console, out) -> None:
    """The keys that ship Inductor's default instead of a portable choice, and why (``out``: a
    zhantune.inductor.portable.PortableTable)."""
    for problem_key, why in list(out.withheld.items())[:WITHHELD_LINES]:
        console.print(f"{problem_key}: Inductor's default ships; its portable choice on "
                      + "; on ".join(f"{dev}: {reason}" for dev, reason in why.items()), markup=False, soft_wrap=True)
    if len(out.withheld) > WITHHELD_LINES:
        console.print(f"... and {len(out.withheld) - WITHHELD_LINES} more problem(s)", markup=False)
    if any(r.startswith(("never paired", "not confirmed")) for why in out.withheld.values() for r in why.values()):
        console.print("to pair them with the default: write the table with min_speedup=null, run python -m "
                      "zhantune.replay table=FILE on each device named, then compare again", markup=False, soft_wrap=True)
    for key in out.shared:
        console.print(f"{key}: Inductor's default ships: problems with different portable choices share this "
                      "lookup key (one choice was never measured for the other)", markup=False, soft_wrap=True)


#: at most this many problems' reasons are listed one per line
WITHHELD_LINES = 10


def main() -> None:
    run_app(_compare_app)


if __name__ == "__main__":
    main()
