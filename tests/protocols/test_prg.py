"""Seed expansion: ChaCha20 keystream per RFC 8439, little-endian words, uniform, hides updates."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from secureffm.errors import ProtocolError
from secureffm.protocols import prg
from secureffm.protocols.prg import add_masks, expand_seed, keystream_throughput, word_dtype
from secureffm.protocols.quantize import Quantizer, add_mod, sub_mod

# RFC 8439 section 2.3.2: key 00..1f, nonce 000000090000004a00000000, block counter 1.
RFC_232 = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
# RFC 8439 appendix A.1, test vectors 1 and 2: zero key, zero nonce, block counters 0 and 1.
RFC_A1 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f"
)

N_WORDS = 200_000
P_MIN = 1e-4


def _chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """Pure-Python ChaCha20 block function (RFC 8439 section 2.3), independent of our code."""
    mask = 0xFFFFFFFF

    def rotl(v: int, c: int) -> int:
        return ((v << c) & mask) | (v >> (32 - c))

    def qr(s: list[int], a: int, b: int, c: int, d: int) -> None:
        s[a] = (s[a] + s[b]) & mask
        s[d] = rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & mask
        s[b] = rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & mask
        s[d] = rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & mask
        s[b] = rotl(s[b] ^ s[c], 7)

    init = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *struct.unpack("<8I", key),
            counter, *struct.unpack("<3I", nonce)]
    s = list(init)
    for _ in range(10):
        qr(s, 0, 4, 8, 12), qr(s, 1, 5, 9, 13), qr(s, 2, 6, 10, 14), qr(s, 3, 7, 11, 15)
        qr(s, 0, 5, 10, 15), qr(s, 1, 6, 11, 12), qr(s, 2, 7, 8, 13), qr(s, 3, 4, 9, 14)
    return struct.pack("<16I", *[(x + y) & mask for x, y in zip(s, init, strict=True)])


def _chi2_p(words: np.ndarray, bits: int) -> tuple[float, float]:
    """Chi-square p-values of the top 8 and the low 8 bits of ``bits``-bit words."""
    top = (words >> np.uint64(bits - 8)) & np.uint64(0xFF)
    low = words & np.uint64(0xFF)
    return tuple(float(chisquare(np.bincount(v.astype(np.int64), minlength=256)).pvalue)
                 for v in (top, low))


def test_reference_block_function_matches_rfc():
    assert _chacha20_block(bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000")) \
        == RFC_232
    assert _chacha20_block(bytes(32), 0, bytes(12)) + _chacha20_block(bytes(32), 1, bytes(12)) \
        == RFC_A1


def test_cryptography_nonce_is_counter_then_rfc_nonce():
    # cryptography's 16-byte nonce = 4-byte little-endian block counter + the RFC's 12 bytes.
    nonce = (1).to_bytes(4, "little") + bytes.fromhex("000000090000004a00000000")
    enc = Cipher(algorithms.ChaCha20(bytes(range(32)), nonce), mode=None).encryptor()
    assert enc.update(bytes(64)) == RFC_232


def test_expand_seed_matches_rfc_words_little_endian():
    words = expand_seed(bytes(32), 16, 64)  # bits > 32: 8 keystream bytes per word
    assert words.dtype == np.uint64 and words.shape == (16,)
    assert int(words[0]) == 0x903DF1A0ADE0B876  # bytes 76 b8 e0 ad a0 f1 3d 90, little-endian
    assert [int(w) for w in words] == [int.from_bytes(RFC_A1[8 * i: 8 * i + 8], "little")
                                       for i in range(16)]
    words = expand_seed(bytes(32), 16, 32)  # bits <= 32: 4 keystream bytes per word
    assert words.dtype == np.uint64 and int(words[0]) == 0xADE0B876
    assert [int(w) for w in words] == [int.from_bytes(RFC_A1[4 * i: 4 * i + 4], "little")
                                       for i in range(16)]
    assert [int(w) for w in expand_seed(bytes(32), 16, 20)] == [int(w) & (2**20 - 1)
                                                                 for w in words]


@pytest.mark.parametrize("bits", [64, 33, 32, 13, 1])
def test_expand_seed_matches_reference_chacha20_over_blocks(bits):
    seed = bytes(np.random.default_rng(bits).integers(0, 256, 32, dtype=np.uint8))
    width = 4 if bits <= 32 else 8
    length = 37  # words: over two (4-byte) or four (8-byte) 64-byte blocks and part of the next
    stream = b"".join(_chacha20_block(seed, c, bytes(12)) for c in range(5))
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
    single ``cryptography`` call, word i = bytes w i .. w i + w - 1 little-endian (w = 4 for
    bits <= 32, else 8), ``(q + sum plus - sum minus) mod 2**bits``."""
    width, out = (4 if bits <= 32 else 8), list(q)
    for seeds, sign in ((plus, 1), (minus, -1)):
        for seed in seeds:
            stream = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor().update(
                bytes(width * len(q)))
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
