"""Accounting for distributed noise: the Poisson-subsampled Skellam mechanism, through RDP.

Under distributed noise each client adds integer Skellam noise Sk(mu/2, mu/2) (the difference
of two Poisson(mu/2) variables; variance mu per coordinate) to its quantized update inside
secure aggregation. A sum of independent Skellam variables is Skellam, so the server's sum
carries Skellam noise of variance ``variance`` = (survivors) x mu, exactly, at least
(minimum honest survivors) x mu.

- Skellam RDP, integer order alpha > 1, integer-valued query with L2 and L1 sensitivities D2, D1
  (Agarwal, Kairouz and Liu 2021, Theorem 3.5):
  eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)).
- Poisson subsampling at rate q, the general upper bound of Zhu and Wang (2019, Theorem 5):
  eps_q(alpha) <= log[(1-q)^(alpha-1) (alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2) e^eps(2)
  + 3 sum_{l=3..alpha} C(alpha,l) (1-q)^(alpha-l) q^l e^((l-1) eps(l))] / (alpha - 1),
  and never more than eps(alpha) itself.
- Composition adds RDP; (epsilon, delta) comes from Opacus' conversion (Balle et al. 2020).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

__all__ = ["ORDERS", "SkellamStep", "skellam_rdp", "subsampled_rdp", "skellam_epsilon",
           "grid_sensitivity"]

ORDERS = tuple(range(2, 257))


@dataclass(frozen=True)
class SkellamStep:
    """``steps`` runs of the Skellam mechanism on one client's Poisson sample (rate ``q``):
    integer sensitivities ``l2``, ``l1`` and total noise ``variance`` per coordinate."""

    q: float
    l2: float
    l1: float
    variance: float
    steps: int = 1


def skellam_rdp(alpha, l2: float, l1: float, variance: float):
    """RDP at integer order(s) ``alpha`` of adding Skellam noise of ``variance`` to an integer
    query with sensitivities ``l2``, ``l1`` (Agarwal et al. 2021, Theorem 3.5)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    mu = variance
    return (alpha * l2**2 / (2 * mu)
            + np.minimum(((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)))


def subsampled_rdp(q: float, base: np.ndarray) -> np.ndarray:
    """RDP at the orders 2, 3, ..., len(base) + 1 of a mechanism whose RDP at those orders is
    ``base``, run on a Poisson sample at rate ``q`` (Zhu and Wang 2019, Theorem 5), capped by
    ``base`` itself."""
    if q >= 1:
        return base
    alphas = np.arange(2, len(base) + 2, dtype=np.float64)[:, None]   # [A, 1]
    orders = np.arange(2, len(base) + 2, dtype=np.float64)[None, :]   # [1, L]
    log_q, log_1q = math.log(q), math.log1p(-q)
    log_comb = gammaln(alphas + 1) - gammaln(orders + 1) - gammaln(alphas - orders + 1)
    terms = (log_comb + (alphas - orders) * log_1q + orders * log_q
             + (orders - 1) * base[None, :] + np.where(orders >= 3, math.log(3), 0.0))
    terms = np.where(orders <= alphas, terms, -np.inf)
    first = (alphas[:, 0] - 1) * log_1q + np.log(alphas[:, 0] * q - q + 1)
    total = logsumexp(np.concatenate([first[:, None], terms], axis=1), axis=1)
    return np.minimum(total / (alphas[:, 0] - 1), base)


def skellam_epsilon(schedule: list[SkellamStep], delta: float,
                    gaussian: list[tuple[float, float, int]] = ()) -> float:
    """epsilon at ``delta`` of the composed ``schedule``, together with any subsampled Gaussian
    mechanisms ``gaussian`` [(noise_multiplier, sample_rate, steps)] on the same data (their
    RDP from Opacus at the same integer orders); 0 when both are empty."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    steps = [s for s in schedule if s.steps > 0]
    gaussian = [g for g in gaussian if g[2] > 0]
    if not steps and not gaussian:
        return 0.0
    rdp = np.zeros(len(ORDERS))
    for s in steps:
        rdp += subsampled_rdp(s.q, skellam_rdp(ORDERS, s.l2, s.l1, s.variance)) * s.steps
    for sigma, q, n in gaussian:
        rdp += np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=n, orders=list(ORDERS)))
    with warnings.catch_warnings():  # "optimal order is the smallest": integer orders start at 2
        warnings.filterwarnings("ignore", message="Optimal order")
        eps, _ = get_privacy_spent(orders=list(ORDERS), rdp=list(rdp), delta=delta)
    return float(eps)


def grid_sensitivity(sensitivity: float, scale: float, step: float, dim: int) -> tuple[float,
                                                                                      float]:
    """(L2, L1) sensitivity, in quantization levels, of one client's quantized input.

    The client's real input scale * x (x with L2 sensitivity ``sensitivity``) is clipped per
    coordinate (a contraction) and divided by the quantizer ``step``; stochastic rounding of
    two neighbouring inputs with shared uniforms moves each of the ``dim`` coordinates by less
    than one level more, so L2 <= scale * sensitivity / step + sqrt(dim) (the mechanism is a
    mixture over the uniforms, and Renyi divergence is jointly quasi-convex), and
    L1 <= sqrt(dim) * L2. A 1e-6 relative slack covers float rounding of the mapping.
    """
    l2 = scale * sensitivity / step * (1 + 1e-6) + math.sqrt(dim)
    return l2, math.sqrt(dim) * l2
