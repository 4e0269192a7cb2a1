"""``python -m zhantune.kerneltuner files=[A.json.gz,B.json.gz] storage.url=...``: import Kernel Tuner data.

Each cache file becomes a device (its ``device_name``; ``devices=[...]``, one name per file, names
them instead; a file without a ``device_name`` is named after its file name), a problem (kernel name
and problem size) and a study named ``kerneltuner:<file name>@<device>`` holding one measurement per
configuration (failures keep their status), with the same config hashes a ``bench=replay`` tune of
that file stores, so ``python -m zhantune.compare`` and transfer (docs/search.md) work on real GPU
data. Importing the same file again adds nothing. Two different files of one problem are never
merged into one device named after file names: give them names with ``devices=[...]``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf

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
    digest = hashlib.sha256(file.path.read_bytes()).hexdigest()
    _refuse_merge(store, file, digest)
    device_id = store.device_id(device.key, device.name, device.kind, device.properties)
    problem_id = store.problem_id(problem.key, lookup_key=None, **problem.row_fields())
    name = f"kerneltuner:{file.path.name}@{device.key}"
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


def _refuse_merge(store: Store, file: KernelTunerFile, digest: str) -> None:
    """A file whose device is named after its file name (no ``device_name``) may not add its
    measurements to a device that already holds this problem from another file: the two could be
    different GPUs. Raises ConfigError naming both files and ``devices=[...]``."""
    if file.device_named_by != "file name":
        return
    from sqlalchemy import select

    from zhantune.storage import models as m

    with store.session() as s:
        # the studies with this device's measurements of this problem (a subquery: PostgreSQL has no
        # DISTINCT over the JSON config column)
        ids = (select(m.Measurement.study_id).join(m.Device, m.Measurement.device_id == m.Device.id)
               .join(m.Problem, m.Measurement.problem_id == m.Problem.id)
               .where(m.Device.key == file.device_key, m.Problem.key == file.problem().key))
        q = select(m.Study.name, m.Study.config).where(m.Study.id.in_(ids))
        for name, config in s.execute(q):
            if (config or {}).get("sha256") != digest:
                raise ConfigError(
                    f"files={file.path}: records no device_name and its file name gives device "
                    f"{file.device_key!r}, which already holds {file.problem().key} from study {name!r}; "
                    "name the devices with devices=[...] (one name per file)")


def _check_devices(files: list[str], devices: object) -> list[str | None]:
    """``devices=[...]``: one non-empty name per file (None: every device named by its file)."""
    if devices is None:
        return [None] * len(files)
    if not isinstance(devices, list) or len(devices) != len(files) \
            or not all(isinstance(d, str) and d.strip() for d in devices):
        raise ConfigError(f"devices={devices!r}: expected one non-empty device name per file "
                          f"({len(files)} file(s)), e.g. devices=[A100,MI250X]")
    return [d.strip() for d in devices]


def _check_distinct(loaded: list[KernelTunerFile]) -> None:
    """Two files of one problem whose devices are both named after file names must not meet in one
    device (ConfigError)."""
    seen: dict[tuple[str, str], KernelTunerFile] = {}
    for f in loaded:
        key = (f.device_key, f.problem().key)
        other = seen.setdefault(key, f)
        if other is not f and "file name" in (f.device_named_by, other.device_named_by):
            raise ConfigError(f"files=[...]: {other.path} and {f.path} both give device {f.device_key!r} for "
                              f"{key[1]} (named after the file name); name them with devices=[...]")


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
        devices = _check_devices(files, OmegaConf.to_container(cfg.devices) if cfg.devices is not None else None)
        from zhantune.bench.replay import load_kerneltuner
        from zhantune.storage import Store

        # all checked before writing
        loaded = [load_kerneltuner(Path(f), source="files", device=d) for f, d in zip(files, devices, strict=True)]
        _check_distinct(loaded)
        store = Store(cfg.storage.url)
        for f in loaded:
            name, added = import_kerneltuner(store, f)
            named = "" if f.device_named_by == "device_name" else f" (device named by {f.device_named_by})"
            print(f"{f.path}: {added} measurement(s) of device {f.device_key!r}{named} as study {name!r}"
                  + ("" if added else " (already imported)"))
        if loaded:
            print(f"its search history: python -m zhantune.compare html=report.html study={loaded[0].path.name} "
                  "(study= takes a study's name or a part only it has)")
    except UserError as e:
        user_error(e)


def main() -> None:
    run_app(_import_app)


if __name__ == "__main__":
    main()
