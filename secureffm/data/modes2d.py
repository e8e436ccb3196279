"""The 2D missing-mode example of DCFM Section 4: four Gaussian modes indexed by two binary
attributes, one combination held by nobody.

Attribute 0 is horizontal (0 = left, 1 = right), attribute 1 vertical (0 = top, 1 = bottom).
Mode (a, b) is N(((2a - 1) c, (1 - 2b) c), s^2 I) with c = ``CENTRE`` and s = ``STD``. The
combination ``MISSING`` = (1, 0), top-right (the paper's 1-based y = (2, 1)), is in no client's
data. Partitions over two clients (docs/dcfm.md):

- ``iid``: the three observed modes pooled and dealt at random, each client holds all three;
- ``disjoint`` (the paper's non-IID split, Fig. 2): client 1 holds the left column (top-left and
  half of bottom-left), client 2 the bottom row (the other half of bottom-left and bottom-right),
  so no client holds "right" and "top" together;
- ``dirichlet``: each observed mode spread over the clients with Dirichlet(alpha) shares.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError
from .partition import partition

__all__ = ["CARDINALITIES", "MISSING", "OBSERVED", "CENTRE", "STD", "mode_centres",
           "sample_modes", "modes2d_shards", "in_mode_fraction"]

CARDINALITIES = (2, 2)
MISSING = (1, 0)
OBSERVED = ((0, 0), (0, 1), (1, 1))
CENTRE = 2.0
STD = 0.3


def mode_centres(labels: torch.Tensor) -> torch.Tensor:
    """Centres of the modes of ``labels`` [N, 2] (values 0/1), shape [N, 2]."""
    signs = torch.stack([2 * labels[:, 0] - 1, 1 - 2 * labels[:, 1]], dim=1)
    return CENTRE * signs.float()


def sample_modes(labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One point of each row's mode, shape [N, 2]."""
    noise = torch.randn(labels.shape[0], 2, generator=generator, device=labels.device)
    return mode_centres(labels) + STD * noise


def modes2d_shards(per_mode: int, clients: int, scheme: str, seed: int, alpha: float = 0.5,
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``per_mode`` points of each observed mode, split over ``clients`` by ``scheme``.

    Returns one (x [n, 2] float, labels [n, 2] long) per client, on the CPU.
    """
    labels = torch.tensor(OBSERVED).repeat_interleave(per_mode, dim=0)
    generator = torch.Generator().manual_seed(seed)
    x = sample_modes(labels, generator)
    combo = np.repeat(np.arange(len(OBSERVED)), per_mode)
    rng = np.random.default_rng(seed)
    if scheme == "disjoint":
        if clients != 2:
            raise DataError(f"clients = {clients}: the paper's non-IID split of modes2d is for "
                            "two clients; use clients = 2, or partition = 'iid' or 'dirichlet'")
        shared = rng.permutation(np.flatnonzero(combo == 1))
        half = len(shared) // 2
        parts = [np.concatenate([np.flatnonzero(combo == 0), shared[:half]]),
                 np.concatenate([shared[half:], np.flatnonzero(combo == 2)])]
    else:
        parts = partition(combo, clients, scheme, rng, alpha=alpha)
    empty = [i + 1 for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise DataError(f"client {empty[0]} got no data under partition = {scheme!r}; use "
                        "fewer clients, a larger shard_size or a larger dirichlet_alpha")
    return [(x[np.sort(p)], labels[np.sort(p)]) for p in parts]


def in_mode_fraction(x: torch.Tensor, combination: tuple[int, int], radius: float = 3.0) -> float:
    """Fraction of points ``x`` [N, 2] within ``radius`` standard deviations of the centre of
    mode ``combination`` (a true sample lands there with probability 1 - exp(-radius^2 / 2),
    0.989 at radius 3)."""
    centre = mode_centres(torch.tensor([combination]))[0].to(x.device)
    return float(((x - centre).norm(dim=1) <= radius * STD).float().mean())
