"""Quantizer: unbiased stochastic rounding, sum error bound, wrap check, modular arithmetic."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secureffm.errors import ProtocolError
from secureffm.protocols import quantize as quantize_module
from secureffm.protocols.prg import word_dtype
from secureffm.protocols.quantize import Quantizer, add_mod, required_bits, sub_mod
from tests.protocols.keystream_reference import mask_keystream


def test_quantize_is_unbiased_and_has_the_rounding_variance():
    clip, reps = 1.0, 40_000
    quant = Quantizer(clip=clip, levels=5, bits=16)  # step 0.5: rounding bias would be visible
    x = np.array([-3.0, -1.0, -0.8, -0.1, 0.0, 0.2, 0.35, 0.5, 0.97, 1.0, 7.0])
    clipped = np.clip(x, -clip, clip)
    q = quant.quantize(np.tile(x, (reps, 1)), np.random.default_rng(0))
    assert q.dtype == np.uint64 and q.shape == (reps, x.size)
    assert q.max() <= quant.levels - 1
    deq = q.astype(np.float64) * quant.step - clip
    frac = (clipped + clip) / quant.step % 1.0
    sd = quant.step * np.sqrt(frac * (1 - frac))  # Bernoulli(frac) times one step
    np.testing.assert_allclose(deq.mean(axis=0), clipped, rtol=0,
                               atol=1e-12 + 5 * sd.max() / np.sqrt(reps))
    assert np.all(np.abs(deq.mean(axis=0) - clipped) <= 1e-12 + 5 * sd / np.sqrt(reps))
    # Points exactly on a level never move; the others spread by one step as predicted.
    np.testing.assert_allclose(deq.std(axis=0), sd, rtol=0.05, atol=1e-12)
    # Only the two neighbouring levels occur.
    low = np.floor((clipped + clip) / quant.step + 1e-12)
    assert np.all((q >= low) & (q <= low + 1))


def test_mean_of_many_clients_through_dequantize_sum_is_unbiased():
    # 0.35 sits 0.3 of a step above level 2: floor would give 0.0, nearest 0.5.
    quant = Quantizer(clip=1.0, levels=5, bits=32)
    n = 40_000
    q = quant.quantize(np.full((n, 1), 0.35), np.random.default_rng(1))
    mean = quant.dequantize_sum(q.sum(axis=0, dtype=np.uint64), n)[0] / n
    sd = quant.step * np.sqrt(0.3 * 0.7) / np.sqrt(n)
    assert abs(mean - 0.35) <= 5 * sd  # 5 sd = 0.0057, well below either rounding bias


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 100), dim=st.integers(1, 16), seed=st.integers(0, 2**32 - 1),
       clip=st.sampled_from([1e-3, 0.5, 1.0, 8.0, 1e4]),
       levels=st.sampled_from([2, 3, 17, 2**10 + 1, 2**22, 2**40, 2**50]),
       extra_bits=st.integers(0, 3))
def test_sum_of_clients_dequantizes_within_error_bound(n, dim, seed, clip, levels, extra_bits):
    bits = min(64, required_bits(n, levels) + extra_bits)
    quant = Quantizer(clip=clip, levels=levels, bits=bits)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3 * clip, 3 * clip, size=(n, dim))
    x[rng.random(x.shape) < 0.1] = clip
    x[rng.random(x.shape) < 0.1] = -clip
    x[rng.random(x.shape) < 0.05] = 1e300
    total = np.zeros(dim, dtype=np.uint64)
    for row in x:
        total = add_mod(total, quant.quantize(row, rng), bits)
    exact = np.clip(x, -clip, clip).sum(axis=0)
    err = np.abs(quant.dequantize_sum(total, n) - exact)
    assert np.all(err <= quant.error_bound(n))


def test_error_bound_formula_and_single_client_roundtrip():
    quant = Quantizer(clip=8.0, levels=2**22, bits=32)
    assert quant.error_bound(10) == pytest.approx(10 * 16.0 / (2**22 - 1), rel=1e-6)
    quant = Quantizer(clip=8.0, levels=2**22 + 1, bits=32)  # odd level count: 0 is a level
    x = np.linspace(-10, 10, 101)
    q = quant.quantize(x, np.random.default_rng(2))
    got = quant.dequantize_sum(q, 1)
    assert np.all(np.abs(got - np.clip(x, -8, 8)) <= quant.error_bound(1))
    assert got[0] == -8.0 and got[-1] == 8.0 and got[50] == 0.0  # exact levels stay exact


def test_check_rejects_possible_wrap_and_accepts_just_below():
    quant = Quantizer(clip=8.0, levels=2**22, bits=32)
    quant.check(1024)  # 1024 * (2**22 - 1) = 2**32 - 1024
    with pytest.raises(ProtocolError, match=r"bits=32.*levels=4194304.*bits >= 33"):
        quant.check(1025)
    edge = Quantizer(clip=1.0, levels=257, bits=16)  # 256 * 256 == 2**16 exactly
    edge.check(255)
    with pytest.raises(ProtocolError, match="bits >= 17"):
        edge.check(256)
    with pytest.raises(ProtocolError, match="n_clients"):
        edge.check(0)
    with pytest.raises(ProtocolError, match="levels <="):
        Quantizer(clip=1.0, levels=2**53, bits=64).check(2**12)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**6), levels=st.integers(2, 2**40), bits=st.integers(1, 64))
def test_check_matches_integer_condition(n, levels, bits):
    if levels - 1 >= 2**bits:
        with pytest.raises(ProtocolError, match="bits"):
            Quantizer(clip=1.0, levels=levels, bits=bits)
        return
    quant = Quantizer(clip=1.0, levels=levels, bits=bits)
    if n * (levels - 1) >= 2**bits:
        with pytest.raises(ProtocolError):
            quant.check(n)
    else:
        quant.check(n)
    need = required_bits(n, levels)
    assert n * (levels - 1) < 2**need and (need == 1 or n * (levels - 1) >= 2 ** (need - 1))


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(clip=0.0, levels=16, bits=32), "clip"),
    (dict(clip=-1.0, levels=16, bits=32), "clip"),
    (dict(clip=float("nan"), levels=16, bits=32), "clip"),
    (dict(clip=float("inf"), levels=16, bits=32), "clip"),
    (dict(clip=1.0, levels=1, bits=32), "levels"),
    (dict(clip=1.0, levels=2.5, bits=32), "levels"),
    (dict(clip=1.0, levels=2**53 + 1, bits=64), "levels"),
    (dict(clip=1.0, levels=16, bits=0), "bits"),
    (dict(clip=1.0, levels=16, bits=65), "bits"),
    (dict(clip=1.0, levels=16, bits=3), "bits"),  # 15 does not fit in 3 bits
])
def test_field_validation_names_the_field(kwargs, field):
    with pytest.raises(ProtocolError, match=field):
        Quantizer(**kwargs)


def test_quantize_rejects_nan_and_dequantize_rejects_impossible_totals():
    quant = Quantizer(clip=1.0, levels=16, bits=32)
    with pytest.raises(ProtocolError, match="NaN"):
        quant.quantize(np.array([0.0, np.nan]), np.random.default_rng(0))
    with pytest.raises(ProtocolError, match="masks did not cancel"):
        quant.dequantize_sum(np.array([31], dtype=np.uint64), 2)  # 2 * 15 = 30 at most
    with pytest.raises(ProtocolError, match="uint64"):
        quant.dequantize_sum(np.array([3], dtype=np.int64), 2)


def _edge_values(bits: int) -> list[int]:
    m = 2**bits
    return [0, 1, 2, m // 2 - 1, m // 2, m - 2, m - 1]


@pytest.mark.parametrize("bits", [16, 32, 63, 64])
def test_add_sub_mod_match_python_ints(bits):
    m = 2**bits
    rng = np.random.default_rng(bits)
    edges = _edge_values(bits)
    a_list = edges * len(edges) + [int(v) for v in rng.integers(0, m, 2000, dtype=np.uint64)]
    b_list = [e for e in edges for _ in edges] + [
        int(v) for v in rng.integers(0, m, 2000, dtype=np.uint64)]
    a = np.array(a_list, dtype=np.uint64)
    b = np.array(b_list, dtype=np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s, d = add_mod(a, b, bits), sub_mod(a, b, bits)
        s0 = add_mod(np.uint64(m - 1), np.uint64(1), bits)  # scalars must not warn either
    assert s.dtype == np.uint64 and d.dtype == np.uint64
    assert [int(v) for v in s] == [(x + y) % m for x, y in zip(a_list, b_list, strict=True)]
    assert [int(v) for v in d] == [(x - y) % m for x, y in zip(a_list, b_list, strict=True)]
    assert int(s0) == 0
    # Wraparound actually happened in the sample, both ways.
    assert any(x + y >= m for x, y in zip(a_list, b_list, strict=True))
    assert any(x < y for x, y in zip(a_list, b_list, strict=True))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), bits=st.sampled_from([16, 32, 63, 64]))
def test_add_sub_mod_hypothesis(data, bits):
    m = 2**bits
    pairs = data.draw(st.lists(st.tuples(st.integers(0, m - 1), st.integers(0, m - 1)),
                               min_size=1, max_size=20))
    a = np.array([p[0] for p in pairs], dtype=np.uint64)
    b = np.array([p[1] for p in pairs], dtype=np.uint64)
    assert [int(v) for v in add_mod(a, b, bits)] == [(x + y) % m for x, y in pairs]
    assert [int(v) for v in sub_mod(a, b, bits)] == [(x - y) % m for x, y in pairs]
    np.testing.assert_array_equal(add_mod(sub_mod(a, b, bits), b, bits), a)


def test_quantizer_mod_helpers_use_its_bits():
    quant = Quantizer(clip=1.0, levels=16, bits=16)
    assert quant.modulus == 2**16
    a = np.array([2**16 - 1], dtype=np.uint64)
    assert int(quant.add_mod(a, np.uint64(2))[0]) == 1
    assert int(quant.sub_mod(np.uint64(0), a)[0]) == 1


def reference_quantize(quant: Quantizer, x: list[float], scale: float, key: bytes
                       ) -> tuple[list[int], int]:
    """The fixed-point rounding of the module docstring written out per element with Python
    floats and integers: v = (clip(scale x) + c) * 2**F (L - 1) / (2 c), capped at (L - 1) 2**F;
    q = (floor(v) + r) >> F with r the top F bits of 32-bit little-endian keystream word i of
    AES-128-CTR(key[:16]); and the count of clipped entries."""
    frac, c = quant.fraction_bits, quant.clip
    lift, top = 2.0**frac * ((quant.levels - 1) / (2 * c)), float(quant.levels - 1) * 2.0**frac
    stream = mask_keystream(key, 4 * len(x))
    out, clipped = [], 0
    for i, value in enumerate(x):
        scaled = value * scale
        clipped += abs(scaled) > c
        v = min((min(max(scaled, -c), c) + c) * lift, top)
        r = int.from_bytes(stream[4 * i: 4 * i + 4], "little") >> (32 - frac)
        out.append((int(v) + r) >> frac)
    return out, clipped


@settings(max_examples=60, deadline=None)
@given(data=st.data(), levels=st.sampled_from([2, 5, 2**10 + 1, 2**22, 2**32, 2**40, 2**53]),
       extra_bits=st.integers(0, 3), length=st.integers(0, 90),
       chunk=st.sampled_from([1, 7, 16, 64, quantize_module.CHUNK_WORDS]),
       clip=st.sampled_from([1.5, 0.7, 1.3]), scale=st.sampled_from([1.0, 0.37, 2.5]),
       seed=st.integers(0, 2**32 - 1), single=st.booleans())
def test_quantize_into_matches_the_reference_bit_for_bit(data, levels, extra_bits, length,
                                                         chunk, clip, scale, seed, single):
    # clip 0.7 and 1.3 at 2**32 levels: 2 clip * (levels - 1) / (2 clip) rounds above
    # levels - 1, so the cap at (levels - 1) 2**F is exercised.
    bits = min(64, required_bits(1, levels) + extra_bits)
    quant = Quantizer(clip=clip, levels=levels, bits=bits)
    x = data.draw(st.lists(st.one_of(st.floats(-4.0, 4.0), st.sampled_from([-clip, 0.0, clip])),
                           min_size=length, max_size=length))
    x = np.array(x, dtype=np.float32 if single else np.float64)
    out = np.zeros(length, dtype=word_dtype(bits))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_module, "CHUNK_WORDS", chunk)
        clipped = quant.quantize_into(x, out, np.random.default_rng(seed), scale)
    want, want_clipped = reference_quantize(quant, [float(v) for v in x], scale,
                                            np.random.default_rng(seed).bytes(32))
    assert [int(v) for v in out] == want and clipped == want_clipped
    assert all(v <= levels - 1 for v in want)


def test_quantize_into_refuses_inf_and_words_too_narrow():
    quant = Quantizer(clip=1.0, levels=16, bits=32)
    with pytest.raises(ProtocolError, match="NaN or Inf"):
        quant.quantize_into(np.array([0.0, np.inf]), np.zeros(2, dtype=np.uint32),
                            np.random.default_rng(0))
    with pytest.raises(ProtocolError, match="quantize_into needs"):
        Quantizer(clip=1.0, levels=2**40, bits=48).quantize_into(
            np.zeros(2), np.zeros(2, dtype=np.uint32), np.random.default_rng(0))
    with pytest.raises(ProtocolError, match="quantize_into needs"):
        quant.quantize_into(np.zeros(3), np.zeros(2, dtype=np.uint32), np.random.default_rng(0))


def test_reduce_keeps_the_low_bits_in_place():
    words = np.array([2**32 - 1, 5], dtype=np.uint32)
    assert Quantizer(clip=1.0, levels=2, bits=3).reduce(words) is words
    assert words.tolist() == [7, 5]
    wide = np.array([2**64 - 1], dtype=np.uint64)
    assert Quantizer(clip=1.0, levels=2, bits=64).reduce(wide).tolist() == [2**64 - 1]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), bits=st.integers(1, 32))
def test_noisy_dequantize_reads_32_bit_words_as_the_general_path_does(data, bits):
    # The uint32 path (sign extension in 32-bit words) against the general uint64 one and
    # against Python integers: the residue nearest the centre of [0, n (levels - 1)].
    n = data.draw(st.integers(1, min(8, 2**bits - 1)))
    levels = data.draw(st.integers(2, (2**bits - 1) // n + 1))
    quant = Quantizer(clip=1.5, levels=levels, bits=bits)
    totals = data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=1, max_size=40))
    narrow = quant.dequantize_sum(np.array(totals, dtype=np.uint32), n, noisy=True)
    wide = quant.dequantize_sum(np.array(totals, dtype=np.uint64), n, noisy=True)
    np.testing.assert_array_equal(narrow, wide)
    centre, m = n * (levels - 1) // 2, 2**bits
    nearest = [(t - centre) % m - (m if (t - centre) % m >= m // 2 else 0) + centre
               for t in totals]
    np.testing.assert_array_equal(narrow, [float(v) * quant.step - n * 1.5 for v in nearest])


def test_one_malicious_input_moves_the_decoded_sum_by_n_times_clip_not_clip():
    """Adversary: a malicious client under secure aggregation. Its masked input looks uniform,
    so only the sum is checked, and the sum only to lie in n clients' range: one client can
    send any word that keeps it there (no range proofs) and move each coordinate of the sum by
    n x clip, n times what one honest input can (privacy.json lists this among its
    exclusions)."""
    q, n = Quantizer(clip=8.0, levels=2**22, bits=32), 10
    honest = [q.quantize(np.zeros(3), np.random.default_rng(i)) for i in range(n - 1)]
    others = np.sum(np.stack(honest).astype(np.uint64), axis=0)
    forged = (n * (q.levels - 1) - others).astype(np.uint32)  # the top of the sum's range
    assert (forged > q.levels - 1).all()  # no honest client can send it
    total = add_mod(np.sum(np.stack(honest), axis=0, dtype=np.uint32), forged, 32)
    moved = q.dequantize_sum(total, n) - q.dequantize_sum(
        add_mod(np.sum(np.stack(honest), axis=0, dtype=np.uint32), honest[0], 32), n)
    assert np.allclose(moved, n * q.clip, atol=n * q.step)  # the honest inputs round
