"""Shamir sharing against exact rational interpolation, hypothesis round trips, a leak test, and
the checking decoder against a brute-force search over every t-subset."""

from __future__ import annotations

import math
import random
import secrets
from fractions import Fraction
from itertools import combinations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from scipy import stats

from secureffm.errors import ProtocolError
from secureffm.protocols.shamir import (
    PRIME,
    Decoded,
    Share,
    decode,
    reconstruct,
    reconstruct_bytes,
    share_from_bytes,
    share_to_bytes,
    split,
    split_bytes,
)

FIELD = st.integers(min_value=0, max_value=PRIME - 1)


def _evaluate(coefficients: list[int], x: int) -> int:
    """f(x) = sum_k c_k x**k over the integers (no modulus)."""
    return sum(c * x**k for k, c in enumerate(coefficients))


def _lagrange_at_zero(points: list[tuple[int, int]]) -> Fraction:
    """Reference: f(0) = sum_i y_i prod_{j != i} x_j / (x_j - x_i), exactly over the rationals."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(points):
        term = Fraction(yi)
        for j, (xj, _) in enumerate(points):
            if j != i:
                term *= Fraction(xj, xj - xi)
        total += term
    return total


def test_textbook_example_recovers_1234():
    # f(x) = 1234 + 166 x + 94 x^2 (the worked example on Wikipedia's "Shamir's secret sharing").
    points = {1: 1494, 2: 1942, 3: 2578, 4: 3402, 5: 4414, 6: 5614}
    for xs in [(1, 2, 3), (2, 4, 5), (6, 1, 3), (4, 5, 6)]:
        assert reconstruct([Share(x, points[x]) for x in xs], 3) == 1234


@settings(max_examples=60, deadline=None)
@given(coefficients=st.lists(FIELD, min_size=1, max_size=20), data=st.data())
def test_reconstruct_matches_rational_lagrange_on_a_known_polynomial(coefficients, data):
    t = len(coefficients)
    n = data.draw(st.integers(t, 20), label="count")
    xs = data.draw(st.permutations(range(1, n + 1)), label="order")[:t]
    points = [(x, _evaluate(coefficients, x)) for x in xs]
    # The reference is exact over Q on the unreduced values, so it shares no code with ours.
    assert _lagrange_at_zero(points) == coefficients[0]
    assert reconstruct([Share(x, y % PRIME) for x, y in points], t) == coefficients[0]


def test_reconstruct_matches_sympy_interpolate():
    sympy = pytest.importorskip("sympy")
    X = sympy.Symbol("X")
    rng = random.Random(3)
    for t in (1, 2, 5, 9):
        coefficients = [rng.randrange(PRIME) for _ in range(t)]
        points = [(x, _evaluate(coefficients, x)) for x in rng.sample(range(1, 30), t)]
        assert sympy.interpolate(points, X).subs(X, 0) == coefficients[0]
        assert reconstruct([Share(x, y % PRIME) for x, y in points], t) == coefficients[0]


@settings(deadline=None)
@given(secret=FIELD, data=st.data())
def test_any_threshold_subset_in_any_order_reconstructs(secret, data):
    n = data.draw(st.integers(1, 20), label="count")
    t = data.draw(st.integers(1, n), label="threshold")
    shares = split(secret, t, n)
    assert [share.x for share in shares] == list(range(1, n + 1))
    assert all(0 <= share.y < PRIME for share in shares)
    size = data.draw(st.integers(t, n), label="size")
    subset = data.draw(st.permutations(shares), label="order")[:size]
    wired = [share_from_bytes(share_to_bytes(share)) for share in subset]
    assert wired == subset
    assert reconstruct(wired, t) == secret
    if t >= 2:
        # t - 1 shares interpolate a degree t - 2 polynomial whose f(0) is uniform, not the secret
        # (equal with probability 1 / PRIME).
        assert reconstruct(subset[: t - 1], t - 1) != secret


@settings(deadline=None)
@given(body=st.binary(max_size=64), zeros=st.integers(0, 64), data=st.data())
def test_bytes_round_trip_keeps_leading_zeros(body, zeros, data):
    secret = (bytes(zeros) + body)[:64]
    n = data.draw(st.integers(1, 8), label="count")
    t = data.draw(st.integers(1, n), label="threshold")
    shares = data.draw(st.permutations(split_bytes(secret, t, n)), label="order")
    assert reconstruct_bytes(shares[:t], t, len(secret)) == secret


def test_only_the_first_threshold_distinct_shares_are_used():
    shares = split(987654321, 3, 5)
    bad = Share(5, (shares[4].y + 1) % PRIME)
    assert reconstruct([shares[0], shares[0], shares[1], shares[2], bad], 3) == 987654321
    assert reconstruct([bad, shares[0], shares[1]], 3) != 987654321


def _low_bit_pvalues(secret: int, samples: int = 4000, bits: int = 4) -> list[float]:
    """Chi-square p-values of the low ``bits`` of y1 and y2 (t = 3) against uniform."""
    counts = [[0] * 2**bits, [0] * 2**bits]
    for _ in range(samples):
        shares = split(secret, 3, 3)
        counts[0][shares[0].y % 2**bits] += 1
        counts[1][shares[1].y % 2**bits] += 1
    return [float(stats.chisquare(c).pvalue) for c in counts]


def test_two_shares_of_a_threshold_three_split_do_not_depend_on_the_secret(monkeypatch):
    # A seeded stand-in for the CSPRNG makes the p-values reproducible (no flaky failures); the
    # property under test is the polynomial construction, not the operating system's generator.
    rng = random.Random(20170101)
    calls = []

    def randbelow(n: int) -> int:
        calls.append(n)
        return rng.randrange(n)

    monkeypatch.setattr(secrets, "randbelow", randbelow)
    s0, s1 = 0, 2**512 - 1  # low bits 0000 and 1111
    for secret in (s0, s1):
        assert min(_low_bit_pvalues(secret)) > 1e-3
    # Every coefficient came from secrets.randbelow(PRIME): t - 1 = 2 per split.
    assert calls == [PRIME] * (2 * 2 * 4000)


def test_leak_check_catches_a_split_with_zero_coefficients(monkeypatch):
    # With a_1 = a_2 = 0, f(x) = s, so y == secret for every share: the low bits of y1 are always
    # those of the secret and the chi-square test above rejects uniformity outright.
    monkeypatch.setattr(secrets, "randbelow", lambda n: 0)
    assert all(share.y == 12345 for share in split(12345, 3, 5))
    assert max(_low_bit_pvalues(12345, samples=400)) < 1e-3


def test_real_split_never_hands_out_the_secret_or_repeats_itself():
    # Would fail for zero coefficients (every y equals the secret) or a fixed seed (repeats).
    secret = 2**300 + 7
    first_shares = [split(secret, 3, 5)[:2] for _ in range(50)]
    assert all(share.y != secret for pair in first_shares for share in pair)
    assert len({pair[0].y for pair in first_shares}) == 50


@pytest.mark.parametrize("call, fragment", [
    (lambda: split(1, 0, 3), "threshold is 0"),
    (lambda: split(1, 4, 3), "threshold 4 exceeds share count 3"),
    (lambda: split(-1, 2, 3), "secret must lie"),
    (lambda: split(PRIME, 2, 3), "secret must lie"),
    (lambda: split(1, 2, 70000), "share count 70000 exceeds"),
    (lambda: reconstruct(split(5, 3, 5)[:2], 3), "only 2 distinct shares for threshold 3"),
    (lambda: reconstruct([Share(1, 4), Share(1, 4), Share(2, 7)], 3), "only 2 distinct"),
    (lambda: reconstruct([Share(1, 4), Share(1, 5), Share(2, 7)], 2), "x = 1 have different y"),
    (lambda: reconstruct([Share(0, 4), Share(1, 5)], 2), "x = 0"),
    (lambda: reconstruct([Share(1, 4)], 0), "threshold is 0"),
    (lambda: split_bytes(bytes(65), 2, 3), "65 bytes"),
    (lambda: reconstruct_bytes(split_bytes(b"\x01\x02", 2, 3), 2, 1), "does not fit in 1 bytes"),
    (lambda: reconstruct_bytes(split_bytes(b"", 2, 3), 2, 65), "length is 65"),
    (lambda: share_from_bytes(bytes(67)), "67 bytes, expected 68"),
    (lambda: share_from_bytes(bytes(69)), "69 bytes, expected 68"),
    (lambda: share_from_bytes(bytes(68)), "x = 0"),
    (lambda: share_from_bytes(b"\x00\x01" + b"\xff" * 66), "y >= PRIME"),
    (lambda: share_to_bytes(Share(70000, 1)), "x = 70000"),
])
def test_bad_inputs_raise_protocol_error_naming_the_problem(call, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        call()


def test_share_encoding_is_fixed_width_big_endian():
    data = share_to_bytes(Share(3, PRIME - 1))
    assert len(data) == 68
    assert data[:2] == b"\x00\x03"
    assert int.from_bytes(data[2:], "big") == PRIME - 1


# -- decode: checking and correcting shares ---------------------------------------------------

def _rational_fit(points: list[tuple[int, int]], x: int) -> Fraction:
    """Reference: the polynomial through ``points`` at x, by Lagrange over the rationals."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(points):
        term = Fraction(yi)
        for j, (xj, _) in enumerate(points):
            if j != i:
                term *= Fraction(x - xj, xi - xj)
        total += term
    return total


def _best_by_brute_force(points: list[tuple[int, int]], t: int):
    """(f(0), xs off f) of the polynomial of degree < t through t of the points that agrees
    with the most of them, exactly over Q with the unreduced y; and that agreement."""
    best = None
    for subset in combinations(points, t):
        off = tuple(x for x, y in points if _rational_fit(list(subset), x) != y)
        if best is None or len(off) < len(best[1]):
            best = (_rational_fit(list(subset), 0), off)
    return best[0], best[1], len(points) - len(best[1])


def _mod_prime(value: Fraction) -> int:
    return value.numerator * pow(value.denominator, -1, PRIME) % PRIME


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_finds_the_polynomial_a_brute_force_search_finds_or_refuses(data):
    t = data.draw(st.integers(1, 4), label="threshold")
    m = data.draw(st.integers(t + 1, 8), label="shares")  # m = t: see the test below
    coefficients = data.draw(st.lists(st.integers(0, 50), min_size=t, max_size=t))
    xs = data.draw(st.permutations(range(1, 12)), label="xs")[:m]
    wrong = data.draw(st.sets(st.sampled_from(range(m)), min_size=1, max_size=m - t),
                      label="wrong")
    offsets = data.draw(st.lists(st.integers(1, 50), min_size=m, max_size=m), label="offsets")
    points = [(x, _evaluate(coefficients, x) + (offsets[i] if i in wrong else 0))
              for i, x in enumerate(xs)]
    secret, off, agreement = _best_by_brute_force(points, t)
    shares = [Share(x, y % PRIME) for x, y in points]
    if 2 * agreement >= m + t:  # then that polynomial is the only one agreeing so often
        event("placed wrong shares" if off else "all consistent")
        found = decode(shares, t)
        assert found.secret == _mod_prime(secret)
        assert sorted(found.inconsistent) == sorted(off)
    else:
        event("too many wrong shares")
        with pytest.raises(ProtocolError, match="decode to no secret"):
            decode(shares, t)


@settings(max_examples=40, deadline=None)
@given(secret=FIELD, data=st.data())
def test_decode_with_a_check_places_one_more_wrong_share(secret, data):
    t = data.draw(st.integers(2, 6), label="threshold")
    m = data.draw(st.integers(t + 1, 12), label="shares")
    honest = split(secret, t, m)
    wrong = (m - t + 1) // 2  # Gao alone places (m - t) // 2
    order = data.draw(st.permutations(range(m)), label="order")
    rng = random.Random(data.draw(st.integers(0, 2**32), label="offsets"))
    shares = list(honest)
    for i in order[:wrong + 1]:  # uniform offsets: a chance agreement has odds about m / PRIME
        shares[i] = Share(shares[i].x, (shares[i].y + rng.randrange(1, PRIME)) % PRIME)
    within = shares[:]
    within[order[wrong]] = honest[order[wrong]]
    found = decode(within, t, accept=lambda v: v == secret)
    assert found.secret == secret
    assert sorted(found.inconsistent) == sorted(i + 1 for i in order[:wrong])
    with pytest.raises(ProtocolError, match="decode to no accepted secret"):
        decode(shares, t, accept=lambda v: v == secret)  # one wrong share too many


def test_beyond_its_reach_colluding_wrong_shares_can_get_a_right_one_named():
    """The limit of naming: holders of x = 2 and 3 (two of four, t = 3) shift their shares by
    e2 and e3 = 3 e2, which cancel at 0 in the interpolation through x = 1, 2, 3 (Lagrange
    coefficients -3 and 1), so that subset passes the check. The secret is right, but the
    honest x = 4 is named: names hold only up to (m - t + 1) / 2 wrong shares."""
    shares = split(77, 3, 4)
    shares[1] = Share(2, (shares[1].y + 1) % PRIME)
    shares[2] = Share(3, (shares[2].y + 3) % PRIME)
    found = decode(shares, 3, accept=lambda v: v == 77)
    assert found == Decoded(77, (4,))


def test_with_exactly_t_shares_a_wrong_one_is_seen_only_through_the_check():
    shares = split(424242, 3, 5)[:3]
    shares[1] = Share(2, (shares[1].y + 1) % PRIME)
    quiet = decode(shares, 3)  # any three points fit a polynomial: nothing looks wrong
    assert quiet.secret != 424242 and quiet.inconsistent == ()
    with pytest.raises(ProtocolError, match="decode to no accepted secret"):
        decode(shares, 3, accept=lambda s: s == 424242)


def test_decode_of_honest_shares_is_reconstruct_and_names_nobody():
    shares = split(2**500 + 3, 4, 9)
    assert decode(shares, 4) == decode(shares[::-1], 4)
    assert decode(shares, 4).secret == reconstruct(shares, 4) == 2**500 + 3
    assert decode(shares, 4).inconsistent == ()
    with pytest.raises(ProtocolError, match="only 3 distinct shares"):
        decode(shares[:3], 4)


@settings(max_examples=60, deadline=None)
@given(secret=st.integers(0, 2**256 - 1), data=st.data())
def test_decode_of_exactly_t_shares_is_reconstruct_right_or_wrong(secret, data):
    """With m = t shares decode takes f(0) from Lagrange weights cached per x-set: it must be
    what reconstruct's own arithmetic gives, for honest shares and for a tampered one (both
    are then f(0) of the one polynomial through the t points)."""
    t = data.draw(st.integers(1, 8))
    count = data.draw(st.integers(t, 12))
    shares = data.draw(st.permutations(split(secret, t, count)))[:t]
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, t - 1))
        shares[i] = Share(shares[i].x, (shares[i].y + data.draw(st.integers(1, PRIME - 1)))
                          % PRIME)
    assert decode(shares, t).secret == reconstruct(shares, t)
    assert decode(shares, t).inconsistent == ()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_secrets_rebuilt_from_one_holder_set_match_rational_lagrange_one_by_one(data):
    """Secure aggregation rebuilds every survivor's seed from the same holders, so decode's
    check and Lagrange weights, computed once per x-set, serve many secrets: each secret of a
    batch, honest or with wrong shares, decodes as the brute-force search over Q finds it one
    by one (or is refused when it finds no polynomial agreeing often enough)."""
    t = data.draw(st.integers(1, 4), label="threshold")
    m = data.draw(st.integers(t, 7), label="shares")
    xs = data.draw(st.permutations(range(1, 12)), label="xs")[:m]
    for _ in range(data.draw(st.integers(2, 4), label="secrets")):
        coefficients = data.draw(st.lists(st.integers(0, 50), min_size=t, max_size=t))
        wrong = data.draw(st.sets(st.sampled_from(range(m)), max_size=m - t), label="wrong")
        points = [(x, _evaluate(coefficients, x) + (7 * i + 1 if i in wrong else 0))
                  for i, x in enumerate(xs)]
        shares = [Share(x, y % PRIME) for x, y in points]
        if m == t:
            assert decode(shares, t).secret == _mod_prime(_lagrange_at_zero(points))
            continue
        secret, off, agreement = _best_by_brute_force(points, t)
        if 2 * agreement >= m + t:
            found = decode(shares, t)
            assert found.secret == _mod_prime(secret)
            assert sorted(found.inconsistent) == sorted(off)
        else:
            with pytest.raises(ProtocolError, match="decode to no secret"):
                decode(shares, t)


def test_wrong_shares_tuned_to_cancel_under_a_fixed_check_are_still_named():
    """Adversary: two share holders who know every holder's x (x is public) and alter their
    shares by e with sum_i u_i e_i = 0, u_i = 1 / prod_{j != i} (x_i - x_j): a check that
    summed the shares with those fixed weights would pass them. decode's check is drawn at
    random, so the pair is still caught and named."""
    shares, xs = split(99, 3, 6), [1, 2, 3, 4, 5, 6]
    u = [pow(math.prod(xi - xj for xj in xs if xj != xi), -1, PRIME) for xi in xs]
    e4 = 1  # e5 chosen so that u_4 e4 + u_5 e5 = 0
    e5 = -u[3] * e4 * pow(u[4], -1, PRIME) % PRIME
    shares[3] = Share(4, (shares[3].y + e4) % PRIME)
    shares[4] = Share(5, (shares[4].y + e5) % PRIME)
    assert decode(shares, 3, accept=lambda v: v == 99) == Decoded(99, (4, 5))
