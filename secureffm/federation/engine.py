"""The in-process engine: moves serialized messages between parties and logs every delivery.

It knows neither the method nor what payloads mean: protocols call :meth:`send` for each
message of each phase; the engine signs the record with the sender's identity, applies injected
faults (the server's deliveries included), checks the message on receipt (known sender,
unaltered bytes, valid signature, not a duplicate) and logs a ``rejected`` event, signed by
the recipient, for everything it rejects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import MessageError
from .crypto import Identity, new_key_pair, verify_signature
from .faults import FaultPlan
from .log import MessageLog, canonical
from .message import SERVER, Envelope, Payload, serialize_payload
from .parties import Client

if TYPE_CHECKING:
    from ..protocols.protocol import Protocol

__all__ = ["InProcessEngine", "Aggregate", "Template"]

# Expected payload of an aggregation: field name -> (shape, dtype).
Template = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass
class Aggregate:
    """What the server obtained from one aggregation.

    ``payload``: sum_i w_i x_i / sum_i w_i over the ``included`` clients, or None when the
    round aborted (``reason`` says why); ``dropped``: client id -> why it was left out.
    """

    payload: Payload | None
    included: list[str]
    dropped: dict[str, str] = field(default_factory=dict)
    reason: str = ""


class InProcessEngine:
    """Parties are objects in this process; messages cross as bytes, signed and logged."""

    def __init__(self, clients: list[Client], protocol: Protocol, log: MessageLog,
                 faults: FaultPlan | None = None):
        ids = [c.id for c in clients]
        if len(set(ids)) != len(ids) or SERVER in ids:
            raise MessageError(f"client ids must be unique and not {SERVER!r}: {ids}")
        self.clients = clients
        self.protocol = protocol
        self.log = log
        self.faults = faults or FaultPlan()
        self.faults.check_phases(protocol.phases, ids)
        self.identities = {SERVER: Identity(), **{c.id: c.identity for c in clients}}
        self.public_keys = {party: ident.public for party, ident in self.identities.items()}
        # Long-term X25519 keys for sealed messages; every party knows the public halves.
        self.sealing_keys = {SERVER: new_key_pair(), **{c.id: c.sealing for c in clients}}
        self.sealing_public = {party: key.public for party, key in self.sealing_keys.items()}
        log.register(self.public_keys, self.sealing_public)
        self._seen: set[tuple] = set()
        self._injected: set[tuple] = set()
        protocol.validate_for(len(clients))

    # -- transport -------------------------------------------------------------------------

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """False once an injected ``drop`` took ``party`` offline in this round."""
        return party == SERVER or not self.faults.dropped(party, round_, phase,
                                                          self.protocol.phases)

    def send(self, round_: int, phase: str, kind: str, sender: str, recipient: str,
             data: bytes, stages: tuple[str, ...] = (), origin: str = "") -> bytes | None:
        """Deliver ``data``; returns the bytes the recipient accepted, or None when the sender
        is offline, the message was lost, or the recipient rejected it (a logged event says
        why). ``origin``: the client whose payload the server relays, if any.

        A ``sender`` that is not registered (a forger) is rejected by name on receipt; its
        message is not logged as a delivery, since no key in parties.json could verify it."""
        if not self.alive(sender, round_, phase):
            return None
        self._inject_unknown_sender(round_, phase, kind, recipient, data)
        envelope = Envelope(kind, sender, recipient, round_, phase, data, stages, origin)
        if sender not in self.identities:
            return self._receive({"round": round_, "phase": phase, "kind": kind,
                                  "sender": sender, "recipient": recipient,
                                  "sha256": envelope.sha256}, data)
        record = self.log.append(envelope, self.identities[sender])
        if self.faults.find("lose", sender, round_, phase, recipient):
            return None
        if self.faults.find("delay", sender, round_, phase, recipient):
            self.reject(round_, phase, sender, f"{kind} message seq {record['seq']} arrived "
                        "after the phase closed", by=recipient)
            return None
        received = data
        if self.faults.find("corrupt", sender, round_, phase, recipient) and data:
            received = bytes([data[0] ^ 0xFF]) + data[1:]
        accepted = self._receive(record, received)
        if self.faults.find("replay", sender, round_, phase, recipient):
            self._receive(record, data)
        return accepted

    def _receive(self, record: dict, received: bytes) -> bytes | None:
        """The recipient's checks: known sender, unaltered bytes, valid signature, first copy.
        A failed check is a ``rejected`` event signed by the recipient."""
        sender, round_, phase = record["sender"], record["round"], record["phase"]
        recipient = record["recipient"]
        if sender not in self.public_keys:
            self.reject(round_, phase, sender, f"{record['kind']} message (sha256 "
                        f"{record['sha256'][:16]}...) from a party that is not registered in "
                        "this federation", by=recipient)
            return None
        if hashlib.sha256(received).hexdigest() != record["sha256"]:
            self.reject(round_, phase, sender, f"message seq {record['seq']} was altered in "
                        "transit (sha256 of the bytes received does not match the signed one)",
                        by=recipient)
            return None
        if not verify_signature(self.public_keys[sender], bytes.fromhex(record["sig"]),
                                canonical(record)):
            self.reject(round_, phase, sender, f"message seq {record['seq']} has an invalid "
                        "signature", by=recipient)
            return None
        key = (round_, phase, record["kind"], sender, recipient, record.get("origin", ""))
        if key in self._seen:
            self.reject(round_, phase, sender, f"duplicate or replayed {record['kind']} message "
                        f"(round {round_}, phase {phase}); the first copy stands", by=recipient)
            return None
        self._seen.add(key)
        return received

    def _inject_unknown_sender(self, round_: int, phase: str, kind: str, recipient: str,
                               data: bytes) -> None:
        """Each ``unknown_sender`` fault due now sends, once, a copy of ``data`` to the
        server in the name of its unregistered party, through :meth:`send` like any message."""
        for fault in self.faults.faults:
            key = (fault.party, round_, phase)
            if (fault.action == "unknown_sender" and fault.phase == phase and fault.hits(round_)
                    and recipient == SERVER and key not in self._injected):
                self._injected.add(key)
                self.send(round_, phase, kind, fault.party, SERVER, data)

    def reject(self, round_: int, phase: str, party: str, reason: str,
               by: str = SERVER) -> None:
        """Log that ``by`` rejected (or, for a client, withheld) a message of ``party``."""
        self.log.event(round_, phase, "rejected", party, reason, self.identities[by], sender=by)

    def close(self) -> str | None:
        """End the run's log with the server's signed closing record; returns the log's head
        (sha256 of the closing line, see :meth:`MessageLog.close`)."""
        return self.log.close(self.identities[SERVER])

    # -- what methods call -----------------------------------------------------------------

    def broadcast(self, round_: int, kind: str, payload: Payload) -> None:
        """Server to every client: state the server publishes (global model, potential)."""
        data = serialize_payload(payload)
        for client in self.clients:
            received = self.send(round_, "broadcast", kind, SERVER, client.id, data)
            if received is not None:
                client.inbox[kind] = self.protocol.decode_public(received, SERVER)

    def aggregate(self, round_: int, kind: str, compute: Callable[[Client], Payload],
                  weights: dict[str, float], template: Template, noise=None) -> Aggregate:
        """Each client computes a payload matching ``template``; the server obtains, through
        the protocol, only the weighted mean over the clients that made it through the round.
        ``noise``: distributed DP noise parameters (protocols.dp.DistributedNoise) or None.

        The server logs each dropped client, then either ``aborted`` or ``aggregated`` with the
        counted client ids in ``included`` and the aggregated kind in ``of_kind``, so an audit
        can check that each counted client sent its input.
        """
        result = self.protocol.aggregate(self, round_, kind, compute, weights, template, noise)
        server = self.identities[SERVER]
        for client_id, why in result.dropped.items():
            self.log.event(round_, "aggregate", "dropped", client_id, why, server)
        if result.payload is None:
            self.log.event(round_, "aggregate", "aborted", "*", result.reason, server)
        else:
            self.log.event(round_, "aggregate", "aggregated", "*",
                           f"{len(result.included)} of {len(self.clients)} clients counted",
                           server, fields={"included": list(result.included), "of_kind": kind})
        return result
