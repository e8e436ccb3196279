"""The typed interface every protocol stage implements, by role.

``client`` stages (DP-SGD, randomized t) change how a client computes a message and send
nothing; ``aggregate`` stages (secure aggregation) let the server obtain only a sum;
``transport`` stages (sealed) encrypt individual messages end to end.
"""

from __future__ import annotations

from typing import Protocol

from ..federation.channel import Aggregate, Compute, Template
from ..federation.message import Payload
from ..federation.parties import Party, Registry
from ..privacy.settings import DistributedNoise, NoiseGeometry
from .link import Link

__all__ = ["Stage", "AggregateStage", "TransportStage"]


class Stage(Protocol):
    """What every stage has: its spec ``name``, ``role``, the ``phases`` it adds to a round,
    the kinds it ``can_protect`` and those it ``protects`` in this spec."""

    name: str
    role: str
    phases: tuple[str, ...]
    can_protect: frozenset[str]
    protects: tuple[str, ...]

    @classmethod
    def from_table(cls, table: dict, source: str) -> Stage:
        """Build from one ``[[stages]]`` table; a bad key or value is a ProtocolError."""

    def validate_for(self, clients: int) -> None:
        """Reject parameters impossible for ``clients`` clients."""


class AggregateStage(Stage, Protocol):
    """A stage through which the server obtains only a (weighted) sum."""

    def aggregate(self, link: Link, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None) -> Aggregate:
        """Run one aggregation over ``link``'s clients."""

    def noise_geometry(self, weights: dict[str, float], sensitivity: dict[str, float],
                       size: int, colluders: int) -> NoiseGeometry:
        """How distributed noise adds up in this stage's sums."""


class TransportStage(Stage, Protocol):
    """A stage that encrypts individual messages for their recipients."""

    def seal(self, sender: Party, registry: Registry, payload: Payload, kind: str, round_: int,
             phase: str, recipients: list[str]) -> bytes:
        """``sender`` seals ``payload`` for ``recipients`` with its own keys."""

    def relay(self, data: bytes, recipient: str, sender: str) -> bytes:
        """What the server forwards of a sealed message to one recipient."""

    def open(self, recipient: Party, registry: Registry, data: bytes, kind: str, round_: int,
             phase: str, sender: str) -> Payload:
        """``recipient`` opens a message of ``sender`` with its own key."""
