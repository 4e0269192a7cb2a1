"""``python -m zhantune.kerneltuner files=[A.json.gz,B.json.gz] storage.url=...``: import Kernel Tuner data.

Each cache file becomes a device (its ``device_name``), a problem (kernel name and problem size) and
a study named ``kerneltuner:<file name>`` holding one measurement per configuration (failures keep
their status), with the same config hashes a ``bench=replay`` tune of that file stores, so
``python -m zhantune.compare`` works on real GPU data. Importing the same file again adds nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.errors import ConfigError, UserError

if TYPE_CHECKING:  # zhantune.bench.replay imports torch: the app checks its input first
    from zhantune.bench.replay import KernelTunerFile
    from zhantune.storage import Store

__all__ = ["import_kerneltuner", "main", "IMPORTED_VERSION"]

#: torch_version of imported rows: they were measured by Kernel Tuner, not through torch
IMPORTED_VERSION = "kerneltuner"


def import_kerneltuner(store: Store, file: KernelTunerFile) -> tuple[str, int]:
    """Store every configuration of ``file``; returns (study name, rows added; 0 when already there)."""
    from zhantune.bench.replay import ReplayBenchmarker
    device = file.device()
    problem = file.problem()
    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    problem_id = store.problem_id(problem.key, lookup_key=None, **problem.row_fields())
    name = f"kerneltuner:{file.path.name}@{device.key}"
    digest = hashlib.sha256(file.path.read_bytes()).hexdigest()
    study_id = store.study_id(name, {"source": str(file.path), "sha256": digest, "format": "kerneltuner"})
    if store.count_measurements(study_id):
        store.finish_study(study_id)
        return name, 0
    (branch,) = file.space().branches
    bench = ReplayBenchmarker(file)
    tuned = [p.name for p in branch.params if p.distribution is not None]
    rows = []
    for number, entry in enumerate(file.cache.values()):
        cand = branch.candidate({n: entry[n] for n in tuned})
        meas = bench.measure(cand)
        t = meas.timing
        row = dict(study_id=study_id, device_id=device_id, problem_id=problem_id, trial_number=number,
                   kind="candidate", status=meas.status, branch=branch.name, template_id=branch.template_id,
                   params=cand.params, config_hash=cand.config_hash, error_text=meas.error_text,
                   compile_s=meas.compile_s, torch_version=IMPORTED_VERSION, triton_version=None)
        if t is not None:
            row.update(median_us=t.median_us, min_us=t.min_us, max_us=t.max_us, p20_us=t.p20_us,
                       p80_us=t.p80_us, n=t.n, timing_method=t.method, tflops=problem.tflops(t.median_us))
        rows.append(row)
    added = store.add_measurements(rows)
    store.finish_study(study_id)
    return name, added


@hydra.main(version_base="1.3", config_path="conf", config_name="kerneltuner")
def _import_app(cfg: DictConfig) -> None:
    mark_task_started()
    try:
        files = list(cfg.files or [])
        if not files:
            raise ConfigError("no files given; use files=[A.json.gz,B.json.gz] (Kernel Tuner cache files)")
        for f in files:  # before the heavy imports
            if not Path(f).exists():
                raise ConfigError(f"files={f}: no such file")
        from zhantune.bench.replay import load_kerneltuner
        from zhantune.storage import Store

        loaded = [load_kerneltuner(Path(f), source="files") for f in files]  # all checked before writing
        store = Store(cfg.storage.url)
        for f in loaded:
            name, added = import_kerneltuner(store, f)
            print(f"{f.path}: {added} measurement(s) as study {name!r}" + ("" if added else " (already imported)"))
        if loaded:
            print(f"its search history: python -m zhantune.compare html=report.html study={loaded[0].path.name} "
                  "(study= takes a study's name or a part only it has)")
    except UserError as e:
        user_error(e)


def main() -> None:
    run_app(_import_app)


if __name__ == "__main__":
    main()
