import numpy as np
import pytest
import torch
from torch import nn

from secureffm.errors import ConfigError
from secureffm.models import VelocityMLP
from secureffm.privacy import DPGradient, PlainGradient, poisson_batch


def losses_of(module, x, t, y):
    return (module(x, t) - y).pow(2).mean(1)


def batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 2, generator=g), torch.rand(n, generator=g),
            torch.randn(n, 2, generator=g))


MODES = ["linear", "ghost"]


@pytest.mark.parametrize("mode", MODES)
def test_without_clipping_or_noise_dp_equals_the_plain_gradient(mode):
    torch.manual_seed(0)
    model = VelocityMLP(2, 16)
    x, t, y = batch()
    plain = PlainGradient(model)(losses_of(model, x, t, y), 64)
    dp = DPGradient(model, clip=1e9, noise_multiplier=0.0, expected_batch=64,
                    generator=torch.Generator(), mode=mode)
    np.testing.assert_allclose(dp(losses_of(dp.forward_module, x, t, y), 64), plain, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_the_clipped_sum_equals_clipping_each_example_alone(mode):
    torch.manual_seed(0)
    model = VelocityMLP(2, 16)
    x, t, y = batch()
    truth, norms = [], []
    for i in range(len(x)):  # the reference: one example at a time, plain autograd
        model.zero_grad(set_to_none=True)
        losses_of(model, x[i:i + 1], t[i:i + 1], y[i:i + 1]).sum().backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        truth.append(g)
        norms.append(g.norm())
    clip = float(torch.stack(norms).median())  # about half the examples are clipped
    scales = [min(1.0, clip / (float(n) + 1e-6)) for n in norms]
    expected = sum(g * c for g, c in zip(truth, scales, strict=True)) / 64
    dp = DPGradient(model, clip=clip, noise_multiplier=0.0, expected_batch=64,
                    generator=torch.Generator(), mode=mode)
    got = dp(losses_of(dp.forward_module, x, t, y), 64)
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-6 * float(expected.norm()) + 1e-8)


def test_auto_mode_picks_linear_clipping_for_linear_only_models_and_ghost_otherwise():
    linear = DPGradient(VelocityMLP(2, 8), 1.0, 1.0, 10, torch.Generator())
    assert linear.mode == "linear"
    model = nn.Sequential(nn.Linear(2, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    assert DPGradient(model, 1.0, 1.0, 10, torch.Generator()).mode == "ghost"
    with pytest.raises(ConfigError, match="nn.Linear"):
        DPGradient(model, 1.0, 1.0, 10, torch.Generator(), mode="linear")


@pytest.mark.parametrize("mode", MODES)
def test_each_example_contributes_at_most_clip(mode):
    torch.manual_seed(0)
    model = VelocityMLP(2, 16)
    x, t, y = batch()
    dp = DPGradient(model, clip=0.05, noise_multiplier=0.0, expected_batch=64,
                    generator=torch.Generator(), mode=mode)
    grad = dp(1e4 * losses_of(dp.forward_module, x, t, y), 64)
    assert np.linalg.norm(grad) <= 0.05 * 64 / 64 + 1e-6
    # One example alone moves the sum by at most C: the sensitivity DP-SGD is accounted for.
    single = dp(1e4 * losses_of(dp.forward_module, x[:1], t[:1], y[:1]), 1)
    assert np.linalg.norm(single * 64) <= 0.05 + 1e-6


@pytest.mark.parametrize("mode", MODES)
def test_noise_has_the_accounted_standard_deviation(mode):
    torch.manual_seed(0)
    model = VelocityMLP(2, 64)
    x, t, y = batch()
    dp = DPGradient(model, clip=2.0, noise_multiplier=1.5, expected_batch=50,
                    generator=torch.Generator().manual_seed(3), mode=mode)
    grad = dp(0.0 * losses_of(dp.forward_module, x, t, y), 64)  # zero per-example gradients
    assert grad.std() == pytest.approx(1.5 * 2.0 / 50, rel=0.05)
    empty = dp(losses_of(dp.forward_module, x[:0], t[:0], y[:0]), 0)
    assert empty.std() == pytest.approx(1.5 * 2.0 / 50, rel=0.05)


def test_poisson_batch_size_is_binomial():
    data = torch.arange(10_000).float()[:, None]
    sizes = [len(poisson_batch(data, 0.03, torch.Generator().manual_seed(s))) for s in range(200)]
    assert np.mean(sizes) == pytest.approx(300, rel=0.02)
    assert np.std(sizes) == pytest.approx(np.sqrt(10_000 * 0.03 * 0.97), rel=0.2)


def test_a_layer_opacus_cannot_handle_is_refused_with_its_explanation():
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="BatchNorm"):
        DPGradient(model, 1.0, 1.0, 10, torch.Generator())


def _dual_losses(f, x0, x1, pool):
    """GOT's dual loss: f at each example's x0 and at its best candidate (two passes)."""
    from secureffm.ot import c_transform

    return -(f(x0) + c_transform(f, pool, x1))


def test_linear_mode_clips_a_loss_with_two_passes_per_example_like_one_example_at_a_time():
    """Example j's loss evaluates the potential at x0_j and at x*_j; its clipped gradient must be
    that of the two passes together (the cross terms), as autograd gives for j alone."""
    from secureffm.models.mlp import PotentialMLP

    torch.manual_seed(0)
    model = PotentialMLP(2, 16)
    g = torch.Generator().manual_seed(1)
    x0, x1, pool = (torch.randn(40, 2, generator=g), torch.randn(40, 2, generator=g) + 1,
                    torch.randn(32, 2, generator=g))
    truth, norms = [], []
    for j in range(len(x0)):
        model.zero_grad(set_to_none=True)
        _dual_losses(model, x0[j:j + 1], x1[j:j + 1], pool).sum().backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        truth.append(grad)
        norms.append(grad.norm())
    clip = float(torch.stack(norms).median())
    expected = sum(t * min(1.0, clip / (float(n) + 1e-6))
                   for t, n in zip(truth, norms, strict=True)) / 40
    dp = DPGradient(model, clip, 0.0, 40, torch.Generator())
    assert dp.mode == "linear"
    got = dp(_dual_losses(dp.forward_module, x0, x1, pool), 40)
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-6 * float(expected.norm()))
    hooks_model = PotentialMLP(2, 16)
    hooks_model.load_state_dict(model.state_dict())
    hooks = DPGradient(hooks_model, clip, 0.0, 40, torch.Generator(), mode="hooks")
    np.testing.assert_allclose(hooks(_dual_losses(hooks.forward_module, x0, x1, pool), 40), got,
                               atol=1e-6 * float(expected.norm()))


def test_linear_mode_is_finite_when_an_examples_two_passes_nearly_cancel():
    """GOT's dual loss -(f(x0_j) - f(x*_j) + c) with x*_j close to x0_j: the cross terms sum to
    about 0 and float rounding took some below 0, whose sqrt was NaN (a client's dual_update was
    then rejected and the round's aggregation aborted, issue 22). Such an example's gradient is
    about 0 and must count as at most clip."""
    from secureffm.models.mlp import PotentialMLP

    torch.manual_seed(0)
    model = PotentialMLP(2, 128)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 2, generator=g) * 10
    near = x + torch.randn(4096, 2, generator=g) * 1e-3
    dp = DPGradient(model, 1.0, 0.0, 4096, torch.Generator())
    got = dp(-(dp.forward_module(x) - dp.forward_module(near)), 4096)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got) <= 1.0 + 1e-6  # 4096 examples of at most clip 1, over 4096


def test_linear_mode_refuses_passes_whose_rows_are_not_the_examples():
    torch.manual_seed(0)
    model = VelocityMLP(2, 8)
    x, t, y = batch(8)
    dp = DPGradient(model, 1.0, 1.0, 8, torch.Generator())
    with pytest.raises(ConfigError, match="row j = example j"):
        losses = losses_of(model, x, t, y)
        model(torch.cat([x, x]), torch.cat([t, t]))  # a pass on 16 rows for 8 examples
        dp(losses, 8)
