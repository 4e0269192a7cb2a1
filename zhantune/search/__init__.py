"""Search: the space and its constraints, samplers, and the loop that asks Optuna for candidates.

- schema.py: a YAML space -> branches, params as Optuna distributions, constraints (simpleeval);
  feasible.py: the feasible set; samplers.py, feasible_tpe.py: the samplers by name (parzen.py:
  the default's Parzen estimators);
- seeds.py: what Inductor itself would try, proposed first; transfer.py: a prior from the storage;
  surrogate.py: the transfer model the default sampler proposes from with a complete prior;
- study.py: the Optuna study in the shared storage, heartbeats; driver.py: the ask/tell loop
  (run_search) shared by the tune and the offline strategy benchmark.
"""

from zhantune.search.driver import run_search
from zhantune.search.feasible_tpe import FeasibleTPESampler
from zhantune.search.samplers import make_sampler
from zhantune.search.schema import Branch, Candidate, Param, Space, load_space, param_distribution

__all__ = ["Branch", "Candidate", "FeasibleTPESampler", "Param", "Space", "load_space", "make_sampler",
           "param_distribution", "run_search"]
