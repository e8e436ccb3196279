"""Transports move signed bytes between named parties; they know no protocol and no method.

:class:`Transport` is what every engine implements (this module's in-process one;
:class:`~secureffm.federation.remote.RemoteTransport` for clients in processes of their own,
on Flower): it carries each phase's requests to the clients and their replies back
(:meth:`Transport.exchange`, see :mod:`.exchange`), checks each message the server receives
against the pinned public keys, reports liveness, and writes the log. It holds no party's
private key.

:class:`InProcessTransport` keeps every party in this process. It applies injected faults (the
server's deliveries included) and checks each message on receipt (known sender, unaltered bytes,
valid signature, not a duplicate) as the recipient's network stack would, and returns each
failure as a :class:`Refusal` with the delivery, so that the recipient signs the ``rejected``
event itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import MessageError
from .exchange import Incoming, Receipts, Refusal, Reply, Request, late_refusal
from .faults import FaultPlan
from .log import MessageLog
from .message import SERVER, Envelope
from .parties import Party, Registry

__all__ = ["Transport", "InProcessTransport", "Delivery", "Refusal", "Endpoint", "LoggedEvents"]

# A client's side of the boundary: it answers a request, given the server's message as it
# arrived (None when the request carries none or it was lost) and the broadcasts that arrived
# with it.
Endpoint = Callable[[Request, Incoming | None, tuple[Incoming, ...]], Reply]


@dataclass(frozen=True)
class Delivery:
    """What became of one envelope: ``data``, the bytes its recipient accepted (None when the
    sender was offline, the message was lost or a receipt check failed), ``refusals``, the
    failed receipt checks (of this envelope, of a replayed copy, of an injected forgery), for
    their recipients to log, ``seq``, the envelope's record in the log (None when it was
    not logged), and, for a reply in an exchange, the ``events`` its client signed while
    answering (already logged)."""

    data: bytes | None
    refusals: tuple[Refusal, ...] = ()
    seq: int | None = None
    events: tuple[dict, ...] = ()


class Transport(Protocol):
    """What carries a federation's messages: signed bytes in, accepted bytes out."""

    registry: Registry
    clients: tuple[str, ...]

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """Whether ``party`` is still online in ``phase`` of ``round_``."""

    def send(self, envelope: Envelope) -> Delivery:
        """Deliver a signed envelope (see :class:`Delivery`)."""

    def exchange(self, requests: dict[str, Request],
                 endpoints: Mapping[str, Endpoint] | None = None) -> dict[str, Delivery]:
        """One request to each named client, answered on the client's side: client id -> the
        :class:`Delivery` of its reply to the server (absent when the client was offline;
        data None when it sent nothing or the server's receipt check refused it). Every
        message both ways is logged, and the events the clients signed are recorded.
        ``endpoints``: the clients' sides when they live in this process (the in-process
        engine calls them); an engine whose clients run elsewhere takes None."""

    def reject(self, by: Party, round_: int, phase: str, party: str, reason: str,
               refused: int | None = None) -> None:
        """``by`` refuses (or withholds) a message of ``party``: a signed ``rejected`` event,
        naming the logged record it refused (``refused``, its seq) when there is one."""

    def record(self, event: dict) -> None:
        """Log an event a party raised and signed (:meth:`Party.event`)."""

    def close(self, closer: Party) -> str | None:
        """End the log with ``closer``'s signed closing record; returns the log's head."""


class LoggedEvents:
    """What every transport does with events: they go to its ``log`` (a :class:`MessageLog`),
    signed by the party that raised them."""

    log: MessageLog

    def reject(self, by: Party, round_: int, phase: str, party: str, reason: str,
               refused: int | None = None) -> None:
        fields = None if refused is None else {"refused": refused}
        self.record(by.event(round_, phase, "rejected", party, reason, fields))

    def record(self, event: dict) -> None:
        self.log.event(event)

    def close(self, closer: Party) -> str | None:
        return self.log.close(closer)


class InProcessTransport(LoggedEvents):
    """Every party is an object of this process; messages cross as bytes, signed and logged.

    ``registry``: the pinned public keys of the server and the ``clients`` (ids, in federation
    order), written to parties.json before any record. ``phases``: the protocol's phase names in
    round order, which injected faults refer to. It holds no client: :meth:`exchange` calls
    the endpoints the caller hands it.
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
        self._receipts = Receipts(registry)
        self._injected: set[tuple] = set()

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """False once an injected ``drop`` took ``party`` offline in this round."""
        return party == SERVER or not self.faults.dropped(party, round_, phase, self.phases)

    def send(self, envelope: Envelope) -> Delivery:
        """See :meth:`Transport.send`. A sender that is not registered (a forger) is refused by
        name on receipt; its message is not logged as a delivery, since no key in parties.json
        could verify it."""
        if not self.alive(envelope.sender, envelope.round, envelope.phase):
            return Delivery(None)
        refusals = self._inject_unknown_sender(envelope)
        if envelope.sender not in self.registry.sign:
            return Delivery(None, (*refusals, Refusal(
                envelope.recipient, envelope.sender, f"{envelope.kind} message (sha256 "
                f"{envelope.sha256[:16]}...) from a party that is not registered in this "
                "federation")))
        arrived, seq = self._transmit(envelope)
        if arrived is None:
            return Delivery(None, refusals, seq)
        if arrived.late:
            return Delivery(None, (*refusals, late_refusal(arrived)), seq)
        refused = self._receipts.check(envelope, arrived.data, seq)
        if refused is not None:
            refusals = (*refusals, refused)
        if self._replayed(envelope):
            again = self._receipts.check(envelope, envelope.data, seq)
            refusals = (*refusals, again) if again else refusals
        return Delivery(None if refused else arrived.data, refusals, seq)

    def exchange(self, requests: dict[str, Request],
                 endpoints: Mapping[str, Endpoint] | None = None) -> dict[str, Delivery]:
        """See :meth:`Transport.exchange` (``endpoints`` are required here): first the
        requests' broadcasts, then their messages are logged (with the injected faults on the
        server's deliveries), then each client online at the request's phase runs its endpoint
        (its reply is lost when it goes offline before the reply's phase), then every reply is
        delivered to the server as :meth:`send` does."""
        if endpoints is None:
            raise MessageError("the in-process transport runs the clients' endpoints it is "
                               "given; none were")
        carried: dict[str, list[Incoming]] = {cid: [] for cid in requests}
        for index in range(max((len(r.broadcasts) for r in requests.values()), default=0)):
            for cid, request in requests.items():
                if index < len(request.broadcasts):
                    carried[cid] += self._arrivals(request.broadcasts[index])
        arrived = {cid: [None] if request.envelope is None else
                   self._arrivals(request.envelope) for cid, request in requests.items()}
        replies: dict[str, Reply] = {}
        for cid, request in requests.items():
            if not self.alive(cid, request.round, request.phase):
                continue
            first = arrived[cid][0] if arrived[cid] else None  # None: lost, or none sent
            answers = [endpoints[cid](request, first, tuple(carried[cid]))]
            answers += [endpoints[cid](request, copy, ()) for copy in arrived[cid][1:]]
            for answer in answers:
                for event in answer.events:
                    self.record(event)
            lost = request.envelope is not None and first is None  # nothing to answer
            if not lost and self.alive(cid, request.round, request.reply_phase):
                replies[cid] = answers[0]
        return {cid: replace(self.send(reply.envelope) if reply.envelope is not None
                             else Delivery(None), events=reply.events)
                for cid, reply in replies.items()}

    def _arrivals(self, envelope: Envelope) -> list[Incoming]:
        """Log ``envelope`` and carry it: the copies that arrive (none when lost; two when
        replayed)."""
        incoming, _ = self._transmit(envelope)
        if incoming is None:
            return []
        if self._replayed(envelope):
            return [incoming, Incoming(envelope, envelope.data, incoming.seq)]
        return [incoming]

    def _transmit(self, envelope: Envelope) -> tuple[Incoming | None, int]:
        """Log ``envelope`` and carry it: what arrived (None when an injected fault lost it),
        and its record's seq."""
        sender, round_, phase, recipient = (envelope.sender, envelope.round, envelope.phase,
                                            envelope.recipient)
        seq = self.log.append(envelope)["seq"]
        if self.faults.find("lose", sender, round_, phase, recipient):
            return None, seq
        late = bool(self.faults.find("delay", sender, round_, phase, recipient))
        data = envelope.data
        if self.faults.find("corrupt", sender, round_, phase, recipient) and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return Incoming(envelope, data, seq, late), seq

    def _replayed(self, envelope: Envelope) -> bool:
        return bool(self.faults.find("replay", envelope.sender, envelope.round,
                                     envelope.phase, envelope.recipient))

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
