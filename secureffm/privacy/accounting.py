"""Epsilon of a schedule of subsampled Gaussian mechanisms, through Opacus' accountants.

A schedule is a list of (noise_multiplier, sample_rate, steps): Opacus' accountant history.
Mechanisms that share a client's data compose, so one client's whole schedule (velocity
gradients and, in GOT, dual updates) is accounted together.

Opacus is imported on first use here and in the other modules of this package
(``secureffm.privacy``'s names load on first access too): importing it loads its privacy
engine and ``torch.distributed``, about 3 s of start-up on a small machine, which a run, a
benchmark or a command that accounts nothing (plaintext, secagg, FedWAD, ``secureffm audit``,
``--help``) should not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from ..errors import ConfigError
from ..names import ACCOUNTANTS

__all__ = ["epsilon", "calibrate_noise", "smallest_multiplier", "check_delta", "ACCOUNTANTS",
           "Schedule"]

Schedule = list[tuple[float, float, int]]


def epsilon(schedule: Schedule, delta: float, accountant: str = "rdp") -> float:
    """epsilon at ``delta`` of the composed ``schedule`` (0 for an empty schedule)."""
    steps = tuple((float(s), float(q), int(n)) for s, q, n in schedule if n > 0)
    if not steps:
        return 0.0
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"accountant = {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")
    return _epsilon(steps, float(delta), accountant)


@lru_cache(maxsize=1024)
def _epsilon(steps: tuple[tuple[float, float, int], ...], delta: float,
             accountant: str) -> float:
    """:func:`epsilon` of a non-empty schedule, remembered: a ledger's report asks for the
    same schedule for every client with the same sample rates, and PRV's answer (which also
    sizes its grid with Opacus' RDP accountant) takes about a second each."""
    from opacus.accountants import PRVAccountant, RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    if accountant == "rdp":  # RDPAccountant.get_epsilon's sum, one step's RDP computed once
        rdp = sum([_step_rdp(s, q) * n for s, q, n in steps])
        return float(rdp_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS,
                                                    rdp=rdp, delta=delta)[0])
    acc = PRVAccountant()
    acc.history = list(steps)
    return float(acc.get_epsilon(delta))


@lru_cache(maxsize=4096)
def _step_rdp(sigma: float, q: float) -> np.ndarray:
    """Opacus' RDP of one subsampled Gaussian step at RDPAccountant's orders (compute_rdp with
    steps = 1, which scales linearly in steps): the series at fractional orders is slow for small
    sigma, and a run's ledger asks for the same (sigma, q) per client, kind and report."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    rdp = rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                   orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.setflags(write=False)
    return rdp


def calibrate_noise(target: float, delta: float, plan: list[tuple[float, int]],
                    accountant: str = "rdp", tolerance: float = 1e-3) -> float:
    """The smallest noise multiplier sigma (to ``tolerance``) with which every mechanism of
    ``plan`` [(sample_rate, steps)], all run at sigma, composes to at most ``target``.

    Opacus' ``get_noise_multiplier`` calibrates a single (rate, steps) pair; this bisects the
    same accountant over the composed schedule.
    """
    def eps(sigma: float) -> float:
        return epsilon([(sigma, q, n) for q, n in plan], delta, accountant)

    return smallest_multiplier(eps, target, delta, tolerance)


def smallest_multiplier(eps: Callable[[float], float], target: float, delta: float,
                        tolerance: float = 1e-3) -> float:
    """The smallest multiplier (to ``tolerance``) at which ``eps(multiplier)``, non-increasing
    in the multiplier, is at most ``target``; by doubling, then bisection."""
    low, high = 0.05, 1.0
    while eps(high) > target:
        low, high = high, high * 2
        if high > 1e4:
            raise ConfigError(f"target_epsilon = {target} at delta = {delta} needs a noise "
                              "multiplier above 10^4 for this schedule; raise the target or "
                              "lower the number of rounds")
    while high - low > tolerance:
        mid = (low + high) / 2
        low, high = (mid, high) if eps(mid) > target else (low, mid)
    return high


def check_delta(delta: float, records: int) -> None:
    """Refuse a delta above 0.1 / ``records`` (the public nominal count of records one client
    holds): at delta >= 1 / N a mechanism that publishes one random record outright meets
    (0, delta)-DP, so the guarantee says nothing; a tenth of that is the loosest we accept."""
    if delta * records > 0.1 * (1 + 1e-9):  # 1e-5 at N = 10,000 is the usual choice
        raise ConfigError(f"delta = {delta:g} is not well below 1 / N = {1 / records:.3g} for "
                          f"shards of {records} records: a mechanism that releases a random "
                          f"record meets it. Use delta <= {0.1 / records:.3g} (1e-5 or less is "
                          "usual)")
