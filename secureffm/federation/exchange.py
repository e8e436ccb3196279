"""The one call between the server and a client: a :class:`Request` out, a :class:`Reply` back.

Every client-side step of a protocol is a named handler (``action``) the client runs on its own
side of the boundary, with its own keys and data: the server sends each client at most one
signed message and the handler's arguments; the client checks that message on receipt
(:class:`Receipts`), runs the handler and answers at most one signed message plus the events
it raised and signed itself. An engine moves requests and replies (the in-process transport
calls the client's endpoint; the Flower transport sends them to the client's process), so the
protocol code that builds requests and reads replies is the same under both.

``args`` carry only public, JSON-able parameters of the step (a template's shapes, the
client's aggregation weight, the name of the method's client computation). They are not
logged and a malicious server chooses them: a client that must not trust a parameter checks it
against its own spec (secure aggregation's announced parameters are, and are signed).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .crypto import verify_signature
from .message import RELAY_PHASE, Envelope, canonical
from .parties import Registry

__all__ = ["Request", "Reply", "Incoming", "Receipts", "Refusal", "late_refusal"]


@dataclass(frozen=True)
class Request:
    """What the server asks of one client in one exchange of ``round`` and ``kind``.

    ``envelope``: the server's signed message of ``phase`` to the client (None when the client
    speaks first); ``action``: the client's handler; ``args``: its public parameters;
    ``reply_phase`` and ``stages``: what the client's answer is labelled with; ``broadcasts``:
    the server's signed broadcasts the client takes first (carried by this exchange instead of
    one of their own).
    """

    round: int
    kind: str
    phase: str
    reply_phase: str
    action: str
    stages: tuple[str, ...] = ()
    envelope: Envelope | None = None
    args: dict = field(default_factory=dict)
    broadcasts: tuple[Envelope, ...] = ()


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
class Incoming:
    """The server's message as it reached the client: ``data`` (the bytes that arrived),
    ``seq`` (its log record), ``late`` (it came after the phase closed)."""

    envelope: Envelope
    data: bytes
    seq: int | None
    late: bool = False


@dataclass(frozen=True)
class Reply:
    """The client's answer: at most one signed ``envelope`` to the server, and the ``events``
    (rejections, clipping) it raised and signed itself, in order."""

    envelope: Envelope | None = None
    events: tuple[dict, ...] = ()


@dataclass
class Receipts:
    """One party's receipt checks (its network stack): unaltered bytes, a valid signature of a
    registered sender, an ``origin`` only on a relayed payload, and one copy per round, phase,
    kind, sender, recipient and origin."""

    registry: Registry
    seen: set[tuple] = field(default_factory=set)

    def check(self, envelope: Envelope, data: bytes, seq: int | None) -> Refusal | None:
        """The refusal of ``data`` (the bytes received for ``envelope``, logged as record
        ``seq``), or None when it is accepted (and then remembered)."""
        where = f"message seq {seq}"

        def refuse(reason: str, refused: int | None = seq) -> Refusal:
            return Refusal(envelope.recipient, envelope.sender, reason, refused)

        # The very bytes the signed digest was computed from (in-process, or a message decoded
        # with its envelope) cannot differ from them: only other bytes are hashed again.
        if data is not envelope.data and hashlib.sha256(data).hexdigest() != envelope.sha256:
            return refuse(f"{where} was altered in transit (sha256 of the bytes received does "
                          "not match the signed one)")
        key = self.registry.sign.get(envelope.sender)
        if key is None or not verify_signature(key, envelope.sig, canonical(envelope.header())):
            return refuse(f"{where} has an invalid signature")
        if envelope.origin and envelope.phase != RELAY_PHASE:
            return refuse(f"{where} names an author ({envelope.origin}) in phase "
                          f"{envelope.phase}; only a payload relayed in phase {RELAY_PHASE} has "
                          "an author other than its sender")
        seen = (envelope.round, envelope.phase, envelope.kind, envelope.sender,
                envelope.recipient, envelope.origin)
        if seen in self.seen:
            return refuse(f"duplicate or replayed {envelope.kind} message (round "
                          f"{envelope.round}, phase {envelope.phase}); the first copy stands",
                          None)
        self.seen.add(seen)
        return None


def late_refusal(arrived: Incoming) -> Refusal:
    """The recipient's refusal of a message that came after its phase closed."""
    envelope = arrived.envelope
    return Refusal(envelope.recipient, envelope.sender, f"{envelope.kind} message seq "
                   f"{arrived.seq} arrived after the phase closed", arrived.seq)
