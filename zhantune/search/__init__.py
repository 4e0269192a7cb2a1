"""Search: spaces and constraints, samplers, and the Optuna study driver."""

from zhantune.search.driver import run_search
from zhantune.search.feasible_tpe import FeasibleTPESampler
from zhantune.search.samplers import make_sampler
from zhantune.search.schema import Branch, Candidate, Param, Space, load_space, param_distribution

__all__ = ["Branch", "Candidate", "FeasibleTPESampler", "Param", "Space", "load_space", "make_sampler",
           "param_distribution", "run_search"]
