"""The server's model, optimizer and EMA (secureffm/methods/global_model.py).

Truths used: Adam's first step moves each parameter by lr * g / (|g| + eps), about lr in the
direction opposite to g's sign; an EMA with decay d starts at the first parameters and then
follows ema <- d ema + (1 - d) p.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from secureffm.methods.global_model import GlobalModel


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_apply_takes_one_adam_step_along_the_given_flat_gradient():
    model = GlobalModel(_module(), lr=0.01)
    before = model.flat()
    gradient = np.random.default_rng(0).normal(size=before.size).astype(np.float32)
    model.apply(gradient)
    np.testing.assert_allclose(model.flat() - before, -0.01 * np.sign(gradient), atol=1e-6)
    assert all(p.grad is None for p in model.module.parameters())


def test_flat_is_the_parameters_in_order():
    module = _module()
    model = GlobalModel(module, lr=0.01)
    expected = np.concatenate([module.weight.detach().numpy().ravel(),
                               module.bias.detach().numpy().ravel()])
    assert np.array_equal(model.flat(), expected)


def test_the_ema_starts_at_the_first_step_then_averages_with_its_decay():
    model = GlobalModel(_module(), lr=0.1, ema_decay=0.75)
    steps = []
    for sign in (1.0, -1.0, 1.0):
        model.apply(np.full(model.flat().size, sign, dtype=np.float32))
        steps.append(model.flat())
    expected = steps[0]
    for params in steps[1:]:
        expected = 0.75 * expected + 0.25 * params
    averaged = torch.cat([p.detach().reshape(-1) for p in model.averaged.parameters()])
    np.testing.assert_allclose(averaged.numpy(), expected, atol=1e-6)
    assert model.state_dict()["ema"] is not None


def test_without_an_ema_the_live_module_is_evaluated():
    model = GlobalModel(_module(), lr=0.1)
    assert model.averaged is model.module
    state = model.state_dict()
    assert state["ema"] is None and set(state) == {"module", "optimizer", "ema"}
