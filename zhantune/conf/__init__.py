"""Hydra config tree of zhantune (a package so that it ships in the wheel and Hydra finds it)."""
