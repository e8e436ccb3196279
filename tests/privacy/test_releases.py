"""A client's release ledger (secureffm/privacy/releases.py) on its own. Truths: Python sets of
rounds, the rounds listed by ``range``, and Opacus' epsilon of the schedule through
``accounting.epsilon``."""

from __future__ import annotations

import json
import math
import random

import pytest

from secureffm.privacy.accounting import epsilon
from secureffm.privacy.releases import Budget, ReleaseGuard, Rounds


@pytest.mark.parametrize("rounds", [Rounds(1, 12), Rounds(3, 20, 3), Rounds(0, 0),
                                    Rounds(5, 4), Rounds(2, None, 2)])
def test_rounds_hold_exactly_what_range_lists(rounds):
    last = 30 if rounds.last is None else rounds.last
    listed = set(range(rounds.first, last + 1, rounds.every))
    assert {r for r in range(-2, 31) if r in rounds} == {r for r in listed if r <= 30}
    assert rounds.count == (math.inf if rounds.last is None else len(listed))


def test_each_round_is_answered_once_in_any_order_and_the_state_is_plain_json():
    """Rounds asked in a random order, each twice: the first answer of each is admitted, the
    second refused; the state stays a short JSON list of ints (one interval here)."""
    guard, state = ReleaseGuard({"task": Rounds(1, 40)}), {}
    asked = [r for r in range(1, 41) for _ in (0, 1)]
    random.Random(3).shuffle(asked)
    admitted, seen = [], set()
    for r in asked:
        why = guard.admit("client-1", state, "task", r)
        assert (why is None) == (r not in seen)
        if why is None:
            admitted.append(r)
        seen.add(r)
        assert guard.answered(state, "task") == len(seen)
    assert sorted(admitted) == list(range(1, 41))
    assert json.loads(json.dumps(state)) == {"released task": [1, 40]}


def test_a_task_or_round_outside_the_plan_is_refused_and_not_noted():
    guard, state = ReleaseGuard({"task": Rounds(2, 10, 2)}), {}
    assert "plan no other" in guard.admit("client-1", state, "other", 2)
    assert "rounds 2, 4, ..10" in guard.admit("client-1", state, "task", 3)
    assert "rounds 2, 4, ..10" in guard.admit("client-1", state, "task", 12)
    assert state == {}


def test_the_budget_refuses_the_first_release_past_the_target():
    """sigma 0.6 at q = 0.02 over two tasks: the guard admits releases while the composed
    epsilon of the answers stays within the target, whatever the order of the tasks."""
    sigma, rate, delta = 0.6, 0.02, 1e-5
    target = epsilon([(sigma, rate, 3), (sigma, rate, 2)], delta)
    guard = ReleaseGuard({"a": Rounds(1, 10), "b": Rounds(1, 10)},
                         Budget(sigma, rate, delta, target, "rdp"))
    state = {}
    for name, r in [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]:
        assert guard.admit("client-1", state, name, r) is None
    assert guard.epsilon(state) == pytest.approx(target)
    assert "past its target" in guard.admit("client-1", state, "b", 3)
    assert "past its target" in guard.admit("client-1", state, "a", 4)
    assert guard.epsilon(state) == pytest.approx(target)
