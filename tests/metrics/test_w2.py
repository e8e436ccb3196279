import math

import numpy as np
import pytest
import torch

import secureffm.ot as transport
from secureffm.errors import SolverError
from secureffm.metrics.w2 import gaussian_w2, w2, w2_many


def test_gaussian_closed_form_matches_diagonal_formula():
    m1, m2 = torch.tensor([0.0, 1.0]), torch.tensor([2.0, -1.0])
    c1, c2 = torch.diag(torch.tensor([1.0, 4.0])), torch.diag(torch.tensor([0.25, 1.0]))
    expected = math.sqrt(8.0 + (1 - 0.5) ** 2 + (2 - 1) ** 2)
    assert gaussian_w2(m1, c1, m2, c2) == pytest.approx(expected, rel=1e-9)


def test_empirical_w2_matches_gaussian_closed_form():
    rng = np.random.default_rng(0)
    m1, m2 = np.array([0.0, 0.0]), np.array([4.0, 3.0])
    c1 = np.array([[1.0, 0.3], [0.3, 0.5]])
    c2 = np.array([[0.5, -0.2], [-0.2, 1.5]])
    x = rng.multivariate_normal(m1, c1, size=2000)
    y = rng.multivariate_normal(m2, c2, size=2000)
    exact = gaussian_w2(*(torch.tensor(v) for v in (m1, c1, m2, c2)))
    assert w2(x, y) == pytest.approx(exact, rel=0.02)


def test_w2_many_equals_sequential_and_reports_each_pair_once():
    rng = np.random.default_rng(1)
    pairs = [(rng.normal(size=(200, 2)), rng.normal(size=(200, 2)) + k) for k in range(3)]
    finished = []
    assert w2_many(pairs, done=finished.append) == [w2(*p) for p in pairs]
    assert sorted(finished) == [0, 1, 2]


def test_non_convergence_is_an_error(monkeypatch):
    monkeypatch.setattr(transport, "MAX_ITER", 5)
    rng = np.random.default_rng(2)
    with pytest.raises(SolverError, match="did not converge"):
        w2(rng.normal(size=(300, 2)), rng.normal(size=(300, 2)))
