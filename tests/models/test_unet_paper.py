"""The U-Net's levels, blocks and attention: the FFM paper's CIFAR-10 layout, and DP-SGD's
per-example clipping through its attention layers."""

import copy

import numpy as np
import pytest
import torch

from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.models.unet import PAPER_CIFAR, UNet, _Attention, make_unet
from secureffm.privacy import DPGradient


def test_paper_layout_has_attention_only_at_16_and_keeps_the_shape():
    model = UNet(3, **{**PAPER_CIFAR, "base_width": 16})  # the layout at a smaller width
    attention = [n for n, m in model.named_modules() if isinstance(m, _Attention)]
    # level 1 (16 x 16): two encoder blocks and two decoder blocks, each followed by attention
    assert len(attention) == 4 and all(".1." in n for n in attention)
    x = torch.randn(2, 3, 32, 32)
    assert model(x, torch.rand(2)).shape == x.shape
    assert sum(p.numel() for p in UNet(3).parameters()) == 456_963  # the default is unchanged


@pytest.mark.parametrize("layout", ["compact", "guided"])
def test_dp_clips_each_example_through_attention(layout):
    torch.manual_seed(0)
    model = make_unet(layout, 3, base_width=8, channel_mult=(1, 2), attention=(4,),
                      image_size=8)
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(6, 3, 8, 8, generator=g), torch.randn(6, 3, 8, 8, generator=g)
    dp = DPGradient(model, clip=0.01, noise_multiplier=0.0, expected_batch=6,
                    generator=torch.Generator().manual_seed(1))
    losses = flow_matching_loss(dp.forward_module, x0, x1, torch.rand(6, generator=g))
    grad = dp(1e4 * losses, 6)
    assert np.isfinite(grad).all() and 0 < np.linalg.norm(grad) <= 0.01 + 1e-6


def _guided_count(channels: int, width: int, mult: tuple[int, ...], blocks: int,
                  attention_levels: set[int]) -> int:
    """Parameters of guided diffusion's UNetModel (Dhariwal and Nichol's code, which torchcfm
    copies), counted layer by layer from that code's structure: an independent reference."""
    def conv(cin, cout, k):
        return cin * cout * k * k + cout

    def res(cin, cout, emb):  # in_layers, emb_layers, out_layers, skip_connection
        return 2 * cin + conv(cin, cout, 3) + emb * cout + cout + 2 * cout + conv(
            cout, cout, 3) + (0 if cin == cout else conv(cin, cout, 1))

    def attn(c):  # norm, qkv (conv1d), proj_out (conv1d)
        return 2 * c + conv(c, 3 * c, 1) + conv(c, c, 1)

    emb = 4 * width
    total = width * emb + emb + emb * emb + emb + conv(channels, width, 3)
    chans, ch = [width], width
    for level, m in enumerate(mult):
        for _ in range(blocks):
            total += res(ch, m * width, emb) + (attn(m * width) if level in attention_levels
                                                else 0)
            ch = m * width
            chans.append(ch)
        if level < len(mult) - 1:
            total += conv(ch, ch, 3)
            chans.append(ch)
    total += 2 * res(ch, ch, emb) + attn(ch)
    for level in reversed(range(len(mult))):
        for i in range(blocks + 1):
            total += res(ch + chans.pop(), mult[level] * width, emb)
            ch = mult[level] * width
            total += attn(ch) if level in attention_levels else 0
            if level and i == blocks:
                total += conv(ch, ch, 3)
    return total + 2 * ch + conv(ch, channels, 3)


def test_guided_layout_has_the_papers_35_75m_parameters():
    """The FFM paper's CIFAR-10 U-Net: 35.75 million parameters (its App. C.2), in guided
    diffusion's layout; the compact layout with the same arguments has fewer."""
    guided = make_unet("guided", 3, **PAPER_CIFAR)
    count = sum(p.numel() for p in guided.parameters())
    assert count == _guided_count(3, 128, (1, 2, 2, 2), 2, {1}) == 35_746_307
    assert round(count / 1e6, 2) == 35.75
    assert sum(p.numel() for p in UNet(3, **PAPER_CIFAR).parameters()) == 20_125_955


def test_guided_layout_starts_at_zero_and_learns_every_layer():
    """Zero-initialized output layers (as guided diffusion): v = 0 at first, and one gradient
    step reaches every parameter, so the skips and the middle block are wired in."""
    torch.manual_seed(0)
    model = make_unet("guided", 3, base_width=16, channel_mult=(1, 2), blocks=1,
                      attention=(4,), image_size=8)
    assert _guided_count(3, 16, (1, 2), 1, {1}) == sum(p.numel() for p in model.parameters())
    x = torch.randn(4, 3, 8, 8)
    assert torch.count_nonzero(model(x, torch.rand(4))) == 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # zeros pass no gradient backwards at first: a few steps open the path
        optimizer.zero_grad()
        (model(x, torch.rand(4)) - x).square().mean().backward()
        optimizer.step()
    optimizer.zero_grad()
    (model(x, torch.rand(4)) - x).square().mean().backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert silent == []


def test_dp_on_the_guided_layout_is_the_mean_of_each_examples_clipped_gradient():
    """Opacus' ghost clipping through the guided layout's skips, middle block and attention
    equals the reference computed one example at a time with plain autograd (no noise)."""
    torch.manual_seed(0)
    model = make_unet("guided", 3, base_width=8, channel_mult=(1, 2), attention=(4,),
                      image_size=8)
    for parameter in model.parameters():  # off the zero start, so every layer has a gradient
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(5, 3, 8, 8, generator=g), torch.randn(5, 3, 8, 8, generator=g)
    t, clip = torch.rand(5, generator=g), 2.6  # per-example norms 2.4-3.1: some clipped
    expected = []
    for i in range(5):
        reference.zero_grad()
        flow_matching_loss(reference, x0[i:i + 1], x1[i:i + 1], t[i:i + 1]).sum().backward()
        grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        expected.append(grad * min(1.0, clip / float(grad.norm())))
    dp = DPGradient(model, clip=clip, noise_multiplier=0.0, expected_batch=5,
                    generator=torch.Generator().manual_seed(1))
    got = dp(flow_matching_loss(dp.forward_module, x0, x1, t), 5)
    np.testing.assert_allclose(got, (sum(expected) / 5).numpy(), rtol=1e-4, atol=1e-7)
