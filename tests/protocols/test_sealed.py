import json

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, Client, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.message import serialize_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.sealed import SealHeader, open_payload, seal_payload
from secureffm.runs.scaffold import open_channel
from tests.gathering import gather


def make_channel(tmp_path, protocol, faults=None, n=3):
    clients = [Client(f"client-{i}", torch.zeros(4, 2), torch.Generator())
               for i in range(1, n + 1)]
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads=True)
    return open_channel(load_protocol(protocol), clients, log, faults), log


def model_of(client):
    index = int(client.id.split("-")[1])
    return {"weight": np.full((4, 3), index, dtype=np.float32),
            "bias": np.arange(3, dtype=np.float32) * index}


def header(round_=0, sender="client-1", recipients=("client-2",)):
    return SealHeader("model", round_, "relay", sender, recipients, 0)


def open_as_client_2(channel, data, round_=0, key=None):
    """client-2 opens ``data`` as client-1's round-``round_`` relay message, against client-1's
    pinned keys (with client-2's own sealing key unless ``key`` is given)."""
    registry = channel.transport.registry
    return open_payload(data, "model", round_, "relay", "client-1", registry.sign["client-1"],
                        registry.seal["client-1"], key or channel.clients[1].sealing,
                        "client-2").payload


def records(log):
    return [json.loads(line) for line in log.path.read_text().splitlines()]


@pytest.mark.parametrize("protocol", ["plaintext", "sealed"])
def test_all_gather_delivers_every_peer_model_exactly(tmp_path, protocol):
    channel, log = make_channel(tmp_path, protocol)
    gathered = gather(channel, 0, "model", model_of)
    for client in channel.clients:
        peers = gathered[client.id]
        assert sorted(peers) == sorted(c.id for c in channel.clients if c is not client)
        for author, payload in peers.items():
            expected = model_of(next(c for c in channel.clients if c.id == author))
            assert payload.keys() == expected.keys()
            for name in expected:
                np.testing.assert_array_equal(payload[name], expected[name])
    channel.close()
    phases = [(r["phase"], r["sender"]) for r in records(log) if r["kind"] == "model"]
    assert sum(p == "upload" for p, _ in phases) == 3
    assert sum(p == "relay" and s == SERVER for p, s in phases) == 6


def test_the_relaying_server_sees_no_model_bytes_and_cannot_open_them(tmp_path):
    channel, log = make_channel(tmp_path, "sealed")
    channel.all_gather(0, "model", model_of)
    channel.close()
    stored = (tmp_path / "payloads.bin").read_bytes()
    plain = serialize_payload(model_of(channel.clients[0]))
    weight_bytes = model_of(channel.clients[0])["weight"].tobytes()
    assert plain not in stored and weight_bytes not in stored
    sealed = seal_payload(model_of(channel.clients[0]), header(), channel.clients[0].identity,
                          channel.clients[0].sealing, channel.transport.registry.seal)
    with pytest.raises(ProtocolError, match="authentication"):
        open_as_client_2(channel, sealed, key=channel.server.sealing)
    assert all("sealed" in r["stages"] for r in records(log) if r["kind"] == "model")


def test_a_model_forged_by_the_server_or_replayed_into_another_round_is_rejected(tmp_path):
    channel, _ = make_channel(tmp_path, "sealed")
    forged = seal_payload(model_of(channel.clients[0]), header(), channel.server.identity,
                          channel.server.sealing, channel.transport.registry.seal)
    with pytest.raises(ProtocolError):
        open_as_client_2(channel, forged)
    genuine = seal_payload(model_of(channel.clients[0]), header(), channel.clients[0].identity,
                           channel.clients[0].sealing, channel.transport.registry.seal)
    opened = open_as_client_2(channel, genuine)
    np.testing.assert_array_equal(opened["bias"], model_of(channel.clients[0])["bias"])
    with pytest.raises(ProtocolError):
        open_as_client_2(channel, genuine, round_=1)


def test_an_upload_altered_in_transit_is_rejected_and_the_rest_still_arrives(tmp_path):
    faults = FaultPlan(faults=(Fault("corrupt", "client-1", "upload", (0,)),))
    channel, _ = make_channel(tmp_path / "next", "sealed", faults)
    gathered = gather(channel, 1, "model", model_of)
    assert all(len(peers) == 2 for peers in gathered.values())
    faults = FaultPlan(faults=(Fault("corrupt", "client-1", "upload", (0,)),))
    channel, log = make_channel(tmp_path, "sealed", faults)
    gathered = gather(channel, 0, "model", model_of)
    assert sorted(gathered["client-1"]) == ["client-2", "client-3"]
    assert sorted(gathered["client-2"]) == ["client-3"]
    channel.close()
    rejected = [r for r in records(log) if r.get("event") == "rejected"]
    assert len(rejected) == 1 and "altered" in rejected[0]["detail"]


def test_a_relayed_copy_for_one_peer_does_not_open_for_another(tmp_path):
    channel, _ = make_channel(tmp_path, "sealed")
    sealer = channel.protocol.sealer("model")
    registry, parties = channel.transport.registry, channel.parties
    data = sealer.seal(parties["client-1"], registry, model_of(channel.clients[0]), "model", 0,
                       "relay", ["client-2", "client-3"])
    copy = sealer.relay(data, "client-2", "client-1")
    assert sealer.open(parties["client-2"], registry, copy, "model", 0, "relay",
                       "client-1")["bias"][1] == 1
    with pytest.raises(ProtocolError):
        sealer.open(parties["client-3"], registry, copy, "model", 0, "relay", "client-1")


def test_send_seals_for_one_recipient_and_refuses_an_aggregated_kind(tmp_path):
    channel, log = make_channel(tmp_path, "sealed")
    received = channel.send(0, "upload", "model", "client-2", SERVER,
                            model_of(channel.clients[1]))
    np.testing.assert_array_equal(received["weight"], model_of(channel.clients[1])["weight"])
    [upload] = [r for r in records(log) if r["kind"] == "model"]
    assert upload["stages"] == ["sealed"] and upload["recipient"] == SERVER
    stored = (tmp_path / "payloads.bin").read_bytes()
    assert model_of(channel.clients[1])["weight"].tobytes() not in stored
    secagg, _ = make_channel(tmp_path / "other", "secagg")
    with pytest.raises(ProtocolError, match="only learn its sum"):
        secagg.send(0, "upload", "gradient", "client-1", SERVER, {"g": np.zeros(3, np.float32)})


def test_dp_sealed_marks_models_as_dp_trained_and_sealed(tmp_path):
    protocol = load_protocol("dp-sealed")
    assert protocol.dp_for("model") is not None
    assert protocol.client_stages("model") == ("dp",)
    assert protocol.stage_for("sealed", "model") is not None
    assert protocol.stage_for("sealed", "gradient") is None
