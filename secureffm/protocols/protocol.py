"""`Protocol`: an ordered list of stages read from a spec (:mod:`.registry`), and what it
decides about each message kind: which stage aggregates or seals it, which client stages shape
it, and the DP settings and randomized-t protections its senders must compute with.

Every stage has a ``role`` (:mod:`.stage`): ``client`` (it changes how a client computes a
message, as DP-SGD or randomized t do; it sends nothing), ``aggregate`` (the server obtains
only a sum, as with secure aggregation) or ``seal`` (individual messages are encrypted end
to end). A kind no aggregation stage protects is aggregated in the clear. A joint kind
(:mod:`~secureffm.federation.joint`, "gradient+dual_update") is one aggregation of its parts,
allowed only where :meth:`Protocol.joint_refusal` finds nothing to refuse. The messages
themselves go through :class:`~secureffm.protocols.channel.ProtectedChannel`.
"""

from __future__ import annotations

import functools
from typing import cast

from ..errors import ProtocolError
from ..federation.joint import is_joint, kind_parts
from ..federation.memory import register_memory
from ..federation.message import RELAY_PHASE
from ..privacy.settings import DPSettings, GeodesicPrivacy, NoiseGeometry
from .dp import DPStage
from .link import BROADCASTS
from .randomized_t import RandomizedTStage
from .registry import STAGES, ProtocolSpec, known_protocols, read_spec, register_stage
from .stage import AggregateStage, SealStage, Stage

__all__ = ["Protocol", "load_protocol", "build_protocol", "stage_classes", "input_phases",
           "without_dp", "PLAIN_PHASES"]

PLAIN_PHASES = ("broadcast", "upload", RELAY_PHASE)


def load_protocol(name_or_path: str) -> Protocol:
    """Load a shipped spec by name (``plaintext``) or a user's spec by path (``my.toml``)."""
    return build_protocol(read_spec(name_or_path))


def build_protocol(spec: ProtocolSpec) -> Protocol:
    """The protocol of a parsed ``spec``, its stages built (and their parameters checked).
    Every registered stage's client-memory codecs are registered with the snapshot first
    (:mod:`secureffm.federation.memory`), so a client's state crosses a Flower message."""
    _register_stages()
    return Protocol(spec)


def stage_classes() -> tuple[type[Stage], ...]:
    """Every registered stage class, in registration order (a log record's ``stages`` name
    them)."""
    _register_stages()
    return tuple(STAGES.values())


def input_phases() -> tuple[str, ...]:
    """The phases of a client's input to an aggregate: ``upload`` in the clear, and each
    registered aggregate stage's own."""
    stages = [s for s in stage_classes() if s.role == "aggregate"]
    return tuple(dict.fromkeys(["upload", *(s.input_phase for s in stages)]))


def without_dp(name_or_path: str) -> str | None:
    """The shipped protocol that runs the stages of spec ``name_or_path`` but its dp stage,
    with equal parameters (what each protects may be wider), or None when no shipped spec, or
    more than one, is: what a sweep runs at epsilon = inf."""
    def rest(spec: ProtocolSpec) -> list[dict]:
        return [{k: v for k, v in t.items() if k != "protects"} for t in spec.stages
                if t.get("stage") != DPStage.name]

    asked = read_spec(name_or_path)
    if len(rest(asked)) == len(asked.stages):
        return None
    found = [name for name, spec in _shipped_specs().items()
             if len(rest(spec)) == len(spec.stages) and rest(spec) == rest(asked)]
    return found[0] if len(found) == 1 else None


@functools.cache
def _shipped_specs() -> dict[str, ProtocolSpec]:
    return {name: read_spec(name) for name in known_protocols()}


def _register_stages() -> None:
    """Register the shipped stages, named here (no stage module registers itself when
    imported; imported when the first protocol is built), then the client memory of every
    registered stage and of the broadcasts a client notes."""
    from .ckks import CKKSStage
    from .sealed import SealedStage
    from .secagg import SecAggStage

    for stage in (DPStage, RandomizedTStage, SealedStage, CKKSStage, SecAggStage):
        register_stage(stage)

    register_memory(BROADCASTS)
    for cls in STAGES.values():
        for codec in cls.memory:
            register_memory(codec)


class Protocol:
    """Builds its stages from a spec; aggregates each message kind with the stage protecting it.

    ``phases``: every phase name a message of this protocol can carry, in round order.
    """

    def __init__(self, spec: ProtocolSpec):
        self.spec = spec
        self.name = spec.name
        self.stages: list[Stage] = []
        for index, table in enumerate(spec.stages):
            name = table.get("stage")
            if name not in STAGES:
                known = ", ".join(sorted(STAGES)) or "none"
                raise ProtocolError(f"protocol spec {spec.source}: stages[{index}] names unknown "
                                    f"stage {name!r}; known stages: {known}")
            self.stages.append(STAGES[name].from_table(table, f"{spec.source} stages[{index}]"))
        dp_stages = [s for s in self.stages if isinstance(s, DPStage)]
        if len(dp_stages) > 1:
            raise ProtocolError(f"protocol spec {spec.source}: more than one 'dp' stage")
        self.dp: DPStage | None = dp_stages[0] if dp_stages else None
        self._by_kind = cast(dict[str, AggregateStage], self._one_stage_per_kind("aggregate"))
        self._sealed_by_kind = cast(dict[str, SealStage],
                                    self._one_stage_per_kind("seal"))
        both = sorted(set(self._by_kind) & set(self._sealed_by_kind))
        if both:
            raise ProtocolError(f"protocol spec {spec.source}: kind {both[0]!r} is both "
                                "aggregated and sent one by one; protect it with one of them")
        self.phases = PLAIN_PHASES + tuple(p for s in self.stages for p in s.phases)
        self._check_distributed_noise()

    def _check_distributed_noise(self) -> None:
        """Distributed noise only on kinds a stage that carries it aggregates
        (:attr:`~.stage.Stage.carries_distributed_noise`)."""
        if self.dp is None or self.dp.settings.noise != "distributed":
            return
        for kind in self.dp.protects:
            stage = self._by_kind.get(kind)
            if stage is None or not stage.carries_distributed_noise:
                carriers = ", ".join(repr(n) for n, cls in STAGES.items()
                                     if cls.carries_distributed_noise)
                raise ProtocolError(
                    f"protocol spec {self.spec.source}: distributed noise on kind {kind!r} holds "
                    "only inside secure aggregation by a stage that carries it (each client "
                    "adds a share; only the sum carries the full noise): add "
                    f"{kind!r} to the protects of a stage {carriers}, or use noise = 'local'")

    def _one_stage_per_kind(self, role: str) -> dict[str, Stage]:
        by_kind: dict[str, Stage] = {}
        for stage in self.stages:
            if stage.role != role:
                continue
            for kind in stage.protects:
                if kind in by_kind:
                    raise ProtocolError(f"protocol spec {self.spec.source}: kind {kind!r} is "
                                        f"protected by two {role} stages")
                by_kind[kind] = stage
        return by_kind

    def stage_for(self, stage_name: str, kind: str) -> Stage | None:
        """The stage named ``stage_name`` that protects ``kind``, or None."""
        for stage in self.stages:
            if stage.name == stage_name and kind in stage.protects:
                return stage
        return None

    def client_stages(self, kind: str) -> tuple[str, ...]:
        """Names of the client-side stages (DP, randomized t) that shaped a ``kind`` message
        (of a joint kind: those that shaped every part)."""
        return tuple(s.name for s in self.stages if s.role == "client"
                     and set(kind_parts(kind)) <= set(s.protects))

    def joint_refusal(self, kind: str) -> str | None:
        """Why this protocol does not aggregate the joint ``kind``'s parts in one aggregation,
        in words, or None when it does: two or more distinct kinds, each aggregated by the
        same stage that can aggregate several kinds at once (``joins_kinds``), shaped by the
        same client stages, and none with distributed noise (whose share is sized by each
        kind's own quantization geometry). Each part then keeps its own protection: a joint
        request cannot release a kind outside it, nor one kind twice."""
        parts = kind_parts(kind)
        if len(parts) < 2:
            return f"a joint aggregation names two or more kinds, not {kind!r}"
        repeated = next((part for i, part in enumerate(parts) if part in parts[:i]), None)
        if repeated is not None:
            return f"it names {repeated!r} twice (each kind is released once per aggregation)"
        stage, shaped = self._by_kind.get(parts[0]), self.client_stages(parts[0])
        for part in parts:
            own = self._by_kind.get(part)
            if own is None:
                return (f"protocol {self.name!r} aggregates {part!r} in the clear, so it "
                        "joins no secure aggregation")
            if own is not stage:
                return (f"protocol {self.name!r} aggregates {part!r} with another stage than "
                        f"{parts[0]!r}")
            if self.client_stages(part) != shaped:
                return (f"protocol {self.name!r} shapes {part!r} with client stages "
                        f"{list(self.client_stages(part))}, {parts[0]!r} with {list(shaped)}: "
                        "each kind keeps its own protection")
            settings = self.dp_for(part)
            if settings is not None and settings.noise == "distributed":
                return (f"protocol {self.name!r} adds distributed noise to {part!r}, sized by "
                        "each kind's own quantization geometry, so its kinds are aggregated "
                        "one after another")
        if not stage.joins_kinds:
            return (f"protocol {self.name!r}'s {stage.name!r} stage aggregates one kind at "
                    "a time")
        return None

    def validate_for(self, clients: int) -> None:
        """Reject parameters impossible for ``clients`` clients (threshold, modulus)."""
        for stage in self.stages:
            stage.validate_for(clients)

    def dp_for(self, kind: str) -> DPSettings | None:
        """The DP settings clients must train ``kind`` updates with (of a joint kind: every
        part's), or None."""
        covered = self.dp is not None and set(kind_parts(kind)) <= set(self.dp.protects)
        return self.dp.settings if covered else None

    def check_protects_any(self, kinds: tuple[str, ...], sender: str) -> None:
        """Refuse a protocol with stages of which none protects any of ``kinds`` (every kind
        ``sender``, a method, sends from client data): the run would travel in the clear under
        a protocol's name that promises a protection."""
        if self.stages and not any(kind in s.protects for s in self.stages for kind in kinds):
            protected = sorted({kind for s in self.stages for kind in s.protects})
            raise ProtocolError(
                f"protocol {self.name!r} protects {', '.join(protected)}, none of what "
                f"{sender} sends ({', '.join(kinds)}); its messages would all travel in the "
                "clear. Pick a protocol that protects them, or 'plaintext' to say so")

    def dp_settings(self, kinds: tuple[str, ...], sender: str) -> DPSettings | None:
        """The DP settings for all of ``kinds`` (every message ``sender``, a method, derives
        from client data), or None when the protocol has no dp stage. A dp stage that leaves
        one of them out is refused, naming it: that message would travel without DP while
        the protocol's name promises DP."""
        if self.dp is None:
            return None
        missing = [kind for kind in kinds if kind not in self.dp.protects]
        if missing:
            raise ProtocolError(
                f"protocol {self.name!r} has a dp stage, but it does not protect "
                f"{missing[0]!r}, which {sender} also sends, computed from client data; "
                f"training it without DP would be silent. Add {missing[0]!r} to the dp stage's "
                "'protects', or use a protocol without a dp stage")
        return self.dp.settings

    def noise_geometry(self, kind: str, weights: dict[str, float],
                       sensitivity: dict[str, float], size: int) -> NoiseGeometry | None:
        """The distributed-noise geometry of ``kind``, or None when ``kind`` does not get
        distributed noise."""
        settings = self.dp_for(kind)
        if settings is None or settings.noise != "distributed":
            return None
        return self._by_kind[kind].noise_geometry(weights, sensitivity, size,
                                                  settings.colluders)

    def aggregator(self, kind: str) -> AggregateStage | None:
        """The aggregate stage protecting ``kind``, or None (aggregated in the clear); of a
        joint kind, the stage aggregating its parts at once, or None when
        :meth:`joint_refusal` refuses it."""
        if is_joint(kind):
            return None if self.joint_refusal(kind) else self._by_kind[kind_parts(kind)[0]]
        return self._by_kind.get(kind)

    def sealer(self, kind: str) -> SealStage | None:
        """The seal stage sealing ``kind``, or None (sent in the clear)."""
        return self._sealed_by_kind.get(kind)

    def geodesic_privacy(self, kind: str = "measure") -> GeodesicPrivacy | None:
        """The randomized-t protections of ``kind`` messages, or None."""
        stage = next((s for s in self.stages
                      if isinstance(s, RandomizedTStage) and kind in s.protects), None)
        return None if stage is None else GeodesicPrivacy(stage.t_low, stage.t_high,
                                                          stage.noise_std)

    def check_individual(self, kind: str) -> None:
        """Refuse sending ``kind`` one by one when an aggregate stage protects it, and a joint
        kind always (it exists only to be aggregated)."""
        if is_joint(kind):
            raise ProtocolError(f"kind {kind!r} joins several kinds in one aggregation; it is "
                                "never sent one by one")
        if kind in self._by_kind:
            raise ProtocolError(
                f"kind {kind!r} is protected by the {self._by_kind[kind].name!r} stage of "
                f"protocol {self.name!r}, so the server may only learn its sum; sending it one by "
                "one would expose each message. Aggregate it, or use a protocol that does not "
                "aggregate this kind")
