"""Stage registration and spec loading: the one place that reads protocol spec files.

A spec is a TOML file with keys ``name``, ``description`` and ``stages`` (a list of tables, each
naming a registered ``stage``, the message kinds it ``protects``, and its parameters). Stage
modules register their class with :func:`register_stage`; the parsing helpers here reject an
unknown or missing key, and a kind a stage cannot protect, by name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ProtocolError

__all__ = ["STAGES", "ROLES", "register_stage", "check_table", "check_protects", "ProtocolSpec",
           "read_spec", "known_protocols"]

# Stage classes by spec name; a stage module registers itself with @register_stage.
STAGES: dict[str, type] = {}
ROLES = ("client", "aggregate", "transport")
_SPEC_KEYS = {"name", "description", "stages"}


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


def read_spec(name_or_path: str) -> ProtocolSpec:
    """A shipped spec by name (``plaintext``) or a user's spec by path (``my.toml``)."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProtocolError(f"protocol spec file {name_or_path!r} does not exist")
        return _parse_spec(path.read_text(), str(path))
    resource = _spec_dir() / f"{name_or_path}.toml"
    if not resource.is_file():
        raise ProtocolError(f"unknown protocol {name_or_path!r}; shipped protocols: "
                            f"{', '.join(known_protocols())}, or give a path to a .toml spec")
    return _parse_spec(resource.read_text(), f"{name_or_path}.toml")


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
