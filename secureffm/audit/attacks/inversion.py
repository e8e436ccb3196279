"""Gradient inversion (Geiping et al. 2020, "Inverting Gradients"): find images whose
flow-matching gradient points the way of the one the server received.

Adversary: an honest-but-curious server that holds the model theta it broadcast in a round and
what a client sent back in it (its plaintext gradient, its DP-noised gradient, or its masked
vector under secure aggregation), and searches for a batch x1 [B, C, H, W] minimising

.. math::

    1 - \\cos\\big(\\nabla_\\theta \\tfrac1B \\sum_j \\ell(x1_j; x0_j, t_j), g\\big)
    + \\lambda\\, \\mathrm{TV}(x1),

with :math:`\\ell` the flow-matching loss, :math:`\\mathrm{TV}` the mean absolute difference
of neighbouring pixels, Adam on the inputs and a projection onto the pixel range [-1, 1]. The
**informed** attacker knows each example's noise x0_j and time t_j (an upper bound on the
leakage: they come from the client's secret stream); the **uninformed** one optimises x0_j and
t_j (through a sigmoid) too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...methods.flow_matching import flow_matching_loss

__all__ = ["Inversion", "invert_gradient", "flow_matching_gradient", "total_variation"]


@dataclass(frozen=True)
class Inversion:
    """The attacker's best images ``x1`` [B, C, H, W] (and its ``x0``, ``t`` [B], given or
    found) and the objective ``loss`` they reached."""

    x1: torch.Tensor
    x0: torch.Tensor
    t: torch.Tensor
    loss: float


def flow_matching_gradient(model: nn.Module, x1: torch.Tensor, x0: torch.Tensor,
                           t: torch.Tensor, weights: torch.Tensor | None = None,
                           create_graph: bool = False) -> torch.Tensor:
    """The flat gradient [P] of the batch's flow-matching losses weighted by ``weights`` [B]
    (default 1 / B: the mean, what an FFM client uploads without DP) with respect to
    ``model``'s parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    losses = flow_matching_loss(model, x0, x1, t)
    loss = losses.mean() if weights is None else (weights * losses).sum()
    grads = torch.autograd.grad(loss, params, create_graph=create_graph)
    return torch.cat([g.reshape(-1) for g in grads])


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference between vertically and horizontally neighbouring pixels."""
    return ((x[..., 1:, :] - x[..., :-1, :]).abs().mean()
            + (x[..., :, 1:] - x[..., :, :-1]).abs().mean())


def _objective(model: nn.Module, target: torch.Tensor, x1: torch.Tensor, x0: torch.Tensor,
               t: torch.Tensor, weights: torch.Tensor | None, tv: float) -> torch.Tensor:
    """1 - cos(gradient at (x1, x0, t), target) + tv * TV(x1), differentiable in the inputs."""
    grad = flow_matching_gradient(model, x1, x0, t, weights, create_graph=True)
    cosine = torch.dot(grad, target) / (grad.norm() * target.norm() + 1e-12)
    return 1 - cosine + tv * total_variation(x1)


def invert_gradient(model: nn.Module, target: torch.Tensor, shape: tuple[int, ...],
                    batch: int, generator: torch.Generator, x0: torch.Tensor | None = None,
                    t: torch.Tensor | None = None, weights: torch.Tensor | None = None,
                    steps: int = 500, lr: float = 0.1,
                    tv: float = 1e-2, restarts: int = 1, good: float = 0.05) -> Inversion:
    """Images [batch, *shape] whose gradient under ``model`` best matches ``target`` [P] in
    cosine (module docstring). ``x0`` [batch, *shape] and ``t`` [batch] given: the informed
    attacker; None: optimised too. ``weights`` [batch]: each example's weight in the
    gradient (default 1 / batch; a sum over clients weights client i's examples
    lambda_i / b_i). Up to ``restarts`` random starts from ``generator`` (the
    attacker's own), the lowest final objective kept, stopping at the first below ``good``
    (the objective is multimodal: a start that lands in a poor basin ends near 0.4, one that
    finds the image near 0.01); ``steps`` Adam steps each at ``lr``,
    decayed by cosine annealing; ``tv``: the weight of total variation."""
    for p in model.parameters():
        p.requires_grad_(True)
    target = target.detach().float().reshape(-1)
    informed = x0 is not None and t is not None
    best: Inversion | None = None
    for _ in range(restarts):
        x1 = (torch.rand((batch, *shape), generator=generator) * 2 - 1).requires_grad_(True)
        free = [x1]
        if not informed:
            noise = torch.randn((batch, *shape), generator=generator).requires_grad_(True)
            logit = torch.zeros(batch, requires_grad=True)
            free += [noise, logit]
        optimizer = torch.optim.Adam(free, lr=lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)

        def objective() -> torch.Tensor:
            source, times = (x0, t) if informed else (noise, torch.sigmoid(logit))  # noqa: B023
            return _objective(model, target, x1, source, times, weights, tv)  # noqa: B023

        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            objective().backward()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                x1.clamp_(-1, 1)
        loss = float(objective().detach())
        if best is None or loss < best.loss or math.isnan(best.loss):
            found_x0, found_t = ((x0, t) if informed else
                                 (noise.detach(), torch.sigmoid(logit).detach()))
            best = Inversion(x1.detach().clone(), found_x0, found_t, loss)
        if best.loss < good:
            break
    return best
