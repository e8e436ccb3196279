"""Parties and their keys, the pin kept apart from a run, messages and their encoding, the typed
Channel methods use, the Transport that moves signed bytes, and the message log."""

from .channel import Aggregate, Channel, Template
from .log import MessageLog
from .message import SERVER, Envelope, Payload, deserialize_payload, serialize_payload
from .parties import Client, Party, Registry
from .transport import InProcessTransport, Transport

__all__ = ["Channel", "Aggregate", "Template", "Transport", "InProcessTransport", "MessageLog",
           "Envelope", "Payload", "Party", "Client", "Registry", "SERVER", "serialize_payload",
           "deserialize_payload"]
