"""A small time-conditioned U-Net for images, trainable under DP-SGD (Opacus)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["UNet", "time_embedding"]


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of times t [B] in [0, 1]: [B, dim] (dim even), frequencies from 1
    to 1000 radians per unit of t (the DDPM embedding of 1000 t)."""
    half = dim // 2
    freqs = torch.exp(-math.log(1e4) * torch.arange(half, device=t.device) / half)
    args = 1000.0 * t.reshape(-1, 1).float() * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class _Block(nn.Module):
    """Residual block: (GroupNorm, SiLU, 3x3 conv) twice, the time embedding added in between."""

    def __init__(self, cin: int, cout: int, emb: int, groups: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(emb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.act(self.norm1(x))) + self.time(emb)[:, :, None, None]
        return self.conv2(self.act(self.norm2(h))) + self.skip(x)


class UNet(nn.Module):
    """Velocity v_theta(x, t) for images: x [B, C, H, W], t [B] (or a scalar) -> [B, C, H, W].

    H and W must be divisible by 4 (two stride-2 downsamplings: H -> H/2 -> H/4 and back, with
    skip connections at H and H/2). Widths ``base_width`` and ``2 * base_width``; every block
    gets the sinusoidal time embedding through its own linear projection. GroupNorm with
    ``groups`` groups (which must divide ``base_width``), never BatchNorm, so that per-example
    gradients exist (Opacus' validator passes) and no parameter is used twice per forward.
    """

    def __init__(self, channels: int, base_width: int = 32, groups: int = 8):
        super().__init__()
        w, emb = base_width, 4 * base_width
        self.base_width = base_width
        self.time = nn.Sequential(nn.Linear(w, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.conv_in = nn.Conv2d(channels, w, 3, padding=1)
        self.down1, self.pool1 = _Block(w, w, emb, groups), nn.Conv2d(w, w, 3, 2, padding=1)
        self.down2 = _Block(w, 2 * w, emb, groups)
        self.pool2 = nn.Conv2d(2 * w, 2 * w, 3, 2, padding=1)
        self.mid = _Block(2 * w, 2 * w, emb, groups)
        self.up2 = nn.Sequential(nn.Upsample(scale_factor=2.0),
                                 nn.Conv2d(2 * w, 2 * w, 3, padding=1))
        self.dec2 = _Block(4 * w, 2 * w, emb, groups)
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2.0), nn.Conv2d(2 * w, w, 3, padding=1))
        self.dec1 = _Block(2 * w, w, emb, groups)
        self.out = nn.Sequential(nn.GroupNorm(groups, w), nn.SiLU(),
                                 nn.Conv2d(w, channels, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] % 4 or x.shape[-1] % 4:
            raise ValueError(f"UNet needs H and W divisible by 4, got {tuple(x.shape[-2:])}")
        t = t.reshape(-1).expand(x.shape[0]).to(x.dtype)
        emb = self.time(time_embedding(t, self.base_width).to(x.dtype))
        h1 = self.down1(self.conv_in(x), emb)                      # [B, w, H, W]
        h2 = self.down2(self.pool1(h1), emb)                       # [B, 2w, H/2, W/2]
        h = self.mid(self.pool2(h2), emb)                          # [B, 2w, H/4, W/4]
        h = self.dec2(torch.cat([self.up2(h), h2], dim=1), emb)    # [B, 2w, H/2, W/2]
        h = self.dec1(torch.cat([self.up1(h), h1], dim=1), emb)    # [B, w, H, W]
        return self.out(h)
