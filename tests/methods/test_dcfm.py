import copy
import json
import math

import numpy as np
import pytest
import torch

from secureffm.audit import verify_run
from secureffm.config import DCFM_TEACHERS, RunConfig
from secureffm.data.modes2d import MISSING, OBSERVED, in_mode_fraction
from secureffm.errors import ConfigError, ProtocolError
from secureffm.federation.channel import Task
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Client, new_clients
from secureffm.methods.dcfm import (
    TEACHERS,
    ComposedField,
    DCFMClient,
    DCFMServer,
    LocalExpert,
    Masking,
    anchors,
    attribute_holders,
    combination_index,
    example_width,
    expert_losses,
    label_counts,
    mask_labels,
    random_route,
    split_uniforms,
    teacher_paths,
)
from secureffm.models.conditional import ConditionalVelocityMLP
from secureffm.privacy.budget import ServerLedger
from secureffm.privacy.settings import DPSettings
from secureffm.protocols.protocol import load_protocol
from secureffm.runs import run
from secureffm.runs.dcfm import conditional_data, dcfm_settings, load_dcfm, nominal_shard_size
from secureffm.runs.scaffold import open_channel

CARDS = (3, 2)


def _model(seed=0, shape=(2,)):
    torch.manual_seed(seed)
    return ConditionalVelocityMLP(shape, CARDS, hidden=16)


def _labels(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(c, (n,), generator=g) for c in CARDS], dim=1)


@pytest.mark.parametrize("shape", [(2,), (3, 4, 4)])
def test_composed_velocity_is_the_sum_formula_of_eq5(shape):
    model = _model(shape=shape)
    n = 7
    x, t, y = torch.randn(n, *shape), torch.rand(n), _labels(n)
    weights = [1.5, 0.5]
    null = torch.tensor(CARDS).expand(n, 2)
    uncond = model(x, t, null)
    only = [torch.stack([y[:, 0], null[:, 1]], 1), torch.stack([null[:, 0], y[:, 1]], 1)]
    expected = uncond + sum(w * (model(x, t, o) - uncond)
                           for w, o in zip(weights, only, strict=True))
    route = torch.zeros(n, 3, dtype=torch.long)
    with torch.no_grad():
        got = ComposedField([model], y, route, CARDS, weights)(x, t)
    torch.testing.assert_close(got, expected.detach())


def test_routed_composition_asks_each_slot_of_its_own_expert():
    experts = [_model(0), _model(1)]
    n = 6
    x, t, y = torch.randn(n, 2), torch.rand(n), _labels(n)
    route = torch.tensor([[0, 1, 0], [1, 0, 1], [1, 1, 1], [0, 0, 0], [0, 1, 1], [1, 0, 0]])
    with torch.no_grad():
        got = ComposedField(experts, y, route, CARDS)(x, t)
        for j in range(n):
            null = torch.tensor([CARDS])
            xj, tj = x[j:j + 1], t[j:j + 1]
            u = experts[route[j, 0]](xj, tj, null)
            v1 = experts[route[j, 1]](xj, tj, torch.tensor([[y[j, 0], CARDS[1]]]))
            v2 = experts[route[j, 2]](xj, tj, torch.tensor([[CARDS[0], y[j, 1]]]))
            torch.testing.assert_close(got[j:j + 1], v1 + v2 - u)


def test_masking_follows_the_configured_probabilities():
    n, cards = 40_000, (3, 2, 4)
    y = torch.stack([torch.randint(c, (n,)) for c in cards], dim=1)
    masking = Masking(full=0.5, marginal=0.3, uncond=0.2)
    masked = mask_labels(y, cards, masking, torch.rand(n, 2, generator=torch.Generator()
                                                      .manual_seed(0), dtype=torch.float64))
    kept = masked != torch.tensor(cards)
    assert (masked[kept] == y[kept]).all()  # kept entries are the true labels
    counts = kept.sum(dim=1)
    expected = {"full": 0.5, "uncond": 0.2}
    observed = {"full": (counts == 3).float().mean(), "uncond": (counts == 0).float().mean()}
    for j in range(3):  # each single attribute with probability marginal / k
        expected[j] = 0.3 / 3
        observed[j] = ((counts == 1) & kept[:, j]).float().mean()
    assert ((counts == 1) | (counts == 3) | (counts == 0)).all()  # nothing else occurs
    for key, p in expected.items():
        assert abs(float(observed[key]) - p) < 5 * math.sqrt(p * (1 - p) / n), key


def test_masking_probabilities_must_sum_to_one():
    with pytest.raises(ConfigError, match="sum to 1"):
        Masking(0.5, 0.2, 0.2)


def test_routes_go_only_to_experts_holding_the_value_and_include_the_trainee():
    # expert 0 holds (0,0),(1,1); expert 1 holds (0,1); expert 2 holds (2,0)
    counts = torch.zeros(3, 6, dtype=torch.long)
    for b, combos in enumerate([[(0, 0), (1, 1)], [(0, 1)], [(2, 0)]]):
        for combo in combos:
            counts[b, combination_index(torch.tensor([combo]), CARDS)] = 5
    holders = attribute_holders(counts, CARDS)
    assert holders[0].tolist() == [[True, True, False], [True, False, False],
                                   [False, False, True]]
    y = torch.tensor([[0, 0], [1, 1]]).repeat(500, 1)  # expert 0's data
    u = torch.rand(1000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    route = random_route(y, holders, u, own=0)
    for slot in (1, 2):
        assert holders[slot - 1][route[:, slot], y[:, slot - 1]].all()
    assert (route == 0).any(dim=1).all()
    assert set(route[:, 0].tolist()) == {0, 1, 2}  # the unconditional slot: any expert
    free = random_route(y, holders, u)  # without ``own``: uniform over the holders
    value_zero = y[:, 0] == 0  # attribute 0 = 0 is held by experts 0 and 1
    share = (free[value_zero, 1] == 1).double().mean()
    assert abs(float(share) - 0.5) < 5 * math.sqrt(0.25 / int(value_zero.sum()))


def test_each_row_of_a_mask_a_route_and_a_loss_depends_on_its_own_uniforms_only():
    """Row j of mask_labels, random_route and expert_losses is a function of (x1_j, y_j, u_j):
    the rows of a sub-batch equal the same rows of the whole batch, so one example more or
    less never changes another's draws (the DP premise)."""
    n, g = 40, torch.Generator().manual_seed(1)
    x1, y = torch.randn(n, 2, generator=g), _labels(n, 1)
    u = torch.rand(n, example_width((2,), 2), generator=g, dtype=torch.float64)
    holders = [torch.ones(3, c, dtype=torch.bool) for c in CARDS]
    peers = [_model(0), _model(1), _model(2)]
    sub = torch.tensor([3, 17, 18, 39])
    draws = split_uniforms(u, (2,), 2)
    assert torch.equal(mask_labels(y, CARDS, Masking(), draws.mask)[sub],
                       mask_labels(y[sub], CARDS, Masking(), draws.mask[sub]))
    assert torch.equal(random_route(y, holders, draws.route, own=1)[sub],
                       random_route(y[sub], holders, draws.route[sub], own=1))
    with torch.no_grad():
        whole = expert_losses(peers[1], x1, y, CARDS, Masking(), u, 1.0, peers, 1, holders)
        part = expert_losses(peers[1], x1[sub], y[sub], CARDS, Masking(), u[sub], 1.0, peers,
                             1, holders)
    torch.testing.assert_close(part, whole[sub])


def test_example_uniforms_give_standard_normal_sources_and_uniform_times():
    u = torch.rand(20_000, example_width((3, 2, 2), 2), generator=torch.Generator()
                   .manual_seed(2), dtype=torch.float64)
    draws = split_uniforms(u, (3, 2, 2), 2)
    assert draws.x0.shape == (20_000, 3, 2, 2) and draws.x0.dtype == torch.float32
    z = draws.x0.reshape(-1).double()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float(draws.t.mean()) - 0.5) < 0.01
    edge = split_uniforms(torch.full((1, u.shape[1]), 1 - 2.0**-53, dtype=torch.float64),
                          (3, 2, 2), 2)  # the largest uniform the stream can give
    assert torch.isfinite(edge.x0).all()


def _client(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    y = _labels(n, seed)
    client = Client(f"client-{seed}", torch.randn(n, 2, generator=g), g)
    client.state["labels"] = y
    return client


def test_peer_experts_are_frozen_and_the_experts_own_marginals_learn():
    own = LocalExpert(_client(), _model(0), 1e-2, 0.0, 32, CARDS, Masking(1.0, 0.0, 0.0))
    peer = _model(1)
    before = copy.deepcopy(peer.state_dict())
    holders = [torch.ones(2, c, dtype=torch.bool) for c in CARDS]
    # no masking (full labels only): the null rows of the embeddings are reached only through
    # the CI target's own unconditional and marginal outputs, which must carry gradient
    rows = torch.arange(32)
    x1, y = own.client.data[rows], own.client.state["labels"][rows]
    losses = expert_losses(own.model, x1, y, CARDS, own.masking, own.uniforms(1, 0, rows), 1.0,
                           [own.model, peer], 0, holders)
    losses.sum().backward()
    assert all(p.grad is None for p in peer.parameters())
    assert all(table.weight.grad[-1].abs().sum() > 0 for table in own.model.embeddings)
    start = copy.deepcopy(own.model.state_dict())
    own.step(1, 0, 1.0, [own.model, peer], 0, holders)
    for name, value in peer.state_dict().items():
        assert torch.equal(value, before[name])
    assert any(not torch.equal(v, start[k]) for k, v in own.model.state_dict().items())


def test_label_counts_count_each_combination():
    y = torch.tensor([[0, 0], [2, 1], [2, 1], [1, 0]])
    assert label_counts(y, CARDS).tolist() == [1, 0, 1, 0, 0, 2]


def _config(tmp_path, method, **changes):
    values = dict(method=method, data="modes2d", partition="disjoint", shard_size=150,
                  batch_size=32, hidden=16, local_steps=6, dcfm_steps=4, distill_steps=4,
                  teacher_steps=4, fedflow_rounds=2, fedflow_local_steps=2, eval_samples=50,
                  nfe=(4,), progress=False, device="cpu", out=str(tmp_path / method))
    values.update(changes)
    return RunConfig(**values)


def _records(out):
    return [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rounds", [2])
def test_dcfm_a_run_all_gathers_then_uploads_and_writes_the_run_folder(tmp_path, rounds):
    result = run(_config(tmp_path, "dcfm-a", dcfm_rounds=rounds))
    names = {p.name for p in result.out.iterdir()}
    assert {"config.toml", "metrics.json", "messages.jsonl", "samples.png",
            "checkpoint.safetensors"} <= names
    assert verify_run(result.out).ok
    models = [r for r in _records(result.out) if r["kind"] == "model"]
    # per round: 2 uploads + 2 relays; then 2 uploads to the server for sampling
    assert len(models) == 4 * rounds + 2
    assert sum(r["recipient"] == "server" for r in models) == 2 * rounds + 2
    comm = result.metrics["communication"]
    sent = sum(r["bytes"] for r in models if r["sender"] == "client-1")
    assert comm["client-1"]["sent_bytes"] == sent
    assert 0.0 <= result.metrics["eval"]["missing_mode_fraction"] <= 1.0
    sampler = load_dcfm(result.out)
    x = sampler.sample((1, 0), 5, torch.Generator().manual_seed(0), nfe=3)
    assert x.shape == (5, 2) and torch.isfinite(x).all()


def test_dcfm_b_uploads_once_and_returns_the_student(tmp_path):
    result = run(_config(tmp_path, "dcfm-b", protocol="sealed"))
    assert verify_run(result.out).ok
    models = [r for r in _records(result.out) if r["kind"] == "model"]
    assert [r["recipient"] for r in models[:2]] == ["server", "server"]
    assert [r["sender"] for r in models[2:]] == ["server", "server"]
    assert all("sealed" in r["stages"] for r in models)
    assert load_dcfm(result.out).kind == "monolithic"


@pytest.mark.slow  # the ledger's RDP and PRV accounting takes ~15 s here
def test_dcfm_a_under_dp_trains_every_step_with_dp_sgd(tmp_path):
    result = run(_config(tmp_path, "dcfm-a", protocol="dp-sealed", noise_multiplier=2.0,
                         target_epsilon=20.0, insecure_deterministic=False))
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert privacy["noise_multiplier"] == {"client-1": 2.0, "client-2": 2.0}
    for row in privacy["clients"].values():
        assert row["target_held"] and 0 < row["rdp"]["total"] <= 20.0
        # stage I + 3 DCFM-A rounds, each at q = batch / nominal shard size (150 here)
        assert row["schedule"]["model"] == [[2.0, 32 / 150, 6 + 3 * 4]]
    models = [r for r in _records(result.out) if r["kind"] == "model"]
    assert all(r["stages"] == ["dp", "sealed"] for r in models)


def test_dp_expert_clips_each_example():
    clip, sigma = 1e-3, 1e-9  # noise negligible: the clipped sum is bounded by b * C
    settings = DPSettings(clip=clip, delta=1e-5, target_epsilon=None, noise_multiplier=sigma,
                          accountant="rdp")
    client = _client(n=200)
    expert = LocalExpert(client, _model(0), 1e-2, 0.0, 50, CARDS, Masking(), settings, sigma,
                         nominal_size=200)
    peer = _model(1)
    holders = [torch.ones(2, c, dtype=torch.bool) for c in CARDS]
    for round_ in range(3):
        expert.step(round_, 0, 1.0, [expert.model, peer], 0, holders)
    assert expert.rate == 0.25
    rows = torch.arange(50)
    x1, y = client.data[rows], client.state["labels"][rows]
    u = expert.uniforms(3, 0, rows)  # the same noise, times, masks and routes for both
    clean = _model(0)
    clean.load_state_dict(expert.model.state_dict())
    plain = expert_losses(clean, x1, y, CARDS, Masking(), u, 1.0, [clean, peer], 0, holders)
    plain.sum().backward()
    assert sum(p.grad.norm() ** 2 for p in clean.parameters()).sqrt() > 10 * 50 * clip
    losses = expert.losses(3, 0, rows, 1.0, [expert.model, peer], 0, holders)
    torch.testing.assert_close(losses, plain)
    grad = expert.estimator(losses, len(losses))  # (sum of clipped + noise) / E[b]
    assert np.linalg.norm(grad) * 50 <= 50 * clip * 1.001


def test_run_experts_take_q_and_the_divisor_from_the_nominal_shard_size(tmp_path):
    """Under DP every client's q and E[b] come from the data set's size over the number of
    clients, however unequal the Dirichlet shards are."""
    config = _config(tmp_path, "dcfm-a", partition="dirichlet", dirichlet_alpha=0.3,
                     clients=3, shard_size=100, batch_size=20)
    data = conditional_data(config)
    sizes = [len(x) for x, _ in data.shards]
    assert len(set(sizes)) == 3 and nominal_shard_size(data) == 100
    clients = [Client(f"client-{i}", x, torch.Generator())
               for i, (x, _) in enumerate(data.shards, start=1)]
    for client, (_, labels) in zip(clients, data.shards, strict=True):
        client.state["labels"] = labels
    settings, _ = dcfm_settings(config, data.facts, load_protocol("plaintext"))
    dp = DPSettings(clip=1.0, delta=1e-5, target_epsilon=None, noise_multiplier=1.5,
                    accountant="rdp")
    program = DCFMClient(settings, dp, [c.id for c in clients], torch.device("cpu"))
    for client in clients:
        program.setup(client)
    experts = [c.state["expert"] for c in clients]
    assert [(e.rate, e.estimator.expected_batch, e.sigma) for e in experts] == [(0.2, 20, 1.5)] * 3


def test_a_dp_expert_without_a_nominal_size_is_refused():
    settings = DPSettings(clip=1.0, delta=1e-5, target_epsilon=None, noise_multiplier=1.0,
                          accountant="rdp")
    with pytest.raises(ConfigError, match="nominal shard size"):
        LocalExpert(_client(), _model(0), 1e-2, 0.0, 8, CARDS, Masking(), settings, 1.0)


def test_a_protocol_that_leaves_models_unprotected_is_refused(tmp_path):
    with pytest.raises(ProtocolError, match="none of what method 'dcfm-a' sends \\(model\\)"):
        run(_config(tmp_path, "dcfm-a", protocol="dp"))


def test_dcfm_methods_need_conditional_data():
    with pytest.raises(ConfigError, match="modes2d"):
        RunConfig(method="dcfm-a", data="8gaussians-moons")


def _adam_steps(client: Client) -> set[int]:
    """The optimizer steps the client's own expert took (Adam's step count, per parameter)."""
    return {int(state["step"]) for state in client.kept["expert"].optimizer.state.values()}


def _federation(config, data, dp):
    protocol = load_protocol(config.protocol)
    settings, _ = dcfm_settings(config, data.facts, protocol)
    clients = new_clients([x for x, _ in data.shards], deterministic_seed=1)
    for client, (_, labels) in zip(clients, data.shards, strict=True):
        client.state["labels"] = labels
    program = DCFMClient(settings, dp, [c.id for c in clients], torch.device("cpu"))
    return settings, clients, program, protocol


def test_a_client_asked_to_publish_trains_what_it_has_not_trained_yet(tmp_path):
    """Asked to publish after DCFM-A round 2 first, a client runs stage I and both rounds;
    asked again for an earlier point, it trains nothing more."""
    config = _config(tmp_path, "dcfm-a", dcfm_rounds=2)
    _, clients, program, _ = _federation(config, conditional_data(config), None)
    client = clients[0]
    program(client, Task("dcfm.publish", {"rounds": 2}))
    assert _adam_steps(client) == {6 + 2 * 4} and client.state["trained"] == 2
    program(client, Task("dcfm.publish", {"rounds": 1}))
    assert _adam_steps(client) == {6 + 2 * 4}


def test_the_server_charges_each_client_every_step_it_ran(tmp_path):
    """DCFM-A under DP: the server's ledger, charged from the public schedule only, holds for
    each client exactly as many steps as the client's own optimizer took."""
    config = _config(tmp_path, "dcfm-a", protocol="dp-sealed", noise_multiplier=4.0,
                     dcfm_rounds=2)
    data = conditional_data(config)
    dp = DPSettings(clip=1.0, delta=1e-5, target_epsilon=None, noise_multiplier=4.0,
                    accountant="rdp")
    settings, clients, program, protocol = _federation(config, data, dp)
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl"),
                           program=program)
    ledger = ServerLedger(dp, 32 / 150, dict.fromkeys((c.id for c in clients), 4.0))
    DCFMServer(channel, settings, torch.device("cpu"), ledger).run_a()
    for client in clients:
        ran = _adam_steps(client)
        assert ran == {6 + 2 * 4}
        assert ledger.ledger.schedule(client.id) == [(4.0, 32 / 150, 6 + 2 * 4)]


# -- DCFM-B's teacher paths -----------------------------------------------------------------

class _ExactExpert(torch.nn.Module):
    """The exact velocity of x_t = (1 - t) x0 + t x1 toward an expert's own data, the modes2d
    Gaussians it holds (``held``: combination -> count), for full, marginal or null labels:
    E[x1 - x0 | x_t] under the mixture of the held modes that agree with the label. A closed
    form standing in for a perfectly trained stage-I expert, independent of the code tested."""

    def __init__(self, held: dict[tuple[int, int], int]):
        super().__init__()
        self.held = held

    def forward(self, x, t, labels):
        from secureffm.data.modes2d import STD, mode_centres

        t = t.reshape(-1, 1)
        var = (1 - t) ** 2 + t ** 2 * STD ** 2  # Var x_t per coordinate, one mode
        logits, means = [], []
        for combo, count in self.held.items():
            m = mode_centres(torch.tensor([combo]))[0]
            agree = ((labels == 2) | (labels == torch.tensor(combo))).all(dim=1)
            r = x - t * m
            log_weight = math.log(count) - (r ** 2).sum(dim=1) / (2 * var[:, 0])
            logits.append(torch.where(agree, log_weight, -torch.inf))
            means.append(m + (t * STD ** 2 - (1 - t)) / var * r)  # E[x1 - x0 | x_t, mode]
        weights = torch.softmax(torch.stack(logits, dim=1), dim=1)  # [B, modes]
        return (weights[:, :, None] * torch.stack(means, dim=1)).sum(dim=1)


def _non_iid_experts():
    """Exact experts of the paper's non-IID split of modes2d and their label counts: client 1
    the left column (top-left, half of bottom-left), client 2 the bottom row."""
    held = [{(0, 0): 2, (0, 1): 1}, {(0, 1): 1, (1, 1): 2}]
    counts = torch.zeros(2, 4, dtype=torch.long)
    for b, h in enumerate(held):
        for combo, count in h.items():
            counts[b, combination_index(torch.tensor([combo]), (2, 2))] = count
    return [_ExactExpert(h) for h in held], counts


def _path_ends(teacher, paths=600, steps=32):
    """End points and labels of ``teacher``'s paths from the exact non-IID experts."""
    experts, counts = _non_iid_experts()
    x, t, y, v = teacher_paths(experts, counts, (2, 2), (2,), paths, steps,
                               torch.Generator().manual_seed(0), torch.device("cpu"), teacher)
    last = t == (steps - 1) / steps
    return x[last] + v[last] / steps, y[last]


def test_exact_expert_paths_end_in_their_modes():
    """The closed-form stand-in is right: one expert's full-label paths land in the mode."""
    expert = _ExactExpert({(0, 0): 2, (0, 1): 1})
    x = torch.randn(2000, 2, generator=torch.Generator().manual_seed(1))
    for combo in ((0, 0), (0, 1)):
        y = torch.tensor([combo]).expand(len(x), 2)
        z = x.clone()
        for s in range(32):
            z = z + expert(z, torch.full((len(z),), s / 32), y) / 32
        assert in_mode_fraction(z, combo) > 0.97


def test_anchored_teacher_takes_the_novel_label_to_the_missing_mode():
    """Under the non-IID split, Eq. (5) anchored on the observed (0, 1) composes the holders'
    full conditionals (1, 1) + (0, 0) - (0, 1) and lands the paths of (1, 0) in the top-right
    mode; the marginals composed under a route land at m_right + m_top - m_uncond of the
    expert answering the unconditional slot, (2, 0) or (0, 2), never in it; the literal
    reading (observed labels only) has no path for (1, 0) at all."""
    novel = torch.tensor(MISSING)
    ends, y = _path_ends("anchored")
    rows = (y == novel).all(dim=1)
    assert rows.sum() > 50
    assert in_mode_fraction(ends[rows], MISSING) > 0.95
    for combo in OBSERVED:
        seen = (y == torch.tensor(combo)).all(dim=1)
        assert in_mode_fraction(ends[seen], combo) > 0.95
    ends, y = _path_ends("marginal")
    rows = (y == novel).all(dim=1)
    assert rows.sum() > 50 and in_mode_fraction(ends[rows], MISSING) < 0.05
    assert not (_path_ends("observed")[1] == novel).all(dim=1).any()


def test_anchors_are_observed_combinations_one_substitution_per_attribute_from_y():
    _, counts = _non_iid_experts()
    table = anchors(counts, (2, 2))
    index = {combo: int(combination_index(torch.tensor([combo]), (2, 2))) for combo in
             ((0, 0), (0, 1), (1, 0), (1, 1))}
    for combo in OBSERVED:  # an observed combination is its own sole anchor
        assert table[index[combo]].nonzero().flatten().tolist() == [index[combo]]
    assert table[index[MISSING]].nonzero().flatten().tolist() == [index[(0, 1)]]
    # with (0, 1) unobserved, (1, 0) has no anchor: (0, 0) and (1, 1) each miss a neighbour
    counts[:, index[(0, 1)]] = 0
    assert not anchors(counts, (2, 2))[index[MISSING]].any()


def test_the_teacher_readings_are_the_config_choices():
    assert TEACHERS == DCFM_TEACHERS
    with pytest.raises(ConfigError, match="dcfm_teacher"):
        RunConfig(method="dcfm-b", data="modes2d", dcfm_teacher="composite")
