import numpy as np
import pytest
import torch

from secureffm.errors import SolverError
from secureffm.metrics.frechet import (
    FeatureStats,
    feature_stats,
    frechet_distance,
    frechet_distance_features,
)
from secureffm.metrics.w2 import gaussian_w2


def test_diagonal_gaussians_match_the_closed_form():
    # For commuting covariances the trace term is sum (sqrt(a_i) - sqrt(b_i))^2.
    a = FeatureStats(np.array([0.0, 1.0, 2.0]), np.diag([1.0, 4.0, 9.0]))
    b = FeatureStats(np.array([1.0, 1.0, 0.0]), np.diag([4.0, 1.0, 1.0]))
    expected = (1 + 0 + 4) + (1 - 2) ** 2 + (2 - 1) ** 2 + (3 - 1) ** 2
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-10)


def test_full_covariances_match_the_bures_form_of_w2():
    rng = np.random.default_rng(0)
    for _ in range(5):
        m1, m2 = rng.normal(size=6), rng.normal(size=6)
        l1, l2 = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
        c1, c2 = l1 @ l1.T + 0.1 * np.eye(6), l2 @ l2.T + 0.1 * np.eye(6)
        w2 = gaussian_w2(*(torch.tensor(v) for v in (m1, c1, m2, c2)))
        assert frechet_distance(FeatureStats(m1, c1), FeatureStats(m2, c2)) == pytest.approx(
            w2**2, rel=1e-6)


def test_identical_statistics_give_zero_and_the_distance_is_symmetric():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(500, 4)))
    y = torch.from_numpy(rng.normal(size=(400, 4)) * 2 + 1)
    assert frechet_distance_features(x, x) == pytest.approx(0.0, abs=1e-8)
    assert frechet_distance_features(x, y) == pytest.approx(frechet_distance_features(y, x),
                                                            rel=1e-8)


def test_samples_converge_to_the_population_value():
    rng = np.random.default_rng(2)
    m1, m2 = np.zeros(3), np.array([1.0, -1.0, 0.5])
    c1 = np.array([[1.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 0.5]])
    c2 = np.diag([0.5, 1.0, 2.0])
    exact = frechet_distance(FeatureStats(m1, c1), FeatureStats(m2, c2))
    x = torch.from_numpy(rng.multivariate_normal(m1, c1, size=20000))
    y = torch.from_numpy(rng.multivariate_normal(m2, c2, size=20000))
    assert frechet_distance_features(x, y) == pytest.approx(exact, rel=0.03)
    stats = feature_stats(x)
    np.testing.assert_allclose(stats.cov, np.cov(x.numpy(), rowvar=False))


def test_singular_covariances_use_the_ridge():
    # Fewer samples than dimensions: rank-deficient covariances, still a finite real value.
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(5, 20)))
    y = torch.from_numpy(rng.normal(size=(5, 20)) + 3)
    value = frechet_distance_features(x, y)
    assert np.isfinite(value) and value > 20 * 9 * 0.5


def test_an_imaginary_square_root_is_a_solver_error():
    # A non-PSD "covariance" makes the product's square root truly complex.
    a = FeatureStats(np.zeros(2), np.diag([1.0, -1.0]))
    b = FeatureStats(np.zeros(2), np.eye(2))
    with pytest.raises(SolverError, match="imaginary"):
        frechet_distance(a, b)
