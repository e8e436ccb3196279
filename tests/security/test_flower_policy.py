"""The server side of a Flower run against a node that pinned its own policy (issue 37).

Adversary: whoever submits the Flower run config (the ServerApp's operator). On Flower the run
config reaches every node, and before issue 37 a node took its protocol, DP target, clip and
threshold from it: a run config naming ``plaintext`` made nodes pinned to ``dp-secagg`` upload
their raw float32 gradients, and one naming a weaker epsilon, a spec with a larger clip or a
lower threshold made them train and mask under the server's parameters. Each attack here ran to
completion on that code (the run finished, the nodes' uploads under ``plaintext`` carried no
stage and parsed as float32 gradients), and is refused by name since: the node compares the run
config with its policy file, read from its own disk, before it builds anything.

The policy file is written here by hand, as a hospital would, with the protocol's digest
computed here from the spec's TOML (sha256 of its sorted-key compact JSON), independently of
secureffm's own digest function.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from secureffm.errors import SecureFFMError
from secureffm.federation.keyfiles import provision
from secureffm.runs import flower_node, flower_server

from ..runs.test_flower_node import (
    CLIENTS,
    Nodes,
    broadcast,
    config,
    node_configs,
    payloads,
    pinning,
)

SPEC = "dp-secagg"


def spec_digest(text: str) -> str:
    """sha256 of a protocol spec's canonical bytes: its name, description and stages as
    sorted-key compact JSON."""
    table = tomllib.loads(text)
    body = {"name": table["name"], "description": table.get("description", ""),
            "stages": table["stages"]}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def shipped(name: str) -> str:
    return (resources.files("secureffm.specs") / "protocols" / f"{name}.toml").read_text()


def hospital_policy(path: Path) -> Path:
    """What a hospital pins for the tiny GOT run of tests/runs/test_flower_node.py under
    dp-secagg: the spec by digest, epsilon 8 at delta 1e-5 by the RDP accountant, clip 1,
    sigma 1, threshold 0.6."""
    path.write_text(f'''
protocol = "{SPEC}"
protocol_sha256 = "{spec_digest(shipped(SPEC))}"
method = "got"
rounds = 3
target_epsilon = 8.0
delta = 1e-5
clip = 1.0
noise_multiplier = 1.0
accountant = "rdp"
threshold = 0.6
kinds = ["dual_update", "gradient"]
''')
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, CLIENTS)
    return folder


def edited_spec(path: Path, old: str, new: str) -> str:
    """A copy of dp-secagg's spec with ``old`` replaced by ``new``, as the server names it."""
    text = shipped(SPEC)
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("attack, fields", [
    ("plaintext", ["protocol", "protocol_sha256", "target_epsilon", "clip", "threshold"]),
    ("weaker epsilon", ["target_epsilon"]),
    ("larger clip", ["protocol_sha256", "clip"]),
    ("lower threshold", ["protocol_sha256", "threshold"]),
])
def test_a_node_refuses_a_run_config_that_differs_from_its_policy(tmp_path, keys, attack,
                                                                   fields):
    """The server submits the run with one protection changed; every node refuses it by name,
    listing each field that differs with both values, before its first reply: no upload
    leaves it. (Before issue 37: the run completed and, under ``plaintext``, every upload was
    a bare float32 gradient.)"""
    honest = config(tmp_path / "run", SPEC)
    served = {"plaintext": replace(honest, protocol="plaintext", noise_multiplier=0.0),
              "weaker epsilon": replace(honest, target_epsilon=16.0),
              "larger clip": replace(honest, protocol=edited_spec(
                  tmp_path / "clip.toml", "clip = 1.0", "clip = 100.0")),
              "lower threshold": replace(honest, protocol=edited_spec(
                  tmp_path / "threshold.toml", "threshold = 0.6", "threshold = 0.51"))}[attack]
    policy = hospital_policy(tmp_path / "policy.toml")
    nodes = Nodes(flower_node.run_config_of(served, keys), rebuild=True,
                  nodes=node_configs(keys, tmp_path / "journals", policy))
    try:
        with pytest.raises(SecureFFMError, match=r"client-1 refuses the run") as refused:
            flower_server.main(nodes, nodes.run_config)
    finally:
        flower_node._LAST.clear()
    uploads = [data for _, data, _ in payloads(nodes) if data is not None]
    assert uploads == []  # nothing left a node
    message = str(refused.value)
    for field in fields:
        assert f"{field}:" in message, message
    assert str(policy) in message


def test_a_node_uses_no_path_the_run_config_names(tmp_path, keys):
    """The server's run config names a keys folder and a folder for the clients' journals.
    Before issue 37 a node without ``keys`` and ``journal`` in its own config loaded its
    pinned registry and key file from the first and created the second (``planted/`` and
    ``client-1.jsonl`` in it). Now both are mandatory node config: refused by name, and
    nothing is created at the server's path."""
    run = config(tmp_path / "run", SPEC)
    planted = tmp_path / "planted"
    carried = {**flower_node.run_config_of(run, keys), "secureffm-journals": str(planted)}
    node = {"client-id": "client-1", "policy": str(hospital_policy(tmp_path / "policy.toml"))}
    with pytest.raises(SecureFFMError, match="client-1's node config lacks keys, journal"):
        flower_node.serve(node, carried, None, broadcast(keys, "client-1"))
    flower_node._LAST.clear()
    assert not planted.exists()


def ask_alone(tmp_path: Path, keys: Path, kind: str, action: str, round_: int = 1,
              spec: str = SPEC):
    """A node pinned to the tiny GOT run under ``spec``, served the run config it pinned, then
    asked (with a fresh signed model) to compute its gradient of ``round_`` and send it as
    ``kind`` through ``action``; its decoded reply."""
    import numpy as np

    from secureffm.federation.channel import Task
    from secureffm.federation.codec import decode_reply, encode_request
    from secureffm.federation.exchange import Incoming, Request
    from secureffm.federation.keyfiles import load_party_keys
    from secureffm.federation.message import SERVER, serialize_payload
    from secureffm.federation.parties import Party

    run = config(tmp_path / "run", spec)
    carried = flower_node.run_config_of(run, keys)
    policy = hospital_policy(tmp_path / "policy.toml") if spec == SPEC else pinning(
        run, tmp_path / "policy.toml")
    node = {"client-id": "client-1", "keys": str(keys), "journal": str(tmp_path / "j.jsonl"),
            "policy": str(policy)}
    flower_node._LAST.clear()
    state, _ = flower_node.serve(node, carried, None, broadcast(keys, "client-1"))
    [endpoint] = flower_node._LAST.values()
    size = sum(p.numel() for p in endpoint.client.state["velocity"].parameters())
    identity, sealing = load_party_keys(keys, SERVER)
    server = Party(SERVER, identity=identity, sealing=sealing)
    model = serialize_payload({"theta": np.zeros(size, dtype=np.float32)})
    envelope = server.envelope(round_, "broadcast", "global_model", "client-1", model)
    args = {"compute": Task("ffm.velocity", {"round": round_})}
    if action == "gather.upload":
        args["peers"] = ["client-2"]
    request = encode_request(Request(round_, kind, "upload", "upload", action, (), None, args,
                                     (envelope,)), None, (Incoming(envelope, model, 7),))
    _, frame = flower_node.serve(node, carried, state, request)
    flower_node._LAST.clear()
    return decode_reply(frame, "client-1")


@pytest.mark.parametrize("action", ["upload", "send", "gather.upload"])
def test_a_node_refuses_to_send_alone_a_kind_its_protocol_aggregates(tmp_path, keys, action):
    """Adversary: a server that keeps the run config the node pinned (dp-secagg) but asks,
    with a fresh signed model, for the client's gradient through a plain upload (or an
    individual send, or a gather) instead of secure aggregation. Before issue 37 the node
    answered with its noised float32 gradient in the clear (no stage): the server held one
    client's update where the protocol promises only the sum. Now the client refuses in a
    signed ``rejected`` event naming the kind and the aggregating stage, and sends nothing."""
    reply = ask_alone(tmp_path, keys, "gradient", action)
    assert reply.envelope is None, "the client sent its gradient outside secure aggregation"
    [event] = reply.events
    assert event["event"] == "rejected" and "'gradient'" in event["detail"]
    assert "'secagg'" in event["detail"]


def test_a_node_answers_only_the_kinds_its_policy_names(tmp_path, keys):
    """Adversary: the same server asks for the gradient under another kind, ``model``, which
    dp-secagg does not aggregate. Before the per-request check the node uploaded its gradient
    as a ``model`` in the clear. Now a request of a kind outside the policy's ``kinds`` (other
    than a message the client only receives) is refused in a signed ``rejected`` event."""
    reply = ask_alone(tmp_path, keys, "model", "upload")
    assert reply.envelope is None, "the client sent its gradient as a model in the clear"
    [event] = reply.events
    assert event["event"] == "rejected"
    assert "kind 'model'" in event["detail"] and "policy" in event["detail"]


def test_a_node_answers_no_round_past_the_runs_last(tmp_path, keys):
    """Adversary: a server that keeps the pinned run config (GOT under ``dp``, 3 rounds) and
    asks for a gradient of round 50: one more DP release than the epsilon the run was
    calibrated for. Before the per-request bound the node computed and sent it. Now a request
    of a round past the run's last (its policy's ``rounds``) is refused in a signed event."""
    reply = ask_alone(tmp_path, keys, "gradient", "upload", round_=50, spec="dp")
    assert reply.envelope is None, "the client released a gradient of round 50 of 3"
    [event] = reply.events
    assert event["event"] == "rejected" and "round 50" in event["detail"]
    (tmp_path / "within").mkdir()
    within = ask_alone(tmp_path / "within", keys, "gradient", "upload", round_=3, spec="dp")
    assert within.envelope is not None and within.events == ()
