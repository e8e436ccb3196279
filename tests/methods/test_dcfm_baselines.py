import json

import numpy as np
import pytest
import torch

from secureffm.audit import verify_run
from secureffm.config import RunConfig
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Client
from secureffm.methods.dcfm import DCFMClient, DCFMSettings, Masking, initial_model
from secureffm.methods.dcfm_baselines import FedFlow, RouterField, router_weights
from secureffm.methods.ffm import client_weights
from secureffm.models.conditional import ConditionalVelocityMLP
from secureffm.models.params import flat_params
from secureffm.protocols.protocol import load_protocol
from secureffm.runs import run
from secureffm.runs.dcfm import load_dcfm
from secureffm.runs.scaffold import open_channel

CARDS = (2, 2)


def test_router_weights_are_smoothed_naive_bayes_on_marginal_counts():
    # expert 0: 30 x (0,0), 10 x (0,1); expert 1: 20 x (1,1)
    counts = torch.tensor([[30, 10, 0, 0], [0, 0, 0, 20]])
    y = torch.tensor([[0, 0], [1, 0], [1, 1]])
    got = router_weights(counts, y, CARDS)

    def score(n, first, second):  # n_b * prod_i (n_b(y_i) + 1) / (n_b + |Y_i|)
        return n * (first + 1) / (n + 2) * (second + 1) / (n + 2)

    raw = torch.tensor([[score(40, 40, 30), score(20, 0, 0)],
                        [score(40, 0, 30), score(20, 20, 0)],
                        [score(40, 0, 10), score(20, 20, 20)]])
    torch.testing.assert_close(got, raw / raw.sum(dim=1, keepdim=True))


def test_router_field_mixes_expert_velocities_with_the_router_weights():
    torch.manual_seed(0)
    experts = [ConditionalVelocityMLP((2,), CARDS, 16) for _ in range(2)]
    counts = torch.tensor([[5, 0, 0, 1], [0, 3, 3, 0]])
    y = torch.tensor([[0, 0], [1, 0], [0, 1]])
    x, t = torch.randn(3, 2), torch.rand(3)
    w = router_weights(counts, y, CARDS)
    with torch.no_grad():
        expected = w[:, :1] * experts[0](x, t, y) + w[:, 1:] * experts[1](x, t, y)
        torch.testing.assert_close(RouterField(experts, counts, y, CARDS)(x, t), expected)


def test_a_fedflow_round_is_the_size_weighted_mean_of_the_local_models(tmp_path):
    torch.manual_seed(0)
    clients = []
    for i, n in enumerate([40, 120], start=1):
        g = torch.Generator().manual_seed(i)
        client = Client(f"client-{i}", torch.randn(n, 2, generator=g), g)
        client.state["labels"] = torch.randint(2, (n, 2), generator=g)
        clients.append(client)
    settings = DCFMSettings("fedflow-l", (2,), CARDS, 80.0, 16, 1e-2, 0.0, 16, Masking(), 1.0,
                            local_steps=0, dcfm_rounds=0, dcfm_steps=0, fedflow_rounds=1,
                            fedflow_local_steps=3, seed=0)
    program = DCFMClient(settings, None, [c.id for c in clients], torch.device("cpu"))
    channel = open_channel(load_protocol("plaintext"), clients,
                           MessageLog(tmp_path / "messages.jsonl"), program=program)
    model = initial_model(settings, len(clients))
    weights = client_weights(clients, "size")
    assert FedFlow(channel, model, weights, 3).run(1, progress=False) == 0
    local = {c.id: flat_params(c.state["expert"].model) for c in clients}
    expected = sum(weights[cid] * theta for cid, theta in local.items())
    np.testing.assert_allclose(flat_params(model), expected, atol=1e-6)
    assert all(not np.allclose(theta, expected) for theta in local.values())


def _config(tmp_path, method, **changes):
    values = dict(method=method, data="modes2d", partition="iid", shard_size=150,
                  batch_size=32, hidden=16, local_steps=6, fedflow_rounds=3,
                  fedflow_local_steps=2, eval_samples=50, nfe=(4,), progress=False,
                  device="cpu", out=str(tmp_path / method))
    values.update(changes)
    return RunConfig(**values)


def _kinds(out):
    return [json.loads(x)["kind"] for x in (out / "messages.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["fedflow", "fedflow-l"])
def test_fedflow_runs_average_updates_through_the_channel(tmp_path, method):
    result = run(_config(tmp_path, method))
    assert verify_run(result.out).ok
    kinds = _kinds(result.out)
    assert kinds.count("update") == kinds.count("global_model") == 3 * 2
    assert "model" not in kinds
    comm = result.metrics["communication"]["client-1"]
    assert comm["update_bytes"] == comm["sent_bytes"] > 0
    assert load_dcfm(result.out).kind == "monolithic"


@pytest.mark.parametrize("method", ["ddm", "ddm-l"])
def test_ddm_runs_upload_each_expert_once(tmp_path, method):
    result = run(_config(tmp_path, method, protocol="sealed"))
    assert verify_run(result.out).ok
    assert _kinds(result.out).count("model") == 2
    sampler = load_dcfm(result.out)
    assert sampler.kind == "router" and len(sampler.models) == 2
    assert sampler.counts.sum() == 2 * 150
