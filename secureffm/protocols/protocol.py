"""`Protocol`: an ordered list of stages read from a spec, wrapping every message.

A spec is a TOML file with keys ``name``, ``description`` and ``stages`` (a list of tables, each
naming a registered ``stage``, the message kinds it ``protects``, and its parameters). A kind
no aggregation stage protects is aggregated in the clear.

Every stage class has a ``role``: ``client`` (it changes how a client computes a message, as
DP-SGD or randomized t do; it sends nothing), ``aggregate`` (the server obtains only a sum, as
with secure aggregation) or ``transport`` (individual messages are encrypted end to end).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.message import SERVER, Payload, deserialize_payload, serialize_payload
from .aggregation import check_payload, weighted_mean

if TYPE_CHECKING:
    from ..federation.engine import Aggregate, InProcessEngine, Template
    from ..federation.parties import Client

__all__ = ["Protocol", "ProtocolSpec", "load_protocol", "known_protocols", "STAGES",
           "register_stage", "PLAIN_PHASES"]

# Stage classes by spec name; a stage module registers itself with @register_stage.
STAGES: dict[str, type] = {}
_SPEC_KEYS = {"name", "description", "stages"}
PLAIN_PHASES = ("broadcast", "upload", "relay")
ROLES = ("client", "aggregate", "transport")


def register_stage(cls: type) -> type:
    if getattr(cls, "role", None) not in ROLES:
        raise TypeError(f"stage class {cls.__name__} needs a role in {ROLES}")
    STAGES[cls.name] = cls
    return cls


def check_table(table: dict, allowed: set[str], required: tuple[str, ...], where: str) -> None:
    """Reject a spec table with an unknown key or without a required one, naming the key."""
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ProtocolError(f"{where}: unknown key {unknown[0]!r}; allowed keys are "
                            f"{', '.join(sorted(allowed - {'stage'}))}")
    for key in required:
        if key not in table:
            raise ProtocolError(f"{where}: missing required key {key!r}")


def check_protects(protects: tuple[str, ...], stage: type, where: str, why: str) -> None:
    """Refuse a kind ``stage`` cannot protect; ``why`` says what the stage can do instead."""
    refused = sorted(set(protects) - stage.can_protect)
    if refused:
        raise ProtocolError(f"{where}: stage {stage.name!r} cannot protect kind {refused[0]!r}: "
                            f"{why}; it protects {', '.join(sorted(stage.can_protect))}")


@dataclass(frozen=True)
class ProtocolSpec:
    """A parsed protocol spec: its name, description and stage tables in order."""

    name: str
    description: str
    stages: tuple[dict[str, Any], ...] = field(default=())
    source: str = ""


def _spec_dir():
    return resources.files("secureffm.specs") / "protocols"


def known_protocols() -> list[str]:
    """Names of the protocol specs shipped with the package."""
    return sorted(p.name[:-5] for p in _spec_dir().iterdir() if p.name.endswith(".toml"))


def _parse_spec(text: str, source: str) -> ProtocolSpec:
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ProtocolError(f"protocol spec {source} is not valid TOML: {err}") from None
    check_table(values, _SPEC_KEYS, ("name", "stages"), f"protocol spec {source}")
    stages = values["stages"]
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise ProtocolError(f"protocol spec {source}: 'stages' must be a list of tables "
                            "([[stages]] with a 'stage' key each)")
    return ProtocolSpec(values["name"], values.get("description", ""), tuple(stages), source)


def load_protocol(name_or_path: str) -> Protocol:
    """Load a shipped spec by name (``plaintext``) or a user's spec by path (``my.toml``)."""
    _register_builtin_stages()
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProtocolError(f"protocol spec file {name_or_path!r} does not exist")
        return Protocol(_parse_spec(path.read_text(), str(path)))
    resource = _spec_dir() / f"{name_or_path}.toml"
    if not resource.is_file():
        raise ProtocolError(f"unknown protocol {name_or_path!r}; shipped protocols: "
                            f"{', '.join(known_protocols())}, or give a path to a .toml spec")
    return Protocol(_parse_spec(resource.read_text(), f"{name_or_path}.toml"))


def _register_builtin_stages() -> None:
    from . import dp, randomized_t, sealed, secagg  # noqa: F401  (they register their stages)


class Protocol:
    """Builds its stages from a spec; aggregates each message kind with the stage protecting it.

    ``phases``: every phase name a message of this protocol can carry, in round order.
    """

    def __init__(self, spec: ProtocolSpec):
        self.spec = spec
        self.name = spec.name
        self.stages = []
        for index, table in enumerate(spec.stages):
            name = table.get("stage")
            if name not in STAGES:
                known = ", ".join(sorted(STAGES)) or "none"
                raise ProtocolError(f"protocol spec {spec.source}: stages[{index}] names unknown "
                                    f"stage {name!r}; known stages: {known}")
            self.stages.append(STAGES[name].from_table(table, f"{spec.source} stages[{index}]"))
        dp_stages = [s for s in self.stages if s.name == "dp"]
        if len(dp_stages) > 1:
            raise ProtocolError(f"protocol spec {spec.source}: more than one 'dp' stage")
        self.dp = dp_stages[0] if dp_stages else None
        self._by_kind = self._one_stage_per_kind("aggregate")
        self._sealed_by_kind = self._one_stage_per_kind("transport")
        both = sorted(set(self._by_kind) & set(self._sealed_by_kind))
        if both:
            raise ProtocolError(f"protocol spec {spec.source}: kind {both[0]!r} is both "
                                "aggregated and sent one by one; protect it with one of them")
        self.phases = PLAIN_PHASES + tuple(p for s in self.stages for p in s.phases)
        self._check_distributed_noise()

    def _check_distributed_noise(self) -> None:
        if self.dp is None or self.dp.settings.noise != "distributed":
            return
        for kind in self.dp.protects:
            stage = self._by_kind.get(kind)
            if stage is None or stage.name != "secagg":
                raise ProtocolError(
                    f"protocol spec {self.spec.source}: distributed noise on kind {kind!r} holds "
                    "only inside secure aggregation (each client adds a share; only the sum "
                    f"carries the full noise): add {kind!r} to a secagg stage's protects, or "
                    "use noise = 'local'")

    def _one_stage_per_kind(self, role: str) -> dict[str, Any]:
        by_kind: dict[str, Any] = {}
        for stage in self.stages:
            if stage.role != role:
                continue
            for kind in stage.protects:
                if kind in by_kind:
                    raise ProtocolError(f"protocol spec {self.spec.source}: kind {kind!r} is "
                                        f"protected by two {role} stages")
                by_kind[kind] = stage
        return by_kind

    def stage_for(self, stage_name: str, kind: str):
        """The stage named ``stage_name`` that protects ``kind``, or None."""
        for stage in self.stages:
            if stage.name == stage_name and kind in stage.protects:
                return stage
        return None

    def client_stages(self, kind: str) -> tuple[str, ...]:
        """Names of the client-side stages (DP, randomized t) that shaped a ``kind`` message."""
        return tuple(s.name for s in self.stages if s.role == "client" and kind in s.protects)

    def validate_for(self, clients: int) -> None:
        """Reject parameters impossible for ``clients`` clients (threshold, modulus)."""
        for stage in self.stages:
            stage.validate_for(clients)

    def dp_for(self, kind: str):
        """The DP settings clients must train ``kind`` updates with, or None."""
        return self.dp.settings if self.dp and kind in self.dp.protects else None

    def dp_settings(self, kinds: tuple[str, ...], sender: str):
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
                       sensitivity: dict[str, float], size: int):
        """The distributed-noise geometry of ``kind`` (see secagg.NoiseGeometry), or None
        when ``kind`` does not get distributed noise."""
        settings = self.dp_for(kind)
        if settings is None or settings.noise != "distributed":
            return None
        return self._by_kind[kind].noise_geometry(weights, sensitivity, size,
                                                  settings.colluders)

    def decode_public(self, data: bytes, sender: str) -> Payload:
        """Decode a message every recipient may read (server broadcasts)."""
        return deserialize_payload(data, sender)

    def aggregate(self, engine: InProcessEngine, round_: int, kind: str,
                  compute: Callable[[Client], Payload], weights: dict[str, float],
                  template: Template, noise=None) -> Aggregate:
        """``noise``: a DistributedNoise for kinds under distributed DP noise, else None."""
        prior = self.client_stages(kind)
        stage = self._by_kind.get(kind)
        settings = self.dp_for(kind)
        if (noise is not None) != bool(settings and settings.noise == "distributed"):
            raise ProtocolError(f"kind {kind!r}: distributed noise parameters must be given "
                                "exactly when the protocol's dp stage uses distributed noise")
        if stage is not None:
            return stage.aggregate(engine, round_, kind, compute, weights, template, prior,
                                   noise=noise)
        return plain_aggregate(engine, round_, kind, compute, weights, template, prior)


    # -- individual messages -----------------------------------------------------------------

    def _check_individual(self, kind: str) -> None:
        if kind in self._by_kind:
            raise ProtocolError(
                f"kind {kind!r} is protected by the {self._by_kind[kind].name!r} stage of "
                f"protocol {self.name!r}, so the server may only learn its sum; sending it one by "
                "one would expose each message. Aggregate it, or use a protocol that does not "
                "aggregate this kind")

    def send(self, engine: InProcessEngine, round_: int, phase: str, kind: str, sender: str,
             recipient: str, payload: Payload) -> Payload | None:
        """One individual message from ``sender`` to ``recipient`` (client ids or SERVER),
        sealed for the recipient when a ``sealed`` stage protects ``kind``.

        Returns the payload as the recipient decoded it, or None when the sender is offline or
        the recipient rejected the message (a logged event names why).
        """
        self._check_individual(kind)
        sealer = self._sealed_by_kind.get(kind)
        shaped = self.client_stages(kind) if sender != SERVER else ()  # the server's own: none
        stages = shaped + ((sealer.name,) if sealer else ())
        if sealer is not None:
            data = sealer.seal(engine, payload, kind, round_, phase, sender, [recipient])
        else:
            data = serialize_payload(payload)
        received = engine.send(round_, phase, kind, sender, recipient, data, stages)
        if received is None:
            return None
        return self._open(engine, round_, phase, kind, sender, recipient, received, sealer)

    def _open(self, engine, round_, phase, kind, author, recipient, data, sealer,
              relayed_by: str | None = None) -> Payload | None:
        try:
            if sealer is None:
                payload = deserialize_payload(data, author)
            else:
                payload = sealer.open(engine, data, kind, round_, phase, author, recipient)
            check_payload(author, payload, None)
        except (MessageError, ProtocolError) as err:
            engine.reject(round_, phase, relayed_by or author,
                          f"{recipient} rejected {kind} message of {author}: {err}", by=recipient)
            return None
        return payload

    def all_gather(self, engine: InProcessEngine, round_: int, kind: str,
                   compute: Callable[[Client], Payload]) -> dict[str, dict[str, Payload]]:
        """Each alive client computes its payload once and uploads it (phase ``upload``); the
        server relays it to every other client (phase ``relay``), sealed per recipient when a
        ``sealed`` stage protects ``kind`` so the relay cannot read it.

        Returns recipient id -> {author id -> payload} for every copy that arrived intact.
        """
        self._check_individual(kind)
        sealer = self._sealed_by_kind.get(kind)
        stages = self.client_stages(kind) + ((sealer.name,) if sealer else ())
        gathered: dict[str, dict[str, Payload]] = {c.id: {} for c in engine.clients}
        authors = [c for c in engine.clients if engine.alive(c.id, round_, "upload")]
        for author in authors:
            peers = [c.id for c in engine.clients if c.id != author.id]
            payload = compute(author)
            if sealer is not None:
                data = sealer.seal(engine, payload, kind, round_, "relay", author.id, peers)
            else:
                data = serialize_payload(payload)
            uploaded = engine.send(round_, "upload", kind, author.id, SERVER, data, stages)
            if uploaded is None:
                continue
            for peer in peers:
                try:
                    copy = sealer.relay(uploaded, peer, author.id) if sealer else uploaded
                except MessageError as err:
                    engine.reject(round_, "upload", author.id, str(err))
                    break
                delivered = engine.send(round_, "relay", kind, SERVER, peer, copy, stages,
                                        origin=author.id)
                if delivered is None:
                    continue
                opened = self._open(engine, round_, "relay", kind, author.id, peer, delivered,
                                    sealer, relayed_by=SERVER)
                if opened is not None:
                    gathered[peer][author.id] = opened
        return gathered


def plain_aggregate(engine, round_, kind, compute, weights, template, prior=()) -> Aggregate:
    """Every client uploads its payload in the clear (``prior``: stages already applied, such
    as ``dp``); the server checks each one against ``template``, leaves out (and names) the bad
    ones, and averages the rest with weights."""
    from ..federation.engine import Aggregate

    reference = {name: np.zeros(shape, dtype) for name, (shape, dtype) in template.items()}
    accepted, dropped = [], {}
    for client in engine.clients:
        if not engine.alive(client.id, round_, "upload"):
            dropped[client.id] = "offline at phase upload"
            continue
        data = engine.send(round_, "upload", kind, client.id, "server",
                           serialize_payload(compute(client)), prior)
        if data is None:
            dropped[client.id] = "its upload was rejected or never arrived"
            continue
        try:
            payload = deserialize_payload(data, client.id)
            check_payload(client.id, payload, reference)
        except MessageError as err:
            engine.reject(round_, "upload", client.id, str(err))
            dropped[client.id] = str(err)
            continue
        accepted.append((client.id, payload))
    if not accepted:
        return Aggregate(None, [], dropped, "no client update was accepted")
    mean = weighted_mean([(payload, weights[cid]) for cid, payload in accepted])
    return Aggregate(mean, [cid for cid, _ in accepted], dropped)
