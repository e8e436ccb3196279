"""A SuperNode's restart and a stolen SuperNode key, in a deployment with TLS and SuperNode
authentication on (``LocalDeployment(tls=True)``: a fresh CA, ``--enable-supernode-auth``, each
node's key registered with ``flwr supernode register``), FFM-GOT under ``dp-secagg``.

Flower ties a registered node's id to its public key: a SuperNode that starts with a
registered key becomes that node again (``ActivateNode``), and the SuperLink activates a node
only while it is not online (Flower 1.42's ``LinkState.activate_node``). So a node restarted
with its key is the same Flower node (no signed hello is asked: the server's map is unchanged),
and whoever holds a registered node's key receives that node's messages once the real node is
down. Truths used: the SuperLink's node list (``flwr supernode ls``), the SuperNodes' logs, the
run's messages.jsonl, its audit against the pin, and the intruder's own journal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from secureffm.audit.verify import verify_run
from secureffm.config import RunConfig
from secureffm.errors import ConfigError, DataError
from secureffm.federation.flower import LocalDeployment
from secureffm.federation.flower_tls import AUTH_KEY_FILE
from secureffm.federation.keyfiles import provision
from secureffm.federation.pin import RunPin
from secureffm.runs import flower_node, flower_server
from secureffm.runs.flower_node import run_config_of
from secureffm.runs.flower_policy import policy_of, write_policy
from tests.runs.test_flower_node import CLIENTS as NODE_CLIENTS
from tests.runs.test_flower_node import Nodes, dcfm_config, node_configs, pinning

CLIENTS = ["client-1", "client-2", "client-3"]
VICTIM = "client-3"


def _setup(tmp_path: Path, rounds: int) -> tuple[RunConfig, Path, dict[str, dict]]:
    """The run (the smallest GOT under dp-secagg), the server's keys folder and each node's
    config (its keys, its pinned policy, its journal)."""
    keys = tmp_path / "keys"
    provision(keys, CLIENTS)
    config = RunConfig(method="got", protocol="dp-secagg", clients=3, partition="iid",
                       shard_size=64, batch_size=16, rounds=rounds, hidden=16,
                       potential_hidden=16, candidates=16, eval_samples=100, nfe=(1,),
                       trajectories=10, progress=False, device="cpu", phase_timeout=120.0,
                       out=str(tmp_path / "run"))
    write_policy(policy_of(config), tmp_path / "policy.toml")
    nodes = {cid: {"keys": str(keys), "policy": str(tmp_path / "policy.toml"),
                   "journal": str(tmp_path / "journals" / f"{cid}.jsonl")} for cid in CLIENTS}
    return config, keys, nodes


def _nodes(deployment: LocalDeployment) -> dict[str, str]:
    """Flower node id -> status, as the SuperLink lists its nodes."""
    listed = json.loads(deployment._flwr("supernode", "ls", "local", "--format", "json"))
    return {node["node-id"]: node["status"] for node in listed["nodes"]}


def _until_online(deployment: LocalDeployment, online: int) -> None:
    """Wait until the SuperLink lists ``online`` nodes online (a killed node stays listed
    online until it misses its heartbeats, Flower: 2 x 30 s, and is not activated again
    before)."""
    deadline = time.monotonic() + 900  # a guard against a hang, not a measured bound
    while list((listed := _nodes(deployment)).values()).count("online") != online:
        assert time.monotonic() < deadline, f"never {online} nodes online: {listed}"
        time.sleep(2)


def _records(result: dict) -> list[dict]:
    folder = Path(result["out"])
    return [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]


def _audited(result: dict) -> None:
    report = verify_run(Path(result["out"]), RunPin(head=result["pin"]["head"]))
    assert report.ok, report.first_bad


@pytest.mark.slow
def test_a_supernode_killed_under_tls_and_node_auth_comes_back_with_its_key_as_itself(
        tmp_path):
    """Adversary and fault: a client whose registered SuperNode dies while it computes round
    1's masked input and is started again with its same registered key, over TLS. Started once
    the SuperLink lists it offline (before, its key's node is not activated again: the next
    test), it becomes the same Flower node (three node ids listed, all online: no fourth),
    rebuilds its client from its sealed state on its own disk and is counted again in round 2;
    round 1 keeps the survivors' exact sum, and the log audits against the pin."""
    pytest.importorskip("flwr")
    config, keys, nodes = _setup(tmp_path, rounds=2)
    hold = tmp_path / "held"
    nodes[VICTIM] |= {"fault-hold": "1:secagg.mask", "fault-hold-file": str(hold)}
    started = time.monotonic()
    with LocalDeployment("secureffm.runs.flower_server:main",
                         "secureffm.runs.flower_node:serve", CLIENTS, node_config=nodes,
                         home=str(tmp_path / "flower"), start_timeout=300, tls=True,
                         admit="secureffm.runs.flower_node:hello") as deployment:
        out = deployment.submit(run_config_of(config, keys))
        while not hold.exists():
            assert time.monotonic() - started < 1500, "round 1's masked input never came"
            time.sleep(0.5)
        before = _nodes(deployment)
        deployment.kill(VICTIM)
        _until_online(deployment, len(CLIENTS) - 1)
        del deployment.node_config[VICTIM]["fault-hold"]
        deployment.restart(VICTIM)  # with the key registered at its first start
        _until_online(deployment, len(CLIENTS))
        after = _nodes(deployment)
        result = deployment.wait(out, timeout=1500)
    print(f"deployment run: {time.monotonic() - started:.0f} s")
    assert sorted(after) == sorted(before) and set(after.values()) == {"online"}
    records = _records(result)
    counted = {r["round"]: r["included"] for r in records
               if r.get("event") == "aggregated" and r["of_kind"] == "gradient"}
    assert counted == {1: ["client-1", "client-2"], 2: CLIENTS}
    assert {r["party"] for r in records if r.get("event") == "dropped"} == {VICTIM}
    assert result["metrics"]["aborted_aggregations"] == 0
    _audited(result)
    assert list((tmp_path / "journals").glob(f"{VICTIM}.*.state"))  # its sealed state


def _exit_305(node, log: Path, since: int) -> str:
    """The SuperNode ``node`` gave up with Flower's exit code 305; its log from ``since``."""
    assert node.wait(timeout=300) != 0
    text = log.read_text()[since:]
    assert "Exit Code: 305" in text, text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("own_key", [True, False])
def test_a_stolen_supernode_key_receives_the_clients_requests_but_is_never_counted(tmp_path,
                                                                                    own_key):
    """Adversary: whoever stole a registered SuperNode's authentication private key (and holds
    ca.pem), but not its client's secureffm key file. While the real node is online the
    SuperLink refuses to activate the key a second time; once the real node is down (killed
    before the run), the intruder starts a SuperNode with the stolen key and becomes that
    Flower node: the server's hello (unsigned) maps client-3 to it and it receives client-3's
    requests. It runs the run's ClientApp as client-3 with the run's parties.json and policy and
    either a key file of its own making (``own_key``) or none. Its replies are not signed with
    the key parties.json pins for client-3, so the server refuses each by name and logs the
    refusal; it is never counted, the round gives the survivors' exact sum and the log audits.
    Keyless, it refuses the run at the hello and the run stops there, naming it."""
    pytest.importorskip("flwr")
    config, keys, nodes = _setup(tmp_path, rounds=1)
    home = tmp_path / "flower"
    own = tmp_path / "intruder"
    own.mkdir()
    intruder = {"policy": str(tmp_path / "policy.toml"), "journal": str(own / "client-3.jsonl")}
    if own_key:
        provision(tmp_path / "made", CLIENTS)  # its own client-3 key, beside the pinned registry
        (own / "client-3.key").write_bytes((tmp_path / "made" / "client-3.key").read_bytes())
        (own / "parties.json").write_bytes((keys / "parties.json").read_bytes())
        intruder["keys"] = str(own)
    with LocalDeployment("secureffm.runs.flower_server:main",
                         "secureffm.runs.flower_node:serve", CLIENTS, node_config=nodes,
                         home=str(home), start_timeout=300, tls=True,
                         admit="secureffm.runs.flower_node:hello") as deployment:
        stolen = home / f"auth-{VICTIM}" / AUTH_KEY_FILE
        _until_online(deployment, len(CLIENTS))
        before = _nodes(deployment)
        real, log = deployment.processes[VICTIM], home / f"{VICTIM}.log"
        since = len(log.read_text())
        refused = _exit_305(deployment.start_node(VICTIM, stolen), log, since)
        deployment.processes[VICTIM] = real  # the real node is still up
        assert "[code: 2004] Failed to activate SuperNode" in refused
        assert "could not be activated" in (home / "superlink.log").read_text()
        deployment.kill(VICTIM)
        _until_online(deployment, len(CLIENTS) - 1)
        deployment.node_config[VICTIM] = intruder
        deployment.start_node(VICTIM, stolen)
        _until_online(deployment, len(CLIENTS))
        assert _nodes(deployment) == before  # the intruder is client-3's Flower node
        started = time.monotonic()
        out = deployment.submit(run_config_of(config, keys))
        if not own_key:  # it refuses the run at the hello: nothing ran, nothing was logged
            with pytest.raises(ConfigError, match="client-3's node config lacks keys"):
                deployment.wait(out, timeout=900)
            assert not Path(config.out).exists()
            return
        result = deployment.wait(out, timeout=900)
    print(f"deployment run: {time.monotonic() - started:.0f} s")
    records = _records(result)
    assert [r["detail"] for r in records if r.get("party") == VICTIM] == [
        "the gradient+dual_update message in the reply of client-3 is not signed by client-3",
        "dropped before advertising keys"]  # both kinds in one secure aggregation
    assert not [r for r in records if r["sender"] == VICTIM]
    counted = {(r["round"], r["of_kind"]): r["included"] for r in records
               if r.get("event") == "aggregated"}
    assert counted == {(1, "gradient"): ["client-1", "client-2"],
                       (1, "dual_update"): ["client-1", "client-2"]}
    assert result["metrics"]["aborted_aggregations"] == 0
    _audited(result)  # the survivors' inputs unmasked exactly, from the log alone
    journal = [json.loads(line) for line in (own / "client-3.jsonl").read_text().splitlines()]
    # what it kept: at most the server's public models, no share, no mask
    received = {line["record"]["kind"] for line in journal if line["direction"] == "received"}
    assert received <= {"global_model", "global_potential"}


def test_a_stolen_node_key_holder_cannot_open_a_model_sealed_to_its_client(tmp_path):
    """Adversary: the stolen key's holder of the test above, under ``sealed`` (DCFM-A's
    all-gather), where the server relays to client-2 the peers' models sealed to client-2's
    X25519 key in parties.json. Flower hands it client-2's requests (the deployment test
    shows it); here the server's process drives it without Flower (tests/runs/test_flower_node's
    loopback). It holds a key file of its own making: it opens none of the sealed models
    (refused by name in its own journal), none of its replies is signed by client-2, and
    client-2 is counted nowhere; the log audits."""
    run = dcfm_config(tmp_path / "run", "dcfm-a", "sealed")
    keys, made, own = tmp_path / "keys", tmp_path / "made", tmp_path / "intruder"
    provision(keys, NODE_CLIENTS)
    provision(made, NODE_CLIENTS)
    own.mkdir()
    (own / "client-2.key").write_bytes((made / "client-2.key").read_bytes())
    (own / "parties.json").write_bytes((keys / "parties.json").read_bytes())
    policy = pinning(run, tmp_path / "policy.toml")
    configs = node_configs(keys, tmp_path / "journals", policy)
    configs["client-2"] |= {"keys": str(own), "journal": str(own / "client-2.jsonl")}
    flower_node._LAST.clear()
    nodes = Nodes(flower_node.run_config_of(run, keys), False, configs)
    try:  # the experts' composition needs a holder of every label value: client-2's is absent
        with pytest.raises(DataError, match="no client holds"):
            flower_server.main(nodes, nodes.run_config)
    finally:
        flower_node._LAST.clear()
    records = [json.loads(line) for line in
               (Path(run.out) / "messages.jsonl").read_text().splitlines()]
    relayed = [r["seq"] for r in records if r["recipient"] == "client-2" and r["kind"] == "model"]
    journal = [json.loads(line) for line in (own / "client-2.jsonl").read_text().splitlines()]
    received = [line["record"]["seq"] for line in journal if line["direction"] == "received"]
    opened = [line["record"]["detail"] for line in journal if line["direction"] == "event"]
    assert relayed and received == relayed  # it got every model sealed to client-2 ...
    assert opened == ["client-2 rejected model message of client-1: ciphertext failed "
                      "authentication (wrong key, context or tampered bytes)"] * len(relayed)
    refused = [r["detail"] for r in records if r.get("party") == "client-2"]
    assert refused.count("the model message in the reply of client-2 is not signed by "
                         "client-2") == run.dcfm_rounds + 1  # stage I and each DCFM-A round
    assert not [r for r in records if r["sender"] == "client-2"]  # ... and none of its own
    assert records[-1]["event"] == "closed"
    report = verify_run(Path(run.out))
    assert report.ok, report.first_bad
