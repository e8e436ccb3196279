"""The ``sealed`` stage: end-to-end encryption of individual messages relayed by the server.

A sealed message is encrypted once under a fresh 32-byte content key (AES-256-GCM); the content
key is wrapped for each recipient under HKDF(X25519(sender's sealing key, recipient's sealing
key)), bound to the kind, round, sender and recipient. Only the sender and that recipient can
derive the wrapping key, so the relaying server can neither read a model nor forge one in a
client's name, and a copy replayed into another round, kind or pair fails authentication.
Sealing keys are long-term X25519 keys whose public halves every party knows (as it knows the
signing keys of parties.json).

Spec keys: ``protects`` (kinds, e.g. ``["model"]``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.message import Payload, deserialize_payload, serialize_payload
from .crypto import KeyPair, agree, open_sealed, seal
from .protocol import check_protects, check_table, register_stage

__all__ = ["SealedStage", "seal_payload", "relay_part", "open_payload"]

_KEYS = {"stage", "protects"}


def _context(kind: str, round_: int, sender: str, recipient: str = "*") -> bytes:
    return f"sealed|{kind}|{round_}|{sender}|{recipient}".encode()


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def seal_payload(payload: Payload, kind: str, round_: int, sender: KeyPair, sender_id: str,
                 recipients: dict[str, bytes]) -> bytes:
    """Encrypt ``payload`` once and wrap its key for every recipient (id -> sealing public key).

    Returns serialized fields ``content`` (nonce + ciphertext) and ``key/<recipient>`` (the
    wrapped 32-byte content key, 60 bytes each).
    """
    content_key = os.urandom(32)
    fields = {"content": _bytes(seal(content_key, serialize_payload(payload),
                                     _context(kind, round_, sender_id), os.urandom(12)))}
    for recipient, public in recipients.items():
        context = _context(kind, round_, sender_id, recipient)
        wrap_key = agree(sender.private, public, b"sealed/" + context)
        fields[f"key/{recipient}"] = _bytes(seal(wrap_key, content_key, context, os.urandom(12)))
    return serialize_payload(fields)


def relay_part(data: bytes, recipient: str, sender_id: str) -> bytes:
    """What the server forwards to ``recipient``: the ciphertext and that recipient's key."""
    fields = deserialize_payload(data, sender_id)
    name = f"key/{recipient}"
    if "content" not in fields or name not in fields:
        raise MessageError(f"sealed message from {sender_id} holds no key for {recipient}")
    return serialize_payload({"content": fields["content"], "key": fields[name]})


def open_payload(data: bytes, kind: str, round_: int, sender_id: str, sender_public: bytes,
                 recipient: KeyPair, recipient_id: str) -> Payload:
    """Recipient side: unwrap the content key and decrypt; ProtocolError if anything was
    altered, addressed to someone else, or sealed for another round or kind."""
    fields = deserialize_payload(data, sender_id)
    key_name = "key" if "key" in fields else f"key/{recipient_id}"
    if "content" not in fields or key_name not in fields:
        raise MessageError(f"sealed message from {sender_id} holds no key for {recipient_id}")
    context = _context(kind, round_, sender_id, recipient_id)
    wrap_key = agree(recipient.private, sender_public, b"sealed/" + context)
    content_key = open_sealed(wrap_key, fields[key_name].tobytes(), context)
    return deserialize_payload(open_sealed(content_key, fields["content"].tobytes(),
                                           _context(kind, round_, sender_id)),
                               sender_id)


@register_stage
class SealedStage:
    """Marks kinds sent one by one that only their recipients may read; see module docstring."""

    name = "sealed"
    role = "transport"
    phases = ()
    can_protect = frozenset({"model", "measure", "scalar"})

    def __init__(self, protects: tuple[str, ...]):
        self.protects = protects

    @classmethod
    def from_table(cls, table: dict, source: str) -> SealedStage:
        where = f"{source} (stage 'sealed')"
        check_table(table, _KEYS, ("protects",), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "messages the server only needs summed are "
                       "protected by secure aggregation instead")
        if not protects:
            raise ProtocolError(f"{where}: protects is empty; name the kinds to seal")
        return cls(protects)

    def validate_for(self, clients: int) -> None:
        """Sealing works for any number of parties."""

    def seal(self, engine, payload: Payload, kind: str, round_: int, sender: str,
             recipients: list[str]) -> bytes:
        """``sender`` seals ``payload`` for ``recipients`` with the engine's sealing keys."""
        return seal_payload(payload, kind, round_, engine.sealing_keys[sender], sender,
                            {r: engine.sealing_public[r] for r in recipients})

    def relay(self, data: bytes, recipient: str, sender: str) -> bytes:
        return relay_part(data, recipient, sender)

    def open(self, engine, data: bytes, kind: str, round_: int, sender: str,
             recipient: str) -> Payload:
        return open_payload(data, kind, round_, sender, engine.sealing_public[sender],
                            engine.sealing_keys[recipient], recipient)
