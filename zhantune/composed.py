"""Checks of a composed Hydra config before a task starts (zhantune.cli.mark_task_started): a key a
``+`` override added that nothing reads, an interpolation that does not resolve. Each returns the
one-line message of a user error (exit code 2), or None."""

from __future__ import annotations

from typing import Any

__all__ = ["added_key_problem", "unresolved_problem"]


def added_key_problem(cfg: Any) -> str | None:
    """The message for the first ``+key=value`` or ``++key=value`` override of this Hydra job that
    added a key its app's config schema (the dataclasses of zhantune.config) does not have: nothing
    reads such a key, so the option would be silently ignored (Hydra's own message for a mistyped
    key suggests the ``+``). Keys under a free-form mapping (``space``, ``search.sampler``) pass, and
    so does a key an interpolation reads (``+M=64 'shape=[${M},${M},${M}]'``)."""
    import dataclasses
    import re

    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import DictConfig, OmegaConf

    try:
        task = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
    except ValueError:  # not in a Hydra job (the compose API)
        return None
    # every absolute key an interpolation reads: ``${a.b}`` and oc.select's first argument
    # (``${oc.select:a.b,0}``); another resolver's arguments (``${oc.env:PW}``) and relative keys are not keys
    read = set()
    for ref in re.findall(r"\$\{([^${}]*)\}", OmegaConf.to_yaml(cfg)):
        resolver, _, args = ref.strip().partition(":") if ":" in ref else ("", "", ref.strip())
        name = args.split(",")[0].strip() if resolver.strip() in ("", "oc.select") else ""
        if re.fullmatch(r"[A-Za-z_][\w.]*", name):
            read.add(name)
    for o in OverridesParser.create().parse_overrides(task):
        if not (o.is_add() or o.is_force_add()) or o.key_or_group.startswith("hydra."):
            continue
        node, path = cfg, o.key_or_group.split(".")
        if any(n == o.key_or_group or n.startswith(o.key_or_group + ".") or o.key_or_group.startswith(n + ".")
               for n in read):
            continue
        for i, part in enumerate(path):
            schema = OmegaConf.get_type(node)
            if dataclasses.is_dataclass(schema) and part not in (names := [f.name for f in dataclasses.fields(schema)]):
                where = ".".join(path[:i])
                return (f"override {'+' * (1 + o.is_force_add())}{o.key_or_group}=...: {'.'.join(path[:i + 1])!r} is not "
                        f"an option{f' of {where}' if where else ''}, and nothing would read it; options"
                        f"{f' of {where}' if where else ''}: {', '.join(names)}")
            node = node.get(part) if isinstance(node, DictConfig) else None
            if not isinstance(node, DictConfig):
                break
    return None


def unresolved_problem(cfg: Any) -> str | None:
    """The message for the first value of the composed config whose interpolation does not resolve
    (``dtype=${nope}``, ``${oc.env:UNSET}``, an interpolated value of the wrong type), naming the
    override it came from, or the config key where a config file holds it; None when every value
    resolves. Checked before the task starts, so that a bad interpolation is a one-line user error
    (exit code 2) and not a traceback after hours of tuning."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        why = str(getattr(e, "msg", None) or e).splitlines()[0]
        where = _override_of(cfg, key) or (f"config key {key}" if key else "the config")
        return (f"{where}: {why}; an interpolation reads a key of this config (${{section.option}}) or a "
                "resolver's value (${oc.env:NAME} of a variable that is set)")
    return None


def _override_of(cfg: Any, key: str) -> str | None:
    """``override <as typed>`` for the command-line override that set ``key`` (or a key above it),
    else for the override whose own value does not resolve (``search.seed=${oc.env:UNSET}`` fails
    first where a shipped file reads it: search.sampler.seed is ``${search.seed}``)."""
    import re

    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    try:
        task = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
        parsed = OverridesParser.create().parse_overrides(task)
    except Exception:  # not in a Hydra job, or nothing to parse
        return None
    for o in reversed(parsed):  # the last override of a key wins
        name = o.key_or_group
        if key == name or re.match(re.escape(name) + r"[.\[]", key):
            return f"override {o.input_line}"
    # the deepest keys first, so that a group choice (search=tpe) is not taken for the value under it
    for o in sorted(parsed, key=lambda o: -o.key_or_group.count(".")):
        if o.is_delete() or o.key_or_group.startswith("hydra."):
            continue
        try:
            node = OmegaConf.select(cfg, o.key_or_group, throw_on_resolution_failure=True)
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)
        except Exception:
            return f"override {o.input_line}"
    return None
