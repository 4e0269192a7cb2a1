"""zhantune's default search strategy: TPE over the enumerated feasible set, then a local search.

Kernel spaces are finite and full of holes (constraints, configurations that do not compile), and a
trial costs seconds; Optuna's TPE keeps the best of ``n_ei_candidates`` draws over the whole box, many
of them infeasible or measured. This sampler keeps TPE's model (the density ratio l(x)/g(x) between
the best ``gamma`` share of the measured points and the rest, Aitchison-Aitken kernels; Bergstra et
al. 2011, Optuna's multivariate TPE) and maximises it exactly over the unmeasured feasible points.
After ``n_model_trials`` it searches locally: the best-scoring unmeasured point at Hamming distance 1
from the best so far (trust regions over Hamming distance, Wan et al. 2021, CASMOPOLITAN), globally
when that is exhausted. Every ``cold_model_every``-th proposal (3) comes from a Bayesian linear model
of log time on one-hot parameter values (the transfer model with no source), by Thompson sampling
over every unmeasured point (docs/search.md, "Cold start": 486 against 429 of 600 replayed runs
within 1.10x of the optimum).

Transfer (:meth:`set_prior`, zhantune.search.transfer): with scores for most configs (other
devices' measurements of this problem), two of every three proposals come from the transfer model
(zhantune.search.surrogate.TransferModel, Thompson sampling) and the third from TPE inside the best
``transfer_quantile`` of the scored configs (the *region*); with scores for a few (or from
neighbouring shapes), their best configs are proposed first, then the cold search.

:func:`zhantune.search.driver.run_search` calls :meth:`bind` before the first trial. The study
(trials of every worker sharing the storage) is its only state, so several workers can use one
study. Spaces too large to enumerate fall back to Optuna's multivariate TPE.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from zhantune.search.feasible import FeasibleSet, enumerate_feasible
from zhantune.search.parzen import log_density_ratio, one_hot
from zhantune.search.schema import Space
from zhantune.search.study import INTERRUPTED_ATTR, RESULT_OF_ATTR
from zhantune.search.surrogate import TransferModel

__all__ = ["FeasibleTPESampler"]

#: largest one-hot matrix of the feasible set kept in memory (float64 cells: 32 MiB)
_MAX_ONE_HOT_CELLS = 4_000_000


class FeasibleTPESampler(optuna.samplers.BaseSampler):
    """TPE over the feasible set, with a Hamming-neighbourhood local search after the model phase,
    and every ``cold_model_every``-th proposal from a Bayesian per-value model (Thompson sampling).

    Args:
        seed: random seed (start-up points and ties).
        n_startup_trials: measured trials drawn uniformly from the feasible set before the model.
        n_model_trials: measured trials after which proposals stay near the best point.
        gamma: share of measured trials in the "good" density l(x) (at least one trial).
        kernel_alpha: Aitchison-Aitken smoothing: a kernel gives 1 - alpha (+ alpha / n_values) to
            its own value and alpha / n_values to each other value of a dim.
        max_neighbourhood: largest Hamming distance searched around the best point.
        max_scored: most unmeasured points scored per TPE proposal (a uniform sample beyond it),
            which bounds the cost of a proposal on large spaces; the models' turns score every
            unmeasured point, or this many where the space's one-hot codes are too large to keep.
        transfer_seeds: with a partial prior (scores for fewer than half of the feasible points, as
            a tune of a neighbouring shape gives), how many of its best-scored configs are proposed
            first (a complete prior proposes none: measured, seeds pull the search into the other
            device's basin; docs/search.md).
        transfer_tpe_every: with a complete prior, one proposal in this many comes from TPE in the
            region, the others from the transfer model (0: all from the model).
        transfer_quantile: the region: this share of the scored configs, best first.
        transfer_startup_trials: with a complete prior, TPE draws uniformly from the region while
            fewer results than this are in (not ``n_startup_trials``), and stays in the region until
            this many of its points have results (:meth:`_trust_region`).
        transfer_slope_sd, transfer_effect_sd, transfer_noise_sd: the transfer model's prior sds
            (zhantune.search.surrogate.TransferModel, log time).
        cold_model_every: without a complete prior (a cold start, or a partial prior once its seeds
            are tried), after the ``n_startup_trials`` uniform draws one proposal in this many
            (counted over every point tried or asked ahead) comes from the transfer model with no
            source (per-value effects alone, Thompson sampling, over every unmeasured point: see
            ``max_scored``), the others from TPE and its local search; it pulls seeds out of a
            basin TPE's density ratio keeps them in (docs/search.md, "Cold start"). 0: TPE alone.
            Spaces too large to enumerate use Optuna's TPE and ignore it.
        refresh_s: the study's trials are read from the storage at most once per this many
            seconds (every proposal when trials take longer, as real compiles and benchmarks do);
            in between, this process's own results are known from ``after_trial``. 0 reads at every
            proposal. Bounds the storage reads of fast studies (replay, many workers).
    """

    def __init__(self, seed: int | None = None, n_startup_trials: int = 16, n_model_trials: int = 30, gamma: float = 0.1,
                 kernel_alpha: float = 0.6, max_neighbourhood: int = 1, max_scored: int = 4096, refresh_s: float = 1.0,
                 transfer_seeds: int = 3, transfer_tpe_every: int = 3, transfer_quantile: float = 0.1,
                 transfer_startup_trials: int = 24, transfer_slope_sd: float = 0.3, transfer_effect_sd: float = 0.3,
                 transfer_noise_sd: float = 0.1, cold_model_every: int = 3):
        for name, value, ok, allowed in (
                ("gamma", gamma, 0 < gamma <= 1, "in (0, 1]"), ("kernel_alpha", kernel_alpha, 0 < kernel_alpha < 1, "in (0, 1)"),
                ("transfer_seeds", transfer_seeds, transfer_seeds >= 0, "at least 0"),
                ("cold_model_every", cold_model_every, cold_model_every >= 0, "at least 0"),
                ("transfer_tpe_every", transfer_tpe_every, transfer_tpe_every >= 0, "at least 0"),
                ("transfer_quantile", transfer_quantile, 0 < transfer_quantile <= 1, "in (0, 1]")):
            if not ok:
                raise ValueError(f"{name}={value} must be {allowed}")
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self.n_startup_trials = n_startup_trials
        self.n_model_trials = n_model_trials
        self.gamma = gamma
        self.kernel_alpha = kernel_alpha
        self.max_neighbourhood = max_neighbourhood
        self.max_scored = max_scored
        self.refresh_s = refresh_s
        self.transfer_seeds = transfer_seeds
        self.transfer_tpe_every = transfer_tpe_every
        self.transfer_quantile = transfer_quantile
        self.transfer_startup_trials = transfer_startup_trials
        self.cold_model_every = cold_model_every
        self._model = TransferModel(transfer_slope_sd, transfer_effect_sd, transfer_noise_sd)
        #: config hash -> prior score (lower is better; zhantune.search.transfer.Prior.scores)
        self._prior: dict[str, float] | None = None
        #: with a partial prior: the seeds (best-scored feasible rows, best first)
        self._seed_rows: np.ndarray = np.zeros(0, dtype=np.int64)
        #: with a prior: its score per feasible row (nan: not scored, inf: only failed there)
        self._score: np.ndarray | None = None
        #: with a complete prior: the region (the best ``transfer_quantile`` of the scored rows), and
        #: the scores filled in (TransferModel.filled) with the rows in their order, best first
        self._region: np.ndarray | None = None
        self._filled = self._order = np.zeros(0)
        self._prior_complete, self._prior_model = False, True
        #: for the summary: the config hashes of the feasible points the prior scores, how many of its
        #: seeds this sampler proposed, and how many it found tried (earlier, or Inductor's own seeds)
        self.prior_hashes: set[str] | None = None
        self.prior_seeds_proposed = self.prior_seeds_tried = 0
        self._feasible: FeasibleSet | None = None
        #: the point chosen in before_trial for each running trial of this process, by trial number
        #: (a point asked ahead, with compile ahead, counts as tried before the storage says so)
        self._pending: dict[int, dict[str, Any]] = {}
        #: (row, value) of each finished trial by number, for the bound study (a finished trial is immutable)
        self._finished: dict[int, tuple[int, float | None]] = {}
        #: the study's trials as last read (plus this process's results since), and when it was read
        self._known: dict[int, tuple[int, float | None]] = {}
        self._last_read_s = -float("inf")
        #: one-hot codes of every feasible point (None: computed per proposal, for large spaces)
        self._one_hot: np.ndarray | None = None
        self._fallback: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True)
        self._random = optuna.samplers.RandomSampler(seed=seed)

    # -- binding ----------------------------------------------------------------------------
    def bind(self, space: Space, problem_vars: dict[str, Any]) -> None:
        """Enumerate the feasible points of ``space`` (falls back to TPE when it is too large)."""
        self._feasible = fs = enumerate_feasible(space, problem_vars)
        self._finished, self._known, self._last_read_s = {}, {}, -float("inf")
        self._one_hot = None
        if fs is not None and len(fs) * int((fs.sizes + 1).sum()) <= _MAX_ONE_HOT_CELLS:
            self._one_hot = one_hot(fs.codes, fs.sizes)
        self._bind_prior()

    def set_prior(self, scores: dict[str, float] | None, model: bool = True) -> None:
        """Scores of configs measured elsewhere, by config hash (lower is better: the mean log
        regret of zhantune.search.transfer.Prior; inf for a config that failed there); None: none.
        ``model``: a complete prior may drive the transfer model (other devices' rankings); False:
        seeds only, however many configs it scores (neighbouring shapes: the model's premise, a
        ranking that holds here scaled, is measured between devices, not between shapes). Takes
        effect at :meth:`bind` (or at once when already bound)."""
        self._prior = dict(scores) if scores else None
        self._prior_model = model
        if self._feasible is not None:
            self._bind_prior()

    def _bind_prior(self) -> None:
        """Map the prior's scores to feasible rows. A complete prior (scores for at least half of the
        feasible set; ``model``) drives the proposals (the transfer model's and TPE's in the region,
        its best ``transfer_quantile``); a partial one gives its ``transfer_seeds`` best, proposed first."""
        fs = self._feasible
        self._seed_rows, self._score, self._region = np.zeros(0, dtype=np.int64), None, None
        self._prior_complete, self.prior_hashes = False, None
        self.prior_seeds_proposed = self.prior_seeds_tried = 0
        if fs is None or not self._prior:
            return
        score, self.prior_hashes = np.full(len(fs), np.nan), set()
        for row, (branch, values) in enumerate(fs.points):
            if (value := self._prior.get(chash := branch.candidate(values).config_hash)) is not None:
                score[row] = value
                self.prior_hashes.add(chash)
        scored = np.flatnonzero(~np.isnan(score))
        if not len(scored):
            return
        self._score, self._prior_complete = score, self._prior_model and 2 * len(scored) >= len(fs)
        order = scored[np.argsort(score[scored], kind="stable")]  # ties: by row, deterministic
        if self._prior_complete:
            self._filled = self._model.filled(score)
            self._order = np.argsort(self._filled, kind="stable")
            self._region = np.zeros(len(fs), dtype=bool)
            self._region[order[: max(1, int(np.ceil(self.transfer_quantile * len(order))))]] = True
        else:  # partial: its best configs first, then the whole space
            self._seed_rows = order[np.isfinite(score[order])][: self.transfer_seeds]

    @property
    def prior_scored(self) -> int | None:
        """Feasible points the prior scores (None without a prior or with none scored)."""
        return None if self._score is None else int((~np.isnan(self._score)).sum())

    @property
    def prior_region_size(self) -> int | None:
        """Feasible points in the transfer region (None without a complete prior)."""
        return None if self._region is None else int(self._region.sum())

    @property
    def prior_complete(self) -> bool:
        """Whether the prior scores at least half of the feasible set (the transfer model proposes)."""
        return self._prior_complete

    @property
    def prior_seed_count(self) -> int:
        """How many best-scored configs of the prior are proposed first (after the enqueued seeds)."""
        return len(self._seed_rows)

    def count_seeds_tried(self, study: optuna.Study, tried: list[int] | None = None) -> None:
        """Count the prior's seeds found tried that this sampler did not propose (``tried``: the feasible
        rows tried, asked ahead included; None: the study's, on a bound sampler): a run of enqueued seeds never asks."""
        rows = tried if tried is not None else [row for row, _ in self._known_trials(study).values() if row >= 0]
        found = int(np.isin(self._seed_rows, np.asarray(rows, dtype=np.int64)).sum()) - self.prior_seeds_proposed
        self.prior_seeds_tried = max(self.prior_seeds_tried, found)

    @property
    def feasible_set(self) -> FeasibleSet | None:
        return self._feasible

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._fallback.reseed_rng()
        self._random.reseed_rng()

    # -- Optuna sampler protocol ------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._feasible is None:
            return self._fallback.infer_relative_search_space(study, trial)
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._feasible is None:
            return self._fallback.sample_relative(study, trial, search_space)
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self._feasible is None:
            self._fallback.before_trial(study, trial)
            return
        if "fixed_params" in trial.system_attrs:
            return  # an enqueued point (seeds, dedupe): Optuna answers it from the queue
        if (row := self.next_row(study)) is not None:
            self._pending[trial.number] = self._feasible.trial_params(row)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if self._feasible is None:
            return self._fallback.sample_independent(study, trial, param_name, param_distribution)
        point = self._pending.get(trial.number, {})
        if param_name in point:
            return point[param_name]
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._pending.pop(trial.number, None)
        if self._feasible is None:
            self._fallback.after_trial(study, trial, state, values)
            return
        # ``trial`` is still RUNNING here (Optuna calls this before storing the state)
        value = values[0] if values else None
        self._known[trial.number] = self._finished[trial.number] = self._classify(trial, state, value)

    # -- the strategy -----------------------------------------------------------------------
    def next_row(self, study: optuna.Study) -> int | None:
        """The feasible row to measure next; None when every feasible point has been tried."""
        fs = self._feasible
        assert fs is not None
        known = self._known_trials(study)
        tried: list[int] = []
        rows: list[int] = []
        values: list[float] = []
        for number in sorted(known):
            row, value = known[number]
            if row < 0:
                continue
            tried.append(row)
            if value is not None:
                rows.append(row)
                values.append(value)
        # points asked ahead and not yet in the storage's answer (one read after its ask is, with
        # its params: counted once)
        tried.extend(fs.row_of(params) for number, params in self._pending.items() if known.get(number, (-1,))[0] < 0)
        unseen = np.ones(len(fs), dtype=bool)
        unseen[tried] = False
        self.count_seeds_tried(study, tried)
        if not unseen.any():
            return None
        n_startup = self.n_startup_trials
        for row in self._seed_rows:  # transfer: the best configs elsewhere first
            if unseen[row]:
                self.prior_seeds_proposed += 1
                return int(row)
        if self._prior_complete:
            every = self.transfer_tpe_every
            if not every or len(tried) % every != every - 1:  # counted over every point asked, pending too
                return self._transfer_row(np.array(rows, dtype=np.int64), np.array(values), unseen)
            # TPE's turn: the density ratio (after uniform draws) inside the region while it holds the best
            n_startup = self.transfer_startup_trials
            inside = unseen & self._region
            if inside.any() and self._trust_region(rows, values):
                unseen = inside
        if len(rows) < n_startup:
            return int(self._rng.choice(np.flatnonzero(unseen)))
        every = self.cold_model_every
        if every and not self._prior_complete and len(tried) % every == every - 1:  # pending counted too
            return self._cold_model_row(np.array(rows, dtype=np.int64), np.array(values), unseen)
        candidates = unseen
        if len(rows) >= self.n_model_trials:
            best = rows[int(np.argmin(values))]
            distance = (fs.codes != fs.codes[best]).sum(axis=1)
            for radius in range(1, self.max_neighbourhood + 1):
                near = (distance == radius) & unseen
                if near.any():
                    candidates = near
                    break
        idx = np.flatnonzero(candidates)
        if len(idx) > self.max_scored:  # like TPE's n_ei_candidates: score a uniform sample
            idx = self._rng.choice(idx, size=self.max_scored, replace=False)
        score = log_density_ratio(np.array(rows), np.array(values), idx, gamma=self.gamma, alpha=self.kernel_alpha,
                                  sizes=fs.sizes, one_hot_rows=self._one_hot_rows, rng=self._rng)
        top = idx[score >= score.max() - 1e-9]  # exact ties (same codes) differ only by rounding
        return int(self._rng.choice(top))

    def _trust_region(self, rows: list[int], values: list[float]) -> bool:
        """Whether TPE's proposals stay in the transfer region: until ``transfer_startup_trials`` of
        its points have results, then while the best result is in it (a better point outside, one of
        Inductor's own configs or the model's, means the other devices' ranking does not hold here)."""
        inside = [v for r, v in zip(rows, values, strict=True) if self._region[r]]
        if len(inside) < self.transfer_startup_trials:
            return True
        return min(inside) <= min(values)

    def _transfer_row(self, rows: np.ndarray, values: np.ndarray, unseen: np.ndarray) -> int:
        """With a complete prior: the unmeasured point best under one posterior draw of the transfer
        model (zhantune.search.surrogate.TransferModel), fitted to every result here (Inductor's own
        seeds included). A config that only failed on the other devices is proposed only when no
        other is left; one they did not measure counts as their average."""
        pool = unseen & ~np.isinf(self._score)
        limit = None if self._one_hot is not None else self.max_scored  # a huge space: score a subset
        return self._model.pick(self._filled, self._order, pool if pool.any() else unseen, rows, values,
                                self._one_hot_rows, self._rng, limit)

    def _cold_model_row(self, rows: np.ndarray, values: np.ndarray, unseen: np.ndarray) -> int:
        """Without a complete prior: the unmeasured point best under one posterior draw of the transfer
        model with no source (every prior score 0: log time = intercept + per-value effects, Thompson
        sampling), among every unmeasured point; where the one-hot codes are not kept (a space over
        _MAX_ONE_HOT_CELLS), among a uniform sample of ``max_scored`` of them."""
        idx = np.flatnonzero(unseen)
        if self._one_hot is None and len(idx) > self.max_scored:  # a huge space: score a uniform sample
            unseen = np.zeros_like(unseen)
            unseen[self._rng.choice(idx, size=self.max_scored, replace=False)] = True
        n = len(self._feasible)
        return self._model.pick(np.zeros(n), np.arange(n), unseen, rows, values, self._one_hot_rows, self._rng)

    def _known_trials(self, study: optuna.Study) -> dict[int, tuple[int, float | None]]:
        """(row, value) of every trial of the study by number, read from the storage at most once per
        ``refresh_s`` seconds; in between, this process's own results (after_trial) keep it exact
        for one worker. Other workers' points are guarded by claims, not by this view."""
        now = time.monotonic()
        if now - self._last_read_s < self.refresh_s:
            return self._known
        known: dict[int, tuple[int, float | None]] = {}
        for t in study.get_trials(deepcopy=False):
            seen = self._finished.get(t.number)
            if seen is None:
                seen = self._classify(t, t.state, t.value)
                if t.state.is_finished():  # a finished trial never changes: classify it once
                    self._finished[t.number] = seen
            known[t.number] = seen
        self._known, self._last_read_s = known, now
        return known

    def _classify(self, t: FrozenTrial, state: TrialState, value: float | None) -> tuple[int, float | None]:
        """(row, value) of a trial in ``state``: row -1 when it is not a tried feasible point
        (infeasible, no params, interrupted, a result of another config: a space with other fixed
        values under this study); value None while it has no result, inf for a measured failure."""
        row = self._feasible.row_of(t.params) if t.params else None
        told = t.user_attrs.get(RESULT_OF_ATTR)  # the config hash it was told a result of
        if row is None or t.user_attrs.get(INTERRUPTED_ATTR) or told not in (None, self._feasible.config_hash(row)):
            return -1, None
        if state == TrialState.COMPLETE and value is not None:
            return row, float(value)
        if state == TrialState.FAIL:
            return row, np.inf
        return row, None

    def _one_hot_rows(self, rows: np.ndarray) -> np.ndarray:
        """One-hot codes of feasible rows (precomputed at bind for spaces of moderate size)."""
        if self._one_hot is not None:
            return self._one_hot[rows]
        return one_hot(self._feasible.codes[rows], self._feasible.sizes)
