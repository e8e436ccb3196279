"""Cryptographic PRG that expands a 32-byte seed into a mask vector in Z_{2^bits}.

The keystream is AES-128 in counter mode (NIST SP 800-38A) from ``cryptography``: the seed's
first 16 bytes are the key, its last 16 the initial 128-bit counter block (big-endian,
incremented per 16-byte block, modulo 2**128), so every byte of the seed moves the stream. Each
seed keys one stream only: seeds are fresh HKDF outputs per pair (or per client) and round, or
32 bytes of OS entropy, so a (key, counter) pair repeats only if two independent seeds share
their key half (probability 2**-128 per pair of seeds).

Why 128-bit keys: every pair seed comes from an X25519 agreement, about 128 bits of security
(the level NIST pairs with AES-128), so a 256-bit key adds nothing an attacker on the pair
secrets would meet first; the first 16 bytes of a uniform 32-byte seed are a uniform 128-bit
key. Measured here: AES-128-CTR 6.5 GB/s against AES-256-CTR's 5.1 (one core, 4 MB buffers),
1.29x on the keystream that is most of a secure round (docs/benchmarks.md). AES-CTR runs at
about 2x ChaCha20's speed on CPUs with AES instructions.

Masks are words of :func:`word_dtype` (``bits``): entry ``i`` is keystream bytes
``w i .. w i + w - 1`` (``w`` = 4 for ``bits <= 32``, else 8) read as a little-endian
unsigned integer, keeping its low ``bits`` bits. A client masks its quantized update ``q`` as
``q + sum_j +-PRG(s_ij) + PRG(b_i)`` modulo ``2**bits``; :func:`add_masks` does this in place
in the word type, whose wrap-around is arithmetic modulo ``2**32`` (or ``2**64``), a multiple
of ``2**bits``, so a final ``& (2**bits - 1)`` gives the result modulo ``2**bits``.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from ..errors import ProtocolError

__all__ = ["SEED_BYTES", "Keystream", "MaskStreams", "add_masks", "expand_seed",
           "keystream_throughput", "word_dtype"]

SEED_BYTES = 32
_KEY_BYTES = 16  # AES-128: the seed's first 16 bytes key the stream, the rest start the counter
# One stream is at most 2**32 blocks of 16 bytes (64 GiB): there AES-CTR is distinguishable
# from random with advantage about q**2 / 2**129 = 2**-65 (no two counter blocks repeat).
_MAX_BYTES = 2**32 * 16
# Words per chunk of add_masks and Quantizer.quantize_into: large enough that the Python loop
# costs little, small enough that a chunk (256 KiB of uint32 words) stays in cache while every
# seed's keystream is added to it; a multiple of 16 (one 64-byte block of uint32 words).
CHUNK_WORDS = 65536
_ZEROS = np.zeros(8 * CHUNK_WORDS, dtype=np.uint8)  # the plaintext a keystream chunk encrypts


def word_dtype(bits: int) -> np.dtype:
    """The unsigned type that masks of ``bits`` (1..64) bits are drawn and added in: uint32 up
    to 32 bits (4 keystream bytes per word), else uint64 (8 bytes)."""
    if not isinstance(bits, numbers.Integral) or isinstance(bits, bool) or not 1 <= bits <= 64:
        raise ProtocolError(f"bits must be an integer in [1, 64], got {bits!r}")
    return np.dtype(np.uint32 if bits <= 32 else np.uint64)


def _check_seed(seed: bytes) -> bytes:
    if not isinstance(seed, bytes | bytearray | memoryview) or len(seed) != SEED_BYTES:
        got = len(seed) if isinstance(seed, bytes | bytearray | memoryview) else type(seed)
        raise ProtocolError(f"a mask seed must be exactly {SEED_BYTES} bytes, got {got}")
    return bytes(seed)


def _encryptor(seed: bytes) -> CipherContext:
    """AES-128-CTR keyed by the first 16 bytes of the 32-byte ``seed``, its counter starting at
    the last 16."""
    return Cipher(algorithms.AES(seed[:_KEY_BYTES]), modes.CTR(seed[_KEY_BYTES:])).encryptor()


class Keystream:
    """The AES-128-CTR keystream of one 32-byte seed, read front to back into arrays."""

    def __init__(self, seed: bytes):
        self._cipher = _encryptor(_check_seed(seed))

    def fill(self, out: np.ndarray) -> np.ndarray:
        """Write the next ``out.nbytes`` keystream bytes into ``out`` (C-contiguous, at most
        ``8 * CHUNK_WORDS`` bytes per call); returns ``out``."""
        self.fill_bytes(memoryview(out).cast("B"))
        return out

    def fill_bytes(self, out: memoryview) -> None:
        """Write the next ``len(out)`` (at most ``8 * CHUNK_WORDS``) keystream bytes into the
        byte view ``out``."""
        self._cipher.update_into(_ZEROS[:len(out)], out)


class MaskStreams:
    """The masks of ``plus`` and ``minus`` seeds over a vector of ``size`` words of ``dtype``
    (uint32 or uint64), read front to back one chunk at a time: :meth:`add_into` adds the next
    ``part.size`` words of each ``plus`` seed's keystream to ``part`` and subtracts each
    ``minus`` seed's, in place, modulo ``2**(8 * itemsize)``. A chunk is at most ``chunk``
    words; one scratch chunk holds each keystream piece while it is added (in cache).

    :func:`add_masks` walks a whole vector with it; the fused paths of
    :mod:`~secureffm.protocols.masking` call it on a chunk they have just quantized or summed.
    """

    def __init__(self, dtype: np.dtype, size: int, plus: Sequence[bytes] = (),
                 minus: Sequence[bytes] = (), chunk: int | None = None):
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.uint32, np.uint64):
            raise ProtocolError(f"masks are added in uint32 or uint64 words, not {self.dtype}")
        if size * self.dtype.itemsize > _MAX_BYTES:
            raise ProtocolError(f"a mask of {size} words exceeds one seed's keystream")
        chunk = CHUNK_WORDS if chunk is None else chunk
        self._update = ([(_encryptor(_check_seed(s)).update_into, np.add) for s in plus]
                        + [(_encryptor(_check_seed(s)).update_into, np.subtract)
                           for s in minus])
        self._scratch = np.empty(max(0, min(chunk, size)), dtype=self.dtype)
        self._raw = memoryview(self._scratch).cast("B")
        nbytes = self._scratch.nbytes
        self._zeros = _ZEROS if nbytes <= _ZEROS.size else np.zeros(nbytes, dtype=np.uint8)

    def __len__(self) -> int:
        """How many keystreams are added or subtracted."""
        return len(self._update)

    def add_into(self, part: np.ndarray) -> None:
        """``part += sum PRG(plus) - sum PRG(minus)`` over the streams' next ``part.size``
        words (``part``: 1-D contiguous, of this dtype, at most one chunk)."""
        if part.size > self._scratch.size:
            raise ProtocolError(f"a chunk of {part.size} words exceeds the "
                                f"{self._scratch.size} this mask was set up for")
        nbytes = part.nbytes
        words, raw, zeros = self._scratch[:part.size], self._raw[:nbytes], self._zeros[:nbytes]
        for update, op in self._update:
            update(zeros, raw)
            op(part, words, out=part)


def add_masks(y: np.ndarray, plus: Sequence[bytes] = (), minus: Sequence[bytes] = ()) -> None:
    """In place: ``y += sum PRG(plus) - sum PRG(minus)`` modulo ``2**(8 * y.itemsize)``.

    ``y``: 1-D C-contiguous uint32 or uint64, shape ``[d]``; each seed's mask is its first
    ``d`` words of the word type of ``y``. Works through ``y`` in chunks of
    :data:`CHUNK_WORDS` words, adding every seed's chunk while it is in cache
    (:class:`MaskStreams`).
    """
    if y.ndim != 1 or y.dtype not in (np.uint32, np.uint64) or not y.flags.c_contiguous or (
            not y.flags.writeable):
        raise ProtocolError(f"add_masks needs a writable 1-D contiguous uint32 or uint64 "
                            f"array, got {y.dtype} of shape {y.shape}")
    chunk = CHUNK_WORDS
    masks = MaskStreams(y.dtype, y.size, plus, minus, chunk)
    if not len(masks):
        return
    for start in range(0, y.size, chunk):
        masks.add_into(y[start:start + chunk])


def expand_seed(seed: bytes, length: int, bits: int) -> np.ndarray:
    """Mask vector of shape ``[length]``, uint64, each entry uniform in ``[0, 2**bits)``.

    Entry ``i`` is word ``i`` of the seed's keystream in :func:`word_dtype` ``(bits)``, low
    ``bits`` bits kept (module docstring). Deterministic in ``seed`` (exactly 32 bytes, else
    ProtocolError).
    """
    dtype = word_dtype(bits)
    if not 0 <= length <= _MAX_BYTES // dtype.itemsize:
        raise ProtocolError(f"length must be in [0, {_MAX_BYTES // dtype.itemsize}], got "
                            f"{length}")
    words = np.zeros(length, dtype=dtype)
    add_masks(words, [seed])
    if bits < 8 * dtype.itemsize:
        np.bitwise_and(words, dtype.type((1 << bits) - 1), out=words)
    return words.astype(np.uint64, copy=False)


def keystream_throughput(nbytes: int = 64 * 2**20, repeats: int = 3,
                         clock: Callable[[], float] = time.perf_counter) -> float:
    """Raw AES-128-CTR keystream speed in bytes per second (best of ``repeats``, one thread).

    Encrypts ``nbytes`` zero bytes into a preallocated buffer in one call, so allocation is not
    timed: the ceiling that masking (:func:`add_masks`) can be compared against. ``clock``:
    wall time by default; ``time.process_time`` counts only this process's CPU time.
    """
    if nbytes < 1 or repeats < 1:
        raise ProtocolError(f"nbytes and repeats must be >= 1, got {nbytes}, {repeats}")
    zeros = bytearray(nbytes)  # written, unlike bytes(n): no first-touch page faults timed
    out = bytearray(nbytes)
    best = float("inf")
    for i in range(repeats):
        encryptor = _encryptor(i.to_bytes(SEED_BYTES, "little"))
        start = clock()
        encryptor.update_into(zeros, out)
        best = min(best, clock() - start)
    return nbytes / best
