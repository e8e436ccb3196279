"""The one-run DP audit (Steinke, Nasr and Jagielski 2023): its p-value against a brute-force
worst case over every (epsilon, delta)-DP mechanism on a few canaries, its bound on a known
mechanism, the canaries' planting and file, and (slow) the bound of real DP runs beside a
broken mechanism whose ledger still claims epsilon 1."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from scipy.sparse import lil_matrix
from scipy.stats import binom

from secureffm.audit.attacks import run_attack
from secureffm.audit.one_run import (
    GUESS_FRACTIONS,
    epsilon_lower_bound,
    guess_counts,
    one_run_audit,
    p_value,
)
from secureffm.cli import main
from secureffm.config import RunConfig
from secureffm.data.pairs import get_pair
from secureffm.errors import ConfigError, SecureFFMError
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import new_client
from secureffm.methods.ffm import FederatedFlowMatching, FFMClient, FFMSettings
from secureffm.models.params import flat_grad
from secureffm.privacy import dpsgd
from secureffm.privacy.canaries import (
    AUDIT_NOTICE,
    CANARY_FILE,
    canary_sum,
    draw_canaries,
    load_canaries,
    save_canaries,
)
from secureffm.protocols import load_protocol
from secureffm.runs import run
from secureffm.runs.scaffold import open_channel, resolve_dp


def _worst_case(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """max P[at least v correct] over every (epsilon, delta)-DP mechanism from the coins
    S in {-1, 1}^m to guesses T in {-1, 0, 1}^m with at most r non-zero, by linear programming:
    variables P(t | s) and, per neighbouring (s, s') and t, u >= P(t|s) - e^eps P(t|s'), with
    sum_t u <= delta (the hockey-stick form of (epsilon, delta)-DP on a finite output set)."""
    inputs = list(itertools.product((-1, 1), repeat=m))
    outputs = [t for t in itertools.product((-1, 0, 1), repeat=m) if sum(map(abs, t)) <= r]
    pairs = [(a, b) for a, b in itertools.permutations(range(len(inputs)), 2)
             if sum(x != y for x, y in zip(inputs[a], inputs[b], strict=True)) == 1]
    n_in, n_out = len(inputs), len(outputs)
    n_p, n_u = n_in * n_out, len(pairs) * n_out
    objective = np.zeros(n_p + n_u)
    for a, s in enumerate(inputs):
        for j, t in enumerate(outputs):
            if sum(x == y for x, y in zip(s, t, strict=True)) >= v:
                objective[a * n_out + j] = -1.0 / n_in  # linprog minimises
    upper = lil_matrix((n_u + len(pairs), n_p + n_u))
    for k, (a, b) in enumerate(pairs):
        for j in range(n_out):
            row = k * n_out + j
            upper[row, a * n_out + j] = 1.0
            upper[row, b * n_out + j] = -math.exp(epsilon)
            upper[row, n_p + row] = -1.0
            upper[n_u + k, n_p + row] = 1.0
    limits = np.concatenate([np.zeros(n_u), np.full(len(pairs), delta)])
    equal = lil_matrix((n_in, n_p + n_u))
    for a in range(n_in):
        equal[a, a * n_out:(a + 1) * n_out] = 1.0
    result = linprog(objective, A_ub=upper.tocsr(), b_ub=limits, A_eq=equal.tocsr(),
                     b_eq=np.ones(n_in), bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return -result.fun


@pytest.mark.parametrize("m, epsilon, delta", [
    (3, 0.5, 0.0), (3, 1.5, 0.0), (3, 0.5, 0.02), (3, 1.0, 0.05),
    pytest.param(4, 1.0, 0.02, marks=pytest.mark.slow),  # 13 s of linear programs
])
def test_p_value_is_at_least_the_worst_mechanism_and_tight_without_delta(m, epsilon, delta):
    p = 1 / (1 + math.exp(-epsilon))
    for r in (m - 1, m):
        for v in range(1, r + 1):
            worst = _worst_case(m, r, v, epsilon, delta)
            bound = p_value(m, r, v, epsilon, delta)
            assert bound >= worst - 1e-7, (r, v, bound, worst)
            if delta == 0 and v > r * p:  # randomized response meets Bin(r, p) exactly
                assert bound == pytest.approx(worst, abs=1e-7)


def _closed_form(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Steinke et al.'s Appendix D expression, without the v <= r p guard."""
    p = 1 / (1 + math.exp(-epsilon))
    alpha = max(sum(binom.pmf(v - j, r, p) for j in range(1, i + 1)) / i
                for i in range(1, v + 1))
    return binom.sf(v - 1, r, p) + 2 * m * delta * alpha


def test_delta_term_is_needed_and_the_closed_form_fails_below_the_mean():
    """Above the mean, a mechanism with delta > 0 beats the pure binomial tail (so an
    implementation without the delta term would over-certify) and the closed form holds;
    below it (v = 1 of 3 at p = 0.62), a mechanism beats the closed form itself, which is why
    p_value answers 1 there."""
    m, r, epsilon, delta = 3, 3, 1.0, 0.05
    worst = _worst_case(m, r, 3, epsilon, delta)
    assert worst > binom.sf(2, r, 1 / (1 + math.exp(-epsilon))) + 0.01
    assert _closed_form(m, r, 3, epsilon, delta) >= worst
    below = _worst_case(m, r, 1, 0.5, delta)
    assert _closed_form(m, r, 1, 0.5, delta) < below - 0.01
    assert p_value(m, r, 1, 0.5, delta) == 1.0


def test_lower_bound_is_where_the_p_value_crosses_beta():
    m, r, v, delta, beta = 1000, 200, 170, 1e-5, 0.05
    bound = epsilon_lower_bound(m, r, v, delta, beta)
    assert p_value(m, r, v, bound, delta) < beta <= p_value(m, r, v, bound + 2e-4, delta)
    assert epsilon_lower_bound(m, r, r // 2, delta, beta) == 0.0  # chance explains it


def test_bad_audit_inputs_raise_with_what_to_change():
    with pytest.raises(SecureFFMError, match="0 <= v <= r <= m"):
        p_value(10, 20, 5, 1.0, 0.0)
    with pytest.raises(SecureFFMError, match="beta"):
        epsilon_lower_bound(10, 4, 4, 0.0, beta=1.5)
    with pytest.raises(SecureFFMError, match="exceed"):
        guess_counts(np.zeros(4), np.zeros(4, bool), 3, 3)


def test_guesses_take_the_top_as_in_and_the_bottom_as_out():
    scores = np.array([0.9, -0.5, 0.1, 0.7, -0.9, 0.0])
    included = np.array([True, False, True, False, False, True])
    # top 2: 0.9 (IN, right), 0.7 (OUT, wrong); bottom 2: -0.9 (OUT, right), -0.5 (OUT, right)
    assert guess_counts(scores, included, 2, 2) == (4, 3)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_randomized_response_is_audited_close_to_and_below_its_epsilon(epsilon):
    """epsilon-DP randomized response on 2000 canaries: each coin reported right with
    probability e^eps / (1 + e^eps). Guessing every canary from the reports, the bound at
    beta = 0.05 lands below epsilon and within 0.4 of it (fixed generator: no flakiness)."""
    rng = np.random.default_rng(5)
    m = 2000
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < 1 / (1 + math.exp(-epsilon))
    reports = np.where(truthful, included, ~included)
    scores = reports + 0.01 * rng.random(m)  # ties broken at random
    k = int(reports.sum())
    r, v = guess_counts(scores, included, k, m - k)
    bound = epsilon_lower_bound(m, r, v, 0.0, 0.05)
    assert epsilon - 0.4 < bound <= epsilon


def test_canaries_are_fair_secret_coins_and_round_trip(tmp_path):
    torch.manual_seed(0)
    first = draw_canaries(400, 2, torch.zeros(30))
    torch.manual_seed(0)
    second = draw_canaries(400, 2, torch.zeros(30))
    assert not torch.equal(first.included, second.included)  # OS entropy, not the seed
    assert not torch.equal(first.directions, second.directions)
    assert 150 < int(first.included.sum()) < 250
    assert torch.allclose(first.directions.norm(dim=1), torch.ones(400))
    assert first.clients.tolist() == [i % 2 for i in range(400)]
    save_canaries(first, tmp_path / CANARY_FILE)
    loaded = load_canaries(tmp_path / CANARY_FILE)
    assert torch.equal(loaded.directions, first.directions)
    assert torch.equal(loaded.included, first.included)
    assert torch.equal(loaded.of_client(1), first.directions[first.included & (first.clients == 1)])
    from safetensors import safe_open
    with safe_open(str(tmp_path / CANARY_FILE), framework="pt") as handle:
        assert handle.metadata()["purpose"] == AUDIT_NOTICE
    with pytest.raises(SecureFFMError, match="at least 2"):
        draw_canaries(1, 2, torch.zeros(3))


def test_canary_sum_samples_at_the_rate_and_adds_clip_times_each_direction():
    directions = torch.eye(5)
    assert np.array_equal(canary_sum(directions, 1.0, 2.0, torch.Generator()),
                          np.full(5, 2.0, dtype=np.float32))
    assert not canary_sum(directions, 0.0, 2.0, torch.Generator()).any()
    kept = np.mean([canary_sum(torch.eye(200), 0.25, 1.0, torch.Generator().manual_seed(s))
                    for s in range(20)])
    assert kept == pytest.approx(0.25, abs=0.02)


def _one_client(tmp_path, name: str, planted: torch.Tensor | None):
    """A DP client (q = 1, seeded streams) under protocol dp, optionally with canaries."""
    config = RunConfig(method="vanilla", protocol="dp", noise_multiplier=1.0, shard_size=16,
                       batch_size=16, hidden=8, progress=False, device="cpu")
    data = get_pair(config.data).target.sample(16, torch.Generator().manual_seed(3))[0]
    client = new_client("client-1", data, deterministic_seed=7)
    settings = FFMSettings.of(config)
    protocol = load_protocol("dp")
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    program = FFMClient(settings, dp, get_pair(config.data), torch.device("cpu"))
    if planted is not None:
        program.plant({"client-1": planted})
    channel = open_channel(protocol, [client], MessageLog(tmp_path / name / "messages.jsonl"),
                           program=program)
    torch.manual_seed(0)
    ffm = FederatedFlowMatching(settings, dp, get_pair(config.data), channel,
                                torch.device("cpu"))
    program.setup(client)
    channel.broadcast(1, "global_model", {"theta": ffm.velocity.flat()})
    return program, client, config


def test_a_planted_canary_adds_clip_times_its_direction_over_the_batch(tmp_path):
    """At q = 1 the canary is sampled every step; the same secret streams give the same data
    term and DP noise, so the two updates differ by exactly C u / B."""
    plain, client, config = _one_client(tmp_path, "plain", None)
    parameters = flat_grad(client.state["velocity"]).size
    u = torch.randn(1, parameters, generator=torch.Generator().manual_seed(1))
    u /= u.norm()
    planted, other, _ = _one_client(tmp_path, "planted", u)
    difference = (planted._velocity(other, 1)["gradient"]
                  - plain._velocity(client, 1)["gradient"])
    assert np.allclose(difference, u[0].numpy() / config.batch_size, atol=1e-6)


def test_canaries_need_a_dp_ffm_run(small_config):
    with pytest.raises(ConfigError, match="canaries"):
        RunConfig(canaries=-1)
    with pytest.raises(ConfigError, match="no dp stage"):
        run(small_config(method="vanilla", protocol="plaintext", canaries=10))
    with pytest.raises(ConfigError, match="'vanilla' or 'got'"):
        run(small_config(method="lot", protocol="dp", canaries=10, overwrite=True))
    program = FFMClient(FFMSettings.of(small_config()), None, get_pair("8gaussians-moons"),
                        torch.device("cpu"))
    with pytest.raises(ConfigError, match="dp stage"):
        program.plant({"client-1": torch.zeros(1, 3)})


@pytest.mark.parametrize("method", ["vanilla", "got"])
def test_an_audit_run_says_so_and_audits_end_to_end(small_config, method):
    # q = 1 keeps the accounting of privacy.json quick (RDP in closed form); 10 rounds fit
    # the target at this fixed multiplier for both methods (a plan past it is refused)
    config = small_config(method=method, protocol="dp", noise_multiplier=3.0, delta=1e-4,
                          rounds=10, shard_size=64, batch_size=64, partition="iid", canaries=60,
                          insecure_deterministic=False)
    result = run(config)
    out = result.out
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["audit_run"] == {"canaries": 60, "notice": AUDIT_NOTICE}
    assert result.metrics["audit_run"]["canaries"] == 60
    assert "canaries = 60" in (out / "config.toml").read_text()
    report = one_run_audit(out)
    assert report["canaries"] == 60 and 0 < report["included"] < 60
    assert report["guesses"] in {2 * max(1, math.ceil(f * 30)) for f in GUESS_FRACTIONS}
    assert report["epsilon_accounted"] > 0 and report["delta"] == 1e-4
    assert 0 <= report["epsilon_lower_bound"] <= report["epsilon_accounted"]
    assert report["accounted_is_guarantee"] == 1.0
    if method == "vanilla":  # the same audit as `secureffm audit --attack one-run RUN_DIR`
        assert run_attack(out, "one-run") == report
        assert main(["audit", "--attack", "one-run", str(out)]) == 0


def test_the_accounted_epsilon_of_an_insecure_deterministic_run_is_no_guarantee(
        small_config, capsys):
    """Reader: whoever sets the empirical bound beside the accounted epsilon. With the secret
    streams derived from the published seed, anyone can replay and subtract the DP noise, so
    the accounted epsilon bounds nothing; before this the audit printed it as the guarantee."""
    out = run(small_config(method="vanilla", protocol="dp", noise_multiplier=3.0, delta=1e-4,
                           shard_size=64, batch_size=64, partition="iid", canaries=20,
                           rounds=2, eval_samples=100, nfe=(1,), trajectories=10)).out
    report = one_run_audit(out)
    assert report["accounted_is_guarantee"] == 0.0 and report["epsilon_accounted"] > 0
    assert main(["audit", "--attack", "one-run", str(out)]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed[:printed.rindex("}") + 1])["one-run"] == report
    assert printed.splitlines()[-1].startswith(
        "INSECURE: epsilon_accounted is not a guarantee. DOES NOT HOLD in this run")


def _no_noise(self) -> np.ndarray:
    """The broken mechanism: DP-SGD's clipped sum over E[b] without its Gaussian noise."""
    return flat_grad(self.model) / np.float32(self.expected_batch)


AUDIT_SIZE = dict(rounds=1000, shard_size=10_000, batch_size=256, canaries=1000,
                  eval_samples=300, nfe=(1,), trajectories=10, insecure_deterministic=False)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["dp", "dp-secagg"])
def test_broken_noise_is_caught_and_honest_noise_is_not(small_config, tmp_path, monkeypatch,
                                                        protocol):
    """The same ledger (sigma calibrated to epsilon 1) over two runs: with DP-SGD as built the
    bound stays at or below 1; with the noise switched off (the test's adversary, not the code
    under test) the audit certifies more than 1, so the claim is caught."""
    honest = run(small_config(method="vanilla", protocol=protocol, target_epsilon=1.0,
                              out=str(tmp_path / "honest"), **AUDIT_SIZE))
    monkeypatch.setattr(dpsgd.DPGradient, "_noisy_mean", _no_noise)
    broken = run(small_config(method="vanilla", protocol=protocol, target_epsilon=1.0,
                              out=str(tmp_path / "broken"), **AUDIT_SIZE))
    honest, broken = one_run_audit(honest.out), one_run_audit(broken.out)
    assert honest["epsilon_accounted"] <= 1.0 and broken["epsilon_accounted"] <= 1.0
    assert honest["epsilon_lower_bound"] <= honest["epsilon_accounted"]
    assert broken["epsilon_lower_bound"] > 1.0
