"""FedWAD's uses with every client rebuilt, for every message, from its key file, its own
labelled data and its saved bytes (the loopback of tests/runs/test_flower_node.py, no Ray),
the server holding only a remote channel: a coreset, an OTDD and a clustered FedAvg give the
same results and the same log records as in-process. Truth: the in-process run of the same
seeded clients (``labelled_clients(deterministic_seed=...)``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secureffm.federation.keyfiles import load_registry, provision
from secureffm.federation.log import MessageLog
from secureffm.methods.client_clustering import FedAvgClient, FedAvgConfig, clustered_fedavg
from secureffm.methods.fedwad import FedWADConfig
from secureffm.methods.fedwad_coreset import CoresetConfig, coreset_client, learn_coreset
from secureffm.methods.otdd import LABELS, OTDDClient, federated_otdd, labelled_clients
from secureffm.protocols.endpoint import ClientEndpoint
from secureffm.protocols.protocol import load_protocol
from secureffm.runs import flower_node
from secureffm.runs.fedwad import FedWADRun
from secureffm.runs.flower_server import remote_channel
from secureffm.runs.scaffold import open_channel

from .test_flower_fedwad import rows
from .test_flower_node import CLIENTS, Nodes

SEED, PROTOCOL = 5, "fedwad-private"
FEDWAD = FedWADConfig(iterations=2, support_size=5)


def labelled(n: int = 12):
    """Two clients' features [2n, 3] and labels [2n] (classes 0, 1 and 1, 2)."""
    rng = np.random.default_rng(0)
    y = [np.repeat([0, 1], n), np.repeat([1, 2], n)]
    return [3.0 * np.eye(3)[k] + rng.standard_normal((2 * n, 3)) for k in y], y


class UseNodes(Nodes):
    """Nodes whose clients hold :func:`labelled` data and run ``program``."""

    def __init__(self, keys, program):
        run = FedWADRun(protocol=PROTOCOL, seed=SEED, insecure_deterministic=True)
        super().__init__(flower_node.run_config_of(run, keys), rebuild=True,
                         nodes={cid: {"partition-id": i} for i, cid in enumerate(CLIENTS)})
        self.keys, self.program, self.run = keys, program, run

    def build(self, node_config: dict, run_config: dict, cid: str) -> ClientEndpoint:
        x, y = labelled()
        index = CLIENTS.index(cid)
        client = flower_node._client(str(self.keys), cid, SEED,
                                     lambda: torch.as_tensor(x[index], dtype=torch.float32))
        client.state[LABELS] = y[index]
        return ClientEndpoint(client, load_registry(self.keys), load_protocol(PROTOCOL),
                              self.program)

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        out = {}
        for cid, frame in requests.items():
            flower_node._LAST.clear()
            self.state[cid], out[cid] = flower_node.answer(self.nodes[cid], self.run_config,
                                                           self.state.get(cid), frame,
                                                           self.build)
            self.replies.append((cid, out[cid]))
        return out

    def channel(self, folder):
        return remote_channel(self, self.run, self.keys, load_protocol(PROTOCOL),
                              MessageLog(folder / "messages.jsonl"), 24)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, CLIENTS)
    return folder


def local_channel(folder, program):
    x, y = labelled()
    clients = labelled_clients(x, y, deterministic_seed=SEED)
    return open_channel(load_protocol(PROTOCOL), clients, MessageLog(folder / "messages.jsonl"),
                        deterministic_seed=SEED, program=program)


def both(tmp_path, keys, program, use):
    """``use(channel, dim)`` in-process and on rebuilt nodes; their results."""
    out = []
    for name in ("local", "nodes"):
        channel = (local_channel(tmp_path / name, program) if name == "local" else
                   UseNodes(keys, program).channel(tmp_path / name))
        try:
            out.append(use(channel, None if name == "local" else 3))
        finally:
            channel.close()
            flower_node._LAST.clear()
    assert rows(tmp_path / "local") == rows(tmp_path / "nodes")
    return out


def test_a_coreset_with_client_drawn_subsamples_is_the_same_on_rebuilt_nodes(tmp_path, keys):
    config = CoresetConfig(size=3, epochs=3, clients_per_epoch=2, samples_per_client=10,
                           fedwad=FEDWAD)
    privacy = load_protocol(PROTOCOL).geodesic_privacy()
    local, nodes = both(tmp_path, keys, coreset_client(config, privacy), lambda ch, dim:
                        learn_coreset(ch, privacy, np.zeros((3, 3)), config,
                                      show_progress=False, dim=dim))
    assert np.array_equal(local.points, nodes.points) and local.losses == nodes.losses


def test_federated_otdd_is_the_same_on_rebuilt_nodes(tmp_path, keys):
    privacy = load_protocol(PROTOCOL).geodesic_privacy()
    local, nodes = both(tmp_path, keys, OTDDClient(FEDWAD, privacy), lambda ch, dim:
                        federated_otdd(ch, privacy, FEDWAD, show_progress=False, dim=dim))
    assert nodes.distances[0, 1] > 0
    assert np.array_equal(local.distances, nodes.distances)
    assert np.array_equal(local.label_distances, nodes.label_distances)


def test_clustered_fedavg_is_the_same_on_rebuilt_nodes(tmp_path, keys):
    config = FedAvgConfig(rounds=2, classes=3, hidden=8)
    x, y = labelled()

    def use(channel, dim):  # one cluster of both clients, over the channel made for it
        members = labelled_clients(x, y, deterministic_seed=SEED) if dim is None else \
            channel.clients
        models = clustered_fedavg(members, np.zeros(2, dtype=int),
                                  lambda m, folder, program: channel, tmp_path, config,
                                  dp=None, show_progress=False, dim=dim)
        return torch.nn.utils.parameters_to_vector(models["client-1"].parameters())

    local, nodes = both(tmp_path, keys, FedAvgClient(config), use)
    assert torch.equal(local, nodes)
