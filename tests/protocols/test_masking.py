"""The fused mask path (quantize, noise and mask chunk by chunk; the masked input's wire format;
the server's chunked unmasked sum) against a plain composition written out here, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from secureffm.errors import MessageError, ProtocolError
from secureffm.federation.message import serialize_payload
from secureffm.protocols import masking
from secureffm.protocols.aggregation import flatten
from secureffm.protocols.masking import (
    as_vector,
    mask_input,
    masked_header,
    masked_payload,
    parse_masked,
    unmask_sum,
)
from secureffm.protocols.prg import MaskStreams, word_dtype
from secureffm.protocols.quantize import Quantizer
from tests.protocols.keystream_reference import mask_keystream

_SEEDS = st.binary(min_size=32, max_size=32)
_BITS = [1, 7, 16, 31, 32, 33, 48, 63, 64]


def _stream_words(seed: bytes, size: int, width: int) -> np.ndarray:
    """The first ``size`` keystream words of ``seed`` (``width`` bytes each, little-endian) as
    Python integers in an object array, from the independent reference keystream."""
    raw = mask_keystream(seed, width * size)
    return np.array([int.from_bytes(raw[width * i: width * i + width], "little")
                     for i in range(size)], dtype=object)


def reference_masked(x: np.ndarray, quantizer: Quantizer, key: bytes, scale: float,
                     plus: list[bytes], minus: list[bytes], noise: list[int] | None
                     ) -> tuple[list[int], int]:
    """The plain composition, whole vectors and Python integers: quantize ``scale * x`` in
    float64 (``V = min((clip(scale x) + c) * lift, (L - 1) 2**F)``, ``q = (floor(V) + r) >> F``
    with ``r`` the top F bits of 32-bit keystream word i of AES-128-CTR(key[:16])), add the noise,
    add each plus seed's keystream words, subtract each minus seed's, all mod ``2**bits``."""
    bits, frac, c = quantizer.bits, quantizer.fraction_bits, quantizer.clip
    lift = 2.0**frac * ((quantizer.levels - 1) / (2 * c))
    top = float(quantizer.levels - 1) * 2.0**frac
    scaled = x.astype(np.float64) * scale
    clipped = int(np.count_nonzero(np.abs(scaled) > c))
    v = np.minimum((np.clip(scaled, -c, c) + c) * lift, top)
    r = _stream_words(key, x.size, 4)
    q = [(int(value) + (int(bits_) >> (32 - frac))) >> frac for value, bits_ in zip(v, r,
                                                                                   strict=True)]
    total = np.array(q, dtype=object)
    if noise is not None:
        total = total + np.array(noise, dtype=object)
    width = 4 if bits <= 32 else 8
    for seed in plus:
        total = total + _stream_words(seed, x.size, width)
    for seed in minus:
        total = total - _stream_words(seed, x.size, width)
    return [int(value) % 2**bits for value in total], clipped


def _case(data, bits: int, length: int, single: bool):
    levels = data.draw(st.integers(2, min(2**bits, 2**53)), label="levels")
    clip = data.draw(st.sampled_from([0.7, 1.0, 1.5]), label="clip")
    scale = data.draw(st.sampled_from([1.0, 0.37, 2.5]), label="scale")
    values = data.draw(st.lists(st.one_of(st.floats(-3.0, 3.0),
                                          st.sampled_from([-clip, 0.0, clip])),
                                min_size=length, max_size=length), label="x")
    x = np.array(values, dtype=np.float32 if single else np.float64)
    return Quantizer(clip=clip, levels=levels, bits=bits), x, scale


@settings(max_examples=80, deadline=None)
@given(data=st.data(), bits=st.sampled_from(_BITS), length=st.integers(0, 120),
       chunk=st.sampled_from([1, 5, 16, 17, 64, masking.CHUNK_WORDS]),
       plus=st.lists(_SEEDS, max_size=3), minus=st.lists(_SEEDS, max_size=3),
       seed=st.integers(0, 2**32 - 1), single=st.booleans(), noisy=st.booleans())
def test_mask_input_matches_the_plain_composition_bit_for_bit(data, bits, length, chunk, plus,
                                                              minus, seed, single, noisy):
    # Sizes that are no multiple of the chunk or of a 16-byte keystream block.
    quantizer, x, scale = _case(data, bits, length, single)
    dtype = word_dtype(bits)
    noise = None
    if noisy:
        noise = data.draw(st.lists(st.integers(-50, 50), min_size=length, max_size=length),
                          label="noise")
    words = None if noise is None else np.array(noise, dtype=np.int64).astype(dtype)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(masking, "CHUNK_WORDS", chunk)
        y, clipped = mask_input(x, quantizer, np.random.default_rng(seed), scale, plus, minus,
                                words)
        data_bytes, clipped_too = masked_payload(x, quantizer, np.random.default_rng(seed),
                                                 scale, plus, minus, words)
    want, want_clipped = reference_masked(x, quantizer, np.random.default_rng(seed).bytes(32),
                                          scale, plus, minus, noise)
    assert y.dtype == dtype and y.shape == (length,)
    assert [int(v) for v in y] == want and clipped == want_clipped == clipped_too
    # The payload is the safetensors encoding of y, and the server reads y back from it.
    assert data_bytes == serialize_payload({"y": y})
    assert [int(v) for v in parse_masked(data_bytes, "client-1", length, dtype)["y"]] == want


@pytest.mark.parametrize("bits", [32, 64])
def test_mask_input_matches_the_reference_past_a_full_chunk(bits):
    d = masking.CHUNK_WORDS + 37  # past the first chunk, into a partial second one
    quantizer = Quantizer(clip=8.0, levels=2**22, bits=bits)
    x = (0.5 * np.random.default_rng(bits).standard_normal(d)).astype(np.float32)
    x[::1000] = 9.0  # some clipped
    plus, minus = [bytes([1]) * 32, bytes([2]) * 32], [bytes([3]) * 32]
    y, clipped = mask_input(x, quantizer, np.random.default_rng(5), 0.9, plus, minus)
    want, want_clipped = reference_masked(x, quantizer, np.random.default_rng(5).bytes(32), 0.9,
                                          plus, minus, None)
    assert [int(v) for v in y] == want and clipped == want_clipped > 0


def test_the_masks_cancel_and_the_quantized_sum_comes_back():
    quantizer = Quantizer(clip=1.0, levels=2**10, bits=16)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, 300) for _ in range(3)]
    pair, selves = bytes([9]) * 32, [bytes([i]) * 32 for i in range(3)]
    # client 0 adds the pair's mask, client 1 subtracts it; each adds its self mask
    masked = [mask_input(xs[0], quantizer, np.random.default_rng(10), 1.0, [selves[0], pair])[0],
              mask_input(xs[1], quantizer, np.random.default_rng(11), 1.0, [selves[1]], [pair])[0],
              mask_input(xs[2], quantizer, np.random.default_rng(12), 1.0, [selves[2]])[0]]
    total = unmask_sum(masked, quantizer, 300, minus=selves)
    plain = [mask_input(x, quantizer, np.random.default_rng(10 + i))[0] for i, x in enumerate(xs)]
    assert [int(v) for v in total] == [int(v) % 2**16 for v in sum(p.astype(np.int64)
                                                                   for p in plain)]
    assert np.all(np.abs(quantizer.dequantize_sum(total, 3) - sum(xs))
                  <= quantizer.error_bound(3))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), bits=st.sampled_from(_BITS), length=st.integers(0, 100),
       count=st.integers(0, 4), chunk=st.sampled_from([1, 7, 16, masking.CHUNK_WORDS]),
       plus=st.lists(_SEEDS, max_size=3), minus=st.lists(_SEEDS, max_size=3))
def test_unmask_sum_matches_the_plain_sum_bit_for_bit(data, bits, length, count, chunk, plus,
                                                      minus):
    quantizer = Quantizer(clip=1.0, levels=2, bits=bits)
    dtype = word_dtype(bits)
    inputs = [np.array(data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=length,
                                          max_size=length)), dtype=np.uint64).astype(dtype)
              for _ in range(count)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(masking, "CHUNK_WORDS", chunk)
        total = unmask_sum(inputs, quantizer, length, plus, minus)
    width = 4 if bits <= 32 else 8
    want = np.array([0] * length, dtype=object)
    for y in inputs:
        want = want + np.array([int(v) for v in y], dtype=object)
    for seed in plus:
        want = want + _stream_words(seed, length, width)
    for seed in minus:
        want = want - _stream_words(seed, length, width)
    assert total.dtype == dtype and [int(v) for v in total] == [int(v) % 2**bits for v in want]


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 1000, 10**6])
def test_the_header_is_safetensors_own(dtype, size):
    words = np.arange(size, dtype=dtype)
    encoded = save({"y": words})
    head = masked_header(size, dtype)
    assert encoded[:len(head)] == head and encoded == head + words.astype(
        np.dtype(dtype).newbyteorder("<")).tobytes()


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@given(size=st.integers(0, 300),
       extra=st.dictionaries(st.sampled_from(["a", "b_commit", "peers", "shares", "view_sig",
                                              "z"]), st.binary(max_size=40), max_size=4))
@settings(max_examples=40, deadline=None, derandomize=True)
def test_a_payload_with_byte_strings_is_safetensors_own_and_read_back_in_place(dtype, size,
                                                                                extra):
    """The keys-once masked input carries byte strings beside the words: masked_payload's
    bytes are serialize_payload's for the same fields (any safetensors reader reads them), and
    parse_masked reads every field back in place."""
    quantizer = Quantizer(clip=1.0, levels=2**10, bits=32 if dtype == np.uint32 else 40)
    x = np.linspace(-1.0, 1.0, size)
    seed = bytes(range(32))
    data, _ = masked_payload(x, quantizer, np.random.default_rng(5), 1.0, [seed],
                             extra=extra)
    y, _ = mask_input(x, quantizer, np.random.default_rng(5), 1.0, [seed])
    fields = {"y": y} | {name: np.frombuffer(value, np.uint8) for name, value in extra.items()}
    assert data == serialize_payload(fields)
    got = parse_masked(data, "client-1", size, dtype, {k: len(v) for k, v in extra.items()})
    assert sorted(got) == sorted(fields) and got["y"].tolist() == y.tolist()
    assert all(got[name].tobytes() == value for name, value in extra.items())
    raw = np.frombuffer(data, dtype=np.uint8)
    assert all(np.shares_memory(array, raw) for array in got.values() if array.size)


def test_byte_strings_of_other_lengths_are_read_by_the_general_parser_or_refused():
    """A client that sends a byte string of another length than the server expects misses the
    in-place reader: the general parser reads it (its caller checks the length) and refuses,
    naming the sender, any other field set or a byte string of another type."""
    words = np.arange(4, dtype=np.uint32)
    longer = serialize_payload({"y": words, "peers": np.frombuffer(b'[ "a" ]', np.uint8)})
    got = parse_masked(longer, "client-2", 4, np.uint32, {"peers": 5})
    assert got["peers"].tobytes() == b'[ "a" ]' and got["y"].tolist() == [0, 1, 2, 3]
    bad = {
        "a byte string missing": serialize_payload({"y": words}),
        "another name": serialize_payload({"y": words, "peer": np.zeros(5, np.uint8)}),
        "not bytes": serialize_payload({"y": words, "peers": np.zeros(5, np.uint32)}),
        "not 1-D": serialize_payload({"y": words, "peers": np.zeros((1, 5), np.uint8)}),
        "other words": serialize_payload({"y": words[:3], "peers": np.zeros(5, np.uint8)}),
    }
    for why, data in bad.items():
        with pytest.raises(MessageError, match="client-2"):
            parse_masked(data, "client-2", 4, np.uint32, {"peers": 5})
            pytest.fail(f"accepted a masked input with {why}")


def test_parse_masked_names_the_sender_of_a_malformed_input():
    words = np.arange(10, dtype=np.uint32)
    good = serialize_payload({"y": words})
    assert parse_masked(good, "client-3", 10, np.uint32)["y"].tolist() == list(range(10))
    bad = {
        "truncated": good[:-1],
        "too long": good + b"\x00\x00\x00\x00",
        "other size": serialize_payload({"y": np.arange(11, dtype=np.uint32)}),
        "other type": serialize_payload({"y": words.astype(np.uint64)}),
        "other field": serialize_payload({"z": words}),
        "extra field": serialize_payload({"y": words, "z": words}),
        "not safetensors": b"\xff" * len(good),
        "empty": b"",
        "header length past the end": (2**40).to_bytes(8, "little") + good[8:],
    }
    for why, data in bad.items():
        with pytest.raises(MessageError, match="client-3"):
            parse_masked(data, "client-3", 10, np.uint32)
            pytest.fail(f"accepted a masked input with {why}")


def test_an_equivalent_safetensors_header_is_still_read():
    # Another writer's spacing or metadata is not the canonical header: the general parser
    # reads it, as before.
    words = np.arange(6, dtype=np.uint32)
    other = save({"y": words}, metadata={"writer": "another"})
    assert other[:len(masked_header(6, np.uint32))] != masked_header(6, np.uint32)
    assert parse_masked(other, "client-1", 6, np.uint32)["y"].tolist() == list(range(6))


def test_parse_masked_reads_in_place():
    data = serialize_payload({"y": np.arange(5, dtype=np.uint32)})
    y = parse_masked(data, "client-1", 5, np.uint32)["y"]
    assert not y.flags.writeable and np.shares_memory(y, np.frombuffer(data, dtype=np.uint8))


def test_mask_input_refuses_what_it_cannot_mask():
    quantizer = Quantizer(clip=1.0, levels=16, bits=32)
    rng = np.random.default_rng(0)
    with pytest.raises(ProtocolError, match="NaN or Inf"):
        mask_input(np.array([0.0, np.nan]), quantizer, rng, 1.0, [bytes(32)])
    with pytest.raises(ProtocolError, match="32 bytes"):
        mask_input(np.zeros(3), quantizer, rng, 1.0, [bytes(31)])
    with pytest.raises(ProtocolError, match="uint32 words"):
        mask_input(np.zeros(3), quantizer, rng, out=np.zeros(3, dtype=np.uint64))
    with pytest.raises(ProtocolError, match="noise"):
        mask_input(np.zeros(3), quantizer, rng, noise=np.zeros(2, dtype=np.uint32))
    with pytest.raises(ProtocolError, match="masked input"):
        unmask_sum([np.zeros(2, dtype=np.uint32)], quantizer, 3)
    with pytest.raises(ProtocolError, match="exceeds"):
        MaskStreams(np.uint32, 10, [bytes(32)], chunk=4).add_into(np.zeros(5, dtype=np.uint32))


def test_as_vector_is_a_view_of_one_field_and_flatten_otherwise():
    grad = np.arange(6, dtype=np.float32).reshape(2, 3)
    one = {"g": ((2, 3), np.dtype(np.float32))}
    vector = as_vector({"g": grad}, one)
    assert np.shares_memory(vector, grad) and vector.tolist() == grad.reshape(-1).tolist()
    two = {"b": ((2,), np.dtype(np.float64)), "a": ((2, 3), np.dtype(np.float32))}
    payload = {"a": grad, "b": np.array([7.0, 8.0])}
    assert np.array_equal(as_vector(payload, two), flatten(payload, two, np.float64))
    assert as_vector(payload, two).dtype == np.float64
    ints = {"n": ((3,), np.dtype(np.int64))}
    assert as_vector({"n": np.arange(3)}, ints).tolist() == [0, 1, 2]
