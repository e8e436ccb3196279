"""PSNR and SSIM against their closed forms (no reference library is installed)."""

from __future__ import annotations

import math

import pytest
import torch

from secureffm.metrics.image_quality import psnr, ssim


def test_psnr_of_a_constant_offset_is_its_closed_form():
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    c = 0.1  # MSE = c^2 on a range of width 2: 10 log10(4 / 0.01) = 26.02 dB
    assert torch.allclose(psnr(x + c, x), torch.full((3,), 10 * math.log10(4 / c**2)))


def test_ssim_of_an_image_with_itself_is_one():
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    assert torch.allclose(ssim(x, x), torch.ones(2), atol=1e-6)


@pytest.mark.parametrize("a, b", [(0.5, 0.5), (0.3, -0.2), (-1.0, 1.0)])
def test_ssim_of_two_constant_images_is_the_luminance_term(a, b):
    """No variance and no covariance: SSIM = (2ab + C1) / (a^2 + b^2 + C1), C1 = (0.01 L)^2."""
    c1 = (0.01 * 2) ** 2
    got = ssim(torch.full((1, 1, 8, 8), a), torch.full((1, 1, 8, 8), b))
    assert float(got) == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-6)


def test_ssim_is_symmetric_and_falls_for_unrelated_images():
    g = torch.Generator().manual_seed(0)
    x, y = (torch.rand(4, 1, 8, 8, generator=g) * 2 - 1 for _ in range(2))
    assert torch.allclose(ssim(x, y), ssim(y, x))
    assert float(ssim(x, y).abs().max()) < 0.5 < float(ssim(x, x + 0.05 * y).min())
