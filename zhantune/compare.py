"""``python -m zhantune.compare``: per-device winners, cross-device regret and portable choices.

Reads every device in ``storage.url`` (or ``devices=[...]``, by key or name) and prints, per problem,
each device's best config, the regret of each device's winner on the others, and the config that
loses least everywhere; then the device x device regret matrix. ``csv=``, ``json=``, ``html=`` write
the same data; ``table=`` writes the portable choices as device-agnostic lookup-table entries.
Definitions in :mod:`zhantune.report.compare`.
"""

from __future__ import annotations

import hydra
import optuna
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.errors import ConfigError, StorageError, UserError

__all__ = ["main"]


@hydra.main(version_base="1.3", config_path="conf", config_name="compare")
def _compare_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.inductor.table import portable_table, write_table
    from zhantune.paths import check_output_path
    from zhantune.report.compare import compare
    from zhantune.report.html import write_html_report
    from zhantune.report.outputs import print_comparison, write_csv, write_json
    from zhantune.storage import Store, sqlite_path

    console = Console()
    try:
        path = sqlite_path(cfg.storage.url)
        if path is not None and not path.exists():
            raise StorageError(f"storage.url={cfg.storage.url}: no database at {path}")
        devices = OmegaConf.to_container(cfg.devices) if cfg.devices is not None else None
        if devices is not None and not isinstance(devices, list):
            raise ConfigError(f"devices={cfg.devices!r} must be a list of device keys or names, e.g. devices=[A,B]")
        for option in ("csv", "json", "html", "table"):
            if cfg[option]:
                check_output_path(cfg[option], option)
        store = Store(cfg.storage.url)
        cmp = compare(store, [str(d) for d in devices] if devices else None)
        study = None
        if cfg.study:
            try:
                study = optuna.load_study(study_name=cfg.study, storage=cfg.storage.url)
            except KeyError:
                names = [s.study_name for s in optuna.get_all_study_summaries(cfg.storage.url)]
                raise ConfigError(f"study={cfg.study!r}: no such Optuna study in {cfg.storage.url}; "
                                  f"allowed: {', '.join(map(repr, names)) or 'none'}") from None
    except UserError as e:
        user_error(e)
        return
    print_comparison(console, cmp, cfg.top)
    if cfg.csv:
        console.print(f"csv: {write_csv(cfg.csv, cmp)}")
    if cfg.json:
        console.print(f"json: {write_json(cfg.json, cmp)}")
    if cfg.html:
        console.print(f"html: {write_html_report(cfg.html, cmp, study)}")
    if cfg.table:
        table = portable_table(cmp, store)
        if table:
            console.print(f"lookup table: {write_table(cfg.table, table)} ({len(table)} portable entr(y/ies))")
        else:
            console.print("[yellow]no portable choice has an Inductor lookup key (imported or replayed "
                          "problems have none); no table written[/yellow]")


def main() -> None:
    run_app(_compare_app)


if __name__ == "__main__":
    main()
