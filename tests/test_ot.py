import numpy as np
import pytest
import torch
from torch import nn

import secureffm.ot as transport
from secureffm.errors import SolverError
from secureffm.ot import (
    c_transform,
    emd_cost,
    semidual_value,
    sqeuclidean_emd_cost,
    squared_distances,
)


class Quadratic(nn.Module):
    """f(x) = -a |x|^2 / 2: its c-transform has a closed form (used as a reference)."""

    def __init__(self, a):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))

    def forward(self, x):
        return -self.a * x.pow(2).sum(1) / 2


def test_c_transform_is_the_minimum_over_candidates():
    gen = torch.Generator().manual_seed(0)
    cand, x1 = torch.randn(50, 2, generator=gen), torch.randn(7, 2, generator=gen)
    f = Quadratic(0.5)
    values = c_transform(f, cand, x1)
    brute = torch.stack([(0.5 * (cand - y).pow(2).sum(1) - f(cand)).min() for y in x1])
    torch.testing.assert_close(values, brute)


def test_gradient_descent_refinement_approaches_the_exact_c_transform():
    # For f = -a|x|^2/2, min_x |x - y|^2/2 + a|x|^2/2 = a/(1+a) |y|^2/2 exactly.
    gen = torch.Generator().manual_seed(0)
    cand, x1 = torch.randn(16, 2, generator=gen), torch.randn(5, 2, generator=gen) * 2
    f = Quadratic(1.0)
    exact = 0.5 * x1.pow(2).sum(1) / 2
    coarse = c_transform(f, cand, x1, steps=0)
    fine = c_transform(f, cand, x1, steps=50, lr=0.2)
    assert (coarse - exact).abs().max() > 1e-2
    torch.testing.assert_close(fine, exact, atol=1e-4, rtol=1e-4)


def test_c_transform_gradient_reaches_phi_only_through_f():
    gen = torch.Generator().manual_seed(0)
    cand, x1 = torch.randn(30, 2, generator=gen), torch.randn(4, 2, generator=gen)
    f = Quadratic(0.3)
    c_transform(f, cand, x1).sum().backward()
    with torch.no_grad():
        best = cand[torch.argmin(0.5 * torch.cdist(cand, x1).pow(2) - f(cand)[:, None], 0)]
    # c(x*, y) - f(x*) = c(x*, y) + a |x*|^2 / 2 with x* held fixed: d/da = sum |x*|^2 / 2.
    torch.testing.assert_close(f.a.grad, best.pow(2).sum() / 2)


def test_semidual_value_lower_bounds_ot_cost():
    # Weak duality: for any f, E f(x0) + E f^c(x1) <= OT_c up to Monte-Carlo error.
    gen = torch.Generator().manual_seed(0)
    x0, cand = torch.randn(4000, 2, generator=gen), torch.randn(4000, 2, generator=gen)
    x1 = torch.randn(4000, 2, generator=gen) + torch.tensor([3.0, 0.0])
    ot_cost = 3.0**2 / 2  # translation: W2^2 / 2
    for a in (0.0, 0.2, -0.3):
        value = semidual_value(Quadratic(a), x0, cand, x1, steps=20, lr=0.2)
        assert float(value.detach()) <= ot_cost + 0.1


def test_on_the_fly_costs_give_the_dense_solvers_optimum():
    """The same linear program with and without a stored cost matrix: equal optima, also for
    unequal sizes and float32 input, and for two samples of one law (a small, tie-prone cost)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(150, 2)), rng.normal(size=(200, 2)) + [1.0, -0.5]
    assert sqeuclidean_emd_cost(x, y) == pytest.approx(emd_cost(squared_distances(x, y)),
                                                       rel=1e-12)
    a = torch.from_numpy(rng.normal(size=(300, 2))).float()
    b = torch.from_numpy(rng.normal(size=(300, 2))).float()
    assert sqeuclidean_emd_cost(a, b) == pytest.approx(emd_cost(squared_distances(a, b)),
                                                       rel=1e-12)


def test_on_the_fly_costs_refuse_a_solve_that_stopped_early(monkeypatch):
    monkeypatch.setattr(transport, "MAX_ITER", 5)
    rng = np.random.default_rng(2)
    with pytest.raises(SolverError, match="did not converge"):
        sqeuclidean_emd_cost(rng.normal(size=(300, 2)), rng.normal(size=(300, 2)))
