"""Couplings of source and target mini-batches: one method, ``couple(x0, x1, generator)``.

FFM-vanilla/I-CFM use the independent coupling, FFM-LOT/OT-CFM the exact mini-batch OT plan,
FFM-GOT the semi-dual resampling of Algorithm 5 through the global potential f_phi.
Cost convention: c(x, y) = |x - y|^2 / 2.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ot import emd_plan, half_squared_cost, semidual_assignment, squared_distances

__all__ = ["IndependentCoupling", "ExactOTCoupling", "SemiDualCoupling", "sample_from_plan"]


class IndependentCoupling:
    """(x0, x1) ~ q0 x q1: the pairs as drawn."""

    def couple(self, x0, x1, generator):
        return x0, x1


def sample_from_plan(plan: torch.Tensor, size: int, generator: torch.Generator):
    """Draw ``size`` index pairs (i, j) with probability plan[i, j] (plan: [N, M], sums to 1)."""
    flat = torch.multinomial(plan.flatten(), size, replacement=True, generator=generator)
    return flat // plan.shape[1], flat % plan.shape[1]


class ExactOTCoupling:
    """Pairs sampled from the exact OT plan of the mini-batch (POT ``ot.emd``)."""

    def couple(self, x0, x1, generator):
        cost = squared_distances(x0.flatten(1), x1.flatten(1)) / 2
        plan = torch.as_tensor(emd_plan(cost), dtype=torch.float32, device=x0.device)
        i, j = sample_from_plan(plan, x0.shape[0], generator)
        return x0[i], x1[j]


class SemiDualCoupling:
    """Algorithm 5: each target takes the candidate source point minimising c - f_phi.

    ``x0`` holds the K candidates, ``x1`` the B targets; returns B pairs. The candidates are
    data-independent draws from q0, so each pair depends on one target example only.
    """

    def __init__(self, potential: nn.Module):
        self.potential = potential

    @torch.no_grad()
    def couple(self, x0, x1, generator):
        k = semidual_assignment(half_squared_cost(x0, x1), self.potential(x0))
        return x0[k], x1
