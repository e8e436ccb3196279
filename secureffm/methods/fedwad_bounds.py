"""Lower bounds on W_p from a few moments of each data set: the other end of FedWAD's bracket.

FedWAD's estimate is an upper bound U on W_p (:mod:`.fedwad`); these give an L <= W_p from
each side's mean m [d] and per-coordinate standard deviations s [d]:

- W_1(mu, nu) >= |m_mu - m_nu|: the linear map x -> <e, x> with e the unit vector along
  m_mu - m_nu is 1-Lipschitz (Kantorovich-Rubinstein duality).
- W_2(mu, nu)^2 >= sum_i W_2(mu_i, nu_i)^2 over the coordinates' marginals (the squared cost
  splits by coordinate, and an optimal plan's marginal plans are feasible for each), and in 1-D
  W_2^2 = (m_i - m'_i)^2 + W_2^2 of the centred marginals >= (m_i - m'_i)^2 + (s_i - s'_i)^2 (the
  triangle inequality through the point mass at 0), so W_2 >= sqrt(|m_mu - m_nu|^2 +
  |s_mu - s_nu|^2).
- For any measure xi, W_p(mu, nu) >= |W_p(mu, xi) - W_p(xi, nu)| (the distances to one xi that
  FedWAD's server already receives: the final ones, and under plaintext every iteration's).

The bounds are exact for translated copies (p = 2: also for copies scaled per coordinate) and
loose when the two data sets differ in shape more than in location and spread (a Gaussian
against a mixture: docs/fedwad.md, "What a result vouches for").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import DataError

__all__ = ["Moments", "moments", "moment_bound", "lower_bound"]


@dataclass(frozen=True)
class Moments:
    """A data set's ``mean`` [d] and ``spread`` [d], each coordinate's standard deviation
    (float64, the data's unit)."""

    mean: np.ndarray
    spread: np.ndarray

    def __post_init__(self) -> None:
        mean = np.asarray(self.mean, dtype=np.float64)
        spread = np.asarray(self.spread, dtype=np.float64)
        if mean.ndim != 1 or spread.shape != mean.shape:
            raise DataError(f"a mean and a spread must be vectors [d] of one d; got shapes "
                            f"{mean.shape} and {spread.shape}")
        if not (np.isfinite(mean).all() and np.isfinite(spread).all() and (spread >= 0).all()):
            raise DataError("a mean must be finite and a spread finite and >= 0")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "spread", spread)


def moments(points: np.ndarray, weights: np.ndarray | None = None) -> Moments:
    """The moments of ``points`` [N, d] with ``weights`` [N] summing to 1 (default 1/N each)."""
    points = np.asarray(points, dtype=np.float64)
    weights = np.full(len(points), 1.0 / len(points)) if weights is None else weights
    mean = weights @ points
    return Moments(mean, np.sqrt(np.maximum(weights @ (points - mean) ** 2, 0.0)))


def moment_bound(a: Moments, b: Moments, p: int) -> float:
    """L <= W_p between two data sets with moments ``a`` and ``b`` (module docstring)."""
    if a.mean.shape != b.mean.shape:
        raise DataError(f"moments of dimension {a.mean.shape[0]} and {b.mean.shape[0]}")
    gap = float(np.linalg.norm(a.mean - b.mean))
    return gap if p == 1 else float(np.hypot(gap, np.linalg.norm(a.spread - b.spread)))


def lower_bound(a: Moments, b: Moments, p: int,
                to_xi: Iterable[tuple[float, float]] = ()) -> float:
    """The largest of :func:`moment_bound` and |W_p(mu, xi) - W_p(xi, nu)| over the pairs of
    distances ``to_xi``, each pair to one measure xi."""
    return max([moment_bound(a, b, p), *(abs(u - v) for u, v in to_xi)])
