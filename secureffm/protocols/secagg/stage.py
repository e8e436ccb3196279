"""The ``secagg`` protocol stage: its spec table and the entry point of one aggregation, which
runs the variant its ``setup`` names (:mod:`.per_round` or :mod:`.keys_once`)."""

from __future__ import annotations

from ...errors import ProtocolError
from ...federation.channel import Aggregate, Compute, Template
from ...privacy.settings import DistributedNoise
from ..endpoint import ClientEndpoint
from ..key_batch import KeyBatch
from ..link import Link
from ..neighbourhood import TOLERANCE_KEYS, tolerance_from_table
from ..quantize import Quantizer
from ..registry import check_protects, check_table
from . import keys_once, per_round
from .common import KEY_BATCH
from .params import SecAggParams
from .session import ClientSession

__all__ = ["SecAggStage"]

_KEYS = {"stage", "protects", "threshold", "neighbours", "clip", "levels", "bits", "adversary",
         "setup", "key_batch"} | TOLERANCE_KEYS
ADVERSARIES = ("malicious", "semi-honest")
SETUPS = ("per-round", "once")


class SecAggStage(SecAggParams):
    """Pairwise-mask secure aggregation with dropout recovery (the package docstring; its
    parameters: :class:`~.params.SecAggParams`). In a spec: ``threshold``, ``neighbours``,
    ``clip``, ``levels`` and ``bits`` (the quantizer of each input x_u), ``adversary``,
    ``setup``, ``key_batch``, and ``corrupt``, ``dropout``, ``security``, ``correctness`` (the
    neighbourhood's tolerance, :mod:`~secureffm.protocols.neighbourhood`).
    """

    name = "secagg"
    role = "aggregate"
    can_protect = frozenset({"gradient", "dual_update", "update", "scalar"})

    @classmethod
    def from_table(cls, table: dict, source: str) -> SecAggStage:
        where = f"{source} (stage 'secagg')"
        check_table(table, _KEYS, ("protects", "threshold"), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "it reveals only a sum, and such messages are "
                       "needed one by one")
        threshold = table["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or (
                isinstance(threshold, float) and not 0.5 < threshold <= 1) or (
                isinstance(threshold, int) and threshold < 2):
            raise ProtocolError(f"{source}: threshold = {threshold!r}; give an integer >= 2 "
                                "(shares needed) or a fraction in (0.5, 1] of each share group: "
                                "at half or below, a server that tells two halves of the group "
                                "different survivor lists collects both secrets of a client")
        neighbours = table.get("neighbours", None if TOLERANCE_KEYS & set(table) else 0)
        if neighbours is not None and (not isinstance(neighbours, int) or neighbours < 0):
            raise ProtocolError(f"{source}: neighbours = {neighbours!r}; give 0 (all clients) "
                                "or a positive number of neighbours (SecAgg+; odd is rounded up)")
        try:
            quantizer = Quantizer(float(table.get("clip", 8.0)), int(table.get("levels", 2**22)),
                                  int(table.get("bits", 32)))
        except ProtocolError as err:
            raise ProtocolError(f"{source}: {err}") from None
        adversary = table.get("adversary", "malicious")
        if adversary not in ADVERSARIES:
            raise ProtocolError(f"{source}: adversary = {adversary!r}; use 'malicious' (keys "
                                "signed, a consistency round: holds against a server that "
                                "deviates) or 'semi-honest' (faster; holds only against a server "
                                "that follows the protocol)")
        setup = table.get("setup", "per-round")
        if setup not in SETUPS:
            raise ProtocolError(f"{source}: setup = {setup!r}; use 'per-round' (fresh keys and "
                                "shares in every aggregation, Bonawitz et al.) or 'once' (keys "
                                "agreed once per kind, masks derived per round: fewer messages "
                                "for many rounds of small models; docs/protocols.md)")
        key_batch = table.get("key_batch", KEY_BATCH)
        if "key_batch" in table and (adversary, setup) != ("malicious", "per-round"):
            raise ProtocolError(f"{source}: key_batch applies only to keys signed every round "
                                "(adversary = 'malicious', setup = 'per-round'); remove it")
        if isinstance(key_batch, bool) or not isinstance(key_batch, int) or not (
                1 <= key_batch <= 1024 and key_batch & (key_batch - 1) == 0):
            raise ProtocolError(f"{source}: key_batch = {key_batch!r}; give a power of two from "
                                "1 (every round's keys signed on their own) to 1024 (rounds "
                                "of keys a client signs at once)")
        tolerance = tolerance_from_table(table, adversary == "malicious", where)
        return cls(protects, threshold, neighbours, quantizer, adversary, setup, key_batch,
                   tolerance)

    def aggregate(self, link: Link, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None) -> Aggregate:
        """One aggregation over ``link``'s clients. ``noise``: each client's share of
        distributed DP noise, or None."""
        self.scales(weights)  # unequal weights are refused before the round
        variant = keys_once if self.setup == "once" else per_round
        return variant.aggregate(self, link, compute, weights, template, noise)

    def restore_session(self, endpoint: ClientEndpoint, tag: str, table: dict
                        ) -> ClientSession | KeyBatch:
        """A client's saved state of this, its own stage (its ``to_json()``): a session
        (``ClientSession.tag``) or its batch of signed keys (``KeyBatch.tag``); KeyError for
        another ``tag``."""
        if tag == KeyBatch.tag:
            return KeyBatch.from_json(table)
        if tag != ClientSession.tag:
            raise KeyError(tag)
        return ClientSession.from_json(endpoint.client, endpoint.registry, self, table)
