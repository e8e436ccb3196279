"""A transport whose clients run in processes of their own (Flower's ServerApp side).

:class:`RemoteTransport` implements :meth:`~secureffm.federation.transport.Transport.exchange`
over a batched call (``calls.call(requests, timeout)``: client id -> request bytes out, reply
bytes or None back, as :class:`secureffm.federation.flower.FlowerCalls` does): it logs the
server's messages, sends each client its request (:mod:`.codec`), and checks every reply as the
server's network stack: a frame that does not parse, an event another party signed or that
does not verify, and a message failing its receipt check are refused by name; a client that
answers nothing by the deadline is offline for the rest of the round. It holds no client and
no client key: only the pinned public keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import MessageError, ProtocolError
from .codec import client_event_problem, decode_reply, encode_request
from .crypto import verify_signature
from .exchange import Incoming, Receipts, Refusal, Request
from .log import MessageLog
from .message import SERVER, Envelope, canonical
from .parties import Registry
from .transport import Delivery, Endpoint, LoggedEvents

__all__ = ["RemoteTransport", "Calls"]


class Calls(Protocol):
    """One batched call to remote clients: client id -> request bytes; client id -> reply
    bytes, or None when it gave none within ``timeout`` seconds."""

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]: ...


def unexpected(sent: Envelope, request: Request) -> str:
    """Why ``sent`` is not the reply ``request`` asks for ("" when it is): another round, kind,
    phase or recipient, or a signed header an honest reply never carries (stages other than
    the request's, or an ``origin``: a client relays no one's payload)."""
    if (sent.round, sent.kind, sent.phase, sent.recipient) != (
            request.round, request.kind, request.reply_phase, SERVER):
        return (f"it answers with a {sent.kind} message of round {sent.round}, phase "
                f"{sent.phase} to {sent.recipient}, not {request.kind} of round {request.round}, "
                f"phase {request.reply_phase} to the server")
    if sent.stages != request.stages:
        return (f"its message names stages {list(sent.stages)}, not the request's "
                f"{list(request.stages)}")
    if sent.origin:
        return f"its message names origin {sent.origin!r}, but a client relays no payload"
    return ""


@dataclass
class RemoteTransport(LoggedEvents):
    """``registry``: the pinned public keys (parties.json); ``clients``: ids in federation
    order; ``calls``: what reaches them; ``timeout``: seconds a phase waits for replies."""

    registry: Registry
    clients: tuple[str, ...]
    log: MessageLog
    calls: Calls
    timeout: float
    _receipts: Receipts = field(init=False)
    _offline: dict[int, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = sorted(set(self.clients) - set(self.registry.sign))
        if missing:
            raise MessageError(f"no public key registered for {missing[0]}")
        self.clients = tuple(self.clients)
        self._receipts = Receipts(self.registry)
        self.log.register(self.registry)

    def alive(self, party: str, round_: int, phase: str) -> bool:
        """False for a client that missed a deadline earlier in ``round_``."""
        return party not in self._offline.get(round_, set())

    def send(self, envelope: Envelope) -> Delivery:
        raise ProtocolError(f"a one-way {envelope.kind} message from {envelope.sender} to "
                            f"{envelope.recipient}: remote clients are reached only by "
                            "exchanges (a request and its reply)")

    def exchange(self, requests: dict[str, Request],
                 endpoints: Mapping[str, Endpoint] | None = None) -> dict[str, Delivery]:
        """See :meth:`~.transport.Transport.exchange`; ``endpoints`` must be None (the clients are
        remote)."""
        if endpoints is not None:
            raise ProtocolError("a remote transport reaches its clients itself")
        carried: dict[str, list[Incoming]] = {cid: [] for cid in requests}
        for index in range(max((len(r.broadcasts) for r in requests.values()), default=0)):
            for cid, request in requests.items():
                if index < len(request.broadcasts):
                    carried[cid].append(self._logged(request.broadcasts[index]))
        frames = {}
        for cid, request in requests.items():
            incoming = None if request.envelope is None else self._logged(request.envelope)
            frames[cid] = encode_request(request, incoming, tuple(carried[cid]))
        replies = self.calls.call(frames, self.timeout)
        out = {}
        for cid, request in requests.items():
            frame = replies.get(cid)
            if frame is None:
                self._offline.setdefault(request.round, set()).add(cid)
                continue
            out[cid] = self._reply(cid, request, frame)
        return out

    def _logged(self, envelope: Envelope) -> Incoming:
        """The server's message, logged, as it is sent."""
        return Incoming(envelope, envelope.data, self.log.append(envelope)["seq"])

    def _reply(self, cid: str, request: Request, frame: bytes) -> Delivery:
        """The server's receipt of ``cid``'s reply frame to ``request``."""
        try:
            reply = decode_reply(frame, cid)
            problem = "" if reply.envelope is None else unexpected(reply.envelope, request)
            if problem:
                raise MessageError(problem)
            for event in reply.events:
                problem = client_event_problem(event, request.round, self.registry.sign)
                if problem is not None:
                    raise MessageError(f"it carries an event whose {problem}")
                if not verify_signature(self.registry.sign[cid],
                                        bytes.fromhex(str(event.get("sig", ""))),
                                        canonical(event)):
                    raise MessageError(f"an event in the reply of {cid} is not signed by {cid}")
        except (MessageError, ValueError) as err:
            return Delivery(None, (Refusal(SERVER, cid, f"refused the reply of {cid}: {err}"),))
        for event in reply.events:
            self.record(event)
        if reply.envelope is None:
            return Delivery(None, events=reply.events)
        envelope = reply.envelope
        if not verify_signature(self.registry.sign[cid], envelope.sig,
                                canonical(envelope.header())):
            # not logged: no key in parties.json verifies it, and the log holds only records
            # their signers signed
            return Delivery(None, (Refusal(SERVER, cid, f"the {envelope.kind} message in the "
                                           f"reply of {cid} is not signed by {cid}"),),
                            events=reply.events)
        seq = self.log.append(envelope)["seq"]
        refused = self._receipts.check(envelope, envelope.data, seq)
        return Delivery(None if refused else envelope.data, (refused,) if refused else (), seq,
                        reply.events)
