"""`Protocol`: an ordered list of stages read from a spec, wrapping every message.

A spec is a TOML file with keys ``name``, ``description`` and ``stages`` (a list of tables, each
naming a registered ``stage``, the message kinds it ``protects``, and its parameters). A kind
no aggregation stage protects is aggregated in the clear.
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
from ..federation.message import Payload, deserialize_payload, serialize_payload
from .aggregation import check_payload, weighted_mean

if TYPE_CHECKING:
    from ..federation.engine import Aggregate, InProcessEngine, Template
    from ..federation.parties import Client

__all__ = ["Protocol", "ProtocolSpec", "load_protocol", "known_protocols", "STAGES",
           "register_stage", "PLAIN_PHASES"]

# Stage classes by spec name; a stage module registers itself with @register_stage.
STAGES: dict[str, type] = {}
_SPEC_KEYS = {"name", "description", "stages"}
PLAIN_PHASES = ("broadcast", "upload")


def register_stage(cls: type) -> type:
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
    from . import dp, secagg  # noqa: F401  (they register their stages)


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
        self._by_kind = {}
        for stage in self.stages:
            if stage is self.dp:
                continue
            for kind in stage.protects:
                if kind in self._by_kind:
                    raise ProtocolError(f"protocol spec {spec.source}: kind {kind!r} is "
                                        f"protected by two aggregation stages")
                self._by_kind[kind] = stage
        self.phases = PLAIN_PHASES + tuple(p for s in self.stages for p in s.phases)

    def validate_for(self, clients: int) -> None:
        """Reject parameters impossible for ``clients`` clients (threshold, modulus)."""
        for stage in self.stages:
            stage.validate_for(clients)

    def dp_for(self, kind: str):
        """The DP settings clients must train ``kind`` updates with, or None."""
        return self.dp.settings if self.dp and kind in self.dp.protects else None

    def decode_public(self, data: bytes, sender: str) -> Payload:
        """Decode a message every recipient may read (server broadcasts)."""
        return deserialize_payload(data, sender)

    def aggregate(self, engine: InProcessEngine, round_: int, kind: str,
                  compute: Callable[[Client], Payload], weights: dict[str, float],
                  template: Template) -> Aggregate:
        prior = ("dp",) if self.dp_for(kind) else ()
        stage = self._by_kind.get(kind)
        if stage is not None:
            return stage.aggregate(engine, round_, kind, compute, weights, template, prior)
        return plain_aggregate(engine, round_, kind, compute, weights, template, prior)


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
