"""The attribute-conditioned velocity field (secureffm/models/conditional.py).

Truths used: the docstring's sizes (embedding tables of |Y_j| + 1 rows, input width
dim + 2 frequencies + embed x k, depth hidden layers), Opacus' ModuleValidator, and that the
null token of attribute j is index |Y_j|.
"""

from __future__ import annotations

import math

import pytest
import torch
from opacus.validators import ModuleValidator
from torch import nn

from secureffm.models.conditional import ConditionalVelocityMLP, null_labels

CARDS = (3, 10)


def test_null_labels_set_every_attribute_to_its_null_index():
    labels = null_labels(4, CARDS)
    assert labels.shape == (4, 2) and labels.dtype == torch.int64
    assert labels.tolist() == [[3, 10]] * 4
    labels[0, 0] = 1  # a copy per row, not a view of one
    assert labels[1].tolist() == [3, 10]


@pytest.mark.parametrize("shape", [(2,), (3, 4, 4)])
def test_sizes_follow_the_docstring(shape):
    model = ConditionalVelocityMLP(shape, CARDS, hidden=32, depth=2, embed=5, frequencies=4)
    dim = math.prod(shape)
    assert [e.num_embeddings for e in model.embeddings] == [4, 11]
    linears = [m for m in model.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (dim + 2 * 4 + 5 * 2, 32), (32, 32), (32, dim)]
    assert sum(isinstance(m, nn.SiLU) for m in model.net) == 2
    assert "freqs" not in model.state_dict()  # derived, not saved
    out = model(torch.randn(6, *shape), torch.rand(6), null_labels(6, CARDS))
    assert out.shape == (6, *shape)


def test_labels_and_time_change_the_velocity_and_rows_stay_apart():
    torch.manual_seed(0)
    model = ConditionalVelocityMLP((2,), CARDS, hidden=16)
    assert ModuleValidator.validate(model, strict=False) == []
    assert {type(m) for m in model.modules() if any(True for _ in m.parameters(recurse=False))
            } == {nn.Linear, nn.Embedding}
    x, t = torch.randn(4, 2), torch.rand(4)
    unconditional = model(x, t, null_labels(4, CARDS))
    full = model(x, t, torch.tensor([[0, 1], [1, 2], [2, 3], [0, 4]]))
    assert not torch.allclose(unconditional, full)
    assert not torch.allclose(model(x, t + 0.1, null_labels(4, CARDS)), unconditional)
    moved = x.clone()
    moved[0] += 1
    assert torch.equal(model(moved, t, null_labels(4, CARDS))[1:], unconditional[1:])
