"""Stage registration and protocol specs (read through the one spec loader, secureffm.specs).

A spec is a TOML file with keys ``name``, ``description`` and ``stages`` (a list of tables, each
naming a registered ``stage``, the message kinds it ``protects``, and its parameters). Stage
classes are registered with :func:`register_stage` (the shipped ones by
:func:`~secureffm.protocols.protocol.build_protocol`); the parsing helpers here reject an
unknown or missing key, and a kind a stage cannot protect, by name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError
from ..specs import check_keys, read_spec_file, shipped

__all__ = ["STAGES", "ROLES", "register_stage", "check_table", "check_protects", "ProtocolSpec",
           "read_spec", "spec_from_table", "known_protocols"]

# Stage classes by spec name, filled by register_stage (no module fills it when imported).
STAGES: dict[str, type] = {}
ROLES = ("client", "aggregate", "seal")
_SPEC_KEYS = {"name", "description", "stages"}


def register_stage(cls: type) -> type:
    if getattr(cls, "role", None) not in ROLES:
        raise TypeError(f"stage class {cls.__name__} needs a role in {ROLES}")
    STAGES[cls.name] = cls
    return cls


def check_table(table: dict, allowed: set[str], required: tuple[str, ...], where: str) -> None:
    """Reject a spec table with an unknown key or without a required one, naming the key."""
    check_keys(table, allowed, required, where, ProtocolError)


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

    def canonical(self) -> bytes:
        """The spec's content (name, description, stages; not where it was read from) as
        sorted-key compact JSON: equal for equal specs, whatever their comments or layout."""
        body = {"name": self.name, "description": self.description, "stages": list(self.stages)}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @property
    def sha256(self) -> str:
        """Hex sha256 of :meth:`canonical`: the digest a Flower node pins its protocol by."""
        return hashlib.sha256(self.canonical()).hexdigest()


def known_protocols() -> list[str]:
    """Names of the protocol specs shipped with the package."""
    return shipped("protocols")


def read_spec(name_or_path: str) -> ProtocolSpec:
    """A shipped spec by name (``plaintext``) or a user's spec by path (``my.toml``)."""
    values, source = read_spec_file("protocols", name_or_path, "protocol", ProtocolError)
    return spec_from_table(values, source)


def spec_from_table(values: dict, source: str) -> ProtocolSpec:
    """The spec of a parsed top-level table (a file's, or :meth:`ProtocolSpec.canonical`'s
    JSON); ``source`` says where it came from in messages."""
    if not isinstance(values, dict):
        raise ProtocolError(f"protocol spec {source}: expected a table of name and stages")
    check_table(values, _SPEC_KEYS, ("name", "stages"), f"protocol spec {source}")
    stages = values["stages"]
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise ProtocolError(f"protocol spec {source}: 'stages' must be a list of tables "
                            "([[stages]] with a 'stage' key each)")
    return ProtocolSpec(values["name"], values.get("description", ""), tuple(stages), source)
