"""A client's evaluation on its own held-out rows (secureffm/metrics/tabular.py).

Truths used, none from the code under test: the Kolmogorov-Smirnov statistic as the largest gap
between two empirical CDFs evaluated at every sample point by hand; total variation from
collections.Counter; Pearson correlations from Python's statistics.correlation; W2 against a
point mass (the root mean squared distance to it) and zero between identical point masses; a
perfect, an inverted and a constant classifier's accuracy and AUC (1, 0, the class share and
0.5); R^2 of an exact linear relation (1) and of an unrelated target (about 0 or below).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

import numpy as np
import pytest

from secureffm.data.encoding import encode
from secureffm.data.schema import Column, Schema
from secureffm.errors import DataError, SchemaError
from secureffm.metrics.tabular import (
    correlation_difference,
    evaluate_table,
    ks_statistic,
    ml_efficacy,
    total_variation,
)


def _objects(values):
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


# -- the marginal and correlation distances -----------------------------------------------------

def _ks_by_hand(a, b):
    points = sorted(set(a) | set(b))
    return max(abs(sum(x <= v for x in a) / len(a) - sum(y <= v for y in b) / len(b))
               for v in points)


def test_ks_statistic_is_the_largest_gap_between_empirical_cdfs():
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.integers(0, 6, size=rng.integers(3, 30)).tolist()
        b = (rng.integers(0, 8, size=rng.integers(3, 30)) - 1).tolist()
        assert ks_statistic(np.array(a), np.array(b)) == pytest.approx(_ks_by_hand(a, b))


def test_total_variation_from_counts():
    a, b = ["x", "y", "y", "z"], ["y", "z", "z", "z", "w"]
    pa, pb = Counter(a), Counter(b)
    by_hand = 0.5 * sum(abs(pa[c] / len(a) - pb[c] / len(b)) for c in ("w", "x", "y", "z"))
    assert total_variation(_objects(a), _objects(b), ("w", "x", "y", "z")) == \
        pytest.approx(by_hand)
    assert total_variation(np.array([0, 1]), np.array([1, 0]), (0, 1)) == 0.0


def test_correlation_difference_against_statistics_correlation():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    b[:, 2] += 2 * b[:, 0]
    pairs = [(0, 1), (0, 2), (1, 2)]
    by_hand = sum(abs(statistics.correlation(a[:, i].tolist(), a[:, j].tolist())
                      - statistics.correlation(b[:, i].tolist(), b[:, j].tolist()))
                  for i, j in pairs) / 3
    assert correlation_difference(a, b) == pytest.approx(by_hand)


def test_a_constant_column_correlates_zero():
    a = np.column_stack([np.arange(5.0), np.ones(5)])
    b = np.column_stack([np.arange(5.0), np.arange(5.0)])  # correlation 1
    assert correlation_difference(a, b) == pytest.approx(1.0)


# -- evaluate_table ------------------------------------------------------------------------------

SCHEMA = Schema((Column("x", "continuous", low=-4.0, high=4.0),
                 Column("n", "integer", low=0, high=10),
                 Column("flag", "binary"),
                 Column("site", "categorical", categories=("a", "b", "c"))))


def _rows(rng, n, shift=0.0):
    x = np.clip(rng.normal(shift, 1.0, n), -4, 4)
    return {"x": x, "n": np.clip(np.rint(2 * x + 5), 0, 10).astype(np.int64),
            "flag": (x > 0).astype(np.int64),
            "site": _objects(rng.choice(["a", "b", "c"], size=n, p=[0.5, 0.3, 0.2]))}


def test_w2_against_a_point_mass_and_its_floor_is_zero():
    """Held-out rows all at one point: both halves are that point (floor 0), and W2 of the
    synthetic rows to it is their root mean squared distance in the encoded space."""
    holdout = {"x": np.full(40, 2.0), "n": np.full(40, 5), "flag": np.ones(40, np.int64),
               "site": _objects(["b"] * 40)}
    synthetic = _rows(np.random.default_rng(2), 20)
    report = evaluate_table(holdout, synthetic, SCHEMA)
    point = encode(holdout, SCHEMA)[0]
    by_hand = math.sqrt(np.mean(((encode(synthetic, SCHEMA) - point) ** 2).sum(axis=1)))
    assert report.w2_samples == 20 and report.w2_floor == pytest.approx(0.0, abs=1e-9)
    assert report.w2 == pytest.approx(by_hand, rel=1e-6)


def test_w2_samples_is_capped_by_half_the_holdout_and_the_synthetic_rows():
    rng = np.random.default_rng(3)
    assert evaluate_table(_rows(rng, 30), _rows(rng, 100), SCHEMA).w2_samples == 15
    assert evaluate_table(_rows(rng, 100), _rows(rng, 100), SCHEMA, w2_samples=12).w2_samples \
        == 12


def test_a_sample_of_the_same_law_scores_near_the_floor_and_a_shifted_one_far_above():
    rng = np.random.default_rng(4)
    holdout = _rows(rng, 400)
    same = evaluate_table(holdout, _rows(rng, 400), SCHEMA, seed=1)
    shifted = evaluate_table(holdout, _rows(rng, 400, shift=1.5), SCHEMA, seed=1)
    assert 0.5 < same.w2 / same.w2_floor < 2.0
    assert shifted.w2 > 2 * shifted.w2_floor


def test_the_per_column_distances_are_the_module_s_functions_on_each_column():
    rng = np.random.default_rng(5)
    holdout, synthetic = _rows(rng, 60), _rows(rng, 50, shift=0.5)
    report = evaluate_table(holdout, synthetic, SCHEMA)
    assert set(report.ks) == {"x", "n"} and set(report.tv) == {"flag", "site"}
    assert report.ks["n"] == pytest.approx(_ks_by_hand(holdout["n"].tolist(),
                                                       synthetic["n"].tolist()))
    counts_real, counts_synth = Counter(holdout["site"]), Counter(synthetic["site"])
    assert report.tv["site"] == pytest.approx(0.5 * sum(
        abs(counts_real[c] / 60 - counts_synth[c] / 50) for c in "abc"))
    assert report.correlation == pytest.approx(abs(
        statistics.correlation(holdout["x"].tolist(), holdout["n"].tolist())
        - statistics.correlation(synthetic["x"].tolist(), synthetic["n"].tolist())))
    assert report.holdout_rows == 60 and report.synthetic_rows == 50 and report.efficacy is None


def test_encoded_arrays_score_as_their_tables():
    rng = np.random.default_rng(6)
    holdout, synthetic = _rows(rng, 40), _rows(rng, 40)
    from_tables = evaluate_table(holdout, synthetic, SCHEMA, target_column="flag")
    from_arrays = evaluate_table(encode(holdout, SCHEMA), encode(synthetic, SCHEMA), SCHEMA,
                                 target_column="flag")
    assert from_arrays.w2 == pytest.approx(from_tables.w2, rel=1e-5)
    assert from_arrays.w2_floor == pytest.approx(from_tables.w2_floor, rel=1e-5)
    assert from_arrays.ks == pytest.approx(from_tables.ks)
    assert from_arrays.tv == from_tables.tv
    assert from_arrays.correlation == pytest.approx(from_tables.correlation, rel=1e-5)
    assert from_arrays.efficacy.synthetic == from_tables.efficacy.synthetic


def test_evaluation_refuses_too_few_held_out_rows():
    rng = np.random.default_rng(7)
    with pytest.raises(DataError, match=r"at least 2 held-out rows.*got 1 and 5"):
        evaluate_table(_rows(rng, 1), _rows(rng, 5), SCHEMA)


# -- machine-learning efficacy -------------------------------------------------------------------

def _separated(rng, n):
    """Rows whose flag is the sign of x, with |x| >= 0.5: a margin any classifier finds."""
    rows = _rows(rng, n)
    rows["x"] = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 3.0, n)
    rows["flag"] = (rows["x"] > 0).astype(np.int64)
    return rows


def test_classification_efficacy_perfect_inverted_and_constant():
    rng = np.random.default_rng(8)
    train, holdout = _separated(rng, 200), _separated(rng, 100)
    inverted = dict(train, flag=1 - train["flag"])
    constant = dict(train, flag=np.ones(200, np.int64))
    real = ml_efficacy(holdout, train, SCHEMA, "flag", train=train)
    assert real.task == "classification" and real.synthetic == real.real
    assert real.synthetic["accuracy"] == 1.0 and real.synthetic["auc"] == 1.0
    flipped = ml_efficacy(holdout, inverted, SCHEMA, "flag").synthetic
    assert flipped["accuracy"] == 0.0 and flipped["auc"] == 0.0
    one = ml_efficacy(holdout, constant, SCHEMA, "flag").synthetic
    assert one["accuracy"] == pytest.approx(np.mean(holdout["flag"] == 1))
    assert one["auc"] == 0.5


def test_a_categorical_target_uses_every_category():
    rng = np.random.default_rng(9)
    train, holdout = _rows(rng, 300), _rows(rng, 150)
    for rows in (train, holdout):
        rows["site"] = _objects(np.where(rows["x"] < -0.5, "a", np.where(rows["x"] < 0.5, "b",
                                                                         "c")))
    result = ml_efficacy(holdout, train, SCHEMA, "site", train=train)
    assert result.synthetic["accuracy"] > 0.85 and result.synthetic["auc"] > 0.95


def test_regression_efficacy_exact_and_unrelated():
    schema = Schema((Column("x", "continuous", low=-4.0, high=4.0),
                     Column("y", "continuous", low=-10.0, high=10.0)))
    rng = np.random.default_rng(10)

    def rows(n, related=True):
        x = rng.uniform(-3, 3, n)
        return {"x": x, "y": 2 * x + 1 if related else rng.uniform(-5, 7, n)}

    holdout, train = rows(100), rows(200)
    exact = ml_efficacy(holdout, train, schema, "y", train=train)
    assert exact.task == "regression" and exact.synthetic["r2"] > 0.999
    assert ml_efficacy(holdout, rows(200, related=False), schema, "y").synthetic["r2"] < 0.1


def test_efficacy_refuses_an_unknown_target_and_a_target_without_features():
    rng = np.random.default_rng(11)
    rows = _rows(rng, 20)
    with pytest.raises(SchemaError, match=r"no column 'age'"):
        evaluate_table(rows, rows, SCHEMA, target_column="age")
    only = Schema((Column("flag", "binary"),))
    with pytest.raises(DataError, match=r"'flag' is the schema's only column"):
        ml_efficacy({"flag": rows["flag"]}, {"flag": rows["flag"]}, only, "flag")
