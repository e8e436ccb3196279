"""A client's own process on Flower (secureffm/runs/flower_node.py), and the server's process
(secureffm/runs/flower_server.py) driving such nodes, without Flower: a loopback ``calls``
object (``hello`` + ``call``) that hands each request to
:func:`~secureffm.runs.flower_node.serve` with the node's saved state, as Flower's ClientApp does
(tests/federation/test_flower.py tests Flower's carriage of the bytes).

The proof that a client's snapshot holds everything that matters: serving every message from
a client rebuilt from its key file, its shard and its saved bytes (the in-process cache
``flower_node._LAST`` cleared before each message) gives the same replies and the same run as
serving from the live objects, and as the in-process engine (``run_ffm``, ``run_dcfm``) on the
same seeded config. Truths used: the in-process engine, the public data recipe (make_shards), the
provisioned key files, and the run folders' messages.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from secureffm.config import RunConfig
from secureffm.data.pairs import get_pair, make_shards
from secureffm.errors import ConfigError
from secureffm.federation.codec import decode_reply, encode_request
from secureffm.federation.exchange import Incoming, Request
from secureffm.federation.keyfiles import load_party_keys, load_registry, provision
from secureffm.federation.message import SERVER, serialize_payload
from secureffm.federation.node_state import NodeState
from secureffm.federation.parties import Party
from secureffm.runs import flower_node, flower_server
from secureffm.runs.dcfm import run_dcfm
from secureffm.runs.fedwad import FedWADRun
from secureffm.runs.ffm import run_ffm
from secureffm.runs.flower_policy import policy_of, write_policy
from secureffm.runs.scaffold import JOURNALS_DIR

CLIENTS = ["client-1", "client-2"]
LOGGED = ("round", "phase", "kind", "sender", "recipient", "bytes", "stages")


def config(out: Path, protocol: str = "plaintext") -> RunConfig:
    """A tiny seeded FFM-GOT run (a fixed noise multiplier skips the DP calibration search,
    which each rebuilt client would otherwise repeat)."""
    dp = {"noise_multiplier": 1.0} if protocol.startswith("dp") else {}
    return RunConfig(method="got", protocol=protocol, clients=len(CLIENTS), rounds=3,
                     shard_size=64, batch_size=32, candidates=16, eval_samples=100, nfe=(1, 2),
                     hidden=16, potential_hidden=16, potential_every=2, trajectories=10,
                     progress=False, device="cpu", insecure_deterministic=True, out=str(out),
                     **dp)


def node_configs(keys: Path, journals: Path, policy: Path) -> dict[str, dict]:
    """Each client's node config (``partition-id`` i for client-(i+1)): its keys folder, its
    journal and its policy file."""
    return {cid: {"partition-id": i, "keys": str(keys), "journal": str(journals / f"{cid}.jsonl"),
                  "policy": str(policy)} for i, cid in enumerate(CLIENTS)}


def pinning(run: RunConfig | FedWADRun, path: Path) -> Path:
    """A policy file at ``path`` that pins ``run`` as given (what an honest node agrees to)."""
    write_policy(policy_of(run), path)
    return path


def own(folder: Path, keys: Path, run: RunConfig | FedWADRun, **node) -> dict:
    """One node's config (``node``: its client-id or partition-id, more keys) with its keys
    folder, a journal in ``folder`` and a policy file there pinning ``run``."""
    cid = node.get("client-id") or f"client-{node['partition-id'] + 1}"
    return {"keys": str(keys), "journal": str(folder / f"{cid}.jsonl"),
            "policy": str(pinning(run, folder / "policy.toml")), **node}


class Nodes:
    """What Flower does for the server's process, in this process: each client id a node
    (config ``nodes[cid]``) whose saved state the loopback keeps between its calls, as a
    ClientApp's context does. ``rebuild``: clear the in-process cache before each message, so
    every message is served by a client rebuilt from its node and its bytes."""

    def __init__(self, run_config: dict, rebuild: bool, nodes: dict[str, dict]):
        self.run_config = run_config
        self.rebuild = rebuild
        self.nodes = nodes
        self.state: dict[str, bytes] = {}
        self.replies: list[tuple[str, bytes]] = []

    def hello(self, timeout: float, clients: int = 0) -> dict[str, int]:
        return {cid: node for node, cid in enumerate(CLIENTS)}

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        out = {}
        for cid, frame in requests.items():
            if self.rebuild:
                flower_node._LAST.clear()
            self.state[cid], out[cid] = flower_node.serve(self.nodes[cid], self.run_config,
                                                          self.state.get(cid), frame)
            self.replies.append((cid, out[cid]))
        return out


def on_nodes(run: RunConfig, keys: Path, rebuild: bool) -> tuple[dict, Nodes]:
    flower_node._LAST.clear()
    out = Path(run.out)
    policy = pinning(run, out.parent / f"{out.name}-policy.toml")
    nodes = Nodes(flower_node.run_config_of(run, keys), rebuild,
                  node_configs(keys, out / JOURNALS_DIR, policy))
    done = flower_server.main(nodes, nodes.run_config)
    flower_node._LAST.clear()
    return done, nodes


def logged(folder: Path) -> list[tuple]:
    lines = (folder / "messages.jsonl").read_text().splitlines()
    return [tuple(json.dumps(json.loads(line).get(k)) for k in LOGGED) for line in lines]


def payloads(nodes: Nodes) -> list[tuple[str, bytes | None, tuple]]:
    """Each reply's message bytes and its events' content (without signatures)."""
    out = []
    for cid, frame in nodes.replies:
        reply = decode_reply(frame, cid)
        events = tuple(json.dumps({k: v for k, v in e.items() if k != "sig"}, sort_keys=True)
                       for e in reply.events)
        out.append((cid, None if reply.envelope is None else reply.envelope.data, events))
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, CLIENTS)
    return folder


@pytest.fixture(scope="module")
def plaintext(tmp_path_factory, keys):
    """The plaintext run three ways: nodes with the cache kept, nodes rebuilt for every
    message, and the in-process engine."""
    root = tmp_path_factory.mktemp("plaintext")
    kept = on_nodes(config(root / "kept"), keys, rebuild=False)
    rebuilt = on_nodes(config(root / "rebuilt"), keys, rebuild=True)
    return root, kept, rebuilt, run_ffm(config(root / "in-process"))


@pytest.fixture(scope="module")
def dp_secagg(tmp_path_factory, keys):
    """dp-secagg with every message served by a rebuilt client, and in-process."""
    root = tmp_path_factory.mktemp("dp-secagg")
    rebuilt = on_nodes(config(root / "rebuilt", "dp-secagg"), keys, rebuild=True)
    return root, rebuilt, run_ffm(config(root / "in-process", "dp-secagg"))


@pytest.fixture(scope="module")
def dp_secagg_once(tmp_path_factory, keys):
    """dp-secagg-once (keys agreed once) with every message served by a rebuilt client, and
    in-process."""
    root = tmp_path_factory.mktemp("dp-secagg-once")
    rebuilt = on_nodes(config(root / "rebuilt", "dp-secagg-once"), keys, rebuild=True)
    return root, rebuilt, run_ffm(config(root / "in-process", "dp-secagg-once"))


@pytest.fixture(scope="module")
def he(tmp_path_factory, keys):
    """he (CKKS) with every message served by a rebuilt client, and in-process."""
    root = tmp_path_factory.mktemp("he")
    rebuilt = on_nodes(config(root / "rebuilt", "he"), keys, rebuild=True)
    return root, rebuilt, run_ffm(config(root / "in-process", "he"))


def test_rebuilt_clients_answer_byte_for_byte_as_kept_ones(plaintext):
    """Plaintext replies are a function of the client's state alone, so equal payloads show
    the snapshot carried everything the next message needed (streams, replicas' inputs, DP
    and training generators, inbox)."""
    _, (_, kept), (_, rebuilt), _ = plaintext
    assert len(kept.replies) == len(rebuilt.replies) > 0
    uploads = [data for _, data, _ in payloads(kept) if data is not None]
    assert len(uploads) >= 2 * 3  # every client uploaded in every round
    assert payloads(rebuilt) == payloads(kept)
    assert [frame for _, frame in rebuilt.replies] == [frame for _, frame in kept.replies]


def test_the_runs_on_nodes_equal_the_in_process_run_under_plaintext(plaintext):
    root, (kept, _), (rebuilt, _), in_process = plaintext
    assert rebuilt["metrics"]["eval"]["w2"] == kept["metrics"]["eval"]["w2"]
    for nfe, w2 in in_process.metrics["eval"]["w2"].items():
        assert rebuilt["metrics"]["eval"]["w2"][nfe] == pytest.approx(w2, rel=1e-5)
    assert logged(root / "rebuilt") == logged(root / "kept") == logged(root / "in-process")


def test_the_run_on_rebuilt_nodes_equals_the_in_process_run_under_dp_secagg(dp_secagg):
    """Secure aggregation's masks are fresh OS entropy, so replies differ from run to run;
    the unmasked sums do not, and neither do the DP noise and batches the snapshots carry
    (seeded streams): the W2 table and every logged record's shape must be equal."""
    root, (rebuilt, _), in_process = dp_secagg
    for nfe, w2 in in_process.metrics["eval"]["w2"].items():
        assert rebuilt["metrics"]["eval"]["w2"][nfe] == pytest.approx(w2, rel=1e-5)
    records = logged(root / "rebuilt")
    assert records == logged(root / "in-process")
    assert {json.loads(r[1]) for r in records} >= {"masked_input", "unmask"}
    assert rebuilt["metrics"]["aborted_aggregations"] == 0


@pytest.mark.slow
def test_secagg_keys_agreed_once_serve_every_round_on_rebuilt_nodes(dp_secagg_once):
    """Under setup = "once" a client keeps its pair secrets and the round it last masked in
    across messages (its saved state): the run on rebuilt nodes sets up once per kind and
    equals the in-process run (W2, every logged record's shape) and its log passes the
    audit. Slow (about 15 s): test_secagg_epoch.py restores clients from saved state in the
    default suite."""
    from secureffm.audit.verify import verify_run

    assert verify_run(dp_secagg_once[0] / "rebuilt").ok
    root, (rebuilt, _), in_process = dp_secagg_once
    for nfe, w2 in in_process.metrics["eval"]["w2"].items():
        assert rebuilt["metrics"]["eval"]["w2"][nfe] == pytest.approx(w2, rel=1e-5)
    records = logged(root / "rebuilt")
    assert records == logged(root / "in-process")
    set_ups = {(json.loads(r[0]), json.loads(r[2])) for r in records
               if json.loads(r[1]) == "keys_taken"}
    # the velocity's kind alone (rounds without a dual step) and GOT's joint kind
    assert {kind for _, kind in set_ups} == {"gradient", "gradient+dual_update"}
    assert len(set_ups) == 2
    assert rebuilt["metrics"]["aborted_aggregations"] == 0


def test_a_ckks_key_set_up_once_serves_every_round_on_rebuilt_nodes(he):
    """The key holder makes the key in round 1 and every client's saved state carries it:
    a client rebuilt for each message still encrypts and decrypts under the same key (one
    he_keys upload for the run), and the W2 table is the in-process run's within CKKS
    error and flooding (encryption and flooding noise are fresh, so the sums differ at about
    1e-7). The sizes of the key messages and ciphertexts vary from run to run (SEAL compresses
    fresh random keys and the residues mod the 40-bit prime), so they are compared without
    them."""
    root, (rebuilt, _), in_process = he

    def shapes(folder: Path) -> list[tuple]:
        keyed = ('"he_keys"', '"relay"', '"upload"', '"he_sum"')
        return [r[:5] + ("",) + r[6:] if r[1] in keyed else r for r in logged(folder)]

    for nfe, w2 in in_process.metrics["eval"]["w2"].items():
        assert rebuilt["metrics"]["eval"]["w2"][nfe] == pytest.approx(w2, rel=1e-5)
    records = logged(root / "rebuilt")
    assert shapes(root / "rebuilt") == shapes(root / "in-process")
    phases = [json.loads(r[1]) for r in records]
    assert phases.count("he_keys") == 1 and phases.count("he_decrypted") >= 3
    assert rebuilt["metrics"]["aborted_aggregations"] == 0


def test_the_logs_of_runs_on_nodes_pass_the_audit(plaintext, dp_secagg, he):
    from secureffm.audit.verify import verify_run

    for folder in (plaintext[0] / "rebuilt", dp_secagg[0] / "rebuilt", he[0] / "rebuilt"):
        report = verify_run(folder)
        assert report.ok, report.summary()


# -- DCFM on nodes -----------------------------------------------------------------------------


def dcfm_config(out: Path, method: str, protocol: str) -> RunConfig:
    """A tiny seeded DCFM-family run on modes2d (tests/behaviour_cases.py's sizes; under DP a
    given noise multiplier, which skips the calibration search)."""
    dp = {"noise_multiplier": 4.0} if protocol.startswith("dp") else {}
    return RunConfig(method=method, protocol=protocol, data="modes2d", partition="disjoint",
                     clients=len(CLIENTS), shard_size=150, batch_size=32, hidden=16,
                     local_steps=6, dcfm_rounds=2, dcfm_steps=4, distill_steps=4,
                     teacher_steps=4, fedflow_rounds=2, fedflow_local_steps=2, eval_samples=50,
                     nfe=(4,), progress=False, device="cpu", insecure_deterministic=True,
                     out=str(out), **dp)


def _same_dcfm_run(on_nodes_metrics: dict, in_process: dict) -> None:
    """Every metric equal, save wall time and the clients' own training losses, which only
    the in-process engine reads (on nodes the report says they are absent)."""
    def public(metrics: dict) -> dict:
        return {k: v for k, v in metrics.items() if k not in ("train_seconds", "training")}

    assert public(on_nodes_metrics) == public(in_process)
    clients = ("stage_one_loss", "dcfm_a_loss")
    training = dict(on_nodes_metrics["training"])
    if any(k in clients for k in in_process["training"]):
        assert training.pop("client_losses").startswith("absent")
    assert training == {k: v for k, v in in_process["training"].items() if k not in clients}


@pytest.mark.parametrize("method, protocol", [("dcfm-a", "sealed"), ("dcfm-b", "dp-sealed"),
                                              ("ddm", "plaintext"), ("fedflow", "plaintext")])
def test_dcfm_on_rebuilt_nodes_is_the_in_process_run(tmp_path, keys, method, protocol):
    """Each client rebuilt from its key file, its labelled shard of the public recipe and its
    saved bytes (its expert, Adam state, EMA, DP and training streams, gathered peers) for
    every message: the same log records and the same metrics as the in-process run. Only named
    tasks cross (the codec refuses callables), so no step of a client runs server-side."""
    done, _ = on_nodes(dcfm_config(tmp_path / "nodes", method, protocol), keys, rebuild=True)
    local = run_dcfm(dcfm_config(tmp_path / "local", method, protocol))
    _same_dcfm_run(done["metrics"], local.metrics)
    assert logged(tmp_path / "nodes") == logged(tmp_path / "local")
    if protocol != "plaintext":
        assert all("sealed" in json.loads(row[6]) for row in logged(tmp_path / "nodes")
                   if json.loads(row[2]) == "model")
    assert json.loads((tmp_path / "nodes" / "privacy.json").read_text()) == json.loads(
        (tmp_path / "local" / "privacy.json").read_text())


def test_a_dcfm_node_holds_its_labelled_shard_of_the_public_recipe(tmp_path, keys):
    from secureffm.runs.dcfm import conditional_data

    cfg = dcfm_config(tmp_path / "unused", "dcfm-a", "sealed")
    run_config = flower_node.run_config_of(cfg, keys)
    shards = conditional_data(cfg).shards
    for index, cid in enumerate(CLIENTS):
        node = own(tmp_path, keys, cfg, **{"partition-id": index})
        _, _, endpoint = served(node, run_config, broadcast(keys, cid))
        torch.testing.assert_close(endpoint.client.data, shards[index][0], rtol=0, atol=0)
        assert torch.equal(endpoint.client.state["labels"], shards[index][1])
        assert set(endpoint.client.kept) == {"expert"}


def test_a_dcfm_node_refuses_client_data_it_cannot_label(tmp_path, keys):
    cfg = dcfm_config(tmp_path / "unused", "dcfm-a", "sealed")
    run_config = flower_node.run_config_of(cfg, keys)
    torch.save(torch.zeros(5, 2), tmp_path / "x.pt")
    node = own(tmp_path, keys, cfg, **{"partition-id": 0, "client-data": str(tmp_path / "x.pt")})
    with pytest.raises(ConfigError, match="no labels"):
        flower_node.serve(node, run_config, None, broadcast(keys, "client-1"))


# -- what a node rebuilds its client from ------------------------------------------------------


def broadcast(keys: Path, cid: str, round_: int = 1) -> bytes:
    """The server's signed broadcast to ``cid`` as a request frame."""
    identity, sealing = load_party_keys(keys, SERVER)
    server = Party(SERVER, identity=identity, sealing=sealing)
    data = serialize_payload({"w": np.arange(4, dtype=np.float32) + round_})
    envelope = server.envelope(round_, "broadcast", "model", cid, data)
    return encode_request(Request(round_, "model", "broadcast", "broadcast", "accept", (),
                                  envelope), Incoming(envelope, data, 0))


def served(node: dict, run_config: dict, request: bytes, state: bytes | None = None):
    """(new state, reply, the endpoint that answered)."""
    flower_node._LAST.clear()
    new_state, reply = flower_node.serve(node, run_config, state, request)
    [endpoint] = flower_node._LAST.values()
    snapshot = NodeState.from_bytes(new_state).snapshot
    assert list(flower_node._LAST) == [(endpoint.client.id, hashlib.sha256(snapshot).hexdigest())]
    flower_node._LAST.clear()
    return new_state, decode_reply(reply, endpoint.client.id), endpoint


def test_a_node_rebuilds_its_client_from_its_key_file_registry_and_shard(tmp_path, keys):
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    shards = make_shards(get_pair(cfg.data), cfg.clients, cfg.shard_size, cfg.partition,
                         cfg.seed, alpha=cfg.dirichlet_alpha, min_size=cfg.batch_size)
    registry = load_registry(keys)
    for index, cid in enumerate(CLIENTS):
        for given in ({"partition-id": index}, {"client-id": cid}):
            disk = tmp_path / f"{cid}-{next(iter(given))}"  # each node its own (no saved state)
            disk.mkdir()
            node = own(disk, keys, cfg, **given)
            _, reply, endpoint = served(node, run_config, broadcast(keys, cid))
            assert reply.envelope is None and reply.events == ()
            assert endpoint.client.id == cid
            torch.testing.assert_close(endpoint.client.data, shards[index], rtol=0, atol=0)
            assert endpoint.client.identity.public == registry.sign[cid]
            assert endpoint.client.sealing.public == registry.seal[cid]
            assert endpoint.registry == registry
    with pytest.raises(ConfigError, match=r"client-3\.key"):  # no keys provisioned for it
        served(own(tmp_path, keys, cfg, **{"client-id": "client-3"}), run_config,
               broadcast(keys, "client-3"))


def test_a_node_reads_its_own_data_file(tmp_path, keys):
    data = torch.randn(40, 2)
    torch.save(data, tmp_path / "shard.pt")
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    node = own(tmp_path, keys, cfg, **{"client-id": "client-2",
                                       "client-data": str(tmp_path / "shard.pt")})
    _, _, endpoint = served(node, run_config, broadcast(keys, "client-2"))
    torch.testing.assert_close(endpoint.client.data, data, rtol=0, atol=0)
    torch.save(torch.zeros(3), tmp_path / "flat.pt")
    with pytest.raises(ConfigError, match="must hold one tensor"):
        served({**node, "client-data": str(tmp_path / "flat.pt")}, run_config,
               broadcast(keys, "client-2"))


def test_a_rebuilt_node_keeps_its_inbox_and_refuses_a_replay(tmp_path, keys):
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    node = own(tmp_path, keys, cfg, **{"client-id": "client-1"})
    first = broadcast(keys, "client-1")
    state, _, _ = served(node, run_config, first)
    state, reply, endpoint = served(node, run_config, first, state)
    assert reply.envelope is None
    assert ["duplicate or replayed" in e["detail"] for e in reply.events] == [True]
    np.testing.assert_array_equal(endpoint.client.inbox["model"]["w"],
                                  np.arange(4, dtype=np.float32) + 1)


class Planted:
    """A pickle whose loading would run a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_client_data_file_holding_a_pickle_is_not_run(tmp_path, keys):
    torch.save(Planted(tmp_path / "ran"), tmp_path / "planted.pt")
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    node = own(tmp_path, keys, cfg, **{"client-id": "client-1",
                                       "client-data": str(tmp_path / "planted.pt")})
    with pytest.raises(Exception):  # noqa: B017 - refused; which error is the next test
        served(node, run_config, broadcast(keys, "client-1"))
    assert not (tmp_path / "ran").exists()


def test_a_client_data_file_holding_a_pickle_is_a_config_error_naming_it(tmp_path, keys):
    torch.save(Planted(tmp_path / "ran"), tmp_path / "planted.pt")
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    node = own(tmp_path, keys, cfg, **{"client-id": "client-1",
                                       "client-data": str(tmp_path / "planted.pt")})
    with pytest.raises(ConfigError, match=r"planted\.pt"):
        served(node, run_config, broadcast(keys, "client-1"))


def test_a_missing_client_data_file_is_a_config_error_naming_it(tmp_path, keys):
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    node = own(tmp_path, keys, cfg, **{"client-id": "client-1",
                                       "client-data": str(tmp_path / "missing.pt")})
    with pytest.raises(ConfigError, match=r"missing\.pt"):
        served(node, run_config, broadcast(keys, "client-1"))


def test_a_process_keeps_one_endpoint_per_client_and_at_most_keep(tmp_path, keys, monkeypatch):
    """A simulation's actor serves many clients, and a client's next message may go to another
    actor (its state then moves on without this process): the in-process cache keeps only the
    client's latest endpoint and at most ``_KEEP`` clients, least recently answered out first;
    a client whose endpoint went is rebuilt from its bytes."""
    monkeypatch.setattr(flower_node, "_KEEP", 1)
    cfg = config(tmp_path / "unused")
    run_config = flower_node.run_config_of(cfg, keys)
    nodes = {cid: own(tmp_path, keys, cfg, **{"client-id": cid}) for cid in CLIENTS}
    flower_node._LAST.clear()
    first = broadcast(keys, "client-1")
    state, _ = flower_node.serve(nodes["client-1"], run_config, None, first)
    flower_node.serve(nodes["client-1"], run_config, None, first)  # an older state, again
    assert [cid for cid, _ in flower_node._LAST] == ["client-1"]
    flower_node.serve(nodes["client-2"], run_config, None, broadcast(keys, "client-2"))
    assert [cid for cid, _ in flower_node._LAST] == ["client-2"]
    _, reply = flower_node.serve(nodes["client-1"], run_config, state, first)  # rebuilt
    assert ["duplicate or replayed" in e["detail"]
            for e in decode_reply(reply, "client-1").events] == [True]
    flower_node._LAST.clear()
