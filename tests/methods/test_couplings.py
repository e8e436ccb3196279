import itertools

import numpy as np
import torch
from torch import nn

from secureffm.methods.couplings import (
    ExactOTCoupling,
    IndependentCoupling,
    SemiDualCoupling,
    sample_from_plan,
)
from secureffm.ot import semidual_assignment


def brute_force_permutation(x0, x1):
    """The optimal assignment by enumerating all permutations (an independent reference)."""
    n = len(x0)
    cost = [[float(((x0[i] - x1[j]) ** 2).sum()) / 2 for j in range(n)] for i in range(n)]
    return min(itertools.permutations(range(n)), key=lambda p: sum(cost[i][p[i]] for i in range(n)))


def test_lot_pairs_come_from_the_exact_plan():
    gen = torch.Generator().manual_seed(3)
    for trial in range(5):
        x0 = torch.randn(6, 2, generator=gen)
        x1 = torch.randn(6, 2, generator=gen) + 2
        best = brute_force_permutation(x0, x1)
        allowed = {(tuple(x0[i].tolist()), tuple(x1[best[i]].tolist())) for i in range(6)}
        a, b = ExactOTCoupling().couple(x0, x1, gen)
        pairs = {(tuple(p.tolist()), tuple(q.tolist())) for p, q in zip(a, b, strict=False)}
        assert pairs <= allowed, f"trial {trial}: a pair outside the optimal permutation"


def test_independent_pairs_are_not_optimal_so_the_lot_test_can_fail():
    gen = torch.Generator().manual_seed(4)
    x0, x1 = torch.randn(6, 2, generator=gen), torch.randn(6, 2, generator=gen)
    best = brute_force_permutation(x0, x1)
    assert best != tuple(range(6))  # the identity pairing is the independent coupling here
    a, b = IndependentCoupling().couple(x0, x1, gen)
    assert torch.equal(a, x0) and torch.equal(b, x1)


def test_sample_from_plan_follows_plan_frequencies():
    plan = torch.tensor([[0.5, 0.0], [0.1, 0.4]])
    gen = torch.Generator().manual_seed(0)
    i, j = sample_from_plan(plan, 40_000, gen)
    counts = np.zeros((2, 2))
    np.add.at(counts, (i.numpy(), j.numpy()), 1)
    assert counts[0, 1] == 0
    np.testing.assert_allclose(counts / counts.sum(), plan.numpy(), atol=0.01)


class Linear(nn.Module):
    def __init__(self, w, b):
        super().__init__()
        self.w, self.b = w, b

    def forward(self, x):
        return x @ self.w + self.b


def test_algorithm5_picks_argmin_of_cost_minus_potential():
    gen = torch.Generator().manual_seed(1)
    candidates = torch.randn(32, 2, generator=gen)
    targets = torch.randn(10, 2, generator=gen) * 3
    potential = Linear(torch.tensor([1.5, -0.7]), 0.3)
    f = potential(candidates)
    expected = []
    for y in targets:
        scores = [0.5 * float(((c - y) ** 2).sum()) - float(fk)
                  for c, fk in zip(candidates, f, strict=True)]
        expected.append(int(np.argmin(scores)))
    cost = 0.5 * torch.cdist(candidates, targets).pow(2)
    assert semidual_assignment(cost, f).tolist() == expected
    x0, x1 = SemiDualCoupling(potential).couple(candidates, targets, gen)
    assert torch.equal(x0, candidates[expected]) and torch.equal(x1, targets)


def test_algorithm5_sign_a_high_potential_attracts_targets():
    # argmin of c - f (not c + f): a candidate with a much larger f wins every target.
    candidates = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    targets = torch.tensor([[0.1, 0.0], [0.0, -0.2]])
    f = torch.tensor([0.0, 1e4])
    cost = 0.5 * torch.cdist(candidates, targets).pow(2)
    assert semidual_assignment(cost, f).tolist() == [1, 1]
