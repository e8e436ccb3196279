"""The ``secagg`` protocol stage: its spec table and the entry point of one aggregation, which
runs the variant its ``setup`` names (:mod:`.per_round` or :mod:`.keys_once`)."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import MessageError, ProtocolError
from ...federation.channel import Aggregate, Compute, Template
from ...federation.message import SERVER
from ...privacy.settings import DistributedNoise
from ..endpoint import ClientEndpoint
from ..key_batch import KeyBatch
from ..link import Link
from ..neighbourhood import TOLERANCE_KEYS, describe, tolerance_from_table
from ..quantize import Quantizer
from ..registry import check_protects, check_table
from ..stage import StageDefaults
from ..step import Handler
from ..wire import payload_bytes
from . import client, keys_once, per_round
from .common import KEY_BATCH
from .params import SecAggParams
from .rules import SecAggRules
from .session import ClientSession

__all__ = ["SecAggStage"]

_KEYS = {"stage", "protects", "threshold", "neighbours", "clip", "levels", "bits", "adversary",
         "setup", "key_batch"} | TOLERANCE_KEYS
ADVERSARIES = ("malicious", "semi-honest")  # the first of each is the default
SETUPS = ("per-round", "once")


def _one_of(table: dict, key: str, allowed: tuple[str, ...], source: str, advice: str) -> str:
    """``table[key]`` (default ``allowed[0]``), refused unless in ``allowed``, with ``advice``
    on each choice."""
    value = table.get(key, allowed[0])
    if value not in allowed:
        raise ProtocolError(f"{source}: {key} = {value!r}; use {advice}")
    return value


class SecAggStage(SecAggParams, StageDefaults):
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
        adversary = _one_of(table, "adversary", ADVERSARIES, source,
                            "'malicious' (keys signed, a consistency round: holds against a "
                            "server that deviates) or 'semi-honest' (faster; holds only "
                            "against a server that follows the protocol)")
        setup = _one_of(table, "setup", SETUPS, source,
                        "'per-round' (fresh keys and shares in every aggregation, Bonawitz et "
                        "al.) or 'once' (keys agreed once per kind, masks derived per round: "
                        "fewer messages for many rounds of small models; docs/protocols.md)")
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

    # -- what the stage says of itself: privacy.json, the audit, a snapshot ------------------

    input_phase = "masked_input"
    memory = ()  # a client's sessions travel with its endpoint (restore_session)
    carries_distributed_noise = True  # each client adds a share; only the sum carries it all
    joins_kinds = True  # one run of the phases for several kinds' concatenated inputs

    @property
    def client_actions(self) -> dict[str, Handler]:
        """Its clients' steps: those both variants share and its own variant's (a client under
        setup = "per-round" runs no step of setup = "once", and the reverse)."""
        variant = keys_once if self.setup == "once" else per_round
        return {**client.CLIENT_ACTIONS, **variant.CLIENT_ACTIONS}

    def claim(self, kind: str) -> tuple[str, str]:
        colluders = ("fewer than the threshold of a client's share holders collude with the "
                     "server")
        neighbourhood, sized_for = describe(self.neighbours, self.tolerance)
        colluders += f"; {sized_for}" if sized_for else ""
        if self.adversary == "malicious":
            trust = (f"{colluders}; against a malicious server (adversary = \"malicious\": "
                     "keys signed by pinned identities, a consistency round) a substituted key, "
                     "a split view or other parameters make the clients refuse, but it can drop "
                     "clients down to the threshold and abort any round (docs/protocols.md)")
        else:
            trust = (f"{colluders}; the server follows the protocol (adversary = "
                     "\"semi-honest\": no signed keys and no consistency round, so a server "
                     "that substitutes keys or tells clients different survivor sets can "
                     "unmask a client's input)")
        return (f"secure aggregation (threshold {self.threshold}, {neighbourhood}, adversary "
                f"= \"{self.adversary}\"): the server "
                "learns only the weighted sum of the survivors' updates; it adds no DP by itself",
                trust)

    def exclusions(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        """A malicious client's input, whatever the kinds: no range proofs."""
        return ("a malicious client's input: secure aggregation cannot check the range of "
                "a masked input (no range proofs), so one client can move each coordinate of "
                "the sum by up to about n x clip (the range n clients' clipped inputs are "
                "decoded from; under distributed noise any residue), not by one input's "
                "clip; DP bounds what the sum reveals of honest clients' examples, not this",)

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str]:
        """Nobody: a masked input is uniform to whoever holds fewer than the threshold of
        shares."""
        return frozenset(), "masked (secagg)"

    @staticmethod
    def audit_rules(signing_keys: Mapping[str, bytes]) -> SecAggRules:
        """Its key, view and signature rules over a log (:mod:`.rules`)."""
        return SecAggRules(signing_keys)

    def audit_parameters(self, clients: int, colluders: int, malicious: bool,
                         logged: list[dict], payload) -> tuple[list, list[str]]:
        """More shares than the colluders hold, more neighbours than colluders, a quantizer
        that holds the sum, the malicious-server variant against a malicious server; and
        whether the parameters the clients signed (``keys`` messages, payloads kept) equal
        these."""
        c, group = colluders, self.group_size(clients)
        needed = self.shares_needed(group)
        checks = [(needed - c >= 2, f"secagg threshold {self.threshold!r}: {needed} of {group} "
                                    f"shares rebuild a secret, so a sum the server unmasks "
                                    f"holds at least {needed} inputs, of which {needed - c} "
                                    f"are honest when {c} collude: 2 or more, or the colluders "
                                    "subtract theirs from the sum and hold one client's "
                                    "update")]
        if group < clients:
            checks.append((group - 1 > c, f"secagg neighbours {group - 1}: each client "
                                          f"masks with {group - 1}, more than the {c} "
                                          "colluder(s) (necessary, not sufficient)"))
        try:
            self.quantizer.check(clients)
            checks.append((True, f"quantizer (clip {self.quantizer.clip:g}, levels "
                                 f"{self.quantizer.levels}, {self.quantizer.bits} bits) holds "
                                 f"the sum of {clients} clients"))
        except ProtocolError as err:
            checks.append((False, f"quantizer: {err}"))
        if malicious:
            checks.append((self.adversary == "malicious",
                           f"secagg adversary = {self.adversary!r}: a malicious server needs "
                           "the malicious-server variant"))
        return checks, [self._signed_parameters(logged, payload)]

    def _signed_parameters(self, logged: list[dict], payload) -> str:
        """Whether the ``keys`` messages' parameters (signed by the clients in the consistency
        round, payloads kept) equal these, in words ('differs ...' when they do not)."""
        told = set()
        for r in logged:
            if r["phase"] == "keys" and r["sender"] == SERVER:
                data = payload(r)
                try:
                    fields = payload_bytes(data, SERVER) if data is not None else {}
                except MessageError:
                    fields = {}
                if "params" in fields:
                    told.add(fields["params"])
        if not told:
            return ("secagg parameters not confirmed by the log (semi-honest variant, or "
                    "payloads not kept)")
        if told == {self.parameters()}:
            return "secagg parameters equal those of every keys message the clients signed"
        return (f"differs: the log's keys messages carry parameters "
                f"{sorted(t.decode(errors='replace') for t in told)}, config.toml's protocol "
                f"{self.parameters().decode()}")

    # -- one aggregation ---------------------------------------------------------------------

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
