"""TPE's Parzen estimators over categorical codes, for the default sampler (feasible_tpe.py).

The density ratio l(x)/g(x) of Bergstra et al. 2011 with multivariate product kernels, as in Optuna's
multivariate TPE: l around the best ``gamma`` share of the measured points, g around the rest, one
Aitchison-Aitken kernel per parameter (categorical values: a kernel gives 1 - alpha + alpha / n to
its own value and alpha / n to each other value of a parameter with n values). Points and centres
are one-hot codes (:func:`one_hot`), so every (point, centre) kernel is one matrix product.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["one_hot", "log_mixture", "log_density_ratio"]

#: most "bad" trials used as centres of g(x) per proposal (a uniform sample beyond it)
MAX_BAD_CENTRES = 256


def one_hot(codes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(n, sum(sizes + 1)) float64 from value indices ``codes`` (n, dims): one column per (dim, value
    index), value -1 (a param the branch lacks) in the first column of its dim."""
    offset = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]])
    out = np.zeros((len(codes), int((sizes + 1).sum())))
    out[np.repeat(np.arange(len(codes)), codes.shape[1]), (codes + 1 + offset[None, :]).ravel()] = 1.0
    return out


def log_mixture(points: np.ndarray, centres: np.ndarray, sizes: np.ndarray, alpha: float) -> np.ndarray:
    """log of the mean over ``centres`` of the product over dims of Aitchison-Aitken kernels, at
    ``points`` (both one-hot codes; ``sizes``: values per dim). Shape (len(points),).

    Per dim, log k = log(a/n) + [same value] * (log(1 - a + a/n) - log(a/n)); summed over dims this
    is a constant plus a matrix product of one-hot codes, one BLAS call for every (point, centre).
    """
    n_values = np.maximum(sizes, 1).astype(np.float64)
    off = np.log(alpha / n_values)
    weight = np.repeat(np.log(1 - alpha + alpha / n_values) - off, sizes + 1)  # per one-hot column
    log_k = points @ (centres * weight).T + off.sum()
    peak = log_k.max(axis=1, keepdims=True)
    return (peak + np.log(np.exp(log_k - peak).mean(axis=1, keepdims=True)))[:, 0]


def log_density_ratio(rows: np.ndarray, values: np.ndarray, points: np.ndarray, *, gamma: float, alpha: float,
                      sizes: np.ndarray, one_hot_rows: Callable[[np.ndarray], np.ndarray],
                      rng: np.random.Generator) -> np.ndarray:
    """log l(x) - log g(x) at the rows ``points``, from the measured ``rows`` and their ``values``
    (lower is better; inf: failed): l around the best ceil(gamma * n) (at least one), g around the
    rest (a uniform sample of MAX_BAD_CENTRES beyond that). ``one_hot_rows(rows)``: their codes."""
    order = np.argsort(values, kind="stable")
    n_good = max(1, int(np.ceil(gamma * len(values))))
    good, bad = rows[order[:n_good]], rows[order[n_good:]]
    if len(bad) > MAX_BAD_CENTRES:  # bound the cost on long studies: a uniform sample of g's centres
        bad = rng.choice(bad, size=MAX_BAD_CENTRES, replace=False)
    at = one_hot_rows(points)
    log_l = log_mixture(at, one_hot_rows(good), sizes, alpha)
    log_g = log_mixture(at, one_hot_rows(bad), sizes, alpha) if len(bad) else np.zeros(len(points))
    return log_l - log_g
