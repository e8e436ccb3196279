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

__all__ = ["Distribution", "DISTRIBUTIONS", "normals"]

# Uniforms [n, k] in [0, 1) -> points [n, dim] float32 and labels [n] int64.
Transform = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Distribution:
    """A labelled distribution on R^dim, written as a transform of ``uniforms`` independent
    U[0, 1) per point, so a point can be drawn from any uniform source: a seeded generator
    (:meth:`sample`) or a keyed per-example stream (``SecretStreams.example_uniforms``).

    ``disjoint_order`` lists labels so that contiguous runs form spatially coherent groups
    (the disjoint partition gives each client one run).
    """

    name: str
    dim: int
    uniforms: int
    transform: Transform
    disjoint_order: tuple[int, ...]

    def sample(self, n: int, generator: torch.Generator,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """n points [n, dim] float32 and their labels [n] int64."""
        return self.from_uniforms(torch.rand(n, self.uniforms, generator=generator,
                                             device=device))

    def from_uniforms(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Points [n, dim] float32 and labels from uniforms ``u`` [n, uniforms] in [0, 1) (row
        i makes point i). The transform runs in float64: a float64 uniform just below 1 would
        round to 1.0 in float32 and Box-Muller would return an infinite point."""
        if u.dim() != 2 or u.shape[1] != self.uniforms:
            raise ValueError(f"{self.name} needs uniforms of shape [n, {self.uniforms}], "
                             f"got {tuple(u.shape)}")
        points, labels = self.transform(u.to(torch.float64))
        return points.to(torch.float32), labels


def normals(u1: torch.Tensor, u2: torch.Tensor) -> torch.Tensor:
    """Box-Muller: two independent U[0, 1) tensors -> standard normals [..., 2]."""
    radius = torch.sqrt(-2.0 * torch.log1p(-u1))
    angle = 2.0 * math.pi * u2
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)


def _labels(u: torch.Tensor, count: int) -> torch.Tensor:
    return (u * count).long().clamp(max=count - 1)


def _eight_gaussians(u):
    labels = _labels(u[:, 0], 8)
    angles = labels.to(torch.float32) * (math.pi / 4)
    centers = 5.0 * torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    return centers + normals(u[:, 1], u[:, 2]) * 0.1**0.25, labels


def _moons(u):
    labels = _labels(u[:, 0], 2)
    angles = u[:, 1] * math.pi
    upper = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    lower = torch.stack([1.0 - torch.cos(angles), 0.5 - torch.sin(angles)], dim=1)
    points = torch.where(labels[:, None] == 0, upper, lower)
    points = points + 0.2 * normals(u[:, 2], u[:, 3])
    return points * 3.0 - 1.0, labels


def _uniform(u):
    return u * 4.0 - 2.0, torch.zeros(len(u), dtype=torch.long, device=u.device)


def _gaussian(u):
    return normals(u[:, 0], u[:, 1]), torch.zeros(len(u), dtype=torch.long, device=u.device)


DISTRIBUTIONS: dict[str, Distribution] = {
    # Lower-left run first: angles 135..270 degrees, then 315..90 (the paper's App. C.1 split).
    "8gaussians": Distribution("8gaussians", 2, 3, _eight_gaussians, (3, 4, 5, 6, 7, 0, 1, 2)),
    "moons": Distribution("moons", 2, 4, _moons, (0, 1)),
    "uniform": Distribution("uniform", 2, 2, _uniform, (0,)),
    "gaussian": Distribution("gaussian", 2, 2, _gaussian, (0,)),
}
