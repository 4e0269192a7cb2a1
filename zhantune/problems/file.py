"""The problems file (YAML) that ``python -m zhantune.collect`` writes and a tune of ``problems=`` reads:
``format: zhantune-problems``, ``format_version`` (FORMAT_VERSIONS), the model, its inputs, the device and
versions, ``problems`` (op, shape, dtype, weight_layout, activation, lookup_key, count, inputs, scalars,
default_us: microseconds, share, note) and ``skipped`` (with the reason). zhantune.problemset tunes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zhantune.config import CONF_DIR
from zhantune.errors import ConfigError, shown
from zhantune.paths import write_atomic

__all__ = ["PROBLEMS_FORMAT", "ROW_KEYS", "MAX_PROBLEMS_BYTES", "write_problems", "read_problems", "problem_keys", "total_trials",
           "op_activation", "row_activation"]

PROBLEMS_FORMAT = "zhantune-problems"
#: the keys of a problem in the file (python -m zhantune.collect writes them all; a hand-written
#: file needs op and shape)
ROW_KEYS = ("op", "shape", "dtype", "weight_layout", "activation", "lookup_key", "count", "inputs", "scalars",
            "default_us", "share", "note")
#: versions read: 1, and 2 (since 2026-11-30: a row may carry ``activation`` and ``note``), which
#: collect writes only for a file that has them, so that an older zhantune refuses it by its version
#: rather than by a key it takes for a typo
FORMAT_VERSIONS = (1, 2)
#: the largest problems file read (bytes)
MAX_PROBLEMS_BYTES = 1 << 20


def write_problems(path: str | Path, problems: list[Any], header: dict[str, Any]) -> Path:
    """Write the problems file (YAML); ``header`` names the model, inputs, device and versions."""
    tunable, skipped = [], []
    for p in problems:
        row: dict[str, Any] = {"lookup_key": p.lookup_key, "count": p.count, "inputs": p.inputs}
        if p.scalars:
            row["scalars"] = p.scalars
        if p.problem is not None and p.reason is None:
            g = p.problem
            act = {"activation": g.activation} if g.activation else {}
            note = {"note": p.note} if getattr(p, "note", None) else {}
            tunable.append({"op": g.op, "shape": list(g.shape), "dtype": g.dtype,
                            "weight_layout": g.weight_layout, **act, **row, "default_us": p.default_us,
                            "share": p.share, **note})
        else:
            skipped.append({"op": p.op_name, **row, "reason": p.reason})
    version = 2 if any("activation" in row or "note" in row for row in tunable) else 1
    doc = {"format": PROBLEMS_FORMAT, "format_version": version, **header, "problems": tunable, "skipped": skipped}
    return write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(doc)), "out")


def _refuse_alias_bombs(path: str | Path, limit: int = 1_000_000) -> None:
    """Raise ConfigError when the file's YAML, with its aliases expanded, holds over ``limit`` nodes
    (a plain 1 MiB file holds fewer): nine anchors nine wide in 330 bytes expand to 9^9 nodes, and
    loading a review's file took 56 s and 500 MB at depth 6, about an hour at depth 8. Counts on the
    composed node graph, where an alias is the node it names: nothing expands."""
    import yaml

    with open(path, encoding="utf-8") as f:
        root = yaml.compose(f, Loader=yaml.SafeLoader)
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) not in sizes:
            sizes[id(node)] = 1  # a node that contains itself counts once
            children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                        else node.value if isinstance(node, yaml.SequenceNode) else [])
            sizes[id(node)] = 1 + sum(size(c) for c in children)
        return sizes[id(node)]

    if root is not None and size(root) > limit:
        raise ConfigError(f"problems={path}: its YAML aliases expand to {size(root):,} values, over the "
                          f"{limit:,} a problems file may hold (python -m zhantune.collect writes no aliases)")


def read_problems(path: str | Path) -> list[dict[str, Any]]:
    """The tunable problems of a problems file, checked; raises ConfigError naming the file and the
    key path (``problems.yaml: problems[1].shape: ...``)."""
    from zhantune.problems import OPS, GemmProblem
    from zhantune.request import DTYPE_NAMES, MAX_SIZE, WEIGHT_LAYOUTS

    size = Path(path).stat().st_size if Path(path).is_file() else 0
    if size > MAX_PROBLEMS_BYTES:  # YAML parsing takes ~20 s and ~200 MB per MiB
        raise ConfigError(f"problems={path}: {size:,} bytes, over the {MAX_PROBLEMS_BYTES >> 20} MiB a problems "
                          "file may hold (a model's file holds a few KiB: one entry per distinct GEMM)")
    try:
        _refuse_alias_bombs(path)
        doc = OmegaConf.to_container(OmegaConf.load(path))
    except FileNotFoundError:
        raise ConfigError(f"problems={path}: no such file") from None
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"problems={path}: not a YAML problems file: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != PROBLEMS_FORMAT:
        raise ConfigError(f"{path}: format: expected {PROBLEMS_FORMAT!r} (write the file with python -m zhantune.collect)")
    version = doc.get("format_version", 1)  # a hand-written file may leave it out: version 1
    if type(version) is not int or version not in FORMAT_VERSIONS:
        raise ConfigError(f"{path}: format_version: this zhantune reads versions 1 and 2, got {version!r}")
    rows = doc.get("problems")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: problems: expected a non-empty list")
    out = []
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        at = f"{path}: problems[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(f"{at}: expected a mapping")
        extra = sorted(set(row) - set(ROW_KEYS), key=str)
        if extra:
            raise ConfigError(f"{at}.{extra[0]}: not a key of a problem (a typo?); allowed: {', '.join(ROW_KEYS)}")
        if row.get("op") not in OPS:
            raise ConfigError(f"{at}.op: {row.get('op')!r}; allowed: {', '.join(sorted(OPS))}")
        if row.get("dtype", "float32") not in DTYPE_NAMES:
            raise ConfigError(f"{at}.dtype: {row.get('dtype')!r}; allowed: {', '.join(DTYPE_NAMES)}")
        layouts = ("kn",) if row["op"] == "bmm" else WEIGHT_LAYOUTS
        if row.get("weight_layout", "kn") not in layouts:
            raise ConfigError(f"{at}.weight_layout: {row.get('weight_layout')!r} for op {row['op']}; "
                              f"allowed: {', '.join(layouts)}")
        act = row_activation(row, at)
        GemmProblem.from_config(row["op"], row.get("shape"), row.get("dtype", "float32"), act,
                                source=f"{at}.shape", weight_layout=row.get("weight_layout", "kn"))
        count, share, key = row.get("count", 1), row.get("share"), row.get("lookup_key")
        if type(count) is not int or not 1 <= count <= MAX_SIZE:  # not a bool: True is an int to isinstance
            raise ConfigError(f"{at}.count: " + (f"{len(str(count))} digits" if type(count) is int and count > MAX_SIZE
                                                  else shown(count)) + f"; a positive integer of at most {MAX_SIZE}")
        if share is not None and (type(share) not in (int, float) or not 0 <= share <= 1):
            raise ConfigError(f"{at}.share: {shown(share)} must be a number in [0, 1] or null")
        default_us = row.get("default_us")
        if default_us is not None and (type(default_us) not in (int, float) or not 0 < default_us < float("inf")):
            raise ConfigError(f"{at}.default_us: {shown(default_us)} must be a positive number of microseconds or null")
        if key is not None and not (isinstance(key, str) and key.isprintable()):
            raise ConfigError(f"{at}.lookup_key: {shown(key)} must be one line of text (an Inductor lookup key) or null")
        if row.get("note") is not None and not (isinstance(row["note"], str) and row["note"].isprintable()):
            raise ConfigError(f"{at}.note: {shown(row['note'])} must be one line of text or null")
        for name, kind in (("inputs", list), ("scalars", dict)):
            if row.get(name) is not None and not isinstance(row[name], kind):
                raise ConfigError(f"{at}.{name}: {shown(row[name])} must be a {kind.__name__} or null")
        # one problem is one study, whatever its rows' lookup keys (collect writes a tunable row only where the
        # problem's own compile makes the model's key): a helper's second row with another key tuned nothing,
        # and its trials and its count were counted twice
        same = (row["op"], str(row["shape"]), row.get("dtype", "float32"), row.get("weight_layout", "kn"), act)
        if same in seen:
            raise ConfigError(f"{at}: the same problem as problems[{seen[same]}]: it would be tuned once and "
                              "counted twice; keep one (its count: how often the model runs it)")
        seen[same] = i
        out.append(row)
    if (total := sum(r.get("share") or 0 for r in out)) > 1.01:  # a helper's two rows of 0.9 (rounded percentages: 1.01)
        raise ConfigError(f"{path}: problems[].share: they add up to {total:g}; each is the problem's part of the "
                          "model's GEMM time, at most 1 in all")
    return out


def problem_keys(path: str | Path) -> list[str]:
    """The problem keys (zhantune.problems.GemmProblem.key) of a problems file, in its order; raises
    ConfigError as :func:`read_problems` does."""
    from zhantune.problems import GemmProblem

    keys = []
    for r in read_problems(path):
        keys.append(GemmProblem.from_config(r["op"], r["shape"], r.get("dtype", "float32"), row_activation(r),
                                            weight_layout=r.get("weight_layout", "kn")).key)
    return keys


def row_activation(row: dict[str, Any], at: str = "problems[]") -> str | None:
    """The activation of a problems file's row: its ``activation`` (collect writes it for a
    linear_act), else its op file's (conf/op/linear_act.yaml: relu); raises ConfigError for one on
    another op or outside zhantune.request.ACTIVATIONS."""
    from zhantune.request import ACTIVATIONS

    act = row.get("activation")
    if act is None and "activation" in row and row["op"] == "linear_act":  # a helper's null: relu, silently
        raise ConfigError(f"{at}.activation: null for op linear_act; give one of {', '.join(ACTIVATIONS)} "
                          "(a row without the key takes the op's: relu)")
    if act is None:
        return op_activation(row["op"])
    if row["op"] != "linear_act":
        raise ConfigError(f"{at}.activation: {shown(act)} for op {row['op']}: only linear_act takes an activation")
    if act not in ACTIVATIONS:
        raise ConfigError(f"{at}.activation: {shown(act)}; allowed: {', '.join(ACTIVATIONS)}")
    return act


def op_activation(op: str) -> str | None:
    """The op file's activation (conf/op/<op>.yaml): what a problems file's row without an
    ``activation`` of its own takes (:func:`row_activation`; a hand-written linear_act row: relu)."""
    return OmegaConf.load(CONF_DIR / "op" / f"{op}.yaml").get("activation")


def total_trials(cfg: Any, rows: list[dict[str, Any]]) -> int:
    """The trials ``rows`` (a problems file's) share: ``search.total_trials``, else ``search.n_trials``
    each; raises ConfigError where that is fewer than one per problem."""
    given = cfg.search.total_trials
    total = given if given is not None else cfg.search.n_trials * len(rows)
    if total < len(rows):
        raise ConfigError(f"search.total_trials={total} is less than the {len(rows)} problems in {cfg.problems}")
    return total
