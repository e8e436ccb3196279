"""Messages between parties and their byte encoding (safetensors: no pickle on the wire)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as _load
from safetensors.numpy import save as _save

from ..errors import MessageError

__all__ = ["Payload", "Envelope", "serialize_payload", "deserialize_payload", "SERVER",
           "canonical", "is_hex", "is_link", "link_of", "UNSIGNED_FIELDS"]

Payload = dict[str, np.ndarray]
SERVER = "server"


def serialize_payload(payload: Payload) -> bytes:
    """Encode named arrays as safetensors bytes (deterministic for equal inputs)."""
    return _save({name: np.ascontiguousarray(array) for name, array in payload.items()})


def deserialize_payload(data: bytes, sender: str = "?") -> Payload:
    """Decode bytes from :func:`serialize_payload`; malformed bytes name the sender."""
    try:
        return dict(_load(data))
    except (SafetensorError, ValueError, OSError) as err:
        raise MessageError(f"message from {sender} is not a valid payload: {err}") from None


# Fields of a log record that its signer does not sign: the signature itself and the record's
# place in the log and in payloads.bin, which only the log's writer knows (the closing record
# signs the chain; the signed sha256 checks whatever bytes an offset points at).
UNSIGNED_FIELDS = frozenset({"sig", "seq", "prev", "offset"})

# The one phase in which the server forwards a payload another party wrote (``origin``).
RELAY_PHASE = "relay"


_HEX = re.compile("[0-9a-f]*")


def is_hex(value: object, length: int) -> bool:
    """True when ``value`` is a string of ``length`` lowercase hex digits."""
    return isinstance(value, str) and len(value) == length and _HEX.fullmatch(value) is not None


def is_link(value: object) -> bool:
    """Whether ``value`` can be a record's ``last``: 64 lowercase hex digits (a record without
    one omits the field; an envelope holds "")."""
    return is_hex(value, 64)


def link_of(signed: bytes) -> str:
    """The back link to a record whose signer signed ``signed`` (its :func:`canonical` bytes):
    their hex sha256, what the signer's next record carries as ``last``."""
    return hashlib.sha256(signed).hexdigest()


def canonical(record: dict) -> bytes:
    """The bytes a party signs for a record: sorted-key compact JSON of its content (every
    field but :data:`UNSIGNED_FIELDS`)."""
    body = {k: v for k, v in record.items() if k not in UNSIGNED_FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Envelope:
    """One delivery: routing header plus the payload bytes as they cross the transport.

    ``stages`` lists the protocol stages that transformed the payload, in order;
    ``origin``: the client that wrote a payload the server relays in :data:`RELAY_PHASE` (""
    when it is the sender's, as in every other phase);
    ``sig``: the sender's Ed25519 signature of :func:`canonical` of :meth:`header` (made by the
    sending party before the transport sees the message; empty until signed);
    ``last``: hex sha256 of the bytes its sender signed for the record it signed before this one
    ("" for its first): a signed back link that lets an audit authenticate the earlier record
    without verifying its signature (:func:`link_of`, docs/log-format.md).
    """

    kind: str
    sender: str
    recipient: str
    round: int
    phase: str
    data: bytes
    stages: tuple[str, ...] = field(default=())
    origin: str = ""
    sig: bytes = b""
    last: str = ""

    @cached_property
    def sha256(self) -> str:
        """Hex SHA-256 of ``data``, computed once per envelope (a payload can be megabytes)."""
        return hashlib.sha256(self.data).hexdigest()

    def signed(self, sig: bytes) -> Envelope:
        """This envelope with its sender's signature ``sig``, keeping the computed digest."""
        out = replace(self, sig=sig)
        out.__dict__["sha256"] = self.sha256  # what cached_property stores; data is the same
        return out

    def header(self) -> dict:
        """The delivery's log record without its place in the log: what the sender signs."""
        record = {"round": self.round, "phase": self.phase, "kind": self.kind,
                  "sender": self.sender, "recipient": self.recipient,
                  "stages": list(self.stages), "bytes": len(self.data), "sha256": self.sha256}
        if self.origin:
            record["origin"] = self.origin
        if self.last:
            record["last"] = self.last
        return record
