"""Individual messages, the client's side of :meth:`~.channel.ProtectedChannel.send`
and :meth:`~.channel.ProtectedChannel.all_gather`: each client reads, seals and keeps them itself.

- ``take``: the server's message to this client, opened (sealed for it, or plain) and kept in
  ``client.inbox[kind]``;
- ``send``: the client's payload for the server (its method's computation), sealed for the
  server when a ``sealed`` stage protects the kind;
- ``gather.upload``: the client's payload for its peers, sealed once for all of them;
- ``gather.take``: a peer's payload the server relays (its author in the envelope's
  ``origin``), opened and kept with
  :meth:`~secureffm.federation.parties.Client.keep_gathered`.

A message the client cannot read, or a request it must not follow (a peer list naming the
server), is refused in the client's own signed ``rejected`` event and answered with nothing.
"""

from __future__ import annotations

from ..errors import MessageError, ProtocolError
from ..federation.message import (
    RELAY_PHASE,
    SERVER,
    Payload,
    deserialize_payload,
    serialize_payload,
)
from ..federation.parties import Party, Registry
from .aggregation import check_payload
from .step import Handler, Step, refused_alone

__all__ = ["open_individual", "read_individual", "CLIENT_ACTIONS"]


def open_individual(protocol, party: Party, registry: Registry, data: bytes, kind: str,
                    round_: int, phase: str, author: str) -> Payload:
    """``party`` opens ``author``'s message of ``kind`` (sealed to it when a ``sealed`` stage
    protects the kind, else plain) and checks it; MessageError or ProtocolError if it cannot."""
    sealer = protocol.sealer(kind)
    if sealer is None:
        payload = deserialize_payload(data, author)
    else:
        payload = sealer.open(party, registry, data, kind, round_, phase, author)
    check_payload(author, payload, None)
    return payload


def read_individual(step: Step, author: str, phase: str) -> Payload | None:
    """The payload of ``author`` in the server's message of ``step`` as its client opens it, or
    None after the client refused it (naming the server that handed it over)."""
    kind, client = step.request.kind, step.client
    try:
        payload = open_individual(step.endpoint.protocol, client, step.endpoint.registry,
                                  step.data, kind, step.request.round, phase, author)
    except (MessageError, ProtocolError) as err:
        step.reject(SERVER, f"{client.id} rejected {kind} message of {author}: {err}",
                    refused=step.seq)
        return None
    return payload


def _seal(step: Step, payload: Payload, phase: str, recipients: list[str]) -> bytes:
    sealer = step.endpoint.protocol.sealer(step.request.kind)
    if sealer is None:
        return serialize_payload(payload)
    return sealer.seal(step.client, step.endpoint.registry, payload, step.request.kind,
                       step.request.round, phase, recipients)


def take(step: Step) -> None:
    """The server's own message to this client: kept in its inbox under the kind."""
    payload = read_individual(step, SERVER, step.request.phase)
    if payload is not None:
        step.client.inbox[step.request.kind] = payload
    return None


def send(step: Step) -> bytes | None:
    """The client's payload for the server, sealed for it under a ``sealed`` stage (refused
    for a kind its protocol aggregates, :func:`~.step.refused_alone`)."""
    if refused_alone(step):
        return None
    return _seal(step, step.compute(), step.request.reply_phase, [SERVER])


def gather_upload(step: Step) -> bytes | None:
    """The client's payload for the peers ``args["peers"]``, sealed once for all of them. A peer
    list that names the server, this client, an unregistered party or a party twice is
    refused: sealing for it would let that party read the payload; so is a kind its protocol
    aggregates (:func:`~.step.refused_alone`)."""
    if refused_alone(step):
        return None
    me, registry = step.client.id, step.endpoint.registry
    peers = step.args.get("peers")
    if (not isinstance(peers, list) or len(set(peers)) != len(peers)
            or any(not isinstance(p, str) or p in (SERVER, me) or p not in registry.sign
                   for p in peers)):
        step.reject(SERVER, f"{me} refused to seal its {step.request.kind} for {peers!r}: "
                    "peers must be distinct registered clients other than itself")
        return None
    return _seal(step, step.compute(), RELAY_PHASE, peers)


def gather_take(step: Step) -> None:
    """A peer's payload relayed by the server, kept among this round's gathered copies."""
    author = step.request.envelope.origin
    if author in (SERVER, step.client.id) or author not in step.endpoint.registry.sign:
        step.reject(SERVER, f"{step.client.id} refused a relayed {step.request.kind} whose "
                    f"author {author!r} is not a peer", refused=step.seq)
        return None
    payload = read_individual(step, author, RELAY_PHASE)
    if payload is not None:
        step.client.keep_gathered(step.request.round, step.request.kind, author, payload)
    return None


# The individual messages' steps, which every client answers (:data:`.endpoint.BASE_ACTIONS`).
CLIENT_ACTIONS: dict[str, Handler] = {"take": take, "send": send, "gather.upload": gather_upload,
                                      "gather.take": gather_take}
