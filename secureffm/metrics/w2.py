"""The 2-Wasserstein distance between empirical measures, exactly, with POT."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import scipy.linalg
import torch

from ..ot import emd_cost, squared_distances

__all__ = ["w2", "w2_many", "gaussian_w2"]


def w2(x, y) -> float:
    """W2 between uniform empirical measures on x [N, d] and y [M, d] (exact network simplex)."""
    return math.sqrt(max(emd_cost(squared_distances(x, y)), 0.0))


def w2_many(pairs: list[tuple], workers: int = 2) -> list[float]:
    """W2 of several (x, y) pairs; POT's solver releases the GIL, so threads run in parallel."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: w2(*p), pairs))


def gaussian_w2(m1: torch.Tensor, c1: torch.Tensor, m2: torch.Tensor, c2: torch.Tensor) -> float:
    """Closed form W2 between N(m1, c1) and N(m2, c2) (Bures metric on the covariances)."""
    c1n, c2n = c1.double().numpy(), c2.double().numpy()
    root = scipy.linalg.sqrtm(c1n)
    cross = scipy.linalg.sqrtm(root @ c2n @ root).real
    bures = float(c1n.trace() + c2n.trace() - 2 * cross.trace())
    return math.sqrt(max(float((m1 - m2).double().pow(2).sum()) + bures, 0.0))
