"""Transports move signed bytes between named parties; they know no protocol and no method.

:class:`Transport` is what every engine implements (this module's in-process one; a Flower
engine later): it delivers an :class:`~secureffm.federation.message.Envelope` that its sender
already signed, checks it on the recipient's behalf against the pinned public keys, reports
liveness, and writes the log. It holds no party's private key.

:class:`InProcessTransport` keeps every party in this process. It applies injected faults (the
server's deliveries included) and checks each message on receipt (known sender, unaltered bytes,
valid signature, not a duplicate) as the recipient's network stack would, and returns each
failure as a :class:`Refusal` with the delivery, so that the recipient signs the ``rejected``
event itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from ..errors import MessageError
from .crypto import verify_signature
from .faults import FaultPlan
from .log import MessageLog
from .message import RELAY_PHASE, SERVER, Envelope, canonical
from .parties import Party, Registry

__all__ = ["Transport", "InProcessTransport", "Delivery", "Refusal"]


@dataclass(frozen=True)
class Refusal:
    """A receipt check of ``recipient`` failed for a message from ``party``: ``reason``;
    ``refused``: the seq of the logged record it refused (None for a copy or forgery the log
    does not hold)."""

    recipient: str
    party: str
    reason: str
    refused: int | None = None


@dataclass(frozen=True)
class Delivery:
    """What became of one envelope: ``data``, the bytes its recipient accepted (None when the
    sender was offline, the message was lost or a receipt check failed), ``refusals``, the
    failed receipt checks (of this envelope, of a replayed copy, of an injected forgery), for
    their recipients to log, and ``seq``, the envelope's record in the log (None when it was
    not logged)."""

    data: bytes | None
    refusals: tuple[Refusal, ...] = ()
    seq: int | None = None


class Transport(Protocol):
    """What carries a federation's messages: signed bytes in, accepted bytes out."""

    registry: Registry
    clients: tuple[str, ...]

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """Whether ``party`` is still online in ``phase`` of ``round_``."""

    def send(self, envelope: Envelope) -> Delivery:
        """Deliver a signed envelope (see :class:`Delivery`)."""

    def reject(self, by: Party, round_: int, phase: str, party: str, reason: str,
               refused: int | None = None) -> None:
        """``by`` refuses (or withholds) a message of ``party``: a signed ``rejected`` event,
        naming the logged record it refused (``refused``, its seq) when there is one."""

    def record(self, event: dict) -> None:
        """Log an event a party raised and signed (:meth:`Party.event`)."""

    def close(self, closer: Party) -> str | None:
        """End the log with ``closer``'s signed closing record; returns the log's head."""


class InProcessTransport:
    """Every party is an object of this process; messages cross as bytes, signed and logged.

    ``registry``: the pinned public keys of the server and the ``clients`` (ids, in federation
    order), written to parties.json before any record. ``phases``: the protocol's phase names in
    round order, which injected faults refer to.
    """

    def __init__(self, registry: Registry, clients: list[str], log: MessageLog,
                 phases: tuple[str, ...], faults: FaultPlan | None = None):
        if len(set(clients)) != len(clients) or SERVER in clients:
            raise MessageError(f"client ids must be unique and not {SERVER!r}: {clients}")
        missing = sorted(set(clients) - set(registry.sign))
        if missing:
            raise MessageError(f"no public key registered for {missing[0]}")
        self.registry = registry
        self.clients = tuple(clients)
        self.log = log
        self.phases = phases
        self.faults = faults or FaultPlan()
        self.faults.check_phases(phases, list(clients))
        log.register(registry)
        self._seen: set[tuple] = set()
        self._injected: set[tuple] = set()

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """False once an injected ``drop`` took ``party`` offline in this round."""
        return party == SERVER or not self.faults.dropped(party, round_, phase, self.phases)

    def send(self, envelope: Envelope) -> Delivery:
        """See :meth:`Transport.send`. A sender that is not registered (a forger) is refused by
        name on receipt; its message is not logged as a delivery, since no key in parties.json
        could verify it."""
        sender, round_, phase = envelope.sender, envelope.round, envelope.phase
        recipient = envelope.recipient
        if not self.alive(sender, round_, phase):
            return Delivery(None)
        refusals = self._inject_unknown_sender(envelope)
        if sender not in self.registry.sign:
            return Delivery(None, (*refusals, Refusal(
                recipient, sender, f"{envelope.kind} message (sha256 {envelope.sha256[:16]}...) "
                "from a party that is not registered in this federation")))
        record = self.log.append(envelope)
        seq = record["seq"]
        if self.faults.find("lose", sender, round_, phase, recipient):
            return Delivery(None, refusals, seq)
        if self.faults.find("delay", sender, round_, phase, recipient):
            return Delivery(None, (*refusals, Refusal(
                recipient, sender, f"{envelope.kind} message seq {seq} arrived after the phase "
                "closed", seq)), seq)
        received = envelope.data
        if self.faults.find("corrupt", sender, round_, phase, recipient) and received:
            received = bytes([received[0] ^ 0xFF]) + received[1:]
        refused = self._receive(record, envelope, received)
        if refused is not None:
            refusals = (*refusals, refused)
        if self.faults.find("replay", sender, round_, phase, recipient):
            again = self._receive(record, envelope, envelope.data)
            refusals = (*refusals, again) if again else refusals
        return Delivery(None if refused else received, refusals, seq)

    def _receive(self, record: dict, envelope: Envelope, received: bytes) -> Refusal | None:
        """The recipient's checks: unaltered bytes, valid signature, an ``origin`` only on a
        relayed payload, first copy (one per round, phase, kind, sender, recipient and, in
        :data:`RELAY_PHASE`, origin)."""
        sender, round_, phase = envelope.sender, envelope.round, envelope.phase
        recipient = envelope.recipient
        if hashlib.sha256(received).hexdigest() != envelope.sha256:
            return Refusal(recipient, sender, f"message seq {record['seq']} was altered in "
                           "transit (sha256 of the bytes received does not match the signed "
                           "one)", record["seq"])
        if not verify_signature(self.registry.sign[sender], envelope.sig,
                                canonical(envelope.header())):
            return Refusal(recipient, sender, f"message seq {record['seq']} has an invalid "
                           "signature", record["seq"])
        if envelope.origin and phase != RELAY_PHASE:
            return Refusal(recipient, sender, f"message seq {record['seq']} names an author "
                           f"({envelope.origin}) in phase {phase}; only a payload relayed in "
                           f"phase {RELAY_PHASE} has an author other than its sender",
                           record["seq"])
        key = (round_, phase, envelope.kind, sender, recipient, envelope.origin)
        if key in self._seen:
            return Refusal(recipient, sender, f"duplicate or replayed {envelope.kind} message "
                           f"(round {round_}, phase {phase}); the first copy stands")
        self._seen.add(key)
        return None

    def _inject_unknown_sender(self, envelope: Envelope) -> tuple[Refusal, ...]:
        """Each ``unknown_sender`` fault due now sends, once, a copy of ``envelope``'s bytes to
        the server in the name of its unregistered party, signed with a key of its own;
        returns what the server refused."""
        round_, phase = envelope.round, envelope.phase
        refusals: tuple[Refusal, ...] = ()
        for fault in self.faults.faults:
            key = (fault.party, round_, phase)
            if (fault.action == "unknown_sender" and fault.phase == phase and fault.hits(round_)
                    and envelope.recipient == SERVER and key not in self._injected):
                self._injected.add(key)
                refusals += self.send(Party(fault.party).envelope(
                    round_, phase, envelope.kind, SERVER, envelope.data)).refusals
        return refusals

    def reject(self, by: Party, round_: int, phase: str, party: str, reason: str,
               refused: int | None = None) -> None:
        fields = None if refused is None else {"refused": refused}
        self.record(by.event(round_, phase, "rejected", party, reason, fields))

    def record(self, event: dict) -> None:
        self.log.event(event)

    def close(self, closer: Party) -> str | None:
        return self.log.close(closer)
