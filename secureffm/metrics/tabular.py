"""A client's evaluation of synthetic rows against its own held-out rows, on its own side.

Only the numbers of the returned :class:`TableReport` leave the client (each a release that the
run must charge or name as unaccounted); the rows never do. Every comparison is against the
client's real held-out rows (``holdout``), never against a recipe:

- ``w2``: exact W2 (:func:`~secureffm.metrics.w2.w2`) between ``m`` synthetic rows and ``m``
  held-out rows in the encoded space (:func:`~secureffm.data.encoding.encode`), and ``w2_floor``,
  the same distance between two disjoint halves of the held-out rows of ``m`` each: what a
  perfect generator would score at that size (the i.i.d. floor of
  :mod:`~secureffm.metrics.evaluate`, drawn from the client's finite rows). ``m`` = min(
  ``w2_samples``, half the held-out rows, the synthetic rows);
- ``ks``: per continuous or integer column, the two-sample Kolmogorov-Smirnov statistic
  sup_v |F_real(v) - F_synth(v)| (scipy.stats.ks_2samp) on the decoded values;
- ``tv``: per binary or categorical column, the total variation distance
  1/2 sum_c |p_real(c) - p_synth(c)| over its categories;
- ``correlation``: the mean absolute difference of the Pearson correlations over the pairs of
  numeric (continuous, integer) columns, i < j (a constant column correlates 0 with every other);
  None with fewer than two numeric columns;
- ``efficacy`` (with ``target_column``): train on the synthetic rows and test on the held-out
  rows, against training on the client's real training rows (``train``); the other columns,
  encoded, are the features. Categorical or binary target: logistic regression, accuracy and the
  macro one-vs-rest ROC AUC over the classes the held-out rows hold (with both outcomes); numeric
  target: ridge regression (alpha 1), R^2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from ..data.encoding import decode, encode
from ..data.schema import Schema
from ..errors import DataError
from .w2 import w2_many

__all__ = ["TableReport", "Efficacy", "evaluate_table", "ks_statistic",
           "total_variation", "correlation_difference", "ml_efficacy"]


@dataclass
class Efficacy:
    """Machine-learning efficacy for ``target``: ``task`` classification (scores ``accuracy``,
    ``auc``) or regression (``r2``); ``synthetic`` trained on the synthetic rows, ``real`` on
    the client's training rows (None without them), both tested on its held-out rows."""

    target: str
    task: str
    model: str
    synthetic: dict[str, float | None]
    real: dict[str, float | None] | None


@dataclass
class TableReport:
    """A client's evaluation of synthetic rows (module docstring): W2 at ``w2_samples`` rows and
    its i.i.d. floor, per-column KS and TV, correlation difference, and ML efficacy."""

    holdout_rows: int
    synthetic_rows: int
    w2: float
    w2_floor: float
    w2_samples: int
    ks: dict[str, float]
    tv: dict[str, float]
    correlation: float | None
    efficacy: Efficacy | None

    def to_dict(self) -> dict:
        return asdict(self)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup_v |F_a(v) - F_b(v)|."""
    from scipy.stats import ks_2samp

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(ks_2samp(a, b, method="asymp").statistic)  # the p-value is not used


def total_variation(a: np.ndarray, b: np.ndarray, categories: tuple) -> float:
    """1/2 sum_c |p_a(c) - p_b(c)| of two samples' frequencies over ``categories``."""
    p = np.array([np.mean(np.asarray(a) == c) for c in categories])
    q = np.array([np.mean(np.asarray(b) == c) for c in categories])
    return float(0.5 * np.abs(p - q).sum())


def _correlations(x: np.ndarray) -> np.ndarray:
    """Pearson correlations of the columns of x [N, k]; a constant column's are 0."""
    centred = x - x.mean(axis=0)
    norms = np.sqrt((centred ** 2).sum(axis=0))
    scaled = np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    return scaled.T @ scaled


def correlation_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean |corr_a - corr_b| over the column pairs i < j of a [N, k] and b [M, k], k >= 2."""
    upper = np.triu_indices(a.shape[1], k=1)
    return float(np.mean(np.abs(_correlations(a)[upper] - _correlations(b)[upper])))


def _matrix(table: Mapping[str, np.ndarray], names: list[str]) -> np.ndarray:
    """The named columns of a table as float64 [N, len(names)]."""
    return np.stack([np.asarray(table[n], dtype=np.float64) for n in names], axis=1)


def _as_table(data, schema: Schema) -> dict[str, np.ndarray]:
    if isinstance(data, np.ndarray):
        return decode(data, schema)
    return {name: np.asarray(data[name]) for name in schema.names}


def evaluate_table(holdout: Mapping[str, np.ndarray] | np.ndarray,
                   synthetic: Mapping[str, np.ndarray] | np.ndarray, schema: Schema,
                   train: Mapping[str, np.ndarray] | np.ndarray | None = None,
                   target_column: str | None = None, w2_samples: int = 1_000,
                   seed: int = 0) -> TableReport:
    """Score ``synthetic`` rows against the client's ``holdout`` rows (module docstring).

    Each of ``holdout``, ``synthetic``, ``train`` is a checked table or an encoded array
    [N, schema.dim] (decoded first, so a model's raw samples are scored as ``sample`` writes
    them). ``seed`` draws the W2 subsamples.
    """
    real, synth = _as_table(holdout, schema), _as_table(synthetic, schema)
    n_real, n_synth = len(real[schema.names[0]]), len(synth[schema.names[0]])
    m = min(w2_samples, n_real // 2, n_synth)
    if m < 1:
        raise DataError(f"evaluation needs at least 2 held-out rows and 1 synthetic row, got "
                        f"{n_real} and {n_synth}: raise --holdout or the synthetic sample size")
    rng = np.random.default_rng(seed)
    real_x, synth_x = encode(real, schema), encode(synth, schema)
    order = rng.permutation(n_real)
    first, second = real_x[order[:m]], real_x[order[m:2 * m]]
    drawn = synth_x[rng.choice(n_synth, size=m, replace=False)]
    distance, floor = w2_many([(drawn, first), (second, first)])
    numeric = [c.name for c in schema.columns if c.numeric]
    return TableReport(
        holdout_rows=n_real, synthetic_rows=n_synth, w2=distance, w2_floor=floor, w2_samples=m,
        ks={n: ks_statistic(real[n], synth[n]) for n in numeric},
        tv={c.name: total_variation(real[c.name], synth[c.name],
                                    (0, 1) if c.type == "binary" else c.categories)
            for c in schema.columns if not c.numeric},
        correlation=(correlation_difference(_matrix(real, numeric), _matrix(synth, numeric))
                     if len(numeric) >= 2 else None),
        efficacy=(None if target_column is None else ml_efficacy(
            real, synth, schema, target_column,
            None if train is None else _as_table(train, schema))),
    )


def ml_efficacy(holdout: Mapping[str, np.ndarray], synthetic: Mapping[str, np.ndarray],
                schema: Schema, target: str,
                train: Mapping[str, np.ndarray] | None = None) -> Efficacy:
    """Train on ``synthetic`` (and on ``train``, the real baseline), test on ``holdout``:
    see the module docstring. Tables, not encoded arrays."""
    column = schema.column(target)
    features = Schema(tuple(c for c in schema.columns if c.name != target))
    if not features.columns:
        raise DataError(f"target column {target!r} is the schema's only column: efficacy "
                        "needs other columns to predict it from")
    x_test = encode(holdout, features)
    classes = (0, 1) if column.type == "binary" else column.categories

    def score(rows: Mapping[str, np.ndarray]) -> dict[str, float | None]:
        x = encode(rows, features)
        if column.numeric:
            return _regress(x, rows[target], x_test, holdout[target])
        return _classify(x, _codes(rows[target], classes), x_test,
                         _codes(holdout[target], classes), len(classes))

    task, model = (("regression", "ridge regression (alpha 1) on the encoded other columns")
                   if column.numeric else
                   ("classification", "logistic regression on the encoded other columns"))
    return Efficacy(target=target, task=task, model=model, synthetic=score(synthetic),
                    real=None if train is None else score(train))


def _codes(values: np.ndarray, classes: tuple) -> np.ndarray:
    lookup = {c: i for i, c in enumerate(classes)}
    return np.array([lookup[v] for v in np.asarray(values).tolist()], dtype=np.int64)


def _regress(x, y, x_test, y_test) -> dict[str, float]:
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    fitted = Ridge(alpha=1.0).fit(x, np.asarray(y, dtype=np.float64))
    return {"r2": float(r2_score(np.asarray(y_test, dtype=np.float64), fitted.predict(x_test)))}


def _classify(x, y, x_test, y_test, n_classes: int) -> dict[str, float | None]:
    """Accuracy and macro one-vs-rest AUC; a training set of one class predicts that class."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    proba = np.zeros((len(x_test), n_classes))
    seen = np.unique(y)
    if len(seen) == 1:
        proba[:, seen[0]] = 1.0
    else:
        fitted = LogisticRegression(max_iter=2_000).fit(x, y)
        proba[:, fitted.classes_] = fitted.predict_proba(x_test)
    aucs = [roc_auc_score(y_test == c, proba[:, c]) for c in range(n_classes)
            if 0 < np.sum(y_test == c) < len(y_test)]
    return {"accuracy": float(np.mean(np.argmax(proba, axis=1) == y_test)),
            "auc": float(np.mean(aucs)) if aucs else None}
