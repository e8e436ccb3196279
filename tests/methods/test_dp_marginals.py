"""Independent DP marginals (secureffm/methods/dp_marginals.py).

Truths used: the Laplace mechanism with scale b on a query of L1 sensitivity s bounds the log
likelihood ratio of every output of two neighbouring inputs by s / b; adding one row moves each
column's histogram by exactly one count; the mean absolute value of Laplace(0, b) noise is b.
"""

from __future__ import annotations

import numpy as np

from secureffm.data.schema import Schema
from secureffm.methods.dp_marginals import histograms, pool, release, sample

SCHEMA = Schema.from_dict({"columns": [
    {"name": "age", "type": "integer", "low": 18, "high": 90},
    {"name": "dose", "type": "continuous", "low": 0.0, "high": 10.0},
    {"name": "smoker", "type": "binary"},
    {"name": "ward", "type": "categorical", "categories": ["icu", "surgery", "general"]},
]})


def _table(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"age": rng.integers(18, 91, rows), "dose": rng.uniform(0, 10, rows),
            "smoker": rng.integers(0, 2, rows),
            "ward": rng.choice(np.array(["icu", "surgery", "general"], dtype=object), rows)}


def _flat(counts: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([counts[n] for n in SCHEMA.names])


def test_release_is_epsilon_dp_against_membership():
    """Adversary: knows every row of a silo but one and sees the silo's release; it decides
    whether that row is in by the likelihood ratio of the release under the two tables (the
    optimal test). Its log ratio over any output is at most (L1 distance of the two tables'
    histograms) / (the noise's scale); with the scale the release actually draws (estimated
    from its noise), that bound must not exceed the stated epsilon."""
    epsilon = 2.0
    table = _table(200, 0)
    exact = _flat(histograms(table, SCHEMA))
    noise = np.concatenate([_flat(release(table, SCHEMA, epsilon)) - exact for _ in range(400)])
    scale = np.mean(np.abs(noise))  # E|Laplace(0, b)| = b; 400 x 17 draws: within ~1%
    worst = 0.0
    for seed in range(20):  # the added row: each neighbour moves one count per column
        row = {name: values[:1] for name, values in _table(1, 100 + seed).items()}
        neighbour = {n: np.concatenate([table[n], row[n]]) for n in SCHEMA.names}
        distance = np.abs(_flat(histograms(neighbour, SCHEMA)) - exact).sum()
        assert distance == len(SCHEMA.columns)
        worst = max(worst, distance / scale)
    assert worst <= epsilon * 1.05
    assert worst >= epsilon * 0.95  # and the noise is no larger than the claim needs


def test_sample_follows_the_pooled_marginals_within_public_bounds():
    """Two silos' exact histograms pooled by sum, sampled: each column's frequencies follow the
    pooled counts, numeric values stay in their public bounds, integers stay integers."""
    a, b = _table(300, 1), _table(500, 2)
    pooled = pool([histograms(a, SCHEMA), histograms(b, SCHEMA)])
    assert np.allclose(_flat(pooled), _flat(histograms(a, SCHEMA)) + _flat(histograms(b, SCHEMA)))
    rows = sample(pooled, SCHEMA, 20_000, np.random.default_rng(0))
    drawn = histograms(rows, SCHEMA)
    for name in SCHEMA.names:
        p, q = pooled[name] / pooled[name].sum(), drawn[name] / drawn[name].sum()
        assert 0.5 * np.abs(p - q).sum() < 0.03, name
    assert rows["age"].dtype == np.int64 and rows["age"].min() >= 18 and rows["age"].max() <= 90
    assert 0.0 <= rows["dose"].min() and rows["dose"].max() <= 10.0
    assert set(rows["smoker"].tolist()) <= {0, 1}
    assert set(rows["ward"].tolist()) <= {"icu", "surgery", "general"}
