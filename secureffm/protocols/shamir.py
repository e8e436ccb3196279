r"""Shamir secret sharing over GF(p), p = 2**521 - 1, for secure aggregation.

Bonawitz et al. (2017), "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
share each client's mask seed and secret key t-out-of-n so that the server can recover the masks
of clients that drop out, while any t - 1 parties learn nothing.

A secret s is the constant term of a random polynomial of degree t - 1,

.. math::

    f(x) = s + a_1 x + \dots + a_{t-1} x^{t-1} \pmod p, \qquad a_k \sim U(\mathbb{F}_p),

and share i is (i, f(i)) for i = 1..n. Any t shares determine f, hence s = f(0), by Lagrange
interpolation; any t - 1 shares are jointly uniform whatever s is (Shamir 1979).

The shares are a Reed-Solomon codeword, so :func:`decode` can also check them: with m > t
shares it confirms that all lie on one polynomial of degree t - 1, and otherwise places up to
(m - t) / 2 wrong shares (Gao 2003, "A new algorithm for decoding Reed-Solomon codes"), one
more when the caller can check the secret (``accept``). With m = t shares every set fits a
polynomial: a wrong share changes the secret unnoticed unless ``accept`` refuses it.
"""

from __future__ import annotations

import functools
import math
import operator
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = [
    "PRIME",
    "SHARE_BYTES",
    "Share",
    "Decoded",
    "split",
    "reconstruct",
    "decode",
    "split_bytes",
    "reconstruct_bytes",
    "share_to_bytes",
    "share_from_bytes",
]

PRIME: int = 2**521 - 1
"""The field modulus: a Mersenne prime above every 64-byte secret (< 2**512)."""

MAX_SECRET_BYTES = 64
_X_BYTES = 2
_Y_BYTES = 66  # ceil(521 / 8)
SHARE_BYTES = _X_BYTES + _Y_BYTES
"""Length of one encoded share (:func:`share_to_bytes`)."""
_MAX_COUNT = 2 ** (8 * _X_BYTES) - 1


@dataclass(frozen=True)
class Share:
    """One point (x, y = f(x) mod PRIME) of the sharing polynomial; x is 1..count."""

    x: int
    y: int


def _check_threshold(threshold: int, count: int) -> None:
    if threshold < 1:
        raise ProtocolError(f"threshold is {threshold}; set it to at least 1")
    if threshold > count:
        raise ProtocolError(
            f"threshold {threshold} exceeds share count {count}; lower the threshold or "
            "raise the count"
        )
    if count > _MAX_COUNT:
        raise ProtocolError(f"share count {count} exceeds {_MAX_COUNT}; use fewer shares")


def split(secret: int, threshold: int, count: int) -> list[Share]:
    r"""Split ``secret`` into ``count`` shares, any ``threshold`` of which recover it.

    .. math::

        y_i = f(i) = s + \sum_{k=1}^{t-1} a_k i^k \pmod p, \qquad i = 1..n,

    with a_k drawn from ``secrets.randbelow(PRIME)`` (a CSPRNG; never seeded).
    """
    _check_threshold(threshold, count)
    if not 0 <= secret < PRIME:
        raise ProtocolError("secret must lie in [0, 2**521 - 1); pass a smaller non-negative int")
    coefficients = [secret] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, count + 1):
        y = 0
        for a in reversed(coefficients):  # Horner: ((a_{t-1} x + a_{t-2}) x + ...) x + s
            y = (y * x + a) % PRIME
        shares.append(Share(x, y))
    return shares


def _distinct_points(shares: list[Share], threshold: int) -> list[tuple[int, int]]:
    """(x, y mod PRIME) of each distinct share in first-seen order; at least ``threshold``."""
    if threshold < 1:
        raise ProtocolError(f"threshold is {threshold}; set it to at least 1")
    seen: dict[int, int] = {}
    for share in shares:
        if not 0 < share.x < PRIME:
            raise ProtocolError(
                f"share has x = {share.x}; shares are evaluated at x = 1..count, never 0"
            )
        y = share.y % PRIME
        if share.x in seen and seen[share.x] != y:
            raise ProtocolError(
                f"two shares at x = {share.x} have different y; drop the corrupted one"
            )
        seen[share.x] = y
    if len(seen) < threshold:
        raise ProtocolError(
            f"only {len(seen)} distinct shares for threshold {threshold}; "
            f"collect at least {threshold}"
        )
    return list(seen.items())  # dicts keep first-insertion order


def reconstruct(shares: list[Share], threshold: int) -> int:
    r"""Recover f(0) from the first ``threshold`` shares with distinct x.

    .. math::

        s = f(0) = \sum_{i} y_i \prod_{j \ne i} \frac{x_j}{x_j - x_i} \pmod p,

    the inverse taken as ``pow(., -1, PRIME)``. A repeated share (same x and y) is skipped;
    the same x with a different y, x outside 1..PRIME-1, or fewer than ``threshold`` distinct
    shares raise ``ProtocolError``.
    """
    points = _distinct_points(shares, threshold)[:threshold]
    secret = 0
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                numerator = numerator * xj % PRIME
                denominator = denominator * (xj - xi) % PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    return secret


@dataclass(frozen=True)
class Decoded:
    """What :func:`decode` found: the secret f(0), and the x of every share off f."""

    secret: int
    inconsistent: tuple[int, ...]


def decode(shares: list[Share], threshold: int,
           accept: Callable[[int], bool] | None = None) -> Decoded:
    r"""The secret of m >= t shares, checking that every share lies on the same polynomial.

    The polynomial f (degree < t) is the one through the first t shares when every other share
    lies on it too; otherwise the unique one agreeing with at least (m + t) / 2 shares, found
    by Gao's decoder, which places up to (m - t) / 2 wrong shares. ``accept`` (for example a
    hash of the secret committed in advance) must also pass f(0); when it does not, each share
    is left out in turn and the rest decoded again, which places one more wrong share (m + 1
    decodings, O(m^3) field operations, run only when a share is wrong).

    Shares that all lie on one polynomial, the common case, cost O(m): a secret random check
    (:func:`_parity_check`) and the Lagrange weights of f(0), both computed once per x-set and
    reused for every secret rebuilt from the same holders (secure aggregation rebuilds each
    survivor's seed from the same survivors: O(n^2) for n secrets instead of O(n^3)).

    Returns f(0) and the x of the shares with y != f(x): exactly the wrong shares while at
    most (m - t) / 2 are wrong ((m - t + 1) / 2 with ``accept``). Beyond that the secret still
    passed ``accept``, but wrong shares chosen together (x is public) can make f a polynomial
    through them whose f(0) is right, and then right shares are the ones returned. Raises
    ``ProtocolError`` when no accepted f is found: with m = t any t shares fit a polynomial,
    so a wrong share is seen only through ``accept`` and cannot be placed. Input checks as in
    :func:`reconstruct`.
    """
    points = _distinct_points(shares, threshold)
    m = len(points)
    xs, ys = zip(*points, strict=True)
    check = _parity_check(xs, threshold) if m > threshold else ()
    if not sum(map(operator.mul, check, ys)) % PRIME:  # on one polynomial: f(0) by weights
        weights = _weights_at_zero(xs[:threshold])
        secret = sum(map(operator.mul, weights, ys)) % PRIME
        if accept is None or accept(secret):
            return Decoded(secret, ())
    subsets = [points]
    if accept is not None and m > threshold:
        subsets += [points[:i] + points[i + 1:] for i in range(m)]
    for subset in subsets:
        f = _fit(subset, threshold)
        secret = f[0] if f else 0
        if f is not None and (accept is None or accept(secret)):
            return Decoded(secret, tuple(x for x, y in points if _evaluate(f, x) != y))
    raise ProtocolError(
        f"the {m} shares (threshold {threshold}) decode to no "
        f"{'accepted ' if accept else ''}secret: some are wrong, more than the "
        f"{m - threshold} spare shares can place"
    )


@functools.lru_cache(maxsize=1024)
def _parity_check(xs: tuple[int, ...], t: int) -> tuple[int, ...]:
    r"""A secret random check c (length m = len(xs) > t) with c . y = 0 mod PRIME for every y
    on a polynomial of degree < t at ``xs``: c_i = u_i g(x_i), u_i = 1 / prod_{j != i}
    (x_i - x_j), g a random polynomial of degree < m - t from ``secrets``. Every such sum
    :math:`\sum_i u_i x_i^k f(x_i)` is the X^{m-1} coefficient of the interpolant of
    X^k f, zero for k + t - 1 <= m - 2, and those m - t sums vanish only on the code; y off
    it passes with odds 1 / PRIME < 2^-520 (Schwartz-Zippel), drawn once per x-set and never
    revealed, so :func:`decode` checks a secret in O(m) instead of O(t m)."""
    g = [secrets.randbelow(PRIME) for _ in range(len(xs) - t)]
    u = _inverses([math.prod(xi - xj for xj in xs if xj != xi) % PRIME for xi in xs])
    return tuple(ui * _evaluate(g, xi) % PRIME for ui, xi in zip(u, xs, strict=True))


@functools.lru_cache(maxsize=1024)
def _weights_at_zero(xs: tuple[int, ...]) -> list[int]:
    """Lagrange weights of f(0) for distinct ``xs``: prod_{j != i} x_j / (x_j - x_i) mod PRIME
    (secure aggregation rebuilds many secrets from the same holders, round after round)."""
    numerators = [math.prod(xj for xj in xs if xj != xi) % PRIME for xi in xs]
    inverses = _inverses([math.prod(xj - xi for xj in xs if xj != xi) % PRIME for xi in xs])
    return [n * d % PRIME for n, d in zip(numerators, inverses, strict=True)]


def _fit(points: list[tuple[int, int]], t: int) -> list[int] | None:
    """Coefficients (low to high) of the polynomial of degree < t that agrees with at least
    (m + t) / 2 of the m points, or None when there is none."""
    f = _interpolate(points[:t])
    if all(_evaluate(f, x) == y for x, y in points[t:]):
        return f  # the common case, in O(t m); Gao's decoder below costs O(m^2)
    return _gao(points, t)


def _gao(points: list[tuple[int, int]], t: int) -> list[int] | None:
    """Gao's Reed-Solomon decoder: partial extended Euclid on g0 = prod (X - x_i) and the
    interpolant g1 until the remainder g has degree < (m + t) / 2, then f = g / v."""
    m = len(points)
    r0, r1 = _vanishing([x for x, _ in points]), _interpolate(points)
    v0, v1 = [], [1]
    while 2 * (len(r1) - 1) >= m + t:
        q, rest = _divmod(r0, r1)
        r0, r1 = r1, rest
        v0, v1 = v1, _sub(v0, _mul(q, v1))
    f, rest = _divmod(r1, v1)
    return f if not rest and len(f) <= t else None


# Polynomials over GF(PRIME): coefficient lists, lowest degree first, no trailing zeros.

def _trim(a: list[int]) -> list[int]:
    while a and a[-1] == 0:
        a.pop()
    return a


def _evaluate(a: list[int], x: int) -> int:
    value = 0
    for c in reversed(a):
        value = (value * x + c) % PRIME
    return value


def _mul(a: list[int], b: list[int]) -> list[int]:
    if not a or not b:
        return []
    out = [0] * (len(a) + len(b) - 1)
    for i, ai in enumerate(a):
        for j, bj in enumerate(b):
            out[i + j] += ai * bj
    return _trim([c % PRIME for c in out])


def _sub(a: list[int], b: list[int]) -> list[int]:
    a, b = a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b))
    return _trim([(ai - bi) % PRIME for ai, bi in zip(a, b, strict=True)])


def _divmod(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """Quotient and remainder of a / b (b nonzero), by long division."""
    rest, q = list(a), [0] * max(len(a) - len(b) + 1, 0)
    lead = pow(b[-1], -1, PRIME)
    for k in range(len(q) - 1, -1, -1):
        q[k] = c = rest[k + len(b) - 1] * lead % PRIME
        for j, bj in enumerate(b):
            rest[k + j] = (rest[k + j] - c * bj) % PRIME
    return _trim(q), _trim(rest[:len(b) - 1])


def _vanishing(xs: list[int]) -> list[int]:
    """prod_i (X - x_i)."""
    out = [1]
    for x in xs:
        out = [(lo - x * hi) % PRIME for lo, hi in zip([0] + out, out + [0], strict=True)]
    return out


def _inverses(values: list[int]) -> list[int]:
    """Inverses mod PRIME of nonzero values with a single pow (Montgomery's batch trick)."""
    prefix = [1]
    for v in values:
        prefix.append(prefix[-1] * v % PRIME)
    inverse, out = pow(prefix[-1], -1, PRIME), [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inverse * prefix[i] % PRIME
        inverse = inverse * values[i] % PRIME
    return out


def _interpolate(points: list[tuple[int, int]]) -> list[int]:
    r"""Coefficients of the polynomial of degree < m through m points with distinct x:
    :math:`\sum_i y_i \, g_0(X) / ((X - x_i) \, g_0'(x_i))`, g0 = prod_i (X - x_i)."""
    xs = [x for x, _ in points]
    g0 = _vanishing(xs)
    slopes = _inverses([math.prod(xi - xk for xk in xs if xk != xi) % PRIME for xi in xs])
    out = [0] * len(points)
    for (xi, yi), inverse in zip(points, slopes, strict=True):
        c, carry = yi * inverse % PRIME, 0
        for k in range(len(points), 0, -1):  # g0 / (X - x_i) by synthetic division
            carry = (g0[k] + xi * carry) % PRIME
            out[k - 1] += c * carry
    return _trim([c % PRIME for c in out])


def split_bytes(secret: bytes, threshold: int, count: int) -> list[Share]:
    """Split a byte string of at most 64 bytes, read as a big-endian integer."""
    if len(secret) > MAX_SECRET_BYTES:
        raise ProtocolError(
            f"secret is {len(secret)} bytes; share at most {MAX_SECRET_BYTES} bytes "
            "(split it or hash it first)"
        )
    return split(int.from_bytes(secret, "big"), threshold, count)


def reconstruct_bytes(shares: list[Share], threshold: int, length: int) -> bytes:
    """Recover a byte string shared by ``split_bytes``; ``length`` restores leading zeros."""
    if not 0 <= length <= MAX_SECRET_BYTES:
        raise ProtocolError(f"length is {length}; pass the secret's length, 0..{MAX_SECRET_BYTES}")
    value = reconstruct(shares, threshold)
    if value.bit_length() > 8 * length:
        raise ProtocolError(
            f"recovered value does not fit in {length} bytes; check length, threshold and shares"
        )
    return value.to_bytes(length, "big")


def share_to_bytes(share: Share) -> bytes:
    """Encode a share as 68 bytes: x in 2 bytes, then y in 66 bytes, both big-endian."""
    if not 0 < share.x <= _MAX_COUNT:
        raise ProtocolError(f"share has x = {share.x}; only x in 1..{_MAX_COUNT} can be encoded")
    if not 0 <= share.y < PRIME:
        raise ProtocolError("share has y outside [0, PRIME); reduce it mod PRIME first")
    return share.x.to_bytes(_X_BYTES, "big") + share.y.to_bytes(_Y_BYTES, "big")


def share_from_bytes(data: bytes) -> Share:
    """Decode the 68-byte encoding written by ``share_to_bytes``."""
    if len(data) != SHARE_BYTES:
        raise ProtocolError(
            f"encoded share is {len(data)} bytes, expected {SHARE_BYTES}; the message is "
            "truncated or not a share"
        )
    x = int.from_bytes(data[:_X_BYTES], "big")
    y = int.from_bytes(data[_X_BYTES:], "big")
    if x == 0 or y >= PRIME:
        raise ProtocolError("encoded share has x = 0 or y >= PRIME; the message is corrupted")
    return Share(x, y)
