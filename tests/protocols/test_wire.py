"""Byte-string and JSON payloads of protocol messages (secureffm/protocols/wire.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from secureffm.errors import MessageError
from secureffm.federation.message import serialize_payload
from secureffm.protocols.wire import bytes_payload, json_payload, payload_bytes, payload_json


def test_byte_strings_and_json_round_trip():
    items = {"c_pk": bytes(range(32)), "empty": b""}
    assert payload_bytes(bytes_payload(items), "client-1") == items
    value = {"survivors": ["client-2", "client-1"], "dropped": []}
    assert payload_json(json_payload(value), "server") == value


@pytest.mark.parametrize("data, fragment", [
    (b"junk", "not a valid payload"),
    (serialize_payload({"x": np.zeros(3, np.float32)}), "sent field 'x' as float32"),
    (bytes_payload({"json": b"{"}), "no valid JSON"),
    (bytes_payload({}), "no valid JSON"),
])
def test_malformed_payloads_are_refused_naming_the_sender(data, fragment):
    with pytest.raises(MessageError, match=fragment):
        payload_json(data, "server")


_NAMES = st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
                   st.text(max_size=6))  # plain names, and any (quotes, escapes, non-ASCII)


@settings(max_examples=200, deadline=None)
@given(items=st.dictionaries(_NAMES, st.binary(max_size=70), max_size=12))
def test_byte_strings_are_safetensors_own_bytes(items):
    # The direct writer gives exactly safetensors' bytes, and the direct reader what the
    # safetensors parser reads.
    data = bytes_payload(items)
    assert data == serialize_payload({k: np.frombuffer(v, dtype=np.uint8)
                                      for k, v in items.items()})
    assert payload_bytes(data, "client-1") == items
    assert all(type(v) is bytes for v in payload_bytes(data, "client-1").values())


@pytest.mark.parametrize("data", [
    bytes_payload({"a": b"xyz", "b": b"1"})[:-1],  # truncated
    bytes_payload({"a": b"xyz"}) + b"!",  # trailing byte
    (10**6).to_bytes(8, "little") + b"{}",  # header length past the end
    b"\x08\x00\x00\x00\x00\x00\x00\x00[]      ",  # a header that is not a table
])
def test_malformed_byte_strings_go_to_the_general_parser_and_are_refused(data):
    with pytest.raises(MessageError, match="client-7"):
        payload_bytes(data, "client-7")


def test_another_writers_header_is_still_read():
    other = save({"a": np.frombuffer(b"xyz", dtype=np.uint8)}, metadata={"by": "another"})
    assert payload_bytes(other, "client-1") == {"a": b"xyz"}
