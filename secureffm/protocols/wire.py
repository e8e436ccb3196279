"""The byte formats of protocol messages that are not tensors: named byte strings (safetensors
of uint8 arrays) and a JSON document carried as one such string. Each parser raises
MessageError naming the sender."""

from __future__ import annotations

import json

import numpy as np

from ..errors import MessageError
from ..federation.message import deserialize_payload, serialize_payload

__all__ = ["bytes_payload", "payload_bytes", "json_payload", "payload_json", "fields_json"]


def bytes_payload(items: dict[str, bytes]) -> bytes:
    """Named byte strings as a payload (each a uint8 array)."""
    return serialize_payload({k: np.frombuffer(v, dtype=np.uint8) for k, v in items.items()})


def payload_bytes(data: bytes, sender: str) -> dict[str, bytes]:
    """The named byte strings of ``sender``'s payload; any other field is refused."""
    payload = deserialize_payload(data, sender)
    for name, array in payload.items():
        if array.dtype != np.uint8 or array.ndim != 1:
            raise MessageError(f"{sender} sent field {name!r} as {array.dtype} {array.shape}, "
                               "expected a byte string")
    return {k: v.tobytes() for k, v in payload.items()}


def json_payload(value) -> bytes:
    """``value`` as sorted-key JSON in the one field ``json``."""
    return bytes_payload({"json": json.dumps(value, sort_keys=True).encode()})


def payload_json(data: bytes, sender: str):
    """The JSON value of ``sender``'s ``json`` field."""
    return fields_json(payload_bytes(data, sender), sender)


def fields_json(fields: dict[str, bytes], sender: str):
    """The JSON value of the ``json`` field of ``sender``'s payload already read by
    :func:`payload_bytes`."""
    try:
        return json.loads(fields["json"])
    except (KeyError, ValueError) as err:  # ValueError covers bad JSON and bad UTF-8
        raise MessageError(f"{sender} sent no valid JSON field: {err!r}") from None
