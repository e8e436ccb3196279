"""The ``sealed`` stage: end-to-end encryption of individual messages relayed by the server,
signed by their author.

A sealed message carries a header (:class:`SealHeader`: kind, round, phase, sender, the sorted
recipient set and the sender's message counter), a ``content`` field encrypted once under a
fresh 32-byte content key (AES-256-GCM, the header as associated data), the author's Ed25519
signature over a domain label, the header and SHA-256(content), and, per recipient, the content
key wrapped under HKDF(X25519(sender's sealing key, recipient's sealing key)) bound to the
header and that recipient.

A recipient rebuilds the header from what it expects (kind, round, phase, sender) and the
counter and recipient set on the wire, checks that it is a recipient, verifies the signature
against the sender's *pinned* signing key before decrypting anything, and refuses a counter not
above the last one it accepted from that sender. So:

- the relay cannot read a model, forge one, swap content between authors or replay a message
  into another kind, round, phase or recipient set: each changes the signed bytes;
- a recipient, which knows the content key shared by all recipients of one all-gather, cannot
  re-encrypt other content under it for another recipient: it cannot sign as the author;
- the counter stops what kind, round and phase cannot: a copy delivered twice in the same phase,
  or an earlier message of the same kind, round and phase delivered in place of (or after) a
  later one. The check is the recipient's own; the engine's duplicate check is the relay's.

Not hidden: sizes, timing, who sends to whom, the recipient set and counter (in the clear, as
the relay routes by them). The signature makes a model non-repudiable: a recipient can show a
third party which ciphertext (and, by revealing the content key, which model) the author sent.
Keys are per run, so the context carries no run id; long-lived keys would need one.

Spec keys: ``protects`` (kinds, e.g. ``["model"]``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.crypto import Identity, KeyPair, agree, open_sealed, seal, verify_signature
from ..federation.memory import MemoryCodec
from ..federation.message import SERVER, Payload, deserialize_payload, serialize_payload
from ..federation.parties import Party, Registry
from .registry import check_protects, check_table
from .stage import StageDefaults

__all__ = ["SealedStage", "SealHeader", "Opened", "seal_payload", "relay_part", "open_payload"]

_KEYS = {"stage", "protects"}
_DOMAIN = b"secureffm/sealed/v2"
_WIRE = ("content", "signature", "counter", "recipients")


@dataclass(frozen=True)
class SealHeader:
    """What one sealed message is bound to; ``recipients`` sorted, ``counter`` >= 0."""

    kind: str
    round: int
    phase: str
    sender: str
    recipients: tuple[str, ...]
    counter: int

    def encode(self) -> bytes:
        """Domain label + canonical JSON: the associated data of the content."""
        fields = [self.kind, int(self.round), self.phase, self.sender, list(self.recipients),
                  self.counter]
        return _DOMAIN + b"|" + json.dumps(fields, separators=(",", ":")).encode()

    def signed_bytes(self, content: bytes) -> bytes:
        """What the author signs: the encoded header and SHA-256 of the content field."""
        return self.encode() + b"|" + hashlib.sha256(content).digest()

    def wrap_context(self, recipient: str) -> bytes:
        """Associated data of the content key wrapped for ``recipient``."""
        return self.encode() + b"|to|" + recipient.encode()


@dataclass(frozen=True)
class Opened:
    """A sealed message as its recipient accepted it."""

    payload: Payload
    counter: int


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def seal_payload(payload: Payload, header: SealHeader, signer: Identity, sealing: KeyPair,
                 sealing_public: dict[str, bytes]) -> bytes:
    """Encrypt ``payload`` once, sign it with ``signer`` (``header.sender``'s identity) and
    wrap its key for each of ``header.recipients`` (``sealing_public``: id -> pinned sealing
    public key).

    Returns serialized fields ``content`` (nonce + ciphertext), ``signature`` (64 bytes),
    ``counter``, ``recipients`` (JSON) and ``key/<recipient>`` (the wrapped key, 60 bytes each).
    """
    content_key = os.urandom(32)
    content = seal(content_key, serialize_payload(payload), header.encode(), os.urandom(12))
    fields = {"content": _bytes(content),
              "signature": _bytes(signer.sign(header.signed_bytes(content))),
              "counter": np.array([header.counter], dtype=np.uint64),
              "recipients": _bytes(json.dumps(list(header.recipients)).encode())}
    for recipient in header.recipients:
        wrap_key = agree(sealing.private, sealing_public[recipient], b"sealed/wrap")
        fields[f"key/{recipient}"] = _bytes(seal(wrap_key, content_key,
                                                 header.wrap_context(recipient), os.urandom(12)))
    return serialize_payload(fields)


def relay_part(data: bytes, recipient: str, sender_id: str) -> bytes:
    """What the server forwards to ``recipient``: the signed fields and that recipient's key."""
    fields = deserialize_payload(data, sender_id)
    name = f"key/{recipient}"
    if any(f not in fields for f in _WIRE) or name not in fields:
        raise MessageError(f"sealed message from {sender_id} holds no key for {recipient}")
    return serialize_payload({**{f: fields[f] for f in _WIRE}, "key": fields[name]})


def _read_header(fields: Payload, kind: str, round_: int, phase: str,
                 sender_id: str) -> SealHeader:
    """The header a recipient expects, completed with the wire's counter and recipient set."""
    counter = fields["counter"]
    if counter.dtype != np.uint64 or counter.shape != (1,):
        raise MessageError(f"sealed message from {sender_id}: counter must be one uint64")
    try:
        recipients = json.loads(fields["recipients"].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        recipients = None
    if (not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients)
            or recipients != sorted(recipients)):
        raise MessageError(f"sealed message from {sender_id}: recipients must be a sorted "
                           "JSON list of party ids")
    return SealHeader(kind, round_, phase, sender_id, tuple(recipients), int(counter[0]))


def open_payload(data: bytes, kind: str, round_: int, phase: str, sender_id: str,
                 sender_signing: bytes, sender_sealing: bytes, recipient: KeyPair,
                 recipient_id: str, after: int = -1) -> Opened:
    """Recipient side: verify the author's signature against its pinned signing key
    ``sender_signing``, then unwrap the content key and decrypt.

    ``after``: the highest counter this recipient accepted from ``sender_id`` (-1: none).
    Raises ProtocolError naming the sender if the message is not signed by it for this kind,
    round, phase and recipient, if its counter is not above ``after``, or if a key or the
    content fails authentication; MessageError if a field is missing or malformed.
    """
    fields = deserialize_payload(data, sender_id)
    key_name = "key" if "key" in fields else f"key/{recipient_id}"
    if any(f not in fields for f in _WIRE) or key_name not in fields:
        raise MessageError(f"sealed message from {sender_id} holds no key for {recipient_id}")
    header = _read_header(fields, kind, round_, phase, sender_id)
    if recipient_id not in header.recipients:
        raise ProtocolError(f"sealed {kind} message of {sender_id} is not addressed to "
                            f"{recipient_id}")
    content = fields["content"].tobytes()
    if not verify_signature(sender_signing, fields["signature"].tobytes(),
                            header.signed_bytes(content)):
        raise ProtocolError(f"sealed {kind} message is not signed by {sender_id}'s pinned key "
                            f"for round {round_}, phase {phase} (forged, altered or replayed)")
    if header.counter <= after:
        raise ProtocolError(f"sealed {kind} message of {sender_id} replayed or out of order: "
                            f"counter {header.counter} is not above {after}, the last accepted")
    wrap_key = agree(recipient.private, sender_sealing, b"sealed/wrap")
    content_key = open_sealed(wrap_key, fields[key_name].tobytes(),
                              header.wrap_context(recipient_id))
    plain = open_sealed(content_key, content, header.encode())
    return Opened(deserialize_payload(plain, sender_id), header.counter)


def _load_counters(saved: dict, arrays: dict) -> dict:
    return {"next": int(saved["next"]), "accepted": {
        str(sender): int(counter) for sender, counter in saved["accepted"].items()}}


# A party's counters (JSON as they are) across a snapshot.
COUNTERS = MemoryCodec("sealed", lambda counters: (counters, {}), _load_counters)


class SealedStage(StageDefaults):
    """Marks kinds sent one by one that only their recipients may read; see module docstring.

    Each party keeps its own counters in its ``memory``: the counter of its next sealed
    message, and per sender the highest counter it accepted.
    """

    name = "sealed"
    role = "seal"
    phases = ()
    can_protect = frozenset({"model", "measure", "scalar"})
    memory = (COUNTERS,)

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

    def claim(self, kind: str) -> tuple[str, str]:
        return ("sealed end to end for its recipients and signed by its author: the relay can "
                "neither read nor forge it; every recipient reads it in full",
                "recipients are trusted with what they receive; sizes, timing and recipient "
                "sets stay visible")

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str]:
        """Its recipients only: the client it is delivered to, the peers a server relays it
        to, or the server."""
        if record["recipient"] != SERVER:
            return frozenset({"recipient"}), f"sealed to {record['recipient']}"
        return (frozenset(), "sealed to the peers it is relayed to") if relayed else (
            frozenset({"server"}), f"sealed to the server (stages {record['stages']})")

    def seal(self, sender: Party, registry: Registry, payload: Payload, kind: str,
             round_: int, phase: str, recipients: list[str]) -> bytes:
        """``sender`` seals ``payload`` for ``recipients``, who receive it in ``phase``, with
        its own signing identity and sealing key and the recipients' pinned sealing keys."""
        memory = sender.memory.setdefault(self.name, {"next": 0, "accepted": {}})
        counter = memory["next"]
        memory["next"] = counter + 1
        header = SealHeader(kind, round_, phase, sender.id, tuple(sorted(recipients)), counter)
        return seal_payload(payload, header, sender.identity, sender.sealing, registry.seal)

    def relay(self, data: bytes, recipient: str, sender: str) -> bytes:
        return relay_part(data, recipient, sender)

    def open(self, recipient: Party, registry: Registry, data: bytes, kind: str, round_: int,
             phase: str, sender: str) -> Payload:
        """``recipient`` opens a message of ``sender`` against ``sender``'s pinned keys."""
        memory = recipient.memory.setdefault(self.name, {"next": 0, "accepted": {}})
        opened = open_payload(data, kind, round_, phase, sender, registry.sign[sender],
                              registry.seal[sender], recipient.sealing, recipient.id,
                              after=memory["accepted"].get(sender, -1))
        memory["accepted"][sender] = opened.counter
        return opened.payload
