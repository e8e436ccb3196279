r"""SecAgg+'s neighbourhood from Bell et al.'s bound (CCS 2020, "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead"), as Google's implementation of that paper
computes it (federated-compute, ``fcp/secagg/server/graph_parameter_finder.cc``).

Clients sit on a Harary graph H(n, k) over a random order (:func:`~secureffm.protocols.secagg.
harary_neighbours`): each masks with and shares its secrets among its k neighbours, t of the
k + 1 shares (its own included) rebuild a secret. Given n clients, of which a fraction gamma
(``corrupt``) collude with the server and a fraction delta (``dropout``) drop out, k and t
must make three bad events unlikely:

1. the honest survivors' graph disconnects (the server then learns a partial sum). Removing
   k/2 consecutive clients in two places of the ring disconnects H(n, k); with
   B = floor(gamma n) + floor(delta n) bad clients, a union bound over the n (n - k - 1) / 2
   pairs of places gives

   .. math::

       \log P_{\rm disc} \le \log\frac{n (n - k - 1)}{2} + \log\frac{B!\,(n - k)!}{n!\,(B - k)!}
       < -(\sigma + 1) \log 2;

2. t or more of a client's neighbours are corrupt (they rebuild both its secrets): with
   A ~ Hypergeometric(n, floor(gamma n), k), t1 is the least a with
   P(A > a) < 2^{-(sigma + 1)} / n, and t must exceed t1; against a malicious server
   (semi-malicious in the paper) it must exceed t1' = ceil((t1 + k - 1.25) / 2), so that two
   survivor lists told to two halves of a group cannot both reach t;
3. fewer than t of a client's neighbours survive (the round fails): with
   S ~ Hypergeometric(n, ceil((1 - delta) n), k), t2 is the greatest t with
   P(S < t) < 2^{-eta} / n, and t <= t2.

k is the least even degree below n - 1 for which some t in (t1, t2] exists (here: the spec's
own threshold, which must also be a majority of the k + 1 shares); with none, every client is
everyone's neighbour (Bonawitz et al.). sigma (``security``, default 40) and eta
(``correctness``, default 20) are the reference's statistical parameters, in bits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = ["TOLERANCE_KEYS", "Tolerance", "Window", "window", "least_degree", "degree_for",
           "check_degree", "tolerance_from_table", "describe"]

TOLERANCE_KEYS = frozenset({"corrupt", "dropout", "security", "correctness"})
"""The keys of a secagg stage's table that state its tolerance (:func:`tolerance_from_table`)."""

_SLACK = 1e-14  # keeps float rounding of gamma n and delta n from erring towards insecurity


@dataclass(frozen=True)
class Tolerance:
    """What a SecAgg+ graph must withstand: fractions of the n clients that are ``corrupt``
    (gamma, colluding with the server) and that ``dropout`` (delta) in a round; the graph fails
    to hide an input with odds below 2^-``security`` and a round fails with odds below
    2^-``correctness`` (bits); ``malicious``: the server may deviate."""

    corrupt: float
    dropout: float
    security: float = 40.0
    correctness: float = 20.0
    malicious: bool = True

    def check(self, where: str) -> None:
        """Refuse fractions outside [0, 1) or beyond the reference's feasible region."""
        for name, value in (("corrupt", self.corrupt), ("dropout", self.dropout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < 1):
                raise ProtocolError(f"{where}: {name} = {value!r}; give a fraction in [0, 1) "
                                    "of the clients")
        for name, value in (("security", self.security), ("correctness", self.correctness)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ProtocolError(f"{where}: {name} = {value!r}; give a positive number of "
                                    "bits (the reference uses 40 and 20)")
        weight, variant = (2, "malicious") if self.malicious else (1, "semi-honest")
        if self.corrupt + weight * self.dropout > 0.9:
            raise ProtocolError(
                f"{where}: corrupt + {weight} x dropout = "
                f"{self.corrupt + weight * self.dropout:.3g} exceeds 0.9, where Bell et al.'s "
                f"bound finds no {variant} neighbourhood; lower corrupt or dropout")


def tolerance_from_table(table: dict, malicious: bool, where: str) -> Tolerance | None:
    """A stage table's tolerance (``corrupt``, ``dropout``, optional ``security`` and
    ``correctness``), checked; None when it states none."""
    given = TOLERANCE_KEYS & set(table)
    if not given:
        return None
    if not {"corrupt", "dropout"} <= given:
        raise ProtocolError(f"{where}: give both corrupt and dropout (the fractions Bell et "
                            "al.'s bound sizes the neighbourhood from), or neither")
    tolerance = Tolerance(table["corrupt"], table["dropout"], table.get("security", 40.0),
                          table.get("correctness", 20.0), malicious)
    tolerance.check(where)
    return tolerance


@dataclass(frozen=True)
class Window:
    """The thresholds a graph of ``degree`` neighbours allows: t in (``low``, ``high``]."""

    degree: int
    low: int
    high: int

    def allows(self, t: int) -> bool:
        return self.low < t <= self.high


def _log_pmf(total: int, marked: int, drawn: int, x: int) -> float:
    """log P(X = x), X ~ Hypergeometric(total, marked, drawn); -inf off the support."""
    if not max(0, drawn + marked - total) <= x <= min(drawn, marked):
        return -math.inf
    lg = math.lgamma
    return (lg(marked + 1) - lg(x + 1) - lg(marked - x + 1) + lg(total - marked + 1)
            - lg(drawn - x + 1) - lg(total - marked - drawn + x + 1) - lg(total + 1)
            + lg(drawn + 1) + lg(total - drawn + 1))


def _below(total: int, marked: int, drawn: int) -> list[float]:
    """P(X < x) for x = 0..drawn + 1, X ~ Hypergeometric(total, marked, drawn), summed from
    the low end (exact in floating point where it is tiny)."""
    out = [0.0]
    for x in range(drawn + 1):
        out.append(out[-1] + math.exp(_log_pmf(total, marked, drawn, x)))
    return out


def _above(total: int, marked: int, drawn: int) -> list[float]:
    """P(X > x) for x = -1..drawn (index x + 1), summed from the high end."""
    out = [0.0]
    for x in range(drawn, -1, -1):
        out.append(out[-1] + math.exp(_log_pmf(total, marked, drawn, x)))
    return out[::-1]


def window(n: int, k: int, tolerance: Tolerance) -> Window | None:
    """The thresholds H(n, k) allows against ``tolerance`` (items 2-3 of the module
    docstring), or None when its honest survivors may disconnect (item 1) or none is left."""
    corrupt = math.floor((tolerance.corrupt + _SLACK) * n)
    bad = corrupt + math.floor((tolerance.dropout + _SLACK) * n)
    if k <= bad:
        log_disconnected = (math.log(n) + math.log(n - k - 1) - math.log(2)
                            + math.lgamma(bad + 1) + math.lgamma(n - k + 1)
                            - math.lgamma(n + 1) - math.lgamma(bad - k + 1))
        if log_disconnected >= -(tolerance.security + 1) * math.log(2):
            return None
    hide = 2.0 ** -(tolerance.security + 1) / n
    adversarial = _above(n, corrupt, k)  # adversarial[a + 1] = P(A > a)
    low = next(a for a in range(k + 1) if adversarial[a + 1] < hide)
    if tolerance.malicious:
        low = math.ceil((low + k - 1.25) / 2)
    surviving = _below(n, math.ceil((1 - tolerance.dropout - _SLACK) * n), k)
    fail = 2.0 ** -tolerance.correctness / n
    high = max([t for t in range(1, k + 1) if surviving[t] < fail], default=0)
    return Window(k, low, high) if high > low else None


@functools.lru_cache(maxsize=256)
def least_degree(n: int, tolerance: Tolerance,
                 threshold: Callable[[int], int] | None = None) -> Window | None:
    """The least even k < n - 1 whose window holds a threshold (the reference's search), and
    that window; with ``threshold`` (shares needed from a group of k + 1), one that holds that
    threshold and where it is a majority of the k + 1 shares (:meth:`~secureffm.protocols.
    secagg.SecAggStage.validate_for`'s rule). None: no such k, every client needs every
    other as a neighbour."""
    for k in range(2, n - 1, 2):
        allowed = window(n, k, tolerance)
        if allowed and (threshold is None or (allowed.allows(threshold(k + 1))
                                              and 2 * threshold(k + 1) > k + 1)):
            return allowed
    return None


def degree_for(n: int, neighbours: int | None, tolerance: Tolerance | None,
               threshold: Callable[[int], int]) -> int:
    """The degree a spec gives n clients: ``neighbours`` when fixed (0: all others), else
    (None) the least that meets ``tolerance`` with the spec's ``threshold`` rule, 0 (all
    others) when none does."""
    if neighbours is not None or tolerance is None:
        return neighbours or 0
    found = least_degree(n, tolerance, threshold)
    return found.degree if found else 0


def check_degree(n: int, neighbours: int | None, tolerance: Tolerance | None,
                 threshold: Callable[[int], int]) -> None:
    """Refuse (ProtocolError, by name) a graph for n clients that does not meet the spec's
    ``tolerance``: a fixed ``neighbours`` outside the bound, or a complete graph whose
    threshold ``t`` of n shares is not above the corrupt clients (a majority with them, against
    a malicious server) or not at most the clients that survive. Nothing without a tolerance."""
    if tolerance is None:
        return
    k = degree_for(n, neighbours, tolerance, threshold)
    k += k % 2
    stated = (f"{n} clients at corrupt = {tolerance.corrupt:g}, dropout = "
              f"{tolerance.dropout:g} ({'malicious' if tolerance.malicious else 'semi-honest'} "
              f"server, 2^-{tolerance.security:g} security, 2^-{tolerance.correctness:g} "
              "failure)")
    if 0 < k < n - 1:
        t, allowed = threshold(k + 1), window(n, k, tolerance)
        if allowed is None or not allowed.allows(t) or 2 * t <= k + 1:
            least = least_degree(n, tolerance, threshold)
            fix = (f"{least.degree}; remove neighbours to derive it" if least else
                   "none below n - 1; use neighbours = 0 (all clients)")
            why = ("its honest survivors may disconnect" if allowed is None else
                   f"threshold {t} of {k + 1} shares is outside ({allowed.low}, {allowed.high}]")
            raise ProtocolError(f"neighbours = {neighbours} gives no Bell et al. guarantee for "
                                f"{stated}: {why}; the least degree that does is {fix}")
        return
    corrupt = math.floor((tolerance.corrupt + _SLACK) * n)
    survivors = math.ceil((1 - tolerance.dropout - _SLACK) * n)
    t = threshold(n)
    floor = (n + corrupt) / 2 if tolerance.malicious else corrupt
    if not floor < t <= survivors:
        raise ProtocolError(f"every client is every other's neighbour, and threshold {t} of "
                            f"{n} shares is outside ({floor:g}, {survivors}] for {stated}; "
                            "change threshold or the fractions")


def describe(neighbours: int | None, tolerance: Tolerance | None) -> tuple[str, str]:
    """(the neighbourhood, the trust it needs) in privacy.json's words: the bound's inputs
    when the spec states them, and that no bound is claimed for a fixed degree without them."""
    if tolerance is None:
        if not neighbours:
            return "neighbours all", ""
        return (f"neighbours {neighbours}, fixed: the spec states no corrupt or dropout "
                "fraction, so no Bell et al. bound is claimed for this neighbourhood"), ""
    inputs = (f"Bell et al.'s bound (CCS 2020) for corrupt = {tolerance.corrupt:g}, dropout = "
              f"{tolerance.dropout:g}, security = {tolerance.security:g} bits, correctness = "
              f"{tolerance.correctness:g} bits: each input stays hidden except with odds "
              f"2^-{tolerance.security:g} and a round fails with odds below "
              f"2^-{tolerance.correctness:g}")
    degree = "neighbours derived by" if neighbours is None else f"neighbours {neighbours}, within"
    return (f"{degree} {inputs}",
            f"at most a fraction {tolerance.corrupt:g} of the clients collude with the server "
            f"and at most {tolerance.dropout:g} drop out of a round (what the neighbourhood is "
            "sized for)")
