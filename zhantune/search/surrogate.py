"""The transfer model: this device's log times as the other devices' ranking plus per-value effects.

With a complete prior (other devices' measurements of the same problem, zhantune.search.transfer),
the default sampler models a config's log time here as

    log t(x) = b0 + b1 * s(x) + sum over parameters p of w[p, x_p] + noise

where s(x) is the prior's score (the mean log regret of x on the other devices), b1 says how much
of the other devices' ranking holds here, and w[p, v] says how much faster or slower value v of
parameter p is here than there (a bigger cache, another warp size: one parameter's values move
together). A Bayesian linear regression with Gaussian priors b0 ~ N(0, 10^2), b1 ~ N(1,
slope_sd^2), w ~ N(0, effect_sd^2) and noise ~ N(0, noise_sd^2): before any result the model is the
other devices' ranking with uncertain per-value effects; each result moves it towards this device.
The next point is chosen by Thompson sampling (one draw of the weights from the posterior, its best
unmeasured point): draws differ in the per-value effects, so early proposals are varied points
near the top of the other devices' ranking, and later ones follow the evidence. Measurements on
devices the method was chosen on and the alternatives tried are in docs/search.md ("Transfer").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular

__all__ = ["TransferModel"]

#: prior standard deviation of the intercept (log microseconds: any time scale)
_INTERCEPT_SD = 10.0
#: a failed config's value: this much (in log time) above the slowest config measured here
_FAILED_PENALTY = 1.0


class TransferModel:
    """Bayesian linear regression of log time on (1, prior score, one-hot parameter values).

    Args:
        slope_sd: prior sd of b1 around 1 (how far this device's ranking may scale the others').
        effect_sd: prior sd of each per-value effect w (log time: 0.3 is 1.35x either way).
        noise_sd: sd of what the model cannot explain (log time).

    Raises ValueError when an sd is not a positive number.
    """

    def __init__(self, slope_sd: float = 0.3, effect_sd: float = 0.3, noise_sd: float = 0.1):
        for name, value in (("slope_sd", slope_sd), ("effect_sd", effect_sd), ("noise_sd", noise_sd)):
            if not value > 0 or not np.isfinite(value):
                raise ValueError(f"{name}={value} must be above 0")
        self.slope_sd, self.effect_sd, self.noise_sd = slope_sd, effect_sd, noise_sd

    @staticmethod
    def design(score: np.ndarray, one_hot: np.ndarray) -> np.ndarray:
        """Feature rows (n, 2 + one_hot columns) for points with prior ``score`` (n,) and ``one_hot``
        codes (n, c)."""
        return np.hstack([np.ones((len(score), 1)), score[:, None], one_hot])

    @staticmethod
    def filled(score: np.ndarray) -> np.ndarray:
        """Prior scores with every point given one: a config the other devices did not measure (nan)
        at their average, one that only failed there (inf) 1 above their worst."""
        finite = np.isfinite(score)
        mean, worst = (score[finite].mean(), score[finite].max()) if finite.any() else (0.0, 0.0)
        return np.where(np.isinf(score), worst + 1.0, np.where(np.isnan(score), mean, score))

    def pick(self, filled: np.ndarray, order: np.ndarray, candidates: np.ndarray, rows: np.ndarray,
             values: np.ndarray, one_hot: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
             limit: int | None = None) -> int:
        """The candidate row best under one posterior draw (Thompson sampling).

        ``filled``: every row's prior score (:meth:`filled`), ``order``: the rows by it, best first;
        ``candidates``: bool mask of the rows that may be proposed; ``rows``/``values``: the measured
        rows and their times (inf: failed); ``one_hot(rows)``: their one-hot parameter codes.
        ``limit``: score at most this many candidates (half the best by prior score, half a uniform
        sample of the rest), for spaces too large to score whole; None: all.
        """
        idx = np.flatnonzero(candidates)
        if limit is not None and len(idx) > limit:
            top = order[candidates[order]][: limit // 2]
            rest = np.setdiff1d(idx, top, assume_unique=True)
            idx = np.concatenate([top, rng.choice(rest, size=limit - len(top), replace=False)])
        weights = self.sample_weights(self.design(filled[rows], one_hot(rows)), values, rng)
        return int(idx[int(np.argmin(self.design(filled[idx], one_hot(idx)) @ weights))])

    def sample_weights(self, features: np.ndarray, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw (p,) of the weights from the posterior given measured ``features`` (m, p) and
        their objective ``values`` (m,), times (any unit; inf or a time <= 0: a failed config); the
        model is of centred log time. With m = 0 a draw from the prior. Non-finite features raise
        numpy's LinAlgError."""
        p = features.shape[1]
        mean0 = np.zeros(p)
        mean0[1] = 1.0
        sd0 = np.full(p, self.effect_sd)
        sd0[0], sd0[1] = _INTERCEPT_SD, self.slope_sd
        precision = np.diag(1.0 / sd0**2)
        shift = mean0 / sd0**2
        if len(values):
            y = _log_values(values)
            precision = precision + features.T @ features / self.noise_sd**2
            shift = shift + features.T @ y / self.noise_sd**2
        factor = cho_factor(precision, lower=True)
        mean = cho_solve(factor, shift)
        # precision = L L^T: mean + L^-T z has covariance precision^-1
        return mean + solve_triangular(factor[0], rng.standard_normal(p), lower=True, trans="T")


def _log_values(values: np.ndarray) -> np.ndarray:
    """Log times, centred; a failed config (inf, or a time <= 0, which no run gives) at
    _FAILED_PENALTY above the slowest that ran."""
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values) & (values > 0)
    y = np.zeros(len(values))
    y[ok] = np.log(values[ok])
    if not ok.any():
        return np.zeros(len(y))
    y[~ok] = y[ok].max() + _FAILED_PENALTY
    return y - y[ok].mean()
