"""FedWAD's maths against truths that do not depend on it: Theorem 3's closed form, POT's exact
``ot.emd2``, POT's free-support barycenter, and the geodesic and monotonicity properties."""

import math

import numpy as np
import ot
import pytest

from secureffm.errors import ConfigError, DataError
from secureffm.methods.fedwad import (
    FedWADConfig,
    Measure,
    fedwad,
    interpolate,
    wasserstein,
)


def pot_wp(x, y, p):
    """W_p by POT's exact solver on its own: emd2 with cost |x - y|^p, then the 1/p power."""
    metric = "sqeuclidean" if p == 2 else "euclidean"
    cost = ot.dist(x, y, metric=metric)
    return ot.emd2(ot.unif(len(x)), ot.unif(len(y)), cost, numItermax=10_000_000) ** (1 / p)


def test_theorem3_equal_covariance_gaussians_one_iteration_at_half():
    """Translates of one cloud are Gaussians' stand-ins with equal covariance: after one
    iteration at t = 0.5, 2 W2(xi_mu, xi_nu) = |m_mu - m_nu| and the bounds approach it at
    the rate of point 4."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((150, 3)) @ np.array([[1.0, 0.3, 0], [0, 0.7, 0.2], [0, 0, 0.5]])
    m_mu, m_nu, m_xi = np.array([0.0, 0, 0]), np.array([4.0, 1, -1]), np.array([1.0, 5, 2])
    mu, nu, xi0 = (Measure.uniform(z + m) for m in (m_mu, m_nu, m_xi))
    closed = float(np.linalg.norm(m_mu - m_nu))
    xi_mu, xi_nu = interpolate(mu, xi0, 0.5), interpolate(nu, xi0, 0.5)
    assert 2 * wasserstein(xi_mu, xi_nu, 2) == pytest.approx(closed, rel=1e-3)

    config = FedWADConfig(iterations=14, support_size=150, t_range=(0.5, 0.5))
    result = fedwad(mu.support, nu.support, config, init=xi0)
    start = float(np.linalg.norm(m_xi - (m_mu + m_nu) / 2))  # W2(xi^(0), xi*)
    for k, bound in zip(result.evaluated[1:], result.iterates[1:], strict=True):
        assert bound - closed <= start / 2 ** (k - 1) + 1e-9
    assert result.distance == pytest.approx(closed, rel=1e-3)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("exact", [False, True])
def test_matches_pot_emd2_in_2d(p, exact):
    """300 vs 100 samples in 2D; S = 100 (the smaller set) for the approximation."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 2))
    y = 0.7 * rng.normal(size=(100, 2)) + np.array([1.0, -0.5])
    result = fedwad(x, y, FedWADConfig(p=p, support_size=100, exact=exact))
    assert result.distance == pytest.approx(pot_wp(x, y, p), rel=0.01)
    assert result.distance >= pot_wp(x, y, p) * (1 - 1e-9)  # every iterate is an upper bound


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("exact", [False, True])
def test_matches_pot_emd2_in_50d(p, exact):
    """100 vs 100 samples in 50-D; S = 100 = N (smaller S has a 15-25% floor in 50-D)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(100, 50))
    y = 0.7 * rng.normal(size=(100, 50)) + 1.0
    result = fedwad(x, y, FedWADConfig(p=p, support_size=100, exact=exact, seed=1))
    assert result.distance == pytest.approx(pot_wp(x, y, p), rel=0.01)


def test_random_t_converges_where_fixed_half_stalls_in_50d():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(100, 50))
    y = 0.7 * rng.normal(size=(100, 50)) + 1.0
    truth = pot_wp(x, y, 2)
    fixed = fedwad(x, y, FedWADConfig(support_size=100, t_range=(0.5, 0.5), seed=1))
    random = fedwad(x, y, FedWADConfig(support_size=100, seed=1))
    assert fixed.distance / truth - 1 > 0.03
    assert random.distance / truth - 1 < 0.01


def test_theorem2_sequence_is_non_increasing_for_exact_interpolation():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120, 2))
    y = rng.normal(size=(60, 2)) + np.array([2.0, 1.0])
    # prune_tol 1e-6 merges only the solver's rounding dust (without it the support explodes)
    result = fedwad(x, y, FedWADConfig(iterations=8, support_size=60, exact=True,
                                       prune_tol=1e-6), trace=True)
    trace = np.array(result.trace)
    assert len(trace) == 8
    assert (np.diff(trace) <= 1e-9 * trace[0]).all()
    assert (trace >= pot_wp(x, y, 2) * (1 - 1e-9)).all()


def test_reported_distance_is_the_smallest_summed_bound():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(80, 2)), rng.normal(size=(80, 2)) + 3.0
    result = fedwad(x, y, FedWADConfig(iterations=6, support_size=10))
    assert result.distance == min(result.iterates)
    assert result.iterates[result.best] == result.distance
    xi = result.measure
    bound = wasserstein(Measure.uniform(x), xi, 2) + wasserstein(xi, Measure.uniform(y), 2)
    assert bound == pytest.approx(result.distance, rel=1e-9)  # distances summed, not squared


@pytest.mark.parametrize("p", [1, 2])
def test_exact_interpolation_is_on_the_geodesic(p):
    rng = np.random.default_rng(4)
    a = Measure.uniform(rng.normal(size=(40, 3)))
    b = Measure(rng.normal(size=(25, 3)) + 2.0, rng.dirichlet(np.ones(25)))
    t = 0.3
    mid = interpolate(a, b, t, p, exact=True, prune_tol=0.0)
    whole = wasserstein(a, b, p)
    assert wasserstein(a, mid, p) == pytest.approx(t * whole, rel=1e-6)
    assert wasserstein(mid, b, p) == pytest.approx((1 - t) * whole, rel=1e-6)


def test_theorem1_equal_sizes_approximation_equals_exact():
    rng = np.random.default_rng(5)
    a, b = (Measure.uniform(rng.normal(size=(50, 2)) + s) for s in (0.0, 1.5))
    approx = interpolate(a, b, 0.4)
    exact = interpolate(a, b, 0.4, exact=True, prune_tol=0.0)
    order = np.lexsort(approx.support.T), np.lexsort(exact.support.T)
    np.testing.assert_allclose(approx.support[order[0]], exact.support[order[1]], atol=1e-12)
    np.testing.assert_allclose(exact.weights, 1 / 50)


@pytest.mark.parametrize("source_smaller", [True, False])
def test_approximation_is_one_step_of_pot_free_support_barycenter(source_smaller):
    rng = np.random.default_rng(6)
    small = Measure(rng.normal(size=(12, 2)), rng.dirichlet(np.ones(12)))
    large = Measure.uniform(rng.normal(size=(90, 2)) + 1.0)
    t = 0.35
    ours = interpolate(small, large, t) if source_smaller else interpolate(large, small, 1 - t)
    pot = ot.lp.free_support_barycenter([small.support, large.support],
                                        [small.weights, large.weights], small.support,
                                        b=small.weights, weights=np.array([1 - t, t]),
                                        numItermax=1)
    np.testing.assert_allclose(ours.support, pot, atol=1e-10)
    np.testing.assert_allclose(ours.weights, small.weights)


def test_pruning_merges_light_atoms_and_keeps_mass():
    rng = np.random.default_rng(9)
    a = Measure.uniform(rng.normal(size=(70, 2)))
    b = Measure.uniform(rng.normal(size=(30, 2)) + 1.0)
    full = interpolate(a, b, 0.5, exact=True, prune_tol=0.0)
    pruned = interpolate(a, b, 0.5, exact=True, prune_tol=0.9)
    assert pruned.size < full.size
    assert pruned.weights.sum() == pytest.approx(1.0)
    assert wasserstein(full, pruned, 2) < 0.1 * wasserstein(a, b, 2)


def test_noise_on_support_points_keeps_an_upper_bound():
    rng = np.random.default_rng(10)
    x, y = rng.normal(size=(100, 2)), rng.normal(size=(100, 2)) + 2.0
    truth = pot_wp(x, y, 2)
    noisy = fedwad(x, y, FedWADConfig(support_size=100, noise_std=0.05))
    assert truth * (1 - 1e-9) <= noisy.distance <= truth * 1.05


@pytest.mark.parametrize("x, y, error, match", [
    (np.zeros((0, 2)), np.ones((5, 2)), DataError, "non-empty"),
    (np.ones((5, 2)), np.ones((5, 3)), DataError, "dimensions 2 and 3"),
    (np.array([[0.0, np.nan], [1.0, 1.0]]), np.ones((5, 2)), DataError, "NaN"),
])
def test_bad_data_is_a_clear_error(x, y, error, match):
    with pytest.raises(error, match=match):
        fedwad(x, y, FedWADConfig(support_size=2, iterations=1))


@pytest.mark.parametrize("changes, match", [
    ({"p": 3}, "use p = 1 or 2"),
    ({"support_size": 0}, "S >= 1"),
    ({"iterations": 0}, "K >= 1"),
    ({"t_range": (0.0, 0.5)}, "0 < t_low"),
    ({"noise_std": -1.0}, "noise_std"),
    ({"init": "kmeans"}, "gaussian"),
])
def test_bad_config_is_a_clear_error(changes, match):
    with pytest.raises(ConfigError, match=match):
        FedWADConfig(**changes)


def test_measure_rejects_bad_weights():
    with pytest.raises(DataError, match="sum to 1"):
        Measure(np.zeros((3, 2)), np.array([0.5, 0.5, 0.5]))
    assert math.isclose(Measure.uniform(np.zeros((4, 1))).weights.sum(), 1.0)
