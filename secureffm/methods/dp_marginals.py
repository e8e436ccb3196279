"""Independent DP marginals: the simple baseline a data owner might pick instead of a generator.

Each silo releases one noisy histogram per column of its own table (:func:`release`): a numeric
column over ``bins`` equal-width bins of its public [low, high], a binary or categorical column
over its public categories. The silos' releases are summed (:func:`pool`), and synthetic rows
draw every column independently from its pooled histogram (:func:`sample`), so the marginals can
be right while every dependence between columns is lost.

Privacy (add/remove one row of a silo): adding or removing a row moves exactly one count of each
of the d column histograms by 1, so the concatenated histograms have L1 sensitivity d. Laplace
noise of scale b = d / epsilon on every count (:func:`laplace_scale`) makes the release
epsilon-DP (pure, delta = 0) by the Laplace mechanism: the likelihood ratio of any output under
two neighbouring tables is at most exp(L1 distance / b) = exp(epsilon). The noise comes from OS
entropy. Pooling and sampling are post-processing.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import numpy as np

from ..data.schema import Column, Schema
from ..errors import ConfigError

__all__ = ["BINS", "bin_edges", "histograms", "laplace_scale", "release", "pool", "sample"]

BINS = 10  # equal-width bins of a numeric column's public range


def bin_edges(column: Column, bins: int = BINS) -> np.ndarray:
    """The ``bins + 1`` public edges of a numeric column over [low, high]."""
    return np.linspace(float(column.low), float(column.high), bins + 1)


def _categories(column: Column) -> tuple:
    return (0, 1) if column.type == "binary" else column.categories


def histograms(table: Mapping[str, np.ndarray], schema: Schema, bins: int = BINS
               ) -> dict[str, np.ndarray]:
    """Exact counts per column: ``bins`` counts of a numeric column (values outside the bounds
    land in the end bins), one count per category otherwise. float64."""
    counts = {}
    for column in schema.columns:
        values = np.asarray(table[column.name])
        if column.numeric:
            inner = bin_edges(column, bins)[1:-1]
            index = np.searchsorted(inner, values.astype(np.float64), side="right")
            counts[column.name] = np.bincount(index, minlength=bins).astype(np.float64)
        else:
            counts[column.name] = np.array([np.sum(values == c) for c in _categories(column)],
                                           dtype=np.float64)
    return counts


def laplace_scale(schema: Schema, epsilon: float) -> float:
    """Laplace scale b per count that makes all d column histograms together epsilon-DP under
    add/remove one row: b = d / epsilon (L1 sensitivity d)."""
    if not epsilon > 0:
        raise ConfigError(f"epsilon = {epsilon}: DP marginals need a positive epsilon")
    return len(schema.columns) / epsilon


def release(table: Mapping[str, np.ndarray], schema: Schema, epsilon: float, bins: int = BINS
            ) -> dict[str, np.ndarray]:
    """A silo's epsilon-DP release: :func:`histograms` plus Laplace(:func:`laplace_scale`)
    noise on every count, drawn from OS entropy."""
    scale = laplace_scale(schema, epsilon)
    rng = np.random.default_rng(secrets.randbits(128))
    return {name: counts + rng.laplace(0.0, scale, counts.shape)
            for name, counts in histograms(table, schema, bins).items()}


def pool(releases: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The silos' releases summed count by count."""
    return {name: np.sum([r[name] for r in releases], axis=0) for name in releases[0]}


def sample(counts: Mapping[str, np.ndarray], schema: Schema, n: int,
           rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` rows (a Table), each column drawn independently: a bin or category with
    probability proportional to its count clipped at 0 (uniform if none is positive), then a
    numeric value uniform within the bin (rounded for an integer column)."""
    rows = {}
    for column in schema.columns:
        weights = np.clip(counts[column.name], 0.0, None)
        p = weights / weights.sum() if weights.sum() > 0 else np.full(len(weights),
                                                                      1 / len(weights))
        drawn = rng.choice(len(p), size=n, p=p)
        if not column.numeric:
            rows[column.name] = np.array(_categories(column), dtype=object)[drawn]
            if column.type == "binary":
                rows[column.name] = rows[column.name].astype(np.int64)
            continue
        edges = bin_edges(column, len(p))
        values = rng.uniform(edges[drawn], edges[drawn + 1])
        rows[column.name] = (np.clip(np.round(values), column.low, column.high).astype(np.int64)
                             if column.type == "integer" else values)
    return rows
