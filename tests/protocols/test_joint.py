"""One aggregation of several kinds (Channel.aggregate_many, secureffm/federation/joint.py):
one secure aggregation of the joint payload where the protocol protects the kinds alike, one
after another otherwise, and what a client refuses of a joint request."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from secureffm.audit import verify_run
from secureffm.federation import Client, MessageLog
from secureffm.federation.channel import Task
from secureffm.federation.exchange import Request
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.joint import joint_task, joint_template
from secureffm.protocols import load_protocol
from secureffm.runs.scaffold import open_channel

KINDS = ("gradient", "dual_update")
SIZES = {"gradient": 5, "dual_update": 3}
SECAGG = {"stage": "secagg", "threshold": 0.6, "neighbours": 0, "clip": 8.0,
          "levels": 2**22, "bits": 32}
CKKS = {"stage": "ckks", "protects": list(KINDS), "poly_modulus_degree": 8192,
        "coeff_mod_bit_sizes": [60, 40, 40], "scale_bits": 60, "decryptors": 1}
DP = {"stage": "dp", "clip": 1.0, "delta": 1e-5, "noise_multiplier": 1.0}


def _spec(tmp_path: Path, *stages: dict) -> str:
    """A spec of ``stages`` (tables; lists as TOML arrays)."""
    lines = ['name = "test-joint"']
    for table in stages:
        lines += ["", "[[stages]]"] + [f"{key} = {json.dumps(value)}"
                                       for key, value in table.items()]
    path = tmp_path / "spec.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _inputs(n: int) -> dict[str, dict[str, np.ndarray]]:
    """task name -> client id -> its input (uniform in [-3, 3])."""
    rng = np.random.default_rng(0)
    return {f"t.{kind}": {f"client-{i}": rng.uniform(-3, 3, SIZES[kind]).astype(np.float32)
                          for i in range(1, n + 1)} for kind in KINDS}


def _federation(tmp_path: Path, protocol: str, n: int = 4, faults: FaultPlan | None = None):
    """n clients whose program answers task ``t.<kind>`` with its input; the channel, its
    log, the inputs and the count of exchanges by round (the transport's own calls)."""
    inputs = _inputs(n)
    clients = [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator().manual_seed(i))
               for i in range(1, n + 1)]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol(protocol), clients, log, faults,
                           program=lambda client, task: {"x": inputs[task.name][client.id]})
    counts: Counter[int] = Counter()
    exchange = channel.transport.exchange

    def counted(requests, endpoints=None):
        counts[next(iter(requests.values())).round] += 1
        return exchange(requests, endpoints)

    channel.transport.exchange = counted
    return channel, log, inputs, counts


def _parts() -> dict:
    return {kind: (Task(f"t.{kind}"), {"x": ((SIZES[kind],), np.dtype(np.float32))}, None)
            for kind in KINDS}


def _records(log: MessageLog) -> list[dict]:
    return [json.loads(line) for line in log.path.read_text().splitlines()]


def test_one_secure_aggregation_gives_each_kind_its_own_mean(tmp_path):
    """secagg protecting both kinds: aggregate_many runs ONE malicious-variant aggregation (5
    exchanges, the broadcast carried by the first request to compute; one after another took
    10 and a broadcast's own exchange), every client message is of the joint kind, and the
    server obtains each kind's mean (to the quantizer's step) with an ``aggregated`` event per
    kind naming it in ``of_kind``."""
    spec = _spec(tmp_path, {**SECAGG, "protects": list(KINDS)})
    channel, log, inputs, counts = _federation(tmp_path, spec)
    ids = [c.id for c in channel.clients]
    out = channel.aggregate_many(1, _parts(), dict.fromkeys(ids, 1.0),
                                 broadcast={"global_model": {"theta": np.ones(2, np.float32)}})
    assert counts == {1: 5}
    for kind in KINDS:
        expected = np.mean([inputs[f"t.{kind}"][c] for c in ids], axis=0)
        assert out[kind].included == ids
        np.testing.assert_allclose(out[kind].payload["x"], expected, atol=1e-5)
    messages = [r for r in _records(log) if r["kind"] != "event"]
    from_clients = {r["kind"] for r in messages if r["sender"] != "server"}
    assert from_clients == {"gradient+dual_update"}
    assert [(e["event"], e.get("of_kind")) for e in log.events] == [
        ("aggregated", "gradient"), ("aggregated", "dual_update")]
    assert all(c.inbox["global_model"]["theta"].tolist() == [1.0, 1.0]
               for c in channel.clients)


def test_an_aborted_joint_aggregation_logs_each_kinds_abort(tmp_path):
    """Three of four clients go offline at the masked input: the joint aggregation aborts,
    the server logs each dropped client once and an ``aborted`` event per kind (naming it in
    ``of_kind``), and the closed log verifies."""
    spec = _spec(tmp_path, {**SECAGG, "protects": list(KINDS)})
    plan = FaultPlan("drop", tuple(Fault("drop", f"client-{i}", "masked_input", (1,))
                                   for i in (2, 3, 4)))
    channel, log, _, _ = _federation(tmp_path, spec, faults=plan)
    out = channel.aggregate_many(1, _parts(), dict.fromkeys([c.id for c in channel.clients],
                                                            1.0))
    assert out["gradient"].payload is None and out["dual_update"].payload is None
    assert out["gradient"].reason == out["dual_update"].reason
    assert [(e["event"], e["party"], e.get("of_kind")) for e in log.events] == [
        ("dropped", f"client-{i}", None) for i in (2, 3, 4)] + [
        ("aborted", "*", "gradient"), ("aborted", "*", "dual_update")]
    channel.close()
    assert verify_run(tmp_path).ok


@pytest.mark.parametrize("stages, why", [
    ([{**SECAGG, "protects": ["gradient"]}], "aggregates 'dual_update' in the clear"),
    ([{**DP, "protects": ["gradient"]}, {**SECAGG, "protects": list(KINDS)}],
     "client stages"),
    ([CKKS], "one kind at a time")])
def test_kinds_protected_differently_are_aggregated_one_after_another(tmp_path, stages, why):
    """Where the protocol does not protect the kinds alike (one in the clear, DP on one only,
    a stage that aggregates one kind at a time), aggregate_many runs one aggregation per kind,
    each message of its own kind, and
    :meth:`~secureffm.protocols.protocol.Protocol.joint_refusal` says why."""
    spec = _spec(tmp_path, *stages)
    assert why in load_protocol(spec).joint_refusal("gradient+dual_update")
    channel, log, inputs, _ = _federation(tmp_path, spec, n=3)
    ids = [c.id for c in channel.clients]
    if any(s["stage"] == "dp" for s in stages):
        return  # DP-SGD needs a method's program: the refusal is what matters here
    out = channel.aggregate_many(1, _parts(), dict.fromkeys(ids, 1 / 3))
    for kind in KINDS:
        expected = np.mean([inputs[f"t.{kind}"][c] for c in ids], axis=0)
        np.testing.assert_allclose(out[kind].payload["x"], expected, atol=1e-4)
    kinds = {r["kind"] for r in _records(log) if r["kind"] != "event"}
    assert kinds == set(KINDS)


# -- what a client refuses -------------------------------------------------------------------

@pytest.mark.parametrize("client_stages, kind, action, why", [
    ([{**SECAGG, "protects": ["gradient"]}], "gradient+dual_update", "secagg.advertise",
     "aggregates 'dual_update' in the clear"),
    ([{**DP, "protects": ["gradient"]}, {**SECAGG, "protects": list(KINDS)}],
     "gradient+dual_update", "secagg.advertise", "client stages"),
    ([{**DP, "protects": list(KINDS), "noise": "distributed"},
      {**SECAGG, "protects": list(KINDS)}], "gradient+dual_update", "secagg.advertise",
     "distributed noise"),
    ([{**SECAGG, "protects": list(KINDS)}], "gradient+gradient", "secagg.advertise",
     "names 'gradient' twice"),
    ([{**SECAGG, "protects": list(KINDS)}], "gradient+gradient", "secagg.mask",
     "names 'gradient' twice"),
    ([CKKS], "gradient+dual_update", "ckks.upload",
     "one kind at a time"),
])
def test_a_client_refuses_a_joint_request_its_own_protocol_does_not_allow(
        tmp_path, client_stages, kind, action, why):
    """Adversary: a malicious server asking a client for a joint aggregation that its own
    protocol would not run: a kind it aggregates in the clear, or with other client stages
    (DP on one kind only), or with distributed noise (sized per kind), or one kind twice, or
    through a stage that aggregates one kind at a time. The client answers nothing and signs
    a ``rejected`` event naming why, before any handler runs (so before it computes)."""
    spec = _spec(tmp_path, *client_stages)
    channel, _, _, _ = _federation(tmp_path, spec, n=3)
    endpoint = channel.endpoints["client-1"]
    reply = endpoint(Request(1, kind, "advertise_keys", "advertise_keys", action), None)
    assert reply.envelope is None
    [event] = reply.events
    assert (event["event"], event["sender"], event["party"]) == ("rejected", "client-1",
                                                                  "server")
    assert f"refused action {action!r} for the joint {kind}" in event["detail"]
    assert why in event["detail"]
    assert not endpoint.sessions  # no keys were made for it


@pytest.mark.parametrize("kind, compute, why", [
    ("gradient+dual_update", Task("t.gradient"), "is not a 'joint' task"),
    ("gradient+dual_update", joint_task({"gradient": Task("t.gradient")}),
     "names the kinds ['gradient'], not ['gradient', 'dual_update']"),
    ("gradient", joint_task({"gradient": Task("t.gradient"), "dual_update": Task("t.dual")}),
     "refused a 'joint' task for the single kind gradient")])
def test_a_client_computes_only_the_parts_its_joint_kind_names(tmp_path, kind, compute, why):
    """Adversary: a malicious server running a secure aggregation whose computation does not
    match its kind: a joint kind with one part's task (its input then fills the joint
    template), a joint task naming fewer kinds than the request's, or a joint task under a
    single kind. Every client withholds its input and names why; the aggregation aborts."""
    spec = _spec(tmp_path, {**SECAGG, "protects": list(KINDS)})
    channel, log, _, _ = _federation(tmp_path, spec, n=3)
    ids = [c.id for c in channel.clients]
    template = ({"x": ((SIZES["gradient"],), np.dtype(np.float32))} if kind == "gradient"
                else joint_template({k: {"x": ((SIZES[k],), np.dtype(np.float32))}
                                     for k in KINDS}))
    result = channel.aggregate(1, kind, compute, dict.fromkeys(ids, 1.0), template)
    assert result.payload is None
    refusals = [e for e in log.events if e["event"] == "rejected" and e["sender"] in ids]
    assert sorted(e["sender"] for e in refusals) == ids
    assert all(why in e["detail"] for e in refusals)


def test_a_client_never_uploads_a_joint_kind_in_the_clear(tmp_path):
    """Adversary: a server asking a plaintext client to upload a joint payload (one upload
    that carries both kinds, outside any aggregation). The client refuses by name and
    computes nothing: a joint kind exists only to be aggregated."""
    channel, _, _, _ = _federation(tmp_path, "plaintext", n=2)
    compute = joint_task({kind: Task(f"t.{kind}") for kind in KINDS})
    reply = channel.endpoints["client-1"](Request(1, "gradient+dual_update", "upload", "upload",
                                                  "upload", (), None, {"compute": compute}),
                                          None)
    assert reply.envelope is None
    [event] = reply.events
    assert "refused to send its gradient+dual_update on its own" in event["detail"]
    assert "never sent one by one" in event["detail"]
