"""A client's masked input in one pass, its wire format, and the server's unmasked sum.

Pairwise-mask secure aggregation (:mod:`.secagg`) sends, per client, one vector of words
``y = q + e + sum PRG(plus) - sum PRG(minus) mod 2**bits``: ``q`` the stochastic quantization
of ``scale * x`` (:class:`~secureffm.protocols.quantize.Quantizer`), ``e`` optional integer
noise (distributed DP), the masks AES-128-CTR keystreams of 32-byte seeds
(:mod:`~secureffm.protocols.prg`). :func:`mask_input` computes it chunk by chunk: each chunk is
quantized, noised and masked while it is in cache, instead of one pass over the whole vector
per step. Addition modulo the word size commutes, so the words are those of quantizing, adding
the noise, adding each mask and reducing in turn (``tests/protocols/test_masking.py`` checks this
bit for bit against that plain composition).

Wire format of a masked input (:func:`masked_payload`, :func:`parse_masked`): the safetensors
encoding of the tensor ``y`` and of any byte strings sent beside it (keys-once rounds send the
seed commitment, the peers, the sealed shares and the view signature), exactly the bytes
``serialize_payload`` gives for them, so any safetensors reader reads it:

- 8 bytes: ``N``, the header's length, little-endian;
- ``N`` bytes: ``{"y":{"dtype":"U32","shape":[d],"data_offsets":[0,4d]}, ...}`` (``U64`` and
  ``8d`` for 64-bit words), then each byte string as ``"name":{"dtype":"U8","shape":[n],...}``
  in name order (safetensors' own order: wider types first, then by name), padded with spaces
  to a multiple of 8;
- ``4 d`` (or ``8 d``) bytes: the words, little-endian; then the byte strings in that order.

The client writes the words straight after the header in one buffer (no serializer copies);
the server, which knows ``d``, the word type and the byte strings' lengths, compares the header
with the one it expects and reads the fields in place (``np.frombuffer``). A payload with any
other header (other JSON spacing, extra fields, other lengths) goes through the general
safetensors parser, so it is read as before or refused by
:class:`~secureffm.errors.MessageError` naming the sender.

:func:`unmask_sum` is the server's side: the sum of the masked inputs with the masks it can
rebuild removed, again chunk by chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.message import Payload, deserialize_payload
from .aggregation import check_payload, flatten
from .prg import CHUNK_WORDS, MaskStreams, word_dtype
from .quantize import Quantizer

__all__ = ["mask_input", "masked_payload", "parse_masked", "unmask_sum", "masked_header",
           "as_vector"]

_FIELD = "y"
_SAFETENSORS_DTYPE = {np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64"}


def masked_header(size: int, dtype: np.dtype, extra: Mapping[str, int] | None = None) -> bytes:
    """The bytes before the words of a masked input of ``size`` words of ``dtype`` (uint32 or
    uint64) sent with the byte strings ``extra`` (name -> length in bytes, names other than
    ``y``): the header length and the padded safetensors header (module docstring)."""
    dtype = np.dtype(dtype)
    if dtype not in _SAFETENSORS_DTYPE:
        raise ProtocolError(f"masked words are uint32 or uint64, not {dtype}")
    end = size * dtype.itemsize
    fields = {_FIELD: {"dtype": _SAFETENSORS_DTYPE[dtype], "shape": [size],
                       "data_offsets": [0, end]}}
    for name, length in sorted((extra or {}).items()):
        if name == _FIELD:
            raise ProtocolError(f"a byte string beside the masked words cannot be named {name}")
        fields[name] = {"dtype": "U8", "shape": [length], "data_offsets": [end, end + length]}
        end += length
    header = json.dumps(fields, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header


def _wire(dtype: np.dtype) -> np.dtype:
    """``dtype`` little-endian, as the words travel."""
    return np.dtype(dtype).newbyteorder("<")


def mask_input(x: np.ndarray, quantizer: Quantizer, rng: np.random.Generator,
               scale: float = 1.0, plus: Sequence[bytes] = (), minus: Sequence[bytes] = (),
               noise: np.ndarray | None = None, out: np.ndarray | None = None
               ) -> tuple[np.ndarray, int]:
    """One client's masked input and how many coordinates were clipped.

    ``x``: 1-D float update, shape ``[d]``; ``quantizer`` clips and rounds ``scale * x``
    (:meth:`~secureffm.protocols.quantize.Quantizer.rounding`, drawing 32 bytes from ``rng``
    for the rounding stream); ``noise``: optional integer noise in the words' type, shape
    ``[d]``, added as residues; ``plus`` / ``minus``: seeds whose masks are added /
    subtracted. Returns ``(y, clipped)`` with

    .. math::

        y = q(\\mathrm{scale}\\, x) + e + \\sum_{s \\in plus} PRG(s)
            - \\sum_{s \\in minus} PRG(s) \\bmod 2^{bits},

    ``y`` in :func:`~secureffm.protocols.prg.word_dtype` ``(bits)``, written into ``out`` when
    given (1-D contiguous, writable, that type and shape). One pass in chunks of
    :data:`~secureffm.protocols.prg.CHUNK_WORDS`.
    """
    x = np.asarray(x)
    dtype = word_dtype(quantizer.bits)
    if out is None:
        out = np.empty(x.shape, dtype=dtype)
    if out.dtype != dtype or not out.flags.writeable:
        raise ProtocolError(f"mask_input writes {dtype} words for bits={quantizer.bits} into a "
                            f"writable array, got {out.dtype}")
    if noise is not None and (noise.shape != x.shape or noise.dtype != dtype):
        raise ProtocolError(f"noise must be {dtype} of shape {x.shape}, got {noise.dtype} "
                            f"{noise.shape}")
    chunk = CHUNK_WORDS
    rounding = quantizer.rounding(x, out, rng, scale, chunk)
    masks = MaskStreams(dtype, rounding.size, plus, minus, chunk)
    reduce = quantizer.bits < 8 * dtype.itemsize
    for start in range(0, rounding.size, chunk):
        stop = min(start + chunk, rounding.size)
        rounding.chunk(start, stop)
        part = out[start:stop]
        if noise is not None:
            np.add(part, noise[start:stop], out=part)
        masks.add_into(part)
        if reduce:
            quantizer.reduce(part)
    return out, rounding.clipped


def masked_payload(x: np.ndarray, quantizer: Quantizer, rng: np.random.Generator,
                   scale: float = 1.0, plus: Sequence[bytes] = (), minus: Sequence[bytes] = (),
                   noise: np.ndarray | None = None, extra: Mapping[str, bytes] | None = None
                   ) -> tuple[bytes, int]:
    """:func:`mask_input` in its wire format (module docstring), with the byte strings
    ``extra`` (name -> bytes) beside the words: the payload bytes, equal to
    ``serialize_payload`` of ``y`` and ``extra`` (as uint8 arrays) but written with one copy of
    the words, and the clipped count."""
    extra = dict(extra or {})
    y, clipped = mask_input(x, quantizer, rng, scale, plus, minus, noise)
    head = masked_header(y.size, y.dtype, {name: len(data) for name, data in extra.items()})
    if y.dtype != _wire(y.dtype):  # a big-endian machine
        y = y.astype(_wire(y.dtype))
    return b"".join((head, y, *(bytes(extra[name]) for name in sorted(extra)))), clipped


def parse_masked(data: bytes, sender: str, size: int, dtype: np.dtype,
                 extra: Mapping[str, int] | None = None) -> Payload:
    """``sender``'s masked input: ``{"y": words, name: bytes...}``, ``y`` being ``size`` words
    of ``dtype`` (uint32 or uint64) and each name of ``extra`` a 1-D uint8 array. When ``data``
    has the expected header (``extra``: name -> expected length) every field is read in place
    (read-only); any other payload is parsed as safetensors and checked to hold exactly these
    fields, ``y`` of that shape and type and the others 1-D uint8 of any length (the caller
    checks their lengths and contents). Raises MessageError naming ``sender`` otherwise."""
    dtype, extra = np.dtype(dtype), dict(extra or {})
    head = masked_header(size, dtype, extra)
    words = size * dtype.itemsize
    if len(data) == len(head) + words + sum(extra.values()) and data[:len(head)] == head:
        out = {_FIELD: np.frombuffer(data, dtype=_wire(dtype), count=size, offset=len(head))}
        offset = len(head) + words
        for name, length in sorted(extra.items()):
            out[name] = np.frombuffer(data, dtype=np.uint8, count=length, offset=offset)
            offset += length
        return out
    got = deserialize_payload(data, sender)
    if set(got) != {_FIELD, *extra}:
        raise MessageError(f"{sender} sent fields {sorted(got)}, expected "
                           f"{sorted([_FIELD, *extra])}")
    check_payload(sender, {_FIELD: got[_FIELD]},
                  {_FIELD: np.broadcast_to(np.zeros((), dtype=dtype), (size,))})
    for name in extra:
        if got[name].dtype != np.uint8 or got[name].ndim != 1:
            raise MessageError(f"{sender} sent {name} as {got[name].dtype} of shape "
                               f"{got[name].shape}, expected a byte string")
    return got


def unmask_sum(inputs: Sequence[np.ndarray], quantizer: Quantizer, size: int,
               plus: Sequence[bytes] = (), minus: Sequence[bytes] = ()) -> np.ndarray:
    """The server's total: ``sum inputs + sum PRG(plus) - sum PRG(minus) mod 2**bits``, shape
    ``[size]``, in :func:`~secureffm.protocols.prg.word_dtype` ``(bits)``; ``inputs``: masked
    inputs of that shape (any word type that casts to it safely). Chunk by chunk: each chunk
    of the total is summed and its masks removed while it is in cache."""
    dtype, inputs = word_dtype(quantizer.bits), list(inputs)
    for y in inputs:
        if y.shape != (size,) or not np.can_cast(y.dtype, dtype):
            raise ProtocolError(f"a masked input is {y.dtype} of shape {y.shape}, expected "
                                f"{dtype} of shape ({size},)")
    chunk = CHUNK_WORDS
    total = np.zeros(size, dtype=dtype) if not inputs else np.empty(size, dtype=dtype)
    masks = MaskStreams(dtype, size, plus, minus, chunk)
    for start in range(0, size, chunk):
        stop = start + chunk
        part = total[start:stop]
        if inputs:
            np.copyto(part, inputs[0][start:stop])
        for y in inputs[1:]:
            np.add(part, y[start:stop], out=part)
        masks.add_into(part)
    return quantizer.reduce(total)


def as_vector(payload: dict[str, np.ndarray], template: dict) -> np.ndarray:
    """The payload's fields (sorted by name) as one 1-D float vector, as
    :func:`~secureffm.protocols.aggregation.flatten` gives in the fields' common float type,
    without a copy when there is one contiguous field (read-only use)."""
    if len(template) == 1:
        (name,) = template
        array = np.asarray(payload[name])
        if array.dtype.kind == "f" and array.flags.c_contiguous:
            return array.reshape(-1)
    return flatten(payload, template, np.result_type(*(dtype for _, dtype in template.values())))

