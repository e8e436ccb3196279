"""The privacy ledger: every DP mechanism each client ran, and the epsilon it has spent."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, replace

from .accounting import Schedule, epsilon
from .settings import DPSettings
from .skellam import SkellamStep, skellam_epsilon

__all__ = ["LedgerEntry", "PrivacyLedger", "CHARGED", "charged_fields", "charged_entries"]

# The log event in which the server records what the ledger charged for one aggregation.
CHARGED = "charged"


@dataclass(frozen=True)
class LedgerEntry:
    """One run of a subsampled DP mechanism on one client's data.

    ``sample_rate``: Poisson rate q; ``clip``: per-example L2 bound C; ``steps``: consecutive
    identical invocations. ``mechanism``: ``gaussian`` (local noise; ``noise_multiplier`` is
    sigma, noise std = sigma * clip) or ``skellam`` (distributed noise; ``noise_multiplier`` is
    tau, and ``l2``, ``l1``, ``variance`` give the client's sensitivities and the sum's noise
    variance in quantization levels, at the fewest honest survivors).
    """

    client: str
    kind: str
    round: int
    sample_rate: float
    noise_multiplier: float
    clip: float
    steps: int = 1
    mechanism: str = "gaussian"
    l2: float = 0.0
    l1: float = 0.0
    variance: float = 0.0


class PrivacyLedger:
    """Appends entries and answers epsilon per client and per message kind."""

    def __init__(self, delta: float):
        self.delta = delta
        self.entries: list[LedgerEntry] = []
        self._schedules: dict[str, dict[str, Schedule]] = defaultdict(lambda: defaultdict(list))
        self._skellam: dict[str, dict[str, list[SkellamStep]]] = defaultdict(
            lambda: defaultdict(list))

    def record(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)
        if entry.mechanism == "skellam":
            steps = self._skellam[entry.client][entry.kind]
            key = (entry.sample_rate, entry.l2, entry.l1, entry.variance)
            if steps and (steps[-1].q, steps[-1].l2, steps[-1].l1, steps[-1].variance) == key:
                steps[-1] = replace(steps[-1], steps=steps[-1].steps + entry.steps)
            else:
                steps.append(SkellamStep(*key, entry.steps))
            return
        schedule = self._schedules[entry.client][entry.kind]
        step = (entry.noise_multiplier, entry.sample_rate)
        if schedule and schedule[-1][:2] == step:
            schedule[-1] = (*step, schedule[-1][2] + entry.steps)
        else:
            schedule.append((*step, entry.steps))

    def history(self, client: str) -> PrivacyLedger:
        """A new ledger holding ``client``'s composed steps (not its entries), to compose a
        plan with cheaply however long the history."""
        copy = PrivacyLedger(self.delta)
        copy._schedules[client].update({k: list(v) for k, v in self._schedules[client].items()})
        copy._skellam[client].update({k: list(v) for k, v in self._skellam[client].items()})
        return copy

    def schedule(self, client: str, kinds: tuple[str, ...] | None = None) -> Schedule:
        """The client's composed history, restricted to ``kinds`` when given."""
        by_kind = self._schedules[client]
        return [step for kind, steps in by_kind.items()
                if kinds is None or kind in kinds for step in steps]

    def skellam_schedule(self, client: str, kinds: tuple[str, ...] | None = None
                         ) -> list[SkellamStep]:
        return [step for kind, steps in self._skellam[client].items()
                if kinds is None or kind in kinds for step in steps]

    def epsilon(self, client: str, accountant: str = "rdp",
                kinds: tuple[str, ...] | None = None) -> float:
        skellam = self.skellam_schedule(client, kinds)
        if not skellam:
            return epsilon(self.schedule(client, kinds), self.delta, accountant)
        if accountant != "rdp":
            raise ValueError("the PRV accountant does not cover the Skellam mechanism "
                             "(distributed noise); its epsilon comes from the RDP bound")
        return skellam_epsilon(skellam, self.delta, self.schedule(client, kinds))

    def _kinds(self, client: str) -> list[str]:
        return sorted(set(self._schedules[client]) | set(self._skellam[client]))

    def clients(self) -> list[str]:
        return sorted(set(self._schedules) | set(self._skellam))

    def report(self, target: float | None, accountant: str = "rdp") -> dict:
        """epsilon per client, overall and per kind, from the RDP and the PRV accountant (PRV
        None with the reason where it fails); ``target_held`` tests ``accountant``'s total, the
        one that calibrated the noise and enforces the target."""
        clients = {}
        for client in self.clients():
            kinds = self._kinds(client)
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
            row["schedule"] = {k: [list(s) for s in self._schedules[client][k]]
                               for k in kinds if k in self._schedules[client]}
            if self._skellam[client]:
                row["skellam_schedule"] = {k: [asdict(s) for s in self._skellam[client][k]]
                                           for k in kinds if k in self._skellam[client]}
            spent = row[accountant]["total"]
            row["target_held"] = None if target is None or spent is None else spent <= target
            clients[client] = row
        return {"delta": self.delta, "target_epsilon": target, "enforced_by": accountant,
                "clients": clients}

    def state_dict(self) -> dict:
        return {"delta": self.delta, "entries": [asdict(e) for e in self.entries]}


def charged_fields(kind: str, entries: list[LedgerEntry], settings: DPSettings) -> dict:
    """The structured fields of a ``charged`` log event: the ``entries`` of one aggregation of
    ``kind`` (client -> the mechanism it ran: rate q, multiplier, clip, steps, and the Skellam
    sensitivities and variance in quantization levels) and what accounting needs besides
    (``delta``, ``accountant``, ``target_epsilon``; ``noise`` and ``colluders``: how the noise
    is split). An audit rebuilds the entries with :func:`charged_entries`."""
    skip = {"client", "kind", "round"}
    return {"of_kind": kind, "delta": settings.delta, "accountant": settings.accountant,
            "target_epsilon": settings.target_epsilon, "noise": settings.noise,
            "colluders": settings.colluders,
            "charged": {e.client: {k: v for k, v in asdict(e).items() if k not in skip}
                        for e in entries}}


def charged_entries(record: dict) -> list[LedgerEntry]:
    """The ledger entries a ``charged`` log record states (see :func:`charged_fields`).
    Raises KeyError or TypeError on a record without them."""
    return [LedgerEntry(client, record["of_kind"], record["round"], **fields)
            for client, fields in record["charged"].items()]
