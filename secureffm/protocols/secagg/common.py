"""What both secure-aggregation variants, and both sides of each, share: the phases, the
fields a client advertises, the neighbour graph, the survivor statement and the labels that
bind keys and sealed shares to their use."""

from __future__ import annotations

import hashlib
import json
import random

from ..shamir import SHARE_BYTES

__all__ = ["PHASES", "EPOCH_PHASES", "MALICIOUS_PHASES", "EPOCH_MALICIOUS_PHASES", "KEY_BATCH",
           "ADVERTISED", "ADVERTISED_ONCE", "MASK_LABEL", "CHANNEL_LABEL", "SEALED_BYTES",
           "Confirmation", "harary_neighbours", "survivor_statement", "share_context"]

PHASES = ("advertise_keys", "keys", "share_keys", "shares", "masked_input", "unmask_request",
          "unmask")
# setup = "once" (keys_once.py): keys in the first aggregation of a kind (advertise_keys,
# keys, keys_taken), then per round an unsigned mask request, masked inputs that carry the
# round's seed shares, and unmasking.
EPOCH_PHASES = ("advertise_keys", "keys", "keys_taken", "mask_request", "masked_input",
                "unmask_request", "unmask")
# The malicious-server variant adds a consistency round between masked inputs and unmasking,
# under either set-up.
MALICIOUS_PHASES = ("advertise_keys", "keys", "share_keys", "shares", "masked_input",
                    "consistency", "consistency_sign", "unmask_request", "unmask")
EPOCH_MALICIOUS_PHASES = EPOCH_PHASES[:5] + MALICIOUS_PHASES[5:]
# Rounds of keys a client signs at once under the malicious variant (key_batch.py): each
# neighbour verifies one signature per client per 32 rounds instead of one per round.
KEY_BATCH = 32
ADVERTISED = ("b_commit", "c_pk", "s_pk")  # 32 bytes each
# Under setup = "once" a client advertises no self-mask commitment: it draws a fresh seed per
# round and commits to it with its masked input (keys_once.py).
ADVERTISED_ONCE = ("c_pk", "s_pk")
# HKDF labels of a pair's X25519 secrets: its pairwise mask seed and its shares' channel key.
MASK_LABEL, CHANNEL_LABEL = b"mask-seed", b"share-channel"
SEALED_BYTES = 12 + 2 * SHARE_BYTES + 16  # per-round: nonce, the two shares, GCM tag
# A client's confirmation of what it saw (malicious variant): its Ed25519 signature of the
# statement, which its peers check before they answer and the audit checks again.
Confirmation = bytes
_SURVIVOR_STATEMENT = b"secureffm/secagg/survivors/v1"


def harary_neighbours(ids: list[str], k: int, rng: random.Random) -> dict[str, set[str]]:
    """A random k-regular graph (Bell et al.): a Harary graph H(n, k) on a random cyclic order.

    k is rounded up to even; k >= n - 1 gives the complete graph.
    """
    n = len(ids)
    if k <= 0 or k >= n - 1:
        return {u: set(ids) - {u} for u in ids}
    half = (k + 1) // 2
    order = ids[:]
    rng.shuffle(order)
    graph = {u: set() for u in ids}
    for i, u in enumerate(order):
        for step in range(1, half + 1):
            v = order[(i + step) % n]
            graph[u].add(v)
            graph[v].add(u)
    return graph


def survivor_statement(round_: int, kind: str, survivors: list[str], parameters: bytes,
                       graph: bytes, broadcasts: bytes) -> bytes:
    """What a survivor signs in the consistency round (and what the audit re-checks): the
    survivor set it was told, bound to the digest of what it saw this round: the stage's
    ``parameters`` (:meth:`~.params.SecAggParams.parameters`), the ``graph`` it was announced
    (sha256 of seed and U1) and the ``broadcasts`` it accepted (:func:`~secureffm.protocols.
    link.broadcast_digest`)."""
    seen = hashlib.sha256(parameters + graph + broadcasts).digest()
    return (_SURVIVOR_STATEMENT + json.dumps([round_, kind, sorted(survivors)]).encode()
            + seen)


def share_context(round_: int, kind: str, author: str, recipient: str) -> bytes:
    """Associated data binding a sealed share to its round, kind and pair."""
    return f"{round_}|{kind}|{author}|{recipient}".encode()
