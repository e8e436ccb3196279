"""Sampling a learned velocity field with torchdiffeq, and path straightness."""

from __future__ import annotations

import torch
from torch import nn
from torchdiffeq import odeint

__all__ = ["integrate", "trajectories", "straightness"]


class _CountingField(nn.Module):
    """Wraps v(x, t) as torchdiffeq's f(t, x) and counts evaluations (the NFE)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.calls = 0

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.model(x, t.expand(x.shape[0]))


@torch.no_grad()
def integrate(
    model: nn.Module, x0: torch.Tensor, nfe: int | None = None, method: str = "euler",
    tol: float = 1e-5,
) -> tuple[torch.Tensor, int]:
    """Push x0 [N, d] from t = 0 to t = 1. Returns (x1 [N, d], function evaluations used).

    ``euler`` takes ``nfe`` equal steps; an adaptive ``method`` (dopri5) uses atol = rtol = tol
    and reports the evaluations it needed.
    """
    field = _CountingField(model)
    if method == "euler":
        grid = torch.linspace(0.0, 1.0, nfe + 1, device=x0.device)
        path = odeint(field, x0, grid, method="euler")
    else:
        grid = torch.tensor([0.0, 1.0], device=x0.device)
        path = odeint(field, x0, grid, method=method, atol=tol, rtol=tol)
    return path[-1], field.calls


@torch.no_grad()
def trajectories(model: nn.Module, x0: torch.Tensor, steps: int = 100) -> torch.Tensor:
    """Euler trajectories with ``steps`` steps, shape [steps + 1, N, d]."""
    grid = torch.linspace(0.0, 1.0, steps + 1, device=x0.device)
    return odeint(_CountingField(model), x0, grid, method="euler")


@torch.no_grad()
def straightness(model: nn.Module, x0: torch.Tensor, steps: int = 100) -> float:
    """Liu et al. (2022): S = int_0^1 E |(z_1 - z_0) - v(z_t, t)|^2 dt; 0 for straight paths.

    Estimated on Euler trajectories from x0 [N, d] with ``steps`` steps (left Riemann sum).
    """
    path = trajectories(model, x0, steps)
    grid = torch.linspace(0.0, 1.0, steps + 1, device=x0.device)
    displacement = path[-1] - path[0]
    total = 0.0
    for k in range(steps):
        v = model(path[k], grid[k].expand(x0.shape[0]))
        total += (displacement - v).pow(2).flatten(1).sum(1).mean().item()
    return total / steps
