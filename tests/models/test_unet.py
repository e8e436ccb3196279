import numpy as np
import pytest
import torch
from opacus.validators import ModuleValidator

from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.models.unet import UNet
from secureffm.privacy import DPGradient


@pytest.mark.parametrize(("channels", "size"), [(3, 8), (1, 28)])
def test_output_has_the_input_shape(channels, size):
    torch.manual_seed(0)
    x = torch.randn(2, channels, size, size)
    assert UNet(channels)(x, torch.rand(2)).shape == x.shape
    assert UNet(channels)(x, torch.tensor(0.5)).shape == x.shape  # one time for the batch


def test_sizes_not_divisible_by_four_are_refused():
    with pytest.raises(ValueError, match="divisible by 4"):
        UNet(1)(torch.randn(1, 1, 10, 10), torch.rand(1))


def test_time_changes_the_output():
    torch.manual_seed(0)
    model, x = UNet(3), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        early, late = model(x, torch.full((2,), 0.1)), model(x, torch.full((2,), 0.9))
    assert (early - late).abs().max() > 1e-3


def test_opacus_accepts_it():
    assert ModuleValidator.validate(UNet(3), strict=False) == []


def test_a_dp_sgd_step_clips_each_example_and_returns_a_finite_flat_gradient():
    torch.manual_seed(0)
    model = UNet(3, base_width=16)
    size = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 3, 8, 8, generator=g)
    dp = DPGradient(model, clip=0.05, noise_multiplier=0.0, expected_batch=8,
                    generator=torch.Generator().manual_seed(1))
    losses = flow_matching_loss(dp.forward_module, x0, x1, torch.rand(len(x0), generator=g))
    assert losses.shape == (8,)
    grad = dp(1e4 * losses, 8)  # every example's gradient is far above the clip
    assert grad.shape == (size,) and grad.dtype == np.float32 and np.isfinite(grad).all()
    assert 0 < np.linalg.norm(grad) <= 0.05 + 1e-6  # (sum of <= 8 vectors of norm 0.05) / 8
    noisy = DPGradient(UNet(3, base_width=16), clip=1.0, noise_multiplier=1.0, expected_batch=8,
                       generator=torch.Generator().manual_seed(2))
    t = torch.rand(len(x0), generator=g)
    out = noisy(flow_matching_loss(noisy.forward_module, x0, x1, t), 8)
    assert out.shape == (size,) and np.isfinite(out).all()
