import math

import numpy as np
import pytest
import torch

from secureffm.data import get_pair, make_shards, partition
from secureffm.errors import DataError


def test_disjoint_moons_upper_and_lower():
    shards = make_shards(get_pair("8gaussians-moons"), 2, 2000, "disjoint", seed=0)
    upper, lower = shards
    # Upper moon: (3 cos a - 1, 3 sin a - 1) lies mostly above the lower one's centre line.
    assert upper[:, 1].mean() > lower[:, 1].mean() + 2
    assert abs(len(upper) + len(lower) - 4000) == 0
    assert 0.4 < len(upper) / 4000 < 0.6


def test_disjoint_8gaussians_lower_left_vs_upper_right():
    shards = make_shards(get_pair("uniform-8gaussians"), 2, 4000, "disjoint", seed=0)
    angles = [torch.rad2deg(torch.atan2(s[:, 1], s[:, 0])) % 360 for s in shards]
    nearest = [torch.round(a / 45).long() % 8 for a in angles]
    # Noise (std 0.56 at radius 5) carries a few points past the 22.5 degree boundary.
    assert torch.isin(nearest[0], torch.tensor([3, 4, 5, 6])).float().mean() > 0.99
    assert torch.isin(nearest[1], torch.tensor([7, 0, 1, 2])).float().mean() > 0.99


def test_iid_and_dirichlet_cover_every_point_once():
    labels = np.random.default_rng(0).integers(0, 8, size=5000)
    for scheme in ("iid", "dirichlet"):
        parts = partition(labels, 5, scheme, np.random.default_rng(1), alpha=0.3)
        joined = np.sort(np.concatenate(parts))
        np.testing.assert_array_equal(joined, np.arange(5000))
    sizes = [len(p) for p in partition(labels, 5, "iid", np.random.default_rng(1))]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = np.random.default_rng(0).integers(0, 8, size=20000)

    def skew(alpha):
        parts = partition(labels, 10, "dirichlet", np.random.default_rng(2), alpha=alpha)
        shares = [np.bincount(labels[p], minlength=8) / max(len(p), 1) for p in parts if len(p)]
        return float(np.mean([s.max() for s in shares]))

    assert skew(0.05) > skew(100.0) + 0.3
    assert skew(100.0) < 0.2  # nearly uniform label mix at large alpha


def test_disjoint_with_too_many_clients_is_a_clear_error():
    with pytest.raises(DataError, match="label group"):
        make_shards(get_pair("8gaussians-moons"), 3, 100, "disjoint", seed=0)


def test_small_shards_under_dirichlet_are_rejected_with_advice():
    with pytest.raises(DataError, match="raise shard_size"):
        make_shards(get_pair("8gaussians-moons"), 6, 100, "dirichlet", seed=0, alpha=0.01,
                    min_size=64)


def test_eight_gaussian_std_is_torchcfm_convention():
    gen = torch.Generator().manual_seed(0)
    x, labels = get_pair("uniform-8gaussians").target.sample(40000, gen, torch.device("cpu"))
    angle = labels.float() * math.pi / 4
    centred = x - 5 * torch.stack([torch.cos(angle), torch.sin(angle)], 1)
    assert float(centred.std()) == pytest.approx(0.1**0.25, rel=0.02)


def test_dirichlet_gives_no_client_the_leftovers_of_every_label():
    # 200 labels of 3 points each over 10 clients: truncated cut points would hand the last
    # client the leftover point of most labels.
    labels = np.repeat(np.arange(200), 3)
    parts = partition(labels, 10, "dirichlet", np.random.default_rng(0), alpha=1.0)
    held = [len(np.unique(labels[p])) for p in parts]
    assert max(held) < 2 * np.median(held)
