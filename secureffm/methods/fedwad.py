"""FedWAD (Rakotomamonjy et al., 2024): W_p between two data sets through interpolating measures.

Pure maths, in one process: the reference for the federated version
(:mod:`secureffm.methods.fedwad_federated`) and for tests. Algorithm 1: the server holds xi; each
client interpolates between its data and xi at its own t and returns that measure; the server
interpolates between the two returned measures to get the next xi. Every xi gives an upper bound

.. math:: W_p(\\mu, \\nu) \\le W_p(\\mu, \\xi) + W_p(\\xi, \\nu)

(distances summed, not their p-th powers), reached on the geodesic between mu and nu.

Conventions: the interpolation at t runs from ``source`` (t = 0) to ``target`` (t = 1) along
an optimal plan for the ground cost |x - y|^p, so W_p(source, xi_t) = t W_p(source, target).
Arrays are float64 numpy (POT's boundary); supports are [S, d], weights [S] summing to 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial import cKDTree

from ..errors import ConfigError, DataError
from ..ot import emd_cost, emd_plan, pot
from .fedwad_bounds import lower_bound, moments

__all__ = ["Measure", "FedWADConfig", "FedWADResult", "interpolate", "interpolate_with_distance",
           "wasserstein",
           "ground_cost", "initial_measure", "check_samples", "draw_t", "add_noise", "fedwad",
           "accuracy"]


@dataclass(frozen=True)
class Measure:
    """A discrete measure: ``support`` [S, d] float64 points and ``weights`` [S] summing to 1."""

    support: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        support = np.asarray(self.support, dtype=np.float64)
        weights = np.asarray(self.weights, dtype=np.float64)
        if support.ndim != 2 or support.shape[0] == 0 or weights.shape != support.shape[:1]:
            raise DataError(f"a measure needs a support [S, d] with S >= 1 and weights [S]; got "
                            f"support {support.shape} and weights {weights.shape}")
        if not (np.isfinite(support).all() and np.isfinite(weights).all()):
            raise DataError("a measure's support and weights must be finite (no NaN or inf)")
        if (weights < 0).any() or abs(weights.sum() - 1.0) > 1e-6:
            raise DataError(f"a measure's weights must be non-negative and sum to 1 (sum "
                            f"{weights.sum():.6g})")
        object.__setattr__(self, "support", support)
        object.__setattr__(self, "weights", weights / weights.sum())

    @classmethod
    def uniform(cls, points: np.ndarray) -> Measure:
        """The empirical measure of ``points`` [N, d], mass 1/N each."""
        points = np.asarray(points, dtype=np.float64)
        return cls(points, np.full(len(points), 1.0 / max(len(points), 1)))

    @property
    def size(self) -> int:
        return int(self.support.shape[0])

    @property
    def dim(self) -> int:
        return int(self.support.shape[1])


@dataclass(frozen=True)
class FedWADConfig:
    """Settings of Algorithm 1, validated on construction.

    ``p``: 1 or 2 (W_p with ground cost |x - y|^p). ``iterations``: K. ``support_size``: S,
    atoms of xi^(0) (and of every measure when ``exact`` is False: Eq. 10's barycentric
    approximation keeps S fixed). ``exact``: Eq. 5's interpolation from the full plan instead,
    whose support grows; every atom lighter than ``prune_tol`` times the mean atom mass is merged
    into its nearest heavier atom. ``t_range``: every
    interpolation draws a fresh t ~ U(t_low, t_high) (equal ends: a fixed t). ``init``:
    ``gaussian`` (xi^(0) = S draws of N(0, init_scale^2 I), independent of the data).
    ``noise_std``: Gaussian noise each client adds to the support points it returns.
    ``seed``: the server's generator (xi^(0), its own t). ``bracket``: also give a lower bound
    from each side's mean and spread (:mod:`.fedwad_bounds`; federated, each client's own
    config decides whether it releases them).
    """

    p: int = 2
    iterations: int = 20
    support_size: int = 100
    exact: bool = False
    t_range: tuple[float, float] = (0.05, 0.95)
    init: str = "gaussian"
    init_scale: float = 1.0
    noise_std: float = 0.0
    prune_tol: float = 0.5
    seed: int = 0
    bracket: bool = False

    def __post_init__(self) -> None:
        if self.p not in (1, 2) or isinstance(self.p, bool):
            raise ConfigError(f"p = {self.p!r}; FedWAD computes W_1 or W_2: use p = 1 or 2")
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise ConfigError(f"iterations = {self.iterations!r}; use an integer K >= 1")
        if not isinstance(self.support_size, int) or self.support_size < 1:
            raise ConfigError(f"support_size = {self.support_size!r}; the interpolating "
                              "measure needs S >= 1 atoms")
        low, high = (float(v) for v in self.t_range) if len(self.t_range) == 2 else (0.0, 0.0)
        if not 0.0 < low <= high < 1.0:
            raise ConfigError(f"t_range = {self.t_range!r}; use (t_low, t_high) with 0 < t_low "
                              "<= t_high < 1 (t near 0 makes a client's measure its data)")
        object.__setattr__(self, "t_range", (low, high))
        if not isinstance(self.bracket, bool):
            raise ConfigError(f"bracket = {self.bracket!r}; use true or false")
        if self.init != "gaussian":
            raise ConfigError(f"init = {self.init!r}; use 'gaussian', or pass an explicit "
                              "initial Measure")
        for name in ("init_scale", "noise_std", "prune_tol"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0 or (name == "init_scale" and value == 0):
                raise ConfigError(f"{name} = {value!r}; give a finite non-negative number"
                                  + (" above 0" if name == "init_scale" else ""))


@dataclass(frozen=True)
class FedWADResult:
    """What Algorithm 1 returns.

    ``distance``: the smallest evaluated upper bound W_p(mu, xi) + W_p(xi, nu).
    ``iterates``: the bound at each evaluated iterate, in order; ``evaluated``: which iterates
    (k of xi^(k), 0 = the initial measure). ``best``: k of the smallest bound, and ``measure``
    that xi^(k). ``trace``: per iteration k >= 1, A^(k) of Theorem 2 when computed, else empty.
    ``seconds``: per evaluated iterate, the CPU seconds of the critical path until its bound was
    known, as if the two clients worked in parallel: per iteration the slower client's
    interpolation (which gives the bound of the xi it received), then the server's; at the end
    the slower client's final distance (:func:`fedwad` only; empty through the channel).
    ``lower_bound``: L <= W_p from the sides' moments and final distances
    (:func:`~secureffm.methods.fedwad_bounds.lower_bound`), when ``config.bracket``; else None.
    """

    distance: float
    iterates: tuple[float, ...]
    evaluated: tuple[int, ...]
    best: int
    measure: Measure
    trace: tuple[float, ...] = field(default=())
    seconds: tuple[float, ...] = field(default=())
    lower_bound: float | None = None


def check_samples(x, name: str) -> np.ndarray:
    """A client's samples as float64 [N, d]; empty, ragged or non-finite data is a DataError."""
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise DataError(f"{name} must be a non-empty [N, d] array of samples; got shape "
                        f"{array.shape}")
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).any(axis=1).sum())
        raise DataError(f"{name} has {bad} sample(s) with NaN or inf; drop or impute them")
    return array


def ground_cost(x: np.ndarray, y: np.ndarray, p: int) -> np.ndarray:
    """|x_i - y_j|^p, shape [N, M]."""
    return pot().dist(x, y, metric="sqeuclidean" if p == 2 else "euclidean")


def wasserstein(a: Measure, b: Measure, p: int) -> float:
    """W_p(a, b) = (min_P sum_ij P_ij |x_i - y_j|^p)^(1/p), exactly (POT's network simplex)."""
    cost = emd_cost(ground_cost(a.support, b.support, p), a.weights, b.weights)
    return max(cost, 0.0) ** (1.0 / p)


def interpolate(source: Measure, target: Measure, t: float, p: int = 2, exact: bool = False,
                prune_tol: float = 0.5) -> Measure:
    """The measure at ``t`` on a W_p geodesic from ``source`` (t = 0) to ``target`` (t = 1).

    ``exact`` (Eq. 5): mass P_ij at (1 - t) x_i + t y_j for the optimal plan P, then pruned and
    merged (see :class:`FedWADConfig`). Otherwise (Eq. 10) the smaller measure's atoms move
    along the barycentric map T(z_i) = (P Y)_i / w_i, keeping its size and weights; for p = 2
    and ``source`` the smaller, this equals one iteration of ``ot.lp.free_support_barycenter``
    with weights (1 - t, t) started at the source (which solves its plans with POT's default
    iteration cap and cannot use the W_1 cost, hence the two lines here).
    """
    return interpolate_with_distance(source, target, t, p, exact, prune_tol)[0]


def interpolate_with_distance(source: Measure, target: Measure, t: float, p: int = 2,
                              exact: bool = False, prune_tol: float = 0.5
                              ) -> tuple[Measure, float]:
    """:func:`interpolate` and W_p(source, target), both from one optimal plan."""
    if source.dim != target.dim:
        raise DataError(f"cannot interpolate between dimension {source.dim} and {target.dim}")
    cost = ground_cost(source.support, target.support, p)
    plan = emd_plan(cost, source.weights, target.weights)
    distance = max(float((plan * cost).sum()), 0.0) ** (1.0 / p)
    if exact:
        rows, cols = np.nonzero(plan)
        points = (1 - t) * source.support[rows] + t * target.support[cols]
        return _prune(points, plan[rows, cols], prune_tol), distance
    if source.size <= target.size:
        mapped = plan @ target.support / source.weights[:, None]
        return Measure((1 - t) * source.support + t * mapped, source.weights), distance
    mapped = plan.T @ source.support / target.weights[:, None]
    return Measure(t * target.support + (1 - t) * mapped, target.weights), distance


def _prune(points: np.ndarray, mass: np.ndarray, tol: float) -> Measure:
    """Merge every atom lighter than ``tol`` times the mean atom mass into its nearest heavier
    atom (mass kept, so W_p moves by at most (sum of moved mass x distance^p)^(1/p))."""
    light = mass < tol * mass.sum() / len(mass)
    if light.any() and not light.all():
        heavy = np.flatnonzero(~light)
        _, nearest = cKDTree(points[heavy]).query(points[light])
        mass = mass[heavy] + np.bincount(nearest, weights=mass[light], minlength=len(heavy))
        points = points[heavy]
    return Measure(points, mass / mass.sum())


def initial_measure(config: FedWADConfig, dim: int, rng: np.random.Generator) -> Measure:
    """xi^(0): ``support_size`` draws of N(0, init_scale^2 I) in ``dim`` dimensions."""
    return Measure.uniform(config.init_scale * rng.standard_normal((config.support_size, dim)))


def draw_t(config: FedWADConfig, rng: np.random.Generator) -> float:
    """A fresh t ~ U(t_low, t_high) for one interpolation."""
    low, high = config.t_range
    return float(rng.uniform(low, high)) if high > low else low


def add_noise(measure: Measure, std: float, rng: np.random.Generator) -> Measure:
    """The measure with N(0, std^2 I) added to every support point (weights unchanged)."""
    if std == 0:
        return measure
    return Measure(measure.support + std * rng.standard_normal(measure.support.shape),
                   measure.weights)


def fedwad(x, y, config: FedWADConfig, rng: np.random.Generator | None = None,
           init: Measure | None = None, trace: bool = False) -> FedWADResult:
    """Algorithm 1 between samples ``x`` [N, d] and ``y`` [M, d], all parties in this process.

    ``rng``: one generator for all parties (default: seeded with ``config.seed``); ``init``:
    xi^(0) instead of a Gaussian draw. Every iterate xi^(0..K) is evaluated; the result keeps the
    smallest bound. ``trace``: also compute A^(k) of Theorem 2 (two extra OT solves per k, not
    counted in ``seconds``). Each party's work is timed (CPU seconds) for ``seconds``.
    """
    mu = Measure.uniform(check_samples(x, "the first data set"))
    nu = Measure.uniform(check_samples(y, "the second data set"))
    if mu.dim != nu.dim:
        raise DataError(f"the data sets have dimensions {mu.dim} and {nu.dim}; FedWAD compares "
                        "samples of one space")
    rng = np.random.default_rng(config.seed) if rng is None else rng
    xi = initial_measure(config, mu.dim, rng) if init is None else init
    if xi.dim != mu.dim:
        raise DataError(f"the initial measure has dimension {xi.dim}, the data {mu.dim}")
    p, exact, tol = config.p, config.exact, config.prune_tol
    measures, bounds, pairs, a_trace, seconds, path = [xi], [], [], [], [], 0.0
    for _ in range(config.iterations):
        (xi_mu, d_mu), a = _timed(interpolate_with_distance, mu, xi, draw_t(config, rng), p,
                                  exact, tol)
        (xi_nu, d_nu), b = _timed(interpolate_with_distance, nu, xi, draw_t(config, rng), p,
                                  exact, tol)
        bounds.append(d_mu + d_nu)
        pairs.append((d_mu, d_nu))
        seconds.append(path + max(a, b))
        start = time.process_time()
        xi_mu = add_noise(xi_mu, config.noise_std, rng)
        xi_nu = add_noise(xi_nu, config.noise_std, rng)
        xi = interpolate(xi_mu, xi_nu, draw_t(config, rng), p, exact, tol)
        path += max(a, b) + time.process_time() - start
        measures.append(xi)
        if trace:
            a_trace.append(wasserstein(mu, xi_mu, p) + wasserstein(xi_mu, xi, p)
                           + wasserstein(xi, xi_nu, p) + wasserstein(xi_nu, nu, p))
    d_mu, a = _timed(wasserstein, mu, xi, p)
    d_nu, b = _timed(wasserstein, xi, nu, p)
    bounds.append(d_mu + d_nu)
    seconds.append(path + max(a, b))
    best = int(np.argmin(bounds))
    lower = (lower_bound(moments(mu.support), moments(nu.support), p, [*pairs, (d_mu, d_nu)])
             if config.bracket else None)
    return FedWADResult(float(bounds[best]), tuple(bounds), tuple(range(len(bounds))), best,
                        measures[best], tuple(a_trace), tuple(seconds), lower)


def _timed(function, *args):
    """(function(*args), CPU seconds it took)."""
    start = time.process_time()
    return function(*args), time.process_time() - start


def accuracy(result: FedWADResult, config: FedWADConfig) -> dict:
    """What the bounds a server learned can vouch for about ``result``, and how to tighten it.

    ``upper_bound``: always true: the distance is W_p(mu, xi) + W_p(xi, nu) >= W_p(mu, nu),
    each term an exact OT cost. ``still_falling``: how far the best bound fell over the later
    half of the evaluated iterates, relative to it (None with one bound, as under
    randomized-t); above about 1e-3, more iterations lower it. The gap to W_p itself is not
    known: S atoms set an error floor that iterations do not remove (docs/fedwad.md, "What a
    result vouches for").
    ``tighten``: the settings to raise. ``lower_bound``: L <= W_p when the run computed one
    (else None), and ``bracket``: how far the upper bound may sit above W_p, U / L - 1 (None
    without L or with L = 0).
    """
    bounds = result.iterates
    falling = None
    if len(bounds) > 1:
        falling = float(min(bounds[: (len(bounds) + 1) // 2]) / result.distance - 1)
    advice = [f"--support above {config.support_size} (up to the smaller client's rows: S sets "
              "an error floor)"]
    if falling is None or falling > 1e-3:
        advice.append(f"--iterations above {config.iterations}")
    lower = result.lower_bound
    bracket = None if not lower else float(result.distance / lower - 1)
    return {"upper_bound": True, "still_falling": falling, "support": result.measure.size,
            "lower_bound": lower, "bracket": bracket,
            "tighten": " and ".join(advice) + ", or --check-exact where the data may be pooled"}
