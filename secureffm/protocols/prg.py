"""Cryptographic PRG that expands a 32-byte seed into a mask vector in Z_{2^bits}.

The keystream is ChaCha20 (RFC 8439) from ``cryptography``, keyed by the seed, with a zero
16-byte nonce (``cryptography`` reads it as a 4-byte little-endian block counter followed by the
RFC's 12-byte nonce, so the stream starts at block 0). A zero nonce is safe because each seed
keys one stream only: seeds are fresh HKDF outputs per pair (or per client) and round.
A client masks its quantized update ``q`` as ``q + sum_j +-expand_seed(s_ij) + expand_seed(b_i)``
modulo ``2**bits``.
"""

from __future__ import annotations

import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

from ..errors import ProtocolError

__all__ = ["SEED_BYTES", "expand_seed", "keystream_throughput"]

SEED_BYTES = 32
_NONCE = bytes(16)
# ChaCha20's 32-bit block counter limits one stream to 2**32 blocks of 64 bytes.
_MAX_WORDS = 2**32 * 64 // 8


def _encryptor(key: bytes) -> CipherContext:
    return Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()


def expand_seed(seed: bytes, length: int, bits: int) -> np.ndarray:
    """Mask vector of shape ``[length]``, uint64, each entry uniform in ``[0, 2**bits)``.

    Entry ``i`` is keystream bytes ``8i .. 8i+7`` read as a little-endian uint64, keeping the
    low ``bits`` bits. Deterministic in ``seed`` (exactly 32 bytes, else ProtocolError).
    """
    if not isinstance(seed, bytes | bytearray | memoryview) or len(seed) != SEED_BYTES:
        got = len(seed) if isinstance(seed, bytes | bytearray | memoryview) else type(seed)
        raise ProtocolError(f"a mask seed must be exactly {SEED_BYTES} bytes, got {got}")
    if not 1 <= bits <= 64:
        raise ProtocolError(f"bits must be in [1, 64], got {bits}")
    if not 0 <= length <= _MAX_WORDS:
        raise ProtocolError(f"length must be in [0, {_MAX_WORDS}], got {length}")
    out = bytearray(length * 8)
    if length:
        _encryptor(bytes(seed)).update_into(bytes(length * 8), out)
    words = np.frombuffer(out, dtype="<u8").astype(np.uint64, copy=False)
    if bits < 64:
        np.bitwise_and(words, np.uint64((1 << bits) - 1), out=words)
    return words


def keystream_throughput(nbytes: int = 64 * 2**20, repeats: int = 3) -> float:
    """Raw ChaCha20 keystream speed in bytes per second (best of ``repeats``, one thread).

    Encrypts ``nbytes`` zero bytes into a preallocated buffer, so allocation is not timed: the
    ceiling that :func:`expand_seed` plus modular masking can be compared against.
    """
    if nbytes < 1 or repeats < 1:
        raise ProtocolError(f"nbytes and repeats must be >= 1, got {nbytes}, {repeats}")
    zeros = bytes(nbytes)
    out = bytearray(nbytes)
    best = float("inf")
    for i in range(repeats):
        encryptor = _encryptor(i.to_bytes(SEED_BYTES, "little"))
        start = time.perf_counter()
        encryptor.update_into(zeros, out)
        best = min(best, time.perf_counter() - start)
    return nbytes / best
