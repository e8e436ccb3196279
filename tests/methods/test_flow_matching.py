"""The flow matching path and loss (secureffm/methods/flow_matching.py).

Truths used: closed forms. On x1 = 2 x0 the straight path is x_t = (1 + t) x0 and its velocity
field v(x, t) = x / (1 + t) is exact, so the loss is zero there; the zero field's loss is the
mean square of x1 - x0.
"""

from __future__ import annotations

import torch
from torch import nn

from secureffm.methods.flow_matching import flow_matching_loss, sample_path


class _Field(nn.Module):
    """v(x, t) = ``scale`` x / (1 + t), on any sample shape."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x, t):
        return self.scale * x / (1 + t.reshape(-1, *([1] * (x.dim() - 1))))


class _Wrap(nn.Module):
    """v(x, t) = net(x) (1 + t): a small network as a velocity field."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, t):
        return self.net(x) * (1 + t[:, None])


def test_the_path_runs_from_source_at_t0_to_data_at_t1_with_target_x1_minus_x0():
    x0, x1 = torch.randn(5, 2), torch.randn(5, 2)
    start = sample_path(x0, x1, torch.zeros(5))
    end = sample_path(x0, x1, torch.ones(5))
    assert torch.equal(start.x_t, x0) and torch.allclose(end.x_t, x1)
    assert torch.equal(start.u_t, x1 - x0)
    t = torch.tensor([0.25, 0.5, 0.75, 0.1, 0.9])
    mid = sample_path(x0, x1, t)
    assert torch.allclose(mid.x_t, x0 + t[:, None] * (x1 - x0))
    assert torch.equal(mid.t, t)


def test_the_path_broadcasts_time_over_image_shaped_samples():
    x0, x1 = torch.zeros(3, 2, 4, 4), torch.ones(3, 2, 4, 4)
    t = torch.tensor([0.0, 0.5, 1.0])
    path = sample_path(x0, x1, t)
    assert path.x_t.shape == (3, 2, 4, 4)
    assert [float(path.x_t[i].unique()) for i in range(3)] == [0.0, 0.5, 1.0]


def test_the_loss_is_zero_for_the_exact_field_of_a_straight_path():
    x0 = torch.randn(64, 2, dtype=torch.float64)
    t = torch.rand(64, dtype=torch.float64)
    losses = flow_matching_loss(_Field(), x0, 2 * x0, t)
    assert losses.shape == (64,) and losses.abs().max() < 1e-24
    assert flow_matching_loss(_Field(1.1), x0, 2 * x0, t).min() > 0  # a wrong field is not


def test_the_loss_of_the_zero_field_is_the_mean_square_of_the_target_per_example():
    x0, x1 = torch.randn(6, 3, 2, 2), torch.randn(6, 3, 2, 2)
    losses = flow_matching_loss(_Field(0.0), x0, x1, torch.rand(6))
    assert torch.allclose(losses, (x1 - x0).pow(2).mean(dim=(1, 2, 3)))


def test_each_term_depends_on_its_own_example_only():
    """What DP clipping relies on: changing example 0 changes term 0 and no other."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
    field = _Wrap(model)
    x0, x1, t = torch.randn(10, 2), torch.randn(10, 2), torch.rand(10)
    before = flow_matching_loss(field, x0, x1, t)
    x1[0] += 3.0
    after = flow_matching_loss(field, x0, x1, t)
    assert after[0] != before[0] and torch.equal(after[1:], before[1:])

