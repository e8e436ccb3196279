"""`ProtectedChannel` (secureffm/protocols/channel.py): what methods do with messages, protected
by a protocol over the in-process transport: broadcast, aggregate (and the server's events about
it), send and all_gather.

Truths used: torch autograd of the pooled weighted loss, numpy weighted means, SHA-256 of the
serialized payloads, and the log's lines as written on disk.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from secureffm.errors import MessageError, ProtocolError
from secureffm.federation import SERVER, Client, MessageLog, serialize_payload
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.methods.ffm import client_weights
from secureffm.models import VelocityMLP, flat_grad, flat_params, load_flat_params
from secureffm.privacy.settings import DistributedNoise
from secureffm.protocols import load_protocol
from secureffm.protocols.channel import ProtectedChannel
from secureffm.runs.scaffold import open_channel
from tests.gathering import gather

VECTOR3 = {"gradient": ((3,), np.dtype(np.float32))}


def make_clients(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Client(f"client-{i}", torch.randn(n, 2, generator=gen), torch.Generator())
            for i, n in enumerate(sizes, start=1)]


def make_channel(tmp_path, clients, protocol="plaintext", faults=None):
    log = MessageLog(tmp_path / "messages.jsonl")
    return open_channel(load_protocol(protocol), clients, log, faults), log


def records(log: MessageLog) -> list[dict]:
    return [json.loads(line) for line in log.path.read_text().splitlines()]


def events(log: MessageLog, name: str) -> list[dict]:
    return [e for e in log.events if e["event"] == name]


def constant(values: dict[str, float]):
    """A compute: each client uploads its value three times."""
    return lambda c: {"gradient": np.full(3, values[c.id], dtype=np.float32)}


# -- aggregate ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol, tol", [("plaintext", 1e-7), ("secagg", 1e-5)])
def test_weighted_aggregation_equals_gradient_of_pooled_weighted_loss(tmp_path, protocol, tol):
    torch.manual_seed(0)
    clients = make_clients([30, 70, 120])
    model = VelocityMLP(2, 16)
    channel, _ = make_channel(tmp_path, clients, protocol)
    weights = client_weights(clients, "size", equal=channel.equal_weights("gradient"))
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
    result = channel.aggregate(1, "gradient", compute, weights,
                               {"gradient": ((count,), np.dtype(np.float32))})
    pooled = sum(weights[c.id] * loss(model, c) for c in clients)
    pooled.backward()
    assert result.included == [c.id for c in clients]
    np.testing.assert_allclose(result.payload["gradient"], flat_grad(model), rtol=0, atol=tol)
    # secure aggregation takes only equal weights: weighting = "size" gives them there
    assert weights["client-3"] == pytest.approx(1 / 3 if protocol == "secagg" else 120 / 220)


def test_every_delivery_is_logged_with_hash_chain_and_keys(tmp_path):
    clients = make_clients([5, 5, 5])
    channel, log = make_channel(tmp_path, clients)
    payload = {"theta": np.arange(4, dtype=np.float32)}
    channel.broadcast(1, "global_model", payload)
    channel.aggregate(1, "gradient", lambda c: {"gradient": c.data[0, :1].repeat(3).numpy()},
                      client_weights(clients, "uniform"), VECTOR3)
    channel.close()
    lines = log.path.read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    assert [(r["sender"], r["recipient"], r["kind"]) for r in logged] == (
        [(SERVER, c.id, "global_model") for c in clients]
        + [(c.id, SERVER, "gradient") for c in clients]
        + [(SERVER, "log", "event"), (SERVER, "log", "event")])
    assert logged[-2]["event"] == "aggregated"  # the server names whom it counted
    assert logged[-2]["included"] == [c.id for c in clients]
    assert logged[-2]["of_kind"] == "gradient"
    assert logged[-1]["event"] == "closed" and logged[-1]["records"] == 7
    assert logged[0]["sha256"] == hashlib.sha256(serialize_payload(payload)).hexdigest()
    assert logged[0]["bytes"] == len(serialize_payload(payload))
    for prev_line, record in zip(lines, logged[1:], strict=False):
        assert record["prev"] == hashlib.sha256(prev_line.encode()).hexdigest()
    assert [r["seq"] for r in logged] == list(range(8))
    parties = json.loads((tmp_path / "parties.json").read_text())
    assert set(parties) == {SERVER, "client-1", "client-2", "client-3"}
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
    channel, log = make_channel(tmp_path, clients, protocol)
    good = {c.id: np.full(3, float(i), dtype=np.float32) for i, c in enumerate(clients)}

    def compute(client):
        return {"gradient": bad if client.id == "client-2" else good[client.id]}

    result = channel.aggregate(1, "gradient", compute, client_weights(clients, "uniform"),
                               VECTOR3)
    assert result.included == ["client-1", "client-3"]
    assert reason in result.dropped["client-2"]
    np.testing.assert_allclose(result.payload["gradient"], [1.0, 1.0, 1.0], atol=1e-5)
    rejected = events(log, "rejected")
    assert rejected and rejected[0]["party"] == "client-2" and reason in rejected[0]["detail"]
    [dropped] = events(log, "dropped")
    assert (dropped["sender"], dropped["party"]) == (SERVER, "client-2")


@pytest.mark.parametrize("protocol, phase", [("plaintext", "upload"),
                                             ("secagg", "advertise_keys")])
def test_the_server_logs_each_dropped_client_then_the_aggregate_naming_whom_it_counted(
        tmp_path, protocol, phase):
    clients = make_clients([4, 4, 4])
    faults = FaultPlan("t", (Fault("drop", "client-3", phase, (1,)),))
    channel, log = make_channel(tmp_path, clients, protocol, faults)
    values = {"client-1": 1.0, "client-2": 3.0, "client-3": 100.0}
    result = channel.aggregate(1, "gradient", constant(values),
                               client_weights(clients, "uniform"), VECTOR3)
    assert result.included == ["client-1", "client-2"] and list(result.dropped) == ["client-3"]
    np.testing.assert_allclose(result.payload["gradient"], 2.0, atol=1e-5)
    assert [(e["event"], e["party"], e["sender"], e["round"]) for e in log.events] == [
        ("dropped", "client-3", SERVER, 1), ("aggregated", "*", SERVER, 1)]
    aggregated = log.events[-1]
    assert aggregated["included"] == ["client-1", "client-2"]
    assert aggregated["of_kind"] == "gradient" and aggregated["detail"] == "2 of 3 clients counted"


@pytest.mark.parametrize("protocol, phase, reason", [
    ("plaintext", "upload", "no client update was accepted"),
    ("secagg", "advertise_keys", "only 1 clients advertised keys, threshold is 2"),
])
def test_an_aggregate_too_few_clients_reach_is_aborted_and_reveals_nothing(tmp_path, protocol,
                                                                           phase, reason):
    clients = make_clients([4, 4, 4])
    gone = ("client-1", "client-2", "client-3") if protocol == "plaintext" else ("client-1",
                                                                                 "client-2")
    faults = FaultPlan("t", tuple(Fault("drop", c, phase, (1,)) for c in gone))
    channel, log = make_channel(tmp_path, clients, protocol, faults)
    result = channel.aggregate(1, "gradient", constant({c.id: 1.0 for c in clients}),
                               client_weights(clients, "uniform"), VECTOR3)
    assert result.payload is None and result.included == [] and result.reason == reason
    assert [(e["event"], e["party"]) for e in log.events] == (
        [("dropped", c) for c in gone] + [("aborted", "*")])
    assert log.events[-1]["detail"] == reason and log.events[-1]["sender"] == SERVER


def test_distributed_noise_is_given_exactly_when_the_protocol_asks_for_it(tmp_path):
    clients = make_clients([4, 4, 4])
    noise = DistributedNoise(1.0, {c.id: 1.0 for c in clients})
    channel, _ = make_channel(tmp_path, clients, "secagg")
    with pytest.raises(ProtocolError, match="exactly when the protocol's dp stage uses"):
        channel.aggregate(1, "gradient", constant({c.id: 1.0 for c in clients}),
                          client_weights(clients, "uniform"), VECTOR3, noise)
    distributed, _ = make_channel(tmp_path / "d", clients, "dp-secagg-distributed")
    with pytest.raises(ProtocolError, match="exactly when the protocol's dp stage uses"):
        distributed.aggregate(1, "gradient", constant({c.id: 1.0 for c in clients}),
                              client_weights(clients, "uniform"), VECTOR3)


# -- broadcast, send, all_gather --------------------------------------------------------------


def test_broadcast_reaches_the_alive_clients_inboxes(tmp_path):
    clients = make_clients([3, 3, 3])
    faults = FaultPlan("t", (Fault("lose", SERVER, "broadcast", (2,), "client-1"),))
    channel, log = make_channel(tmp_path, clients, faults=faults)
    channel.broadcast(2, "global_model", {"theta": np.ones(2, np.float32)})
    assert [c.id for c in clients if "global_model" in c.inbox] == ["client-2", "client-3"]
    assert [r["recipient"] for r in records(log)] == ["client-1", "client-2", "client-3"]


def test_a_broadcast_its_recipient_cannot_read_is_refused_by_it_and_named(tmp_path):
    """Adversary: a malicious server that signs and sends client-2 bytes that are no payload
    in place of the model. client-2 refuses that record by seq (so an audit knows it never
    accepted it) and the round goes on; the others take the model."""
    clients = make_clients([3, 3, 3])
    channel, log = make_channel(tmp_path, clients)
    honest = channel.server.envelope

    def envelope(round_, phase, kind, recipient, data, stages=(), origin="",
                 digest=None):  # digest dropped: the honest envelope hashes what is sent
        data = b"not a payload" if recipient == "client-2" else data
        return honest(round_, phase, kind, recipient, data, stages, origin)

    channel.server.envelope = envelope
    channel.broadcast(1, "global_model", {"theta": np.ones(2, np.float32)})
    assert [c.id for c in clients if "global_model" in c.inbox] == ["client-1", "client-3"]
    [rejected] = events(log, "rejected")
    sent = [r for r in records(log) if r["recipient"] == "client-2"]
    assert (rejected["sender"], rejected["party"], rejected["refused"]) == (
        "client-2", SERVER, sent[0]["seq"])


def test_send_delivers_one_message_each_way_and_none_when_it_cannot(tmp_path):
    clients = make_clients([3, 3, 3])
    faults = FaultPlan("t", (Fault("corrupt", "client-2", "upload", (1,)),
                             Fault("drop", "client-3", "upload", (1,))))
    channel, log = make_channel(tmp_path, clients, faults=faults)
    payload = {"weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    up = channel.send(1, "upload", "model", "client-1", SERVER, payload)
    np.testing.assert_array_equal(up["weight"], payload["weight"])
    down = channel.send(1, "broadcast", "model", SERVER, "client-2", payload)
    np.testing.assert_array_equal(down["weight"], payload["weight"])
    np.testing.assert_array_equal(clients[1].inbox["model"]["weight"], payload["weight"])
    assert channel.send(1, "upload", "model", "client-2", SERVER, payload) is None  # altered
    assert channel.send(1, "upload", "model", "client-3", SERVER, payload) is None  # offline
    [rejected] = events(log, "rejected")
    assert (rejected["sender"], rejected["party"]) == (SERVER, "client-2")
    assert "altered in transit" in rejected["detail"]
    assert [(r["sender"], r["recipient"]) for r in records(log) if r["kind"] == "model"] == [
        ("client-1", SERVER), (SERVER, "client-2"), ("client-2", SERVER)]


def test_a_message_its_recipient_cannot_read_is_rejected_by_the_recipient(tmp_path):
    clients = make_clients([3, 3, 3])
    channel, log = make_channel(tmp_path, clients)
    bad = {"weight": np.array([np.nan], np.float32)}
    assert channel.send(1, "broadcast", "model", SERVER, "client-2", bad) is None
    assert "model" not in clients[1].inbox
    [rejected] = events(log, "rejected")
    assert (rejected["sender"], rejected["party"]) == ("client-2", SERVER)
    assert "client-2 rejected model message of server" in rejected["detail"]


def test_send_goes_between_the_server_and_a_client_only(tmp_path):
    channel, log = make_channel(tmp_path, make_clients([3, 3, 3]))
    with pytest.raises(ProtocolError, match="all_gather"):
        channel.send(1, "upload", "model", "client-1", "client-2",
                     {"weight": np.zeros(2, np.float32)})
    assert records(log) == []


def test_send_refuses_a_kind_the_server_may_only_learn_summed(tmp_path):
    channel, log = make_channel(tmp_path, make_clients([3, 3, 3]), "secagg")
    with pytest.raises(ProtocolError, match="only learn its sum"):
        channel.send(0, "upload", "gradient", "client-1", SERVER, {"g": np.zeros(3, np.float32)})
    with pytest.raises(ProtocolError, match="only learn its sum"):
        channel.all_gather(0, "gradient", lambda c: {"g": np.zeros(3, np.float32)})
    assert records(log) == []


@pytest.mark.parametrize("protocol", ["plaintext", "sealed"])
def test_all_gather_gives_every_client_each_alive_peers_payload(tmp_path, protocol):
    clients = make_clients([3, 3, 3, 3])
    faults = FaultPlan("t", (Fault("drop", "client-4", "upload", (0,)),))
    channel, log = make_channel(tmp_path, clients, protocol, faults)
    computed = []

    def compute(client):
        computed.append(client.id)
        return {"weight": np.full(2, int(client.id[-1]), np.float32)}

    gathered = gather(channel, 0, "model", compute)
    assert computed == ["client-1", "client-2", "client-3"]  # once each, offline excluded
    assert gathered["client-4"] == {}  # offline from upload on: it receives nothing
    for client in clients[:3]:
        authors = [a for a in ("client-1", "client-2", "client-3") if a != client.id]
        assert sorted(gathered[client.id]) == authors
        for author in authors:
            assert gathered[client.id][author]["weight"].tolist() == [int(author[-1])] * 2
    relays = [r for r in records(log) if r["phase"] == "relay"]
    assert len(relays) == 9 and all(r["sender"] == SERVER and r["origin"] for r in relays)


def test_the_channel_takes_the_transports_clients_in_its_order(tmp_path):
    clients = make_clients([3, 3, 3])
    channel, _ = make_channel(tmp_path, clients)
    assert channel.parties == {SERVER: channel.server, **{c.id: c for c in clients}}
    with pytest.raises(MessageError, match="in its order"):
        ProtectedChannel(channel.protocol, channel.transport, channel.server, clients[::-1])


def test_close_ends_the_log_with_the_servers_record_and_returns_its_head(tmp_path):
    channel, log = make_channel(tmp_path, make_clients([3, 3]))
    channel.broadcast(1, "global_model", {"theta": np.ones(1, np.float32)})
    head = channel.close()
    last = log.path.read_text().splitlines()[-1]
    assert head == hashlib.sha256(last.encode()).hexdigest()
    assert json.loads(last)["sender"] == SERVER and json.loads(last)["event"] == "closed"
