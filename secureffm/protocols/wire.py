"""The byte formats of protocol messages that are not tensors: named byte strings (safetensors
of uint8 arrays) and a JSON document carried as one such string. Each parser raises
MessageError naming the sender.

Named byte strings are written and read here directly in safetensors' own layout (8 bytes of
header length, little-endian; the JSON header ``{"name":{"dtype":"U8","shape":[n],
"data_offsets":[a,b]},...}`` with the names sorted and the strings back to back in that order,
padded with spaces to a multiple of 8; then the strings), the bytes safetensors writes for the
same uint8 arrays: its numpy path costs a few microseconds per field, which the dozens of
fields of a key or share message add up to. A name that would need JSON escaping is written by
safetensors itself; a payload whose header is not the one this writer gives for its fields is
read by safetensors' parser, as before.
"""

from __future__ import annotations

import json
import re

import numpy as np

from ..errors import MessageError
from ..federation.message import deserialize_payload, serialize_payload

__all__ = ["bytes_payload", "payload_bytes", "json_payload", "payload_json", "fields_json"]

_PLAIN_NAME = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\': no escaping
_FIELD = re.compile(rb'"([ !#-\[\]-~]*)":\{"dtype":"U8","shape":\[(\d+)\],'
                    rb'"data_offsets":\[\d+,\d+\]\}')


def _header(fields: list[tuple[str, int]]) -> bytes:
    """The safetensors prefix (length and padded header) of uint8 fields ``(name, length)``,
    sorted by name, with plain names."""
    parts, offset = [], 0
    for name, size in fields:
        parts.append(f'"{name}":{{"dtype":"U8","shape":[{size}],"data_offsets":'
                     f'[{offset},{offset + size}]}}')
        offset += size
    header = ("{" + ",".join(parts) + "}").encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header


def bytes_payload(items: dict[str, bytes]) -> bytes:
    """Named byte strings as a payload (each a uint8 array)."""
    names = sorted(items)
    if not all(_PLAIN_NAME.fullmatch(name) for name in names):
        return serialize_payload({k: np.frombuffer(v, dtype=np.uint8) for k, v in items.items()})
    return b"".join([_header([(name, len(items[name])) for name in names]),
                     *(items[name] for name in names)])


def _plain_fields(data: bytes) -> dict[str, bytes] | None:
    """The fields of ``data`` when its header is exactly :func:`_header`'s for them, else
    None (then safetensors parses it). The fields are read off the header by pattern, and the
    header rebuilt from them must equal it byte for byte, so nothing else gets through."""
    if len(data) < 8:
        return None
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8:
        return None
    fields = [(match[1].decode(), int(match[2]))
              for match in _FIELD.finditer(data, 8, 8 + length)]
    if (sum(size for _, size in fields) != len(data) - 8 - length
            or _header(fields) != data[:8 + length]):
        return None
    out, offset = {}, 8 + length
    for name, size in fields:
        out[name] = bytes(data[offset:offset + size])
        offset += size
    return out


def payload_bytes(data: bytes, sender: str) -> dict[str, bytes]:
    """The named byte strings of ``sender``'s payload; any other field is refused."""
    fields = _plain_fields(data)
    if fields is not None:
        return fields
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
