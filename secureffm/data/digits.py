"""scikit-learn's bundled digits (8x8 images, 10 classes) split over clients by class pairs.

The split follows FedWAD's Appendix D.5: every client holds two classes. With ``structure =
"clusters"`` each client draws its pair from five fixed pairs (0,1), (2,3), (4,5), (6,7), (8,9)
(at least two clients per pair, the rest at random), so the clients form five planted clusters;
with ``structure = "random"`` each client draws any two distinct classes, so there is no planted
structure. A class's examples are dealt evenly over the clients that hold it, separately for the
train and test parts, so each client's test set has its own train set's classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DataError

__all__ = ["LabelledShard", "load_digit_arrays", "class_pair_split", "CLUSTER_PAIRS",
           "STRUCTURES"]

CLUSTER_PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
STRUCTURES = ("clusters", "random")
CLASSES = 10


@dataclass(frozen=True)
class LabelledShard:
    """One client's digits: features [N, 64] float32 in [0, 1], labels [N] int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[int, ...]


def load_digit_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits: pixels scaled from 0..16 to [0, 1], shape [1797, 64]; labels [1797]."""
    from sklearn.datasets import load_digits  # first use: secureffm.ot.pot says why

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def _pairs(structure: str, clients: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    if structure == "clusters":
        groups = len(CLUSTER_PAIRS)
        if clients < 2 * groups:
            raise DataError(f"clients = {clients}: the 'clusters' split puts at least two "
                            f"clients on each of its {groups} class pairs; use clients >= "
                            f"{2 * groups} or structure = 'random'")
        extra = rng.integers(0, groups, size=clients - 2 * groups)
        group = rng.permutation(np.concatenate([np.repeat(np.arange(groups), 2), extra]))
        return [CLUSTER_PAIRS[g] for g in group]
    if structure == "random":
        return [tuple(sorted(int(c) for c in rng.choice(CLASSES, 2, replace=False)))
                for _ in range(clients)]
    raise DataError(f"structure = {structure!r} is unknown; use one of {', '.join(STRUCTURES)}")


def _deal(y: np.ndarray, pairs: list[tuple[int, int]], rng: np.random.Generator,
          minimum: int, part: str) -> list[np.ndarray]:
    """Indices of ``y`` per client: each class's examples split evenly over its holders."""
    held: list[list[np.ndarray]] = [[] for _ in pairs]
    for label in range(CLASSES):
        holders = [i for i, pair in enumerate(pairs) if label in pair]
        if not holders:
            continue
        pieces = np.array_split(rng.permutation(np.flatnonzero(y == label)), len(holders))
        for client, piece in zip(holders, pieces, strict=True):
            if len(piece) < minimum:
                raise DataError(f"class {label} is held by {len(holders)} clients, leaving "
                                f"{len(piece)} {part} example(s) each (need {minimum}); use "
                                "fewer clients or a larger test_fraction")
            held[client].append(piece)
    return [np.sort(np.concatenate(parts)) for parts in held]


def class_pair_split(structure: str, clients: int = 20, seed: int = 0,
                     test_fraction: float = 0.25) -> list[LabelledShard]:
    """Split the digits over ``clients`` clients holding two classes each (module docstring).

    The train/test cut is stratified and seeded, the pair draws and the dealing too.
    """
    from sklearn.model_selection import train_test_split  # first use: secureffm.ot.pot says why

    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction = {test_fraction}: must lie strictly between 0 and 1")
    if clients < 1:
        raise DataError(f"clients = {clients}: need at least one client")
    x, y = load_digit_arrays()
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, stratify=y, random_state=seed)
    rng = np.random.default_rng(seed)
    pairs = _pairs(structure, clients, rng)
    train = _deal(y_train, pairs, rng, 2, "train")
    test = _deal(y_test, pairs, rng, 1, "test")
    return [LabelledShard(x_train[tr], y_train[tr], x_test[te], y_test[te], pair)
            for tr, te, pair in zip(train, test, pairs, strict=True)]
