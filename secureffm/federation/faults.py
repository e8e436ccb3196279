"""Fault injection for the in-process engine, read from ``threat_models/*.toml``.

A threat model lists faults; each names an ``action``, the ``party`` it hits, the ``phase`` of
the protocol at which it hits, and optionally the ``rounds`` (every round when omitted):

- ``drop``: the party goes offline at that phase and sends nothing more that round.
- ``corrupt``: its message at that phase is altered in transit (one byte flipped).
- ``replay``: its message at that phase is delivered a second time.
- ``delay``: its message at that phase arrives after the phase closed.
- ``unknown_sender``: a message claiming to be from ``party`` (a name no one registered) arrives
  at that phase.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError

__all__ = ["Fault", "FaultPlan", "load_threat_model", "ACTIONS"]

ACTIONS = ("drop", "corrupt", "replay", "delay", "unknown_sender")
_FAULT_KEYS = {"action", "party", "phase", "rounds"}
_MODEL_KEYS = {"name", "description", "faults"}


@dataclass(frozen=True)
class Fault:
    action: str
    party: str
    phase: str
    rounds: tuple[int, ...] = ()

    def hits(self, round_: int) -> bool:
        return not self.rounds or round_ in self.rounds


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a threat model, queried by the engine at every delivery."""

    name: str = "none"
    faults: tuple[Fault, ...] = ()
    description: str = ""

    def find(self, action: str, party: str, round_: int, phase: str) -> Fault | None:
        for fault in self.faults:
            if (fault.action == action and fault.party == party and fault.phase == phase
                    and fault.hits(round_)):
                return fault
        return None

    def dropped(self, party: str, round_: int, phase: str, phases: tuple[str, ...]) -> bool:
        """True when ``party`` went offline at ``phase`` or an earlier phase of ``phases``."""
        if phase not in phases:
            return False
        here = phases.index(phase)
        return any(f.action == "drop" and f.party == party and f.hits(round_)
                   and f.phase in phases and phases.index(f.phase) <= here
                   for f in self.faults)

    def check_phases(self, phases: tuple[str, ...], parties: list[str]) -> None:
        """Every fault must name a phase of the protocol in use and, but for
        ``unknown_sender``, a real party."""
        for fault in self.faults:
            if fault.phase not in phases:
                raise ConfigError(f"threat model {self.name!r}: phase {fault.phase!r} is not a "
                                  f"phase of this protocol; its phases are {', '.join(phases)}")
            if fault.action != "unknown_sender" and fault.party not in parties:
                raise ConfigError(f"threat model {self.name!r}: party {fault.party!r} does not "
                                  f"exist; parties are {', '.join(parties)}")


def load_threat_model(name_or_path: str) -> FaultPlan:
    """A shipped model by name (``threat_models/NAME.toml``) or a user's by path."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"threat model file {name_or_path!r} does not exist")
        text, source = path.read_text(), str(path)
    else:
        resource = resources.files("secureffm.specs") / "threat_models" / f"{name_or_path}.toml"
        if not resource.is_file():
            shipped = sorted(p.name[:-5] for p in resource.parent.iterdir()
                             if p.name.endswith(".toml"))
            raise ConfigError(f"unknown threat model {name_or_path!r}; shipped: "
                              f"{', '.join(shipped) or 'none'}, or give a path to a .toml file")
        text, source = resource.read_text(), f"{name_or_path}.toml"
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"threat model {source} is not valid TOML: {err}") from None
    unknown = sorted(set(values) - _MODEL_KEYS)
    if unknown:
        raise ConfigError(f"threat model {source}: unknown key {unknown[0]!r}; allowed: "
                          f"{', '.join(sorted(_MODEL_KEYS))}")
    faults = []
    for index, table in enumerate(values.get("faults", [])):
        bad = sorted(set(table) - _FAULT_KEYS)
        if bad:
            raise ConfigError(f"threat model {source}: faults[{index}] has unknown key "
                              f"{bad[0]!r}; allowed: {', '.join(sorted(_FAULT_KEYS))}")
        missing = sorted({"action", "party", "phase"} - set(table))
        if missing:
            raise ConfigError(f"threat model {source}: faults[{index}] needs {missing[0]!r}")
        if table["action"] not in ACTIONS:
            raise ConfigError(f"threat model {source}: faults[{index}].action = "
                              f"{table['action']!r}; choose one of {', '.join(ACTIONS)}")
        faults.append(Fault(table["action"], table["party"], table["phase"],
                            tuple(int(r) for r in table.get("rounds", ()))))
    return FaultPlan(values.get("name", source), tuple(faults), values.get("description", ""))
