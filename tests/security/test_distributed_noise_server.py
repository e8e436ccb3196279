"""Who sets a client's noise and weight in secure aggregation (issue 37, items 4 and 6).

Item 4: under ``dp-secagg-distributed`` a malicious server sends each client the Skellam share
variance and the scale it multiplies its update by. The adversary here is the server party of a
real federation (real stage, crypto and signed log) that runs its own copy of the stage with
parameters of its choosing; each client holds its own copy of the pinned protocol (as a remote
client does) and its own noise plan (tau and sensitivity from its own settings).

Item 6: a malicious client's weight in the sum. The adversary is a client that adds levels to
its own masked words before signing them; what it can add is bounded only by the range check
of the unmasked total, not by the clip.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from secureffm.audit.verify import verify_run
from secureffm.errors import ProtocolError
from secureffm.federation import Aggregate, Client, MessageLog, deserialize_payload
from secureffm.federation.message import serialize_payload
from secureffm.privacy.settings import DistributedNoise
from secureffm.protocols import load_protocol
from secureffm.runs.scaffold import open_channel

from .test_malicious_client import corrupt, ids

KIND, N, SIZE = "gradient", 5, 400
NOISE = DistributedNoise(1.0, {cid: 1e-3 for cid in ids(N)})  # tau 1, L2 sensitivity 1e-3
DISTRIBUTED = "dp-secagg-distributed"


def distributed_once(tmp_path: Path) -> str:
    """dp-secagg-distributed with keys agreed once per kind (secagg/keys_once.py)."""
    text = (Path(__file__).parents[2] / "protocols" / f"{DISTRIBUTED}.toml").read_text()
    path = tmp_path / "distributed-once.toml"
    path.write_text(text.replace('adversary = "malicious"',
                                 'adversary = "malicious"\nsetup = "once"'))
    return str(path)


def aggregate(tmp_path: Path, protocol: str, values: dict[str, np.ndarray],
              noise: DistributedNoise | None = None, server_stage: dict | None = None,
              client_tamper: dict | None = None, weights: dict[str, float] | None = None
              ) -> tuple[Aggregate, list[dict]]:
    """One aggregation of ``values`` (client id -> [SIZE]) over ``protocol``; every client
    holds its own copy of the protocol and, under distributed noise, its own ``noise`` plan.
    ``server_stage``: attributes of the server's copy of the stage that the server replaces
    (its choice of share variance or scales); ``client_tamper``: client id -> {phase: change}
    (see :func:`corrupt`). Checks that the log verifies with its closing record."""
    clients = [Client(cid, torch.zeros(1, 2), torch.Generator()) for cid in values]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol(protocol), clients, log)
    for endpoint in channel.endpoints.values():
        endpoint.protocol = load_protocol(protocol)  # the client's own pinned copy
        endpoint.noise = lambda *_: noise  # its own tau and sensitivity
    for name, value in (server_stage or {}).items():
        setattr(channel.protocol.aggregator(KIND), name, value)
    for cid, tamper in (client_tamper or {}).items():
        corrupt(channel.parties[cid], tamper)
    weights = weights or {cid: 1.0 for cid in values}
    result = channel.aggregate(1, KIND, lambda c: {KIND: values[c.id]}, weights,
                               {KIND: ((SIZE,), np.dtype(np.float32))}, noise)
    channel.close()
    report = verify_run(tmp_path)
    assert report.ok, report.summary()
    return result, list(log.events)


def honest_variance(protocol: str = DISTRIBUTED) -> float:
    """Each client's share variance in levels at scale 1 (what the clients derive)."""
    stage = load_protocol(protocol).aggregator(KIND)
    geometry = stage.noise_geometry({cid: 1.0 for cid in ids(N)}, NOISE.sensitivity, SIZE, 0)
    return geometry.share_variance(NOISE.multiplier)


def honest_std(protocol: str) -> float:
    """Std of the decoded mean's noise per coordinate when every client adds its own share."""
    step = load_protocol(protocol).aggregator(KIND).quantizer.step
    return math.sqrt(N * honest_variance(protocol)) * step / N


# -- item 4: the server chooses the noise -------------------------------------------------------

@pytest.mark.parametrize("setup", ["per-round", "once"])
@pytest.mark.parametrize("server_stage, fragment", [
    ({"share_variance": lambda *_: 1e-300}, "share_variance"),
    ({"scales": lambda weights: {u: 1000.0 for u in weights},
      "share_variance": lambda *_: honest_variance()}, "scale = 1000"),
])
def test_a_server_that_shrinks_the_noise_is_refused_by_every_client(tmp_path, setup,
                                                                   server_stage, fragment):
    """Adversary: the server, under dp-secagg-distributed, sends every client a Skellam share
    variance of 1e-300 (no noise), or a scale of 1000 (the update 1000 times louder against
    the same noise), and decodes with its own choice. Before the fix: the clients used both
    unchecked and the released mean was exact: error std 8e-07 (variance) and 3e-07
    (scale) per coordinate against 2.8e-04 honestly, with no event, while the ledger charged
    the honest noise. Now each client derives the share variance from its own spec and plan,
    requires scale 1, and refuses by name; the round aborts cleanly."""
    protocol = DISTRIBUTED if setup == "per-round" else distributed_once(tmp_path)
    values = {cid: np.full(SIZE, 1e-3, dtype=np.float32) for cid in ids(N)}
    result, events = aggregate(tmp_path, protocol, values, NOISE, server_stage)
    if result.payload is not None:
        error = float(np.std(result.payload[KIND].astype(np.float64) - 1e-3))
        pytest.fail(f"the attack succeeded: error std {error:.2g} per coordinate against "
                    f"{honest_std(protocol):.2g} with the honest noise")
    for cid in ids(N):
        refusals = [e for e in events if e["event"] == "rejected" and e["sender"] == cid
                    and e["party"] == "server" and e["phase"] == "masked_input"]
        assert any(fragment in e["detail"] for e in refusals), (cid, refusals)
    assert [e["event"] for e in events[-2:]] == ["aborted", "closed"]
    assert result.included == []


def test_each_client_derives_the_share_variance_an_honest_server_sends(tmp_path):
    """Control for the test above: with the server's honest parameters no client refuses and
    the decoded mean carries the full noise (the variance of N shares, over N^2)."""
    values = {cid: np.full(SIZE, 1e-3, dtype=np.float32) for cid in ids(N)}
    result, events = aggregate(tmp_path, DISTRIBUTED, values, NOISE)
    assert not [e for e in events if e["event"] == "rejected"]
    assert result.included == ids(N)
    error = result.payload[KIND].astype(np.float64) - 1e-3
    assert np.std(error) == pytest.approx(honest_std(DISTRIBUTED), rel=0.25)


def _refusals(tmp_path, own_noise=None) -> list[dict]:
    """One aggregation under distributed noise (``own_noise``: every client's own plan, none
    when None): it aborts with an intact log; returns the clients' ``rejected`` events, one
    per client."""
    values = {cid: np.full(SIZE, 1e-3, dtype=np.float32) for cid in ids(N)}
    clients = [Client(cid, torch.zeros(1, 2), torch.Generator()) for cid in values]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol(DISTRIBUTED), clients, log)
    if own_noise is not None:
        for endpoint in channel.endpoints.values():
            endpoint.noise = lambda *_: own_noise
    result = channel.aggregate(1, KIND, lambda c: {KIND: values[c.id]},
                               {cid: 1.0 for cid in values},
                               {KIND: ((SIZE,), np.dtype(np.float32))}, NOISE)
    channel.close()
    assert result.payload is None and verify_run(tmp_path).ok
    refusals = [e for e in log.events if e["event"] == "rejected"]
    assert {e["sender"] for e in refusals} == set(ids(N))
    return refusals


def test_a_client_without_a_noise_plan_of_its_own_refuses_to_mask(tmp_path):
    """A client whose own protocol adds distributed noise but that holds no plan of its own
    (tau and sensitivity) does not take the server's share variance: it refuses by name."""
    assert all("no noise plan of its own" in e["detail"] for e in _refusals(tmp_path))


def test_a_client_whose_own_plan_admits_no_noise_share_refuses_by_name(tmp_path):
    """A client whose own plan needs more noise than its stage's bits hold refuses the request
    by name (a signed event, the round aborts) instead of failing inside its handler."""
    loud = DistributedNoise(1e6, NOISE.sensitivity)
    assert all("cannot size its own noise share" in e["detail"]
               for e in _refusals(tmp_path, loud))


def test_unequal_weights_are_refused_under_distributed_noise(tmp_path):
    """Clients accept no scale but 1 under distributed noise, so the server refuses weights
    that would need one, before the round, with what to change."""
    values = {cid: np.full(SIZE, 1e-3, dtype=np.float32) for cid in ids(N)}
    weights = {cid: 1.0 + i for i, cid in enumerate(ids(N))}
    with pytest.raises(ProtocolError, match="equal weights"):
        aggregate(tmp_path, DISTRIBUTED, values, NOISE, weights=weights)


def test_no_clipped_count_of_a_noiseless_update_is_released(tmp_path):
    """Adversary: the server reading the ``clipped`` event. Under distributed noise the count
    is taken on the client's update before its noise share: a function of its data that no
    mechanism accounts for. Before the fix: client-1 signed '100 of 400 coordinates of its
    scaled update lay outside [-8, 8]'. Now no such event is logged under distributed noise
    (the clip still applies: it is a contraction, so the sensitivity bound holds)."""
    values = {cid: np.full(SIZE, 1e-3, dtype=np.float32) for cid in ids(N)}
    values["client-1"][:100] = 10.0
    result, events = aggregate(tmp_path, DISTRIBUTED, values, NOISE)
    assert result.included == ids(N)
    assert not [e for e in events if e["event"] == "clipped"]


# -- item 6: a malicious client's weight in the sum ---------------------------------------------

def add_levels(levels: int, bits: int):
    """A masked-input tamper: ``levels`` added to every masked word (mod 2^bits), which adds
    ``levels`` quantization steps to the client's own input once the masks cancel."""
    def tamper(data: bytes, recipient: str) -> bytes:
        fields = dict(deserialize_payload(data))
        y = fields["y"].astype(np.uint64)
        fields["y"] = ((y + np.uint64(levels)) % np.uint64(2**bits)).astype(fields["y"].dtype)
        return serialize_payload(fields)
    return tamper


@pytest.mark.parametrize("protocol", ["secagg", "secagg-once"])
@pytest.mark.parametrize("factor", [0.96, 1.04])
def test_a_client_weighs_up_to_n_clips_per_coordinate_undetected(tmp_path, protocol, factor):
    """What does NOT hold: the clip bounds an honest client's input only. Adversary: client-2
    adds ``factor`` x n x clip per coordinate to its own input (levels added to its masked
    words; the masks hide it from everyone). The server checks only that the unmasked total
    lies in [-n clip, n clip]: at 0.96 (38.4 per coordinate at clip 8, n = 5) the round
    completes with no event and client-2's contribution in the mean; at 1.04 the total leaves
    the range and the round aborts, naming no one. Per-client range proofs would enforce the
    clip (RoFL); none are built."""
    stage = load_protocol(protocol).aggregator(KIND)
    clip, step = stage.quantizer.clip, stage.quantizer.step
    added = round(factor * N * clip / step)
    values = {cid: np.zeros(SIZE, dtype=np.float32) for cid in ids(N)}
    result, events = aggregate(tmp_path, protocol, values,
                               client_tamper={"client-2": {"masked_input": add_levels(
                                   added, stage.quantizer.bits)}})
    assert not [e for e in events if e["event"] == "rejected"]
    if factor < 1:
        assert result.included == ids(N)
        contribution = result.payload[KIND].astype(np.float64) * N  # the others sent 0
        assert np.abs(contribution - factor * N * clip).max() < N * step * 2
    else:
        assert result.payload is None and "the unmasked sum is unusable" in result.reason

