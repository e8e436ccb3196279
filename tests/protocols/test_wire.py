"""Byte-string and JSON payloads of protocol messages (secureffm/protocols/wire.py)."""

from __future__ import annotations

import numpy as np
import pytest

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
