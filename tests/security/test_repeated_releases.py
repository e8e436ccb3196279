"""A server that asks a client for more releases than the client's own plan allows (issue 37).

Adversary: a malicious server, the federation's real server party (its own key, a real signed
log), that sends the victim extra requests of a task the victim runs: the same FFM velocity
round again and again (each answer under local-noise DP carries fresh noise, so the mean of k
answers has 1/sqrt(k) of one answer's noise and a membership test on it gains what the whole
planned run never allowed), a round beyond the run's plan, a round past the client's own
privacy target, a DCFM publish beyond its DCFM-A rounds (more DP training than planned), and a
second FedWAD interpolation of the same iteration (a second t toward the same measure). The
server plays these through its own link or channel, as a server can; it never holds a
client's key. Before issue 37 every one of them was answered. Now the client's own release
ledger (secureffm/privacy/releases.py) answers each (task, round) once, only for the rounds its
own settings plan and, under DP, never past its own target; every other request is refused by
name in a ``rejected`` event the victim signed, and the log still verifies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from secureffm.audit.verify import verify_run
from secureffm.config import RunConfig
from secureffm.data.pairs import get_pair
from secureffm.errors import BudgetError
from secureffm.federation.channel import Task
from secureffm.federation.faults import FaultPlan
from secureffm.federation.log import MessageLog
from secureffm.federation.message import SERVER, deserialize_payload, serialize_payload
from secureffm.federation.parties import Client, new_client, new_clients
from secureffm.federation.snapshot import client_state, pack, restore_client, unpack
from secureffm.methods.dcfm import DCFMClient
from secureffm.methods.fedwad import FedWADConfig, Measure
from secureffm.methods.fedwad_federated import FedWADClient, measure_payload
from secureffm.methods.ffm import FederatedFlowMatching, FFMClient, FFMSettings
from secureffm.privacy.accounting import epsilon
from secureffm.privacy.dpsgd import poisson_rate
from secureffm.protocols import load_protocol
from secureffm.protocols.link import Ask
from secureffm.runs.dcfm import conditional_data, dcfm_settings
from secureffm.runs.scaffold import open_channel, resolve_dp

VICTIM = "client-1"
EXTRA = 50  # the extra requests of one round the server sends


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]


def _refusals(folder: Path) -> list[dict]:
    """``rejected`` events the victim signed, in order."""
    return [r for r in _records(folder)
            if r.get("event") == "rejected" and r["sender"] == VICTIM]


def _verified(channel, folder: Path) -> None:
    channel.close()
    report = verify_run(folder)
    assert report.ok, report.summary()  # the victim's signed refusals verify


# -- FFM ----------------------------------------------------------------------------------------

def _ffm(folder: Path, protocol: str = "dp", **changes) -> FederatedFlowMatching:
    """Two clients with 100 rows of 8gaussians-moons targets each, FFM-vanilla over a real
    channel of ``protocol`` (q = 2 / 100, sigma 1 unless ``changes`` say otherwise)."""
    values = dict(method="vanilla", protocol=protocol, shard_size=100, batch_size=2, hidden=16,
                  potential_hidden=16, candidates=16, rounds=4, potential_every=1,
                  ema_decay=0.0, noise_multiplier=1.0, progress=False, device="cpu")
    values.update(changes)
    if protocol == "plaintext":
        values.pop("noise_multiplier")
    config = RunConfig(**values)
    pair = get_pair(config.data)
    data = pair.target.sample(200, torch.Generator().manual_seed(1))[0]
    clients = [new_client(f"client-{i}", part) for i, part in
               enumerate(torch.split(data, [100, 100]), start=1)]
    settings, protocol_ = FFMSettings.of(config), load_protocol(protocol)
    dp = resolve_dp(config, protocol_, settings.sent_kinds)
    program = FFMClient(settings, dp, pair, torch.device("cpu"))
    channel = open_channel(protocol_, clients, MessageLog(folder / "messages.jsonl"),
                           FaultPlan(), program=program)
    torch.manual_seed(0)
    return FederatedFlowMatching(settings, dp, pair, channel, torch.device("cpu"))


def _ask_velocity(ffm: FederatedFlowMatching, round_: int, asked: int) -> np.ndarray | None:
    """The server asks the victim alone, in ``round_`` (its messages' round: the client takes
    one model per round), for ``ffm.velocity`` of round ``asked`` (the task's round, which
    keys the computation), the global model carried with the request as an honest round sends
    it; returns the victim's gradient as the server received it, or None."""
    channel = ffm.channel
    link = channel._link(round_, "gradient", channel.protocol.client_stages("gradient"))
    link.carry = {"global_model": serialize_payload({"theta": ffm.velocity.flat()})}
    delivery = link.exchange("upload", "upload", "upload", {
        VICTIM: Ask(None, {"compute": Task("ffm.velocity", {"round": asked})})})[VICTIM]
    return None if delivery.data is None else deserialize_payload(delivery.data)["gradient"]


def test_a_client_answers_each_velocity_round_once_under_dp(tmp_path):
    """Before issue 37 all 51 requests of round 1 were answered, each with fresh noise: the
    difference of the means of two halves of 25 answers had about 1/5 of the std of the
    difference of two single answers (the noise averages away as 1/sqrt(k)). Now the first
    is answered and the other 50 are refused by name, each in the victim's signed event."""
    ffm = _ffm(tmp_path)
    answers = [a for a in (_ask_velocity(ffm, 1 + i, 1) for i in range(1 + EXTRA))
               if a is not None]
    if len(answers) > 2:  # what the server gained from the extra answers
        stack = np.stack(answers)
        half = len(answers) // 2
        single = np.std(stack[0] - stack[1])
        averaged = np.std(stack[:half].mean(0) - stack[half:2 * half].mean(0))
        pytest.fail(f"the victim answered {len(answers)} requests of round 1: the mean of "
                    f"{half} answers has {averaged / single:.3f} of one answer's noise std "
                    f"(1/sqrt({half}) = {half ** -0.5:.3f})")
    assert len(answers) == 1
    refusals = _refusals(tmp_path)
    assert len(refusals) == EXTRA
    assert all(r["party"] == SERVER and "ffm.velocity" in r["detail"]
               and "round 1" in r["detail"] and "answered" in r["detail"] for r in refusals)
    _verified(ffm.channel, tmp_path)


def test_a_client_refuses_a_velocity_round_outside_its_own_plan(tmp_path):
    """Rounds 0 and 5 of a 4-round run: nothing the victim's own settings plan (before issue
    37, both were answered)."""
    ffm = _ffm(tmp_path)
    assert _ask_velocity(ffm, 5, 5) is None and _ask_velocity(ffm, 6, 0) is None
    refusals = _refusals(tmp_path)
    assert len(refusals) == 2
    assert all("rounds 1..4" in r["detail"] for r in refusals)
    _verified(ffm.channel, tmp_path)


def test_a_client_refuses_a_release_past_its_own_target(tmp_path):
    """With a given sigma whose 4 planned rounds exceed the target after round 2, the honest
    server refuses the run (``refuse_overspending``); this one asks for round 3 anyway. The
    victim's own ledger refuses it; before issue 37 it was answered."""
    sigma, rate, delta = 0.6, poisson_rate(2, 100), 1e-5
    target = (epsilon([(sigma, rate, 2)], delta) + epsilon([(sigma, rate, 3)], delta)) / 2
    ffm = _ffm(tmp_path, noise_multiplier=sigma, target_epsilon=target)
    assert ffm.rounds_within_budget() == 2
    with pytest.raises(BudgetError, match="rounds 1..2 fit"):
        ffm.refuse_overspending()
    assert _ask_velocity(ffm, 1, 1) is not None and _ask_velocity(ffm, 2, 2) is not None
    assert _ask_velocity(ffm, 3, 3) is None
    [refusal] = _refusals(tmp_path)
    assert "target" in refusal["detail"] and "round 3" in refusal["detail"]
    releases, victim = ffm.channel.endpoints[VICTIM].program.releases, ffm.channel.clients[0]
    assert releases.epsilon(victim.state) == pytest.approx(epsilon([(sigma, rate, 2)], delta))
    _verified(ffm.channel, tmp_path)


def test_without_dp_a_replayed_round_gets_no_second_computation(tmp_path):
    """Plaintext: no target to keep, but a second request for round 1 still gets no fresh
    computation (before issue 37 it got one, on a fresh batch)."""
    ffm = _ffm(tmp_path, protocol="plaintext")
    assert _ask_velocity(ffm, 1, 1) is not None
    assert _ask_velocity(ffm, 2, 1) is None
    [refusal] = _refusals(tmp_path)
    assert "answered" in refusal["detail"]
    _verified(ffm.channel, tmp_path)


def test_an_honest_run_is_answered_and_the_client_accounts_what_the_server_charged(tmp_path):
    """GOT under dp, every planned round: nothing refused, and each client's own epsilon
    (from its own answers) equals the server ledger's for it."""
    ffm = _ffm(tmp_path, method="got", potential_every=2, ctransform_steps=0)
    for round_ in range(1, 5):
        assert ffm.train_round(round_).aborted == 0
    assert not [r for r in _records(tmp_path) if r.get("event") == "rejected"]
    releases = ffm.channel.endpoints[VICTIM].program.releases  # one program runs every client
    for client in ffm.channel.clients:
        assert releases.epsilon(client.state) == pytest.approx(ffm.ledger.epsilon(client.id))
    _verified(ffm.channel, tmp_path)


def test_what_a_client_answered_survives_its_snapshot(tmp_path):
    """A Flower node keeps its client between messages as a snapshot: a client rebuilt from
    one still refuses the round it answered before it was saved."""
    ffm = _ffm(tmp_path)
    assert _ask_velocity(ffm, 1, 1) is not None
    program, victim = ffm.channel.endpoints[VICTIM].program, ffm.channel.clients[0]
    rebuilt = new_client(VICTIM, victim.data)
    program.setup(rebuilt)
    restore_client(rebuilt, *unpack(pack(*client_state(victim))))
    assert program.releases.epsilon(rebuilt.state) == program.releases.epsilon(victim.state) > 0
    rebuilt.inbox["global_model"] = {"theta": ffm.velocity.flat()}
    with pytest.raises(Exception, match="answered"):
        program(rebuilt, Task("ffm.velocity", {"round": 1}))
    assert "gradient" in program(rebuilt, Task("ffm.velocity", {"round": 2}))


# -- DCFM ---------------------------------------------------------------------------------------

def _adam_steps(client: Client) -> set[int]:
    return {int(state["step"]) for state in client.kept["expert"].optimizer.state.values()}


def test_a_dcfm_client_publishes_each_point_once_and_trains_no_further_than_planned(tmp_path):
    """DCFM-A under dp-sealed with one DCFM-A round planned (6 + 4 DP steps). The server asks
    for stage I's expert twice and then for the expert after DCFM-A round 3. Before issue 37
    the victim published twice and trained rounds 1-3 (6 + 3 * 4 DP steps, beyond what its
    sigma was calibrated for); now it publishes once, refuses both by name and has trained
    stage I only."""
    config = RunConfig(method="dcfm-a", data="modes2d", partition="disjoint", shard_size=150,
                       batch_size=32, hidden=16, local_steps=6, dcfm_rounds=1, dcfm_steps=4,
                       protocol="dp-sealed", noise_multiplier=4.0, progress=False,
                       device="cpu", out=str(tmp_path / "run"))
    data = conditional_data(config)
    protocol = load_protocol(config.protocol)
    settings, dp = dcfm_settings(config, data.facts, protocol)
    clients = new_clients([x for x, _ in data.shards])
    for client, (_, labels) in zip(clients, data.shards, strict=True):
        client.state["labels"] = labels
    program = DCFMClient(settings, dp, [c.id for c in clients], torch.device("cpu"))
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl"),
                           program=program)

    def publish(round_: int, rounds: int):
        return channel.send(round_, "upload", "model", VICTIM, SERVER,
                            Task("dcfm.publish", {"rounds": rounds}))

    assert publish(1, 0) is not None
    assert publish(1, 0) is None and publish(2, 3) is None
    assert _adam_steps(clients[0]) == {6}
    first, beyond = _refusals(tmp_path)
    assert "dcfm.publish" in first["detail"] and "answered" in first["detail"]
    assert "rounds 0..1" in beyond["detail"]
    _verified(channel, tmp_path)


# -- FedWAD -------------------------------------------------------------------------------------

def test_a_fedwad_client_interpolates_once_per_iteration_under_fedwad_private(tmp_path):
    """Under fedwad-private the server sends xi and asks for the victim's interpolation
    toward it twice in round 1, then, in later rounds, more interpolations than one distance
    has iterations. Before issue 37 each was answered at a fresh t (two measures moved
    toward the same xi); now the second of round 1 and the fourth of a 3-iteration distance
    are refused by name."""
    rng = np.random.default_rng(0)
    clients = [new_client(f"client-{i}", torch.as_tensor(rng.normal(size=(50, 2)) + i))
               for i in (1, 2)]
    protocol = load_protocol("fedwad-private")
    config = FedWADConfig(iterations=3, support_size=50, exact=True, prune_tol=1e-6)
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl"),
                           program=FedWADClient(config, protocol.geodesic_privacy()))
    xi = Measure.uniform(rng.normal(size=(50, 2)))

    def interpolate(round_: int, send_xi: bool = True):
        if send_xi:
            assert channel.send(round_, "broadcast", "measure", SERVER, VICTIM,
                                measure_payload(xi))
        return channel.send(round_, "upload", "measure", VICTIM, SERVER,
                            Task("fedwad.interpolate", {"round": round_}))

    assert interpolate(1) is not None
    assert interpolate(1, send_xi=False) is None  # xi is still in its inbox
    assert interpolate(2) is not None and interpolate(3) is not None
    assert interpolate(4) is None  # a fourth before the final distance
    once, fourth = _refusals(tmp_path)
    assert "fedwad.interpolate" in once["detail"] and "answered" in once["detail"]
    assert "3 interpolation" in fourth["detail"]
    _verified(channel, tmp_path)
