"""The U-Net's levels, blocks and attention: the FFM paper's CIFAR-10 layout, and DP-SGD's
per-example clipping through its attention layers."""

import numpy as np
import torch

from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.models.unet import PAPER_CIFAR, UNet, _Attention
from secureffm.privacy import DPGradient


def test_paper_layout_has_attention_only_at_16_and_keeps_the_shape():
    model = UNet(3, **{**PAPER_CIFAR, "base_width": 16})  # the layout at a smaller width
    attention = [n for n, m in model.named_modules() if isinstance(m, _Attention)]
    # level 1 (16 x 16): two encoder blocks and two decoder blocks, each followed by attention
    assert len(attention) == 4 and all(".1." in n for n in attention)
    x = torch.randn(2, 3, 32, 32)
    assert model(x, torch.rand(2)).shape == x.shape
    assert sum(p.numel() for p in UNet(3).parameters()) == 456_963  # the default is unchanged


def test_dp_clips_each_example_through_attention():
    torch.manual_seed(0)
    model = UNet(3, 8, channel_mult=(1, 2), attention=(4,), image_size=8)
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(6, 3, 8, 8, generator=g), torch.randn(6, 3, 8, 8, generator=g)
    dp = DPGradient(model, clip=0.01, noise_multiplier=0.0, expected_batch=6,
                    generator=torch.Generator().manual_seed(1))
    losses = flow_matching_loss(dp.forward_module, x0, x1, torch.rand(6, generator=g))
    grad = dp(1e4 * losses, 6)
    assert np.isfinite(grad).all() and 0 < np.linalg.norm(grad) <= 0.01 + 1e-6
