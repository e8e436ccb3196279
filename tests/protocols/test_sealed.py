import json

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, Client, InProcessEngine, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.message import serialize_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.sealed import SealHeader, open_payload, seal_payload


def make_engine(tmp_path, protocol, faults=None, n=3):
    clients = [Client(f"client-{i}", torch.zeros(4, 2), torch.Generator())
               for i in range(1, n + 1)]
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads=True)
    return InProcessEngine(clients, load_protocol(protocol), log, faults), log


def model_of(client):
    index = int(client.id.split("-")[1])
    return {"weight": np.full((4, 3), index, dtype=np.float32),
            "bias": np.arange(3, dtype=np.float32) * index}


def header(round_=0, sender="client-1", recipients=("client-2",)):
    return SealHeader("model", round_, "relay", sender, recipients, 0)


def open_as_client_2(engine, data, round_=0, key=None):
    """client-2 opens ``data`` as client-1's round-``round_`` relay message."""
    return open_payload(data, "model", round_, "relay", "client-1", engine.public_keys["client-1"],
                        engine.sealing_public["client-1"], key or engine.clients[1].sealing,
                        "client-2").payload


def records(log):
    return [json.loads(line) for line in log.path.read_text().splitlines()]


@pytest.mark.parametrize("protocol", ["plaintext", "sealed"])
def test_all_gather_delivers_every_peer_model_exactly(tmp_path, protocol):
    engine, log = make_engine(tmp_path, protocol)
    gathered = engine.protocol.all_gather(engine, 0, "model", model_of)
    for client in engine.clients:
        peers = gathered[client.id]
        assert sorted(peers) == sorted(c.id for c in engine.clients if c is not client)
        for author, payload in peers.items():
            expected = model_of(next(c for c in engine.clients if c.id == author))
            assert payload.keys() == expected.keys()
            for name in expected:
                np.testing.assert_array_equal(payload[name], expected[name])
    engine.close()
    phases = [(r["phase"], r["sender"]) for r in records(log) if r["kind"] == "model"]
    assert sum(p == "upload" for p, _ in phases) == 3
    assert sum(p == "relay" and s == SERVER for p, s in phases) == 6


def test_the_relaying_server_sees_no_model_bytes_and_cannot_open_them(tmp_path):
    engine, log = make_engine(tmp_path, "sealed")
    engine.protocol.all_gather(engine, 0, "model", model_of)
    engine.close()
    stored = (tmp_path / "payloads.bin").read_bytes()
    plain = serialize_payload(model_of(engine.clients[0]))
    weight_bytes = model_of(engine.clients[0])["weight"].tobytes()
    assert plain not in stored and weight_bytes not in stored
    sealed = seal_payload(model_of(engine.clients[0]), header(), engine.clients[0].identity,
                          engine.clients[0].sealing, engine.sealing_public)
    with pytest.raises(ProtocolError, match="authentication"):
        open_as_client_2(engine, sealed, key=engine.sealing_keys[SERVER])
    assert all("sealed" in r["stages"] for r in records(log) if r["kind"] == "model")


def test_a_model_forged_by_the_server_or_replayed_into_another_round_is_rejected(tmp_path):
    engine, _ = make_engine(tmp_path, "sealed")
    forged = seal_payload(model_of(engine.clients[0]), header(), engine.identities[SERVER],
                          engine.sealing_keys[SERVER], engine.sealing_public)
    with pytest.raises(ProtocolError):
        open_as_client_2(engine, forged)
    genuine = seal_payload(model_of(engine.clients[0]), header(), engine.clients[0].identity,
                           engine.clients[0].sealing, engine.sealing_public)
    opened = open_as_client_2(engine, genuine)
    np.testing.assert_array_equal(opened["bias"], model_of(engine.clients[0])["bias"])
    with pytest.raises(ProtocolError):
        open_as_client_2(engine, genuine, round_=1)


def test_an_upload_altered_in_transit_is_rejected_and_the_rest_still_arrives(tmp_path):
    faults = FaultPlan(faults=(Fault("corrupt", "client-1", "upload", (0,)),))
    engine, _ = make_engine(tmp_path / "next", "sealed", faults)
    gathered = engine.protocol.all_gather(engine, 1, "model", model_of)
    assert all(len(peers) == 2 for peers in gathered.values())
    faults = FaultPlan(faults=(Fault("corrupt", "client-1", "upload", (0,)),))
    engine, log = make_engine(tmp_path, "sealed", faults)
    gathered = engine.protocol.all_gather(engine, 0, "model", model_of)
    assert sorted(gathered["client-1"]) == ["client-2", "client-3"]
    assert sorted(gathered["client-2"]) == ["client-3"]
    engine.close()
    rejected = [r for r in records(log) if r.get("event") == "rejected"]
    assert len(rejected) == 1 and "altered" in rejected[0]["detail"]


def test_a_relayed_copy_for_one_peer_does_not_open_for_another(tmp_path):
    engine, _ = make_engine(tmp_path, "sealed")
    sealer = engine.protocol.stage_for("sealed", "model")
    data = sealer.seal(engine, model_of(engine.clients[0]), "model", 0, "relay", "client-1",
                       ["client-2", "client-3"])
    copy = sealer.relay(data, "client-2", "client-1")
    assert sealer.open(engine, copy, "model", 0, "relay", "client-1", "client-2")["bias"][1] == 1
    with pytest.raises(ProtocolError):
        sealer.open(engine, copy, "model", 0, "relay", "client-1", "client-3")


def test_send_seals_for_one_recipient_and_refuses_an_aggregated_kind(tmp_path):
    engine, log = make_engine(tmp_path, "sealed")
    received = engine.protocol.send(engine, 0, "upload", "model", "client-2", SERVER,
                                    model_of(engine.clients[1]))
    np.testing.assert_array_equal(received["weight"], model_of(engine.clients[1])["weight"])
    secagg, _ = make_engine(tmp_path / "other", "secagg")
    with pytest.raises(ProtocolError, match="only learn its sum"):
        secagg.protocol.send(secagg, 0, "upload", "gradient", "client-1", SERVER,
                             {"g": np.zeros(3, np.float32)})


def test_dp_sealed_marks_models_as_dp_trained_and_sealed(tmp_path):
    protocol = load_protocol("dp-sealed")
    assert protocol.dp_for("model") is not None
    assert protocol.client_stages("model") == ("dp",)
    assert protocol.stage_for("sealed", "model") is not None
    assert protocol.stage_for("sealed", "gradient") is None
