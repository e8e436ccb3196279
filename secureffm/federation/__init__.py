"""Parties and their keys, the pin kept apart from a run, messages and their encoding, the typed
Channel methods use, the Transport that moves signed bytes, and the message log.

The names below are imported when first used: a deployed Flower node starts a process per
message that imports :mod:`.flower` through this package, and :mod:`.parties` imports torch
(about 1 s of imports on a 2-core machine) that a node's hello and echo do not need.
"""

from ..lazy import exports

__all__ = ["Channel", "Aggregate", "Template", "Transport", "InProcessTransport", "MessageLog",
           "Envelope", "Payload", "Party", "Client", "Registry", "SERVER", "serialize_payload",
           "deserialize_payload"]

# exported name -> the module of this package that defines it
_WHERE = {"Channel": "channel", "Aggregate": "channel", "Template": "channel",
          "MessageLog": "log", "SERVER": "message", "Envelope": "message", "Payload": "message",
          "deserialize_payload": "message", "serialize_payload": "message", "Client": "parties",
          "Party": "parties", "Registry": "parties", "InProcessTransport": "transport",
          "Transport": "transport"}

__getattr__ = exports(__name__, _WHERE)
