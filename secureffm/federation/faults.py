"""Fault injection for the in-process engine, read from ``threat_models/*.toml``.

A threat model lists faults; each names an ``action``, the ``party`` it hits (a client, or
``server`` for the server's own deliveries), the ``phase`` of the protocol at which it hits,
optionally the ``recipient`` whose delivery it hits (every recipient when omitted) and the
``rounds`` (every round when omitted):

- ``drop``: the client goes offline at that phase and sends nothing more that round (never the
  server, and never for one recipient: lose a delivery instead).
- ``lose``: its message at that phase is lost in transit; it stays online. Under secagg a lost
  ``shares`` delivery makes its recipient drop out before masking.
- ``corrupt``: its message at that phase is altered in transit (one byte flipped).
- ``replay``: its message at that phase is delivered a second time.
- ``delay``: its message at that phase arrives after the phase closed.
- ``unknown_sender``: a message claiming to be from ``party`` (a name no one registered) arrives
  at the server at that phase, a copy of a real message's bytes.

Deviations of a malicious server (``party = "server"``, each at its one phase, to
``recipient`` or every client), played by the protocol layer (secureffm/protocols/adversary.py),
not by the transport: ``substitute_keys`` (``keys``), ``split_view`` (``consistency``),
``invent_survivor`` and ``ask_twice`` (``unmask_request``), ``split_broadcast`` (``broadcast``).

Corrupted, replayed, delayed and forged messages are rejected on receipt by their recipient
and logged; a lost one leaves only its sender's record.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..specs import check_keys, read_spec_file
from .message import SERVER

__all__ = ["Fault", "FaultPlan", "load_threat_model", "ACTIONS", "SERVER_DEVIATIONS"]

# A malicious server's deviations: action -> the phase at which it plays.
SERVER_DEVIATIONS = {"substitute_keys": "keys", "split_view": "consistency",
                     "invent_survivor": "unmask_request", "ask_twice": "unmask_request",
                     "split_broadcast": "broadcast"}
ACTIONS = ("drop", "lose", "corrupt", "replay", "delay", "unknown_sender",
           *SERVER_DEVIATIONS)
_FAULT_KEYS = {"action", "party", "phase", "recipient", "rounds"}
# ``adversary``: what the audit holds the run to (secureffm/audit/threat.py); not the engine's.
_MODEL_KEYS = {"name", "description", "faults", "adversary"}


@dataclass(frozen=True)
class Fault:
    """One fault; ``recipient`` "" hits every recipient, ``rounds`` () every round."""

    action: str
    party: str
    phase: str
    rounds: tuple[int, ...] = ()
    recipient: str = ""

    def hits(self, round_: int) -> bool:
        return not self.rounds or round_ in self.rounds


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a threat model, queried by the engine at every delivery."""

    name: str = "none"
    faults: tuple[Fault, ...] = ()
    description: str = ""

    def find(self, action: str, party: str, round_: int, phase: str,
             recipient: str = "") -> Fault | None:
        """The fault ``action`` on ``party``'s message to ``recipient`` at ``phase``, if any."""
        for fault in self.faults:
            if (fault.action == action and fault.party == party and fault.phase == phase
                    and fault.hits(round_) and fault.recipient in ("", recipient)):
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
        """Every fault must name a phase of the protocol in use and a real party (a client
        or the server; for ``unknown_sender``, a name no one registered), and a recipient
        only where one makes sense."""
        known = [SERVER, *parties]
        for fault in self.faults:
            where = f"threat model {self.name!r}: {fault.action} fault on {fault.party!r}"
            if fault.phase not in phases:
                raise ConfigError(f"{where}: phase {fault.phase!r} is not a phase of this "
                                  f"protocol; its phases are {', '.join(phases)}")
            if fault.action == "unknown_sender":
                if fault.party in known:
                    raise ConfigError(f"{where}: {fault.party!r} is registered; name a party "
                                      "that is not, such as 'mallory'")
            elif fault.party not in known:
                raise ConfigError(f"{where}: party {fault.party!r} does not exist; parties "
                                  f"are {', '.join(known)}")
            deviation = SERVER_DEVIATIONS.get(fault.action)
            if deviation and (fault.party != SERVER or fault.phase != deviation):
                raise ConfigError(f"{where}: {fault.action} is the server's deviation at phase "
                                  f"{deviation!r}; give party = 'server', phase = "
                                  f"{deviation!r}")
            if fault.action == "drop" and fault.party == SERVER:
                raise ConfigError(f"{where}: the server cannot go offline; use action "
                                  "'lose' to lose one of its deliveries")
            if fault.recipient and (fault.action in ("drop", "unknown_sender")
                                    or fault.recipient not in known
                                    or fault.recipient == fault.party):
                raise ConfigError(f"{where}: recipient {fault.recipient!r} is not possible; "
                                  "give another party for lose, corrupt, replay or delay, and "
                                  "none for drop or unknown_sender")


def load_threat_model(name_or_path: str) -> FaultPlan:
    """A shipped model by name (``threat_models/NAME.toml``) or a user's by path."""
    values, source = read_spec_file("threat_models", name_or_path, "threat model", ConfigError)
    check_keys(values, _MODEL_KEYS, (), f"threat model {source}", ConfigError)
    tables = values.get("faults", [])
    if not isinstance(tables, list):
        raise ConfigError(f"threat model {source}: faults must be a list of [[faults]] tables")
    faults = [_fault(table, f"threat model {source}: faults[{index}]")
              for index, table in enumerate(tables)]
    return FaultPlan(values.get("name", source), tuple(faults), values.get("description", ""))


def _fault(table, where: str) -> Fault:
    """One ``[[faults]]`` table, its keys and value types checked."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} is not a table")
    check_keys(table, _FAULT_KEYS, ("action", "party", "phase"), where, ConfigError)
    for key in ("action", "party", "phase", "recipient"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where}.{key} = {table[key]!r}; give a string")
    if table["action"] not in ACTIONS:
        raise ConfigError(f"{where}.action = {table['action']!r}; choose one of "
                          f"{', '.join(ACTIONS)}")
    rounds = table.get("rounds", [])
    if not isinstance(rounds, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rounds):
        raise ConfigError(f"{where}.rounds = {rounds!r}; give a list of round numbers (>= 0)")
    return Fault(table["action"], table["party"], table["phase"], tuple(rounds),
                 table.get("recipient", ""))
