"""The ``randomized-t`` stage: its spec is validated where it is read, and the shipped
fedwad-private protocol builds it."""

import json

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Client
from secureffm.methods.fedwad import FedWADConfig
from secureffm.methods.fedwad_federated import FedWADClient, federated_distance
from secureffm.protocols.protocol import load_protocol
from secureffm.protocols.randomized_t import RandomizedTStage
from secureffm.runs.scaffold import open_channel

STAGE = '[[stages]]\nstage = "randomized-t"\n'


def spec(tmp_path, body: str, extra: str = ""):
    path = tmp_path / "p.toml"
    path.write_text(f'name = "p"\n{STAGE}{body}\n{extra}')
    return load_protocol(str(path))


def test_shipped_spec_builds_the_stage():
    protocol = load_protocol("fedwad-private")
    stage = protocol.stage_for("randomized-t", "measure")
    assert isinstance(stage, RandomizedTStage)
    assert 0 < stage.t_low < stage.t_high < 1 and stage.noise_std == 0
    assert protocol.client_stages("measure") == ("randomized-t",)
    assert load_protocol("plaintext").stage_for("randomized-t", "measure") is None


@pytest.mark.parametrize("body, match", [
    ('protects = ["measure"]\nt_low = 0.0\nt_high = 0.5', "0 < t_low < t_high < 1"),
    ('protects = ["measure"]\nt_low = 0.5\nt_high = 0.5', "equal ends"),
    ('protects = ["measure"]\nt_low = 0.2\nt_high = 1.0', "0 < t_low < t_high < 1"),
    ('protects = ["measure"]\nt_low = 0.2\nt_high = "0.8"', "finite number"),
    ('protects = ["measure"]\nt_low = 0.2\nt_high = 0.8\nnoise_std = -1', "noise_std"),
    ('protects = ["measure"]\nt_low = 0.2\nt_high = 0.8\nsigma = 1', "unknown key 'sigma'"),
    ('protects = ["measure"]\nt_low = 0.2', "missing required key 't_high'"),
    ('protects = ["gradient"]\nt_low = 0.2\nt_high = 0.8', "cannot protect kind 'gradient'"),
    ('protects = []\nt_low = 0.2\nt_high = 0.8', "protects is empty"),
])
def test_bad_spec_is_a_clear_error(tmp_path, body, match):
    with pytest.raises(ProtocolError, match=match):
        spec(tmp_path, body)


def test_stage_values_drive_the_clients_and_combine_with_sealing(tmp_path):
    """Noise from the stage reaches the measures; a sealed stage on the same kind still works."""
    protocol = spec(tmp_path, 'protects = ["measure"]\nt_low = 0.3\nt_high = 0.7\n'
                    'noise_std = 0.05', '[[stages]]\nstage = "sealed"\n'
                    'protects = ["measure", "scalar"]')
    assert protocol.stage_for("randomized-t", "measure").noise_std == 0.05
    rng = np.random.default_rng(0)
    data = [rng.normal(size=(60, 2)), rng.normal(size=(60, 2)) + 2.0]
    clients = [Client(f"client-{i}", torch.as_tensor(x), torch.Generator().manual_seed(i),
                      protocol_rng=np.random.default_rng(i)) for i, x in enumerate(data, 1)]
    privacy = protocol.geodesic_privacy()
    assert (privacy.t_low, privacy.t_high, privacy.noise_std) == (0.3, 0.7, 0.05)
    config = FedWADConfig(iterations=4, support_size=60)
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "run" / "messages.jsonl"),
                           program=FedWADClient(config, privacy))
    result = federated_distance(channel, privacy, "client-1", "client-2", config)
    channel.close()
    assert result.evaluated == (4,)
    assert 2.0 < result.distance < 4.0
    records = [json.loads(line) for line in
               (tmp_path / "run" / "messages.jsonl").read_text().splitlines()]
    uploads = [r for r in records if r["kind"] == "measure" and r["phase"] == "upload"]
    assert len(uploads) == 2 * 4  # each client, each iteration, its measure sealed
    assert all(r["stages"] == ["randomized-t", "sealed"] for r in uploads)
    assert not any(r.get("event") == "rejected" for r in records)
