"""The privacy ledger: every DP mechanism each client ran, and the epsilon it has spent."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from .accounting import Schedule, epsilon

__all__ = ["LedgerEntry", "PrivacyLedger"]


@dataclass(frozen=True)
class LedgerEntry:
    """One run of the subsampled Gaussian mechanism on one client's data.

    ``sample_rate``: Poisson rate q; ``noise_multiplier``: sigma (noise std = sigma * clip);
    ``clip``: per-example L2 bound C; ``steps``: consecutive identical invocations.
    """

    client: str
    kind: str
    round: int
    sample_rate: float
    noise_multiplier: float
    clip: float
    steps: int = 1


class PrivacyLedger:
    """Appends entries and answers epsilon per client and per message kind."""

    def __init__(self, delta: float):
        self.delta = delta
        self.entries: list[LedgerEntry] = []
        self._schedules: dict[str, dict[str, Schedule]] = defaultdict(lambda: defaultdict(list))

    def record(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)
        schedule = self._schedules[entry.client][entry.kind]
        step = (entry.noise_multiplier, entry.sample_rate)
        if schedule and schedule[-1][:2] == step:
            schedule[-1] = (*step, schedule[-1][2] + entry.steps)
        else:
            schedule.append((*step, entry.steps))

    def schedule(self, client: str, kinds: tuple[str, ...] | None = None) -> Schedule:
        """The client's composed history, restricted to ``kinds`` when given."""
        by_kind = self._schedules[client]
        return [step for kind, steps in by_kind.items()
                if kinds is None or kind in kinds for step in steps]

    def epsilon(self, client: str, accountant: str = "rdp",
                kinds: tuple[str, ...] | None = None) -> float:
        return epsilon(self.schedule(client, kinds), self.delta, accountant)

    def clients(self) -> list[str]:
        return sorted(self._schedules)

    def report(self, target: float | None) -> dict:
        """epsilon per client, overall and per kind, from the RDP accountant (which enforces
        the target) and the PRV accountant (reported; None with the reason where it fails)."""
        clients = {}
        for client in self.clients():
            kinds = sorted(self._schedules[client])
            row = {"rdp": {"total": self.epsilon(client, "rdp"),
                           "by_kind": {k: self.epsilon(client, "rdp", (k,)) for k in kinds}}}
            try:
                row["prv"] = {"total": self.epsilon(client, "prv"),
                              "by_kind": {k: self.epsilon(client, "prv", (k,)) for k in kinds}}
            except (MemoryError, ValueError, OverflowError) as err:
                # PRV discretizes the privacy loss; at very small noise its grid explodes.
                row["prv"] = {"total": None, "by_kind": {},
                              "error": f"PRV accountant could not evaluate this schedule: "
                                       f"{type(err).__name__}: {err}"}
            row["schedule"] = {k: [list(s) for s in self._schedules[client][k]] for k in kinds}
            row["target_held"] = None if target is None else row["rdp"]["total"] <= target
            clients[client] = row
        return {"delta": self.delta, "target_epsilon": target, "clients": clients}

    def state_dict(self) -> dict:
        return {"delta": self.delta, "entries": [asdict(e) for e in self.entries]}
