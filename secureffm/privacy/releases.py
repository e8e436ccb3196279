"""A client's own ledger of its releases: what it answers, whatever the server asks.

The server asks a client's program to run named tasks; every answer computed from the client's
data is a release (under DP-SGD, one more noisy gradient: k answers of one round average the
noise down by 1/sqrt(k)). A client program holds a :class:`ReleaseGuard` built from its own
settings, never from a request, and asks it before each release. The guard refuses (the
program raises the reason as a ``TaskRefused``, which the client's endpoint signs into a
``rejected`` event):

- a (task, round) the client answered before;
- a round its own settings do not plan for that task (:class:`Rounds`);
- under local-noise DP (:class:`Budget`), a release after which the client's own epsilon,
  composed from its own answers with the accountant that calibrated sigma, would pass its
  target.

What a client answered lives in ``client.state`` (per task, its answered rounds as a flat list
of closed intervals ``[a1, b1, a2, b2, ...]``), so the client's snapshot
(:mod:`secureffm.federation.snapshot`) carries it between messages.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

from .accounting import epsilon

__all__ = ["Rounds", "Budget", "ReleaseGuard"]


@dataclass(frozen=True)
class Rounds:
    """The rounds a client's settings plan for one task: ``first``, ``first + every``, ...
    up to ``last`` (None: no last round)."""

    first: int
    last: int | None
    every: int = 1

    def __contains__(self, round_: int) -> bool:
        return (round_ >= self.first and (self.last is None or round_ <= self.last)
                and (round_ - self.first) % self.every == 0)

    @property
    def count(self) -> float:
        """How many rounds the plan holds (inf without a last round)."""
        if self.last is None:
            return math.inf
        return max(0, (self.last - self.first) // self.every + 1)

    def __str__(self) -> str:
        end = "" if self.last is None else str(self.last)
        if self.every == 1:
            return f"rounds {self.first}..{end}"
        return f"rounds {self.first}, {self.first + self.every}, ..{end}"


@dataclass(frozen=True)
class Budget:
    """Local-noise DP: each answer runs one subsampled Gaussian mechanism at noise multiplier
    ``sigma`` and Poisson rate ``rate``; the client's answers compose, under ``accountant``
    at ``delta``, to at most ``target`` epsilon."""

    sigma: float
    rate: float
    delta: float
    target: float
    accountant: str


def _answered(state: list[int], round_: int) -> bool:
    """Whether ``round_`` lies in the flat sorted intervals ``state``."""
    i = bisect.bisect_right(state[0::2], round_) - 1
    return i >= 0 and round_ <= state[2 * i + 1]


def _with(state: list[int], round_: int) -> list[int]:
    """The flat sorted intervals ``state`` with ``round_`` (not in them) added, merged."""
    pairs = [[a, b] for a, b in zip(state[0::2], state[1::2], strict=True)]
    pairs.append([round_, round_])
    pairs.sort()
    merged: list[list[int]] = []
    for a, b in pairs:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [n for pair in merged for n in pair]


def _count(state: list[int]) -> int:
    return sum(b - a + 1 for a, b in zip(state[0::2], state[1::2], strict=True))


class ReleaseGuard:
    """What one client program answers: ``plan`` (task name -> the :class:`Rounds` its own
    settings plan) and, under local-noise DP with a target, ``budget``. One guard serves
    every client the program runs; each client's answers live in its own ``state`` (its
    ``client.state``), which every method takes."""

    def __init__(self, plan: dict[str, Rounds], budget: Budget | None = None):
        self.plan = dict(plan)
        self.budget = budget

    @functools.cached_property
    def _plan_fits(self) -> bool:
        """Whether the whole plan fits the target, so that no answer within it can pass the
        target. Computed at the first release, not when the guard is made: a deployed node
        rebuilds its program for every message, and the accountant (Opacus' import, then
        RDP) costs seconds there that its key-exchange messages need not pay."""
        return self.budget is None or (
            all(r.count < math.inf for r in self.plan.values())
            and self._epsilon({name: int(r.count) for name, r in self.plan.items()})
            <= self.budget.target)

    @staticmethod
    def _key(name: str) -> str:
        return f"released {name}"

    def answered(self, state: dict, name: str) -> int:
        """How many releases of task ``name`` the client of ``state`` has answered."""
        return _count(state.get(self._key(name), []))

    def _epsilon(self, counts: dict[str, int]) -> float:
        b = self.budget
        return epsilon([(b.sigma, b.rate, n) for n in counts.values()], b.delta, b.accountant)

    def epsilon(self, state: dict) -> float:
        """The epsilon of the client of ``state`` from its own answers so far (0 without a
        budget)."""
        if self.budget is None:
            return 0.0
        return self._epsilon({name: self.answered(state, name) for name in self.plan})

    def admit(self, owner: str, state: dict, name: str, round_: int) -> str | None:
        """Client ``owner`` (its ``state``) is asked to release task ``name`` of ``round_``:
        None when it may (the release is then noted in ``state``), else why it refuses."""
        rounds = self.plan.get(name)
        if rounds is None:
            return (f"{owner} refused {name}: its own settings plan no {name} (they plan "
                    f"{', '.join(self.plan) or 'nothing'})")
        if round_ not in rounds:
            return (f"{owner} refused {name} for round {round_}: its own settings plan {name} "
                    f"for {rounds} only")
        answered = state.get(self._key(name), [])
        if _answered(answered, round_):
            return (f"{owner} refused {name} for round {round_}: it answered that round "
                    "already, and it answers each round once (a second answer would release "
                    "its data again: under DP, with fresh noise that averages away)")
        if not self._plan_fits:
            spent = self._epsilon({n: self.answered(state, n) + (n == name) for n in self.plan})
            if spent > self.budget.target:
                return (f"{owner} refused {name} for round {round_}: its own ledger would "
                        f"reach epsilon {spent:.4g}, past its target {self.budget.target:g} "
                        f"(delta {self.budget.delta:g}, {self.budget.accountant})")
        state[self._key(name)] = _with(answered, round_)
        return None
