"""Who sets a client's weight in the sum under secure aggregation (issue 37).

The adversary is the server party of a real federation (real stage, crypto and signed log) that
replaces its copy of the stage's ``scales``: the factor it sends each client to multiply its
input by. Each client holds its own copy of the pinned protocol, as a remote client does.
"""

from __future__ import annotations

import numpy as np
import pytest

from secureffm.errors import ProtocolError

from .test_distributed_noise_server import KIND, SIZE, N, aggregate
from .test_malicious_client import ids

VICTIM = "client-1"
PHASE = {"secagg": "masked_input", "secagg-plus": "masked_input", "secagg-once": "masked_input",
         "he": "upload"}


def isolate(victim_scale: float):
    """The server's ``scales``: ``victim_scale`` for the victim, 0 for every other client."""
    return {"scales": lambda weights: {u: victim_scale if u == VICTIM else 0.0
                                       for u in weights}}


def values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {cid: rng.uniform(-1, 1, SIZE).astype(np.float32) for cid in ids(N)}


def refusals(events: list[dict], cid: str, phase: str) -> list[str]:
    """The details of ``cid``'s signed refusals of the server's request at ``phase``."""
    return [e["detail"] for e in events if e["event"] == "rejected" and e["sender"] == cid
            and e["party"] == "server" and e["phase"] == phase]


@pytest.mark.parametrize("protocol", ["secagg", "secagg-once", "secagg-plus", "he"])
def test_a_server_that_weighs_out_all_but_one_client_is_refused_by_every_client(tmp_path,
                                                                                protocol):
    """Adversary: the server (malicious-server variant, the shipped default; for ``he``, a
    server that deviates) sends scale 0 to every client but client-1 and 5 to client-1, so
    the unmasked (decrypted) "weighted sum" is client-1's update alone. Before the fix every
    client multiplied its input by the server's scale unchecked: under secagg the server read
    client-1's update to within a few quantization steps, with no event, and the log verified.
    Now each client weighs its own input 1, refuses any other scale by name in a signed
    ``rejected`` event, and the round aborts with its closing record."""
    updates = values()
    result, events = aggregate(tmp_path, protocol,
                               updates, server_stage=isolate(5.0))
    if result.payload is not None:
        error = float(np.abs(result.payload[KIND] - updates[VICTIM]).max())
        pytest.fail(f"the attack succeeded: the server read {VICTIM}'s update to {error:.2g}")
    for cid in ids(N):
        assert any("scale = " in d and "takes no scale but 1" in d
                   for d in refusals(events, cid, PHASE[protocol])), (cid, events)
    assert [e["event"] for e in events[-2:]] == ["aborted", "closed"]


@pytest.mark.parametrize("protocol", ["secagg", "secagg-once"])
def test_a_server_that_weighs_the_others_zero_gets_too_few_inputs(tmp_path, protocol):
    """Adversary: the same server sends client-1 the honest scale 1 and every other client
    0. Client-1 masks its input; every other client refuses by name, so fewer than the
    threshold of inputs arrive and the round aborts: the server never unmasks client-1's
    input alone."""
    result, events = aggregate(tmp_path, protocol,
                               values(), server_stage=isolate(1.0))
    assert result.payload is None and "masked inputs arrived" in result.reason
    assert not refusals(events, VICTIM, "masked_input")
    for cid in ids(N)[1:]:
        assert any("scale = 0.0" in d for d in refusals(events, cid, "masked_input")), cid


@pytest.mark.parametrize("protocol", ["secagg", "secagg-once", "he"])
def test_unequal_weights_are_refused_before_the_round(tmp_path, protocol):
    """Clients take no scale but 1 under secure aggregation, so the server refuses weights
    that would need one, before any message, with what to change."""
    weights = {cid: 1.0 + i for i, cid in enumerate(ids(N))}
    with pytest.raises(ProtocolError, match="equal weights.*weighting = 'uniform'"):
        aggregate(tmp_path, protocol, values(),
                  weights=weights)

