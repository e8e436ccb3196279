"""Source/target pairs by name, and the clients' finite shards."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DataError
from ..names import PAIRS
from .partition import partition
from .toy2d import DISTRIBUTIONS, Distribution

__all__ = ["DataPair", "get_pair", "make_shards", "PAIRS"]



@dataclass(frozen=True)
class DataPair:
    """Source q0 (public noise every party can sample) and target q1 (the clients' data)."""

    source: Distribution
    target: Distribution

    @property
    def dim(self) -> int:
        return self.target.dim


def get_pair(name: str) -> DataPair:
    """``SOURCE-TARGET``, one of :data:`PAIRS`."""
    if name not in PAIRS:
        raise DataError(f"data = {name!r} is unknown; choose one of {', '.join(PAIRS)}")
    source, target = name.split("-", 1)
    return DataPair(DISTRIBUTIONS[source], DISTRIBUTIONS[target])


def make_shards(
    pair: DataPair,
    clients: int,
    shard_size: int,
    scheme: str,
    seed: int,
    *,
    alpha: float = 0.5,
    min_size: int = 1,
) -> list[torch.Tensor]:
    """Draw a pool of ``clients * shard_size`` target points once and split it.

    Returns one CPU tensor [N_i, d] per client. Each shard is a fixed finite data set.
    """
    generator = torch.Generator().manual_seed(seed)
    points, labels = pair.target.sample(clients * shard_size, generator, torch.device("cpu"))
    rng = np.random.default_rng(seed)
    index = partition(labels.numpy(), clients, scheme, rng,
                      disjoint_order=pair.target.disjoint_order, alpha=alpha)
    shards = [points[torch.as_tensor(i, dtype=torch.long)] for i in index]
    for client, shard in enumerate(shards, start=1):
        if len(shard) < min_size:
            raise DataError(
                f"client-{client} holds {len(shard)} points under partition {scheme!r}, fewer "
                f"than the batch size {min_size}; raise shard_size or dirichlet_alpha, or "
                "lower clients or batch_size"
            )
    return shards
