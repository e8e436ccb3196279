import math

import pytest
import torch

from secureffm.data.modes2d import (
    MISSING,
    OBSERVED,
    in_mode_fraction,
    mode_centres,
    modes2d_shards,
    sample_modes,
)
from secureffm.errors import DataError


def _held(labels):
    return {tuple(row) for row in labels.tolist()}


@pytest.mark.parametrize("scheme", ["iid", "disjoint", "dirichlet"])
def test_no_client_holds_the_missing_combination(scheme):
    shards = modes2d_shards(200, 2, scheme, seed=1, alpha=0.5)
    assert sum(len(x) for x, _ in shards) == 3 * 200
    for x, labels in shards:
        assert MISSING not in _held(labels)
        assert x.shape == (len(labels), 2)
        # every point lies near its own mode's centre
        assert ((x - mode_centres(labels)).norm(dim=1) < 2.0).all()


def test_iid_clients_hold_all_three_observed_modes():
    for _, labels in modes2d_shards(200, 2, "iid", seed=0):
        assert _held(labels) == set(OBSERVED)


def test_non_iid_split_is_the_papers_figure_2():
    (_, first), (_, second) = modes2d_shards(200, 2, "disjoint", seed=0)
    assert _held(first) == {(0, 0), (0, 1)}  # left column: only "left"
    assert _held(second) == {(0, 1), (1, 1)}  # bottom row: only "bottom"
    assert len(first) == len(second) == 300


def test_non_iid_split_needs_two_clients():
    with pytest.raises(DataError, match="two clients"):
        modes2d_shards(10, 3, "disjoint", seed=0)


def test_in_mode_fraction_of_true_samples_matches_the_gaussian_radius_law():
    n = 20_000
    labels = torch.tensor([MISSING]).expand(n, 2)
    x = sample_modes(labels, torch.Generator().manual_seed(0))
    expected = 1 - math.exp(-9 / 2)  # P(|z| <= 3) for a standard 2D Gaussian
    assert abs(in_mode_fraction(x, MISSING) - expected) < 5 * math.sqrt(expected / n)
    assert in_mode_fraction(x, (0, 1)) == 0.0  # the opposite corner is far away
