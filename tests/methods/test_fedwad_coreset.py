import json

import numpy as np
import ot
import pytest
import torch

from secureffm.errors import ConfigError, DataError
from secureffm.federation.log import MessageLog
from secureffm.methods.fedwad import FedWADConfig, Measure, interpolate, wasserstein
from secureffm.methods.fedwad_coreset import (
    CoresetConfig,
    coreset_client,
    coreset_distance,
    learn_coreset,
)
from secureffm.methods.fedwad_federated import FedWADClient, federated_distance
from secureffm.methods.otdd import labelled_clients
from secureffm.protocols.protocol import load_protocol
from secureffm.runs.scaffold import open_channel


def _mixture(seed: int, n: int = 240):
    """Four well separated 3-D Gaussian blobs, dealt at random over four clients."""
    rng = np.random.default_rng(seed)
    centres = 4.0 * np.eye(4, 3)
    labels = np.repeat(np.arange(4), n // 4)
    x = centres[labels] + 0.3 * rng.standard_normal((n, 3))
    parts = np.array_split(rng.permutation(n), 4)
    clients = labelled_clients([x[p] for p in parts], [labels[p] for p in parts],
                               deterministic_seed=seed)
    return x, clients


def _channel(clients, tmp_path, program, protocol="plaintext"):
    return open_channel(load_protocol(protocol), clients,
                        MessageLog(tmp_path / "messages.jsonl"), program=program)


def test_gradient_through_an_interpolating_measure_equals_the_gradient_of_w2():
    rng = np.random.default_rng(0)
    points = torch.tensor(rng.normal(size=(6, 2)), requires_grad=True)
    data = rng.normal(loc=2.0, size=(30, 2))
    xi = interpolate(Measure.uniform(points.detach().numpy()), Measure.uniform(data), 0.4,
                     exact=True, prune_tol=0.0)
    coreset_distance(points, xi, 2).backward()
    ours = points.grad.clone()
    # independent truth: POT's torch backend differentiates W2(points, data) itself
    reference = points.detach().clone().requires_grad_(True)
    cost = ot.dist(reference, torch.tensor(data))
    ot.emd2(torch.full((6,), 1 / 6, dtype=torch.float64),
            torch.full((30,), 1 / 30, dtype=torch.float64), cost).sqrt().backward()
    assert torch.allclose(ours, reference.grad, atol=1e-8)


def test_fedwad_between_server_and_client_is_close_to_exact_w2(tmp_path):
    x, clients = _mixture(0)
    config = FedWADConfig(iterations=8, support_size=20, exact=True)
    channel = _channel(clients, tmp_path, FedWADClient(config, None))
    held = Measure.uniform(np.random.default_rng(1).normal(size=(8, 3)))
    data = clients[0].data.double().numpy()
    privacy = channel.protocol.geodesic_privacy()  # None: plaintext
    distance = federated_distance(channel, privacy, held, clients[0].id, config).distance
    channel.close()
    exact = wasserstein(held, Measure.uniform(data), 2)
    assert exact <= distance * (1 + 1e-9)  # every FedWAD value bounds W_p from above
    assert distance < 1.03 * exact
    records = [json.loads(line) for line in (tmp_path / "messages.jsonl").open()]
    kinds = [r["kind"] for r in records if r["kind"] != "event"]
    assert set(kinds) == {"measure", "scalar"}
    assert all(r["recipient"] == "client-1" or r["sender"] == "client-1"
               for r in records if r["kind"] != "event")  # the server's side sends nothing
    assert kinds.count("scalar") == config.iterations + 1  # plaintext: a bound per iterate
    assert kinds.count("measure") == 2 * config.iterations + 1


def test_fedwad_private_protocol_marks_client_measures_and_keeps_the_bound(tmp_path):
    x, clients = _mixture(1)
    privacy = load_protocol("fedwad-private").geodesic_privacy()
    assert privacy is not None
    config = FedWADConfig(iterations=4, support_size=10)
    channel = _channel(clients, tmp_path, FedWADClient(config, privacy), "fedwad-private")
    rows = [c.data.double().numpy() for c in clients[:2]]
    distance = federated_distance(channel, privacy, clients[0].id, clients[1].id,
                                  config).distance
    channel.close()
    assert distance >= wasserstein(Measure.uniform(rows[0]), Measure.uniform(rows[1]), 2)
    records = [json.loads(line) for line in (tmp_path / "messages.jsonl").open()]
    uploads = [r for r in records if r["kind"] == "measure" and r["recipient"] == "server"]
    assert uploads and all("randomized-t" in r["stages"] for r in uploads)
    assert sum(r["kind"] == "scalar" for r in records) == 2  # one distance each, at the end


@pytest.mark.parametrize("exact", [False, True])
def test_coreset_loss_falls_and_the_coreset_moves_towards_the_data(tmp_path, exact):
    x, clients = _mixture(0)
    initial = np.random.default_rng(3).normal(size=(4, 3))
    config = CoresetConfig(size=4, epochs=40, clients_per_epoch=2, lr=0.2,
                           fedwad=FedWADConfig(iterations=4, support_size=4), seed=0)
    channel = _channel(clients, tmp_path, coreset_client(config, None))
    result = learn_coreset(channel, channel.protocol.geodesic_privacy(), initial, config,
                           exact=exact, show_progress=False)
    channel.close()
    assert len(result.losses) == config.epochs
    assert np.mean(result.losses[-5:]) < 0.75 * np.mean(result.losses[:5])
    pooled = Measure.uniform(x)
    before = wasserstein(Measure.uniform(result.initial), pooled, 2)
    after = wasserstein(Measure.uniform(result.points), pooled, 2)
    assert after < 0.5 * before


def test_bad_coreset_requests_are_clear_errors(tmp_path):
    _, clients = _mixture(0)
    channel = _channel(clients, tmp_path, coreset_client(CoresetConfig(size=3), None))
    with pytest.raises(ConfigError, match="size"):
        CoresetConfig(size=0)
    with pytest.raises(ConfigError, match="lr"):
        CoresetConfig(lr=0.0)
    with pytest.raises(DataError, match="initial coreset"):
        learn_coreset(channel, None, np.zeros((3, 2)), CoresetConfig(size=3),
                      show_progress=False)
    with pytest.raises(ConfigError, match="clients_per_epoch"):
        learn_coreset(channel, None, np.zeros((3, 3)),
                      CoresetConfig(size=3, clients_per_epoch=5), show_progress=False)
