"""Checks of single Hydra overrides that zhantune.cli.check_group_overrides runs before Hydra
composes anything: a database password that Hydra's grammar splits, and overrides naming code for
Hydra to instantiate (outside zhantune's _target_ allowlist)."""

from __future__ import annotations

__all__ = ["password_split", "hydra_instantiates"]


def _walk(node: object) -> tuple[list[str], list[str]]:
    """(every string, every mapping key) in a parsed override value."""
    strings: list[str] = []
    keys: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, str):
            strings.append(n)
        elif isinstance(n, dict):
            keys.extend(str(k) for k in n)
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return strings, keys


def password_split(o: object) -> bool:
    """Whether Hydra's grammar split a database URL with a password written in override ``o``: an
    item of its parsed value holds an ``@`` but no ``://`` (``sources=[postgresql://u:a,b@h/db]``
    parses to ``...u:a`` and ``b@h/db``; the second was saved to .hydra/config.yaml, masked nowhere:
    a review's finding). Escaped (``a\\,b``) or quoted, and several URLs in one list, pass."""
    from zhantune.redact import url_secrets

    if o.is_sweep_override() or o.is_delete():
        return False
    if not any(url_secrets([o.input_line.partition("=")[2]])):
        return False
    strings, _ = _walk(o.value())
    return any("@" in v and "://" not in v for v in strings)


def hydra_instantiates(o: object) -> bool:
    """Whether override ``o`` sets something Hydra instantiates (a callback, a ``_target_``, a logging
    ``()`` factory) through its key (``hydra.callbacks.x._target_=os.makedirs``) or a mapping value
    (``++hydra={callbacks: ...}``): code outside the _target_ allowlist. Sweep parameters
    (``hydra.sweeper.params.*``) are the app's values, not Hydra's, and pass."""
    group = o.key_or_group
    if not (group == "hydra" or group.startswith("hydra.")) or group.startswith("hydra.sweeper.params."):
        return False
    if group == "hydra" or group.startswith("hydra.callbacks") or "_target_" in group or "()" in group:
        return True
    if o.is_delete() or o.is_sweep_override():
        return False
    _, keys = _walk(o.value())
    return any(k in ("_target_", "()", "callbacks") for k in keys)
