"""Time-conditioned U-Nets for images, trainable under DP-SGD (Opacus), in two layouts:
``compact`` (:class:`UNet`: one skip per level, the small one tests and benchmarks use) and
``guided`` (:class:`GuidedUNet`: guided diffusion's layout, which torchcfm's U-Net and so the
FFM paper use). The paper's CIFAR-10 arguments (App. C.2: base width 128, channel multipliers
(1, 2, 2, 2), 2 residual blocks per resolution, attention with 4 heads at 16 x 16) are
:data:`PAPER_CIFAR`; under the guided layout they give the paper's 35.75M parameters."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..names import UNET_LAYOUTS

__all__ = ["UNet", "GuidedUNet", "make_unet", "LAYOUTS", "time_embedding", "PAPER_CIFAR"]

PAPER_CIFAR = {"base_width": 128, "channel_mult": (1, 2, 2, 2), "blocks": 2,
               "attention": (16,), "heads": 4}
"""The FFM paper's CIFAR-10 U-Net (App. C.2) in the U-Nets' arguments (its layout: guided)."""


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


class _Attention(nn.Module):
    """Residual multi-head self-attention over the H*W positions: GroupNorm, q/k/v and output
    projections as nn.Linear on [B, H*W, C] tokens (so Opacus clips them per example; its
    MultiheadAttention is not on the ghost-clipping path), scaled dot-product attention."""

    def __init__(self, channels: int, heads: int, groups: int):
        super().__init__()
        if channels % heads:
            raise ValueError(f"attention: {channels} channels do not split into {heads} heads")
        self.heads = heads
        self.norm = nn.GroupNorm(groups, channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)                    # [B, HW, C]
        q, k, v = self.qkv(tokens).reshape(b, h * w, 3, self.heads, c // self.heads
                                           ).permute(2, 0, 3, 1, 4)         # [B, heads, HW, c]
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        out = self.proj(out.transpose(1, 2).reshape(b, h * w, c))
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class _TimeConditioned(nn.Module):
    """What both layouts share: the checks of their arguments and of an input's size, and the
    time embedding [B, 4 base_width] (sinusoidal, then Linear, SiLU, Linear), to which an
    optional condition embedding is added."""

    def __init__(self, name: str, base_width: int, channel_mult: tuple[int, ...], blocks: int):
        super().__init__()
        if len(channel_mult) < 1 or blocks < 1:
            raise ValueError(f"{name} needs at least one level and one block per level")
        self.name, self.base_width = name, base_width
        self.factor = 2 ** (len(channel_mult) - 1)
        emb = self.embedding_dim
        self.time = nn.Sequential(nn.Linear(base_width, emb), nn.SiLU(), nn.Linear(emb, emb))

    @property
    def embedding_dim(self) -> int:
        """Width of the time embedding every block receives (4 x base width)."""
        return 4 * self.base_width

    def embed(self, x: torch.Tensor, t: torch.Tensor,
              condition: torch.Tensor | None) -> torch.Tensor:
        """The embedding [B, embedding_dim] of times ``t`` [B] (or a scalar) for the images
        ``x`` [B, C, H, W], plus ``condition`` when given; raises ValueError unless H and W
        are divisible by 2^(levels - 1)."""
        if x.shape[-2] % self.factor or x.shape[-1] % self.factor:
            raise ValueError(f"{self.name} needs H and W divisible by {self.factor}, got "
                             f"{tuple(x.shape[-2:])}")
        t = t.reshape(-1).expand(x.shape[0]).to(x.dtype)
        emb = self.time(time_embedding(t, self.base_width).to(x.dtype))
        return emb if condition is None else emb + condition.to(emb.dtype)


class UNet(_TimeConditioned):
    """Velocity v_theta(x, t) for images: x [B, C, H, W], t [B] (or a scalar) -> [B, C, H, W].

    Levels i = 0 .. L-1 (L = len(channel_mult)) at resolutions H / 2^i with widths
    ``base_width * channel_mult[i]``. The encoder runs ``blocks`` residual blocks per level and
    a stride-2 convolution between levels; the last level is the bottleneck. The decoder, for
    each level L-2 .. 0, upsamples (nearest, then a 3x3 conv to the level's width), concatenates
    the encoder's output at that level and runs ``blocks`` residual blocks. Self-attention
    (``heads`` heads) follows every block at a resolution listed in ``attention`` (in pixels,
    e.g. 16 for 16 x 16). H and W must be divisible by 2^(L-1). Every block gets the sinusoidal
    time embedding through its own linear projection. GroupNorm with ``groups`` groups (which
    must divide every width), never BatchNorm, so per-example gradients exist (Opacus'
    validator passes) and no parameter is used twice per forward.

    The default (``channel_mult`` (1, 2, 2), one block, no attention) is the small U-Net the DP
    benchmarks use; with :data:`PAPER_CIFAR` it has 20.1M parameters, where the paper's
    (guided) layout has 35.75M: see :class:`GuidedUNet`.
    """

    def __init__(self, channels: int, base_width: int = 32, groups: int = 8,
                 channel_mult: tuple[int, ...] = (1, 2, 2), blocks: int = 1,
                 attention: tuple[int, ...] = (), heads: int = 4, image_size: int = 32):
        super().__init__("UNet", base_width, channel_mult, blocks)
        w, emb = base_width, self.embedding_dim
        widths = [w * m for m in channel_mult]
        self.conv_in = nn.Conv2d(channels, w, 3, padding=1)

        def stage(cin: int, cout: int, level: int) -> nn.ModuleList:
            layers = nn.ModuleList()
            for j in range(blocks):
                layers.append(_Block(cin if j == 0 else cout, cout, emb, groups))
                if image_size >> level in attention:
                    layers.append(_Attention(cout, heads, groups))
            return layers

        self.encoder, self.down = nn.ModuleList(), nn.ModuleList()
        previous = w
        for level, width in enumerate(widths):
            self.encoder.append(stage(previous, width, level))
            if level < len(widths) - 1:
                self.down.append(nn.Conv2d(width, width, 3, 2, padding=1))
            previous = width
        self.up, self.decoder = nn.ModuleList(), nn.ModuleList()
        for level in range(len(widths) - 2, -1, -1):
            self.up.append(nn.Sequential(nn.Upsample(scale_factor=2.0),
                                         nn.Conv2d(widths[level + 1], widths[level], 3,
                                                   padding=1)))
            self.decoder.append(stage(2 * widths[level], widths[level], level))
        self.out = nn.Sequential(nn.GroupNorm(groups, w), nn.SiLU(),
                                 nn.Conv2d(w, channels, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor,
                condition: torch.Tensor | None = None) -> torch.Tensor:
        """``condition``: an optional [B, embedding_dim] embedding added to the time embedding
        (a class or attribute embedding, :class:`~.conditional.ConditionalUNet`)."""
        emb = self.embed(x, t, condition)
        h, skips = self.conv_in(x), []
        for level, layers in enumerate(self.encoder):
            for layer in layers:
                h = layer(h, emb)
            if level < len(self.down):
                skips.append(h)                                    # [B, w_l, H/2^l, W/2^l]
                h = self.down[level](h)
        for up, layers in zip(self.up, self.decoder, strict=True):
            h = torch.cat([up(h), skips.pop()], dim=1)             # [B, 2 w_l, H/2^l, W/2^l]
            for layer in layers:
                h = layer(h, emb)
        return self.out(h)


class _Unit(nn.Module):
    """A residual block, then self-attention when ``attend``: [B, cin, H, W] -> [B, cout, H, W]."""

    def __init__(self, cin: int, cout: int, emb: int, groups: int, attend: bool, heads: int):
        super().__init__()
        self.block = _Block(cin, cout, emb, groups)
        self.attention = _Attention(cout, heads, groups) if attend else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.block(x, emb)
        return h if self.attention is None else self.attention(h, emb)


class GuidedUNet(_TimeConditioned):
    """Velocity v_theta(x, t) for images in guided diffusion's layout (Dhariwal and Nichol,
    2021), the U-Net torchcfm trains and the FFM paper uses: x [B, C, H, W], t [B] -> [B, C, H, W].

    The same arguments and blocks as :class:`UNet`, arranged as that code does: the encoder
    keeps a skip after its input convolution, after every residual block (each followed by
    attention at a resolution in ``attention``) and after every stride-2 convolution; a middle
    block (residual, attention, residual) at the lowest resolution; the decoder runs
    ``blocks + 1`` residual blocks per level, each on its input concatenated with one skip, and
    upsamples (nearest, then a 3 x 3 convolution) between levels. The last convolution of each
    residual block, each attention's output projection and the output convolution start at
    zero, as in that code, so v_theta = 0 at initialization. :data:`PAPER_CIFAR` gives
    35,746,307 parameters (the paper: 35.75 million).
    """

    def __init__(self, channels: int, base_width: int = 32, groups: int = 8,
                 channel_mult: tuple[int, ...] = (1, 2, 2), blocks: int = 1,
                 attention: tuple[int, ...] = (), heads: int = 4, image_size: int = 32):
        super().__init__("GuidedUNet", base_width, channel_mult, blocks)
        w, emb = base_width, self.embedding_dim
        self.conv_in = nn.Conv2d(channels, w, 3, padding=1)
        skips, width = [w], w  # the width of each skip, in the order the encoder keeps them
        self.encoder, self.down = nn.ModuleList(), nn.ModuleList()
        for level, mult in enumerate(channel_mult):
            units = nn.ModuleList()
            for _ in range(blocks):
                units.append(_Unit(width, w * mult, emb, groups,
                                   image_size >> level in attention, heads))
                width = w * mult
                skips.append(width)
            self.encoder.append(units)
            if level < len(channel_mult) - 1:
                self.down.append(nn.Conv2d(width, width, 3, 2, padding=1))
                skips.append(width)
        self.middle = nn.ModuleList([_Unit(width, width, emb, groups, True, heads),
                                     _Unit(width, width, emb, groups, False, heads)])
        self.decoder, self.up = nn.ModuleList(), nn.ModuleList()
        for level in range(len(channel_mult) - 1, -1, -1):
            units = nn.ModuleList()
            for _ in range(blocks + 1):
                units.append(_Unit(width + skips.pop(), w * channel_mult[level], emb, groups,
                                   image_size >> level in attention, heads))
                width = w * channel_mult[level]
            self.decoder.append(units)
            if level > 0:
                self.up.append(nn.Sequential(nn.Upsample(scale_factor=2.0),
                                             nn.Conv2d(width, width, 3, padding=1)))
        self.out = nn.Sequential(nn.GroupNorm(groups, w), nn.SiLU(),
                                 nn.Conv2d(w, channels, 3, padding=1))
        zeroed = [self.out[2]] + [m.conv2 for m in self.modules() if isinstance(m, _Block)]
        zeroed += [m.proj for m in self.modules() if isinstance(m, _Attention)]
        for layer in zeroed:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor,
                condition: torch.Tensor | None = None) -> torch.Tensor:
        """``condition``: as :meth:`UNet.forward`."""
        emb = self.embed(x, t, condition)
        h = self.conv_in(x)
        skips = [h]
        for level, units in enumerate(self.encoder):
            for unit in units:
                h = unit(h, emb)
                skips.append(h)
            if level < len(self.down):
                h = self.down[level](h)
                skips.append(h)
        for unit in self.middle:
            h = unit(h, emb)
        for level, units in enumerate(self.decoder):
            for unit in units:
                h = unit(torch.cat([h, skips.pop()], dim=1), emb)
            if level < len(self.up):
                h = self.up[level](h)
        return self.out(h)


LAYOUTS = dict(zip(UNET_LAYOUTS, (UNet, GuidedUNet), strict=True))
"""The U-Net layouts by name (``unet_layout`` in a run config)."""


def make_unet(layout: str, channels: int, **arguments) -> nn.Module:
    """A U-Net of ``layout`` (a key of :data:`LAYOUTS`) with :class:`UNet`'s ``arguments``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unet layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    return LAYOUTS[layout](channels, **arguments)
