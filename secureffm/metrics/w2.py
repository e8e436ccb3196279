"""The 2-Wasserstein distance between empirical measures, exactly, with POT.

:func:`w2` runs POT's exact network simplex with the costs computed on the fly
(:func:`~secureffm.ot.sqeuclidean_emd_cost`): memory O(N + M) instead of the dense cost matrix
and POT's arrays of its size (3.9 GB at N = M = 10^4), at 1.5-2x the dense solver's time
(docs/benchmarks.md, "The README's main job").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

import scipy.linalg
import torch

from ..ot import sqeuclidean_emd_cost

__all__ = ["w2", "w2_many", "gaussian_w2"]


def w2(x, y) -> float:
    """W2 between uniform empirical measures on x [N, d] and y [M, d] (exact network simplex)."""
    return math.sqrt(max(sqeuclidean_emd_cost(x, y), 0.0))


def w2_many(pairs: list[tuple], workers: int = 2,
            done: Callable[[int], None] | None = None) -> list[float]:
    """W2 of several (x, y) pairs, in order; POT's solver releases the GIL, so ``workers``
    threads solve in parallel. ``done(index)`` is called as each pair's solve finishes (for a
    progress display)."""
    distances: list[float] = [math.nan] * len(pairs)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(w2, *pair): index for index, pair in enumerate(pairs)}
        for future in as_completed(futures):
            distances[futures[future]] = future.result()
            if done is not None:
                done(futures[future])
    return distances


def gaussian_w2(m1: torch.Tensor, c1: torch.Tensor, m2: torch.Tensor, c2: torch.Tensor) -> float:
    """Closed form W2 between N(m1, c1) and N(m2, c2) (Bures metric on the covariances)."""
    c1n, c2n = c1.double().numpy(), c2.double().numpy()
    root = scipy.linalg.sqrtm(c1n)
    cross = scipy.linalg.sqrtm(root @ c2n @ root).real
    bures = float(c1n.trace() + c2n.trace() - 2 * cross.trace())
    return math.sqrt(max(float((m1 - m2).double().pow(2).sum()) + bures, 0.0))
