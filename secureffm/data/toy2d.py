"""Labelled 2D distributions (sources and targets of the FFM paper's 2D experiments).

Conventions (stated once, in docs/results.md too):

- ``8gaussians``: eight Gaussians centred on a circle of radius 5 at angles k*45 degrees
  (label k), per-axis std 0.1**0.25 = 0.562: torchcfm's sampler, which the paper uses, passes
  the variance 0.1 where a std belongs; we keep its distribution so numbers compare.
- ``moons``: two moons at uniformly random angles (not sklearn's fixed angle grid, which makes
  target-vs-target W2 misleadingly low), noise std 0.2, then scaled by 3 and shifted by -1 as in
  torchcfm; label 0 is the upper moon, 1 the lower.
- ``uniform``: uniform on the square [-2, 2]^2. ``gaussian``: standard normal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Distribution", "DISTRIBUTIONS"]

Sampler = Callable[[int, torch.Generator, torch.device], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Distribution:
    """A labelled distribution on R^dim.

    ``sample(n, generator, device)`` returns points [n, dim] float32 and labels [n] int64.
    ``disjoint_order`` lists labels so that contiguous runs form spatially coherent groups
    (the disjoint partition gives each client one run).
    """

    name: str
    dim: int
    sample: Sampler
    disjoint_order: tuple[int, ...]


def _eight_gaussians(n, generator, device):
    labels = torch.randint(0, 8, (n,), generator=generator, device=device)
    angles = labels.to(torch.float32) * (math.pi / 4)
    centers = 5.0 * torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    noise = torch.randn(n, 2, generator=generator, device=device) * 0.1**0.25
    return centers + noise, labels


def _moons(n, generator, device):
    labels = torch.randint(0, 2, (n,), generator=generator, device=device)
    angles = torch.rand(n, generator=generator, device=device) * math.pi
    upper = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    lower = torch.stack([1.0 - torch.cos(angles), 0.5 - torch.sin(angles)], dim=1)
    points = torch.where(labels[:, None] == 0, upper, lower)
    points = points + 0.2 * torch.randn(n, 2, generator=generator, device=device)
    return points * 3.0 - 1.0, labels


def _uniform(n, generator, device):
    points = torch.rand(n, 2, generator=generator, device=device) * 4.0 - 2.0
    return points, torch.zeros(n, dtype=torch.long, device=device)


def _gaussian(n, generator, device):
    points = torch.randn(n, 2, generator=generator, device=device)
    return points, torch.zeros(n, dtype=torch.long, device=device)


DISTRIBUTIONS: dict[str, Distribution] = {
    # Lower-left run first: angles 135..270 degrees, then 315..90 (the paper's App. C.1 split).
    "8gaussians": Distribution("8gaussians", 2, _eight_gaussians, (3, 4, 5, 6, 7, 0, 1, 2)),
    "moons": Distribution("moons", 2, _moons, (0, 1)),
    "uniform": Distribution("uniform", 2, _uniform, (0,)),
    "gaussian": Distribution("gaussian", 2, _gaussian, (0,)),
}
