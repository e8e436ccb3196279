"""Optimal transport helpers that methods and metrics share: exact OT through POT (with
non-convergence treated as an error), the cost c(x, y) = |x - y|^2 / 2, and the semi-dual
objective of FFM-GOT (Eq. 7-8) with its c-transform.

POT's ``ot.emd`` stops at ``numItermax`` with only a warning (at N = 5000 the default limit
returns a cost 0.3-1.8% off); here the limit is raised and a warning raises `SolverError`.
Inputs are torch tensors or numpy arrays; POT is called on float64 numpy (the boundary), and
loaded on first use (:func:`pot`).
:func:`emd_cost` takes a dense cost matrix, and POT's solver keeps arrays of that size of its own
(the process's peak resident memory grew by 3.9 GB at N = M = 10^4, about 39 N M bytes);
:func:`sqeuclidean_emd_cost` runs the same exact network simplex with each squared distance
computed from the points when needed (``ot.lp.emd2_lazy``), in O(N + M) memory.

Semi-dual conventions: f lives on the source; f^c(x1) = min_{x0} c(x0, x1) - f(x0), approximated
by the minimum over K data-independent candidates from q0, optionally refined by gradient
descent on x0. The dual value f(x0) + f^c(x1) is *maximised*: Algorithm 4 as printed descends
it, which collapses the coupling (see docs/results.md).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import nn

from .errors import SolverError

__all__ = ["pot", "squared_distances", "emd_plan", "emd_cost", "sqeuclidean_emd_cost", "MAX_ITER",
           "half_squared_cost", "semidual_assignment", "c_transform", "semidual_value"]

MAX_ITER = 100_000_000


def pot() -> ModuleType:
    """POT (``import ot``), loaded when a function first needs it: its package imports
    scikit-learn and ``scipy.stats``, 1.6 s of start-up here that ``secureffm --help``,
    ``secureffm audit`` and the secure-aggregation benchmarks need not pay."""
    import ot

    return ot


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def squared_distances(x, y) -> np.ndarray:
    """|x_i - y_j|^2, shape [N, M] (note: without the 1/2 of the cost c)."""
    return pot().dist(_numpy(x), _numpy(y), metric="sqeuclidean")


def _check(log: dict, n: int, m: int) -> None:
    if log.get("warning"):
        raise SolverError(f"exact OT on {n} x {m} points did not converge: {log['warning']}")


def emd_plan(cost: np.ndarray, a: np.ndarray | None = None, b: np.ndarray | None = None):
    """Optimal plan for ``cost`` [N, M] between weights a [N] and b [M] (uniform if None)."""
    n, m = cost.shape
    a = np.full(n, 1.0 / n) if a is None else a
    b = np.full(m, 1.0 / m) if b is None else b
    plan, log = pot().emd(a, b, cost, numItermax=MAX_ITER, log=True)
    _check(log, n, m)
    return plan


def emd_cost(cost: np.ndarray, a: np.ndarray | None = None, b: np.ndarray | None = None) -> float:
    """Optimal transport cost sum_ij P_ij cost_ij (uniform weights if None)."""
    n, m = cost.shape
    a = np.full(n, 1.0 / n) if a is None else a
    b = np.full(m, 1.0 / m) if b is None else b
    value, log = pot().emd2(a, b, cost, numItermax=MAX_ITER, log=True)
    _check(log, n, m)
    return float(value)


def sqeuclidean_emd_cost(x, y) -> float:
    """Optimal transport cost between uniform empirical measures on x [N, d] and y [M, d] for
    the cost |x_i - y_j|^2: :func:`emd_cost` of :func:`squared_distances` (the same exact
    solver), with each cost computed when the simplex needs it instead of stored."""
    x, y = _numpy(x), _numpy(y)
    value, log = pot().lp.emd2_lazy(x, y, metric="sqeuclidean", numItermax=MAX_ITER, log=True,
                                 return_matrix=False)
    _check(log, len(x), len(y))
    return float(value)


def half_squared_cost(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """c(x0_k, x1_j) = |x0_k - x1_j|^2 / 2 as a [K, B] matrix."""
    return 0.5 * torch.cdist(x0.flatten(1), x1.flatten(1)).pow(2)


def semidual_assignment(cost: torch.Tensor, potential_values: torch.Tensor) -> torch.Tensor:
    """Algorithm 5: for each target j, k*(j) = argmin_k cost[k, j] - f(x0_k).

    ``cost``: [K, B]; ``potential_values``: f(x0_k), shape [K]. Returns indices [B].
    """
    return torch.argmin(cost - potential_values[:, None], dim=0)


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
