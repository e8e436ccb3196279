import json
from itertools import combinations

import numpy as np
import pytest
import torch

from secureffm.errors import DataError
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Client
from secureffm.methods.fedwad import FedWADConfig
from secureffm.methods.otdd import (
    OTDDClient,
    augment,
    class_distances,
    federated_otdd,
    label_embedding,
    labelled_clients,
    otdd_exact,
)
from secureffm.ot import emd_cost, squared_distances
from secureffm.protocols.protocol import load_protocol
from secureffm.runs.scaffold import open_channel


def _labelled(rng, classes: list[int], shift: float, per_class: int = 15):
    centres = np.array([[3.0 * c, -2.0 * c, c * c / 2] for c in range(5)])
    y = np.repeat(classes, per_class)
    return centres[y] + rng.standard_normal((len(y), 3)) + shift, y


def _channel(clients, tmp_path, config=None):
    """A plaintext channel whose clients run OTDD's program of ``config``."""
    return open_channel(load_protocol("plaintext"), clients,
                        MessageLog(tmp_path / "messages.jsonl"),
                        program=OTDDClient(config or FedWADConfig(), None))


def _otdd(channel, config):
    return federated_otdd(channel, channel.protocol.geodesic_privacy(), config,
                          show_progress=False)


def test_otdd_exact_compares_class_distributions_not_label_names():
    rng = np.random.default_rng(0)
    x, y = _labelled(rng, [0, 3], 0.0)
    assert otdd_exact(x, y, x, y) == pytest.approx(0.0, abs=1e-6)
    # renaming the classes changes no class-conditional distribution: still 0
    assert otdd_exact(x, y, x, np.where(y == 0, 7, 1)) == pytest.approx(0.0, abs=1e-6)
    # one class holding everything: the features match (W2 = 0) but the classes do not
    assert emd_cost(squared_distances(x, x)) == pytest.approx(0.0, abs=1e-9)
    assert otdd_exact(x, y, x, np.zeros_like(y)) > 1.0


def test_label_embedding_reproduces_euclidean_distances():
    points = np.random.default_rng(1).normal(size=(6, 3))
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    e = label_embedding(distances)
    assert np.allclose(np.linalg.norm(e[:, None] - e[None], axis=-1), distances, atol=1e-8)
    x = np.zeros((2, 1))
    assert np.allclose(augment(x, np.array([4, 7]), np.array([4, 7]), e[:2]),
                       np.concatenate([x, e[:2]], axis=1))


def test_federated_otdd_is_close_to_central_otdd_with_exact_solvers(tmp_path):
    rng = np.random.default_rng(0)
    data = [_labelled(rng, [0, 1, 2], 0.0), _labelled(rng, [1, 3], 0.7),
            _labelled(rng, [4], -0.5)]  # the third client holds a single class
    # Seeded client streams: with OS-entropy t the error is 0.1-0.2% in most runs, but about
    # one run in twelve draws ts that leave it above 2% (measured); the test checks the method.
    clients = labelled_clients([x for x, _ in data], [y for _, y in data], deterministic_seed=0)
    config = FedWADConfig(iterations=10, support_size=20, exact=True, seed=0)
    channel = _channel(clients, tmp_path, config)
    result = _otdd(channel, config)
    channel.close()
    for i, j in combinations(range(3), 2):
        exact = otdd_exact(*data[i], *data[j])
        assert result.distances[i, j] == result.distances[j, i]
        assert abs(result.distances[i, j] / exact - 1) < 0.02, (i, j)
    # class-to-class distances across clients: FedWAD upper-bounds exact W2, and is close
    rows = {c.id: (x, y) for c, (x, y) in zip(clients, data, strict=True)}
    for a, b in combinations(range(len(result.labels)), 2):
        (ca, ka), (cb, kb) = result.labels[a], result.labels[b]
        if ca == cb:
            continue
        xa, ya = rows[ca]
        xb, yb = rows[cb]
        exact = np.sqrt(emd_cost(squared_distances(xa[ya == ka], xb[yb == kb])))
        assert exact * (1 - 1e-9) <= result.label_distances[a, b] < exact * 1.02
    # within a client: the client's own exact distances
    classes, local = class_distances(*data[0])
    assert np.allclose(result.label_distances[:3, :3], local)


def test_the_server_receives_measures_and_scalars_only(tmp_path):
    rng = np.random.default_rng(2)
    data = [_labelled(rng, [0, 1], 0.0, per_class=30), _labelled(rng, [2, 3], 0.0, per_class=30)]
    clients = labelled_clients([x for x, _ in data], [y for _, y in data])
    config = FedWADConfig(iterations=3, support_size=8, seed=0)
    channel = _channel(clients, tmp_path, config)
    _otdd(channel, config)
    channel.close()
    records = [json.loads(line) for line in (tmp_path / "messages.jsonl").open()]
    to_server = {r["kind"] for r in records if r["recipient"] == "server"}
    assert to_server == {"measure", "scalar"}
    from_server = {r["kind"] for r in records if r["sender"] == "server" and r["kind"] != "event"}
    assert from_server == {"measure", "label_embedding"}


def test_bad_inputs_are_clear_errors(tmp_path):
    rng = np.random.default_rng(0)
    x, y = _labelled(rng, [0, 1], 0.0)
    with pytest.raises(DataError, match="label arrays"):
        labelled_clients([x, x], [y])
    with pytest.raises(DataError, match="integers"):
        labelled_clients([x], [y.astype(float)])
    with pytest.raises(DataError, match="shape"):
        labelled_clients([x], [y[:-1]])
    unlabelled = [Client(f"client-{i}", torch.zeros(4, 3), torch.Generator()) for i in (1, 2)]
    channel = _channel(unlabelled, tmp_path)
    with pytest.raises(DataError, match="holds no labels"):
        _otdd(channel, FedWADConfig())
    alone = _channel(labelled_clients([x], [y]), tmp_path / "one")
    with pytest.raises(DataError, match="at least two"):
        _otdd(alone, FedWADConfig())
    with pytest.raises(DataError, match="square"):
        label_embedding(np.zeros((2, 3)))
    with pytest.raises(DataError, match="no embedding"):
        augment(x, y, np.array([0]), np.zeros((1, 2)))
