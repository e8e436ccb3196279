"""`ProtectedChannel`: the typed :class:`~secureffm.federation.channel.Channel` that methods use,
implemented over any :class:`~secureffm.federation.transport.Transport` by a
:class:`~secureffm.protocols.protocol.Protocol`.

The channel is the server's side: it builds each phase's requests, signs its own messages and
reads the replies. Every client step (computing, sealing, opening, masking, decrypting) runs in
the client's own :class:`~secureffm.protocols.endpoint.ClientEndpoint` with its own keys, made
here for the in-process engine or living in the client's process on Flower; the transport
carries signed bytes and holds no private key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..errors import MessageError, ProtocolError
from ..federation.channel import Aggregate, Compute, Part, Program, Task, Template
from ..federation.faults import FaultPlan
from ..federation.joint import joint_kind, joint_task, joint_template, split_payload
from ..federation.message import (
    RELAY_PHASE,
    SERVER,
    Payload,
    serialize_payload,
)
from ..federation.parties import Client, ClientInfo, Party
from ..federation.transport import Transport
from ..privacy.settings import DistributedNoise, NoiseGeometry
from .adversary import play_deviations
from .aggregation import plain_aggregate
from .endpoint import ClientEndpoint
from .individual import open_individual  # and registers the clients' handlers
from .link import Ask, Link, accepted
from .protocol import Protocol

__all__ = ["ProtectedChannel"]


def _fixed(payload: Payload) -> Callable[[Client], Payload]:
    """A client computation that returns ``payload`` (made in this process)."""
    return lambda _client: payload


class ProtectedChannel:
    """Every message of a method, protected as ``protocol`` says, over ``transport``.

    ``server``: the server party (its own keys); ``clients``: the clients, in the transport's
    order; ``deviations``: a threat model whose malicious-server deviations the server plays
    (:mod:`.adversary`). In-process, the channel makes each client's side
    (:class:`.endpoint.ClientEndpoint`, running ``program``, the method's client computations)
    and hands them to the transport; ``remote``: the clients run in processes of their own,
    ``clients`` only name them (:class:`~secureffm.federation.parties.ClientInfo`) and the
    transport reaches them itself.
    """

    def __init__(self, protocol: Protocol, transport: Transport, server: Party,
                 clients: list[Client] | list[ClientInfo],
                 deviations: FaultPlan | None = None, program: Program | None = None,
                 remote: bool = False):
        if tuple(c.id for c in clients) != tuple(transport.clients):
            raise MessageError("the channel's clients must be the transport's, in its order")
        protocol.validate_for(len(clients))
        self.protocol = protocol
        self.transport = transport
        self.server = server
        self.clients = clients
        self.parties: dict[str, Party] = {SERVER: server}
        self.endpoints = None
        if not remote:
            self.parties |= {c.id: c for c in clients}
            self.endpoints = {c.id: ClientEndpoint(c, transport.registry, protocol, program)
                              for c in clients}
        self.deviations = deviations or FaultPlan()
        play_deviations(server, self.deviations)

    def _link(self, round_: int, kind: str, stages: tuple[str, ...] = ()) -> Link:
        return Link(self.transport, self.parties, self.clients, round_, kind, stages,
                    self.deviations, self.endpoints)

    def broadcast(self, round_: int, kind: str, payload: Payload) -> None:
        """Server to every client: state the server publishes (global model, potential). Each
        client notes the digest of what it accepted, which the malicious-server variant of
        secure aggregation signs, so a server that sends clients different models is caught."""
        data = serialize_payload(payload)
        self._link(round_, kind).exchange("broadcast", "broadcast", "accept",
                                          {c.id: Ask(data) for c in self.clients})

    def aggregate(self, round_: int, kind: str, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None,
                  broadcast: dict[str, Payload] | None = None) -> Aggregate:
        """See :meth:`.Channel.aggregate`. ``broadcast`` (kind -> payload) travels with the
        stage's exchange that asks the clients to compute, each client taking it first (one
        exchange less than :meth:`broadcast` then :meth:`aggregate`, and the payload arrives
        with the request that uses it). The server logs each dropped client, then either
        ``aborted`` or ``aggregated`` with the counted client ids in ``included`` and the
        aggregated kind in ``of_kind``, so an audit can check that each counted client sent
        its input."""
        settings = self.protocol.dp_for(kind)
        if (noise is not None) != bool(settings and settings.noise == "distributed"):
            raise ProtocolError(f"kind {kind!r}: distributed noise parameters must be given "
                                "exactly when the protocol's dp stage uses distributed noise")
        link, result = self._aggregate(round_, kind, compute, weights, template, noise,
                                       broadcast)
        self._outcome(link, result, kind)
        return result

    def aggregate_many(self, round_: int, parts: dict[str, Part], weights: dict[str, float],
                       broadcast: dict[str, Payload] | None = None) -> dict[str, Aggregate]:
        """See :meth:`.Channel.aggregate_many`. One aggregation of the joint kind
        (:mod:`~secureffm.federation.joint`) when every part's computation is a
        :class:`~secureffm.federation.channel.Task` and the protocol aggregates the parts at
        once (:meth:`~.protocol.Protocol.joint_refusal`: the same stage that ``joins_kinds``,
        the same client stages, no distributed noise); each client then runs every part's
        task, each admitted and privatized by its own program on its own. The log keeps
        each part's outcome: an ``aborted`` (with ``of_kind``) or ``aggregated`` event per
        part. Otherwise the parts are aggregated one after another."""
        kind = joint_kind(parts)
        tasks = {part: compute for part, (compute, _, _) in parts.items()}
        if (len(parts) < 2 or self.protocol.joint_refusal(kind) is not None
                or not all(isinstance(task, Task) for task in tasks.values())
                or any(noise is not None for _, _, noise in parts.values())):
            out = {}
            for part, (compute, template, noise) in parts.items():
                out[part] = self.aggregate(round_, part, compute, weights, template, noise,
                                           broadcast)
                broadcast = None  # it travelled with the first
            return out
        templates = {part: template for part, (_, template, _) in parts.items()}
        link, result = self._aggregate(round_, kind, joint_task(tasks), weights,
                                       joint_template(templates), None, broadcast)
        split = (split_payload(result.payload, templates) if result.payload is not None
                 else dict.fromkeys(parts))
        out = {part: replace(result, payload=split[part]) for part in parts}
        self._dropped(link, result)
        for part in parts:
            self._outcome(link, out[part], part, dropped=False)
        return out

    def _aggregate(self, round_: int, kind: str, compute: Compute, weights: dict[str, float],
                   template: Template, noise: DistributedNoise | None,
                   broadcast: dict[str, Payload] | None) -> tuple[Link, Aggregate]:
        """One run of ``kind``'s aggregating stage (in the clear without one), ``broadcast``
        carried by its first request to compute, or sent alone when it ended before."""
        prior = self.protocol.client_stages(kind)
        stage = self.protocol.aggregator(kind)
        link = self._link(round_, kind, (*prior, stage.name) if stage else prior)
        link.carry = {name: serialize_payload(payload)
                      for name, payload in (broadcast or {}).items()}
        if stage is not None:
            result = stage.aggregate(link, compute, weights, template, noise)
        else:
            result = plain_aggregate(link, compute, weights, template)
        if link.carry:  # the stage ended before its first exchange: they travel alone
            for name, payload in (broadcast or {}).items():
                self.broadcast(round_, name, payload)
        return link, result

    @staticmethod
    def _dropped(link: Link, result: Aggregate) -> None:
        for client_id, why in result.dropped.items():
            link.event("aggregate", "dropped", client_id, why)

    def _outcome(self, link: Link, result: Aggregate, of_kind: str,
                 dropped: bool = True) -> None:
        """The server's events closing one kind's aggregation: each ``dropped`` client (when
        ``dropped``), then ``aborted`` (with ``of_kind`` when the link's kind is joint) or
        ``aggregated``."""
        if dropped:
            self._dropped(link, result)
        if result.payload is None:
            link.event("aggregate", "aborted", "*", result.reason,
                       fields={"of_kind": of_kind} if of_kind != link.kind else None)
        else:
            link.event("aggregate", "aggregated", "*",
                       f"{len(result.included)} of {len(self.clients)} clients counted",
                       fields={"included": list(result.included), "of_kind": of_kind})

    def noise_geometry(self, kind: str, weights: dict[str, float],
                       sensitivity: dict[str, float], size: int) -> NoiseGeometry | None:
        return self.protocol.noise_geometry(kind, weights, sensitivity, size)

    def equal_weights(self, kind: str) -> bool:
        return self.protocol.aggregator(kind) is not None

    def _stages(self, kind: str, by_client: bool) -> tuple[str, ...]:
        """Stages named on an individual ``kind`` message: the client stages that shaped it
        (none for the server's own messages), then the sealer."""
        sealer = self.protocol.sealer(kind)
        shaped = self.protocol.client_stages(kind) if by_client else ()
        return shaped + ((sealer.name,) if sealer else ())

    def send(self, round_: int, phase: str, kind: str, sender: str, recipient: str,
             payload: Payload | Compute) -> Payload | None:
        """One individual message between the server and a client, sealed by its author for
        its recipient when a ``sealed`` stage protects ``kind``.

        Server to client: ``payload`` is the server's; the client opens it and keeps it in
        its inbox (``client.inbox[kind]``); returns ``payload`` when the client accepted it.
        Client to server: ``payload`` is what the client computes (a :class:`.Task` of its
        program; in-process also a callable on the client, or a payload made in this
        process); returns it as the server opened it. None when the message did not arrive
        or was refused (a logged event names why).
        """
        self.protocol.check_individual(kind)
        ids = [c.id for c in self.clients]
        if sender == SERVER and recipient in ids:
            link = self._link(round_, kind, self._stages(kind, by_client=False))
            sealer = self.protocol.sealer(kind)
            data = (serialize_payload(payload) if sealer is None else sealer.seal(
                self.server, self.transport.registry, payload, kind, round_, phase, [recipient]))
            delivery = link.exchange(phase, phase, "take", {recipient: Ask(data)}).get(recipient)
            return payload if accepted(delivery, recipient) else None
        if sender not in ids or recipient != SERVER:
            raise ProtocolError(f"send goes between the server and a client, not {sender} -> "
                                f"{recipient}; clients reach each other by all_gather")
        if isinstance(payload, dict):  # made in this process: the in-process engine only
            payload = _fixed(payload)
        link = self._link(round_, kind, self._stages(kind, by_client=True))
        delivery = link.exchange(phase, phase, "send",
                                 {sender: Ask(None, {"compute": payload})}).get(sender)
        if delivery is None or delivery.data is None:
            return None
        return self._open(link, phase, sender, delivery.data)

    def _open(self, link: Link, phase: str, author: str, data: bytes) -> Payload | None:
        """The server reads (opens, when sealed) ``author``'s message; a bad one is rejected
        by the server by name."""
        try:
            payload = open_individual(self.protocol, self.server, self.transport.registry, data,
                                      link.kind, link.round, phase, author)
        except (MessageError, ProtocolError) as err:
            link.reject(phase, author, f"{SERVER} rejected {link.kind} message of {author}: "
                        f"{err}")
            return None
        return payload

    def all_gather(self, round_: int, kind: str, compute: Compute) -> dict[str, list[str]]:
        """Each alive client computes its payload once and uploads it (phase ``upload``),
        sealed by it once for all its peers when a ``sealed`` stage protects ``kind`` so the
        relay cannot read it; the server relays each upload to every other client (phase
        ``relay``, one exchange per author), and each recipient keeps the copies it accepted
        (:meth:`Client.peers`).

        Returns recipient id -> the authors whose copies it accepted, in federation order.
        """
        self.protocol.check_individual(kind)
        sealer = self.protocol.sealer(kind)
        link = self._link(round_, kind, self._stages(kind, by_client=True))
        ids = [c.id for c in self.clients]
        uploads = link.exchange("upload", "upload", "gather.upload", {
            author: Ask(None, {"compute": compute, "peers": [p for p in ids if p != author]})
            for author in ids})
        gathered: dict[str, list[str]] = {cid: [] for cid in ids}
        for author in ids:
            uploaded = uploads.get(author)
            if uploaded is None or uploaded.data is None:
                continue
            copies = {}
            for peer in (p for p in ids if p != author):
                try:
                    copies[peer] = (sealer.relay(uploaded.data, peer, author) if sealer
                                    else uploaded.data)
                except MessageError as err:
                    link.reject("upload", author, str(err))
                    break
            else:
                relayed = link.exchange(RELAY_PHASE, RELAY_PHASE, "gather.take",
                                        {peer: Ask(copy, origin=author)
                                         for peer, copy in copies.items()})
                for peer in copies:
                    if accepted(relayed.get(peer), peer):
                        gathered[peer].append(author)
        return gathered

    def note(self, round_: int, event: str, detail: str, fields: dict) -> None:
        """See :meth:`.Channel.note`: an event about every party (``*``), phase ``aggregate``."""
        self.transport.record(self.server.event(round_, "aggregate", event, "*", detail, fields))

    def close(self) -> str | None:
        """End the run's log with the server's signed closing record; returns its head."""
        return self.transport.close(self.server)
