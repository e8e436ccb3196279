"""The adversary of a threat model (``threat_models/NAME.toml``, table ``[adversary]``): who
is adversarial and what a run must hide from it, read by the claim checks
(:mod:`secureffm.audit.claims`). The same file may also hold ``[[faults]]`` for the in-process
engine (:mod:`secureffm.federation.faults`).

Keys of ``[adversary]``:

- ``parties``: who is adversarial, any of ``server`` (the aggregator and relay: it handles
  every delivery), ``clients`` (``colluding_clients`` of the clients, any of them; together
  with the server when both are named), ``wire`` (an eavesdropper on every delivery's bytes),
  ``folder`` (a party with write access to the run folder: it reads ``payloads.bin`` and can
  rewrite the log, so the log's integrity needs a pin kept apart);
- ``colluding_clients``: how many clients collude (0 or more; at least 1 with ``clients``);
- ``behaviour``: ``honest-but-curious`` (follows the protocol, reads all it gets) or
  ``malicious`` (deviates; secure aggregation must then be its malicious-server variant);
- ``must_not_see``: message kinds that must not reach the adversary readable by it
  (default: ``gradient``, ``dual_update``, ``update``, ``model``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..federation.faults import load_threat_model
from ..specs import check_keys, read_spec_file

__all__ = ["Adversary", "load_adversary", "PARTIES", "BEHAVIOURS", "INDIVIDUAL_KINDS"]

PARTIES = ("server", "clients", "wire", "folder")
BEHAVIOURS = ("honest-but-curious", "malicious")
# What carries one client's data: its update, its dual update, its model (DCFM).
INDIVIDUAL_KINDS = ("gradient", "dual_update", "update", "model")
_KEYS = {"parties", "colluding_clients", "behaviour", "must_not_see"}


@dataclass(frozen=True)
class Adversary:
    """Who is adversarial (``parties``, a subset of :data:`PARTIES`), how many clients
    collude, whether it deviates, and the kinds it must not read."""

    name: str
    description: str
    parties: tuple[str, ...]
    colluding_clients: int = 0
    behaviour: str = "honest-but-curious"
    must_not_see: tuple[str, ...] = INDIVIDUAL_KINDS

    @property
    def malicious(self) -> bool:
        return self.behaviour == "malicious"

    def describe(self) -> str:
        """One line: who, how many colluders, how it behaves."""
        who = ", ".join(self.parties)
        colluders = f" with {self.colluding_clients} colluding client(s)" * bool(
            self.colluding_clients)
        return f"{who}{colluders}, {self.behaviour}; must not read: {', '.join(self.must_not_see)}"


def load_adversary(name_or_path: str) -> Adversary:
    """The ``[adversary]`` of a shipped threat model by name, or of a user's file by path.
    Raises ConfigError for a file without one (a fault plan only) or with a bad value."""
    load_threat_model(name_or_path)  # the whole file is valid, faults included
    values, source = read_spec_file("threat_models", name_or_path, "threat model", ConfigError)
    where = f"threat model {source}: [adversary]"
    table = values.get("adversary")
    if not isinstance(table, dict):
        raise ConfigError(f"threat model {source} has no [adversary] table, so it says nothing "
                          "the audit can hold a run to (it is a fault plan only); add one with "
                          f"parties = [...] (any of {', '.join(PARTIES)})")
    check_keys(table, _KEYS, ("parties",), where, ConfigError)
    parties = table["parties"]
    if (not isinstance(parties, list) or not parties
            or not all(isinstance(p, str) and p in PARTIES for p in parties)):
        raise ConfigError(f"{where}.parties = {parties!r}; give a non-empty list of "
                          f"{', '.join(PARTIES)}")
    colluders = table.get("colluding_clients", 0)
    if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
        raise ConfigError(f"{where}.colluding_clients = {colluders!r}; give a count >= 0")
    if "clients" in parties and colluders < 1:
        raise ConfigError(f"{where}: parties names clients but colluding_clients = "
                          f"{colluders}; give how many clients collude (1 or more)")
    behaviour = table.get("behaviour", BEHAVIOURS[0])
    if behaviour not in BEHAVIOURS:
        raise ConfigError(f"{where}.behaviour = {behaviour!r}; choose {' or '.join(BEHAVIOURS)}")
    kinds = table.get("must_not_see", list(INDIVIDUAL_KINDS))
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"{where}.must_not_see = {kinds!r}; give a list of message kinds "
                          f"such as {', '.join(INDIVIDUAL_KINDS)}")
    return Adversary(values.get("name", source), values.get("description", ""),
                     tuple(dict.fromkeys(parties)), colluders, behaviour, tuple(kinds))
