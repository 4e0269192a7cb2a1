"""``python -m zhantune.space +op=mm shape=[M,N,K] [space=[...]]``: validate and preview a search space.

Prints each branch's size before and after its constraints, whether Inductor's lowering offers the
branch's template for this problem on this device (a template it does not offer can only give
``not_applied`` trials; the spaces' constraints keep such branches empty), and a few sample
candidates, without compiling or benchmarking anything and without touching the database. Same
options as the tune app, plus ``device_profile=H100|H200|A100|MI300X``: the CUDA spaces of that GPU
without one (its SM count, shared memory, compute capability and device key; Inductor's lowering
runs against the profile, zhantune.inductor.simulate).
"""

from __future__ import annotations

import random

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import UserError
from zhantune.report.console import make_console, print_table

__all__ = ["main", "preview"]

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="space_app")
def _space_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    from zhantune.request import check_request

    try:  # bad input is refused before torch and Inductor are imported
        check_request(cfg)
        preview(cfg, make_console())
    except UserError as e:
        user_error(e)


def preview(cfg: DictConfig, console: Console) -> None:
    """Print the dry run of the tune config ``cfg`` to ``console`` (module docstring); raises a
    UserError for bad input before printing anything."""
    from zhantune.runspec import resolve_run
    from zhantune.search.study import feasible_size, random_feasible_point

    run = resolve_run(cfg, preview=True)
    sizes = feasible_size(run.space, run.problem_vars)
    offered = None
    if run.device.kind == "cuda" and run.replay is None:
        from zhantune.runspec import cuda_offered_uids

        offered = cuda_offered_uids(run.problem, run.device)
    profile = run.device.properties.get("profile")
    where = f"{run.device.name} ({run.device.kind}" + (f", profile {profile}: simulated)" if profile else ")")
    t = Table(title=escape(f"search space for {run.problem.key} on {where}"))
    for col in ("branch", "scope", "template_id", "points", "feasible", "offered by Inductor"):
        t.add_column(col)
    for b in run.space.branches:
        total, feasible = sizes[b.name] if sizes else ("> 200000", "?")
        offer = "-" if offered is None or b.scope != "template" else ("yes" if b.template_id in offered else "no")
        t.add_row(escape(b.name), b.scope, escape(b.template_id or "-"), str(total), str(feasible), offer)
    print_table(console, t)
    if offered == frozenset():
        console.print("note: Inductor's lowering makes no GEMM selection for this problem on this device (e.g. a bmm "
                      "with M = N = 1 and K <= 32 on CUDA is a multiply and a sum): no lookup, so no table entry "
                      "applies and every trial of a tune would be not applied", markup=False)
    if profile:
        p = run.device.properties
        console.print(f"profile {profile}: {p['sm_count']} SMs, {p['smem_bytes']:,} B shared memory per block, "
                      f"compute capability {p['capability']}" + (f", ROCm {p['hip']}" if p.get("hip") else "")
                      + f"; device key {run.device.key!r}", markup=False)
        if p.get("hip"):
            console.print("note: this torch registered CUDA's template heuristics, so on a ROCm profile which "
                          "templates Inductor offers is its own, the configs each would try are CUDA's")
    rng = random.Random(cfg.search.seed)
    console.print("sample candidates:")
    shown: set[str] = set()
    while len(shown) < 5:
        point = random_feasible_point(run.space, run.problem_vars, rng, exclude=shown)
        if point is None:
            break
        cand = point[0].candidate(point[1])
        shown.add(cand.config_hash)
        console.print(f"  {cand.describe()}", soft_wrap=True, highlight=False, markup=False)


def main() -> None:
    run_app(_space_app)


if __name__ == "__main__":
    main()
