"""Source/target pairs and the clients' shards (secureffm/data/pairs.py).

Truths used: the pool is the target's own sample at the seed (drawn again here), and a
partition hands every pool point to exactly one client.
"""

from __future__ import annotations

import math

import pytest
import torch

from secureffm.data.pairs import PAIRS, get_pair, make_shards
from secureffm.data.toy2d import DISTRIBUTIONS
from secureffm.errors import DataError


@pytest.mark.parametrize("name", PAIRS)
def test_a_pair_is_its_source_and_target_by_name(name):
    source, target = name.split("-", 1)
    pair = get_pair(name)
    assert pair.source is DISTRIBUTIONS[source] and pair.target is DISTRIBUTIONS[target]
    assert pair.dim == 2


def test_an_unknown_pair_is_refused_listing_the_known_ones():
    with pytest.raises(DataError, match="data = 'moons-8gaussians' is unknown; choose one of "
                                        "8gaussians-moons, uniform-8gaussians"):
        get_pair("moons-8gaussians")


def _rows(tensor: torch.Tensor) -> list[tuple[float, ...]]:
    return sorted(map(tuple, tensor.tolist()))


@pytest.mark.parametrize("scheme", ["iid", "disjoint", "dirichlet"])
def test_shards_split_the_seeded_pool_of_target_points_exactly(scheme):
    """Every point of the pool (clients x shard_size target points from the seed) is held by
    exactly one client; the same seed gives the same shards."""
    pair = get_pair("gaussian-8gaussians")
    shards = make_shards(pair, 4, 250, scheme, seed=11)
    pool, _ = pair.target.sample(1000, torch.Generator().manual_seed(11))
    assert len(shards) == 4 and all(s.dtype == torch.float32 and s.shape[1] == 2
                                    for s in shards)
    assert _rows(torch.cat(shards)) == _rows(pool)
    again = make_shards(pair, 4, 250, scheme, seed=11)
    assert all(torch.equal(a, b) for a, b in zip(shards, again, strict=True))
    if scheme == "iid":
        assert [len(s) for s in shards] == [250] * 4


def test_disjoint_shards_hold_contiguous_runs_of_the_8gaussians_circle():
    """Client 1 holds the lower-left modes (angles 135..270 degrees), client 2 the rest, as
    the disjoint_order documents: each point's nearest centre says which mode it came from."""
    shards = make_shards(get_pair("gaussian-8gaussians"), 2, 400, "disjoint", seed=0)
    angles = torch.arange(8) * math.pi / 4
    centres = 5 * torch.stack([torch.cos(angles), torch.sin(angles)], 1)
    modes = [set(torch.cdist(s, centres).argmin(1).tolist()) for s in shards]
    assert modes == [{3, 4, 5, 6}, {7, 0, 1, 2}]


def test_a_shard_smaller_than_the_batch_is_refused_naming_the_client():
    with pytest.raises(DataError, match="client-1 holds 20 points under partition 'iid', "
                                        "fewer than the batch size 32"):
        make_shards(get_pair("gaussian-moons"), 2, 20, "iid", seed=0, min_size=32)
