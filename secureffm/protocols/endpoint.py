"""A client's side of the boundary: the named handlers it runs when the server asks.

:class:`ClientEndpoint` is all a client exposes: given a
:class:`~secureffm.federation.exchange.Request` and the server's message as it arrived, it
checks that message on receipt with its own pinned keys, runs the handler the request names
(its action table: the base actions, :data:`BASE_ACTIONS`, and the ``client_actions`` of its
own protocol's stages, each for the kinds that stage protects) with its own keys, data and
state, and answers one signed reply and the events it signed. An action outside that table is
refused in a signed ``rejected`` event before any handler runs, and so is a stage's action for
a joint kind its own protocol does not aggregate at once (:meth:`~.protocol.Protocol.
joint_refusal`). Nothing of the client (keys,
shard, sessions) leaves it except through that reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import MessageError, ProtocolError
from ..federation.channel import Program, TaskRefused
from ..federation.exchange import Incoming, Receipts, Reply, Request, late_refusal
from ..federation.joint import is_joint, kind_parts
from ..federation.message import SERVER, deserialize_payload, serialize_payload
from ..federation.parties import Client, Registry
from ..privacy.settings import DistributedNoise
from . import individual
from .link import record_broadcast
from .stage import StagedProtocol
from .step import Handler, Step, refused_alone

__all__ = ["ClientEndpoint", "NoisePlan", "BASE_ACTIONS", "action_table"]

# A client's own plan of distributed noise: (the client, the kind, its own protocol, the
# federation's client ids) -> its tau, sensitivity and colluders, from its own settings.
NoisePlan = Callable[[Client, str, Any, list[str]], DistributedNoise]


@dataclass
class ClientEndpoint:
    """One client's side: ``client`` (its keys, shard and streams), ``registry`` (the public
    keys it pinned), ``protocol`` (its own copy of the run's protocol, whose parameters it
    trusts rather than the server's word), ``program`` (what runs the method's named
    computations), ``noise`` (its own plan of distributed noise; by default the program's
    ``distributed_noise``, if it has one), the per-aggregation ``sessions`` its protocol
    handlers keep, and what they keep ``lasting`` across aggregations, by (tag, kind) (a batch
    of signed keys); ``actions``: what it answers, built from its own protocol
    (:func:`action_table`)."""

    client: Client
    registry: Registry
    protocol: StagedProtocol
    program: Program | None = None
    noise: NoisePlan | None = None
    sessions: dict[tuple[int, str], Any] = field(default_factory=dict)
    lasting: dict[tuple[str, str], Any] = field(default_factory=dict)
    receipts: Receipts = field(init=False)
    actions: dict[str, tuple[Handler, frozenset[str] | None]] = field(init=False)

    def __post_init__(self) -> None:
        self.receipts = Receipts(self.registry)
        self.actions = action_table(self.protocol)
        if self.noise is None:
            self.noise = getattr(self.program, "distributed_noise", None)

    def own_noise(self, kind: str, clients: list[str]) -> DistributedNoise:
        """This client's own distributed-noise plan for ``kind`` in a federation of
        ``clients``; MessageError when it has none (it then takes no noise from the server)."""
        if self.noise is None:
            raise MessageError(f"{self.client.id} has no noise plan of its own for {kind} "
                               "(tau and sensitivity from its own settings)")
        return self.noise(self.client, kind, self.protocol, clients)

    def _take_broadcast(self, arrived: Incoming, events: list[dict]) -> None:
        """A broadcast carried by another exchange, checked on receipt and taken as its own
        exchange's would be (its events signed with its round)."""
        envelope = arrived.envelope
        step = Step(self, Request(envelope.round, envelope.kind, envelope.phase,
                                  envelope.phase, "accept"), None, None, events)
        refusal = (late_refusal(arrived) if arrived.late else
                   self.receipts.check(envelope, arrived.data, arrived.seq))
        if refusal is not None:
            step.reject(refusal.party, refusal.reason, refused=refusal.refused)
            return
        accept(step, envelope.round, envelope.kind, arrived.data, arrived.seq, envelope.sha256)

    def saved(self) -> dict:
        """What this endpoint keeps between requests besides its client (JSON values): the
        copies it accepted (for the duplicate check), its sessions and what lasts across
        them."""
        return {"seen": [list(key) for key in self.receipts.seen],
                "sessions": [[round_, kind, session.tag, session.to_json()]
                             for (round_, kind), session in self.sessions.items()],
                "lasting": [[tag, kind, kept.to_json()]
                            for (tag, kind), kept in self.lasting.items()]}

    def restore(self, saved: dict) -> None:
        """The inverse of :meth:`saved`."""
        try:
            self.receipts.seen = {tuple(key) for key in saved["seen"]}
            self.sessions = {(int(round_), str(kind)): self._restored(tag, kind, table)
                             for round_, kind, tag, table in saved["sessions"]}
            self.lasting = {(str(tag), str(kind)): self._restored(tag, kind, table)
                            for tag, kind, table in saved.get("lasting", [])}
        except (KeyError, TypeError, ValueError) as err:
            raise MessageError(f"{self.client.id}'s saved sessions do not load: {err}") from None

    def _restored(self, tag: str, kind: str, table: dict) -> Any:
        """What :meth:`saved` kept of ``tag`` for ``kind`` (its ``to_json()``), rebuilt by the
        stage of this client's own protocol that aggregates ``kind``."""
        restore = getattr(self.protocol.aggregator(kind), "restore_session", None)
        if restore is None:
            raise ValueError(f"its protocol keeps no {tag!r} state for {kind!r}")
        return restore(self, tag, table)

    def _handler(self, step: Step) -> Handler | None:
        """The handler of the step's action in this client's table, or None after the client
        refused it (an action no stage of its own protocol offers for the request's kind)."""
        action, kind = step.request.action, step.request.kind
        handler, kinds = self.actions.get(action, (None, frozenset()))
        if handler is not None and kinds is not None and is_joint(kind):
            refusal = self.protocol.joint_refusal(kind)
            if refusal is None and set(kind_parts(kind)) <= kinds:
                return handler
            step.reject(SERVER, f"{self.client.id} refused action {action!r} for the joint "
                        f"{kind}: {refusal or 'no stage of its protocol runs it for every part'}")
            return None
        if handler is not None and (kinds is None or kind in kinds):
            return handler
        step.reject(SERVER, f"{self.client.id} refused action {action!r} for {kind}: no stage "
                    f"of its protocol {self.protocol.name!r} runs it for that kind (it answers "
                    f"{', '.join(sorted(self.actions))})")
        return None

    def __call__(self, request: Request, incoming: Incoming | None,
                 broadcasts: tuple[Incoming, ...] = ()) -> Reply:
        """Take the broadcasts that came with the request, check the server's message on
        receipt, run the request's action, sign the reply (none when the message was lost)."""
        step = Step(self, request, None, None)
        for arrived in broadcasts:
            self._take_broadcast(arrived, step.events)
        if request.envelope is not None and incoming is None:
            return Reply(None, tuple(step.events))  # its message was lost: nothing to answer
        handler = self._handler(step)
        if handler is None:
            return Reply(None, tuple(step.events))
        if incoming is not None:
            refusal = (late_refusal(incoming) if incoming.late else
                       self.receipts.check(incoming.envelope, incoming.data, incoming.seq))
            if refusal is not None:
                step.reject(refusal.party, refusal.reason, refused=refusal.refused)
                return Reply(None, tuple(step.events))
            step.data, step.seq = incoming.data, incoming.seq
        try:
            data = handler(step)
        except TaskRefused as refused:
            step.reject(SERVER, str(refused), refused=step.seq)
            data = None
        envelope = None if data is None else self.client.envelope(
            request.round, request.reply_phase, request.kind, SERVER, data, request.stages)
        return Reply(envelope, tuple(step.events))


def accept_broadcast(step: Step) -> None:
    """A broadcast of its own exchange (see :meth:`ClientEndpoint._take_broadcast`)."""
    accept(step, step.request.round, step.request.kind, step.data, step.seq,
           step.request.envelope.sha256)
    return None


def accept(step: Step, round_: int, kind: str, data: bytes, seq: int | None,
           digest: str) -> None:
    """A broadcast: the client keeps the payload in its inbox and notes its digest (which the
    malicious-server variant of secure aggregation signs, so a server that sends clients
    different models is caught); an unreadable one is refused by name."""
    try:
        step.client.inbox[kind] = deserialize_payload(data, SERVER)
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}", phase="broadcast", refused=seq)
        return
    record_broadcast(step.client, round_, kind, digest)


def upload(step: Step) -> bytes | None:
    """Aggregation in the clear: the client's payload, as it is (refused for a kind its
    protocol aggregates, :func:`refused_alone`)."""
    return None if refused_alone(step) else serialize_payload(step.compute())


# The actions every client answers, whatever its protocol: a broadcast, an upload in the
# clear, and individual messages (:mod:`.individual`).
BASE_ACTIONS: Mapping[str, Handler] = MappingProxyType(
    {"accept": accept_broadcast, "upload": upload, **individual.CLIENT_ACTIONS})


def action_table(protocol: StagedProtocol) -> dict[str, tuple[Handler, frozenset[str] | None]]:
    """A client's actions under its own ``protocol``: action name -> (its handler, the kinds
    it runs for; None: any kind): :data:`BASE_ACTIONS`, then each stage's ``client_actions``
    for the kinds the stages offering it protect. Two stages offering one name with two
    handlers are a ProtocolError."""
    table: dict[str, tuple[Handler, frozenset[str] | None]] = {
        name: (handler, None) for name, handler in BASE_ACTIONS.items()}
    for stage in protocol.stages:
        for name, handler in stage.client_actions.items():
            known, kinds = table.get(name, (handler, frozenset()))
            if known is not handler or kinds is None:
                raise ProtocolError(f"stage {stage.name!r} offers client action {name!r}, "
                                    "which another stage or the endpoint already runs with "
                                    "another handler; name the stage's actions after it")
            table[name] = (handler, kinds | frozenset(stage.protects))
    return table
