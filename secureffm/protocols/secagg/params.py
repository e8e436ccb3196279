"""A secure-aggregation stage's parameters and what follows from them: its phases, the share
group and threshold, the equal weights and the distributed-noise geometry. Both sides use
them: the server to run a round, each client to check what the server asks against its own
spec. :class:`~.stage.SecAggStage` adds the spec parsing and the round itself."""

from __future__ import annotations

import json
import math

from ...errors import ProtocolError
from ...privacy.settings import DistributedNoise, NoiseGeometry
from ...privacy.skellam import grid_sensitivity
from ..neighbourhood import Tolerance, check_degree, degree_for
from ..quantize import Quantizer
from .common import (
    ADVERTISED,
    ADVERTISED_ONCE,
    EPOCH_MALICIOUS_PHASES,
    EPOCH_PHASES,
    KEY_BATCH,
    MALICIOUS_PHASES,
    PHASES,
)

__all__ = ["SecAggParams"]

# Headroom for distributed noise: the decoded sum must stay within half the modulus of the
# centre of its noiseless range for this many standard deviations of the total noise.
_NOISE_SIGMAS = 12.0
# Why a secure-aggregation stage (secagg, ckks) refuses unequal weights before a round.
EQUAL_WEIGHTS = ("secure aggregation needs equal weights: each client weighs its own input 1 "
                 "and refuses any other scale, so the server cannot weigh out all clients but "
                 "one. Give every client the same weight (weighting = 'uniform')")


class SecAggParams:
    """``protects``: the kinds aggregated. ``threshold``: shares needed to rebuild a secret, an
    integer or a fraction of |S(u)|. ``neighbours``: 0 masks with every other client
    (Bonawitz), k > 0 with k random neighbours (SecAgg+), None with as many as Bell et al.'s
    bound gives ``tolerance`` (the spec's ``corrupt`` and ``dropout`` fractions;
    :mod:`~secureffm.protocols.neighbourhood`). ``quantizer``: of each input x_u
    (clip, levels, bits). ``adversary``: "malicious" or "semi-honest". ``setup``: "per-round"
    or "once". ``key_batch`` (malicious variant, per-round set-up): rounds of keys a client
    signs at once (key_batch.py; 1 signs every round's).
    """

    def __init__(self, protects: tuple[str, ...], threshold: float, neighbours: int | None,
                 quantizer: Quantizer, adversary: str = "malicious", setup: str = "per-round",
                 key_batch: int = KEY_BATCH, tolerance: Tolerance | None = None):
        self.protects = protects
        self.threshold = threshold
        self.neighbours = neighbours
        self.quantizer = quantizer
        self.adversary = adversary
        self.setup = setup
        self.key_batch = key_batch
        self.tolerance = tolerance

    @property
    def phases(self) -> tuple[str, ...]:
        """This variant's phases, in round order."""
        if self.setup == "once":
            return EPOCH_MALICIOUS_PHASES if self.adversary == "malicious" else EPOCH_PHASES
        return MALICIOUS_PHASES if self.adversary == "malicious" else PHASES

    @property
    def advertised(self) -> tuple[str, ...]:
        """The fields a client advertises besides its signature (32 bytes each)."""
        return ADVERTISED_ONCE if self.setup == "once" else ADVERTISED

    def parameters(self) -> bytes:
        """Canonical bytes of the parameters every client must share (signed in the
        consistency round, so a server that tells clients different ones is caught)."""
        q = self.quantizer
        values = [self.threshold, self.neighbours, q.clip, q.levels, q.bits, self.adversary]
        if self.tolerance:
            t = self.tolerance
            values += [t.corrupt, t.dropout, t.security, t.correctness]
        return json.dumps(values + (["once"] if self.setup == "once" else [])).encode()

    def degree(self, clients: int) -> int:
        """k, the neighbours each of ``clients`` clients gets (0: all others)."""
        return degree_for(clients, self.neighbours, self.tolerance, self.shares_needed)

    def group_size(self, clients: int) -> int:
        """|S(u)|: a client's neighbours plus itself."""
        k = self.degree(clients)
        k += k % 2
        return clients if k <= 0 or k >= clients - 1 else k + 1

    def shares_needed(self, group: int) -> int:
        if isinstance(self.threshold, float):
            return max(2, math.ceil(self.threshold * group - 1e-9))
        return int(self.threshold)

    def validate_for(self, clients: int) -> None:
        group = self.group_size(clients)
        needed = self.shares_needed(group)
        if clients < 2:
            raise ProtocolError("secure aggregation needs at least 2 clients: the sum of one "
                                "update is the update")
        if 2 * needed <= group:
            raise ProtocolError(
                f"threshold = {self.threshold!r} needs only {needed} of {group} shares; it must "
                f"exceed half the share group ({group // 2 + 1} or more), or a server that tells "
                "two halves of the group different survivor lists collects both secrets of one "
                "client")
        if needed > group:
            raise ProtocolError(
                f"threshold = {self.threshold!r} needs {needed} shares but each client shares "
                f"among {group} parties ({clients} clients, neighbours = {self.neighbours}); "
                f"lower threshold to at most {group} or raise neighbours")
        check_degree(clients, self.neighbours, self.tolerance, self.shares_needed)
        self.quantizer.check(clients)

    @staticmethod
    def scales(weights: dict[str, float]) -> dict[str, float]:
        """w_u, the factor each client multiplies its input by: 1 for every client, the only
        one a client takes (:func:`~secureffm.protocols.secagg.client.check_scale`), so the
        server obtains the equally weighted sum. Unequal ``weights`` are refused
        (ProtocolError): a weight the server chose would let it weigh out all but one client
        and read that client's input as the "sum"."""
        if len(set(weights.values())) > 1:
            raise ProtocolError(EQUAL_WEIGHTS)
        return dict.fromkeys(weights, 1.0)

    def noise_geometry(self, weights: dict[str, float], sensitivity: dict[str, float],
                       size: int, colluders: int) -> NoiseGeometry:
        """Distributed-noise geometry for inputs of ``size`` coordinates whose L2 sensitivity
        is ``sensitivity[u]`` in the update's units; see :class:`NoiseGeometry`."""
        scale = self.scales(weights)
        honest = self.shares_needed(self.group_size(len(weights))) - colluders
        if honest < 1:
            raise ProtocolError(
                f"colluders = {colluders} leaves no honest client among the "
                f"{honest + colluders} whose inputs a round needs at least; distributed noise "
                "then protects nobody. Lower colluders or raise the secagg threshold")
        return NoiseGeometry({u: grid_sensitivity(sensitivity[u], scale[u], self.quantizer.step,
                                                  size) for u in weights}, honest)

    def share_variance(self, noise: DistributedNoise | None, weights: dict[str, float],
                       size: int, n: int) -> float:
        """Each client's Skellam noise variance in levels (0 without distributed noise),
        after checking that the weights are equal (:meth:`scales`) and that the noisy sum of
        all n clients cannot wrap the modulus. Each client derives the same value from its own
        spec and noise plan (:func:`~secureffm.protocols.secagg.client.client_input`); the
        server's is only what they check."""
        if noise is None:
            return 0.0
        geometry = self.noise_geometry(weights, noise.sensitivity, size, noise.colluders)
        variance = geometry.share_variance(noise.multiplier)
        centre = n * (self.quantizer.levels - 1) / 2
        if centre + _NOISE_SIGMAS * math.sqrt(n * variance) >= self.quantizer.modulus / 2:
            raise ProtocolError(
                f"bits = {self.quantizer.bits} leaves no room for distributed noise of std "
                f"{math.sqrt(variance):.3g} levels per client on {n} clients; raise bits or "
                "lower levels in the secagg stage")
        return variance
