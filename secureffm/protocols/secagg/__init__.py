"""Secure aggregation (``stage = "secagg"``): the server learns only the sum of the updates of
the clients that survive a round, or, below the threshold, nothing. Two variants, by the
stage's ``setup``:

- ``per-round`` (:mod:`.per_round`): Bonawitz et al. (CCS 2017), fresh keys and shares in
  every aggregation, with the SecAgg+ neighbour graph of Bell et al. (CCS 2020);
- ``once`` (:mod:`.keys_once`): keys agreed once per kind, each round's masks derived from
  them (in the spirit of Flamingo, IEEE S&P 2023).

Each is semi-honest or, by default, holds against a malicious server (signed keys and a
consistency round). The parts: :mod:`.stage` (the spec table, the entry point),
:mod:`.params` (the parameters and what follows from them), :mod:`.common` (phases, the
neighbour graph, the survivor statement), :mod:`.server` and :mod:`.client` (what both
variants share on each side), :mod:`.session` (a client's session of one aggregation),
:mod:`.rules` (its rules over a log, for the audit).

Each clipped coordinate is counted; a client with any logs a ``clipped`` event with the count,
except under distributed noise (the count is of its update before its noise share). The round
then is exact over the survivors or aborts with a reason (``Aggregate.payload`` None). The clip
binds honest clients only: a client may send any masked words, and the server checks only that
the unmasked total lies in the quantizer's range (none under distributed noise), so one client
can weigh up to about n x clip per coordinate in the sum (half the modulus under distributed
noise); per-client range proofs would be needed to enforce the clip, and none are built.
"""

from .client import check_scale, epoch_session
from .common import EPOCH_PHASES, KEY_BATCH, MALICIOUS_PHASES, harary_neighbours, survivor_statement
from .keys_once import round_label, round_seed
from .stage import SecAggStage

__all__ = ["SecAggStage", "harary_neighbours", "survivor_statement", "EPOCH_PHASES",
           "MALICIOUS_PHASES", "KEY_BATCH", "check_scale", "epoch_session", "round_label",
           "round_seed"]
