"""Messages, their encoding, the in-process engine and the message log."""

from .engine import InProcessEngine
from .log import MessageLog
from .message import SERVER, Envelope, Payload, deserialize_payload, serialize_payload
from .parties import Client

__all__ = ["InProcessEngine", "MessageLog", "Envelope", "Payload", "Client", "SERVER",
           "serialize_payload", "deserialize_payload"]
