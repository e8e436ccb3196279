"""The semi-dual OT objective of FFM-GOT (Eq. 7-8) and its c-transform.

f lives on the source; f^c(x1) = min_{x0} c(x0, x1) - f(x0), approximated by the minimum over
K data-independent candidates from q0, optionally refined by gradient descent on x0.
The dual value f(x0) + f^c(x1) is *maximised*: Algorithm 4 as printed descends it, which
collapses the coupling (see docs/results.md), so the loss we minimise is its negative.
"""

from __future__ import annotations

import torch
from torch import nn

from .couplings import half_squared_cost, semidual_assignment

__all__ = ["c_transform", "semidual_value"]


def c_transform(
    potential: nn.Module,
    candidates: torch.Tensor,
    x1: torch.Tensor,
    steps: int = 0,
    lr: float = 0.1,
) -> torch.Tensor:
    """f^c(x1_j) ~ c(x0*, x1_j) - f(x0*), shape [B]; gradients reach phi only through f(x0*).

    ``candidates`` [K, d] are source draws; x0* starts at the best candidate and takes ``steps``
    gradient steps of size ``lr`` on x0 -> c(x0, x1) - f(x0) with phi held fixed.
    """
    with torch.no_grad():
        best = candidates[semidual_assignment(half_squared_cost(candidates, x1),
                                              potential(candidates))]
    if steps:
        requires = [p.requires_grad for p in potential.parameters()]
        potential.requires_grad_(False)
        x = best.clone().requires_grad_(True)
        for _ in range(steps):
            objective = (0.5 * (x - x1).pow(2).flatten(1).sum(1) - potential(x)).sum()
            (grad,) = torch.autograd.grad(objective, x)
            x = (x - lr * grad).detach().requires_grad_(True)
        for p, r in zip(potential.parameters(), requires, strict=False):
            p.requires_grad_(r)
        best = x.detach()
    return 0.5 * (best - x1).pow(2).flatten(1).sum(1) - potential(best)


def semidual_value(
    potential: nn.Module,
    x0: torch.Tensor,
    candidates: torch.Tensor,
    x1: torch.Tensor,
    steps: int = 0,
    lr: float = 0.1,
) -> torch.Tensor:
    """Monte-Carlo semi-dual E f(x0) + E f^c(x1), a scalar that estimates OT_c(q0, q1)."""
    return potential(x0).mean() + c_transform(potential, candidates, x1, steps, lr).mean()
