import hashlib
import json

import numpy as np
import pytest
import torch

from secureffm.errors import ConfigError, MessageError
from secureffm.federation import (
    Client,
    InProcessEngine,
    MessageLog,
    serialize_payload,
)
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.methods.ffm import client_weights
from secureffm.models import VelocityMLP, flat_grad, flat_params, load_flat_params
from secureffm.protocols import load_protocol

VECTOR3 = {"gradient": ((3,), np.dtype(np.float32))}


def make_clients(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Client(f"client-{i}", torch.randn(n, 2, generator=gen), torch.Generator())
            for i, n in enumerate(sizes, start=1)]


def make_engine(tmp_path, clients, protocol="plaintext", faults=None):
    log = MessageLog(tmp_path / "messages.jsonl")
    return InProcessEngine(clients, load_protocol(protocol), log, faults), log


@pytest.mark.parametrize("protocol, tol", [("plaintext", 1e-7), ("secagg", 1e-5)])
def test_weighted_aggregation_equals_gradient_of_pooled_weighted_loss(tmp_path, protocol, tol):
    torch.manual_seed(0)
    clients = make_clients([30, 70, 120])
    model = VelocityMLP(2, 16)
    engine, _ = make_engine(tmp_path, clients, protocol)
    weights = client_weights(clients, "size")
    gen = torch.Generator().manual_seed(1)
    fixed = {c.id: (torch.randn(c.size, 2, generator=gen), torch.rand(c.size, generator=gen))
             for c in clients}

    def loss(m, client):
        x0, t = fixed[client.id]
        xt = (1 - t[:, None]) * x0 + t[:, None] * client.data
        return (m(xt, t) - (client.data - x0)).pow(2).mean()

    def compute(client):
        replica = VelocityMLP(2, 16)
        load_flat_params(replica, flat_params(model))
        loss(replica, client).backward()
        return {"gradient": flat_grad(replica)}

    count = sum(p.numel() for p in model.parameters())
    result = engine.aggregate(1, "gradient", compute, weights,
                              {"gradient": ((count,), np.dtype(np.float32))})
    pooled = sum(weights[c.id] * loss(model, c) for c in clients)
    pooled.backward()
    assert result.included == [c.id for c in clients]
    np.testing.assert_allclose(result.payload["gradient"], flat_grad(model), rtol=0, atol=tol)
    assert weights["client-3"] == pytest.approx(120 / 220)


def test_every_delivery_is_logged_with_hash_chain_and_keys(tmp_path):
    clients = make_clients([5, 5, 5])
    engine, log = make_engine(tmp_path, clients)
    payload = {"theta": np.arange(4, dtype=np.float32)}
    engine.broadcast(1, "global_model", payload)
    engine.aggregate(1, "gradient", lambda c: {"gradient": c.data[0, :1].repeat(3).numpy()},
                     client_weights(clients, "uniform"), VECTOR3)
    log.close()
    lines = (tmp_path / "messages.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["sender"], r["recipient"], r["kind"]) for r in records] == (
        [("server", c.id, "global_model") for c in clients]
        + [(c.id, "server", "gradient") for c in clients] + [("server", "log", "event")])
    assert records[-1]["event"] == "aggregated"  # the server names whom it counted
    assert records[-1]["included"] == [c.id for c in clients]
    assert records[0]["sha256"] == hashlib.sha256(serialize_payload(payload)).hexdigest()
    assert records[0]["bytes"] == len(serialize_payload(payload))
    for prev_line, record in zip(lines, records[1:], strict=False):
        assert record["prev"] == hashlib.sha256(prev_line.encode()).hexdigest()
    assert [r["seq"] for r in records] == list(range(7))
    parties = json.loads((tmp_path / "parties.json").read_text())
    assert set(parties) == {"server", "client-1", "client-2", "client-3"}
    assert all(c.inbox["global_model"]["theta"].tolist() == [0, 1, 2, 3] for c in clients)


@pytest.mark.parametrize("protocol", ["plaintext", "secagg"])
@pytest.mark.parametrize("bad, reason", [
    (np.array([1.0, np.nan, 0.0], dtype=np.float32), "NaN"),
    (np.array([1.0, np.inf, 0.0], dtype=np.float32), "NaN or Inf"),
    (np.zeros(4, dtype=np.float32), "shape"),
    (np.zeros(3, dtype=np.float64), "float64"),
])
def test_a_bad_update_is_named_and_dropped_and_the_round_completes(tmp_path, bad, reason,
                                                                   protocol):
    clients = make_clients([5, 5, 5])
    engine, log = make_engine(tmp_path, clients, protocol)
    good = {c.id: np.full(3, float(i), dtype=np.float32) for i, c in enumerate(clients)}

    def compute(client):
        return {"gradient": bad if client.id == "client-2" else good[client.id]}

    result = engine.aggregate(1, "gradient", compute, client_weights(clients, "uniform"),
                              VECTOR3)
    assert result.included == ["client-1", "client-3"]
    assert reason in result.dropped["client-2"]
    np.testing.assert_allclose(result.payload["gradient"], [1.0, 1.0, 1.0], atol=1e-5)
    events = [e for e in log.events if e["event"] == "rejected"]
    assert events and events[0]["party"] == "client-2" and reason in events[0]["detail"]


def test_client_ids_must_be_unique(tmp_path):
    clients = make_clients([3, 3])
    clients[1].id = clients[0].id
    with pytest.raises(MessageError, match="unique"):
        make_engine(tmp_path, clients)


# -- fault plans ------------------------------------------------------------------------------

@pytest.mark.parametrize("action, event", [("lose", None), ("corrupt", "altered in transit"),
                                           ("delay", "after the phase closed")])
def test_a_fault_on_the_servers_delivery_hits_only_its_recipient(tmp_path, action, event):
    clients = make_clients([3, 3, 3])
    plan = FaultPlan("t", (Fault(action, "server", "broadcast", (1,), "client-2"),))
    engine, log = make_engine(tmp_path, clients, faults=plan)
    for round_ in (1, 2):
        for c in clients:
            c.inbox.clear()
        engine.broadcast(round_, "global_model", {"theta": np.arange(2, dtype=np.float32)})
        got = [c.id for c in clients if "global_model" in c.inbox]
        assert got == (["client-1", "client-3"] if round_ == 1 else [c.id for c in clients])
    engine.close()
    rejected = [e for e in log.events if e["event"] == "rejected"]
    if event is None:  # a lost message leaves only the server's record of sending it
        assert rejected == []
    else:  # the recipient, not the server, rejects what it received
        assert [(e["sender"], e["party"], e["round"]) for e in rejected] == [
            ("client-2", "server", 1)]
        assert event in rejected[0]["detail"]
    sent = [json.loads(line) for line in (tmp_path / "messages.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "global_model" for r in sent) == 6


@pytest.mark.parametrize("fault, fragment", [
    (Fault("drop", "server", "upload"), "the server cannot go offline; use action 'lose'"),
    (Fault("drop", "client-9", "upload"), "party 'client-9' does not exist"),
    (Fault("corrupt", "client-1", "masked_input"), "phase 'masked_input' is not a phase"),
    (Fault("unknown_sender", "client-1", "upload"), "'client-1' is registered"),
    (Fault("unknown_sender", "server", "upload"), "'server' is registered"),
    (Fault("drop", "client-1", "upload", (), "server"), "recipient 'server' is not possible"),
    (Fault("lose", "server", "broadcast", (), "client-9"), "recipient 'client-9' is not"),
    (Fault("lose", "server", "broadcast", (), "server"), "recipient 'server' is not"),
])
def test_a_fault_the_federation_cannot_suffer_is_refused_by_the_engine(tmp_path, fault,
                                                                       fragment):
    with pytest.raises(ConfigError, match=fragment):
        make_engine(tmp_path, make_clients([3, 3]), faults=FaultPlan("m", (fault,)))
