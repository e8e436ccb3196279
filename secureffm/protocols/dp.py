"""The ``dp`` stage: client-side DP-SGD (through Opacus) on every update of the kinds it
protects. It sends no messages of its own: it changes how a client computes its update, and the
privacy ledger accounts for every invocation. For kind ``model`` (DCFM's exchanged experts) the
model a client sends was trained with DP-SGD, so the model and everything computed from it is
post-processing of the DP mechanism.

Spec keys: ``protects`` (kinds), ``clip`` (per-example L2 bound C), ``delta``, and either
``target_epsilon`` (sigma is calibrated per client for the run's planned steps) or
``noise_multiplier`` (sigma fixed; with a target too, a run whose plan would pass it is
refused before its first round: :func:`secureffm.privacy.budget.refuse_overspending`),
``noise``, ``accountant`` (``rdp`` enforces the budget; PRV is always reported beside it),
``colluders``.

``noise = "local"``: each client adds the full Gaussian noise; its update is DP on its own.
``noise = "distributed"``: each client adds a share of integer Skellam noise inside secure
aggregation (every protected kind must also be protected by a ``secagg`` stage), sized so that
the sum carries the full noise whenever at least the secagg threshold of clients survive, of
which ``colluders`` (default 0) may be known to the server (or malicious); each client sizes
its share itself from its own spec and settings and refuses the server's other value;
accounted with the Skellam RDP bound (:mod:`secureffm.privacy.skellam`).
"""

from __future__ import annotations

from ..errors import ProtocolError
from ..privacy.settings import DPSettings
from .registry import check_protects, check_table
from .stage import StageDefaults

__all__ = ["DPStage", "SYBIL"]

_KEYS = {"stage", "protects", "clip", "delta", "target_epsilon", "noise_multiplier", "noise",
         "accountant", "colluders"}
NOISE = ("local", "distributed")
# What distributed noise assumes of the clients that count toward the threshold.
SYBIL = ("no Sybils: the clients counted toward the threshold are distinct parties the server "
         "does not control. A server that registers clients of its own (or learns their noise) "
         "reaches the threshold with fewer honest shares, and the sum then carries less noise "
         "than accounted; the clients cannot detect this")


class DPStage(StageDefaults):
    """Marks kinds whose updates clients compute with DP-SGD; see the module docstring."""

    name = "dp"
    role = "client"
    phases = ()
    can_protect = frozenset({"gradient", "dual_update", "update", "model"})
    def __init__(self, protects: tuple[str, ...], settings: DPSettings):
        self.protects = protects
        self.settings = settings

    @classmethod
    def from_table(cls, table: dict, source: str) -> DPStage:
        where = f"{source} (stage 'dp')"
        check_table(table, _KEYS, ("protects", "clip", "delta"), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "DP-SGD privatizes gradient-like updates, other "
                       "messages need their own mechanism")
        noise = table.get("noise", "local")
        if noise not in NOISE:
            raise ProtocolError(f"{source}: noise = {noise!r}; use 'local' (each client's update "
                                "is DP on its own) or 'distributed' (only the secure sum is)")
        colluders = table.get("colluders", 0)
        if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
            raise ProtocolError(f"{source}: colluders = {colluders!r}; give the number of "
                                "clients that may share their noise with the server (0 or more)")
        if noise == "distributed" and table.get("accountant", "rdp") != "rdp":
            raise ProtocolError(f"{source}: distributed (Skellam) noise is accounted with its RDP "
                                "bound; the PRV accountant does not cover it: use accountant = "
                                "'rdp'")
        if colluders and noise == "local":
            raise ProtocolError(f"{source}: colluders applies to distributed noise only; local "
                                "noise does not depend on other clients")
        settings = DPSettings(
            clip=_positive(table["clip"], "clip", source),
            delta=_positive(table["delta"], "delta", source),
            target_epsilon=_optional(table.get("target_epsilon"), "target_epsilon", source),
            noise_multiplier=_optional(table.get("noise_multiplier"), "noise_multiplier",
                                       source),
            accountant=table.get("accountant", "rdp"),
            noise=noise,
            colluders=colluders,
        )
        if settings.delta >= 1:
            raise ProtocolError(f"{source}: delta = {settings.delta}; it must be below 1 "
                                "(and well below 1/n for n examples per client)")
        if settings.accountant not in ("rdp", "prv"):
            raise ProtocolError(f"{source}: accountant = {settings.accountant!r}; use 'rdp' "
                                "or 'prv'")
        return cls(protects, settings)

    def validate_for(self, clients: int) -> None:
        """Local noise does not depend on the number of clients; distributed noise is checked
        against the secagg threshold by :class:`.Protocol`."""

    def claim(self, kind: str) -> tuple[str, str]:
        if self.settings.noise == "distributed":
            return ("DP-SGD with distributed Skellam noise: each client adds a share inside "
                    "secure aggregation; the sum is DP, a single update is not (distributed_"
                    "noise below)",
                    f"at least the secagg threshold of clients survive each round, at most "
                    f"{self.settings.colluders} of them reveal their noise to the server, and "
                    f"{SYBIL}")
        return ("DP-SGD with local Gaussian noise: each client's update is DP on its own",
                "none beyond the client's own code: it answers each (task, round) once, only in "
                "the rounds its own run config plans, and never past its own target, whatever "
                "the server asks")

    def exclusions(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        """Floating-point noise sampling and client-level DP, when it protects any of
        ``kinds``."""
        if not set(kinds) & set(self.protects):
            return ()
        sampler = ("the Skellam shares (numpy's floating-point Poisson sampler)"
                   if self.settings.noise == "distributed" else
                   "the Gaussian noise (torch's floating-point generator)")
        return (f"floating-point noise sampling: {sampler} is neither a discrete nor a secure "
                "sampler; attacks on its low-order bits (Mironov 2012) are not mitigated and "
                "no bound covers its tails",
                "client-level DP: the unit is one example of a client's shard; a client's "
                "whole shard (whether it takes part at all) is not protected, its updates may "
                "move by the per-example bound times its number of examples")


def _positive(value, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProtocolError(f"{source}: {key} = {value!r}; give a positive number")
    return float(value)


def _optional(value, key: str, source: str) -> float | None:
    return None if value is None else _positive(value, key, source)
