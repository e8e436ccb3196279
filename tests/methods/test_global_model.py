"""The server's model, optimizer and EMA (secureffm/methods/global_model.py).

Truths used: Adam's first step moves each parameter by lr * g / (|g| + eps), about lr in the
direction opposite to g's sign; an EMA with decay d starts at the first parameters and then
follows ema <- d ema + (1 - d) p.
"""

from __future__ import annotations

import numpy as np
import pytest
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
    assert state["ema"] is None and set(state) == {"module", "optimizer", "ema", "schedule"}


def _steps(model: GlobalModel, count: int) -> list[float]:
    """The size of each of ``count`` steps along a constant gradient (Adam's step is then
    its learning rate, to eps)."""
    sizes = []
    for _ in range(count):
        before = model.flat()
        model.apply(np.ones(before.size, dtype=np.float32))
        sizes.append(float(np.abs(model.flat() - before).mean()))
    return sizes


def test_the_warm_up_raises_the_learning_rate_linearly_and_survives_a_restart():
    """Step s moves by lr * min(1, (s + 1) / W); a model rebuilt from the state after two
    steps goes on at the third step's rate, not from the start of the ramp."""
    model = GlobalModel(_module(), lr=0.01, warmup=4)
    np.testing.assert_allclose(_steps(model, 5), [0.0025, 0.005, 0.0075, 0.01, 0.01],
                               rtol=1e-3)
    first = GlobalModel(_module(), lr=0.01, warmup=4)
    _steps(first, 2)
    restarted = GlobalModel(_module(), lr=0.01, warmup=4)
    restarted.load_state_dict(first.state_dict())
    np.testing.assert_allclose(_steps(restarted, 2), [0.0075, 0.01], rtol=1e-3)
    old = {k: v for k, v in GlobalModel(_module(), lr=0.01).state_dict().items()
           if k != "schedule"}  # saved before warm-ups existed
    GlobalModel(_module(), lr=0.01).load_state_dict(old)
    with pytest.raises(ValueError, match="warm-up"):
        restarted.load_state_dict(old)
