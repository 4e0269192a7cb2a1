"""Bad input through every entry point: one line naming the value, exit code 2, no traceback, the
database's bytes unchanged and no stray file. Each case was found by an attack on the entry points
(issue 16); the table-driven case list below is the regression net.

Tables are data: a table may set only allow-listed tuning knobs (zhantune.inductor.knobs); the
``cpp.march`` entry below would make gcc run a shell command if it reached Inductor.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zhantune.storage import Store

MLP = ["model=zhantune.models:mlp", "model_kwargs={d_model:64,hidden:128,layers:1}", "input_shapes=[[32,64]]"]
KEY = "((torch.float32, [32, 64], [64, 1]), (torch.float32, [64, 128], [1, 64]))+mm"
MARCH = {"template_id": "zhantune::config",
         "config_patch": {"max_autotune_gemm_backends": "CPP",
                          "cpp.march": "native -wrapper '/bin/sh,-c,touch pwned; exec \"$0\" \"$@\"'"}}


def _table(tmp: Path, entry: dict, name: str = "t.json", key: str = KEY) -> str:
    (tmp / name).write_text(json.dumps({key: [entry]}))
    return name


def _raw(tmp: Path, text: str) -> str:
    (tmp / "raw.json").write_text(text)
    return "raw.json"


def _deep(tmp: Path) -> str:
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return "deep.json"


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo.json")
    return "fifo.json"


def _kt_file(tmp: Path, name: str, time: object, truncate: bool = False, kernel_name: str = "k",
             device_name: str = "GPU", first: tuple[str, object] = ("1", 1), problem_size: list | None = None) -> str:
    """A small Kernel Tuner cache file with one entry of the given time (``first``: that entry's cache
    key and value of its parameter x)."""
    doc = {"device_name": device_name, "kernel_name": kernel_name, "problem_size": problem_size or [64],
           "tune_params_keys": ["x"],
           "tune_params": {"x": [1, 2]}, "objective": "time",
           "cache": {first[0]: {"x": first[1], "time": time, "times": [time, time]}, "2": {"x": 2, "time": 5.0, "times": [5.0]}}}
    raw = gzip.compress(json.dumps(doc).encode())
    (tmp / name).write_bytes(raw[: len(raw) // 2] if truncate else raw)
    return name


def _raw_kt(tmp: Path, tune_params: dict, cache: dict) -> str:
    """A Kernel Tuner file with these tune_params and cache, written by Python's json (which writes
    NaN and Infinity as such)."""
    doc = {"device_name": "GPU", "kernel_name": "k", "problem_size": [64], "tune_params_keys": list(tune_params),
           "tune_params": tune_params, "objective": "time", "cache": cache}
    (tmp / "raw_kt.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return "raw_kt.json.gz"


def _sql(db: Path, statement: str) -> str:
    """Run one statement on an SQLite file with plain sqlite3; returns the file's name."""
    con = sqlite3.connect(db)
    con.execute(statement)
    con.commit()
    con.close()
    return db.name


def _foreign_db(tmp: Path) -> str:
    return _sql(tmp / "app.db", "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")


def _optuna_named_db(tmp: Path) -> str:
    """Another program's table under one of Optuna's table names (its ``studies``, no ``study_id``)."""
    return _sql(tmp / "lab.db", "CREATE TABLE studies (id INTEGER PRIMARY KEY, title TEXT)")


def _newer_zhantune_db(tmp: Path) -> str:
    Store(f"sqlite:///{tmp}/newer.db").engine.dispose()
    return _sql(tmp / "newer.db", "UPDATE zt_alembic_version SET version_num = '9999'")


def _corrupt_db(tmp: Path) -> str:
    Store(f"sqlite:///{tmp}/corrupt.db").engine.dispose()
    with open(tmp / "corrupt.db", "r+b") as f:  # keep the header, garble pages 2-4 (schema and tables)
        f.seek(4096)
        f.write(b"\xa5" * 3 * 4096)
    return "corrupt.db"


def _newer_optuna(tmp: Path) -> str:
    return _sql(tmp / "zhantune.db", "UPDATE alembic_version SET version_num = 'v99.0.0.a'")


def _one_row_db(path: Path, study: str, size: int, params: dict, lookup_key: str | None, **row) -> None:
    """A zhantune database at ``path`` with one ok candidate of mm size^3 on a CPU 'cpu0' in ``study``."""
    store = Store(f"sqlite:///{path}")
    dev = store.device_id("cpu0", "cpu0", "cpu", {})
    prob = store.problem_id(f"mm[M={size},N={size},K={size}]:float32", op="mm",
                            shape={"M": size, "N": size, "K": size, "B": 1}, dtype="float32", activation=None,
                            weight_layout="kn", lookup_op="mm", lookup_key=lookup_key, flops=2 * size ** 3)
    store.add_measurement(study_id=store.study_id(study, {}), device_id=dev, problem_id=prob, kind="candidate",
                          status="ok", template_id=None, params=params, median_us=1.0, torch_version="2.13.0", **row)
    store.engine.dispose()


def _bad_source_db(tmp: Path) -> str:
    """A zhantune database whose one measurement sets cpp.march: db merge must not import it."""
    _one_row_db(tmp / "evil.db", "evil", 4, {"cpp.march": "native"}, KEY)
    return "evil.db"


def _good_source_db(tmp: Path) -> str:
    """A zhantune database with one ok row of an allowed knob: a source merge takes."""
    _one_row_db(tmp / "good.db", "good", 4, {"max_autotune_gemm_backends": "ATEN"}, KEY)
    return "good.db"


def _broken_source(statement: str, knob: dict | None = None):
    """A setup: sources good.db (fine) and bad.db, one ok row each, ``statement`` run on bad.db with
    plain sqlite3 (``knob``: bad.db's row sets it); both are checked before the first is merged."""
    def setup(tmp: Path) -> str:
        _one_row_db(tmp / "good.db", "good", 4, {"max_autotune_gemm_backends": "ATEN"}, KEY)
        _one_row_db(tmp / "bad.db", "bad", 4, knob or {"max_autotune_gemm_backends": "ATEN"}, KEY)
        return _sql(tmp / "bad.db", statement)
    return setup


def _two_isas(tmp: Path) -> str:
    """Sources good.db and bad.db whose CPU 'cpu0' (one model name) was an AVX2 and an AVX-512 machine."""
    _broken_source("""update zt_device set properties = '{"isa": "AVX2"}'""")(tmp)
    _sql(tmp / "good.db", """update zt_device set properties = '{"isa": "AVX512"}'""")
    return "bad.db"


def _empty_first_source(tmp: Path) -> str:
    """Sources: an empty SQLite file (no tables), then bad.db (a device kind no run writes)."""
    _broken_source("update zt_device set kind = 'CPU'")(tmp)
    sqlite3.connect(tmp / "empty.db").close()
    return "empty.db"


def _bad_optuna_source(tmp: Path) -> str:
    """good.db, and bad.db whose Optuna study (named like its zhantune study) holds a parameter whose
    distribution does not decode: optuna.copy_study raised mid-merge."""
    import optuna

    _broken_source("select 1")(tmp)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp / 'bad.db'}")
    study = optuna.create_study(study_name="bad", storage=storage)
    study.tell(study.ask({"x": optuna.distributions.IntDistribution(1, 4)}), 1.0)
    storage.engine.dispose()  # else its open connection keeps the next write in the WAL file, not bad.db
    return _sql(tmp / "bad.db", "update trial_params set distribution_json = 'not json'")


def _other_problems_study(tmp: Path) -> str:
    """The existing database with a study named 'other' that measured mm 8x8x8."""
    _one_row_db(tmp / "zhantune.db", "other", 8, {"max_autotune_gemm_backends": "ATEN"}, None, trial_number=0)
    return "other"


def _two_kinds_db(tmp: Path) -> str:
    """A database with one mm 64^3 measured on a CPU (a C++ config patch) and on a GPU (a Triton entry)."""
    store = Store(f"sqlite:///{tmp / 'two.db'}")
    key = "((torch.float32, [64, 64], [64, 1]), (torch.float32, [64, 64], [64, 1]))+mm"
    triton = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}
    for dev, kind, template_id, params in (("cpu0", "cpu", None, {"max_autotune_gemm_backends": "CPP"}),
                                           ("NVIDIA H100", "cuda", "triton::mm", triton)):
        prob = store.problem_id("mm[M=64,N=64,K=64]:float32", op="mm", shape={"M": 64, "N": 64, "K": 64, "B": 1},
                                dtype="float32", activation=None, weight_layout="kn", lookup_op="mm", lookup_key=key,
                                flops=2 * 64 ** 3)
        store.add_measurement(study_id=store.study_id("s", {}), device_id=store.device_id(dev, dev, kind, {}),
                              problem_id=prob, kind="candidate", status="ok", template_id=template_id, params=params,
                              median_us=1.0, torch_version="2.13.0", lookup_key=f"{dev}+{key}" if template_id else None)
    store.engine.dispose()
    return "two.db"


def _file(tmp: Path) -> str:
    (tmp / "afile").write_text("x")
    return "afile"


class _Touch:
    """Unpickled, creates ``path`` (a file the case's listing would show)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _pickle(tmp: Path) -> str:
    import pickle

    (tmp / "config.pickle").write_bytes(pickle.dumps(_Touch(tmp / "pwned")))
    return "config.pickle"


def _link_loop(tmp: Path) -> str:
    (tmp / "loop1.yaml").symlink_to("loop2.yaml")
    (tmp / "loop2.yaml").symlink_to("loop1.yaml")
    return "loop1.yaml"


def _dir(tmp: Path) -> str:
    (tmp / "adir").mkdir()
    return "adir"


def _user_module(tmp: Path) -> str:
    """A user's model module in the working directory, with a bug in its factory and its forward,
    and one that raises when imported."""
    (tmp / "usermod.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef helper(n):\n    return nn.Linear(n, -n)\n\n\n"
        "class Fwd(nn.Module):\n\n    def forward(self, x):\n        return x @ torch.ones(3, 3) + self.missing\n\n\n"
        "def bad(n: int = 4):\n    return helper(n)\n\n\ndef fwd():\n    return Fwd()\n")
    (tmp / "usermod_at_import.py").write_text("raise RuntimeError('boom')\n")
    return "usermod"


# (id, module, arguments with {x} filled in by setup, setup, message, database checked unchanged)
CASES = [
    # a newcomer's mm with an activation tuned a plain mm (the activation dropped without a word)
    ("activation-on-mm", "zhantune", ["+op=mm", "op.activation=gelu", "shape=[4,4,4]", "device=cpu"], None,
     "op.activation='gelu' for op mm: only linear_act takes an activation (+op=linear_act op.activation=relu|gelu)",
     None),
    ("kernel-store-in-a-file", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "bench.kernel_store={x}/k"],
     _file, "bench.kernel_store=afile/k: cannot create", None),
    ("huge-shape", "zhantune", ["+op=mm", "shape=[1000000000,1000000000,1000000000]", "device=cpu"], None,
     "shape=[1000000000,1000000000,1000000000]: mm in float32 needs at least", None),
    ("mysql", "zhantune", ["+op=mm", "shape=[4,4,4]", "storage.url=mysql://u@localhost/db"], None,
     "the 'mysql' backend is not supported; use sqlite:///FILE or postgresql+psycopg", None),
    ("in-memory-export", "zhantune.export", ["storage.url=sqlite://"], None,
     "storage.url='sqlite://': an in-memory SQLite database keeps nothing", None),
    ("in-memory-compare", "zhantune.compare", ["storage.url=sqlite:///:memory:"], None,
     "storage.url='sqlite:///:memory:': an in-memory SQLite database keeps nothing", None),
    ("in-memory-merge-source", "zhantune.db", ["merge", "sources=[sqlite://]"], None,
     "sources[0]='sqlite://': an in-memory SQLite database keeps nothing", None),
    # SQLite deletes w.db's -wal file when w.db is opened, zhantune its schema lock after a merge
    ("database-named-as-a-wal-file", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "storage.url=sqlite:///w.db-wal"],
     None, "storage.url=sqlite:///w.db-wal: w.db-wal is the name of the '-wal' file of w.db", None),
    ("database-named-as-a-lock-file", "zhantune.db", ["upgrade", "storage.url=sqlite:///w.db.zt-lock"],
     None, "w.db.zt-lock is the name of the '.zt-lock' file of w.db", None),
    # a password is never printed (the generic test also checks that "s3cret" appears nowhere)
    ("db-current-unreachable-server", "zhantune.db", ["current", "storage.url=postgresql+psycopg://u:s3cret@127.0.0.1:1/db"],
     None, "storage.url=postgresql+psycopg://u:***@127.0.0.1:1/db: cannot open the database", None),
    # a helper's: libpq then used the database named as the user (the maintenance database 'postgres')
    ("postgres-url-without-a-database", "zhantune.export", ["storage.url=postgresql+psycopg://u:s3cret@127.0.0.1:1/"],
     None, "storage.url='postgresql+psycopg://u:***@127.0.0.1:1/': no database name", None),
    ("merge-unreachable-source", "zhantune.db", ["merge", "sources=[postgresql+psycopg://u:s3cret@127.0.0.1:1/db]"], None,
     "sources[0]=postgresql+psycopg://u:***@127.0.0.1:1/db: cannot open the database", None),
    ("export-unreachable-server", "zhantune.export", ["storage.url=postgresql+psycopg://u:s3cret@127.0.0.1:1/db"], None,
     "storage.url=postgresql+psycopg://u:***@127.0.0.1:1/db: cannot open the database", None),
    ("compare-unreachable-server", "zhantune.compare", ["storage.url=postgresql://u:s3cret@127.0.0.1:1/db"], None,
     "storage.url=postgresql://u:***@127.0.0.1:1/db: cannot open the database", None),
    ("optuna-schema-newer", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu"], _newer_optuna,
     "Optuna's tables are at schema 'v99.0.0.a'", "{x}"),
    ("upgrade-foreign", "zhantune.db", ["upgrade", "storage.url=sqlite:///{x}"], _foreign_db,
     "not a zhantune database (it has tables users)", "{x}"),
    # a table named as one of Optuna's but another program's (an attack, session 42): the tune wrote 20
    # tables beside it and failed with a traceback; the import and upgrade made it a zhantune database
    ("tune-table-named-as-optunas", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "storage.url=sqlite:///{x}"],
     _optuna_named_db, "not a zhantune database (it has tables studies (not Optuna's)); left untouched", "{x}"),
    ("upgrade-table-named-as-optunas", "zhantune.db", ["upgrade", "storage.url=sqlite:///{x}"], _optuna_named_db,
     "not a zhantune database (it has tables studies (not Optuna's)); left untouched", "{x}"),
    # an SQLite driver zhantune does not install (aiosqlite): was a ModuleNotFoundError traceback
    ("tune-sqlite-driver", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "storage.url=sqlite+aiosqlite:///a.db"],
     None, "storage.url='sqlite+aiosqlite:///a.db': SQLite through Python's sqlite3 module: sqlite:///FILE (not the "
     "'aiosqlite' driver)", None),
    ("upgrade-newer", "zhantune.db", ["upgrade", "storage.url=sqlite:///{x}"], _newer_zhantune_db,
     "schema revision '9999' is newer than this zhantune knows", "{x}"),
    ("upgrade-corrupt", "zhantune.db", ["upgrade", "storage.url=sqlite:///{x}"], _corrupt_db,
     "fails SQLite's integrity check", "{x}"),
    ("current-corrupt", "zhantune.db", ["current", "storage.url=sqlite:///{x}"], _corrupt_db,
     "fails SQLite's integrity check", "{x}"),
    # a merge's target lock (zhantune.storage.locks) is taken before the target is opened: a lock file that
    # cannot be made was a FileNotFoundError traceback
    ("merge-target-lock-file-unmakeable", "zhantune.db", ["merge", "sources=[sqlite:///{x}]", "storage.url=sqlite:////proc/x.db"],
     _good_source_db, "storage.url=sqlite:////proc/x.db: cannot open the database: its lock file /proc/x.db.zt-lock", None),
    ("merge-missing-source", "zhantune.db", ["merge", "sources=[sqlite:///missing.db]"], None,
     "sources[0]=sqlite:///missing.db: no database at missing.db", None),
    ("merge-disallowed-knob", "zhantune.db", ["merge", "sources=[sqlite:///{x}]"], _bad_source_db,
     "params.cpp.march: 'cpp.march' is not a tuning knob zhantune allows on cpu", "{x}"),
    # a source merge_into cannot copy whole, or whose rows no run writes: refused before the good
    # first source is merged (the JSON one merged good.db, then failed with a traceback)
    ("merge-undecodable-json", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_study set config = 'not json'"),
     "sources[1]=sqlite:///bad.db: study 1: config 'not json' is not a JSON object; nothing was merged", None),
    # a JSON value of the wrong kind decodes, then failed where it was used (AttributeError in merge)
    ("merge-device-properties-not-an-object", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_device set properties = '\"x\"'"),
     "sources[1]=sqlite:///bad.db: device 1: properties '\"x\"' is not a JSON object; nothing was merged", None),
    # an edited database in the readers: JSONDecodeError, ValueError or 'no such table' tracebacks, a tune's after
    # its study was marked running
    # an attack's findings: a table its own loader refused was written (exit 0, the old file replaced), and an
    # Inductor-format table of CPU and GPU keys that no load of either kind could read
    ("export-torch-version-not-a-version", "zhantune.export", ['torch_version="2.13.0+cpu x"'], None,
     "torch_version='2.13.0+cpu x': expected a torch release such as '2.13.0+cpu'", None),
    # a helper's: these said "nothing to export ... with torch abc", or were stamped into the table
    ("export-torch-version-a-word", "zhantune.export", ["torch_version=abc"], None,
     "torch_version='abc': expected a torch release such as '2.13.0+cpu'", None),
    ("export-torch-version-two-local-labels", "zhantune.export", ["torch_version=2.13.0+cpu+x"], None,
     "torch_version='2.13.0+cpu+x': expected a torch release such as '2.13.0+cpu'", None),
    # a helper's: an empty path was "path=.: cannot write: Device or resource busy", in a tune after its search
    ("export-empty-path", "zhantune.export", ['path=""'], None, "path='': expected a file name", None),
    ("tune-empty-export-path", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", 'export.path=""'], None,
     "export.path='': expected a file name", None),
    ("export-inductor-format-two-kinds", "zhantune.export",
     ["path=e.json", "format=inductor", "min_speedup=null", "storage.url=sqlite:///{x}"], _two_kinds_db,
     "format=inductor: the table holds keys of 1 cpu and 1 cuda device(s), and Inductor's format names no key's kind",
     None),
    ("export-edited-params", "zhantune.export", ["path=e.json", "storage.url=sqlite:///{x}"],
     _broken_source("update zt_measurement set params = '[1,2]'"),
     "storage.url=sqlite:///bad.db: measurement 1: params '[1,2]' is not a JSON object; no zhantune run writes it", None),
    ("compare-edited-date", "zhantune.compare", ["storage.url=sqlite:///{x}"],
     _broken_source("update zt_measurement set created_at = 'yesterday'"),
     "storage.url=sqlite:///bad.db: measurement 1: created_at 'yesterday' is not a date; no zhantune run writes it",
     None),
    ("tune-dropped-table", "zhantune", ["+op=mm", "shape=[4,4,4]", "storage.url=sqlite:///{x}"],
     _broken_source("drop table zt_claim"),
     "storage.url=sqlite:///bad.db: table zt_claim of schema revision 0009 is missing; no zhantune run drops it", None),
    ("merge-dangling-device", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_measurement set device_id = 99", {"cpp.march": "native"}),
     "sources[1]=sqlite:///bad.db: measurement 1: device_id 99 names no row", None),
    ("merge-knob-under-another-op", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_problem set op = 'MM'", {"cpp.march": "native"}),
     "sources[1]=sqlite:///bad.db: measurement 1: params.cpp.march:", None),
    ("merge-forged-lookup-key", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_problem set lookup_key = '((x)),)+mm' || char(10) || 'FORGED LINE'"),
     'sources[1]=sqlite:///bad.db: problem 1: lookup_key "((x)),)+mm\\nFORGED LINE" is not a device-agnostic', None),
    ("merge-shape-not-integers", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("""update zt_problem set shape = '{"M":4,"N":4,"K":"abc","B":1}'"""),
     "sources[1]=sqlite:///bad.db: problem 1: shape {", None),
    ("merge-forged-default-row-key", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_measurement set kind = 'default', lookup_key = 'cpu0+((x)),)+mm' || char(10) || 'X'"),
     'sources[1]=sqlite:///bad.db: measurement 1: lookup_key "cpu0+((x)),)+mm\\nX" is not an Inductor lookup key', None),
    ("merge-device-key-forges-a-line", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_device set key = 'cpu0' || char(10) || 'hit x1'"),
     'sources[1]=sqlite:///bad.db: device 1: key "cpu0\\nhit x1" is not one line', None),
    ("merge-undecodable-optuna-study", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _bad_optuna_source, "sources[1]=sqlite:///bad.db: Optuna's tables: a stored value does not decode", None),
    ("merge-empty-source", "zhantune.db", ["merge", "sources=[sqlite:///{x},sqlite:///bad.db]"], _empty_first_source,
     "sources[0]=sqlite:///empty.db: holds no zhantune tables, nothing to merge", None),
    # an attack's findings: a row's lookup key edited to another GEMM's shipped its config and claim under
    # that key; one CPU model name's AVX2 and AVX-512 machines were joined (the other's claim hit here)
    ("merge-measurement-key-of-another-gemm", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_measurement set lookup_key = 'cpu0+((torch.float32, [4096, 4096], [4096, 1]), "
                    "(torch.float32, [4096, 4096], [4096, 1]))+mm'"),
     "sources[1]=sqlite:///bad.db: measurement 1: lookup_key \"cpu0+((torch.float32, [4096, 4096], [4096, 1]), "
     "(torch.float32, [4096, 4096], [4096, 1]))+mm\" is not a lookup of its problem's GEMM", None),
    ("merge-one-cpu-name-two-isas", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"], _two_isas,
     "sources[1]: device \"cpu0\" is a CPU with vector ISA 'AVX2' there and 'AVX512' in sources[0] (one model name, "
     "two kinds of machine): nothing was merged", None),
    ("merge-device-kind", "zhantune.db", ["merge", "sources=[sqlite:///good.db,sqlite:///{x}]"],
     _broken_source("update zt_device set kind = 'CPU'"),
     'sources[1]=sqlite:///bad.db: device 1: kind "CPU" is not cpu or cuda', None),
    ("export-path-dir", "zhantune.export", ["path={x}"], _dir, "path=adir: is a directory", None),
    ("tune-export-path-under-file", "zhantune", ["+op=mm", "shape=[4,4,4]", "export.path={x}/t.json"], _file,
     "export.path=afile/t.json: afile is not a directory", None),
    # an output file never replaces a database (issue: export path=zhantune.db wrote JSON over it)
    ("export-path-is-the-database", "zhantune.export", ["path=zhantune.db"], None,
     "path=zhantune.db: zhantune.db is an SQLite database", None),
    ("compare-csv-is-the-database", "zhantune.compare", ["csv=zhantune.db"], None,
     "csv=zhantune.db: zhantune.db is an SQLite database", None),
    ("collect-out-is-a-database", "zhantune.collect", [*MLP, "out=zhantune.db"], None,
     "out=zhantune.db: zhantune.db is an SQLite database", None),
    ("tune-export-path-is-the-new-database", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu",
                                                          "storage.url=sqlite:///new.db", "export.path=new.db"], None,
     "export.path=new.db is the database of storage.url=sqlite:///new.db", None),
    ("tune-export-path-is-the-wal", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu",
                                                 "export.path=zhantune.db-wal"], None,
     "export.path=zhantune.db-wal: zhantune.db is an SQLite database", None),
    ("tune-export-path-is-the-new-databases-wal", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu",
                                                               "storage.url=sqlite:///new.db", "export.path=new.db-wal"],
     None, "export.path=new.db-wal is the database of storage.url=sqlite:///new.db", None),
    # one study tunes one problem: another problem's study is not resumed, counted or fed to the sampler
    ("study-name-of-another-problem", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "search.study_name={x}",
                                                   "search.n_trials=1", "export.enabled=false"], _other_problems_study,
     "search.study_name='other' is the study of mm[M=8,N=8,K=8]:float32, not of mm[M=4,N=4,K=4]:float32", None),
    # an output that is one of the command's inputs would replace it (a problems file, a table)
    ("table-over-problems-file", "zhantune", ["problems={x}", "export.path={x}"], _file,
     "export.path=afile: is the file of problems=afile, which this command reads", None),
    ("export-over-problems-file", "zhantune.export", ["problems={x}", "path=./{x}"], _file,
     "path=./afile: is the file of problems=afile, which this command reads", None),
    ("check-json-over-its-table", "zhantune.check", [*MLP, "table={x}", "json={x}"],
     lambda t: _table(t, {"template_id": "aten::mm"}), "json=t.json: is the file of table=t.json", None),
    ("problems-with-dtype", "zhantune", ["problems={x}", "dtype=bfloat16"], _file,
     "override dtype=bfloat16: problems= takes each problem's dtype and weight_layout from the file (afile)", None),
    ("problems-with-study-name", "zhantune", ["problems={x}", "search.study_name=s"], _file,
     "search.study_name='s' names one study; problems= tunes one study per problem", None),
    ("compare-html-dir", "zhantune.compare", ["html={x}"], _dir, "html=adir: is a directory", None),
    ("compare-study-without-html", "zhantune.compare", ["study=s"], None,
     "study=s: a study's history is drawn into the HTML report: give html=PATH too", None),
    # the -wal file of a database, not there yet: SQLite would take what is written there as its log
    ("compare-json-to-a-wal-to-be", "zhantune.compare", ["json=zhantune.db-wal"], None,
     "json=zhantune.db-wal: zhantune.db is an SQLite database", None),
    ("compare-csv-under-file", "zhantune.compare", ["csv={x}/c.csv"], _file,
     "csv=afile/c.csv: afile is not a directory", None),
    ("check-json-dir", "zhantune.check", [*MLP, "table={x}", "json=."],
     lambda t: _table(t, {"template_id": "aten::mm"}), "json=.: is a directory", None),
    ("collect-out-dir", "zhantune.collect", [*MLP, "out={x}"], _dir, "out=adir: is a directory", None),
    # collect's options, which check never reads, were taken and ignored (a newcomer's, session 51)
    ("check-collects-option", "zhantune.check", [*MLP, "measure=false"], None,
     "override measure=...: 'measure' is not an option (options: model, model_kwargs, input_shapes,", None),
    ("table-deep", "zhantune.check", [*MLP, "table={x}"], _deep, "JSON nested too deeply", None),
    ("table-dev-zero", "zhantune.check", [*MLP, "table=/dev/zero"], None,
     "/dev/zero: not a regular file", None),
    # a regular file whose read fails (as a failing disk's): was OSError's traceback, exit 1
    ("table-read-fails", "zhantune.check", [*MLP, "table=/proc/self/mem"], None,
     "/proc/self/mem: cannot read: Input/output error", None),
    # under the size cap, but 1.7 GB as Python lists: refused before it is parsed
    ("table-many-lists", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _raw(t, f'{{"{KEY}": [' + ",".join(["[]"] * 2_100_000) + "]}"),
     "more than 2,000,000 '[' and '{' characters; a lookup table has a few per GEMM", None),
    ("table-fifo", "zhantune.check", [*MLP, "table={x}"], _fifo, "fifo.json: not a regular file", None),
    # a newcomer's database given as the table: the message named neither the option nor what a table is
    ("table-is-a-database", "zhantune.check", [*MLP, "table={x}"],
     lambda t: (t / "zhantune.db").write_bytes(b"SQLite format 3\x00\xff\xfe\x00") and "zhantune.db",
     "table=zhantune.db: not a UTF-8 text file; a table is JSON (python -m zhantune.export writes one)", None),
    ("table-dir", "zhantune.check", [*MLP, "table={x}"], _dir, "table=adir: is a directory; give a file", None),
    ("table-huge-int", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _raw(t, f'{{"{KEY}": [{{"template_id": "triton::mm", "BLOCK_M": {"1" * 5000}}}]}}'),
     "raw.json: not a table: an integer of over 4,300 digits (a tuning knob's value is at most a few)", None),
    ("table-duplicate-key", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _raw(t, f'{{"{KEY}": [{{"template_id": "zhantune::config", "config_patch": {{"cpp.march": "native"}}, '
                    '"config_patch": {}}]}'),
     'raw.json: key "config_patch" appears twice in one JSON object', None),
    ("table-torch-forges-lines", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _raw(t, json.dumps({"format": "zhantune-lookup-table", "format_version": 1,
                                   "torch": "2.13.0\n[green]hit[/green] x1\ncoverage 100%: ok\x1b[8m",
                                   "table": {KEY: [{"template_id": "aten::mm"}]}})),
     "raw.json: torch: expected a version such as '2.13.0+cpu'", None),
    ("table-key-forges-a-line", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _raw(t, json.dumps({"cpu0\nhit x1 " + KEY: [{"template_id": "aten::mm"}]})),
     'raw.json: ["cpu0\\nhit x1 ', None),
    # Hydra's override grammar takes no newline: its error, on one line like every other
    ("table-path-with-a-newline", "zhantune.check", [*MLP, "table={x}"],
     lambda t: (t / "a\nb.json").write_text("[]") and "a\nb.json", "override table=a\\nb.json: ", None),
    ("table-unknown-knob", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _table(t, {"template_id": "zhantune::config", "config_patch": {"cpp.no_such_key": 1}}),
     "config_patch.cpp.no_such_key: 'cpp.no_such_key' is not a tuning knob zhantune allows on cpu", None),
    ("table-bad-value", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _table(t, {"template_id": "zhantune::config", "config_patch": {"cpp.gemm_max_k_slices": -3}}),
     "cpp.gemm_max_k_slices=-3 is not allowed; expected an integer in [0, 4096]", None),
    ("table-code-in-template-kwarg", "zhantune.check", [*MLP, "table={x}"],
     lambda t: _table(t, {"template_id": "triton::mm", "ACC_TYPE": "tl.float32; import os"}),
     ".ACC_TYPE: 'ACC_TYPE' is not a kwarg zhantune allows in a triton::mm entry", None),
    ("import-infinite-parameter-value", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _raw_kt(t, {"x": [1, float("inf")]}, {"1": {"x": 1, "time": 1.0}, "inf": {"x": float("inf"), "time": 2.0}}),
     "tune_params.x holds inf; a parameter's values are finite numbers", None),
    ("replay-truncated-gzip", "zhantune", ["bench=replay", "bench.path={x}"],
     lambda t: _kt_file(t, "trunc.json.gz", 4.0, truncate=True), "the compressed file is truncated", None),
    ("replay-negative-time", "zhantune", ["bench=replay", "bench.path={x}"],
     lambda t: _kt_file(t, "neg.json.gz", -4.0), "cache.1.time=-4.0; a recorded time is a positive, finite number",
     None),
    # a 5,000-digit integer: Python's int() refuses it (ValueError), one line, not a traceback
    ("import-5000-digit-integer", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: (t / "bigint.json").write_text('{"problem_size": [' + "9" * 5000 + ']}') and "bigint.json",
     "bigint.json: not a Kernel Tuner cache file (JSON): Exceeds the limit", None),
    ("import-duplicate-cache-key", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: (t / "dup.json").write_text('{"cache": {"1": {"time": 1.0}, "1": {"time": 9.0}}}') and "dup.json",
     "dup.json: not a Kernel Tuner cache file (JSON): key \"1\" appears twice in one JSON object", None),
    # a FIFO as an input file would block its reader (Ctrl-C deferred there): refused before it is opened
    ("problems-fifo", "zhantune", ["problems={x}"], _fifo, "problems=fifo.json: not a regular file", None),
    ("export-problems-fifo", "zhantune.export", ["problems={x}"], _fifo, "problems=fifo.json: not a regular file",
     None),
    ("replay-table-fifo", "zhantune.replay", ["table={x}"], _fifo, "table=fifo.json: not a regular file", None),
    ("total-trials-without-problems", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.total_trials=5"], None,
     "search.total_trials=5 shares trials among the problems of a problems= file; one problem takes search.n_trials",
     None),
    # a helper's 400-digit size and count (session 46): an OverflowError in the memory check and the shares
    ("shape-of-400-digits", "zhantune", ["+op=mm", "shape=[64,64," + "9" * 400 + "]", "device=cpu"], None,
     "K is 400 digits; a tensor's size is at most 9223372036854775807 (int64)", None),
    ("problems-count-of-400-digits", "zhantune", ["problems={x}", "device=cpu"],
     lambda t: (t / "c.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: mm, shape: [16, 16, 16], "
                                         "count: " + "9" * 400 + "}\n") and "c.yaml",
     "c.yaml: problems[0].count: 400 digits; a positive integer of at most 9223372036854775807", None),
    ("problems-file-over-1-mib", "zhantune", ["problems={x}"],
     lambda t: (t / "big.yaml").write_text("format: zhantune-problems\n" + "#" * (1 << 20)) and "big.yaml",
     "problems=big.yaml: 1,048,602 bytes, over the 1 MiB a problems file may hold", None),
    # numbers no float holds or no measurement takes: one line, not an OverflowError (nothing written)
    ("import-huge-time", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "huge.json.gz", 1e306), "cache.1.time=1e+306; a recorded time is a positive, finite "
     "number of milliseconds up to 1e+09", None),
    # names the database's columns do not hold (PostgreSQL refused them with a traceback, SQLite not)
    ("import-long-kernel-name", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "k101.json.gz", 4.0, kernel_name="k" * 101),
     "kernel_name 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkk'... (101 characters); the database holds names of at most 100",
     None),
    ("replay-long-problem-key", "zhantune", ["bench=replay", "bench.path={x}"],
     lambda t: _kt_file(t, "size.json.gz", 4.0, problem_size=[10**9] * 60),
     "its problem key would be 'kerneltuner:k[1000000000x1000... (676 characters); the database holds at most 512",
     None),
    ("import-long-file-name", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "f" * 240 + ".json.gz", 4.0, device_name="D" * 250),
     "its study name would be 'kerneltuner:fffffffffffffffff... (534 characters)", None),
    # a replay's problem is its file's: another problem named beside it was silently not tuned
    ("replay-with-problems-file", "zhantune", ["bench=replay", "bench.path={x}", "problems=p.yaml"],
     lambda t: _kt_file(t, "p.json.gz", 4.0), "bench=replay replays the one problem of bench.path's file "
     "(its kernel_name and problem_size): drop problems=", None),
    ("replay-with-op-and-shape", "zhantune", ["bench=replay", "bench.path={x}", "+op=mm", "shape=[8,8,8]"],
     lambda t: _kt_file(t, "o.json.gz", 4.0), "drop +op=", None),
    ("replay-long-device-name-option", "zhantune", ["bench=replay", "bench.path={x}", "bench.device_name=" + "G" * 257],
     lambda t: _kt_file(t, "g.json.gz", 4.0), "device name (from bench.device_name) 'GGGGGGGGGGGGGGGGGGGGGGGGGGGGGG'... "
     "(257 characters); the database holds names of at most 256 characters without control, format or surrogate "
     "characters; name the device with bench.device_name=NAME", None),
    # text that neither the database nor a terminal holds as it is (a traceback, or two devices that
    # print alike): surrogates (not UTF-8), format characters (a right-to-left override), C1 controls
    ("import-surrogate-in-device-name", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "sur.json.gz", 4.0, device_name="G\ud800"),
     "device name (from device_name) 'G\\ud800' (2 characters); the database holds names of at most 256 "
     "characters without control, format or surrogate characters", None),
    ("import-rtl-override-in-devices", "zhantune.kerneltuner", ["files=[{x}]", "devices=['A\u202eB']"],
     lambda t: _kt_file(t, "rlo.json.gz", 4.0), "device name (from devices) 'A\\u202eB'", None),
    ("replay-c1-control-in-kernel-name", "zhantune", ["bench=replay", "bench.path={x}"],
     lambda t: _kt_file(t, "c1.json.gz", 4.0, kernel_name="k\x85"), "kernel_name 'k\\x85'", None),
    ("replay-study-name-too-long", "zhantune", ["bench=replay", "bench.path={x}", "search.study_name=" + "s" * 513],
     lambda t: _kt_file(t, "sn.json.gz", 4.0), "search.study_name='ssssssssssssssssssssssssssssss'... (513 "
     "characters): a study's name is 1 to 512 characters", None),
    ("replay-pace-nan", "zhantune", ["bench=replay", "bench.path={x}", "bench.replay_pace=nan"],
     lambda t: _kt_file(t, "nan.json.gz", 4.0), "bench.replay_pace=nan is not a number; allowed: 0 to 1000", None),
    # a value set by a command-line override was blamed on the shipped file alone (an attack, session 42)
    ("space-override-empty-choices", "zhantune.space", ["+op=mm", "shape=[4,4,4]", "device=cpu", "space=[cpp_gemm]",
                                                        "space.cpp_gemm.branches.cpp_gemm.params.k_slices.choices=[]"],
     None, "cpp_gemm.yaml as changed by the command line's override of space.cpp_gemm: "
     "branches.cpp_gemm.params.k_slices.choices: must be a non-empty list, got []", None),
    ("tune-no-spaces", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu", "space=[]"], None,
     "override space=[]: no space named; give space=[name,...] (allowed: aten, ", None),
    ("compare-no-devices", "zhantune.compare", ["devices=[]"], None,
     "devices=[]: no device named; give device keys, names or numbers (devices=[A,B]), or drop devices=", None),
    # the dry run showed the H100's spaces for device=cpu device_profile=H100 (an attack, session 42)
    ("space-profile-and-cpu", "zhantune.space", ["+op=mm", "shape=[4,4,4]", "device=cpu", "device_profile=H100"], None,
     "device_profile=H100 previews a GPU; device=cpu asks for another device: give one of them", None),
    # a space value no table may carry: measured, then refused by export and by db merge (whole database)
    ("space-num-warps-3", "zhantune.space", ["+op=mm", "shape=[4096,4096,4096]", "dtype=bfloat16", "device_profile=H100",
                                             "space=[triton_mm]", "~space.triton_mm.branches.triton_mm.params.num_warps",
                                             "+space.triton_mm.branches.triton_mm.params.num_warps={choices:[4,3]}"],
     None, "branches.triton_mm: num_warps=3: a template kwarg is one of 1, 2, 4, 8, 16, 32", None),
    ("collect-inputs-over-memory", "zhantune.collect", ["model=zhantune.models:mlp", "input_shapes=[[10000000,10000000]]",
                                                        "out=p.yaml", "device=cpu"], None,
     "input_shapes=[[10000000, 10000000]]: the inputs need 372,529.0 GiB", None),
    ("collect-weights-over-memory", "zhantune.collect", ["model=zhantune.models:mlp", "model_kwargs={d_model:10000000000}",
                                                         "input_shapes=[[4,4]]", "out=p.yaml", "device=cpu"], None,
     "model_kwargs={'d_model': 10000000000}: its weights do not fit in memory", None),
    # the driver's arguments: ?timeout=abc was a ValueError traceback from the engine, in every app
    ("sqlite-query-argument", "zhantune.export", ["path=e.json", "storage.url='sqlite:///zhantune.db?timeout=abc'"],
     None, "storage.url='sqlite:///zhantune.db?timeout=abc': a query parameter does not read as the SQLite driver's "
     "argument (could not convert string to float: 'abc'); e.g. ?timeout=30 (seconds), or none", None),
    ("sqlite-query-argument-source", "zhantune.db", ["merge", "sources=['sqlite:///zhantune.db?timeout=abc']",
                                                     "storage.url=sqlite:///m.db"], None,
     "sources[0]='sqlite:///zhantune.db?timeout=abc': a query parameter does not read", None),
    ("sqlite-uri-filename", "zhantune.db", ["current", "storage.url=\"sqlite:///file:x.db?uri=true\""], None,
     "SQLite URI filenames (file:...?uri=true) are not supported", None),
    # each run's own database in its run folder: a resume measured everything again
    ("hydra-job-chdir", "zhantune.db", ["current", "storage.url=sqlite:///x.db", "hydra.job.chdir=true"], None,
     "override hydra.job.chdir=true: zhantune reads and writes paths", None),
    ("import-file-not-a-path", "zhantune.kerneltuner", ["files=[1]"], None,
     "files=[...]: 1 is not a file path; give paths", None),
    ("import-file-a-list", "zhantune.kerneltuner", ["files=[[a]]"], None,
     "files=[...]: ['a'] is not a file path; give paths", None),
    ("replay-table-missing", "zhantune.replay", ["device=cpu"], None, "no table given; use table=PATH", None),
    ("replay-table-empty", "zhantune.replay", ["device=cpu", "table="], None, "no table given; use table=PATH", None),
    # Hydra's two sentences on one line, the first ended by its full stop (it read ".; To append")
    ("op-without-plus", "zhantune", ["op=mm"], None,
     "Could not override 'op'. No match in the defaults list. To append to your default list use +op=mm", None),
    # Hydra's message for a mistyped key suggests the '+', which adds a key nothing reads (a newcomer's finding)
    # Hydra's message for a mistyped key advises the '+', which the next run refuses (a newcomer's finding)
    ("check-table-missing", "zhantune.check", [*MLP, "table=nope.json"], None, "table=nope.json: no such file", None),
    ("typo", "zhantune", ["+op=mm", "shape=[4,4,4]", "serch.n_trials=4"], None,
     "override serch.n_trials=...: 'serch' is not an option; did you mean search? (options: op, shape,", None),
    # a launcher's option (a newcomer's, session 51: Hydra's advice, '+', took submitit to a traceback)
    ("typo-launcher", "zhantune", ["-m", "hydra/launcher=submitit_local", "+op=mm", "shape=[4,4,4]",
                                   "hydra.launcher.timeout_mn=5"], None,
     "override hydra.launcher.timeout_mn=...: 'hydra.launcher.timeout_mn' is not an option of hydra.launcher; did "
     "you mean hydra.launcher.timeout_min? (options of hydra.launcher: submitit_folder, timeout_min,", None),
    # '+' adds a keyword the basic launcher's class does not take: Hydra's "Error in call to target", exit 1,
    # and a summary of "a job's failure" when no job had started (session 53)
    ("plus-basic-launcher", "zhantune", ["-m", "+op=mm", "shape=[4,4,4]", "+hydra.launcher.foo=5"], None,
     "hydra.launcher.foo: not an option of the launcher (hydra._internal.core_plugins.basic_launcher.BasicLauncher); "
     "it takes no option", None),
    # Hydra's own options (a review's: Hydra's sentence, advising '+')
    ("typo-hydra-run", "zhantune", ["+op=mm", "shape=[4,4,4]", "hydra.run.dirr=x"], None,
     "override hydra.run.dirr=...: 'hydra.run.dirr' is not an option of hydra.run; did you mean hydra.run.dir? "
     "(options of hydra.run: dir)", None),
    ("typo-hydra-sweeper", "zhantune", ["-m", "+op=mm", "shape=[4,4,4]", "hydra.sweeper.foo=1"], None,
     "override hydra.sweeper.foo=...: 'hydra.sweeper.foo' is not an option of hydra.sweeper (options of "
     "hydra.sweeper: max_batch_size, params)", None),
    # a misspelt launcher: Hydra's list of the group's options was dropped with its indented lines
    ("launcher-name", "zhantune", ["-m", "hydra/launcher=submitit_lcoal", "+op=mm", "shape=[4,4,4]"], None,
     "Could not find 'hydra/launcher/submitit_lcoal'; Available options in 'hydra/launcher': basic, submitit_local, "
     "submitit_slurm", None),
    ("typo-nested-export", "zhantune.export", ["pth=x.json"], None,
     "override pth=...: 'pth' is not an option; did you mean path? (options: enabled, path,", None),
    ("plus-typo", "zhantune", ["+op=mm", "shape=[4,4,4]", "+serch.n_trials=4"], None,
     "override +serch.n_trials=...: 'serch' is not an option, and nothing would read it; options: op, shape,", None),
    ("plus-plus-typo-nested", "zhantune", ["+op=mm", "shape=[4,4,4]", "++search.n_trails=4"], None,
     "override ++search.n_trails=...: 'search.n_trails' is not an option of search, and nothing would read it; "
     "options of search: ", None),
    # a resolver's argument is not a key (a review's finding: ${oc.env:PW} let +PW=... pass)
    ("plus-typo-read-by-a-resolver", "zhantune", ["+op=mm", "shape=[4,4,4]", "+HOME=x",
                                                  "storage.url=sqlite:///${oc.env:HOME}/x.db"], None,
     "override +HOME=...: 'HOME' is not an option, and nothing would read it", None),
    ("plus-typo-collect", "zhantune.collect", ["model=zhantune.models:mlp", "input_shapes=[[4,64]]", "+outt=p.yaml"],
     None, "override +outt=...: 'outt' is not an option, and nothing would read it; options: model,", None),
    # Hydra's rerun unpickles the file (a pickle runs code: here it would create 'pwned'), any prefix of the option too
    ("experimental-rerun", "zhantune", ["--experimental-rerun", "{x}"], _pickle,
     "--experimental-rerun: Hydra's rerun unpickles the file it names", None),
    ("experimental-rerun-prefix", "zhantune.export", ["--exp={x}"], _pickle,
     "--experimental-rerun: Hydra's rerun unpickles the file it names", None),
    # os.access says yes to root for /proc (and a read-only mount): the write failed at the end, with a traceback
    ("export-path-in-proc", "zhantune.export", ["path=/proc/x.json"], None,
     "path=/proc/x.json: cannot create a file in /proc" if os.geteuid() == 0 else "path=/proc/x.json: directory /proc "
     "is not writable", None),
    # raised through Hydra before the task, or when the sweeper made its directory: tracebacks (exit 1)
    ("hydra-option-unset-variable", "zhantune.db", ["current", "hydra.output_subdir=${oc.env:ZT_UNSET_DIR}"], None,
     "Hydra's setup failed: hydra.output_subdir: InterpolationResolutionError: KeyError raised while resolving "
     "interpolation: \"Environment variable 'ZT_UNSET_DIR' not found\"", None),
    ("sweep-dir-under-a-file", "zhantune", ["-m", "bench=replay", "bench.path={x}", "search.seed=0,1",
                                            "hydra.sweep.dir=afile/x"],
     lambda t: (_file(t), _kt_file(t, "k_GPU.json.gz", 4.0))[1],
     "hydra.sweep.dir=afile/x: afile is not a directory this user can write in; give hydra.sweep.dir=DIR", None),
    # argparse's 8 lines of usage before its error
    ("argparse-bad-choice", "zhantune", ["--cfg", "nope"], None,
     "argument --cfg/-c: invalid choice: 'nope' (choose from 'job', 'hydra', 'all'); --help lists the options", None),
    ("argparse-unknown-flag", "zhantune.export", ["--nope"], None,
     "unrecognized arguments: --nope; --help lists the options", None),
    # Hydra's own setup failing: its traceback had been joined into one line, four chained exceptions long
    ("hydra-run-dir-is-a-file", "zhantune.db", ["current"], lambda t: ((t / "hydra").write_text("x"), "")[1],
     "Hydra's setup failed: FileExistsError: [Errno 17] File exists: ", None),
    ("hydra-logging-level", "zhantune.db", ["current", "hydra.job_logging.root.level=NOPE"], None,
     "Hydra's setup failed: ValueError: Unable to configure root logger (ValueError: Unknown level: 'NOPE')", None),
    # a loop of symbolic links: Path.resolve's RuntimeError traceback (Python 3.11) in the output path's check
    ("problems-link-loop", "zhantune", ["problems={x}"], _link_loop,
     "problems=loop1.yaml: a symbolic link to nothing (or a loop of links)", None),
    ("export-path-link-loop", "zhantune.export", ["path={x}", "problems=loop2.yaml"], _link_loop,
     "path=loop1.yaml: is a loop of symbolic links; give a file name", None),
    # a later job of a sweep: Hydra's 6-line error (exit 1), or a refusal once the earlier jobs had measured and stored
    ("sweep-wrong-type", "zhantune", ["-m", "bench=replay", "bench.path={x}", "search.seed=0,abc"],
     lambda t: _kt_file(t, "k_GPU.json.gz", 4.0),
     "sweep job #1 (search.seed=abc): Error merging override search.seed=abc; Value 'abc' of type 'str' could not "
     "be converted to Integer", None),
    ("sweep-checked-value", "zhantune", ["-m", "bench=replay", "bench.path={x}", "search.seed=0,-1"],
     lambda t: _kt_file(t, "k_GPU.json.gz", 4.0), "sweep job #1 (search.seed=-1): search.seed=-1 must be in", None),
    ("sweep-interpolation", "zhantune", ["-m", "bench=replay", "bench.path={x}", "search.n_trials=1,${nope}"],
     lambda t: _kt_file(t, "k_GPU.json.gz", 4.0),
     "sweep job #1 (search.n_trials=${nope}): override search.n_trials=${nope}: Interpolation key 'nope' not found",
     None),
    # a later job's file or database (an attack, session 42): job #0 measured and stored, then job #1 was refused
    ("sweep-missing-file", "zhantune", ["-m", "bench=replay", "bench.path={x},missing.json.gz", "search.n_trials=2"],
     lambda t: _kt_file(t, "k_GPU.json.gz", 4.0), "sweep job #1 (bench.path=missing.json.gz): bench.path=missing.json.gz: "
     "no such file", None),
    ("sweep-foreign-database", "zhantune", ["-m", "bench=replay", "bench.path={x}", "search.n_trials=2",
                                             "storage.url=sqlite:///fresh.db,sqlite:///app.db"],
     lambda t: (_foreign_db(t), _kt_file(t, "k_GPU.json.gz", 4.0))[1],
     "sweep job #1 (storage.url=sqlite:///app.db): storage.url=sqlite:///app.db: not a zhantune database", None),
    ("sweep-bad-problems-file", "zhantune", ["-m", "problems=good.yaml,bad.yaml", "device=cpu"],
     lambda t: ((t / "good.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: mm, shape: [16, 16, 16]}\n"),
                (t / "bad.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: mm, shape: [0, 16, 16]}\n"),
                "")[2], "sweep job #1 (problems=bad.yaml): bad.yaml: problems[0].shape", None),
    # what a job's run refuses, refused before the first job tunes (a helper's attack, session 46: job #1
    # refused after job #0 had tuned and stored)
    ("sweep-one-study-name-two-shapes", "zhantune", ["-m", "+op=mm", "shape=[16,16,16],[32,16,16]",
                                                     "search.study_name=s", "device=cpu"], None,
     "sweep job #1: search.study_name='s' is also job #0's, of another problem: one study tunes one problem", None),
    ("sweep-one-study-name-two-layouts", "zhantune", ["-m", "+op=mm", "shape=[16,16,16]", "weight_layout=kn,nk",
                                                      "search.study_name=s", "device=cpu"], None,
     "sweep job #1: search.study_name='s' is also job #0's, of another problem", None),
    # a shape beyond the machine's memory: job #1 failed after job #0 had tuned (a helper's)
    ("sweep-shape-beyond-memory", "zhantune", ["-m", "+op=mm", "shape=[16,16,16],[1000000000,1000000000,1000000000]",
                                               "device=cpu"], None,
     "sweep job #1 (shape=[1000000000,1000000000,1000000000]): shape=[1000000000,1000000000,1000000000]: mm in float32 "
     "needs at least", None),
    ("sweep-problems-beyond-memory", "zhantune", ["-m", "problems=s.yaml,b.yaml", "device=cpu"],
     lambda t: (t / "s.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: mm, shape: [16, 16, 16]}\n")
     and (t / "b.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: linear_act, shape: [300000, 300000, "
                                   "300000]}\n") and "",
     "sweep job #1 (problems=b.yaml): shape=[300000,300000,300000]: linear_act in float32 needs at least", None),
    ("sweep-total-trials-below-problems", "zhantune", ["-m", "problems=p.yaml", "search.total_trials=2,1", "device=cpu"],
     lambda t: (t / "p.yaml").write_text("format: zhantune-problems\nproblems:\n- {op: mm, shape: [16, 16, 16]}\n"
                                         "- {op: mm, shape: [32, 16, 16]}\n") and "",
     "sweep job #1 (search.total_trials=1): search.total_trials=1 is less than the 2 problems in p.yaml", None),
    # an interpolation that does not resolve: it was a Hydra traceback with exit code 1, from wherever it was read
    ("interpolation-missing-key", "zhantune", ["+op=mm", "shape=[4,4,4]", "dtype=${nope}"], None,
     "override dtype=${nope}: Interpolation key 'nope' not found; an interpolation reads a key of this config", None),
    ("interpolation-unset-variable", "zhantune.db", ["current", "storage.url=sqlite:///${oc.env:ZT_UNSET_VAR}/x.db"],
     None, "override storage.url=sqlite:///${oc.env:ZT_UNSET_VAR}/x.db: KeyError raised while resolving "
     "interpolation: \"Environment variable 'ZT_UNSET_VAR' not found\"", None),
    ("interpolation-wrong-type", "zhantune.space", ["+op=mm", "shape=[4,4,4]", "search.n_trials=${dtype}"], None,
     "override search.n_trials=${dtype}: While dereferencing interpolation '${dtype}': Value 'float32' of type "
     "'str' could not be converted to Integer", None),
    # it fails first where a shipped file reads it (search.sampler.seed is ${search.seed}): the override is named
    ("interpolation-read-by-a-shipped-file", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.seed=${oc.env:ZT_UNSET}"],
     None, "override search.seed=${oc.env:ZT_UNSET}: KeyError raised while resolving interpolation", None),
    ("interpolation-in-a-list", "zhantune", ["+op=mm", "shape=[4,${nope},4]"], None,
     "override shape=[4,${nope},4]: Interpolation key 'nope' not found", None),
    ("import-nul-in-device-name", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "nul.json.gz", 4.0, device_name="GPU\x00X"),
     "device name (from device_name) 'GPU\\x00X' (5 characters)", None),
    # an entry whose key or values the replay would not find: import and replay must not disagree
    ("import-key-not-its-values", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "key.json.gz", 4.0, first=("9", 1)),
     "cache.'9' holds the configuration '1'; a cache key is its entry's values of tune_params_keys", None),
    ("import-value-not-in-tune-params", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "val.json.gz", 4.0, first=("1", "1")),
     "cache.'1'.x='1' is not one of tune_params.x [1, 2]", None),
    ("import-400-digit-time", "zhantune.kerneltuner", ["files=[{x}]"],
     lambda t: _kt_file(t, "digits.json.gz", 10**400), "cache.1.time=100000000000000000000000000000... (401 "
     "characters)", None),
    ("replay-zero-time", "zhantune", ["bench=replay", "bench.path={x}"],
     lambda t: _kt_file(t, "zero.json.gz", 0), "cache.1.time=0", None),
    ("bench-target-ms", "zhantune", ["+op=mm", "shape=[4,4,4]", "bench.target_ms=-1"], None,
     "bench.target_ms=-1.0 must be at least 0.001", None),
    # no upper bound: an OverflowError traceback in the timing worker's wait, or in the heartbeat's thread (exit 0)
    ("compile-timeout-huge", "zhantune", ["+op=mm", "shape=[4,4,4]", "bench.compile_timeout_s=1e30"], None,
     "bench.compile_timeout_s=1e+30 must be at most 604800", None),
    ("search-timeout-nan", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.timeout_s=nan"], None,
     "search.timeout_s=nan must be positive and at most 31536000 (a year), or null for no limit", None),
    ("heartbeat-huge", "zhantune", ["+op=mm", "shape=[4,4,4]", "storage.heartbeat_interval_s=9999999999",
                                    "storage.grace_period_s=99999999999"], None,
     "storage.heartbeat_interval_s=9999999999 must be 1 to 86400", None),
    ("replay-seed-negative", "zhantune.replay", ["table={x}", "seed=-1"],
     lambda t: _table(t, {"template_id": "aten::mm"}), "seed=-1 must be in [0, 4294967295]", None),
    ("search-seed-negative", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.seed=-1", "storage.url=sqlite:///s.db"],
     None, "search.seed=-1 must be in [0, 4294967295]", None),
    ("search-max-seeds-negative", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.max_seeds=-2",
                                               "storage.url=sqlite:///s.db"],
     None, "search.max_seeds=-2 must be 0 (no seeds) or a positive count", None),
    # a sampler argument its constructor refuses: the constructor's own words, before the database exists
    ("search-sampler-argument", "zhantune", ["+op=mm", "shape=[4,4,4]", "search.sampler.transfer_tpe_every=-1",
                                             "storage.url=sqlite:///s.db"],
     None, "search.sampler: cannot instantiate 'zhantune.search.FeasibleTPESampler': transfer_tpe_every=-1 must be at least 0",
     None),
    ("bench-warmup-ms", "zhantune", ["+op=mm", "shape=[4,4,4]", "bench.warmup_ms=-1"], None,
     "bench.warmup_ms=-1.0 must be at least 0", None),
    ("bench-min-reps", "zhantune", ["+op=mm", "shape=[4,4,4]", "bench.min_reps=0"], None,
     "bench.min_reps=0 must be at least 1", None),
    ("check-bench-target-ms", "zhantune.check", [*MLP, "table={x}", "bench.target_ms=0"],
     lambda t: _table(t, {"template_id": "aten::mm"}), "bench.target_ms=0.0 must be at least 0.001", None),
    ("collect-wrong-input-shape", "zhantune.collect", ["model=zhantune.models:mlp", "input_shapes=[[4,7]]"], None,
     "input_shapes=[[4, 7]]: model='zhantune.models:mlp' failed on inputs of these shapes (RuntimeError: mat1 and "
     "mat2 shapes cannot be multiplied (4x7 and 256x1024) (at ", None),
    # a bug in the user's model: one line, but with where their code raised it (the traceback's use)
    ("collect-forward-bug", "zhantune.collect", ["model={x}:fwd", "input_shapes=[[4,3]]"], _user_module,
     "model='usermod:fwd' failed on inputs of these shapes (AttributeError: 'Fwd' object has no attribute "
     "'missing' (at usermod.py:12 in forward))", None),
    ("collect-factory-bug", "zhantune.collect", ["model={x}:bad", "input_shapes=[[4,3]]"], _user_module,
     "model='usermod:bad' with model_kwargs={}: the factory raised RuntimeError: Trying to create tensor with "
     "negative dimension -4: [-4, 4] (at usermod.py:6 in helper)", None),
    ("collect-import-raises", "zhantune.collect", ["model={x}_at_import:fwd", "input_shapes=[[4,3]]"], _user_module,
     "model='usermod_at_import:fwd': importing 'usermod_at_import' raised RuntimeError: boom (at "
     "usermod_at_import.py:1 in <module>)", None),
    # the factory refusing its kwargs: torch's RuntimeError for a negative size was a traceback (only TypeError was caught)
    ("collect-factory-raises", "zhantune.collect", ["model=zhantune.models:mlp", "input_shapes=[[4,64]]",
                                                    "model_kwargs={d_model:-4}"], None,
     "model='zhantune.models:mlp' with model_kwargs={'d_model': -4}: the factory raised RuntimeError: Trying to "
     "create tensor with negative dimension -4", None),
    ("collect-builtin-factory", "zhantune.collect", ["model=os:system", "input_shapes=[[4,7]]",
                                                     "model_kwargs={command:'touch pwned'}"], None,
     "model='os:system': builtin_function_or_method 'system' is not a Python function", None),
    ("inline-space", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu",
                                  "+space.evil={branches:{b:{scope:config,fixed:{cpp.march:native}}}}"], None,
     "override space.evil: branches.b: 'cpp.march' is not a tuning knob zhantune allows on cpu", None),
    ("space-march-value", "zhantune", ["+op=mm", "shape=[4,4,4]", "device=cpu",
                                       "+space.evil={branches:{b:{scope:config,fixed:{max_autotune_gemm_backends:'CPP,TRITON'}}}}"],
     None, "max_autotune_gemm_backends='CPP,TRITON' is not allowed; expected one of ATEN, CPP (one backend",
     None),
]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(tmp: Path) -> dict[str, str]:
    """Every file under tmp (Hydra's own output directory aside) with its digest (FIFOs by name)."""
    out = {}
    for p in sorted(tmp.rglob("*")):
        rel = p.relative_to(tmp)
        if rel.parts[0] == "hydra":
            continue
        out[str(rel)] = _digest(p) if p.is_file() else "dir" if p.is_dir() else "other"
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(cli, tmp_path, existing_db, case):
    _, module, args, setup, message, _db = case
    x = setup(tmp_path) if setup else ""
    args = [a.replace("{x}", x) for a in args]
    before = _listing(tmp_path)
    r = cli(args + (["progress=false"] if module == "zhantune" else []), cwd=tmp_path, module=module, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("zhantune: "), r.stderr[-3000:]
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.stderr + r.stdout and "s3cret" not in r.stderr + r.stdout
    # nothing written: every database's bytes, and no new or stray file (no .tmp, no pwned)
    assert _listing(tmp_path) == before


def test_an_added_key_that_an_interpolation_reads_is_not_refused(cli, tmp_path):
    """A review's finding: the check of '+' overrides (bad-input cases plus-typo*) refused a helper key
    that the config reads through an interpolation."""
    path = _kt_file(tmp_path, "k_GPU.json.gz", 4.0)
    r = cli(["bench=replay", f"bench.path={path}", "+T=2", "search.n_trials=${T}", "progress=false"], cwd=tmp_path)
    assert r.returncode == 0 and "trials: 2 measured" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # and the value it reads is resolved before it is checked (the shape check saw '${M}' and refused it)
    r = cli(["+op=mm", "+M=64", "shape=[${M},${M},32]", "device=cpu"], cwd=tmp_path, module="zhantune.space")
    assert r.returncode == 0 and "mm[M=64,N=64,K=32]:float32" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # Hydra's resolver in a sweep, as cluster sweeps use it: the check of every job before the first (a bad value
    # in a later job) set up no job, so ${hydra:...} did not resolve and the valid sweep was refused (a review's
    # finding)
    r = cli(["-m", "bench=replay", f"bench.path={path}", "search.n_trials=1", "search.seed=${hydra:job.num}",
             "storage.url=sqlite:///${hydra:runtime.cwd}/sweep.db", "search.transfer=off,auto", "progress=false"],
            cwd=tmp_path)
    assert r.returncode == 0 and "2 job record(s)" in r.stdout and (tmp_path / "sweep.db").exists(), \
        r.stdout[-2000:] + r.stderr[-2000:]


def test_a_table_file_named_with_a_newline_is_named_on_one_line(tmp_path):
    """read_table names the file in every error; a newline in its name (from Python, where the CLI's
    override grammar does not reach) is written as its escape, so the error stays one line."""
    from zhantune.errors import TableError
    from zhantune.inductor.table import read_table

    (tmp_path / "a\nb.json").write_text("[]")
    with pytest.raises(TableError) as e:
        read_table(tmp_path / "a\nb.json")
    assert str(e.value) == json.dumps(str(tmp_path / "a\nb.json")) + ": expected a JSON object, got list"
    # and so does check's report of a table that loads (its header line was the raw name: a file named
    # "x.json\nhit   x1 FORGED" printed a forged hit line), and use_table("") names the file it could not read
    (tmp_path / "c\nhit   x1 FORGED.json").write_text(json.dumps({KEY: [{"template_id": "aten::mm"}]}))
    assert read_table(tmp_path / "c\nhit   x1 FORGED.json").source == json.dumps(str(tmp_path / "c\nhit   x1 FORGED.json"))
    with pytest.raises(TableError, match='^"": cannot read: No such file'):
        read_table("")


def test_a_negative_recorded_duration_paces_as_zero():
    """A crafted Kernel Tuner entry with compile_time -5000 made a paced replay sleep a negative time
    (ValueError, a traceback, the study left running): a field that is no duration counts 0."""
    from zhantune.bench.recorded import recorded_cost_s

    assert recorded_cost_s({"compile_time": -5000.0, "verification_time": "x", "benchmark_time": 2.0}) == 0.002


def test_a_kernel_tuner_file_over_the_size_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """A gzip bomb (1 MiB on disk, 1 GiB of blanks inside) took 2.4 GB of memory to parse before its
    one-line error; reading stops at MAX_KT_BYTES decompressed (128 MiB; 2 KiB here, monkeypatched,
    with a real gzip file of 4 KiB of blanks around a valid cache), and a file at the cap is read."""
    from zhantune.bench import recorded
    from zhantune.errors import ConfigError

    doc = json.loads(gzip.decompress((tmp_path / _kt_file(tmp_path, "ok.json.gz", 4.0)).read_bytes()))
    body = json.dumps(doc).encode()
    monkeypatch.setattr(recorded, "MAX_KT_BYTES", len(body) + 2048)
    (tmp_path / "bomb.json.gz").write_bytes(gzip.compress(b" " * 4096 + body))
    with pytest.raises(ConfigError) as e:
        recorded.load_kerneltuner(tmp_path / "bomb.json.gz", "files")
    assert str(e.value) == f"files={tmp_path / 'bomb.json.gz'}: over 0 MiB of JSON decompressed: not read"
    (tmp_path / "fits.json.gz").write_bytes(gzip.compress(b" " * 2048 + body))
    assert recorded.load_kerneltuner(tmp_path / "fits.json.gz").kernel_name == "k"


def test_march_table_is_refused_by_check_use_table_and_replay(cli, tmp_path, existing_db):
    """The shell-running table of issue 16 under a real key: refused before anything compiles."""
    from zhantune.device import resolve_device
    from zhantune.errors import TableError
    from zhantune.inductor.runtime import table_report, use_table

    key = f"{resolve_device('cpu').key}+((torch.float32, [32, 64], [64, 1]), (torch.float32, [128, 64], [1, 128]))+addmm"
    name = _table(tmp_path, MARCH, "march.json", key)
    before = _listing(tmp_path)
    report_before = table_report()
    with pytest.raises(TableError, match=r"config_patch\.cpp\.march: 'cpp\.march' is not a tuning knob"):
        use_table(tmp_path / name)
    with pytest.raises(TableError, match="cpp.march"):
        use_table(json.loads((tmp_path / name).read_text()), device="cpu")
    with pytest.raises(TableError, match="max_autotune_gemm_backends='CPP' is not allowed"):  # CUDA: no CPP
        use_table(json.loads((tmp_path / name).read_text()), device="cuda")
    assert table_report() is report_before  # nothing was installed
    for module, args in (("zhantune.check", [*MLP, f"table={name}"]),
                         ("zhantune.replay", [f"table={name}", "device=cpu"])):
        r = cli(args, cwd=tmp_path, module=module)
        assert r.returncode == 2, r.stderr[-3000:]
        assert r.stderr.strip().startswith("zhantune: table=march.json: ") and "'cpp.march' is not a tuning knob" in r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "pwned").exists() and _listing(tmp_path) == before


def test_export_skips_entries_a_table_may_not_carry(tmp_path):
    """A stored row that sets a non-knob (a tf32 backend flag; a merged row) or a knob a CPU table
    cannot apply (a fusion limit: read when Inductor schedules the graph) is never exported: the key
    gets the next carried config, else Inductor's default choice."""
    import torch

    from zhantune.inductor.builder import build_table

    store = Store(f"sqlite:///{tmp_path}/z.db")
    dev = store.device_id("gpu0", "gpu0", "cpu", {})  # a config patch a CPU table carries
    prob = store.problem_id("mm[M=32,N=128,K=64]:float32", op="mm", shape={"M": 32, "N": 128, "K": 64, "B": 1},
                            dtype="float32", activation=None, weight_layout="kn", lookup_op="mm",
                            lookup_key=KEY, flops=2 * 32 * 128 * 64)
    study = store.study_id("s", {})
    store.add_measurement(study_id=study, device_id=dev, problem_id=prob, kind="candidate", status="ok",
                          template_id=None, params={"cuda.matmul.allow_tf32": True}, median_us=1.0,
                          config_hash="a", torch_version=torch.__version__)
    assert build_table(store) == {f"gpu0+{KEY}": [{"template_id": "aten::mm"}]}
    store.add_measurement(study_id=study, device_id=dev, problem_id=prob, kind="candidate", status="ok",
                          template_id=None, params={"max_fusion_size": 8}, median_us=2.0, config_hash="b",
                          torch_version=torch.__version__)
    assert build_table(store) == {f"gpu0+{KEY}": [{"template_id": "aten::mm"}]}
    store.add_measurement(study_id=study, device_id=dev, problem_id=prob, kind="candidate", status="ok",
                          template_id=None, params={"max_autotune_gemm_backends": "CPP", "cpp.gemm_max_k_slices": 1},
                          median_us=3.0, config_hash="c", torch_version=torch.__version__)
    assert build_table(store) == {f"gpu0+{KEY}": [{"template_id": "zhantune::config", "config_patch": {
        "max_autotune_gemm_backends": "CPP", "cpp.gemm_max_k_slices": 1}}]}
    # a Triton config the table may not carry (more than 256 accumulators a thread: a space of 2026-11-24
    # measured 256x256 on 4 warps) is skipped, the next carried one exported: it failed the whole export
    # (a second review, session 40)
    gpu = store.device_id("gpu1", "gpu1", "cuda", {})
    tri = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3, "GROUP_M": 8}
    for us, params, chash in ((1.0, {**tri, "BLOCK_M": 512, "BLOCK_N": 512}, "big"), (2.0, tri, "ok")):
        store.add_measurement(study_id=study, device_id=gpu, problem_id=prob, kind="candidate", status="ok",
                              template_id="triton::mm", params=params, median_us=us, config_hash=chash,
                              torch_version=torch.__version__)
    assert build_table(store)[f"gpu1+{KEY}"] == [{"template_id": "triton::mm", **tri}]


KNOB_ROWS = [  # (device kind, key, value, allowed)
    ("cpu", "max_autotune_gemm_backends", "CPP", True),
    ("cpu", "max_autotune_gemm_backends", "cpp", True),
    ("cpu", "max_autotune_gemm_backends", "aten,cpp", False),  # the compile would autotune between the two
    ("cpu", "max_autotune_gemm_backends", "ATEN, aten", True),  # one backend
    ("cpu", "max_autotune_gemm_backends", "TRITON", False),
    ("cpu", "max_autotune_gemm_backends", " cpp ,\u2003aten\n", False),  # Inductor would get the spaces
    ("cpu", "max_autotune_gemm_backends", "CPP ,cpp", True),  # Inductor strips each part
    ("cuda", "max_autotune_gemm_backends", "tr\u0131ton", False),  # dotless i: "TRITON" once upper-cased
    ("cpu", "cpp.gemm_thread_factors", "1,2,1", True),
    ("cpu", "cpp.gemm_thread_factors", None, True),
    ("cpu", "cpp.gemm_thread_factors", "1,2", False),
    ("cpu", "cpp.gemm_thread_factors", "0,2,1", False),
    ("cpu", "cpp.gemm_cache_blocking", "4,1,16; rm -rf /", False),
    ("cpu", "cpp.gemm_thread_factors", "1,2,1\n", False),  # a regex's $ takes a trailing newline
    ("cpu", "cpp.gemm_thread_factors", "\u0661,\u0662,\u0661", False),  # Arabic-Indic digits: \d, int() take them
    ("cpu", "cpp.gemm_max_k_slices", 0, True),
    ("cpu", "cpp.gemm_max_k_slices", True, False),
    ("cpu", "cpp.gemm_max_k_slices", 2.0, False),
    ("cpu", "cpp.march", "native", False),
    ("cpu", "cpp.cxx", ["/bin/sh"], False),
    ("cpu", "epilogue_fusion", True, True),
    ("cpu", "max_fusion_size", "8", False),
    ("cuda", "epilogue_fusion", True, True),
    ("cuda", "max_fusion_unique_io_buffers", None, True),
    ("cuda", "max_fusion_size", 0, False),
    ("cuda", "triton.cudagraphs", True, False),
    ("cuda", "max_autotune_gemm_backends", "TRITON", True),
    ("cuda", "max_autotune_gemm_backends", "ATEN,TRITON", False),
    ("cuda", "max_autotune_gemm_backends", "CUTLASS", False),
]


@pytest.mark.parametrize("kind,key,value,allowed", KNOB_ROWS)
def test_config_knob_allow_list(kind, key, value, allowed):
    from zhantune.inductor.knobs import config_knob_problem

    assert (config_knob_problem(key, value, kind) is None) is allowed


TEMPLATE_ROWS = [  # (entry, allowed)
    ({"template_id": "triton::mm", "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 3,
      "GROUP_M": 8, "EVEN_K": True, "template_hash": "abc123"}, True),
    ({"template_id": "decompose_k", "k_split": 4}, True),
    ({"template_id": "aten::mm"}, True),
    # what Inductor derives or passes itself (a review: each failed or could fail the GPU compile, or
    # overrode a layout- or device-derived value): refused, per template
    ({"template_id": "triton::mm", "BLOCK_K": 16, "ALLOW_TF32": False}, False),  # repeated: TypeError
    ({"template_id": "triton::mm", "BLOCK_K": 16, "ACC_TYPE": "tl.float32"}, False),
    ({"template_id": "triton::mm_persistent_tma", "BLOCK_K": 16, "TMA_EXPERIMENTAL_API": True}, False),
    ({"template_id": "triton::mm_persistent_tma", "BLOCK_K": 16, "NUM_SMS": 4}, False),
    ({"template_id": "triton::mm_persistent_tma", "BLOCK_K": 16, "A_ROW_MAJOR": False}, False),
    ({"template_id": "aten::mm", "BLOCK_M": 64}, False),  # reached torch.mm(..., BLOCK_M=64)
    ({"template_id": "decompose_k", "k_split": 4, "BLOCK_M": 64}, False),  # generate() got an unexpected kwarg
    ({"template_id": "triton::bmm", "BLOCK_M": 64, "k_split": 4}, False),
    ({"template_id": "triton::mm", "BLOCK_M": "64"}, False),
    ({"template_id": "triton::mm", "num_warps": 3}, False),
    ({"template_id": "triton::mm", "EVEN_K": 1}, False),
    ({"template_id": "triton::mm", "ACC_TYPE": "tl.float32\nimport os"}, False),
    ({"template_id": "triton::mm", "prologue": "import os"}, False),
    ({"template_id": "triton::mm", "template_hash": "x; rm"}, False),
    ({"template_id": "a b c"}, False),
    ({"template_id": "triton::mm", "num_warps": 4.0}, False),  # 4.0 == 4 in Python; a float is not a warp count
    ({"template_id": "triton::mm\n"}, False),
    ({"template_id": "triton::\uff4d\uff4d"}, False),  # fullwidth "mm": \w takes it
    ({"template_id": "triton::mm", "template_hash": "abc\n"}, False),
    ({"template_id": "triton::mm", "EVEN_K": True}, False),  # would describe Inductor's first config's BLOCK_K
    ({"template_id": "triton::mm", "BLOCK_K": 16, "EVEN_K": True}, True),
]
#: entries of allowed kwargs whose tiles or warps no kernel holds (knobs.triton_resources_problem, checked at load)
RESOURCE_ROWS = [
    ({"template_id": "triton::mm_persistent_tma", "num_warps": 2}, False),  # Inductor's TMA configs leave 2 out
    ({"template_id": "triton::mm_persistent_tma", "num_warps": 4}, True),
    ({"template_id": "triton::mm", "num_warps": 2}, True),
    ({"template_id": "triton::mm", "num_warps": 16}, False),
    ({"template_id": "triton::mm", "BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 16, "num_warps": 4}, False),
]


@pytest.mark.parametrize("entry,allowed", TEMPLATE_ROWS)
def test_template_kwarg_allow_list(entry, allowed):
    from zhantune.inductor.knobs import template_entry_problem

    assert (template_entry_problem(entry) is None) is allowed


@pytest.mark.parametrize("entry,allowed", RESOURCE_ROWS)
def test_triton_resources_at_load(entry, allowed):
    from zhantune.inductor.knobs import triton_resources_problem

    assert (triton_resources_problem(entry) is None) is allowed


def test_a_table_the_reader_would_refuse_is_never_written(tmp_path):
    """A database edited elsewhere (a device key with a terminal escape and a newline) made export
    write keys that its own reader then refused; write_table checks as read_table does, writes nothing."""
    from zhantune.errors import TableError
    from zhantune.inductor.table import read_table, write_table

    key = "\x1b[31mRED\x1b[0m\n2nd line+" + KEY
    with pytest.raises(TableError, match=r"t.json \(not written\): \[.*\]: not an Inductor lookup key") as e:
        write_table(tmp_path / "t.json", {key: [{"template_id": "aten::mm"}]})
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
    write_table(tmp_path / "t.json", {KEY: [{"template_id": "aten::mm"}]})
    assert read_table(tmp_path / "t.json").table == {KEY: [{"template_id": "aten::mm"}]}


def test_read_table_names_a_hostile_key_on_one_line_and_checks_every_value():
    """A table's key path is printed escaped (a newline or a terminal escape in a key would forge
    output lines), a zhantune::config entry's template_hash is checked like a template entry's, and
    a lookup key with a trailing newline is not Inductor's format."""
    from zhantune.errors import TableError
    from zhantune.inductor.table import read_table

    evil = "x\n\x1b[2Jzhantune: coverage 100%: ok"
    with pytest.raises(TableError) as e:
        read_table({KEY: [{"template_id": "zhantune::config", "config_patch": {evil: 1}}]}, "cpu")
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value) and "config_patch.x\\n" in str(e.value)
    with pytest.raises(TableError, match=r"\[0\]\.template_hash: expected a hash string"):
        read_table({KEY: [{"template_id": "zhantune::config", "config_patch": {}, "template_hash": {"a": [1]}}]})
    with pytest.raises(TableError, match="not an Inductor lookup key"):
        read_table({KEY + "\n": [{"template_id": "aten::mm"}]})


def test_use_table_of_a_bad_table_file_object_changes_no_inductor_config():
    """A TableFile whose wrapper fields are wrong (a torch version that is not a string) is refused
    like a file, and nothing is left installed: Inductor's config is as before (it kept the table
    in lookup_table.table when the handler failed after the config patch)."""
    from torch._inductor import config as inductor_config

    from zhantune.errors import TableError
    from zhantune.inductor.runtime import table_report, use_table
    from zhantune.inductor.table import FORMAT, TableFile

    before, report_before = inductor_config.save_config_portable(), table_report()
    bad = TableFile({KEY: [{"template_id": "aten::mm"}]}, {"format": FORMAT, "format_version": 1, "torch": 2})
    with pytest.raises(TableError, match="torch: expected a string, got int"):
        use_table(bad)
    assert inductor_config.save_config_portable() == before and table_report() is report_before


def test_use_table_removed_in_any_order_leaves_what_was_there_and_refuses_what_is_not_a_table():
    """Two installs removed first-in first (a review: the first table stayed in effect after both
    were removed, and removing it alone switched the second off), or one removed inside the other's
    block: each remove() leaves exactly the tables still installed, the last one in effect. Keys
    that are not strings (a Python dict's) and a table that is not a path, dict or TableFile (None
    read a file named "None") are refused."""
    from torch._inductor import config as inductor_config
    from torch._inductor.virtualized import V

    from zhantune.errors import TableError
    from zhantune.inductor import cpu_gemm
    from zhantune.inductor.runtime import use_table

    def state():
        return inductor_config.lookup_table.table, type(V.choices), cpu_gemm._users

    before = state()
    table_a, table_b = {KEY: [{"template_id": "aten::mm"}]}, {KEY: [{"template_id": "aten::bmm"}]}
    a, b = use_table(table_a), use_table(table_b)
    a.remove()
    assert V.choices is b.handler and inductor_config.lookup_table.table == table_b and cpu_gemm._users == 1
    b.remove()
    assert state() == before
    with use_table(table_a) as a:
        b = use_table(table_b)
    assert V.choices is b.handler and inductor_config.lookup_table.table == table_b
    b.remove()
    a.remove()  # again: nothing
    assert state() == before
    for bad, match in (({KEY: [{"template_id": "aten::mm", 1: 2}]}, r"\[0\]: the key 1 is not a string"),
                       ({KEY: [{"template_id": "zhantune::config", "config_patch": {1: 2}}]},
                        r"\[0\]\.config_patch: the key 1 is not a string")):
        with pytest.raises(TableError, match=match):
            use_table(bad)
    for bad in (None, 123):
        with pytest.raises(TypeError, match="expected a path, a dict or a TableFile"):
            use_table(bad)
    assert state() == before
    # per thread, as Inductor's handler is: another thread's remove() is refused, its own works
    import threading

    a, errors = use_table(table_a), []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, a.remove)))
    t.start()
    t.join()
    assert errors and "in the thread that installed it" in str(errors[0].value) and V.choices is a.handler
    a.remove()
    assert state() == before


PLAIN_CALL = textwrap.dedent("""
    import gc, json, sys, torch
    from torch._dynamo.utils import counters
    import zhantune
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 96),
                                torch.nn.GELU(), torch.nn.Linear(96, 64)).eval()
    x = torch.randn(32, 64)
    torch._inductor.config.freezing = True   # the README's inference compile (the C++ template needs it)
    zhantune.use_table(sys.argv[1])          # the README's plain call: the result is not kept
    gc.collect()
    with torch.no_grad():
        out = torch.compile(model)(x)
        err = ((out - model(x)).abs().max() / model(x).abs().max()).item()
    print(json.dumps({"report": zhantune.table_report().as_dict(), "error": err,
                      "autotune": counters["inductor"]["select_algorithm_autotune"],
                      "cpp_kernels": counters["inductor"]["cpp_templated_kernel_counter"]}))
""")


@pytest.mark.slow
def test_readme_plain_call_use_table_hits_every_key_in_a_fresh_process(tmp_path):
    """``zhantune.use_table("t.json")`` without keeping the result, then torch.compile: all three GEMMs
    hit, no autotuning runs (issue 16: the handler used to be restored when the object was collected)."""
    import torch

    from zhantune.device import resolve_device
    from zhantune.inductor.gemms import collect

    # the run's Inductor cache (tests/conftest.py), the FX graph and AOTAutograd caches off: the compile
    # makes its lookups (tests/compiles.py), and the kernels (and the ISA probe's) built before load
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 96),
                                torch.nn.GELU(), torch.nn.Linear(96, 64)).eval()  # PLAIN_CALL's (in this process)
    device = resolve_device("cpu")
    keys = [f"{device.key}+{p.lookup_key}" for p in collect(model, (torch.randn(32, 64),), device)]
    assert len(keys) == 3
    # one C++-template GEMM, two ATen ones
    patches = [{"max_autotune_gemm_backends": "CPP"}, {"max_autotune_gemm_backends": "ATEN"},
               {"max_autotune_gemm_backends": "ATEN"}]
    table = {k: [{"template_id": "zhantune::config", "config_patch": p}] for k, p in zip(keys, patches, strict=True)}
    (tmp_path / "t.json").write_text(json.dumps(table))
    r = subprocess.run([sys.executable, "-c", PLAIN_CALL, str(tmp_path / "t.json")], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(got["report"]["hits"]) == sorted(keys), got["report"]
    assert got["report"]["misses"] == {} and got["report"]["coverage"] == 1.0
    assert got["autotune"] == 0  # one choice per GEMM: the table decided, nothing was benchmarked
    assert got["cpp_kernels"] == 1
    assert got["error"] < 1e-4


def test_table_report_has_no_coverage_without_lookups(tmp_path):
    from zhantune.inductor.runtime import use_table

    with use_table({KEY: [{"template_id": "aten::mm"}]}) as installed:
        report = installed.report
        assert report.lookups == 0 and report.coverage is None
        assert report.as_dict()["note"] == "no GEMM lookup seen: served from Inductor's cache or not compiled yet"


def test_every_shipped_space_sets_only_allow_listed_knobs():
    """What a tune stores is what a table may ship: every config branch of every op's default spaces
    (conf/op/*.yaml, per device kind) passes the allow-list with every value it can take."""
    from omegaconf import OmegaConf

    from zhantune.config import CONF_DIR
    from zhantune.inductor.knobs import config_knob_problem

    checked = 0
    for op_file in sorted((CONF_DIR / "op").glob("*.yaml")):
        spaces = OmegaConf.to_container(OmegaConf.load(op_file)).get("spaces") or {}
        for kind, names in spaces.items():
            for name in names:
                doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "space" / f"{name}.yaml"))
                for branch in doc["branches"].values():
                    if branch["scope"] != "config":
                        continue
                    values = {k: [v] for k, v in (branch.get("fixed") or {}).items()}
                    for pname, spec in (branch.get("params") or {}).items():
                        values[spec.get("key", pname)] = spec.get("choices") or list(range(spec["low"], spec["high"] + 1))
                    for key, choices in values.items():
                        for v in choices:
                            assert config_knob_problem(key, v, kind) is None, (op_file.name, kind, name, key, v)
                            checked += 1
    assert checked > 20


def test_disk_full_while_creating_the_database_is_one_line_and_leaves_no_file(cli, tmp_path, tiny_disk):
    r = cli(["+op=mm", "shape=[64,64,64]", "device=cpu", "progress=false", f"storage.url=sqlite:///{tiny_disk}/z.db",
             "export.enabled=false"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "database or disk is full" in lines[0] and "Traceback" not in r.stderr
    assert list(tiny_disk.iterdir()) == []  # the half-created database and its lock file are gone


OLD_TORCH = textwrap.dedent("""
    import runpy, sys, torch
    torch.__version__ = torch.torch_version.TorchVersion("2.11.0+cu130")  # the H200 image's torch
    target, sys.argv = sys.argv[1], sys.argv[1:]
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
""")


def test_an_older_torch_is_refused_in_one_line_before_anything_compiles_or_is_written(tmp_path, existing_db):
    """torch 2.11 (the lent H200's image) compiled every Triton entry into a compile_error and looked
    addmm up under another key (zhantune.torch_support): tuning, the dry run, collect, check, replay,
    use_table and gpu_check refuse it, naming the version, with nothing written."""
    from zhantune.inductor.runtime import table_report, use_table
    from zhantune.torch_support import UnsupportedTorchError, check_torch

    for ok in ("2.13.0+cpu", "2.13.0a0+git1234abc", "2.14.1", "3.0.0"):
        check_torch(ok)
    check_torch("a build without a version")  # nothing to refuse on
    for old in ("2.11.0+cu130", "2.12.1", "1.13.1", "2.11.0-custom"):
        with pytest.raises(UnsupportedTorchError, match=re.escape(f"needs torch>=2.13; this environment has torch {old}:")):
            check_torch(old)

    name = _table(tmp_path, {"template_id": "aten::mm"})
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    (tmp_path / "empty").mkdir()
    before = _listing(tmp_path)
    for target, args, cwd in (
            ("zhantune", ["+op=mm", "shape=[32,32,32]", "search.n_trials=1", "progress=false",
                          f"storage.url=sqlite:///{existing_db}"], tmp_path),
            ("zhantune", ["+op=mm", "shape=[32,32,32]", "progress=false"], tmp_path / "empty"),  # would create zhantune.db
            ("zhantune.space", ["+op=addmm", "shape=[32,32,32]", "device_profile=H100"], tmp_path),
            ("zhantune.collect", [*MLP, "out=problems.yaml"], tmp_path),
            ("zhantune.check", [*MLP, f"table={name}"], tmp_path),
            ("zhantune.replay", [f"table={name}", "device=cpu", f"storage.url=sqlite:///{existing_db}"], tmp_path),
            (str(script), ["--trials", "1"], tmp_path)):
        hydra_dir = [] if target.endswith(".py") else [f"hydra.run.dir={tmp_path}/hydra"]
        r = subprocess.run([sys.executable, "-c", OLD_TORCH, target, *args, *hydra_dir], cwd=cwd, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1, (target, r.stdout[-2000:], r.stderr[-3000:])
        assert "needs torch>=2.13; this environment has torch 2.11.0+cu130" in lines[0], (target, lines[0])
        assert "Traceback" not in r.stderr + r.stdout
    assert _listing(tmp_path) == before  # no database, problems file or table written or changed

    import torch

    report_before = table_report()
    real = torch.__version__
    try:
        torch.__version__ = torch.torch_version.TorchVersion("2.11.0+cu130")
        with pytest.raises(UnsupportedTorchError, match="zhantune.use_table needs torch>=2.13"):
            use_table(tmp_path / name)
    finally:
        torch.__version__ = real
    assert table_report() is report_before  # nothing was installed


def test_a_recorded_failure_text_is_cut_and_escaped(tmp_path):
    """A Kernel Tuner failure is a name in ``time`` (CompilationFailedConfig, ...); any other text
    was the error as it was, printed on each trial line and stored: a review's file held 200 KB
    ending in a terminal escape. Kernel Tuner's own names stay as they are."""
    from zhantune.bench.recorded import ReplayBenchmarker, load_kerneltuner

    odd = "X" * 200_000 + "\x1b[31m"
    name = _raw_kt(tmp_path, {"x": [1, 2, 3]}, {"1": {"x": 1, "time": 1.0}, "2": {"x": 2, "time": odd},
                                               "3": {"x": 3, "time": "CompilationFailedConfig"}})
    replay = load_kerneltuner(tmp_path / name)
    (branch,) = replay.space().branches
    bench = ReplayBenchmarker(replay)
    got = bench.measure(branch.candidate({"x": 2}))
    assert got.status == "runtime_error" and len(got.error_text) < 100 and "\x1b" not in got.error_text
    assert got.error_text.endswith("characters)")  # its length given
    kt = bench.measure(branch.candidate({"x": 3}))
    assert (kt.status, kt.error_text) == ("compile_error", "CompilationFailedConfig")


def test_a_table_entry_that_cannot_be_right_for_its_keys_sizes_is_refused(tmp_path):
    """A review (session 39): allow-listed values that broke the user's compile or its results. An
    entry whose BLOCK_K does not divide the key's K with EVEN_K: true (unmasked loads past K under
    stock Inductor), a decompose_k k_split that does not divide K
    (Inductor's reshape failed inside torch.compile), a BLOCK_K under tl.dot's least for the dtype
    (bfloat16's 16 on NVIDIA), and a key of
    thousands of entries (each a kernel to compile and time) load no more; the file's wrapper takes
    only its own fields, in at most 1 MiB (64 MiB of padding stayed in memory while installed)."""
    from zhantune.errors import TableError
    from zhantune.inductor.table import read_table

    k48 = "((torch.float32, [64, 48], [48, 1]), (torch.float32, [48, 64], [64, 1]))+mm"
    tri = {"template_id": "triton::mm", "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3,
           "GROUP_M": 8}
    with pytest.raises(TableError, match=r"\+mm\"\]\[0\]\.EVEN_K: EVEN_K=true is wrong for K=48 \(the key's\), no "
                                         r"multiple of BLOCK_K=32: the K loop would read past K unmasked"):
        read_table({k48: [{**tri, "EVEN_K": True}]}, "cuda")
    assert read_table({k48: [{**tri, "EVEN_K": False}]}, "cuda").table  # as export writes it
    assert read_table({k48: [tri]}, "cuda").table  # as export wrote it before it wrote EVEN_K: use_table derives it
    assert read_table({k48: [{**tri, "BLOCK_K": 16}]}, "cuda").table  # 16 divides 48
    with pytest.raises(TableError, match=r"\[0\]\.k_split: k_split=5 does not divide K=48"):
        read_table({k48: [{"template_id": "decompose_k", "k_split": 5}]}, "cuda")
    assert read_table({k48: [{"template_id": "decompose_k", "k_split": 3}]}, "cuda").table
    # tl.dot's least K on NVIDIA: 8 for float32, 16 for a 16-bit dtype (Triton's min_dot_size); 1 on AMD
    assert read_table({k48: [{**tri, "BLOCK_K": 8}]}, "cuda").table
    with pytest.raises(TableError, match=r"\[0\]\.BLOCK_K: BLOCK_K=4 is below 8, the least K of Triton's tl.dot "
                                         r"for float32 on an NVIDIA GPU"):
        read_table({k48: [{**tri, "BLOCK_K": 4, "EVEN_K": False}]}, "cuda")
    bf16 = k48.replace("float32", "bfloat16")
    with pytest.raises(TableError, match=r"BLOCK_K=8 is below 16, the least K of Triton's tl.dot for bfloat16"):
        read_table({bf16: [{**tri, "BLOCK_K": 8}]}, "cuda")
    assert read_table({f"gfx942:sramecc+:xnack-+{bf16}": [{**tri, "BLOCK_K": 8}]}, "cuda").table  # AMD: 1
    with pytest.raises(TableError, match=r"\+mm\"\]: 65 entries; a key holds at most 64"):
        read_table({k48: [{**tri, "BLOCK_K": 16}] * 65}, "cuda")
    # a fuzz of CUDA entries through Triton's own compiler (session 40): what the user's compile could not
    # survive loaded. More than 256 accumulators a thread (1024x1024 on 4 warps compiled for minutes, out
    # of memory), a tile over Triton's 2^20 elements, 16 or 32 warps (ptxas ran out of registers on sm_90)
    for change, match in (({"BLOCK_M": 1024, "BLOCK_N": 1024}, r"\[0\]\.BLOCK_M: BLOCK_M x BLOCK_N = 1024 x 1024 "
                                                               r"accumulators on num_warps=4 \(128 threads\) is 8192 per"),
                          ({"BLOCK_M": 512, "BLOCK_N": 16, "BLOCK_K": 4096, "EVEN_K": False},
                           r"\[0\]\.BLOCK_K: BLOCK_K=4096 with BLOCK_M=512, BLOCK_N=16 makes a tile of more than 1,048,576"),
                          ({"num_warps": 16}, r"\[0\]\.num_warps: num_warps=16 is more than a table entry may have \(8: ")):
        entry = {k: v for k, v in {**tri, **change}.items() if v is not None}
        entry["BLOCK_K"] = min(entry["BLOCK_K"], 16) if change.get("BLOCK_K") != 4096 else 4096
        with pytest.raises(TableError, match=match):
            read_table({k48: [entry]}, "cuda")
    assert read_table({k48: [{**tri, "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 16}]}, "cuda").table  # 256 a thread
    with pytest.raises(TableError, match=r"\[0\]\.num_warps: num_warps=16 is more than a table entry may have"):
        read_table({k48: [{"template_id": "triton::mm", "num_warps": 16}]}, "cuda")  # blocks left out (a review)

    wrapped = {"format": "zhantune-lookup-table", "format_version": 1, "torch": "2.13.0",
               "table": {KEY: [{"template_id": "aten::mm"}]}}
    assert read_table(wrapped).table
    # a wrapper without its torch release passed as this release's (its entries never stale): an attack's finding
    for torch_field in ({}, {"torch": None}):
        with pytest.raises(TableError, match=r"^<dict>: torch: missing or null; a table file names the torch release"):
            read_table({**{k: v for k, v in wrapped.items() if k != "torch"}, **torch_field})
    for extra, match in (({"evil": {"_target_": "os.system"}}, r'"evil": not a field of a table file'),
                         ({"devices": [{"key": "cpu", "extra": 1}]}, r'devices\[0\]\."extra": not a field of a device'),
                         ({"devices": [{"key": "cpu", "name": ["x"]}]}, r"devices\[0\]\.name: expected one line"),
                         ({"options": {"pad": "ab" * (1 << 20)}}, r"the fields besides table take 2,097,\d+ bytes"),
                         ({"options": {"x": float("nan")}}, r"the fields besides table are not JSON data"),
                         ({"activations": {}}, r'"activations": not a field of a table file \(version 1 has'),
                         ({"format_version": 2, "activations": {KEY: "silu"}}, r'activations\["\(\(torch\.float32.*\]: "silu"; '
                          r"allowed: relu, gelu"),
                         ({"format_version": 2, "activations": {"other+((x))+mm": "gelu"}},
                          r'activations\["other\+\(\(x\)\)\+mm"\]: not a key of the table'),
                         ({"format_version": 2, "activations": [KEY]}, r"activations: expected an object"),
                         ({"format_version": 3, "activations": {KEY: ["gelu"]}}, r'\]: \["gelu"\]; allowed: relu, gelu, or'),
                         ({"format_version": 3, "activations": {KEY: ["gelu", "gelu"]}}, r"allowed: relu, gelu, or a list"),
                         ({"format_version": 3, "activations": {KEY: ["gelu", "silu"]}}, r"allowed: relu, gelu, or a list"),
                         # a nested list: the items are checked before they are hashed (a review's traceback)
                         ({"format_version": 3, "activations": {KEY: [["relu"], "gelu"]}}, r"allowed: relu, gelu, or"),
                         ({"format_version": 1, "activations": {KEY: ["gelu", None]}}, r'"activations": not a field'),
                         ({"format_version": 4}, r"format_version: this zhantune reads versions 1, 2 and 3, got 4")):
        with pytest.raises(TableError, match=match):
            read_table({**wrapped, **extra})
    # a list in version 2, as tables exported for a few hours of 2026-11-30 hold it: read
    assert read_table({**wrapped, "format_version": 2, "activations": {KEY: ["gelu", None]}}).activations == {
        KEY: ["gelu", None]}
    (tmp_path / "w.json").write_text(json.dumps({**wrapped, "evil": 1}))
    r = subprocess.run([sys.executable, "-m", "zhantune.check", *MLP, f"table={tmp_path / 'w.json'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().endswith('"evil": not a field of a table file (version 1 has format, '
                                                           'format_version, zhantune, torch, triton, created_at, '
                                                           'source, devices, options, table)'), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # a TMA block of under 16 bytes in a dimension (Triton's descriptor minimum); an op not known here
    # (int_mm's int8): tl.dot's least K for its dtype all the same (a second review)
    tma = {**tri, "template_id": "triton::mm_persistent_tma", "BLOCK_K": 64}
    with pytest.raises(TableError, match=r"BLOCK_N=4 gives a TMA block of 8 bytes in a dimension for bfloat16"):
        read_table({bf16: [{**tma, "BLOCK_N": 4}]}, "cuda")
    int_mm = "((torch.int8, [64, 64], [64, 1]), (torch.int8, [64, 64], [64, 1]))+int_mm"
    with pytest.raises(TableError, match=r"BLOCK_K=16 is below 32, the least K of Triton's tl.dot for int8"):
        read_table({int_mm: [{**tri, "BLOCK_K": 16}]}, "cuda")
    # copied as plain JSON types, then checked: what JSON cannot hold (from Python) is a TableError, and
    # a dict subclass's own copy (__deepcopy__ returning other values) is never what is served
    import threading

    for bad in ({KEY: [{"template_id": "aten::mm", "x": threading.Lock()}]}, {**wrapped, "options": {"x": threading.Lock()}}):
        with pytest.raises(TableError, match="a value of type lock is not JSON data"):
            read_table(bad)

    class Entry(dict):
        def __deepcopy__(self, memo):
            return {**self, "num_stages": "__import__('os').system('true') or 2"}

        def items(self):
            return [(k, 3 if k == "num_stages" else v) for k, v in dict.items(self)]

    with pytest.raises(TableError, match=r"num_stages='2' is not allowed"):
        read_table({k48: [Entry(**{**tri, "num_stages": "2", "EVEN_K": False})]}, "cuda")
    served = read_table({k48: [Entry(**{**tri, "EVEN_K": False})]}, "cuda").table[k48][0]
    assert type(served) is dict and served["num_stages"] == 3
