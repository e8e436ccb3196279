"""Small networks for 2D data (secureffm/models/mlp.py).

Truths used: the layer sizes stated in the docstrings (parameter counts by hand), Opacus'
ModuleValidator (DP-SGD must accept both), and that a row's output depends on its own input.
"""

from __future__ import annotations

import pytest
import torch
from opacus.validators import ModuleValidator
from torch import nn

from secureffm.models.mlp import PotentialMLP, VelocityMLP


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("dim, hidden", [(2, 64), (5, 8)])
def test_the_velocity_field_is_three_selu_layers_on_x_and_t(dim, hidden):
    model = VelocityMLP(dim, hidden)
    assert _count(model) == ((dim + 1) * hidden + hidden) + 2 * (hidden * hidden + hidden) + (
        hidden * dim + dim)
    assert sum(isinstance(m, nn.SELU) for m in model.modules()) == 3
    out = model(torch.randn(7, dim), torch.rand(7))
    assert out.shape == (7, dim)


def test_the_velocity_field_takes_one_time_for_the_batch_or_one_per_row():
    torch.manual_seed(0)
    model = VelocityMLP(2, 16)
    x = torch.randn(4, 2)
    shared = model(x, torch.tensor(0.3))
    per_row = model(x, torch.full((4,), 0.3))
    assert torch.allclose(shared, per_row)
    assert not torch.allclose(model(x, torch.full((4,), 0.9)), per_row)  # t is an input


@pytest.mark.parametrize("dim, hidden", [(2, 128), (3, 8)])
def test_the_potential_is_scalar_per_row_with_two_relu_layers(dim, hidden):
    model = PotentialMLP(dim, hidden)
    assert _count(model) == (dim * hidden + hidden) + (hidden * hidden + hidden) + (hidden + 1)
    assert model(torch.randn(6, dim)).shape == (6,)


def test_both_networks_are_accepted_by_opacus_and_rows_stay_apart():
    """Per-example clipping needs no batch statistics: row 0 changed, other rows unchanged."""
    torch.manual_seed(0)
    velocity, potential = VelocityMLP(2, 8), PotentialMLP(2, 8)
    assert ModuleValidator.validate(velocity, strict=False) == []
    assert ModuleValidator.validate(potential, strict=False) == []
    x, t = torch.randn(5, 2), torch.rand(5)
    moved = x.clone()
    moved[0] += 1.0
    assert torch.equal(velocity(moved, t)[1:], velocity(x, t)[1:])
    assert torch.equal(potential(moved)[1:], potential(x)[1:])
