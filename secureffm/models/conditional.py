"""Velocity fields conditioned on k discrete attributes, each of which may be "null": an MLP
for points and small images, a U-Net for images.

Labels are long tensors [B, k] with values 0..cardinality_j - 1; the extra index
``cardinality_j`` is the null token of attribute j (the attribute is masked out), so
``null_labels`` gives the unconditional label and a row with one non-null entry a marginal one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .unet import make_unet

__all__ = ["ConditionalVelocityMLP", "ConditionalUNet", "null_labels"]


def null_labels(batch: int, cardinalities: tuple[int, ...], device=None) -> torch.Tensor:
    """The unconditional label: every attribute null, shape [batch, k]."""
    return torch.tensor(cardinalities, device=device).expand(batch, -1).clone()


class ConditionalVelocityMLP(nn.Module):
    """v_theta(x, t, y): [B, *shape] x [B] x [B, k] -> [B, *shape].

    ``shape``: one sample's shape, e.g. (2,) or (3, 8, 8); the input is flattened inside.
    ``cardinalities``: |Y_j| per attribute; attribute j gets an embedding table of
    |Y_j| + 1 rows (the last is null). Time enters as ``2 * frequencies`` sinusoidal features.
    Hidden layers: ``depth`` x ``hidden`` units with SiLU. Only Linear and Embedding layers, so
    Opacus' ghost clipping can train it under DP-SGD.
    """

    def __init__(self, shape: tuple[int, ...], cardinalities: tuple[int, ...], hidden: int = 128,
                 depth: int = 3, embed: int = 16, frequencies: int = 8):
        super().__init__()
        self.shape = tuple(shape)
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.dim = math.prod(self.shape)
        self.embeddings = nn.ModuleList(nn.Embedding(c + 1, embed) for c in self.cardinalities)
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(frequencies).float(),
                             persistent=False)
        width = self.dim + 2 * frequencies + embed * len(self.cardinalities)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, self.dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        angles = t.reshape(-1, 1).expand(batch, 1).to(x.dtype) * self.freqs
        parts = [x.reshape(batch, -1), torch.sin(angles), torch.cos(angles)]
        parts += [table(y[:, j]) for j, table in enumerate(self.embeddings)]
        return self.net(torch.cat(parts, dim=1)).reshape(batch, *self.shape)


class ConditionalUNet(nn.Module):
    """v_theta(x, t, y) for images: [B, C, H, W] x [B] x [B, k] -> [B, C, H, W].

    A U-Net of ``layout`` (:func:`~.unet.make_unet`: ``base_width``, ``channel_mult``,
    ``blocks``, ``attention``) whose time embedding gets the sum of one learned embedding per
    attribute added (attribute j: a table of |Y_j| + 1 rows, the last the null token), as
    class-conditional diffusion U-Nets condition on labels. Embedding, Linear, Conv2d and
    GroupNorm only: Opacus clips each example's gradient."""

    def __init__(self, shape: tuple[int, int, int], cardinalities: tuple[int, ...],
                 base_width: int = 32, channel_mult: tuple[int, ...] = (1, 2, 2),
                 blocks: int = 1, attention: tuple[int, ...] = (), layout: str = "compact"):
        super().__init__()
        channels, size, _ = shape
        self.shape = tuple(shape)
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.unet = make_unet(layout, channels, base_width=base_width,
                              channel_mult=channel_mult, blocks=blocks, attention=attention,
                              image_size=size)
        self.embeddings = nn.ModuleList(nn.Embedding(c + 1, self.unet.embedding_dim)
                                        for c in self.cardinalities)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        condition = sum(table(y[:, j]) for j, table in enumerate(self.embeddings))
        return self.unet(x, t, condition)
