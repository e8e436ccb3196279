"""The labelled 2D distributions (secureffm/data/toy2d.py) have their documented laws.

Truths used: the laws stated in the module docstring, checked with scipy's KS and chi-square
tests on points made from numpy's uniforms (independent of the code's own sampler).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from secureffm.data.toy2d import DISTRIBUTIONS, normals

N = 20_000
P_MIN = 1e-3  # a correct law fails one of these tests about once in a thousand fixed seeds


def _uniforms(columns: int, seed: int = 0) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).random((N, columns)), dtype=torch.float64)


def _standard_normal(values: torch.Tensor, scale: float = 1.0) -> bool:
    return stats.kstest(values.double().numpy() / scale, "norm").pvalue > P_MIN


def test_normals_are_independent_standard_normals():
    """Box-Muller: each coordinate N(0, 1), the squared radius chi^2 with 2 degrees of freedom
    (exponential, mean 2), the two coordinates uncorrelated; u1 = 0 gives the origin."""
    u = _uniforms(2)
    z = normals(u[:, 0], u[:, 1])
    assert z.shape == (N, 2)
    assert _standard_normal(z[:, 0]) and _standard_normal(z[:, 1])
    assert stats.kstest(z.pow(2).sum(1).numpy(), "expon", args=(0, 2)).pvalue > P_MIN
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 4 / math.sqrt(N)
    assert torch.equal(normals(torch.zeros(3), torch.rand(3)), torch.zeros(3, 2))


def test_eight_gaussians_are_eight_equally_likely_centres_on_radius_5_with_std_0562():
    points, labels = DISTRIBUTIONS["8gaussians"].from_uniforms(_uniforms(3))
    assert stats.chisquare(np.bincount(labels.numpy(), minlength=8)).pvalue > P_MIN
    angles = labels.double() * math.pi / 4
    centres = 5 * torch.stack([torch.cos(angles), torch.sin(angles)], 1)
    residual = points.double() - centres
    std = 0.1**0.25
    assert std == pytest.approx(0.562, abs=1e-3)
    assert _standard_normal(residual[:, 0], std) and _standard_normal(residual[:, 1], std)
    for k in range(8):  # every cluster sits at its own centre, not only on average
        mean = residual[labels == k].mean(0)
        assert mean.norm() < 5 * std / math.sqrt((labels == k).sum().item())


def test_moons_lie_on_their_two_arcs_at_uniform_angles_with_noise_std_0_2_times_3():
    """Without noise (u2 = 0), label 0 lies on the upper unit half-circle and label 1 on the
    lower one centred at (1, 0.5), in the torchcfm frame p = 3 q - 1; the angle is uniform on
    [0, pi) (not a fixed grid); the noise is 0.2 per axis before scaling."""
    moons = DISTRIBUTIONS["moons"]
    u = _uniforms(4)
    clean_u = u.clone()
    clean_u[:, 2] = 0
    clean, labels = moons.from_uniforms(clean_u)
    q = (clean.double() + 1) / 3
    upper, lower = q[labels == 0], q[labels == 1] - torch.tensor([1.0, 0.5], dtype=torch.float64)
    assert torch.allclose(upper.norm(dim=1), torch.ones(len(upper), dtype=torch.float64),
                          atol=1e-5)
    assert torch.allclose(lower.norm(dim=1), torch.ones(len(lower), dtype=torch.float64),
                          atol=1e-5)
    assert upper[:, 1].min() >= -1e-6 and lower[:, 1].max() <= 1e-6
    assert stats.binomtest(int((labels == 0).sum()), N).pvalue > P_MIN
    angle = torch.atan2(upper[:, 1], upper[:, 0]).clamp(min=0).numpy()
    assert stats.kstest(angle / math.pi, "uniform").pvalue > P_MIN
    assert -4 - 1e-4 <= clean[:, 0].min() and clean[:, 0].max() <= 5 + 1e-4
    assert -2.5 - 1e-4 <= clean[:, 1].min() and clean[:, 1].max() <= 2 + 1e-4
    noisy, noisy_labels = moons.from_uniforms(u)
    assert torch.equal(noisy_labels, labels)
    noise = (noisy.double() - clean.double()) / 3
    assert _standard_normal(noise[:, 0], 0.2) and _standard_normal(noise[:, 1], 0.2)


def test_uniform_is_uniform_on_the_square_and_gaussian_is_standard_normal():
    square, labels = DISTRIBUTIONS["uniform"].from_uniforms(_uniforms(2))
    assert square.min() >= -2 and square.max() < 2 and not labels.any()
    for axis in range(2):
        assert stats.kstest(square[:, axis].numpy(), "uniform", args=(-2, 4)).pvalue > P_MIN
    gauss, labels = DISTRIBUTIONS["gaussian"].from_uniforms(_uniforms(2, seed=1))
    assert not labels.any()
    assert _standard_normal(gauss[:, 0]) and _standard_normal(gauss[:, 1])
    assert torch.allclose(torch.cov(gauss.T.double()), torch.eye(2, dtype=torch.float64),
                          atol=0.05)


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_sample_returns_float32_points_and_int64_labels_replayed_by_the_seed(name):
    dist = DISTRIBUTIONS[name]
    points, labels = dist.sample(50, torch.Generator().manual_seed(4))
    assert points.shape == (50, dist.dim) and points.dtype == torch.float32
    assert labels.shape == (50,) and labels.dtype == torch.int64
    again, _ = dist.sample(50, torch.Generator().manual_seed(4))
    assert torch.equal(points, again)
    assert set(labels.tolist()) <= set(dist.disjoint_order)
    assert sorted(dist.disjoint_order) == list(range(len(dist.disjoint_order)))


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_from_uniforms_refuses_the_wrong_number_of_uniforms(name):
    dist = DISTRIBUTIONS[name]
    with pytest.raises(ValueError, match=rf"{name} needs uniforms of shape \[n, {dist.uniforms}\]"):
        dist.from_uniforms(torch.rand(4, dist.uniforms + 1))


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_uniform_in_the_unit_interval_gives_a_finite_point(name):
    """keyed_uniforms returns float64 values up to 1 - 2^-53; the law has no infinite points,
    so the largest of them must map to a finite one (in FFM an infinite x0 makes the client's
    update NaN, and the round drops it)."""
    dist = DISTRIBUTIONS[name]
    points, _ = dist.from_uniforms(torch.full((1, dist.uniforms), 1 - 2**-53,
                                              dtype=torch.float64))
    assert torch.isfinite(points).all(), points
