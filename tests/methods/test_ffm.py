"""Federated Flow Matching's own parts (secureffm/methods/ffm.py), on a tiny in-process
federation: keyed per-example noise, GOT's candidate pool, losses, weights, a round, and the
DP bookkeeping (sample rate, ledger, planned steps, rounds within the budget).

Truths used: the client's SecretStreams read directly (what the keying documents), Opacus'
RDPAccountant for epsilon, Adam's first step (about lr per parameter), and sums of weights.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

from secureffm.config import RunConfig
from secureffm.data.pairs import get_pair
from secureffm.errors import ConfigError
from secureffm.federation.channel import Task
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.log import PAYLOADS_FILE, MessageLog
from secureffm.federation.message import deserialize_payload, serialize_payload
from secureffm.federation.parties import SecretStreams, new_client
from secureffm.methods.couplings import IndependentCoupling
from secureffm.methods.ffm import (
    FederatedFlowMatching,
    FFMClient,
    FFMSettings,
    _template,
    client_weights,
    velocity_gradient,
)
from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.methods.round_report import RoundReport
from secureffm.models.mlp import VelocityMLP
from secureffm.protocols import load_protocol
from secureffm.runs.scaffold import open_channel, resolve_dp

SHARD, BATCH, K = 24, 8, 16
# Under DP: q = 2 / 100, small enough for Opacus' RDP bound to take milliseconds.
DP = dict(shard_size=100, batch_size=2)
Q = 2 / 100
DELTA = 1e-5  # protocols/dp.toml


def _ffm(tmp_path, method="vanilla", protocol="plaintext", sizes=(SHARD, SHARD),
         faults: FaultPlan | None = None, **changes) -> FederatedFlowMatching:
    """Clients with ``sizes`` rows of 8gaussians-moons targets, seeded secret streams, over a
    real ProtectedChannel whose log keeps every payload (payloads.bin: the server's view)."""
    values = dict(method=method, protocol=protocol, shard_size=SHARD, batch_size=BATCH,
                  candidates=K, hidden=16, potential_hidden=16, rounds=4, potential_every=1,
                  ema_decay=0.0, progress=False, device="cpu")
    values.update(changes)
    config = RunConfig(**values)
    pair = get_pair(config.data)
    data = pair.target.sample(sum(sizes), torch.Generator().manual_seed(1))[0]
    clients = [new_client(f"client-{i}", part, deterministic_seed=7)
               for i, part in enumerate(torch.split(data, list(sizes)), start=1)]
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # one log per federation
    settings = FFMSettings.of(config)
    protocol = load_protocol(protocol)
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    program = FFMClient(settings, dp, pair, torch.device("cpu"))
    channel = open_channel(protocol, clients,
                           MessageLog(folder / "messages.jsonl", keep_payloads=True), faults,
                           program=program)
    for client in clients:
        program.setup(client)
    torch.manual_seed(0)
    return FederatedFlowMatching(settings, dp, pair, channel, torch.device("cpu"))


def _program(ffm) -> FFMClient:
    """The clients' side of ``ffm`` (one program runs every client's tasks in-process)."""
    return ffm.channel.endpoints["client-1"].program


def _records(ffm) -> list[dict]:
    """Every record of the federation's log so far, as written."""
    return [json.loads(line) for line in ffm.channel.transport.log.path.read_text().splitlines()]


def _uploads(ffm, round_: int, kind: str = "gradient") -> dict[str, np.ndarray]:
    """Each client's ``kind`` upload of ``round_``, read back from payloads.bin: the bytes the
    server received, not what the method kept. Ends the run first (the server's closing
    record; payloads.bin is complete once the log is closed)."""
    ffm.channel.close()
    blob = (ffm.channel.transport.log.path.parent / PAYLOADS_FILE).read_bytes()
    return {r["sender"]: deserialize_payload(blob[r["offset"]:r["offset"] + r["bytes"]])
            ["gradient"] for r in _records(ffm)
            if r["round"] == round_ and r["kind"] == kind and r["phase"] == "upload"}


def _plain_sgd(ffm) -> None:
    """Swap the server's Adam for plain SGD at the same lr, so one step moves the velocity by
    exactly -lr times the aggregated gradient (Adam's first step is about lr * sign)."""
    ffm.velocity.optimizer = torch.optim.SGD(ffm.velocity.module.parameters(),
                                             lr=ffm.settings.lr)


def _opacus_epsilon(history: list[tuple[float, float, int]]) -> float:
    accountant = RDPAccountant()
    accountant.history = history
    return accountant.get_epsilon(DELTA)


# -- keyed per-example randomness ----------------------------------------------------------

def test_example_noise_is_the_clients_keyed_uniforms_for_round_kind_and_row(tmp_path):
    """x0 and t of rows r come from SecretStreams.example_uniforms((round, kind, "example"), r):
    t is the first uniform, x0 the source drawn from the rest."""
    ffm = _ffm(tmp_path)
    client = ffm.channel.clients[0]
    rows = torch.tensor([3, 0, 17])
    x0, t = _program(ffm).example_noise(client, 5, "gradient", rows)
    width = ffm.pair.source.uniforms + 1
    u = torch.as_tensor(client.streams.example_uniforms((5, "gradient", "example"),
                                                        rows.numpy(), width))  # float64
    assert x0.shape == (3, 2) and t.shape == (3,)
    assert torch.equal(t, u[:, 0].float()) and 0 <= t.min() and t.max() < 1
    assert torch.equal(x0, ffm.pair.source.from_uniforms(u[:, 1:])[0])


def test_example_noise_is_keyed_by_row_round_and_kind_only(tmp_path):
    ffm = _ffm(tmp_path)
    client, other = ffm.channel.clients
    rows = torch.tensor([2, 9, 4])
    x0, t = _program(ffm).example_noise(client, 1, "gradient", rows)
    again, t_again = _program(ffm).example_noise(client, 1, "gradient", torch.tensor([9, 4, 2, 11]))
    assert torch.equal(again[:3], x0[[1, 2, 0]]) and torch.equal(t_again[:3], t[[1, 2, 0]])
    for changed in [_program(ffm).example_noise(client, 2, "gradient", rows),
                    _program(ffm).example_noise(client, 1, "dual_update", rows),
                    _program(ffm).example_noise(other, 1, "gradient", rows)]:
        assert not torch.isclose(changed[1], t).any()
        assert not torch.isclose(changed[0], x0).all(dim=1).any()


def test_the_candidate_pool_has_k_rows_keyed_by_round_and_kind_whatever_the_batch(tmp_path):
    ffm = _ffm(tmp_path, method="got")
    client = ffm.channel.clients[0]
    pool = _program(ffm).candidate_pool(client, 3, "gradient")
    assert pool.shape == (K, 2)
    # draws nothing from the pool's key
    _program(ffm).velocity_losses(client, 3, torch.tensor([0, 5]))
    assert torch.equal(_program(ffm).candidate_pool(client, 3, "gradient"), pool)
    u = client.streams.example_uniforms((3, "gradient", "pool"), np.arange(K),
                                        ffm.pair.source.uniforms)
    assert torch.equal(pool, ffm.pair.source.from_uniforms(torch.as_tensor(u))[0])
    assert not torch.equal(_program(ffm).candidate_pool(client, 4, "gradient"), pool)
    assert not torch.equal(_program(ffm).candidate_pool(client, 3, "dual_update"), pool)


def test_the_largest_keyed_uniform_still_gives_finite_source_points(tmp_path, monkeypatch):
    """keyed_uniforms can return 1 - 2^-53; here every uniform is that value (the stream is
    replaced, the code under test is FFM's use of it)."""
    ffm = _ffm(tmp_path, method="got")
    client = ffm.channel.clients[0]
    monkeypatch.setattr(SecretStreams, "example_uniforms",
                        lambda self, context, rows, width: np.full((len(rows), width),
                                                                   1 - 2**-53))
    x0, _ = _program(ffm).example_noise(client, 1, "gradient", torch.tensor([0, 1]))
    assert torch.isfinite(x0).all() and torch.isfinite(
        _program(ffm).candidate_pool(client, 1, "gradient")).all()


# -- losses and gradients ------------------------------------------------------------------

@pytest.mark.parametrize("method", ["vanilla", "lot", "got"])
def test_velocity_losses_are_one_finite_term_per_row(tmp_path, method):
    ffm = _ffm(tmp_path, method=method)
    client = ffm.channel.clients[0]
    losses = _program(ffm).velocity_losses(client, 1, torch.tensor([0, 3, 7, 11, 20]))
    assert losses.shape == (5,) and torch.isfinite(losses).all() and (losses >= 0).all()


def test_a_vanilla_term_depends_on_its_own_row_only(tmp_path):
    """Row 3's term is the same alone or in a batch (the per-example premise of DP-SGD)."""
    ffm = _ffm(tmp_path)
    client = ffm.channel.clients[0]
    ffm.channel.broadcast(1, "global_model", {"theta": ffm.velocity.flat()})
    _program(ffm).sync_replicas(client)
    alone = _program(ffm).velocity_losses(client, 1, torch.tensor([3]))
    batch = _program(ffm).velocity_losses(client, 1, torch.tensor([8, 3, 1]))
    assert torch.allclose(batch[1], alone[0], rtol=1e-6)


def test_dual_losses_are_one_finite_term_per_row(tmp_path):
    ffm = _ffm(tmp_path, method="got")
    client = ffm.channel.clients[0]
    losses = _program(ffm).dual_losses(client, 1, torch.tensor([1, 2, 3]))
    assert losses.shape == (3,) and torch.isfinite(losses).all()


def test_velocity_gradient_is_the_gradient_of_the_mean_loss():
    torch.manual_seed(0)
    model = VelocityMLP(2, 8)
    x0, x1 = torch.randn(6, 2), torch.randn(6, 2)
    gradient, loss = velocity_gradient(model, IndependentCoupling(), x0, x1,
                                       torch.Generator().manual_seed(2))
    t = torch.rand(6, generator=torch.Generator().manual_seed(2))
    mean = flow_matching_loss(model, x0, x1, t).mean()
    expected = torch.autograd.grad(mean, list(model.parameters()))
    np.testing.assert_allclose(gradient, torch.cat([g.reshape(-1) for g in expected]).numpy(),
                               rtol=1e-5, atol=1e-7)
    assert loss == pytest.approx(mean.item())


# -- weights and rounds --------------------------------------------------------------------

def test_client_weights_sum_to_one_by_size_or_uniformly(tmp_path):
    clients = _ffm(tmp_path, sizes=(10, 30, 60)).channel.clients
    by_size = client_weights(clients, "size")
    assert by_size == pytest.approx({"client-1": 0.1, "client-2": 0.3, "client-3": 0.6})
    uniform = client_weights(clients, "uniform")
    assert uniform == pytest.approx({c.id: 1 / 3 for c in clients})
    assert sum(by_size.values()) == pytest.approx(1) and sum(uniform.values()) == pytest.approx(1)


def test_under_dp_the_weights_ignore_the_true_shard_sizes(tmp_path):
    """Size weights would release each client's true size; under DP they are uniform."""
    assert _ffm(tmp_path, sizes=(12, 36)).weights == pytest.approx(
        {"client-1": 0.25, "client-2": 0.75})
    assert _ffm(tmp_path, protocol="dp", noise_multiplier=1.0, sizes=(12, 36),
                **DP).weights == {
        "client-1": 0.5, "client-2": 0.5}


@pytest.mark.parametrize("method", ["vanilla", "got"])
def test_a_round_moves_the_global_model_by_one_step_over_every_client(tmp_path, method):
    ffm = _ffm(tmp_path, method=method)
    before = ffm.velocity.flat()
    potential = ffm.potential.flat() if ffm.potential is not None else None
    report = ffm.train_round(1)
    moved = np.abs(ffm.velocity.flat() - before)
    assert np.median(moved) == pytest.approx(ffm.settings.lr, rel=1e-2)  # Adam's first step
    assert report.aborted == 0 and np.isfinite(report.diagnostics["loss"])
    aggregated = [e for e in ffm.channel.transport.log.events if e["event"] == "aggregated"]
    assert aggregated[0]["included"] == ["client-1", "client-2"]
    if potential is not None:  # potential_every = 1: the dual step runs this round too
        assert not np.array_equal(ffm.potential.flat(), potential)
        assert np.isfinite(report.diagnostics["dual"]) and len(aggregated) == 2


# -- DP bookkeeping ------------------------------------------------------------------------

def test_under_dp_q_is_batch_over_the_nominal_shard_size_and_the_ledger_has_each_step(tmp_path):
    """A client whose true shard (150 rows) differs from the nominal one (100) still samples at
    q = 2 / 100; two GOT rounds record one entry per client, kind and round, and each client's
    epsilon is Opacus' for that history."""
    ffm = _ffm(tmp_path, method="got", protocol="dp", noise_multiplier=1.0, sizes=(100, 150),
               **DP)
    assert [c.state["rate"] for c in ffm.channel.clients] == [Q, Q]
    for round_ in (1, 2):
        ffm.train_round(round_)
    steps = sorted((e.client, e.kind, e.round) for e in ffm.ledger.entries)
    assert steps == sorted((c, k, r) for c in ("client-1", "client-2")
                           for k in ("gradient", "dual_update") for r in (1, 2))
    assert {(e.sample_rate, e.noise_multiplier, e.clip) for e in ffm.ledger.entries} == {
        (Q, 1.0, 1.0)}
    expected = _opacus_epsilon([(1.0, Q, 4)])
    for client in ffm.channel.clients:
        assert ffm.ledger.epsilon(client.id) == pytest.approx(expected, rel=1e-9)
        assert ffm.client_epsilon(client.id, 1.0, 2) == pytest.approx(expected, rel=1e-9)


def _count_exchanges(ffm) -> Counter:
    """Round -> the transport's exchanges in it (each a request to every client asked, and
    their replies), counted as the transport makes them from now on."""
    counts: Counter[int] = Counter()
    transport = ffm.channel.transport
    exchange = transport.exchange

    def counted(requests, endpoints=None):
        counts[next(iter(requests.values())).round] += 1
        return exchange(requests, endpoints)

    transport.exchange = counted
    return counts


def _got_dp_secagg(tmp_path):
    return _ffm(tmp_path, method="got", protocol="dp-secagg", noise_multiplier=1.0,
                sizes=(100, 100, 100), **DP)


def _charged(ffm) -> list[dict]:
    """The server's ``charged`` records, without what places them in the log (``last``: the
    sha256 of the record before)."""
    return [{k: v for k, v in r.items() if k not in ("seq", "prev", "sig", "sha256", "last")}
            for r in ffm.channel.transport.log.events if r["event"] == "charged"]


def test_a_got_round_under_dp_secagg_is_one_secure_aggregation_of_five_exchanges(tmp_path):
    """GOT under dp-secagg (malicious-server secagg), a dual update every round: the
    velocity gradient and the dual update go in one secure aggregation of their joint kind,
    its request to compute carrying theta and phi: 5 exchanges a round. One after another
    (the stage set to aggregate one kind at a time, as before) it is 10; before this, 11 (the
    potential's own broadcast) and a set-up broadcast. Both ways every client is charged
    each kind of each round, in the same charged records, so epsilon is the same."""
    joint, sequential = _got_dp_secagg(tmp_path), _got_dp_secagg(tmp_path)
    sequential.channel.protocol.aggregator("gradient").joins_kinds = False
    counts = {"joint": _count_exchanges(joint), "sequential": _count_exchanges(sequential)}
    for round_ in (1, 2):
        assert joint.train_round(round_).aborted == sequential.train_round(round_).aborted == 0
    assert counts == {"joint": {1: 5, 2: 5}, "sequential": {1: 10, 2: 10}}
    ids = [c.id for c in joint.channel.clients]
    inputs = {r["kind"] for r in _records(joint) if r["phase"] == "masked_input"}
    assert inputs == {"gradient+dual_update"}
    assert sorted((e.client, e.kind, e.round) for e in joint.ledger.entries) == sorted(
        (c, k, r) for c in ids for k in ("gradient", "dual_update") for r in (1, 2))
    assert joint.ledger.entries == sequential.ledger.entries
    assert _charged(joint) == _charged(sequential)
    for cid in ids:
        assert joint.ledger.epsilon(cid) == sequential.ledger.epsilon(cid) > 0


def test_a_kind_released_in_a_joint_aggregation_is_not_released_again_that_round(tmp_path):
    """Adversary: a malicious server that, after round 1's joint aggregation, asks every
    client for round 1's velocity gradient again, alone (a second release at fresh noise
    averages the noise away). Each part of the joint request went through the client's own
    release guard, so each client withholds its input and names why; the aggregation
    aborts and the ledger is unchanged."""
    ffm = _got_dp_secagg(tmp_path)
    assert ffm.train_round(1).aborted == 0
    entries = list(ffm.ledger.entries)
    again = ffm.channel.aggregate(1, "gradient", Task("ffm.velocity", {"round": 1}),
                                  ffm.weights, _template(ffm.velocity))
    assert again.payload is None and ffm.ledger.entries == entries
    refusals = [e for e in ffm.channel.transport.log.events
                if e["event"] == "rejected" and e["sender"] != "server"]
    assert sorted(e["sender"] for e in refusals) == [c.id for c in ffm.channel.clients]
    assert all("refused ffm.velocity for round 1: it answered that round already"
               in e["detail"] for e in refusals)


def test_a_calibrated_sigma_meets_the_target_for_the_planned_steps_and_no_less_does(tmp_path):
    """GOT plans 20 gradient and 4 dual steps: sigma is the smallest (to 1e-3) within 2.0."""
    ffm = _ffm(tmp_path, method="got", protocol="dp", target_epsilon=2.0, rounds=20,
               potential_every=5, sizes=(100,), **DP)
    sigma = ffm.noise_multipliers["client-1"]
    assert _opacus_epsilon([(sigma, Q, 20), (sigma, Q, 4)]) <= 2.0
    assert _opacus_epsilon([(sigma - 2e-3, Q, 20), (sigma - 2e-3, Q, 4)]) > 2.0


def test_planned_steps_count_each_kind_a_client_sends(tmp_path):
    assert _ffm(tmp_path, rounds=12).planned_steps() == {"gradient": 12}
    got = _ffm(tmp_path, method="got", rounds=12, potential_every=5)
    assert got.planned_steps() == {"gradient": 12, "dual_update": 2}
    assert got.planned_steps(30) == {"gradient": 30, "dual_update": 6}


def test_rounds_within_budget_is_the_last_round_within_the_target_and_grows_with_it(tmp_path):
    """At sigma = 1 and q = 0.02, epsilon grows from 1.33 (10 rounds) to 1.84 (100 rounds): the
    answer r keeps epsilon(r) within the target and epsilon(r + 1) above it, and a looser target
    never allows fewer rounds."""
    answers = []
    for target in (1.45, 1.6, 19.0):
        ffm = _ffm(tmp_path, protocol="dp", noise_multiplier=1.0, target_epsilon=target,
                   rounds=100, sizes=(100,), **DP)
        rounds = ffm.rounds_within_budget()
        answers.append(rounds)
        if rounds < 100:
            assert _opacus_epsilon([(1.0, Q, rounds + 1)]) > target
        assert _opacus_epsilon([(1.0, Q, rounds)]) <= target
    assert answers[0] < answers[1] < answers[2] == 100
    assert _ffm(tmp_path, rounds=7).rounds_within_budget() == 7  # no DP: every round


def test_got_under_dp_refuses_gradient_steps_through_the_potential(tmp_path):
    with pytest.raises(ConfigError, match="ctransform_steps = 0 under a dp protocol"):
        _ffm(tmp_path, method="got", protocol="dp", noise_multiplier=1.0, ctransform_steps=2,
             **DP)


# -- one round through a real ProtectedChannel ---------------------------------------------

def _vanilla_gradient(ffm, twin, theta: np.ndarray, round_: int) -> np.ndarray:
    """Vanilla FFM's gradient [P] for ``twin`` at parameters ``theta``, computed from scratch:
    a fresh client with the same id, shard and seeded streams draws the same mini-batch; its
    keyed uniforms give t (first) and x0 (the rest); torch differentiates the mean loss."""
    model = VelocityMLP(ffm.pair.dim, ffm.settings.hidden)
    torch.nn.utils.vector_to_parameters(torch.tensor(theta), model.parameters())
    rows = twin.minibatch_rows(ffm.settings.batch_size)
    u = torch.as_tensor(twin.streams.example_uniforms(
        (round_, "gradient", "example"), rows.numpy(), ffm.pair.source.uniforms + 1))
    x0, t = ffm.pair.source.from_uniforms(u[:, 1:])[0], u[:, 0].float()
    loss = flow_matching_loss(model, x0, twin.data[rows], t).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).numpy()


def test_a_plaintext_round_steps_by_lr_times_the_size_weighted_mean_of_client_gradients(
        tmp_path):
    """Three clients of 12, 20 and 28 rows: each upload is the gradient the client's twin
    computes independently, and the velocity moves by exactly -lr times their mean weighted
    by 12/60, 20/60 and 28/60 (not by the unweighted mean)."""
    sizes = (12, 20, 28)
    ffm = _ffm(tmp_path, sizes=sizes, lr=0.05)
    twins = [new_client(c.id, c.data, deterministic_seed=7) for c in ffm.channel.clients]
    _plain_sgd(ffm)
    before = ffm.velocity.flat()
    expected = {t.id: _vanilla_gradient(ffm, t, before, 1) for t in twins}
    report = ffm.train_round(1)
    uploads = _uploads(ffm, 1)
    assert sorted(uploads) == sorted(expected)
    for cid, gradient in expected.items():
        np.testing.assert_allclose(uploads[cid], gradient, rtol=1e-5, atol=1e-7)
    weighted = sum(n / sum(sizes) * expected[c.id].astype(np.float64)
                   for n, c in zip(sizes, ffm.channel.clients, strict=True))
    unweighted = np.mean([g.astype(np.float64) for g in expected.values()], axis=0)
    assert np.abs(weighted - unweighted).max() > 1e-3  # the weights matter at this tolerance
    np.testing.assert_allclose(ffm.velocity.flat(), before - ffm.settings.lr * weighted,
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose((before - ffm.velocity.flat()) / ffm.settings.lr, weighted,
                               rtol=1e-3, atol=5e-5)
    assert report.aborted == 0


def test_every_client_trains_from_the_broadcast_model(tmp_path):
    """The round's global_model broadcast reaches each client (sha256 logged per client),
    each replica holds those parameters when it computes its gradient, and the client then
    forgets the broadcast (its last use this round: its saved state need not carry it)."""
    ffm = _ffm(tmp_path, sizes=(12, 20, 28))
    theta = ffm.velocity.flat()
    ffm.train_round(1)
    digest = hashlib.sha256(serialize_payload({"theta": theta})).hexdigest()
    sent = [r for r in _records(ffm) if r["kind"] == "global_model"]
    assert [(r["sender"], r["recipient"], r["sha256"]) for r in sent] == [
        ("server", c.id, digest) for c in ffm.channel.clients]
    for client in ffm.channel.clients:
        assert "global_model" not in client.inbox
        replica = torch.nn.utils.parameters_to_vector(client.state["velocity"].parameters())
        assert np.array_equal(replica.detach().numpy(), theta)


def test_got_requests_carry_the_potential_each_round_starts_with(tmp_path):
    """potential_every = 2 over rounds 1-4: dual updates in rounds 2 and 4. Each round's
    request carries to every client the potential the server held as the round started (no
    set-up broadcast, none after a dual update: the next request carries it), and each
    client's replica trains from that copy."""
    ffm = _ffm(tmp_path, method="got", sizes=(12, 20, 28), potential_every=2)
    held = {0: ffm.potential.flat()}
    for round_ in range(1, 5):
        ffm.train_round(round_)
        held[round_] = ffm.potential.flat()
    sent = [r for r in _records(ffm) if r["kind"] == "global_potential"]
    clients = [c.id for c in ffm.channel.clients]
    assert [(r["round"], r["recipient"]) for r in sent] == [
        (round_, cid) for round_ in range(1, 5) for cid in clients]
    for r in sent:
        assert r["sender"] == "server" and r["phase"] == "broadcast"
        assert r["sha256"] == hashlib.sha256(
            serialize_payload({"phi": held[r["round"] - 1]})).hexdigest()
    assert not np.array_equal(held[2], held[0]) and np.array_equal(held[3], held[2])
    dual = {r["round"] for r in _records(ffm) if r["kind"] == "dual_update"}
    assert dual == {2, 4}
    for client in ffm.channel.clients:
        assert np.array_equal(client.inbox["global_potential"]["phi"], held[3])
        replica = torch.nn.utils.parameters_to_vector(client.state["potential"].parameters())
        assert np.array_equal(replica.detach().numpy(), held[3])


def test_under_a_dp_stage_the_step_is_the_equal_weight_mean_of_the_uploads(tmp_path):
    """Shards of 12, 36 and 60 rows (size weighting asked): the dp protocol releases no shard
    size, so the weights are client_weights(equal=True), 1/3 each, and the velocity moves by
    -lr times the plain mean of the three (noisy) uploads the server received."""
    ffm = _ffm(tmp_path, protocol="dp", noise_multiplier=1.0, sizes=(12, 36, 60), lr=0.05,
               **DP)
    clients = ffm.channel.clients
    assert ffm.weights == client_weights(clients, "size", equal=True) == {
        c.id: pytest.approx(1 / 3) for c in clients}
    assert client_weights(clients, "size") == pytest.approx(
        {"client-1": 12 / 108, "client-2": 36 / 108, "client-3": 60 / 108})
    _plain_sgd(ffm)
    before = ffm.velocity.flat()
    report = ffm.train_round(1)
    uploads = _uploads(ffm, 1)
    assert sorted(uploads) == [c.id for c in clients]
    mean = np.mean([g.astype(np.float64) for g in uploads.values()], axis=0)
    np.testing.assert_allclose(ffm.velocity.flat(), before - ffm.settings.lr * mean,
                               rtol=0, atol=1e-6)
    assert report == RoundReport()  # no unprivatized client loss is reported under DP


@pytest.mark.parametrize("method, aborts", [("vanilla", 1), ("got", 2)])
def test_an_aborted_aggregation_leaves_the_model_unchanged(tmp_path, method, aborts):
    """Every client goes offline at upload in round 1 (a FaultPlan): no aggregation has an
    input, so each aborts (logged with the dropped clients), the report counts it, and neither
    the velocity, its optimizer nor (GOT) the potential moves or is re-broadcast."""
    ids = ("client-1", "client-2", "client-3")
    plan = FaultPlan("all-drop", tuple(Fault("drop", cid, "upload", (1,)) for cid in ids))
    ffm = _ffm(tmp_path, method=method, sizes=(12, 20, 28), faults=plan)
    velocity = ffm.velocity.flat()
    potential = ffm.potential.flat() if ffm.potential is not None else None
    report = ffm.train_round(1)
    assert report == RoundReport(aborted=aborts)
    assert np.array_equal(ffm.velocity.flat(), velocity)
    assert ffm.velocity.optimizer.state_dict()["state"] == {}  # Adam never stepped
    events = [e for e in ffm.channel.transport.log.events if e["round"] == 1]
    assert [e["event"] for e in events] == ["dropped"] * 3 + ["aborted"] + (
        ["dropped"] * 3 + ["aborted"] if method == "got" else [])
    assert not [r for r in _records(ffm) if r["phase"] == "upload"]
    if potential is not None:
        assert np.array_equal(ffm.potential.flat(), potential)
        assert {r["round"] for r in _records(ffm) if r["kind"] == "global_potential"} == {1}


@pytest.mark.parametrize("task", [
    Task("ffm.leak", {"round": 1}), Task("ffm.velocity", {}),
    Task("ffm.velocity", {"round": "1"}), Task("ffm.dual", {"round": -1})])
def test_a_client_refuses_a_task_it_does_not_run_in_its_signed_event(tmp_path, task):
    """Adversary: a server asking a client's program for a task it does not have, or with a
    missing or malformed round. The client answers nothing and signs a ``rejected`` event
    naming the task (before, an unknown task or a missing round raised out of the client's
    handler and stopped the run)."""
    from secureffm.federation.exchange import Request
    from secureffm.federation.message import SERVER

    ffm = _ffm(tmp_path, sizes=(12, 20, 28))
    endpoint = ffm.channel.endpoints["client-1"]
    reply = endpoint(Request(1, "gradient", "upload", "upload", "upload", (), None,
                             {"compute": task}), None)
    assert reply.envelope is None
    [event] = reply.events
    assert (event["event"], event["sender"], event["party"]) == ("rejected", "client-1", SERVER)
    assert task.name in event["detail"]
