"""The conditional flow matching loss, written once for every coupling.

Convention: time runs from source (t = 0) to data (t = 1); x_t = (1 - t) x0 + t x1 and the
regression target is u_t = x1 - x0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["PathSample", "sample_path", "flow_matching_loss"]


@dataclass(frozen=True)
class PathSample:
    """Points on straight paths: t [B], x_t [B, d], target velocity u_t [B, d]."""

    t: torch.Tensor
    x_t: torch.Tensor
    u_t: torch.Tensor


def sample_path(x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor) -> PathSample:
    """The straight path from paired x0 [B, d] to x1 [B, d] at times t [B]."""
    tt = t.reshape(-1, *([1] * (x0.dim() - 1)))
    return PathSample(t=t, x_t=(1 - tt) * x0 + tt * x1, u_t=x1 - x0)


def flow_matching_loss(
    model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """Per-example loss |v(x_t, t) - (x1 - x0)|^2 averaged over dimensions, shape [B], at
    times ``t`` [B] in [0, 1]. Term i depends on (x0_i, x1_i, t_i) only, so DP clipping
    applies to it."""
    path = sample_path(x0, x1, t)
    error = model(path.x_t, path.t) - path.u_t
    return error.pow(2).flatten(1).mean(dim=1)
