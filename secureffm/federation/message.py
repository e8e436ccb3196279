"""Messages between parties and their byte encoding (safetensors: no pickle on the wire)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as _load
from safetensors.numpy import save as _save

from ..errors import MessageError

__all__ = ["Payload", "Envelope", "serialize_payload", "deserialize_payload", "SERVER"]

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


@dataclass(frozen=True)
class Envelope:
    """One delivery: routing header plus the payload bytes as they crossed the engine.

    ``stages`` lists the protocol stages that transformed the payload, in order;
    ``origin``: the client that wrote a payload the server relays ("" when it is the sender's).
    """

    kind: str
    sender: str
    recipient: str
    round: int
    phase: str
    data: bytes
    stages: tuple[str, ...] = field(default=())
    origin: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()
