"""A server that asks FedWAD's clients for more than their protocol lets it have (issue 17).

Under ``fedwad-private`` a client's t is what keeps its data from the server: holding the
measure xi it sent, the measure the client moved toward it and W_p(data, xi), the server gets
t = 1 - W(moved, xi) / W(data, xi) (exact interpolation). The server here plays the tasks
itself through the channel (signed with its own key), asking the victim for the distance of
the measure it just moved toward it, as a per-iteration distance (``fedwad.distance``) or as
a final one (``fedwad.final``), or for an interpolation at a range of t it chooses. Each leak
is first shown to work with the client's check removed (its program told it the protocol has
no randomized-t stage), then refused by the client in a ``rejected`` event it signed, naming
why, while the log still verifies. Truths used: the victim's replayed protocol stream (seeded
here) and POT's exact W_p.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from secureffm.audit.verify import verify_run
from secureffm.federation.channel import Task
from secureffm.federation.log import MessageLog
from secureffm.federation.message import SERVER
from secureffm.federation.parties import Client
from secureffm.methods.fedwad import FedWADConfig, Measure, wasserstein
from secureffm.methods.fedwad_federated import FedWADClient, measure_payload
from secureffm.protocols.protocol import load_protocol
from secureffm.runs.scaffold import open_channel

VICTIM = "client-1"
CONFIG = FedWADConfig(iterations=3, support_size=50, exact=True, prune_tol=1e-6)


@pytest.fixture
def setup(tmp_path):
    """(channel under fedwad-private, the clients' program, the victim's data, a replay of
    its protocol stream, the server's xi)."""
    rng = np.random.default_rng(0)
    data = [rng.normal(size=(50, 2)), rng.normal(size=(50, 2)) + 2.0]
    clients = [Client(f"client-{i}", torch.as_tensor(x), torch.Generator().manual_seed(i),
                      protocol_rng=np.random.default_rng([5, i]))
               for i, x in enumerate(data, start=1)]
    protocol = load_protocol("fedwad-private")
    program = FedWADClient(CONFIG, protocol.geodesic_privacy())
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl"),
                           program=program)
    replay = copy.deepcopy(clients[0].protocol_rng)
    xi = Measure.uniform(rng.normal(size=(50, 2)))
    return channel, program, data[0], replay, xi


def moved_and_distance(channel, round_: int, xi: Measure, distance: Task):
    """The server's attack in ``round_``: xi to the victim, its interpolation, then
    ``distance`` of it."""
    assert channel.send(round_, "broadcast", "measure", SERVER, VICTIM, measure_payload(xi))
    moved = channel.send(round_, "upload", "measure", VICTIM, SERVER,
                         Task("fedwad.interpolate", {"round": round_}))
    return moved, channel.send(round_, "upload", "scalar", VICTIM, SERVER, distance)


def refusals(folder) -> list[dict]:
    records = [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("event") == "rejected"]


@pytest.mark.parametrize("task", ["fedwad.distance", "fedwad.final"])
def test_a_distance_of_the_measure_a_client_moved_toward_is_refused(tmp_path, setup, task,
                                                                    monkeypatch):
    channel, program, data, replay, xi = setup
    t = replay.uniform(0.2, 0.8)  # protocols/fedwad-private.toml: the victim's first t
    with monkeypatch.context() as removed:  # the client's check removed: the leak works
        removed.setattr(program, "private", False)
        moved, distance = moved_and_distance(channel, 1, xi, Task(task))
    recovered = 1 - wasserstein(Measure(**moved), xi, 2) / distance["distance"][0]
    assert recovered == pytest.approx(t, abs=1e-6)
    assert distance["distance"][0] == pytest.approx(wasserstein(Measure.uniform(data), xi, 2))

    moved, distance = moved_and_distance(channel, 2, xi, Task(task))  # with the check
    assert moved is not None and distance is None
    [refusal] = refusals(tmp_path)
    assert refusal["sender"] == VICTIM and refusal["party"] == SERVER  # signed by the victim
    assert ("per iteration" if task == "fedwad.distance" else "one per 3") in refusal["detail"]
    channel.close()
    report = verify_run(tmp_path)
    assert report.ok, report.summary()  # the client's signature on its refusal verifies


@pytest.mark.parametrize("args", [{"t_range": [0.001, 0.002]}, {"t": 0.001},
                                  {"noise_std": 0.0}])
def test_a_client_takes_no_t_range_or_noise_from_the_server(tmp_path, setup, args):
    channel, _, _, replay, xi = setup
    assert channel.send(1, "broadcast", "measure", SERVER, VICTIM, measure_payload(xi))
    got = channel.send(1, "upload", "measure", VICTIM, SERVER,
                       Task("fedwad.interpolate", {**args, "round": 1}))
    assert got is None
    [refusal] = refusals(tmp_path)
    assert refusal["sender"] == VICTIM and sorted(args)[0] in refusal["detail"]
    # the client's stream did not move: it drew no t for the server's request
    assert channel.clients[0].protocol_rng.uniform() == replay.uniform()
    channel.close()
    assert verify_run(tmp_path).ok
