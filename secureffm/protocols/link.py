"""One exchange of one kind in one round, as each party of this process plays its part.

A stage's server-side and client-side steps send through a :class:`Link`: the sending party
signs its envelope with its own key, and a party that refuses a message raises the signed
``rejected`` event itself. The transport only carries signed bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..federation.exchange import Request
from ..federation.faults import FaultPlan
from ..federation.memory import MemoryCodec
from ..federation.message import SERVER
from ..federation.parties import Client, Party
from ..federation.transport import Delivery, Endpoint, Transport

__all__ = ["Link", "Ask", "accepted", "silence", "record_broadcast", "broadcast_digest",
           "digest_of_broadcasts", "BROADCASTS"]

_BROADCASTS = "broadcasts"


def _load_broadcasts(saved: dict, arrays: dict) -> dict[int, list[tuple[str, str]]]:
    return {int(r): [tuple(pair) for pair in seen] for r, seen in saved.items()}


# What a party noted of the broadcasts it accepted (round -> [(kind, sha256)]) across a
# snapshot; every protocol registers it (:func:`~secureffm.protocols.protocol.build_protocol`).
BROADCASTS = MemoryCodec(_BROADCASTS, lambda seen: ({str(r): v for r, v in seen.items()}, {}),
                         _load_broadcasts)


def record_broadcast(party: Party, round_: int, kind: str, digest: str) -> None:
    """``party`` notes a broadcast it accepted in ``round_``: its kind and the hex SHA-256
    ``digest`` of its bytes (kept in its own memory)."""
    seen = party.memory.setdefault(_BROADCASTS, {}).setdefault(round_, [])
    seen.append((kind, digest))


def broadcast_digest(party: Party, round_: int) -> bytes:
    """SHA-256 over the (kind, sha256) of every broadcast ``party`` accepted in ``round_``, in
    order: equal for two clients exactly when they received the same broadcasts."""
    return digest_of_broadcasts(party.memory.get(_BROADCASTS, {}).get(round_, []))


def digest_of_broadcasts(seen: list[tuple[str, str]]) -> bytes:
    """SHA-256 of the compact JSON list of [kind, sha256 hex] pairs, in order (what an auditor
    recomputes from the broadcast records of one recipient and round)."""
    return hashlib.sha256(json.dumps([list(pair) for pair in seen],
                                     separators=(",", ":")).encode()).digest()


def accepted(delivery: Delivery | None, recipient: str) -> bool:
    """Whether ``recipient`` ran its handler on the server's message and refused nothing (a
    ``rejected`` event it signed)."""
    return delivery is not None and not any(
        e.get("event") == "rejected" and e.get("sender") == recipient for e in delivery.events)


def silence(delivery: Delivery, client: str, default: str) -> str:
    """Why ``client`` answered nothing usable: the reason it gave in its own signed event
    withholding its message (``rejected`` about itself), else ``default``."""
    for event in delivery.events:
        if event.get("event") == "rejected" and event.get("party") == client:
            return event["detail"]
    return default


@dataclass(frozen=True)
class Ask:
    """The server's part of one request to one client: its message ``data`` (None: the client
    speaks first), the handler's public ``args``, and the message's author ``origin`` when the
    server relays a payload another party wrote."""

    data: bytes | None = None
    args: dict = field(default_factory=dict)
    origin: str = ""


@dataclass
class Link:
    """``parties``: the server and the clients by id; ``clients``: the clients in federation
    order; ``stages``: the stages named on every message of this exchange; ``deviations``: a
    threat model's malicious-server deviations the server plays (secureffm/protocols/
    adversary.py), none by default."""

    transport: Transport
    parties: dict[str, Party]
    clients: list[Client]
    round: int
    kind: str
    stages: tuple[str, ...] = ()
    deviations: FaultPlan = field(default_factory=FaultPlan)
    endpoints: Mapping[str, Endpoint] | None = None
    carry: dict[str, bytes] = field(default_factory=dict)  # broadcasts: kind -> bytes

    def send(self, phase: str, sender: str, recipient: str, data: bytes,
             origin: str = "") -> bytes | None:
        """``sender`` signs and sends ``data``; the bytes its recipient accepted, or None. Each
        failed receipt check is logged as the recipient's own ``rejected`` event."""
        return self.deliver(phase, sender, recipient, data, origin).data

    def deliver(self, phase: str, sender: str, recipient: str, data: bytes,
                origin: str = "") -> Delivery:
        """:meth:`send`, returning the whole :class:`Delivery` (its log record's seq too)."""
        delivery = self.transport.send(self.parties[sender].envelope(
            self.round, phase, self.kind, recipient, data, self.stages, origin))
        for refusal in delivery.refusals:
            self.reject(phase, refusal.party, refusal.reason, by=refusal.recipient,
                        refused=refusal.refused)
        return delivery

    def exchange(self, phase: str, reply_phase: str, action: str,
                 asks: dict[str, Ask]) -> dict[str, Delivery]:
        """The server signs each ask's message of ``phase`` and asks each client to run its
        handler ``action``; client id -> the delivery of its ``reply_phase`` answer (absent
        when the client was offline). The server logs its own refusals of the replies. The
        broadcasts in ``carry`` travel with the first exchange that asks the clients to compute
        (an ask with a ``compute`` argument), each client taking them first: the model arrives
        with the request that uses it, and a client need not keep it in its saved state over
        the phases before (a client offline by then gets none: it computes nothing)."""
        server = self.parties[SERVER]
        carry = self.carry if any("compute" in ask.args for ask in asks.values()) else {}
        digests: dict[int, str] = {}  # id of bytes sent to several clients -> their SHA-256

        def digest(data: bytes) -> str:
            if id(data) not in digests:
                digests[id(data)] = hashlib.sha256(data).hexdigest()
            return digests[id(data)]

        requests = {cid: Request(self.round, self.kind, phase, reply_phase, action, self.stages,
                                 None if ask.data is None else server.envelope(
                                     self.round, phase, self.kind, cid, ask.data, self.stages,
                                     ask.origin, digest=digest(ask.data)), ask.args,
                                 tuple(server.envelope(self.round, "broadcast", kind, cid, data,
                                                       digest=digest(data))
                                       for kind, data in carry.items()))
                    for cid, ask in asks.items()}
        if carry:
            self.carry = {}  # delivered with this exchange
        deliveries = self.transport.exchange(requests, self.endpoints)
        for delivery in deliveries.values():
            for refusal in delivery.refusals:
                self.reject(reply_phase, refusal.party, refusal.reason, by=refusal.recipient,
                            refused=refusal.refused)
        return deliveries

    def alive(self, party: str, phase: str) -> bool:
        return self.transport.alive(party, self.round, phase)

    def reject(self, phase: str, party: str, reason: str, by: str = SERVER,
               refused: int | None = None) -> None:
        """``by`` refuses (or withholds) a message of ``party``: a ``rejected`` event, naming
        the logged record it refused (``refused``, its seq) when the transport refused one."""
        self.transport.reject(self.parties[by], self.round, phase, party, reason, refused)

    def event(self, phase: str, event: str, about: str, detail: str, by: str = SERVER,
              fields: dict | None = None) -> None:
        """Any other event, raised and signed by ``by``."""
        self.transport.record(self.parties[by].event(self.round, phase, event, about, detail,
                                                     fields))
