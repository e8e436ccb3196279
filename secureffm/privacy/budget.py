"""A run's privacy budget, spent the same way by every method: the noise multiplier's
calibration, the one policy for a multiplier that would overspend, and the server's ledger
charges.

A method states its DP plan as a :class:`Plan`: the Poisson sample rate q and, per message
kind, how many DP-SGD steps each client runs over the planned run. From it:

- :func:`noise_multiplier`: sigma of local (Gaussian) noise, the given one or the smallest that
  keeps the composed plan within the target; :func:`distributed_noise`: tau of distributed
  (Skellam) noise the same way, over the protocol's noise geometry. Both use public settings
  only, so the server and each client's own process compute the same value.
- :func:`refuse_overspending`: a given multiplier whose plan would pass the target is refused
  before the first round (:class:`~secureffm.errors.BudgetError`, naming how much of the plan
  fits and what to change); nothing is trained shorter than asked. :func:`affordable` says how
  much fits.
- :class:`ServerLedger`: the server's ledger, charged for every step it asked each client to
  run (a client that dropped is charged too: it may overstate, never understate), each charge
  optionally signed into the run's log as a ``charged`` event an audit recomputes epsilon from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BudgetError
from .accounting import epsilon, smallest_multiplier
from .ledger import CHARGED, LedgerEntry, PrivacyLedger, charged_fields
from .settings import DistributedNoise, DPSettings, NoiseGeometry
from .skellam import SkellamStep, skellam_epsilon

__all__ = ["Plan", "noise_multiplier", "gaussian_epsilon", "distributed_noise",
           "distributed_epsilon", "affordable", "refuse_overspending", "ServerLedger", "Note"]

# The channel's note: (round, event, detail, fields) signed by the server into the run's log.
Note = Callable[[int, str, str, dict], None]


@dataclass(frozen=True)
class Plan:
    """One client's DP-SGD steps over a run: Poisson sample ``rate`` q (batch over the public
    nominal shard size) and ``steps``, (message kind, steps) pairs in the order the kinds
    compose."""

    rate: float
    steps: tuple[tuple[str, int], ...]


@functools.lru_cache(maxsize=16)
def noise_multiplier(dp: DPSettings, plan: Plan) -> float:
    """sigma of local-noise DP-SGD: ``dp``'s given one, or the smallest (to 1e-3) at which
    ``plan``'s steps compose, under ``dp.accountant`` at ``dp.delta``, to at most
    ``dp.target_epsilon``. Kept per process: the search costs seconds, and a client's process
    answers many messages."""
    if dp.noise_multiplier:
        return dp.noise_multiplier
    return smallest_multiplier(lambda m: gaussian_epsilon(dp, plan, m), dp.target_epsilon,
                               dp.delta)


def gaussian_epsilon(dp: DPSettings, plan: Plan, multiplier: float) -> float:
    """The epsilon one client spends over ``plan`` with local noise at sigma ``multiplier``
    (``dp.accountant`` at ``dp.delta``)."""
    return epsilon([(multiplier, plan.rate, n) for _, n in plan.steps], dp.delta, dp.accountant)


def distributed_noise(dp: DPSettings, plan: Plan, sensitivity: float, clients: list[str],
                      sizes: dict[str, int], noise_geometry: Callable
                      ) -> tuple[dict[str, NoiseGeometry], DistributedNoise]:
    """Each kind's distributed-noise geometry for updates of ``sizes[kind]`` coordinates from
    ``clients`` at equal weights (``noise_geometry(kind, weights, sensitivity, size)``: the
    protocol's, or the channel's), and the noise every client adds: L2 ``sensitivity`` (in the
    update's units; clip / batch for DP-SGD), and tau the given one or the smallest keeping
    every client within the target over ``plan``. Public settings only: the server plans with
    it and each client derives its own noise share with it."""
    l2 = dict.fromkeys(clients, sensitivity)
    weights = dict.fromkeys(clients, 1.0)
    geometry = {kind: noise_geometry(kind, weights, l2, size) for kind, size in sizes.items()}
    tau = dp.noise_multiplier or _calibrated_tau(dp, plan, tuple(
        (kind, g.honest, tuple(sorted(g.sensitivity.items()))) for kind, g in geometry.items()))
    return geometry, DistributedNoise(tau, l2, dp.colluders)


def distributed_epsilon(dp: DPSettings, plan: Plan, geometry: dict[str, NoiseGeometry],
                        client: str, multiplier: float) -> float:
    """The epsilon ``client`` spends over ``plan`` under distributed noise at multiplier tau,
    every kind's Skellam steps composed."""
    return skellam_epsilon([
        SkellamStep(plan.rate, *geometry[kind].sensitivity[client],
                    geometry[kind].sum_variance(multiplier), n)
        for kind, n in plan.steps], dp.delta)


@functools.lru_cache(maxsize=16)
def _calibrated_tau(dp: DPSettings, plan: Plan, frozen: tuple) -> float:
    """tau for :func:`distributed_noise`; ``frozen``: the geometry as (kind, honest, sorted
    (client, (L2, L1)) pairs) per kind. Kept per process (the search costs seconds, and the
    server and the in-process clients ask for the same one); each distinct sensitivity
    profile is evaluated once."""
    geometry = {kind: NoiseGeometry(dict(pairs), honest) for kind, honest, pairs in frozen}
    profiles = {tuple(g.sensitivity[cid] for g in geometry.values()): cid
                for cid, _ in frozen[0][2]}
    return smallest_multiplier(
        lambda m: max(distributed_epsilon(dp, plan, geometry, cid, m)
                      for cid in profiles.values()), dp.target_epsilon, dp.delta)


def affordable(epsilon_of: Callable[[int], float], target: float, first: int, last: int) -> int:
    """The largest n in ``first``..``last`` with ``epsilon_of(n)`` (non-decreasing in n) at most
    ``target``: ``last`` when the whole plan fits, ``first`` - 1 when not even ``first`` does."""
    if epsilon_of(last) <= target:
        return last
    low, high = first - 1, last
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if epsilon_of(mid) <= target else (low, mid)
    return low


def refuse_overspending(epsilon_of: Callable[[int], float], dp: DPSettings, multiplier: float,
                        first: int, last: int, unit: str, advice: str) -> None:
    """The policy for a noise multiplier that would overspend, the same for every method:
    raise :class:`BudgetError` when ``epsilon_of(last)``, the epsilon of the plan through
    ``last`` of its ``unit`` (rounds, steps) at ``multiplier``, passes ``dp``'s target; the
    message names how many fit from ``first`` on and what to change (``advice``, with
    ``{fit}`` for that count: e.g. "pass --rounds {fit}"). Nothing without a target."""
    target = dp.target_epsilon
    if target is None:
        return
    fit = affordable(epsilon_of, target, first, last)
    if fit >= last:
        return
    fits = (f"{unit} {first}..{fit} fit: {advice.format(fit=fit)}" if fit >= first else
            f"not one of its {unit} fits")
    raise BudgetError(f"noise multiplier {multiplier:.4g} over the planned {unit} "
                      f"{first}..{last} spends epsilon {epsilon_of(last):.4g}, past the target "
                      f"{target:g} (delta {dp.delta:g}, {dp.accountant}): {fits}, or raise the "
                      "noise multiplier or the target epsilon")


class ServerLedger:
    """The server's DP ledger of one run: what it asked each client to run, charged at
    ``rate`` q and each client's ``multipliers[client]`` (sigma for local noise, tau for
    distributed noise, whose per-kind ``geometry`` then prices each step as a Skellam
    mechanism). ``note``: when given, every charge is also signed into the run's log as a
    ``charged`` event (:func:`~secureffm.privacy.ledger.charged_fields`)."""

    def __init__(self, dp: DPSettings, rate: float, multipliers: dict[str, float],
                 geometry: dict[str, NoiseGeometry] | None = None, note: Note | None = None):
        self.dp, self.rate, self.multipliers = dp, rate, dict(multipliers)
        self.geometry, self.note = geometry, note
        self.ledger = PrivacyLedger(dp.delta)
        # The Skellam bound is an RDP bound: distributed noise is accounted with RDP only.
        self.accountant = "rdp" if dp.noise == "distributed" else dp.accountant

    def entry(self, client: str, kind: str, round_: int, steps: int = 1,
              multiplier: float | None = None) -> LedgerEntry:
        """What ``steps`` steps of ``kind`` from ``round_`` on charge ``client`` (at its own
        multiplier unless ``multiplier`` is given)."""
        m = self.multipliers[client] if multiplier is None else multiplier
        if self.geometry is None:
            return LedgerEntry(client, kind, round_, self.rate, m, self.dp.clip, steps)
        l2, l1 = self.geometry[kind].sensitivity[client]
        return LedgerEntry(client, kind, round_, self.rate, m, self.dp.clip, steps,
                           mechanism="skellam", l2=l2, l1=l1,
                           variance=self.geometry[kind].sum_variance(m))

    def charge(self, clients: list[str], kind: str, round_: int, steps: int = 1) -> None:
        """Charge each of ``clients`` (those asked to compute ``kind`` in ``round_``) ``steps``
        steps; nothing for no client or no step."""
        if clients and steps:
            self.record([self.entry(cid, kind, round_, steps) for cid in clients])

    def record(self, entries: list[LedgerEntry]) -> None:
        """Record ``entries`` (of one kind and round; e.g. a continued run's logged charges)
        and, with ``note``, sign them into the log."""
        for entry in entries:
            self.ledger.record(entry)
        if self.note is not None:
            kind, round_ = entries[0].kind, entries[0].round
            self.note(round_, CHARGED, f"DP ledger: {len(entries)} client(s) charged for "
                      f"their {kind}", charged_fields(kind, entries, self.dp))

    def epsilon_after(self, client: str, steps: dict[str, int], round_: int,
                      multiplier: float | None = None, past: bool = True) -> float:
        """The epsilon ``client`` would have spent after ``steps[kind]`` more steps of each
        kind from ``round_`` on (at ``multiplier``, its own by default), composed with what
        the ledger charged it (``past``; else alone)."""
        ledger = self.ledger.history(client) if past else PrivacyLedger(self.dp.delta)
        for kind, n in steps.items():
            if n > 0:
                ledger.record(self.entry(client, kind, round_, n, multiplier))
        return ledger.epsilon(client, self.accountant)

    def accounting(self, **extra) -> dict:
        """privacy.json's accounting: the ledger's report (epsilon per client and kind, the
        target, ``target_held``), each client's ``noise_multiplier``, the ``clip`` and
        ``extra``."""
        report = self.ledger.report(self.dp.target_epsilon, self.dp.accountant)
        report.update(noise_multiplier=self.multipliers, clip=self.dp.clip, **extra)
        return report
