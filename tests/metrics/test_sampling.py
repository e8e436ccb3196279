import math

import pytest
import torch
from torch import nn

from secureffm.metrics.sampling import integrate, straightness


class Constant(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x, t):
        return self.c.expand_as(x)


class Decay(nn.Module):
    def forward(self, x, t):
        return -x


class Rotation(nn.Module):
    def forward(self, x, t):
        return torch.stack([-x[:, 1], x[:, 0]], dim=1)


def test_euler_uses_exactly_nfe_evaluations_and_matches_closed_form():
    x0 = torch.randn(10, 2)
    for nfe in (1, 2, 7):
        x1, used = integrate(Decay(), x0, nfe)
        assert used == nfe
        torch.testing.assert_close(x1, x0 * (1 - 1 / nfe) ** nfe)


def test_adaptive_solver_is_accurate_and_reports_nfe():
    x0 = torch.randn(10, 2, dtype=torch.float64)
    x1, used = integrate(Decay(), x0, method="dopri5", tol=1e-8)
    torch.testing.assert_close(x1, x0 * math.exp(-1), atol=1e-6, rtol=1e-6)
    assert used > 6


def test_straightness_zero_for_constant_field_positive_for_rotation():
    x0 = torch.randn(100, 2)
    assert straightness(Constant(torch.tensor([1.0, -2.0])), x0) == pytest.approx(0, abs=1e-10)
    assert straightness(Rotation(), x0) > 0.1
