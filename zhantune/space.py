"""``python -m zhantune.space +op=mm shape=[M,N,K] [space=[...]]``: validate and preview a search space.

Prints each branch's size before and after its constraints and a few sample candidates, without
compiling or benchmarking anything and without touching the database. Same options as the tune app.
"""

from __future__ import annotations

import random

import hydra
from omegaconf import DictConfig
from rich.table import Table

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import UserError
from zhantune.report.console import make_console, print_table

__all__ = ["main"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="space_app")
def _space_app(cfg: DictConfig) -> None:
    mark_task_started()
    from zhantune.request import check_request

    try:  # bad input is refused before torch and Inductor are imported
        check_request(cfg)
    except UserError as e:
        user_error(e)
        return
    from zhantune.search.study import feasible_size, random_feasible_point
    from zhantune.tune import resolve_run

    try:
        run = resolve_run(cfg)
        sizes = feasible_size(run.space, run.problem_vars)
    except UserError as e:
        user_error(e)
        return
    console = make_console()
    t = Table(title=f"search space for {run.problem.key} on {run.device.name} ({run.device.kind})")
    for col in ("branch", "scope", "template_id", "points", "feasible"):
        t.add_column(col)
    for b in run.space.branches:
        total, feasible = sizes[b.name] if sizes else ("> 200000", "?")
        t.add_row(b.name, b.scope, b.template_id or "-", str(total), str(feasible))
    print_table(console, t)
    rng = random.Random(cfg.search.seed)
    console.print("sample candidates:")
    shown: set[str] = set()
    while len(shown) < 5:
        point = random_feasible_point(run.space, run.problem_vars, rng, exclude=shown)
        if point is None:
            break
        cand = point[0].candidate(point[1])
        shown.add(cand.config_hash)
        console.print(f"  {cand.describe()}", soft_wrap=True, highlight=False)


def main() -> None:
    run_app(_space_app)


if __name__ == "__main__":
    main()
