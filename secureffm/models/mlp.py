"""Small networks for 2D and tabular data."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VelocityMLP", "PotentialMLP"]


class VelocityMLP(nn.Module):
    """Time-conditioned velocity v_theta(x, t): [B, d] x [B] -> [B, d].

    The MLP of torchcfm's 2D examples (which the FFM paper uses): input (x, t), three hidden
    layers of ``hidden`` units with SELU.
    """

    def __init__(self, dim: int, hidden: int = 64):
        super().__init__()
        self.dim = dim
        self.net = nn.Sequential(
            nn.Linear(dim + 1, hidden), nn.SELU(),
            nn.Linear(hidden, hidden), nn.SELU(),
            nn.Linear(hidden, hidden), nn.SELU(),
            nn.Linear(hidden, dim),
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(-1, 1).expand(x.shape[0], 1).to(x.dtype)
        return self.net(torch.cat([x, t], dim=1))


class PotentialMLP(nn.Module):
    """Dual potential f_phi(x0): [B, d] -> [B]; 3 layers, ``hidden`` units, ReLU (FFM App. C.1).
    Inputs [B, ...] with d elements per example are flattened (images [B, C, H, W]: f lives on
    the source, N(0, I) noise without spatial structure, so an MLP on the pixels suffices, and
    DP-SGD clips it exactly in ``linear`` mode)."""

    def __init__(self, dim: int, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).squeeze(-1)
