"""The typed interface every protocol stage implements, by role.

``client`` stages (DP-SGD, randomized t) change how a client computes a message and send
nothing; ``aggregate`` stages (secure aggregation) let the server obtain only a sum;
``seal`` stages (sealed) encrypt individual messages end to end.

A stage also describes itself, so that nothing outside ``protocols/`` switches on its name:
its claims and trust for privacy.json (:mod:`.statement`), who can read a logged message it
names and what its parameters must meet, for the audit (:mod:`secureffm.audit.claims`), the
phase of a client's input to it (aggregate stages), a codec for every entry it keeps in a
client's memory (:mod:`secureffm.federation.memory`, for a snapshot), the steps its clients
run (``client_actions``, which a client's endpoint answers for the kinds the stage protects,
and no other), and whether it carries distributed DP noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from ..federation.channel import Aggregate, Compute, Template
from ..federation.memory import MemoryCodec
from ..federation.message import Payload
from ..federation.parties import Party, Registry
from ..privacy.settings import DistributedNoise, DPSettings, NoiseGeometry
from .link import Link

__all__ = ["Stage", "AggregateStage", "SealStage", "StageDefaults", "StagedProtocol",
           "Rules", "READERS", "Check"]


# Who can read a logged message as is, in the audit's words: ``server``, ``wire`` (an
# eavesdropper), ``folder`` (a writer of the run folder, when payloads.bin keeps it),
# ``recipient`` (the client it is delivered to), ``key-holders`` (every client).
READERS = frozenset({"server", "wire", "folder", "recipient", "key-holders"})
# A parameter requirement the audit judges: (met, what it requires, in words).
Check = tuple[bool, str]


class Rules(Protocol):
    """A stage's rules over a log (:class:`~secureffm.audit.rules.ProtocolRules` feeds it
    every verified record in order, after its own rules)."""

    def check(self, record: dict, payload: bytes | None) -> str | None:
        """The first of its rules ``record`` (its kept ``payload``, None when not kept)
        breaks, as a sentence, or None."""

    def status(self) -> dict[str, str]:
        """Each of its rules that read a record: what it checked, or why it was not done."""


class Stage(Protocol):
    """What every stage has: its spec ``name``, ``role``, the ``phases`` it adds to a round,
    the kinds it ``can_protect`` and those it ``protects`` in this spec, the ``memory``
    codecs of the entries it keeps in a client's memory, its ``client_actions`` (action name
    -> a client's handler, :data:`~.step.Handler`: the steps its clients run, by the name a
    request's action gives), whether it ``carries_distributed_noise`` (a dp stage's
    ``noise = "distributed"`` holds only on kinds such a stage aggregates) and whether it
    ``joins_kinds`` (an aggregate stage that aggregates several kinds' concatenated payload
    in one run of its phases, :meth:`~.protocol.Protocol.joint_refusal`)."""

    name: str
    role: str
    phases: tuple[str, ...]
    can_protect: frozenset[str]
    protects: tuple[str, ...]
    memory: tuple[MemoryCodec, ...]
    client_actions: Mapping[str, Callable]
    carries_distributed_noise: bool
    joins_kinds: bool

    @classmethod
    def from_table(cls, table: dict, source: str) -> Stage:
        """Build from one ``[[stages]]`` table; a bad key or value is a ProtocolError."""

    def validate_for(self, clients: int) -> None:
        """Reject parameters impossible for ``clients`` clients."""

    def claim(self, kind: str) -> tuple[str, str]:
        """(what the stage does for a ``kind`` message, the trust that needs), in words, as
        privacy.json states them."""

    def exclusions(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        """What no claim covers in a run whose clients send ``kinds`` under this stage."""

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str] | None:
        """Who can read a logged ``record`` that names this stage (of :data:`READERS`) and why,
        in words; None when the stage leaves its payload as readable as it was. ``relayed``:
        the server relays the record's payload onward to the author's peers."""

    @staticmethod
    def audit_rules(signing_keys: Mapping[str, bytes]) -> Rules | None:
        """This stage's rules over a verified log, for parties with ``signing_keys`` (party ->
        Ed25519 public key, as in parties.json), or None when it has none."""

    def audit_parameters(self, clients: int, colluders: int, malicious: bool,
                         logged: list[dict], payload: Callable[[dict], bytes | None]
                         ) -> tuple[list[Check], list[str]]:
        """What this stage's parameters must meet against ``colluders`` clients colluding with
        the server (``malicious``: one that deviates) in a federation of ``clients``, and
        where the values came from, in words; ``logged``: the log's messages that name this
        stage; ``payload``: a record's kept payload (None when not kept)."""


class StageDefaults:
    """What a stage says where it has nothing to add (a base class its own statements
    override): no exclusions, no readers of its own (its messages stay as readable as they
    were), no client memory, no client actions, no distributed noise, no audit rules, no
    parameters for the audit to judge, no joint aggregation."""

    memory: tuple[MemoryCodec, ...] = ()
    client_actions: Mapping[str, Callable] = MappingProxyType({})
    carries_distributed_noise = False
    joins_kinds = False

    def exclusions(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        return ()

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str] | None:
        return None

    @staticmethod
    def audit_rules(signing_keys: Mapping[str, bytes]) -> Rules | None:
        return None

    def audit_parameters(self, clients: int, colluders: int, malicious: bool,
                         logged: list[dict], payload: Callable[[dict], bytes | None]
                         ) -> tuple[list[Check], list[str]]:
        return [], []


class AggregateStage(Stage, Protocol):
    """A stage through which the server obtains only a (weighted) sum; ``input_phase``: the
    phase of each client's input to it."""

    input_phase: str

    def aggregate(self, link: Link, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None) -> Aggregate:
        """Run one aggregation over ``link``'s clients."""

    def noise_geometry(self, weights: dict[str, float], sensitivity: dict[str, float],
                       size: int, colluders: int) -> NoiseGeometry:
        """How distributed noise adds up in this stage's sums."""


class SealStage(Stage, Protocol):
    """A stage that encrypts individual messages for their recipients."""

    def seal(self, sender: Party, registry: Registry, payload: Payload, kind: str, round_: int,
             phase: str, recipients: list[str]) -> bytes:
        """``sender`` seals ``payload`` for ``recipients`` with its own keys."""

    def relay(self, data: bytes, recipient: str, sender: str) -> bytes:
        """What the server forwards of a sealed message to one recipient."""

    def open(self, recipient: Party, registry: Registry, data: bytes, kind: str, round_: int,
             phase: str, sender: str) -> Payload:
        """``recipient`` opens a message of ``sender`` with its own key."""


@runtime_checkable
class StagedProtocol(Protocol):
    """What a client's handlers read of its own protocol (the one it built from its own spec,
    :class:`~secureffm.protocols.protocol.Protocol`): the stage protecting each kind, its DP
    settings, and whether it may send a kind on its own."""

    name: str
    stages: list[Stage]

    def aggregator(self, kind: str) -> AggregateStage | None:
        """The aggregate stage protecting ``kind``, or None (aggregated in the clear)."""

    def sealer(self, kind: str) -> SealStage | None:
        """The seal stage sealing ``kind``, or None (sent in the clear)."""

    def dp_for(self, kind: str) -> DPSettings | None:
        """The DP settings ``kind`` is computed with, or None."""

    def check_individual(self, kind: str) -> None:
        """Refuse sending ``kind`` one by one when an aggregate stage protects it."""

    def joint_refusal(self, kind: str) -> str | None:
        """Why it does not aggregate the joint ``kind``'s parts at once, or None."""
