"""``python -m zhantune.kerneltuner files=[A.json.gz,B.json.gz] storage.url=...``: import Kernel Tuner data.

Each cache file becomes a device (its ``device_name``; ``devices=[...]``, one name per file, names
them instead; a file without a ``device_name`` is named after its file name), a problem (kernel name
and problem size) and a study named ``kerneltuner:<file name>@<device>`` holding one measurement per
configuration (failures keep their status), with the same config hashes a ``bench=replay`` tune of
that file stores, so ``python -m zhantune.compare`` and transfer (docs/search.md) work on real GPU
data. Importing the same recording again for a device adds nothing (a copy under another name,
gzipped or decompressed, too); another file of the same file name (another
folder) gets its own study, ``kerneltuner:<file name>[sha256:<12 hex digits>]@<device>``. Two
different files of one problem are never merged into one device named after file names: give them
names with ``devices=[...]`` (zhantune.storage.ingest.import_kerneltuner).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf

from zhantune.cli import mark_task_started, run_app, user_error
from zhantune.config import register
from zhantune.errors import ConfigError, UserError, shown

if TYPE_CHECKING:  # zhantune.bench.recorded imports torch: the app checks its input first
    from zhantune.bench.recorded import KernelTunerFile

__all__ = ["main"]

register()


def _check_devices(files: list[str], devices: object) -> list[str | None]:
    """``devices=[...]``: one non-empty name per file (None: every device named by its file)."""
    if devices is None:
        return [None] * len(files)
    if not isinstance(devices, list) or len(devices) != len(files) \
            or not all(isinstance(d, str) and d.strip() for d in devices):
        quote = next((d for d in devices if isinstance(d, (bool, int, float))), None) if isinstance(devices, list) else None
        raise ConfigError(f"devices={devices!r}: expected one non-empty device name per file "
                          f"({len(files)} file(s)), e.g. devices=[A100,MI250X]"
                          + (f" (a name Hydra reads as a number or boolean, such as {quote!r}: quote it, e.g. "
                             f"devices=['{quote}'])" if quote is not None else ""))
    return [d.strip() for d in devices]


def _check_distinct(loaded: list[KernelTunerFile]) -> None:
    """Two files of one problem whose devices are both named after file names, or two files that
    record two GPUs' names (of any problems), must not meet in one device (ConfigError); copies of one
    recording are one file (the import adds it once)."""
    seen: dict[tuple[str, str], KernelTunerFile] = {}
    named: dict[str, KernelTunerFile] = {}  # device key -> its first file that records a GPU's name
    for f in loaded:
        key = (f.device_key, f.problem().key)
        other = seen.setdefault(key, f)
        if other is not f and not other.digests & f.digests and "file name" in (f.device_named_by, other.device_named_by):
            raise ConfigError(f"files=[...]: {other.path} and {f.path} both give device {f.device_key!r} for "
                              f"{key[1]} (named after the file name); name them with devices=[...]")
        other = named.setdefault(f.device_key, f) if f.device_name.strip() else f
        if other.device_name.strip() != f.device_name.strip():
            raise ConfigError(f"files=[...]: {other.path} (recorded on {other.device_name.strip()!r}) and {f.path} "
                              f"(recorded on {f.device_name.strip()!r}) both give device {f.device_key!r}: two GPUs in "
                              "one device; name them apart with devices=[...]")


@hydra.main(version_base="1.3", config_path="conf", config_name="kerneltuner")
def _import_app(cfg: DictConfig) -> None:
    mark_task_started(cfg)
    try:
        if cfg.files and not OmegaConf.is_list(cfg.files):
            raise ConfigError(f"files={cfg.files}: expected a list of Kernel Tuner cache files, e.g. files=[{cfg.files}]")
        files = list(cfg.files or [])
        if not files:
            raise ConfigError("no files given; use files=[A.json.gz,B.json.gz] (Kernel Tuner cache files)")
        for f in files:  # before the heavy imports
            if not isinstance(f, str) or not f:  # files=[1], [null], [[a]]: was a TypeError traceback
                raise ConfigError(f"files=[...]: {shown(f)} is not a file path; give paths, e.g. files=[A.json.gz]")
            if not Path(f).exists():
                raise ConfigError(f"files={f}: no such file")
        devices = _check_devices(files, OmegaConf.to_container(cfg.devices, resolve=True) if OmegaConf.is_list(cfg.devices)
                                 else cfg.devices)
        from zhantune.bench.recorded import load_kerneltuner
        from zhantune.storage import Store
        from zhantune.storage.ingest import import_files

        # all checked before writing
        loaded = [load_kerneltuner(Path(f), source="files", device=d) for f, d in zip(files, devices, strict=True)]
        _check_distinct(loaded)

        def imported(f: KernelTunerFile, name: str, added: int) -> None:  # each file's line as it is stored
            named = "" if f.device_named_by == "device_name" else (
                " (the device holding this recording, imported under another file name)" if f.adopted
                else f" (device named by {f.device_named_by})")
            print(f"{f.path}: {added:,} measurement(s) of device {f.device_key!r}{named} as study {name!r}"
                  + ("" if added else " (already imported)"))

        names = [name for name, _ in import_files(Store(cfg.storage.url), loaded, imported)]
        if loaded:  # a command that runs when pasted: the database too where it is not the default
            from zhantune.cli import override_arg
            from zhantune.config import StorageConfig
            from zhantune.redact import hide_password

            url = hide_password(cfg.storage.url)
            db = "" if url == StorageConfig.url else " " + override_arg("storage.url", url)
            print(f"its search history: python -m zhantune.compare html=report.html "
                  f"{override_arg('study', names[0])}{db} (study= takes a study's name or a part only it "
                  "has" + ("; put the database's password in place of ***" if url != cfg.storage.url else "") + ")")
    except UserError as e:
        user_error(e)
    except Exception as e:  # the database locked past the busy timeout, a full disk, an import beside this one
        from zhantune.storage.rerun import locked_out

        if (msg := locked_out(e, cfg.storage.url, concurrent=True)) is None:
            raise
        user_error(msg)


def main() -> None:
    run_app(_import_app)


if __name__ == "__main__":
    main()
