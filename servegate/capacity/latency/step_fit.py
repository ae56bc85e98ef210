"""Least-squares fits of the step cost: on bare model steps (stage 1) and on steps the server ran (stage 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servegate.capacity.latency.provenance import FitError
from servegate.capacity.latency.terms import FEATURES, Chunk, StepCost, StepSample, step_features


def fit_steps(samples: Sequence[StepSample]) -> tuple[StepCost, FitError]:
    """Non-negative least squares on relative error: the step cost and the fit's quality."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} measured steps to fit (got {len(samples)})")
    x = np.array([step_features(s.chunks) for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    coef, rel = _nonnegative_fit(x, y, 1.0 / np.maximum(y, 1e-6))  # relative: short steps count as much as long
    return StepCost(*(float(c) for c in coef)), _fit_error(rel)


def _fit_error(rel: np.ndarray) -> FitError:
    return FitError(len(rel), float(np.median(rel)), float(np.percentile(rel, 90)))


def _nonnegative_fit(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares of y on the columns of x (each scaled to its maximum so that no feature's
    units dominate), optionally weighted per row: the coefficients and every row's relative error."""
    from scipy.optimize import nnls

    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    w = np.ones_like(y) if weights is None else weights
    coef, _ = nnls((x / scale) * w[:, None], y * w)
    coef = coef / scale
    return coef, np.abs(x @ coef - y) / y


@dataclass(frozen=True)
class ServingStep:
    """One step the engine ran while serving: its chunks, its duration in seconds, requests admitted meanwhile."""

    chunks: tuple[Chunk, ...]
    seconds: float
    arrivals: int
    began: float | None = None
    """When it began (perf_counter seconds in the serving process), if known."""
    ended: float | None = None
    """When it ended, if known."""
    after_completed: int = 0
    """Requests the step just before answered, when this one followed it at once (the responses were sent
    while this one ran)."""


@dataclass(frozen=True)
class ServingFit:
    """The step cost and per-request costs fitted on serving steps (fit_serving_steps)."""

    steps: StepCost
    admission_s: float
    """Seconds each request admitted during a step adds to it."""
    completion_s: float
    """Seconds each request answered by the previous step adds to a step that follows at once."""
    error: FitError
    """How far the serving steps fall from the fit."""
    mean_step_s: float
    """Mean measured step, seconds."""

    def step_seconds(self, step: ServingStep) -> float:
        """Predicted duration of a traced step."""
        return (
            self.steps.seconds(step.chunks)
            + self.admission_s * step.arrivals
            + self.completion_s * step.after_completed
        )


def fit_serving_steps(steps: Sequence[ServingStep]) -> ServingFit:
    """Step cost and the per-admission and per-answer costs, fitted on steps measured inside the serving process.

    Non-negative least squares on absolute error, each step counted once per sequence in it: a request's
    latency is the sum of the steps it was in, so the fitted mean of the steps as requests see them equals
    the measured one. (A fit right in relative terms, as for the bare model steps, underestimates that sum
    whenever step times are skewed, as they are under load.)
    """
    if len(steps) < 4 * (len(FEATURES) + 2):
        raise ValueError(f"need at least {4 * (len(FEATURES) + 2)} serving steps to fit (got {len(steps)})")
    x = np.array([[*step_features(s.chunks), float(s.arrivals), float(s.after_completed)] for s in steps], dtype=float)
    y = np.array([s.seconds for s in steps], dtype=float)
    coef, rel = _nonnegative_fit(x, y, np.sqrt([len(s.chunks) for s in steps]))  # squared: once per sequence
    cost = StepCost(*(float(c) for c in coef[:-2]))
    return ServingFit(cost, float(coef[-2]), float(coef[-1]), _fit_error(rel), float(y.mean()))


def residual_spread(steps: StepCost, samples: Sequence[StepSample]) -> float:
    """Coefficient of variation of measured / predicted step time (the noise the simulator replays)."""
    ratios = np.array([s.seconds / max(steps.seconds(s.chunks), 1e-9) for s in samples])
    return float(np.std(ratios) / max(np.mean(ratios), 1e-9))
