"""Colored digits: scikit-learn's bundled 8x8 digits in 10 colors, and their federated split.

Two attributes (digit, color), 10 x 10 = 100 combinations. An image of digit d in color c is
``2 * intensity * rgb[c] - 1`` per channel: strokes in the color, background -1 (black), shape
[3, 8, 8] in [-1, 1]. The 1,797 images are split once, stratified by digit and independent of
the run seed, into training images (the clients' pool) and test images (the evaluation
reference).

Federated split (DCFM paper, Section 6.1): the held combinations are a band of the 10 x 10 grid
(cell (d, c) with (c - d) mod 10 in {0, ..., 4} for coverage 1/2) after a seeded permutation of
digits and of colors, so every digit and every color is held in equally many combinations and
the held combinations connect all digits and colors (the condition behind Eq. (2)). The other
combinations are novel: no client holds them. Each training image is colored in
``colors_per_image`` distinct held colors of its digit, and the pool is split over the clients
IID or per combination by Dirichlet(alpha) proportions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from ..errors import DataError
from .partition import partition

__all__ = ["COLORS", "CARDINALITIES", "ColoredDigits", "FederatedDigits", "colorize",
           "digit_images", "load_colored_digits", "held_combinations",
           "federated_colored_digits"]

COLORS: tuple[tuple[str, tuple[float, float, float]], ...] = (
    ("red", (1.0, 0.0, 0.0)),
    ("orange", (1.0, 0.5, 0.0)),
    ("yellow", (1.0, 1.0, 0.0)),
    ("green", (0.0, 1.0, 0.0)),
    ("cyan", (0.0, 1.0, 1.0)),
    ("blue", (0.1, 0.3, 1.0)),
    ("purple", (0.6, 0.2, 1.0)),
    ("magenta", (1.0, 0.0, 1.0)),
    ("pink", (1.0, 0.6, 0.7)),
    ("white", (1.0, 1.0, 1.0)),
)
"""Color names and RGB in [0, 1]; the color label is the index."""

CARDINALITIES: tuple[int, int] = (10, len(COLORS))
"""Cardinalities of the two attributes: digit, color."""

TEST_FRACTION = 0.25
_SPLIT_SEED = 0


@dataclass(frozen=True)
class ColoredDigits:
    """``x`` [N, 3, 8, 8] float32 in [-1, 1]; ``labels`` [N, 2] int64 (digit, color)."""

    x: torch.Tensor
    labels: torch.Tensor
    cardinalities: tuple[int, ...] = CARDINALITIES

    def __len__(self) -> int:
        return len(self.x)

    def select(self, digit: int, color: int) -> torch.Tensor:
        """Images [M, 3, 8, 8] of one combination."""
        keep = (self.labels[:, 0] == digit) & (self.labels[:, 1] == color)
        return self.x[keep]


@dataclass(frozen=True)
class FederatedDigits:
    """Clients' shards and the combinations they hold.

    ``held`` [H, 2] and ``novel`` [100 - H, 2] list (digit, color) pairs, sorted; every held pair
    is in some client's shard, no novel pair is in any.
    """

    clients: list[ColoredDigits]
    held: torch.Tensor
    novel: torch.Tensor
    cardinalities: tuple[int, ...] = CARDINALITIES


def colorize(intensity: torch.Tensor, colors: torch.Tensor) -> torch.Tensor:
    """Intensity [N, H, W] in [0, 1] and color labels [N] -> RGB images [N, 3, H, W] in [-1, 1]
    (8 x 8 for scikit-learn's digits, 28 x 28 for MNIST)."""
    rgb = torch.tensor([c for _, c in COLORS], dtype=torch.float32)[colors]
    return 2.0 * intensity[:, None] * rgb[:, :, None, None] - 1.0


def digit_images(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Gray images [N, 8, 8] in [0, 1] and digits [N] of ``split`` ("train", "test" or "all")."""
    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    if split == "all":
        return torch.from_numpy(images), torch.from_numpy(bunch.target).long()
    if split not in ("train", "test"):
        raise DataError(f"split = {split!r} is unknown; use 'train', 'test' or 'all'")
    train, test = train_test_split(np.arange(len(images)), test_size=TEST_FRACTION,
                                   stratify=bunch.target, random_state=_SPLIT_SEED)
    index = np.sort(train if split == "train" else test)
    return torch.from_numpy(images[index]), torch.from_numpy(bunch.target[index]).long()


def _color_choices(allowed: np.ndarray, digits: np.ndarray, per_image: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Give each image ``per_image`` distinct colors among its digit's allowed ones (``allowed``
    [10, 10] bool), balanced: a digit's images, in seeded random order, take its allowed colors
    (also in seeded random order) cyclically, so each allowed combination gets an equal share
    (+-1). Returns (image index, color), each of length N * per_image."""
    fewest = int(allowed.sum(1).min())
    if not 1 <= per_image <= fewest:
        raise DataError(f"colors_per_image = {per_image}: every digit has at least {fewest} "
                        f"allowed color(s); use a value from 1 to {fewest}")
    index, colors = [], []
    for digit in range(allowed.shape[0]):
        images = rng.permutation(np.flatnonzero(digits == digit))
        palette = rng.permutation(np.flatnonzero(allowed[digit]))
        slots = np.arange(len(images) * per_image)
        index.append(np.repeat(images, per_image))
        colors.append(palette[slots % len(palette)])
    return np.concatenate(index), np.concatenate(colors)


def _colored(intensity: torch.Tensor, digits: torch.Tensor, index: np.ndarray,
             colors: np.ndarray) -> ColoredDigits:
    index_t, colors_t = torch.as_tensor(index), torch.as_tensor(colors)
    return ColoredDigits(colorize(intensity[index_t], colors_t),
                         torch.stack([digits[index_t], colors_t], dim=1))


def load_colored_digits(split: str = "train", colors_per_image: int = len(COLORS),
                        seed: int = 0,
                        images: tuple[torch.Tensor, torch.Tensor] | None = None) -> ColoredDigits:
    """Every image of ``split`` in ``colors_per_image`` distinct colors, balanced over colors
    (seeded by ``seed``). With the default (all 10) the set is fully colored: each image appears
    once in every color. ``images``: gray images [N, H, W] in [0, 1] and digits [N] to color
    instead of scikit-learn's 8 x 8 digits (e.g. MNIST's, :func:`.images.mnist_intensity`)."""
    intensity, digits = digit_images(split) if images is None else images
    index, colors = _color_choices(np.ones(CARDINALITIES, dtype=bool), digits.numpy(),
                                   colors_per_image, np.random.default_rng(seed))
    return _colored(intensity, digits, index, colors)


def held_combinations(coverage: float, rng: np.random.Generator,
                      cardinalities: tuple[int, int] = CARDINALITIES) -> np.ndarray:
    """Bool mask [K1, K2] of the combinations the clients hold, a fraction ``coverage``.

    Cells are taken in the order (n mod K1, (n + n // lcm) mod K2), n = 0, 1, ...: the first
    lcm(K1, K2) cover every value of both attributes, and each later block shifts the second
    attribute by one. Rows and columns are then permuted by ``rng``. Raises DataError when the
    held combinations do not connect all attribute values (then no model can separate the
    attributes' effects; Eq. (2) of the DCFM paper asks for at least K1 + K2 - 1).
    """
    k1, k2 = cardinalities
    total = k1 * k2
    if not 0.0 < coverage <= 1.0:
        raise DataError(f"coverage = {coverage}: use a fraction in (0, 1]")
    count = round(coverage * total)
    if not math.isclose(count, coverage * total, abs_tol=1e-6):
        raise DataError(f"coverage = {coverage} is not a whole number of the {total} "
                        f"combinations; use a multiple of 1/{total}, e.g. {count / total}")
    lcm = math.lcm(k1, k2)
    n = np.arange(count)
    mask = np.zeros((k1, k2), dtype=bool)
    mask[n % k1, (n + n // lcm) % k2] = True
    rows, cols = np.nonzero(mask)
    graph = coo_matrix((np.ones(count), (rows, k1 + cols)), shape=(k1 + k2, k1 + k2))
    if connected_components(graph, directed=False)[0] > 1:
        raise DataError(f"coverage = {coverage} ({count} of {total} combinations) cannot hold "
                        "every attribute value in combinations that connect them all; raise "
                        f"coverage to at least {(k1 + k2 - 1) / total:.2f}")
    return mask[rng.permutation(k1)][:, rng.permutation(k2)]


def federated_colored_digits(
    clients: int = 10,
    coverage: float = 0.5,
    scheme: str = "iid",
    alpha: float = 0.1,
    seed: int = 0,
    colors_per_image: int = 1,
    min_size: int = 1,
    images: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FederatedDigits:
    """The training images split over ``clients`` with total coverage ``coverage``.

    ``scheme`` "iid": the pool is shuffled and cut into equal parts. "dirichlet": for each held
    combination, client shares ~ Dirichlet(alpha); redrawn (up to 100 times) until every client
    holds at least ``min_size`` images. Deterministic given the arguments. ``images``: gray
    training images [N, H, W] in [0, 1] and digits [N] instead of scikit-learn's 8 x 8 digits
    (Colored MNIST: ``images=mnist_intensity(data_dir)`` from :mod:`.images`).
    """
    if clients < 1:
        raise DataError(f"clients = {clients}: need at least one client")
    if scheme not in ("iid", "dirichlet"):
        raise DataError(f"partition = {scheme!r} is unknown; use 'iid' or 'dirichlet'")
    rng = np.random.default_rng(seed)
    mask = held_combinations(coverage, rng)
    intensity, digits = digit_images("train") if images is None else images
    index, colors = _color_choices(mask, digits.numpy(), colors_per_image, rng)
    if len(index) < clients * min_size:
        raise DataError(f"{len(index)} training images cannot give {clients} clients at least "
                        f"{min_size} each; use fewer clients, a smaller min_size or more "
                        "colors_per_image")
    pool = _colored(intensity, digits, index, colors)
    combination = (pool.labels[:, 0] * CARDINALITIES[1] + pool.labels[:, 1]).numpy()
    for _ in range(100):
        parts = partition(combination, clients, scheme, rng, alpha=alpha)
        if min(len(p) for p in parts) >= min_size:
            break
    else:
        raise DataError(f"Dirichlet(alpha = {alpha}) left some client with fewer than "
                        f"{min_size} images in 100 draws; raise alpha or lower clients or "
                        "min_size")
    shards = [ColoredDigits(pool.x[torch.as_tensor(p)], pool.labels[torch.as_tensor(p)])
              for p in parts]
    held = torch.as_tensor(np.argwhere(mask)).long()
    novel = torch.as_tensor(np.argwhere(~mask)).long()
    return FederatedDigits(shards, held, novel)
