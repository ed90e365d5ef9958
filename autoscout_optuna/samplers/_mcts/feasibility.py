"""Learned infeasibility: how likely a planned structure is to FAIL (pure: codes in, numbers out).

A trial that failed *on its prefix* (an invalid layout found as soon as its last offending
choice was made) is already handled by the dead-end rule of ``descent.py``. A trial that failed
*after* asking everything (out of memory, an invalid combination checked at launch) says more:
resource use is roughly a sum of per-choice contributions in log space (a larger micro-batch, no
recomputation, less sharding each add memory), so a failure at one structure makes the
structures that add even more likely to fail too. A logistic regression over the one-hot
encoded structure is exactly a threshold on such a sum, and it is fitted on the finished trials
of the history every time a plan is made (no state to keep). A numeric column (micro-batch,
parallel degrees, ZeRO stage) also gets a trend along its values (log2 of positive ones), so
the sum extends to values and combinations no trial has run (:func:`numeric_trends`).

Only rows that asked as many params as the shortest feasible row are training rows: a row that
failed earlier failed on its prefix, and its missing params would teach the model that absence
causes failure.

With a memory estimate (``estimate.py``) the failures that ran out of memory are the
calibrated estimate's to explain, as long as it tracks the measured peaks: those it saw coming
(P(out of memory) at least ``EXPLAINED_P_OOM``) leave the logistic and the dominance rule,
which then learn from the other failures, and P(FAIL) is at least the estimate's P(out of
memory). The ones it called fits are its blind spots (a term the formula leaves out that only
some structures pay), which the calibration cannot see where no such structure ran: the
learned models keep those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscout_optuna.samplers._mcts.estimate import EstimateCalibration, calibrate
from autoscout_optuna.samplers._mcts.memory import MemoryModel, fit_memory, measured_peaks
from autoscout_optuna.samplers._mcts.monotone import DominanceModel, fit_dominance
from autoscout_optuna.samplers._mcts.prefix import FAILURES, dead_pairs, p_dead
from autoscout_optuna.samplers._mcts.rules import RulePatterns, rule_patterns
from autoscout_optuna.samplers._mcts.tree import ABSENT, unique_rows

# Ridge penalty on the weights (not the intercept): with a few dozen rows and ~30 one-hot
# features, an unpenalized fit would call every unseen combination certain to fail or succeed.
L2 = 1.0
NEWTON_STEPS = 25
# P(FAIL) of a structure at least as heavy as a known failure (``monotone.py``): above any
# redraw threshold, yet below 1, so that when every path drawn is dominated the least likely
# one still runs (a prediction never closes the only route left).
DOMINATED_P_FAIL = 0.99
# A failure that ran out of memory is the calibrated estimate's to explain when the estimate
# gave it at least this P(out of memory); below it the learned models take it back. Against
# every such failure left to the estimate, a formula blind to the micro-batch (``llm_training``,
# seeds 0-39, 100 trials) failed 8.0 -> 6.3 (8B) and 17.1 -> 12.5 (70B) trials per seed after
# trial 20, best/optimum +0.006 / +0.005; the study's own formula on seeds 120-239 level
# (-0.000 / +0.000) with 5.1 -> 5.0 and 10.2 -> 8.9 failures per seed.
EXPLAINED_P_OOM = 0.1


@dataclass(frozen=True)
class FeasibilityModel:
    """A fitted logistic model of P(FAIL | structure); ``None`` weights: too little evidence."""

    offsets: np.ndarray
    weights: np.ndarray | None
    intercept: float = 0.0
    dominance: DominanceModel | None = None
    dead: np.ndarray | None = None
    rules: RulePatterns | None = None
    memory: MemoryModel | None = None
    memory_trends: np.ndarray | None = None  # the trends of the memory model's features
    estimate: Callable[[np.ndarray], np.ndarray] | None = None  # codes -> estimated peak
    calibration: EstimateCalibration | None = None  # of ``estimate``, from measured peaks

    def p_fail(self, codes: np.ndarray) -> np.ndarray:
        """P(FAIL) of each row of ``codes`` (a 1-D path is one row); 0 without a model.

        The monotone rule overrides the logistic where it applies: no heavier than a known
        success, 0; at least as heavy as a known failure, ``DOMINATED_P_FAIL``. A dead pair
        of choices (``prefix.py``) or the shared choices of rule failures (``rules.py``)
        raise it further, and so do a memory model's P(out of memory) (``memory.py``) and a
        calibrated memory estimate's (``estimate.py``).
        """
        rows = np.atleast_2d(codes)
        p = np.zeros(len(rows))
        if self.weights is not None:
            z = self.intercept + one_hot(rows, self.offsets) @ self.weights
            p = 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))
        if self.dominance is not None:
            fails, fits = self.dominance.verdicts(rows)
            p = np.where(fits, 0.0, p)
            p = np.where(fails, np.maximum(p, DOMINATED_P_FAIL), p)
        if self.dead is not None:
            p = np.maximum(p, p_dead(rows, self.dead))
        if self.rules is not None:
            p = np.maximum(p, self.rules.p_fail(rows))
        if self.predicts_memory:
            p = np.maximum(p, self.p_out_of_memory(rows))
        return p

    def p_out_of_memory(self, codes: np.ndarray) -> np.ndarray:
        """P(out of memory) per row: the calibrated estimate's where there is one, else the
        memory model's (0 without either; ``_memory_parts`` never sets both)."""
        rows = np.atleast_2d(codes)
        return self._memory_answer(rows, MemoryModel.p_out_of_memory,
                                   EstimateCalibration.p_out_of_memory, default=0.0)

    @property
    def predicts_memory(self) -> bool:
        """Whether :meth:`memory_use` has something to say (a memory model or an estimate)."""
        return self.memory is not None or self.calibration is not None

    def memory_use(self, codes: np.ndarray) -> np.ndarray:
        """The predicted peak over capacity per row: the calibrated estimate where there is one,
        else the memory model's (NaN without either)."""
        rows = np.atleast_2d(codes)
        return np.exp(self._memory_answer(rows, MemoryModel.log_fraction,
                                          EstimateCalibration.log_fraction, default=np.nan))

    def _memory_answer(
        self, rows: np.ndarray, learned: Callable[..., np.ndarray],
        calibrated: Callable[..., np.ndarray], *, default: float,
    ) -> np.ndarray:
        """``calibrated(calibration, estimates, features)`` where the user's estimate is
        calibrated, else ``learned(memory_model, features)``, else ``default`` per row: the
        one choice both memory answers make."""
        if self.calibration is not None and self.estimate is not None:
            features = memory_features(rows, self.offsets, self.memory_trends)
            return calibrated(self.calibration, self.estimate(rows), features)
        if self.memory is None:
            return np.full(len(rows), default)
        return learned(self.memory, memory_features(rows, self.offsets, self.memory_trends))


def fit_feasibility(
    codes: np.ndarray,
    n_values: Sequence[int],
    failed: np.ndarray,
    feasible: np.ndarray,
    numeric: Sequence[np.ndarray | None] | None = None,
    positions: np.ndarray | None = None,
    broke_rule: np.ndarray | None = None,
    dead_pair_failures: int = 1,
    memory: np.ndarray | None = None,
    estimate: Callable[[np.ndarray], np.ndarray] | None = None,
) -> FeasibilityModel:
    """Fit P(FAIL) on the full-length failed rows and the feasible rows of ``codes``.

    Args:
        codes: History table (rows x structural params), ``ABSENT`` where not asked.
        n_values: Number of values per column.
        failed: Mask of rows that ended FAIL.
        feasible: Mask of rows that ended with a value (real or estimate).
        numeric: Per column, the numeric value of each code (None: not numbers). Given, the
            monotone dominance rule of ``monotone.py`` refines the logistic's predictions.
        positions: Ask position of each param per row (-1 when not asked). Given, the rows
            that failed on their prefix name dead pairs of choices (``prefix.py``).
        broke_rule: Mask of the failed rows whose reason was a broken rule, not a resource
            limit (:func:`autoscout_optuna._failure.breaks_a_rule`). Full-length ones name
            the choices they share (``rules.py``). They stay in the logistic fit too: taken
            out of it (seeds 40-119, 100 trials, with the rule pairs of 876ad6b), 70B lost
            0.009 at 100 trials and 6 of 30 seeds at 95 %, for no fewer failures.
        dead_pair_failures: Prefix failures a dead pair needs before it counts (one
            failure makes every earlier choice a suspect; two that agree narrow it down).
        memory: Per row, the peak memory over capacity it reported (NaN: none; infinite: it
            ran out of memory, :func:`autoscout_optuna._memory.memory_use`). Given, a memory
            model is fitted (``memory.py``), or with ``estimate`` the estimate's calibration.
        estimate: ``codes -> estimated peak over capacity`` (NaN: none;
            :class:`~autoscout_optuna.samplers._mcts.estimate.MemoryEstimator`). Given, its
            calibration on ``memory`` replaces the memory model, and the rows that ran out of
            memory where it gave at least ``EXPLAINED_P_OOM`` train neither the logistic nor
            the dominance rule.

    Returns:
        The model; without a feasible row it predicts 0, without a full-length failed row
        only dead pairs count.
    """
    offsets = np.concatenate([[0], np.cumsum(n_values)]).astype(int)
    if len(n_values) == 0:
        # No structural param asked yet (a dense-only history before a conditional one): no
        # structure to tell apart, and the fits below need a column.
        return FeasibilityModel(offsets, None)
    memory_parts = _memory_parts(codes, offsets, numeric, memory, estimate)
    asked = (codes != ABSENT).sum(axis=1)
    if not feasible.any():
        return FeasibilityModel(offsets, None, **memory_parts)
    full_failed = failed & (asked >= asked[feasible].min())
    dead = None
    if positions is not None:
        dead = dead_pairs(codes, positions, failed, failed & ~full_failed)
        dead = dead[dead[:, FAILURES] >= dead_pair_failures]
    rules = None
    if broke_rule is not None:
        rules = rule_patterns(codes, full_failed & broke_rule, feasible)
    calibration = memory_parts.get("calibration")
    if calibration is not None and calibration.informative and memory is not None:
        # out of memory where the estimate saw it coming: the estimate's to explain
        full_failed = full_failed & ~_explained_by_estimate(codes, memory, offsets, memory_parts)
    if not full_failed.any():
        return FeasibilityModel(offsets, None, dead=dead, rules=rules, **memory_parts)
    rows = full_failed | feasible
    trends = None if numeric is None else numeric_trends(numeric, offsets)
    weights, intercept = _logistic(
        codes[rows], offsets, full_failed[rows].astype(float), trends
    )
    dominance = None
    if numeric is not None:
        per_column = [weights[offsets[j]: offsets[j + 1]] for j in range(len(n_values))]
        dominance = fit_dominance(codes, numeric, per_column, full_failed, feasible)
    return FeasibilityModel(offsets, weights, intercept, dominance, dead, rules, **memory_parts)


def _memory_parts(
    codes: np.ndarray, offsets: np.ndarray, numeric: Sequence[np.ndarray | None] | None,
    memory: np.ndarray | None, estimate: Callable[[np.ndarray], np.ndarray] | None,
) -> dict[str, Any]:
    """The memory model (``memory`` given) or the estimate's calibration (``estimate``
    given), as :class:`FeasibilityModel` fields."""
    if memory is None and estimate is None:
        return {}
    memory = np.full(len(codes), np.nan) if memory is None else np.asarray(memory, float)
    # memory is a product of factors: log-scale trends of the positive numeric columns
    trends = numeric_trends(
        [v if v is not None and np.all(v > 0) else None for v in numeric or []], offsets
    )
    structures, structure, _ = unique_rows(codes)
    features = memory_features(structures, offsets, trends)
    if estimate is None:
        return {"memory": fit_memory(features, structure, memory), "memory_trends": trends}
    # only the structures with a measured peak calibrate: the others (pending, failed early,
    # asked a few params) need no call to the user's function
    measured = np.zeros(len(structures), dtype=bool)
    measured[structure[measured_peaks(memory)]] = True
    estimates = np.full(len(structures), np.nan)
    if measured.any():
        estimates[measured] = estimate(structures[measured])
    calibration = calibrate(estimates, features, structure, memory)
    return {"memory_trends": trends, "estimate": estimate, "calibration": calibration}


def _explained_by_estimate(
    codes: np.ndarray, memory: np.ndarray, offsets: np.ndarray, parts: dict[str, Any]
) -> np.ndarray:
    """The rows that ran out of memory where the calibrated estimate gave it at least
    ``EXPLAINED_P_OOM``.

    The others are the estimate's blind spots (a term the formula leaves out that only some
    structures pay, e.g. the logits of a large micro-batch), which calibration on the peaks of
    trials that ran cannot see: they stay with the logistic and the dominance rule, which
    learn such failures from the history.
    """
    oom = np.isposinf(np.asarray(memory, dtype=float))
    if not oom.any():
        return oom
    explained = oom.copy()
    explained[oom] = FeasibilityModel(offsets, None, **parts).p_out_of_memory(
        codes[oom]) >= EXPLAINED_P_OOM
    return explained


def _effective(theta: np.ndarray, lift: np.ndarray) -> np.ndarray:
    """Intercept and one-hot weights plus each feature's share of the trend weights."""
    n = lift.shape[0]
    return theta[:n] + np.einsum("jk,k->j", lift, theta[n:]) if lift.shape[1] else theta[:n]


def numeric_values(values: Sequence[Any]) -> np.ndarray | None:
    """A column's values as numbers (booleans included), or None if any is not a number."""
    if not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        return None
    return np.array(values, dtype=float)


def one_hot(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One column per (param, value); a row's ``ABSENT`` (not asked) or ``OTHER`` (outside
    the domain) params add none."""
    x = np.zeros((len(codes), int(offsets[-1])))
    for column in range(codes.shape[1]):
        taken = codes[:, column] >= 0  # ABSENT and OTHER (a value outside the domain) add none
        x[np.flatnonzero(taken), offsets[column] + codes[taken, column]] = 1.0
    return x


def memory_features(
    codes: np.ndarray, offsets: np.ndarray, trends: np.ndarray | None
) -> np.ndarray:
    """The memory model's design: the one-hot choices, then the ``trends``' values (see
    :func:`numeric_trends`: a numeric column's centred log2 value, 0 where not asked)."""
    x = one_hot(codes, offsets)
    return x if trends is None else np.hstack([x, np.einsum("if,fk->ik", x, trends)])


def numeric_trends(numeric: Sequence[np.ndarray | None], offsets: np.ndarray) -> np.ndarray | None:
    """One trend per numeric column of three or more values: (one-hot features x trends), each
    column's values on a log2 scale (raw where one is <= 0), centred; None without any.

    A trend's weight adds ``weight * value`` to each of its column's one-hot weights: resource
    use grows steadily with a micro-batch or shrinks with the parallel degree, so a value with
    few rows borrows the trend the others show, and an unseen combination of values is judged
    by where its values lie on each trend rather than by a weight of 0 per unseen value. On
    the trials the ``autoscout`` benchmark's explore arm ran after trial 20, this raised the
    area under the ROC curve of P(OOM) from 0.73 to 0.80 (70B) and from 0.78 to 0.85 (8B).
    """
    columns = [
        (j, values) for j, values in enumerate(numeric)
        if values is not None and len(np.unique(values)) >= 3
    ]
    if not columns:
        return None
    trends = np.zeros((int(offsets[-1]), len(columns)))
    for k, (j, values) in enumerate(columns):
        scaled = np.log2(values) if np.all(values > 0) else np.asarray(values, dtype=float)
        trends[offsets[j]: offsets[j + 1], k] = scaled - scaled.mean()
    return trends


def _logistic(
    codes: np.ndarray, offsets: np.ndarray, y: np.ndarray, trends: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """L2-penalized logistic regression on the one-hot encoding of ``codes`` (see
    :func:`one_hot`) by Newton's method (intercept not penalized), optionally with numeric
    ``trends`` (see :func:`numeric_trends`, penalized like the one-hot weights).

    Returns the intercept and each one-hot feature's effective weight (its own plus its
    column's trend weight times its value): the trends change the fit, not the model's form.

    The design is never formed: a row has one active feature per asked column, so the Hessian
    is a weighted count of co-active feature pairs (``np.bincount``) and a row's logit a sum of
    its features' weights. That is ~(columns / features)^2 of the dense matrix products' work,
    and none of it goes through BLAS, whose worker threads, on a machine busy with other
    processes (parallel workers, the job being tuned), spin waiting for a core: the dense form
    took 4.7 ms single-threaded and 330 ms with two BLAS threads on two busy cores (700 rows).
    """
    n_features = int(offsets[-1])
    # Feature 0 is the intercept, 1 + j the one-hot column j, and the last one a sink for the
    # params a row lacks (ABSENT or OTHER: no feature), whose weight stays 0.
    sink = n_features + 1
    size = n_features + 2
    active = np.full((len(codes), codes.shape[1] + 1), sink, dtype=np.int64)
    active[:, 0] = 0
    for column in range(codes.shape[1]):
        taken = codes[:, column] >= 0
        active[taken, column + 1] = 1 + offsets[column] + codes[taken, column]
    # Rows of one structure are one weighted row (``count`` of them, ``failures`` failed): a
    # long study refines the same structures over and over.
    active, inverse, count = unique_rows(active)
    failures = np.bincount(inverse, weights=y, minlength=len(active))
    pairs = (active[:, :, None] * size + active[:, None, :]).reshape(len(active), -1)
    # The parameters: intercept, one-hot weights, then trend weights. ``lift`` maps the trend
    # weights onto the features' effective weights, so the data's gradient and Hessian stay the
    # cheap per-feature ones, carried to the trend weights by ``lift`` (einsum, not a BLAS
    # product: the reason the design is never formed, above).
    n_trends = 0 if trends is None else trends.shape[1]
    lift = np.zeros((size - 1, n_trends))
    if n_trends:
        lift[1:] = trends
    penalty = np.full(size - 1 + n_trends, L2)
    penalty[0] = 1e-6
    theta = np.zeros(size - 1 + n_trends)
    # Start the intercept at the base rate's logit: the penalized optimum is unique (the
    # problem is convex), and from there Newton needs a few steps fewer than from 0.
    rate = float(np.clip(failures.sum() / count.sum(), 1e-3, 1 - 1e-3))
    theta[0] = np.log(rate / (1 - rate))
    beta = np.zeros(size)  # effective weights; the sink's entry stays 0
    for _ in range(NEWTON_STEPS):
        beta[:-1] = _effective(theta, lift)
        p = 1.0 / (1.0 + np.exp(-np.clip(beta[active].sum(axis=1), -30.0, 30.0)))
        residual = np.repeat(count * p - failures, active.shape[1])
        gradient = np.bincount(active.ravel(), weights=residual, minlength=size)[:-1]
        curvature = np.repeat(count * p * (1 - p), pairs.shape[1])
        hessian = np.bincount(pairs.ravel(), weights=curvature, minlength=size * size)
        hessian = hessian.reshape(size, size)[:-1, :-1]
        if n_trends:
            cross = np.einsum("ij,jk->ik", hessian, lift)
            hessian = np.block([[hessian, cross],
                                [cross.T, np.einsum("ji,jk->ik", lift, cross)]])
            gradient = np.concatenate([gradient, np.einsum("j,jk->k", gradient, lift)])
        gradient += penalty * theta
        step = np.linalg.solve(hessian + np.diag(penalty), gradient)
        theta -= step
        if np.max(np.abs(step)) < 1e-6:
            break
    beta[:-1] = _effective(theta, lift)
    return beta[1:-1], float(beta[0])
