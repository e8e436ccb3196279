"""How close a reconstructed image is to the original: PSNR and SSIM, in torch.

Images are [N, C, H, W] with values in a known range of width ``data_range`` (2 for images in
[-1, 1]); both functions return one value per image, [N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["psnr", "ssim"]


def psnr(x: torch.Tensor, y: torch.Tensor, data_range: float = 2.0) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB, [N]: 10 log10(data_range^2 / MSE) per image (inf for
    equal images)."""
    mse = (x.float() - y.float()).pow(2).flatten(1).mean(dim=1)
    return 10.0 * torch.log10(data_range**2 / mse)


def _window(size: int, sigma: float) -> torch.Tensor:
    """A normalised 2D Gaussian window [size, size]."""
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-coords.pow(2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = 2.0, window: int = 7,
         sigma: float = 1.5) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004), [N]: the mean over channels and over every
    position of a ``window`` x ``window`` Gaussian window (std ``sigma`` pixels, no padding; the
    window shrinks to the image's side when that is smaller) of

    .. math::

        \\frac{(2 \\mu_x \\mu_y + C_1)(2 \\sigma_{xy} + C_2)}
              {(\\mu_x^2 + \\mu_y^2 + C_1)(\\sigma_x^2 + \\sigma_y^2 + C_2)},
        \\qquad C_1 = (0.01 L)^2,\\ C_2 = (0.03 L)^2,

    with L = ``data_range``; local (co)variances are the window-weighted ones."""
    x, y = x.double(), y.double()
    channels = x.shape[1]
    size = min(window, x.shape[-2], x.shape[-1])
    kernel = _window(size, sigma).to(x.device).expand(channels, 1, size, size)

    def blur(z: torch.Tensor) -> torch.Tensor:
        return F.conv2d(z, kernel, groups=channels)

    mx, my = blur(x), blur(y)
    vx, vy = blur(x * x) - mx.pow(2), blur(y * y) - my.pow(2)
    cov = blur(x * y) - mx * my
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    index = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx.pow(2) + my.pow(2) + c1) * (vx + vy + c2))
    return index.flatten(1).mean(dim=1).float()
