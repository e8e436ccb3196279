"""Messages and their byte encoding (secureffm/federation/message.py).

Truths used: the safetensors layout read by hand (an 8-byte little-endian header length, a JSON
header of dtype, shape and data offsets, then the raw little-endian bytes) and hashlib.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from secureffm.errors import MessageError
from secureffm.federation.message import Envelope, deserialize_payload, serialize_payload

PAYLOAD = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
           "b": np.array([1, -2], dtype=np.int64)}


def test_payload_roundtrip_and_malformed_bytes():
    payload = {"a": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32),
               "b": np.array([1, 2], dtype=np.int64)}
    back = deserialize_payload(serialize_payload(payload))
    assert set(back) == {"a", "b"} and all(np.array_equal(back[k], payload[k]) for k in payload)
    with pytest.raises(MessageError, match="client-9"):
        deserialize_payload(b"not a payload", "client-9")


def test_the_bytes_are_safetensors_read_by_hand():
    """No pickle on the wire: a header any safetensors reader parses, then the raw arrays."""
    data = serialize_payload(PAYLOAD)
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    for name, array in PAYLOAD.items():
        entry = header[name]
        assert entry["shape"] == list(array.shape)
        assert entry["dtype"] == {"float32": "F32", "int64": "I64"}[str(array.dtype)]
        start, end = entry["data_offsets"]
        assert body[start:end] == array.astype(array.dtype.newbyteorder("<")).tobytes()


def test_serialization_is_deterministic_whatever_the_field_order_or_memory_layout():
    """Equal payloads give equal bytes (their sha256 is what the log signs)."""
    reordered = {"b": PAYLOAD["b"].copy(), "a": np.asfortranarray(PAYLOAD["a"])}
    assert serialize_payload(reordered) == serialize_payload(PAYLOAD)
    transposed = {"t": PAYLOAD["a"].T}  # not contiguous: copied, not refused
    assert np.array_equal(deserialize_payload(serialize_payload(transposed))["t"],
                          PAYLOAD["a"].T)


@pytest.mark.parametrize("cut", ["empty", "header only", "truncated", "trailing", "zero header"])
def test_malformed_bytes_are_a_message_error_naming_the_sender(cut):
    data = serialize_payload(PAYLOAD)
    bad = {"empty": b"", "header only": data[:8], "truncated": data[:-3],
           "trailing": data + b"zz", "zero header": bytes(8)}[cut]
    with pytest.raises(MessageError, match="message from client-4 is not a valid payload"):
        deserialize_payload(bad, "client-4")


def test_an_envelopes_sha256_is_that_of_its_bytes():
    envelope = Envelope("gradient", "client-1", "server", 2, "upload", b"abc", ("dp",))
    assert envelope.sha256 == hashlib.sha256(b"abc").hexdigest()
    assert envelope.origin == "" and envelope.stages == ("dp",)
