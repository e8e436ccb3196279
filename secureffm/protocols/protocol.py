"""`Protocol`: an ordered list of stages read from a spec, wrapping every message.

A spec is a TOML file with keys ``name``, ``description`` and ``stages`` (a list of tables, each
naming a registered ``stage`` and its parameters). Stages register by the name used in specs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ProtocolError
from ..federation.message import Envelope, Payload, deserialize_payload, serialize_payload
from .aggregation import weighted_sum

__all__ = ["Protocol", "ProtocolSpec", "load_protocol", "known_protocols", "STAGES"]

# Stage classes by spec name. Secure aggregation, DP, CKKS and sealed transport register here.
STAGES: dict[str, type] = {}
_SPEC_KEYS = {"name", "description", "stages"}


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
    unknown = sorted(set(values) - _SPEC_KEYS)
    if unknown:
        raise ProtocolError(f"protocol spec {source}: unknown key {unknown[0]!r}; "
                            f"allowed keys are {', '.join(sorted(_SPEC_KEYS))}")
    for key in ("name", "stages"):
        if key not in values:
            raise ProtocolError(f"protocol spec {source}: missing required key {key!r}")
    stages = values["stages"]
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise ProtocolError(f"protocol spec {source}: 'stages' must be a list of tables "
                            "([[stages]] with a 'stage' key each)")
    for index, table in enumerate(stages):
        name = table.get("stage")
        if name not in STAGES:
            known = ", ".join(sorted(STAGES)) or "none in this version"
            raise ProtocolError(f"protocol spec {source}: stages[{index}] names unknown stage "
                                f"{name!r}; known stages: {known}")
    return ProtocolSpec(values["name"], values.get("description", ""), tuple(stages), source)


def load_protocol(name_or_path: str) -> Protocol:
    """Load a shipped spec by name (``plaintext``) or a user's spec by path (``my.toml``)."""
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


class Protocol:
    """Wraps every message: ``encode`` on the sender's side, ``aggregate``/``decode`` on receipt."""

    def __init__(self, spec: ProtocolSpec):
        self.spec = spec
        self.name = spec.name

    def encode(self, payload: Payload) -> tuple[bytes, tuple[str, ...]]:
        """Sender side: the bytes that cross the engine and the stages applied to them."""
        return serialize_payload(payload), ()

    def decode(self, envelope: Envelope) -> Payload:
        """Receiver side, for messages the recipient must read individually."""
        return deserialize_payload(envelope.data, envelope.sender)

    def aggregate(self, envelopes: list[Envelope], weights: dict[str, float]) -> Payload:
        """Server side: the weighted sum of the senders' payloads (weights by sender id)."""
        return weighted_sum([(e.sender, self.decode(e), weights[e.sender]) for e in envelopes])
