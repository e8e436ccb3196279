"""The in-process engine: moves serialized messages between parties through a `Protocol`.

It knows neither the method nor what payloads mean. Every delivery is logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import MessageError
from .log import MessageLog
from .message import SERVER, Envelope, Payload, serialize_payload
from .parties import Client

if TYPE_CHECKING:
    from ..protocols.protocol import Protocol

__all__ = ["InProcessEngine"]


class InProcessEngine:
    """Parties are objects in this process; messages cross as bytes and are logged."""

    def __init__(self, clients: list[Client], protocol: Protocol, log: MessageLog):
        ids = [c.id for c in clients]
        if len(set(ids)) != len(ids) or SERVER in ids:
            raise MessageError(f"client ids must be unique and not {SERVER!r}: {ids}")
        self.clients = clients
        self.protocol = protocol
        self.log = log

    def broadcast(self, round_: int, kind: str, payload: Payload) -> None:
        """Server to every client: state the server publishes (global model, potential)."""
        data = serialize_payload(payload)
        for client in self.clients:
            envelope = Envelope(kind, SERVER, client.id, round_, "broadcast", data)
            self.log.append(envelope)
            client.inbox[kind] = self.protocol.decode(envelope)

    def aggregate(
        self,
        round_: int,
        kind: str,
        compute: Callable[[Client], Payload],
        weights: dict[str, float],
    ) -> Payload:
        """Every client computes a payload; the server obtains only what the protocol reveals.

        ``weights``: lambda_i by client id. Returns sum_i lambda_i * payload_i.
        """
        envelopes = []
        for client in self.clients:
            data, stages = self.protocol.encode(compute(client))
            envelope = Envelope(kind, client.id, SERVER, round_, "upload", data, stages)
            self.log.append(envelope)
            envelopes.append(envelope)
        return self.protocol.aggregate(envelopes, weights)
