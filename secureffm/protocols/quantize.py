"""Clip and stochastically quantize real updates into Z_{2^bits} for secure aggregation.

Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017) adds masks modulo ``2**bits``, so
each client first maps its real update to integers. With step ``s = 2 * clip / (levels - 1)``:

.. math::

    v = (\\mathrm{clip}(x) + c) / s \\in [0, L - 1], \\qquad
    q = \\lfloor (\\lfloor 2^F v \\rfloor + r) / 2^F \\rfloor, \\quad
    r \\sim U\\{0, \\dots, 2^F - 1\\},

stochastic rounding in fixed point with ``F = min(32, 64 - bitlength(L - 1))`` fraction bits:
``q = floor(v) + 1`` with probability ``frac(v)`` truncated to ``F`` bits, so ``E[q] = v`` up to
``2**-F`` of a step (none where float64 holds ``v`` to ``F`` bits or fewer, as for
``v >= 2**(53 - F)``), and ``q * s - c`` estimates the clipped update. ``r`` is read from an
AES-128-CTR keystream (:mod:`.prg`) keyed by 32 bytes drawn from the caller's generator. The
server's unmasked total is ``sum_i q_i``; it equals the true integer sum as long as
``n * (L - 1) < 2**bits`` (:meth:`Quantizer.check`). :meth:`Quantizer.dequantize_sum` checks
only that the total lies in ``[0, n (L - 1)]`` (and nothing when noisy): a client that sends
other integers than its quantized update is bounded by that, not by ``clip`` (up to about
``n * clip`` per coordinate). Clipping biases the sum;
:meth:`Quantizer.quantize_into` counts the entries it changes.

:meth:`Quantizer.quantize_into` writes the words that masking adds to in place
(:func:`~secureffm.protocols.prg.word_dtype`: uint32 for ``bits <= 32``), one pass over the
update in cache-sized chunks.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import ProtocolError
from .prg import CHUNK_WORDS, SEED_BYTES, Keystream, word_dtype

__all__ = ["Quantizer", "Rounding", "add_mod", "sub_mod", "required_bits"]

# Levels above 2**53 are not exactly representable in float64, so the mapping would lose the
# sub-level fraction that stochastic rounding needs.
_MAX_LEVELS = 2**53
# Allowance for float64 rounding in error_bound, in units of clip * eps per client: computing v
# costs about 3 roundings of a value up to L - 1 (3 eps * 2 clip in real units), dequantizing
# about 3 more; 16 leaves a margin.
_FLOAT_SLACK = 16.0


def required_bits(n_clients: int, levels: int) -> int:
    """Smallest ``bits`` with ``n_clients * (levels - 1) < 2**bits`` (may exceed 64)."""
    return max(1, (n_clients * (levels - 1)).bit_length())


def _mask(bits: int) -> np.uint64 | None:
    return None if bits == 64 else np.uint64((1 << bits) - 1)


def _check_bits(bits: int) -> None:
    if not isinstance(bits, numbers.Integral) or isinstance(bits, bool) or not 1 <= bits <= 64:
        raise ProtocolError(f"bits must be an integer in [1, 64], got {bits!r}")


def _mod(op, a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``op(a, b) mod 2**bits`` on uint64 (wraparound at 2**64, then the mask)."""
    _check_bits(bits)
    with np.errstate(over="ignore"):
        out = op(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64),
                 dtype=np.uint64)
    mask = _mask(bits)
    return out if mask is None else np.bitwise_and(out, mask, dtype=np.uint64)


def add_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``(a + b) mod 2**bits`` elementwise on uint64 arrays (broadcast shapes), as uint64."""
    return _mod(np.add, a, b, bits)


def sub_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``(a - b) mod 2**bits`` elementwise on uint64 arrays (broadcast shapes), as uint64."""
    return _mod(np.subtract, a, b, bits)


@dataclass(frozen=True)
class Quantizer:
    """Clip to ``[-clip, clip]``, quantize to ``levels`` integers, add modulo ``2**bits``.

    ``clip`` is in the update's own units; ``levels`` (L >= 2) integer levels span the clip range
    with step ``2 * clip / (levels - 1)``; ``bits`` (1..64) sets the modulus ``2**bits``.
    """

    clip: float
    levels: int
    bits: int

    def __post_init__(self) -> None:
        if not isinstance(self.clip, numbers.Real) or not (0 < self.clip < math.inf):
            raise ProtocolError(f"clip must be a finite number > 0, got {self.clip!r}")
        if (not isinstance(self.levels, numbers.Integral) or isinstance(self.levels, bool)
                or not 2 <= self.levels <= _MAX_LEVELS):
            raise ProtocolError(
                f"levels must be an integer in [2, 2**53], got {self.levels!r}"
            )
        _check_bits(self.bits)
        object.__setattr__(self, "clip", float(self.clip))
        object.__setattr__(self, "levels", int(self.levels))
        object.__setattr__(self, "bits", int(self.bits))
        if self.levels - 1 >= self.modulus:
            raise ProtocolError(
                f"levels={self.levels} does not fit in bits={self.bits}: a single quantized "
                f"value needs levels - 1 < 2**bits; use bits >= {required_bits(1, self.levels)}"
            )

    @property
    def modulus(self) -> int:
        """The modulus ``2**bits`` as a Python int."""
        return 1 << self.bits

    @property
    def step(self) -> float:
        """Width of one quantization level in update units: ``2 * clip / (levels - 1)``."""
        return 2.0 * self.clip / (self.levels - 1)

    def add_mod(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``(a + b) mod 2**bits`` on uint64 arrays; see :func:`add_mod`."""
        return add_mod(a, b, self.bits)

    def sub_mod(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``(a - b) mod 2**bits`` on uint64 arrays; see :func:`sub_mod`."""
        return sub_mod(a, b, self.bits)

    def check(self, n_clients: int) -> None:
        """Raise ProtocolError unless the sum of ``n_clients`` quantized vectors cannot wrap."""
        if n_clients < 1:
            raise ProtocolError(f"n_clients must be >= 1, got {n_clients}")
        if n_clients * (self.levels - 1) >= self.modulus:
            need = required_bits(n_clients, self.levels)
            if need <= 64:
                fix = f"use bits >= {need} or fewer levels"
            else:
                fix = f"use levels <= {(2**64 - 1) // n_clients + 1} (bits cannot exceed 64)"
            raise ProtocolError(
                f"bits={self.bits} with levels={self.levels} can wrap for {n_clients} clients: "
                f"n_clients * (levels - 1) = {n_clients * (self.levels - 1)} >= 2**{self.bits}; "
                f"{fix}"
            )

    @property
    def fraction_bits(self) -> int:
        """``F``: the fraction bits of the fixed-point stochastic rounding (module docstring),
        ``min(32, 64 - bitlength(levels - 1))``, so that ``(levels - 1) * 2**F < 2**64``."""
        return min(32, 64 - (self.levels - 1).bit_length())

    def reduce(self, words: np.ndarray) -> np.ndarray:
        """In place: ``words mod 2**bits`` for uint32 or uint64 words whose sums wrapped at the
        word size (a multiple of ``2**bits``); returns ``words``."""
        if self.bits < 8 * words.dtype.itemsize:
            np.bitwise_and(words, words.dtype.type((1 << self.bits) - 1), out=words)
        return words

    def quantize(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip, map to ``[0, levels - 1]`` and round stochastically; same shape as x, uint64.

        Unbiased up to ``2**-F`` of a step (module docstring); draws 32 bytes from ``rng``.
        Rejects NaN or Inf with ProtocolError. See :meth:`quantize_into`.
        """
        x = np.asarray(x)
        words = np.empty(x.size, dtype=word_dtype(self.bits))
        self.quantize_into(x.reshape(-1), words, rng)
        return words.astype(np.uint64, copy=False).reshape(x.shape)

    def quantize_into(self, x: np.ndarray, out: np.ndarray, rng: np.random.Generator,
                      scale: float = 1.0) -> int:
        """Quantize ``scale * x`` (x: 1-D, shape ``[d]``, float32 or float64, computed in
        float64) into ``out`` (1-D contiguous uint32 or uint64 words, shape ``[d]``); returns how
        many entries of ``scale * x`` lay outside ``[-clip, clip]`` and were clipped.

        One pass in chunks of :data:`~secureffm.protocols.prg.CHUNK_WORDS` (:meth:`rounding`);
        draws 32 bytes from ``rng`` to key the rounding stream. Rejects NaN or Inf with
        ProtocolError.
        """
        chunk = CHUNK_WORDS
        rounding = self.rounding(x, out, rng, scale, chunk)
        for start in range(0, rounding.size, chunk):
            rounding.chunk(start, min(start + chunk, rounding.size))
        return rounding.clipped

    def rounding(self, x: np.ndarray, out: np.ndarray, rng: np.random.Generator,
                 scale: float = 1.0, chunk: int | None = None) -> Rounding:
        """The quantization of ``scale * x`` into ``out`` as a :class:`Rounding` that a caller
        runs chunk by chunk (at most ``chunk`` words, default
        :data:`~secureffm.protocols.prg.CHUNK_WORDS`), in order, doing its own work on each
        chunk while it is in cache (masking: :func:`~secureffm.protocols.masking.mask_input`).
        Draws 32 bytes from ``rng`` to key the rounding stream; arguments as
        :meth:`quantize_into`."""
        return Rounding(self, x, out, rng, scale, CHUNK_WORDS if chunk is None else chunk)

    def _clip(self, v: np.ndarray) -> int:
        """Clip ``v`` to ``[-clip, clip]`` in place; how many entries changed. Raises
        ProtocolError for NaN or Inf."""
        if not np.isfinite(v).all():
            raise ProtocolError("quantize got NaN or Inf in the update; clip or drop it first")
        count = int(np.count_nonzero(np.abs(v) > self.clip))
        np.clip(v, -self.clip, self.clip, out=v)
        return count

    def dequantize_sum(self, total: np.ndarray, n: int, noisy: bool = False) -> np.ndarray:
        """Sum of ``n`` clipped updates from the sum of their quantized vectors; float64.

        ``total`` (uint32 or uint64, any shape) is ``sum_i q_i mod 2**bits``; :meth:`check`
        (called here) ensures it did not wrap. Returns ``total * step - n * clip``, within
        :meth:`error_bound` ``(n)`` of the exact sum of the clipped inputs. Raises ProtocolError
        if an entry exceeds ``n * (levels - 1)``: the masks did not cancel or ``n`` is wrong.

        ``noisy``: the vectors carry zero-mean integer noise, so the integer sum may leave
        ``[0, n (levels - 1)]``; it is read as the residue nearest the centre of that range
        (exact while it stays within half the modulus of the centre).
        """
        self.check(n)
        total = np.asarray(total)
        if total.dtype not in (np.uint32, np.uint64):
            raise ProtocolError(f"dequantize_sum expects a uint32 or uint64 total, got "
                                f"{total.dtype}")
        top = n * (self.levels - 1)
        if noisy:
            centre = top // 2
            if total.dtype == np.uint32:  # bits <= 32: the same residues, in 32-bit words
                return self._centred(total, centre) * self.step - n * self.clip
            offset = sub_mod(total, np.uint64(centre), self.bits)
            if self.bits == 64:
                signed = offset.view(np.int64)
            else:
                high = offset >= np.uint64(1 << (self.bits - 1))
                signed = offset.astype(np.int64) - high.astype(np.int64) * self.modulus
            return (signed.astype(np.float64) + centre) * self.step - n * self.clip
        if total.size and int(total.max()) > top:
            raise ProtocolError(
                f"aggregate entry {int(total.max())} exceeds n * (levels - 1) = {top} for n={n}: "
                "the masks did not cancel or the client count is wrong"
            )
        return total.astype(np.float64) * self.step - n * self.clip

    def _centred(self, total: np.ndarray, centre: int) -> np.ndarray:
        """``total`` (uint32 words, ``bits <= 32``) read as the residue mod ``2**bits``
        nearest ``centre``, in float64: ``total - centre`` in two's complement of ``bits``
        bits (sign-extended by a left and an arithmetic right shift), plus ``centre``."""
        shift = 32 - self.bits
        offset = np.subtract(total, np.uint32(centre))  # mod 2**32, a multiple of 2**bits
        if shift:
            np.left_shift(offset, shift, out=offset)
        signed = offset.view(np.int32)
        if shift:
            np.right_shift(signed, shift, out=signed)  # arithmetic: sign-extends
        out = signed.astype(np.float64)
        out += centre
        return out

    def error_bound(self, n: int) -> float:
        """Worst-case absolute per-coordinate error of :meth:`dequantize_sum` for ``n`` clients.

        Each client's integer is within one level of its real value, so the sum is within
        ``n * step = n * 2 * clip / (levels - 1)``; a float64 rounding allowance of
        ``16 * n * clip * eps`` is added (negligible unless levels approaches 2**50).
        """
        return n * (self.step + _FLOAT_SLACK * self.clip * float(np.finfo(np.float64).eps))


class Rounding:
    """One stochastic quantization of ``scale * x`` into the words ``out``, run chunk by chunk
    (see :meth:`Quantizer.rounding`); ``clipped`` counts the entries clipped so far.

    Per chunk, with ``V = (clip(scale x) + c) * lift`` (``lift = 2**F (L - 1) / (2 c)``,
    capped at ``(L - 1) 2**F``) in float64, exactly the module docstring's rounding:
    ``q = (floor(V) + r) >> F``. The range check runs on the input's own dtype (scaling by a
    positive factor and widening to float64 are monotone, so the extremes of ``scale x`` are
    the scaled extremes); with ``scale == 1`` widening and adding ``c`` are one pass; ``floor``
    goes through int64 where ``(L - 1) 2**F < 2**63`` (a faster cast than to uint64, same value).
    """

    def __init__(self, quantizer: Quantizer, x: np.ndarray, out: np.ndarray,
                 rng: np.random.Generator, scale: float, chunk: int):
        x = np.asarray(x)
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        if (x.ndim != 1 or out.shape != x.shape or out.dtype not in (np.uint32, np.uint64)
                or not out.flags.c_contiguous
                or quantizer.levels - 1 > np.iinfo(out.dtype).max):
            raise ProtocolError(f"quantize_into needs a 1-D update and contiguous uint32/uint64 "
                                f"words of its shape holding levels - 1, got {x.shape} and "
                                f"{out.dtype} {out.shape}")
        if chunk < 1:
            raise ProtocolError(f"chunk must be >= 1 words, got {chunk}")
        self.quantizer, self.size, self.clipped = quantizer, x.size, 0
        self._x, self._out, self._scale = x, out, float(scale)
        self._frac, self._clip = quantizer.fraction_bits, quantizer.clip
        self._lift = 2.0**self._frac * ((quantizer.levels - 1) / (2 * self._clip))  # exact
        self._top = float(quantizer.levels - 1) * 2.0**self._frac
        n = min(chunk, x.size)
        self._v = np.empty(n)
        signed = (quantizer.levels - 1) << self._frac < 2**63  # floor(V) fits int64
        self._floor = np.empty(n, dtype=np.int64 if signed else np.uint64)
        self._low = self._floor.view(np.uint64)
        self._r = np.empty(n, dtype=np.uint32)
        self._stream = Keystream(rng.bytes(SEED_BYTES))

    def chunk(self, start: int, stop: int) -> None:
        """Quantize ``x[start:stop]`` into ``out[start:stop]`` (the next chunk: chunks must come
        in order, since they read the rounding stream front to back)."""
        part, n = self._x[start:stop], stop - start
        v, floor, low, r = self._v[:n], self._floor[:n], self._low[:n], self._r[:n]
        clip, lift, scale = self._clip, self._lift, self._scale
        if n:
            low_x, high_x = float(part.min()), float(part.max())
            if scale != 1.0:
                low_x, high_x = sorted((low_x * scale, high_x * scale))
        else:
            low_x = high_x = 0.0
        inside = -clip <= low_x and high_x <= clip  # NaN fails both comparisons
        if inside and scale == 1.0:
            np.add(part, clip, out=v, dtype=np.float64)
        else:
            if scale == 1.0:
                np.copyto(v, part, casting="same_kind")
            else:
                np.multiply(part, scale, out=v, dtype=np.float64)
            if not inside:
                self.clipped += self.quantizer._clip(v)
                high_x = clip
            np.add(v, clip, out=v)
        np.multiply(v, lift, out=v)
        if (high_x + clip) * lift > self._top:  # rounding can lift the top level past L - 1
            np.minimum(v, self._top, out=v)
        np.copyto(floor, v, casting="unsafe")  # floor(2**F v): v >= 0
        self._stream.fill(r)
        if self._frac < 32:
            np.right_shift(r, 32 - self._frac, out=r)
        np.add(low, r, out=low)  # < levels * 2**F <= 2**64: no wrap
        np.right_shift(low, self._frac, out=self._out[start:stop], casting="unsafe")
