import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from secureffm.data.colored_digits import (
    COLORS,
    digit_images,
    federated_colored_digits,
    held_combinations,
    load_colored_digits,
)
from secureffm.errors import DataError


def combos(labels: torch.Tensor) -> set[tuple[int, int]]:
    return {tuple(pair) for pair in labels.tolist()}


def test_fully_colored_set_shapes_range_and_every_color_per_image():
    data = load_colored_digits("test")
    gray, digits = digit_images("test")
    assert data.x.shape == (10 * len(gray), 3, 8, 8) and data.labels.shape == (len(data.x), 2)
    assert data.x.dtype == torch.float32 and data.labels.dtype == torch.int64
    assert data.x.min() >= -1 and data.x.max() <= 1
    assert torch.equal(torch.bincount(data.labels[:, 1]), torch.full((10,), len(gray)))
    assert torch.equal(torch.bincount(data.labels[:, 0]), 10 * torch.bincount(digits))


def test_color_is_the_stroke_color_and_the_digit_is_sklearns_image():
    data = load_colored_digits("all")
    bunch = load_digits()
    image = torch.from_numpy(bunch.images[0]).float() / 16
    for color, (_, rgb) in enumerate(COLORS):
        rows = (data.labels[:, 0] == int(bunch.target[0])) & (data.labels[:, 1] == color)
        expected = 2 * image[None] * torch.tensor(rgb)[:, None, None] - 1
        # The first image of sklearn's set in this color is among this combination's images.
        assert (data.x[rows] - expected).abs().flatten(1).max(1).values.min() < 1e-6


def test_train_and_test_images_are_disjoint_and_cover_the_data():
    train, _ = digit_images("train")
    test, _ = digit_images("test")
    assert len(train) + len(test) == 1797
    flat_train = {tuple(row) for row in train.flatten(1).tolist()}
    flat_test = {tuple(row) for row in test.flatten(1).tolist()}
    # sklearn's digits contain a few duplicate images; nearly all test images are unseen.
    assert len(flat_test - flat_train) > 0.98 * len(flat_test)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_coverage_is_half_and_novel_combinations_are_held_by_nobody(scheme):
    fed = federated_colored_digits(clients=10, coverage=0.5, scheme=scheme, seed=3)
    held, novel = combos(fed.held), combos(fed.novel)
    assert len(held) == 50 and len(novel) == 50 and not held & novel
    assert held | novel == {(d, c) for d in range(10) for c in range(10)}
    observed = set().union(*(combos(client.labels) for client in fed.clients))
    assert observed == held
    # Full marginal coverage: every digit and every color is held in 5 combinations.
    assert np.bincount(fed.held[:, 0].numpy(), minlength=10).tolist() == [5] * 10
    assert np.bincount(fed.held[:, 1].numpy(), minlength=10).tolist() == [5] * 10
    assert sum(len(c) for c in fed.clients) == len(digit_images("train")[1])
    for client in fed.clients:
        assert client.x.shape[1:] == (3, 8, 8) and client.x.min() >= -1 and client.x.max() <= 1


def test_dirichlet_split_is_skewed_and_iid_is_not():
    def spread(scheme: str) -> float:
        """Mean over clients of the share of its images in its most common combination."""
        fed = federated_colored_digits(scheme=scheme, alpha=0.1, seed=0)
        shares = []
        for client in fed.clients:
            counts = torch.bincount(client.labels[:, 0] * 10 + client.labels[:, 1], minlength=100)
            shares.append(float(counts.max()) / len(client))
        return float(np.mean(shares))

    assert spread("iid") < 0.1  # about 1/50 plus noise
    assert spread("dirichlet") > 2 * spread("iid")
    dirichlet = federated_colored_digits(scheme="dirichlet", alpha=0.1, seed=0)
    iid = federated_colored_digits(scheme="iid", seed=0)
    held_per_client = {name: np.median([len(combos(c.labels)) for c in fed.clients])
                       for name, fed in (("dirichlet", dirichlet), ("iid", iid))}
    assert held_per_client["dirichlet"] < held_per_client["iid"] / 2


def test_split_is_deterministic_and_seed_dependent():
    a = federated_colored_digits(scheme="dirichlet", seed=5)
    b = federated_colored_digits(scheme="dirichlet", seed=5)
    c = federated_colored_digits(scheme="dirichlet", seed=6)
    assert torch.equal(a.held, b.held)
    for x, y in zip(a.clients, b.clients, strict=True):
        assert torch.equal(x.x, y.x) and torch.equal(x.labels, y.labels)
    assert not torch.equal(a.held, c.held)


def test_held_mask_stays_connected_down_to_the_minimum_coverage():
    rng = np.random.default_rng(0)
    assert held_combinations(0.19, rng).sum() == 19  # K1 + K2 - 1, Eq. (2)
    assert held_combinations(1.0, rng).all()
    with pytest.raises(DataError, match="at least 0.19"):
        held_combinations(0.18, rng)


@pytest.mark.parametrize("coverage", [0.0, -0.5, 1.5])
def test_coverage_outside_unit_interval_is_rejected(coverage):
    with pytest.raises(DataError, match=r"fraction in \(0, 1\]"):
        federated_colored_digits(coverage=coverage)


def test_impossible_requests_are_clear_errors():
    with pytest.raises(DataError, match="multiple of 1/100"):
        federated_colored_digits(coverage=0.505)
    with pytest.raises(DataError, match="fewer clients"):
        federated_colored_digits(clients=5000)
    with pytest.raises(DataError, match="from 1 to 5"):
        federated_colored_digits(colors_per_image=6)
    with pytest.raises(DataError, match="'iid' or 'dirichlet'"):
        federated_colored_digits(scheme="disjoint")
    with pytest.raises(DataError, match="raise alpha"):
        federated_colored_digits(scheme="dirichlet", alpha=0.01, min_size=130)
