r"""Shamir secret sharing over GF(p), p = 2**521 - 1, for secure aggregation.

Bonawitz et al. (2017), "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
share each client's mask seed and secret key t-out-of-n so that the server can recover the masks
of clients that drop out, while any t - 1 parties learn nothing.

A secret s is the constant term of a random polynomial of degree t - 1,

.. math::

    f(x) = s + a_1 x + \dots + a_{t-1} x^{t-1} \pmod p, \qquad a_k \sim U(\mathbb{F}_p),

and share i is (i, f(i)) for i = 1..n. Any t shares determine f, hence s = f(0), by Lagrange
interpolation; any t - 1 shares are jointly uniform whatever s is (Shamir 1979).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = [
    "PRIME",
    "Share",
    "split",
    "reconstruct",
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
_SHARE_BYTES = _X_BYTES + _Y_BYTES
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


def reconstruct(shares: list[Share], threshold: int) -> int:
    r"""Recover f(0) from the first ``threshold`` shares with distinct x.

    .. math::

        s = f(0) = \sum_{i} y_i \prod_{j \ne i} \frac{x_j}{x_j - x_i} \pmod p,

    the inverse taken as ``pow(., -1, PRIME)``. A repeated share (same x and y) is skipped;
    the same x with a different y, x outside 1..PRIME-1, or fewer than ``threshold`` distinct
    shares raise ``ProtocolError``.
    """
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
    points = list(seen.items())[:threshold]  # dicts keep first-insertion order
    secret = 0
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                numerator = numerator * xj % PRIME
                denominator = denominator * (xj - xi) % PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    return secret


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
    if len(data) != _SHARE_BYTES:
        raise ProtocolError(
            f"encoded share is {len(data)} bytes, expected {_SHARE_BYTES}; the message is "
            "truncated or not a share"
        )
    x = int.from_bytes(data[:_X_BYTES], "big")
    y = int.from_bytes(data[_X_BYTES:], "big")
    if x == 0 or y >= PRIME:
        raise ProtocolError("encoded share has x = 0 or y >= PRIME; the message is corrupted")
    return Share(x, y)
