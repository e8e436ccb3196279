"""What a method may do with messages: the typed :class:`Channel`.

A method never sees keys, stages or the transport. It asks the channel to broadcast the
server's state, to aggregate one payload per client (the server obtains only what the protocol
lets it: a plain mean or only a sum), to send one message, or to all-gather one payload per
client among the clients. The protocol layer implements it over any transport
(``secureffm.protocols.channel.ProtectedChannel``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import ProtocolError
from ..privacy.settings import DistributedNoise, NoiseGeometry
from .message import Payload
from .parties import Client

__all__ = ["Channel", "Aggregate", "Template", "Compute", "Task", "TaskRefused", "task_count",
           "Program", "Part"]


@dataclass(frozen=True)
class Task:
    """A named client-side computation: the client's program runs ``name`` with ``args``
    (JSON-able) and returns the payload it contributes."""

    name: str
    args: dict = field(default_factory=dict)


# A method's client program: what runs a named :class:`Task` on one client (its keys, shard and
# state) -> the payload it contributes; raises :class:`TaskRefused` for what its own settings
# forbid. A client's own process builds it from public settings (e.g. ``FFMClient``).
Program = Callable[[Client, Task], Payload]


class TaskRefused(ProtocolError):
    """A client's program will not run what the server asked (a task its own settings forbid);
    the client's endpoint answers nothing and signs a ``rejected`` event with this message."""


def task_count(client_id: str, task: Task, key: str) -> int:
    """The non-negative integer ``task.args[key]`` (a round or a round count), or TaskRefused:
    the server chooses the args, so a missing or malformed one is refused, not a crash."""
    value = task.args.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TaskRefused(f"{client_id} refused {task.name} with {key} = {value!r}: it must be "
                          "a non-negative integer")
    return value


# Expected payload of an aggregation: field name -> (shape, dtype).
Template = dict[str, tuple[tuple[int, ...], np.dtype]]
# A client-side computation: the payload one client contributes. A Task names one the
# client's own program runs (any engine); a callable on the client runs only in-process.
Compute = Task | Callable[[Client], Payload]
# One kind's part of :meth:`Channel.aggregate_many`: what each client computes, the template it
# matches, and each client's share of distributed DP noise (None without).
Part = tuple[Compute, Template, DistributedNoise | None]


@dataclass
class Aggregate:
    """What the server obtained from one aggregation.

    ``payload``: sum_i w_i x_i / sum_i w_i over the ``included`` clients, or None when the
    round aborted (``reason`` says why); ``dropped``: client id -> why it was left out;
    ``asked``: the clients asked to compute their payload (what a DP ledger counts).
    """

    payload: Payload | None
    included: list[str]
    dropped: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    asked: list[str] = field(default_factory=list)


class Channel(Protocol):
    """The one way methods exchange messages. ``clients``: the federation's clients, in order;
    a method's client-side code runs on them (``compute(client)``)."""

    clients: list[Client]

    def broadcast(self, round_: int, kind: str, payload: Payload) -> None:
        """Server to every client: state the server publishes; lands in ``client.inbox``."""

    def aggregate(self, round_: int, kind: str, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None,
                  broadcast: dict[str, Payload] | None = None) -> Aggregate:
        """Each client computes a payload matching ``template``; the server obtains only the
        ``weights``-weighted mean over the clients that made it through the round.
        ``noise``: each client's share of distributed DP noise, when the protocol asks for it;
        ``broadcast``: kind -> payload the server publishes to the clients asked to compute,
        as :meth:`broadcast` does, carried by the request that asks them."""

    def aggregate_many(self, round_: int, parts: dict[str, Part], weights: dict[str, float],
                       broadcast: dict[str, Payload] | None = None) -> dict[str, Aggregate]:
        """:meth:`aggregate` of each kind of ``parts`` (kind -> its part), in order: in one
        aggregation of their joint payload where the protocol protects them alike and its
        aggregating stage can, else one aggregation after another (``broadcast`` with the
        first). Returns kind -> what the server obtained of it."""

    def send(self, round_: int, phase: str, kind: str, sender: str, recipient: str,
             payload: Payload | Compute) -> Payload | None:
        """One message between the server and a client. Server to client: ``payload`` is the
        server's, kept by the client in ``client.inbox[kind]``; returns it when the client
        accepted it. Client to server: ``payload`` is what the client computes (``Compute``);
        returns it as the server accepted it. None when it was lost or refused (logged)."""

    def all_gather(self, round_: int, kind: str, compute: Compute) -> dict[str, list[str]]:
        """Each alive client's payload to every other client through the server; each
        recipient keeps the copies it accepted (``client.peers(round_, kind)``). Returns
        recipient id -> the authors whose copies it accepted."""

    def noise_geometry(self, kind: str, weights: dict[str, float],
                       sensitivity: dict[str, float], size: int) -> NoiseGeometry | None:
        """How distributed DP noise on ``kind`` adds up in the aggregate (None without it)."""

    def equal_weights(self, kind: str) -> bool:
        """Whether :meth:`aggregate` takes only equal weights for ``kind``: under secure
        aggregation each client weighs its own input 1 and refuses any other weight the server
        sends, so a method weighs its clients equally there."""

    def note(self, round_: int, event: str, detail: str, fields: dict) -> None:
        """The server signs an event of its own into the log (e.g. what its DP ledger charged),
        with structured ``fields`` (JSON-able) an audit reads."""

    def close(self) -> str | None:
        """End the run's log with the server's closing record; returns the log's head."""
