"""One request as its client handles it (:class:`Step`), and what a handler is: a client's
step of a protocol (:data:`Handler`), which a stage lists in its ``client_actions`` and the
client's :class:`~.endpoint.ClientEndpoint` runs by the request's action name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ProtocolError
from ..federation.channel import Program, Task, TaskRefused
from ..federation.exchange import Request
from ..federation.joint import JOINT_TASK, is_joint, joint_payload, task_parts
from ..federation.message import SERVER, Payload
from ..federation.parties import Client, Registry
from ..privacy.settings import DistributedNoise
from .stage import StagedProtocol

__all__ = ["Step", "Handler", "HandlerEndpoint", "refused_alone"]


class HandlerEndpoint(Protocol):
    """What a handler reads of its client's endpoint (:class:`~.endpoint.ClientEndpoint`):
    the client, the keys it pinned, its own protocol and program, and its state per
    aggregation (``sessions``, by (round, kind)) and across them (``lasting``, by (tag,
    kind))."""

    client: Client
    registry: Registry
    protocol: StagedProtocol
    program: Program | None
    sessions: dict[tuple[int, str], Any]
    lasting: dict[tuple[str, str], Any]

    def own_noise(self, kind: str, clients: list[str]) -> DistributedNoise:
        """This client's own distributed-noise plan for ``kind``."""


@dataclass
class Step:
    """One request as its client handles it: ``data`` and ``seq``, the server's message as the
    client accepted it and its log record (None when the client speaks first); ``events``:
    what the client raised and signed while handling it."""

    endpoint: HandlerEndpoint
    request: Request
    data: bytes | None
    seq: int | None
    events: list[dict] = field(default_factory=list)

    @property
    def client(self) -> Client:
        return self.endpoint.client

    @property
    def args(self) -> dict:
        return self.request.args

    def reject(self, party: str, reason: str, phase: str = "",
               refused: int | None = None) -> None:
        """The client refuses (or withholds) a message of ``party``: a signed ``rejected``
        event of ``phase`` (the request's by default), naming the refused record's seq."""
        fields = None if refused is None else {"refused": refused}
        self.event(phase or self.request.phase, "rejected", party, reason, fields)

    def event(self, phase: str, event: str, about: str, detail: str,
              fields: dict | None = None) -> None:
        self.events.append(self.client.event(self.request.round, phase, event, about, detail,
                                             fields))

    def compute(self) -> Payload:
        """The payload of the method's client computation named in ``args["compute"]`` (a
        :class:`Task` the client's program runs, or, in-process only, a callable on the
        client). For a joint kind, a joint task: each part's task run in turn by the program
        (which admits and privatizes each on its own), their payloads joined
        (:mod:`~secureffm.federation.joint`); a joint task for another kind is refused."""
        compute, kind = self.args["compute"], self.request.kind
        if is_joint(kind):
            parts = task_parts(self.client.id, compute, kind)
            return joint_payload({part: self._run(task) for part, task in parts.items()})
        if isinstance(compute, Task) and compute.name == JOINT_TASK:
            raise TaskRefused(f"{self.client.id} refused a {JOINT_TASK!r} task for the single "
                              f"kind {kind}")
        return self._run(compute)

    def _run(self, compute) -> Payload:
        if isinstance(compute, Task):
            if self.endpoint.program is None:
                raise ProtocolError(f"{self.client.id} has no program to run task "
                                    f"{compute.name!r}")
            return self.endpoint.program(self.client, compute)
        return compute(self.client)

    def session(self, make: Callable[[], Any]) -> Any:
        """This client's state for the request's aggregation (round, kind), made on first use."""
        key = (self.request.round, self.request.kind)
        if key not in self.endpoint.sessions:
            self.endpoint.sessions[key] = make()
        return self.endpoint.sessions[key]


# A client's step: the request as it handles it -> the reply's bytes, or None to send nothing.
Handler = Callable[[Step], bytes | None]


def refused_alone(step: Step) -> bool:
    """Whether the client refuses to send its payload of the request's kind on its own (in
    the clear, sealed, or for peers): its own protocol aggregates that kind, so the server may
    learn only a sum. A refusal is a signed ``rejected`` event naming the kind and the stage."""
    try:
        step.endpoint.protocol.check_individual(step.request.kind)
    except ProtocolError as err:
        step.reject(SERVER, f"{step.client.id} refused to send its {step.request.kind} on its "
                    f"own: {err}", refused=step.seq)
        return True
    return False
