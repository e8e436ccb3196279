"""Seed expansion: AES-128-CTR keystream (NIST SP 800-38A), little-endian words, uniform, hides
updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from secureffm.errors import ProtocolError
from secureffm.protocols import prg
from secureffm.protocols.prg import add_masks, expand_seed, keystream_throughput, word_dtype
from secureffm.protocols.quantize import Quantizer, add_mod, sub_mod
from tests.protocols.keystream_reference import aes_ctr_keystream, mask_keystream

# NIST SP 800-38A, F.5.5 (CTR-AES256.Encrypt): key, initial counter, plaintext, ciphertext.
SP800_KEY = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
SP800_COUNTER = 0xF0F1F2F3F4F5F6F7F8F9FAFBFCFDFEFF
SP800_PLAIN = bytes.fromhex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51")
SP800_CIPHER = bytes.fromhex("601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5")

N_WORDS = 200_000
P_MIN = 1e-4


def _chi2_p(words: np.ndarray, bits: int) -> tuple[float, float]:
    """Chi-square p-values of the top 8 and the low 8 bits of ``bits``-bit words."""
    top = (words >> np.uint64(bits - 8)) & np.uint64(0xFF)
    low = words & np.uint64(0xFF)
    return tuple(float(chisquare(np.bincount(v.astype(np.int64), minlength=256)).pvalue)
                 for v in (top, low))


# F.5.1 (CTR-AES128.Encrypt), same counter and plaintext: the masks' cipher.
SP800_KEY_128 = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
SP800_CIPHER_128 = bytes.fromhex("874d6191b620e3261bef6864990db6ce9806f66b7970fdff8617187bb9fffdff")


@pytest.mark.parametrize("key, cipher", [(SP800_KEY, SP800_CIPHER),
                                         (SP800_KEY_128, SP800_CIPHER_128)])
def test_the_reference_keystream_matches_the_nist_vectors(key, cipher):
    stream = aes_ctr_keystream(key, 32, SP800_COUNTER)
    assert bytes(a ^ b for a, b in zip(stream, SP800_PLAIN, strict=True)) == cipher


def test_a_mask_seed_keys_aes_128_and_starts_its_counter():
    """The first half of a seed is the key, the second the initial counter block: a seed whose
    counter half is one block further gives the same stream one block (4 words) later, and a
    counter at 2**128 - 1 wraps to zero as the reference does."""
    seed = bytes(range(32))
    later = seed[:16] + (int.from_bytes(seed[16:], "big") + 1).to_bytes(16, "big")
    np.testing.assert_array_equal(expand_seed(later, 8, 32), expand_seed(seed, 12, 32)[4:])
    wrapping = seed[:16] + b"\xff" * 16
    stream = mask_keystream(wrapping, 32)
    assert [int(w) for w in expand_seed(wrapping, 8, 32)] == [
        int.from_bytes(stream[4 * i: 4 * i + 4], "little") for i in range(8)]
    assert stream[16:] == mask_keystream(seed[:16] + bytes(16), 16)


def test_expand_seed_reads_the_keystream_as_little_endian_words():
    stream = mask_keystream(bytes(32), 128)
    words = expand_seed(bytes(32), 16, 64)  # bits > 32: 8 keystream bytes per word
    assert words.dtype == np.uint64 and words.shape == (16,)
    assert [int(w) for w in words] == [int.from_bytes(stream[8 * i: 8 * i + 8], "little")
                                       for i in range(16)]
    words = expand_seed(bytes(32), 16, 32)  # bits <= 32: 4 keystream bytes per word
    assert words.dtype == np.uint64
    assert [int(w) for w in words] == [int.from_bytes(stream[4 * i: 4 * i + 4], "little")
                                       for i in range(16)]
    assert [int(w) for w in expand_seed(bytes(32), 16, 20)] == [int(w) & (2**20 - 1)
                                                                 for w in words]


@pytest.mark.parametrize("bits", [64, 33, 32, 13, 1])
def test_expand_seed_matches_the_reference_keystream_over_blocks(bits):
    seed = bytes(np.random.default_rng(bits).integers(0, 256, 32, dtype=np.uint8))
    width = 4 if bits <= 32 else 8
    length = 37  # words: over 9 (4-byte) or 18 (8-byte) 16-byte blocks and part of the next
    stream = mask_keystream(seed, width * length)
    want = [int.from_bytes(stream[width * i: width * i + width], "little") % 2**bits
            for i in range(length)]
    got = expand_seed(seed, length, bits)
    assert [int(w) for w in got] == want
    # A prefix of a longer stream is the shorter stream.
    np.testing.assert_array_equal(expand_seed(seed, 5, bits), got[:5])


def test_deterministic_and_seed_dependent():
    a, b = b"\x01" * 32, b"\x01" * 31 + b"\x02"
    np.testing.assert_array_equal(expand_seed(a, 1000, 32), expand_seed(a, 1000, 32))
    assert np.mean(expand_seed(a, 1000, 32) == expand_seed(b, 1000, 32)) < 0.01
    assert expand_seed(a, 0, 32).shape == (0,)


@pytest.mark.parametrize("seed", [b"", bytes(16), bytes(31), bytes(33), bytes(64)])
def test_wrong_seed_length_raises(seed):
    with pytest.raises(ProtocolError, match="32 bytes"):
        expand_seed(seed, 10, 32)


def test_bad_bits_or_length_raise():
    with pytest.raises(ProtocolError, match="bits"):
        expand_seed(bytes(32), 10, 0)
    with pytest.raises(ProtocolError, match="bits"):
        expand_seed(bytes(32), 10, 65)
    with pytest.raises(ProtocolError, match="length"):
        expand_seed(bytes(32), -1, 32)


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_output_is_uniform(bits):
    words = expand_seed(bytes(range(32)), N_WORDS, bits)
    assert int(words.max()) < 2**bits
    p_top, p_low = _chi2_p(words, bits)
    assert p_top > P_MIN and p_low > P_MIN


def test_chi_square_detects_nonuniform_words():
    # The uniformity check has power: a slight skew of the top byte is rejected.
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, N_WORDS, dtype=np.uint64)
    words[: N_WORDS // 20] &= np.uint64(0x7FFFFFFF)  # 5% forced into the lower half
    assert _chi2_p(words, 32)[0] < P_MIN


def test_masking_hides_the_update():
    bits = 32
    mask = expand_seed(bytes(range(100, 132)), N_WORDS, bits)
    zeros = np.zeros(N_WORDS, dtype=np.uint64)
    const = np.full(N_WORDS, 0xDEADBEEF, dtype=np.uint64)
    masked_zeros, masked_const = add_mod(zeros, mask, bits), add_mod(const, mask, bits)
    # Unmasked vectors are maximally non-uniform; masked ones are indistinguishable from uniform.
    assert max(_chi2_p(zeros, bits)) < P_MIN and max(_chi2_p(const, bits)) < P_MIN
    assert min(_chi2_p(masked_zeros, bits)) > P_MIN
    assert min(_chi2_p(masked_const, bits)) > P_MIN
    assert np.count_nonzero(masked_zeros) > 0.99 * N_WORDS
    # Whoever holds the seed removes the mask exactly.
    np.testing.assert_array_equal(sub_mod(masked_const, expand_seed(
        bytes(range(100, 132)), N_WORDS, bits), bits), const)


def test_pairwise_masks_cancel_in_the_sum():
    bits, n = 24, 1000
    rng = np.random.default_rng(3)
    q1, q2 = (rng.integers(0, 2**10, n, dtype=np.uint64) for _ in range(2))
    pair = expand_seed(bytes(range(32)), n, bits)
    y1, y2 = add_mod(q1, pair, bits), sub_mod(q2, pair, bits)  # client 1 adds, client 2 subtracts
    assert not np.array_equal(y1, q1)
    np.testing.assert_array_equal(add_mod(y1, y2, bits), q1 + q2)


def reference_masked(q: list[int], plus: list[bytes], minus: list[bytes], bits: int) -> list[int]:
    """The mask path written out plainly: Python integers, one whole keystream per seed from a
    single reference call, word i = bytes w i .. w i + w - 1 little-endian (w = 4 for
    bits <= 32, else 8), ``(q + sum plus - sum minus) mod 2**bits``."""
    width, out = (4 if bits <= 32 else 8), list(q)
    for seeds, sign in ((plus, 1), (minus, -1)):
        for seed in seeds:
            stream = mask_keystream(seed, width * len(q))
            for i in range(len(q)):
                out[i] += sign * int.from_bytes(stream[width * i: width * i + width], "little")
    return [v % 2**bits for v in out]


def fast_masked(q: list[int], plus: list[bytes], minus: list[bytes], bits: int) -> list[int]:
    """The fast path: words of ``word_dtype(bits)`` masked in place, then reduced."""
    y = np.array(q, dtype=word_dtype(bits))
    add_masks(y, plus, minus)
    return [int(v) for v in Quantizer(1.0, 2, bits).reduce(y)]


_SEEDS = st.binary(min_size=32, max_size=32)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), bits=st.sampled_from([1, 7, 16, 31, 32, 33, 48, 63, 64]),
       length=st.integers(0, 150), chunk=st.sampled_from([1, 5, 16, 17, 64, prg.CHUNK_WORDS]),
       plus=st.lists(_SEEDS, max_size=4), minus=st.lists(_SEEDS, max_size=4))
def test_add_masks_matches_the_reference_bit_for_bit(data, bits, length, chunk, plus, minus):
    # Sizes that are no multiple of a 64-byte block or of the chunk, chunks that split a block.
    q = data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=length, max_size=length))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prg, "CHUNK_WORDS", chunk)
        assert fast_masked(q, plus, minus, bits) == reference_masked(q, plus, minus, bits)


@pytest.mark.parametrize("bits", [32, 64])
def test_add_masks_matches_the_reference_across_a_full_chunk(bits):
    d = prg.CHUNK_WORDS + 37  # past the first chunk, into a partial second one
    q = [int(v) for v in np.random.default_rng(bits).integers(0, 2**bits, d, dtype=np.uint64)]
    plus, minus = [bytes([1]) * 32, bytes([2]) * 32], [bytes([3]) * 32]
    assert fast_masked(q, plus, minus, bits) == reference_masked(q, plus, minus, bits)


def test_add_masks_refuses_arrays_it_cannot_mask_in_place():
    for bad in (np.zeros(4, dtype=np.int64), np.zeros((2, 2), dtype=np.uint32),
                np.zeros(8, dtype=np.uint32)[::2]):
        with pytest.raises(ProtocolError, match="add_masks needs"):
            add_masks(bad, [bytes(32)])
    with pytest.raises(ProtocolError, match="32 bytes"):
        add_masks(np.zeros(4, dtype=np.uint32), [bytes(31)])


def test_keystream_throughput_is_positive():
    assert keystream_throughput(2**20, repeats=1) > 0
