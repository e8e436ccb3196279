import json
import math

import numpy as np
import pytest
import torch
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from scipy.special import logsumexp
from scipy.stats import skellam

from secureffm.errors import ProtocolError
from secureffm.federation import Client, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.privacy.settings import DistributedNoise
from secureffm.privacy.skellam import (
    ORDERS,
    SkellamStep,
    grid_sensitivity,
    skellam_epsilon,
    skellam_rdp,
    subsampled_rdp,
)
from secureffm.protocols import load_protocol
from secureffm.runs import run
from secureffm.runs.scaffold import open_channel


def exact_skellam_rdp(alpha: int, shift: int, variance: float) -> float:
    """D_alpha(Sk + shift || Sk) by summing the pmf (scipy), Sk of the given variance."""
    width = int(60 * math.sqrt(variance)) + shift + 60
    x = np.arange(-width, width + 1)
    log_p = skellam.logpmf(x - shift, variance / 2, variance / 2)
    log_q = skellam.logpmf(x, variance / 2, variance / 2)
    finite = np.isfinite(log_p) & np.isfinite(log_q)
    return float(logsumexp(alpha * log_p[finite] + (1 - alpha) * log_q[finite])) / (alpha - 1)


@pytest.mark.parametrize("variance", [3.0, 30.0, 300.0, 3000.0])
@pytest.mark.parametrize("shift", [1, 2, 5])
def test_the_skellam_rdp_bound_holds_against_the_exact_divergence(variance, shift):
    for alpha in (2, 4, 16, 64):
        exact = exact_skellam_rdp(alpha, shift, variance)
        assert exact <= skellam_rdp(alpha, shift, shift, variance) * (1 + 1e-9)


def zhu_wang_by_the_formula(alpha: int, q: float, base) -> float:
    terms = [(alpha - 1) * math.log1p(-q) + math.log(alpha * q - q + 1),
             math.log(math.comb(alpha, 2)) + 2 * math.log(q) + (alpha - 2) * math.log1p(-q)
             + base(2)]
    for order in range(3, alpha + 1):
        terms.append(math.log(3 * math.comb(alpha, order)) + (alpha - order) * math.log1p(-q)
                     + order * math.log(q) + (order - 1) * base(order))
    return min(float(logsumexp(terms)) / (alpha - 1), base(alpha))


@pytest.mark.parametrize("q, sigma", [(0.01, 1.0), (0.1, 0.8), (0.05, 2.0)])
def test_subsampled_rdp_is_the_zhu_wang_bound_and_never_below_the_exact_gaussian(q, sigma):
    base = np.array([a / (2 * sigma**2) for a in ORDERS])  # the Gaussian mechanism's RDP
    bound = subsampled_rdp(q, base)
    for index in (0, 1, 5, 30, 120, 254):
        alpha = ORDERS[index]
        assert bound[index] == pytest.approx(
            zhu_wang_by_the_formula(alpha, q, lambda a: a / (2 * sigma**2)), rel=1e-9)
    exact = np.array(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(ORDERS)))
    assert np.all(bound >= exact * (1 - 1e-9))
    np.testing.assert_allclose(subsampled_rdp(1.0, base), base)


def test_skellam_epsilon_is_at_least_the_gaussian_one_at_the_same_noise():
    # A Skellam sum of std tau * l2 is never better than the Gaussian of multiplier tau.
    tau, q, steps = 1.1, 0.05, 500
    for l2 in (10.0, 1000.0):
        sk = skellam_epsilon([SkellamStep(q, l2, 30 * l2, (tau * l2) ** 2, steps)], 1e-5)
        rdp = compute_rdp(q=q, noise_multiplier=tau, steps=steps, orders=list(ORDERS))
        gaussian, _ = get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=1e-5)
        assert sk >= gaussian
    assert sk < 1.3 * gaussian  # with many levels per clip the extra terms are small


def test_fewer_honest_survivors_spend_more_for_the_same_noise_share(tmp_path):
    weights = {f"client-{i}": 1.0 for i in range(1, 6)}
    sensitivity = {cid: 1.0 / 64 for cid in weights}
    spent = {}
    for threshold, colluders in [(3, 0), (5, 0), (5, 2)]:
        path = tmp_path / f"t{threshold}c{colluders}.toml"
        path.write_text(_distributed_spec(threshold, colluders))
        protocol = load_protocol(str(path))
        geometry = protocol.noise_geometry("gradient", weights, sensitivity, 1000)
        l2, l1 = geometry.sensitivity["client-1"]
        share = 4.0 * l2**2  # the same noise added by each client in every setting
        spent[(threshold, colluders)] = skellam_epsilon(
            [SkellamStep(0.05, l2, l1, geometry.honest * share, 200)], 1e-5)
    assert spent[(3, 0)] > spent[(5, 0)]
    assert spent[(5, 2)] == pytest.approx(spent[(3, 0)])  # 2 colluders of 5 = 3 honest


def _distributed_spec(threshold: int, colluders: int) -> str:
    return ('name = "d"\n[[stages]]\nstage = "dp"\nprotects = ["gradient"]\nclip = 1.0\n'
            f'delta = 1e-5\ntarget_epsilon = 8.0\nnoise = "distributed"\ncolluders = {colluders}\n'
            f'[[stages]]\nstage = "secagg"\nprotects = ["gradient"]\nthreshold = {threshold}\n')


def aggregate_noise(tmp_path, faults=None, size=20000):
    """Decoded mean minus the true mean of one secure aggregation with distributed noise."""
    clients = [Client(f"client-{i}", torch.zeros(10, 2), torch.Generator(),
                      protocol_rng=np.random.default_rng(i)) for i in range(1, 5)]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol("dp-secagg-distributed"), clients, log, faults)
    values = {c.id: np.full(size, 0.01 * i, dtype=np.float32) for i, c in enumerate(clients)}
    weights = {c.id: 1.0 for c in clients}
    noise = DistributedNoise(1.0, {c.id: 1e-3 for c in clients})
    for endpoint in channel.endpoints.values():  # each client's own plan, which it checks
        endpoint.noise = lambda *_: noise  # the server's share variance against
    result = channel.aggregate(0, "gradient", lambda c: {"gradient": values[c.id]}, weights,
                               {"gradient": ((size,), np.dtype(np.float32))}, noise)
    truth = np.mean([values[cid] for cid in result.included], axis=0)
    stage = channel.protocol.aggregator("gradient")
    geometry = stage.noise_geometry(weights, noise.sensitivity, size, 0)
    share = geometry.share_variance(1.0) * stage.quantizer.step**2  # per client, update units
    return result.payload["gradient"] - truth, share, len(result.included)


def test_secure_aggregation_adds_each_survivors_noise_share_and_only_theirs(tmp_path):
    error, share, n = aggregate_noise(tmp_path)
    assert n == 4
    # mean of n clients' inputs: noise variance n * share / n^2, plus rounding (< step^2 / 4)
    assert abs(error.mean()) < 5 * math.sqrt(share / n / error.size)
    assert error.var() == pytest.approx(share / n, rel=0.05)
    faults = FaultPlan(faults=(Fault("drop", "client-4", "masked_input"),))
    error, share, n = aggregate_noise(tmp_path / "drop", faults)
    assert n == 3 and error.var() == pytest.approx(share / n, rel=0.05)


def test_distributed_noise_is_refused_without_secure_aggregation_or_with_prv(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "d"\n[[stages]]\nstage = "dp"\nprotects = ["gradient"]\nclip = 1.0\n'
                    'delta = 1e-5\ntarget_epsilon = 8.0\nnoise = "distributed"\n')
    with pytest.raises(ProtocolError, match="only inside secure aggregation"):
        load_protocol(str(path))
    path.write_text(_distributed_spec(3, 0).replace('noise = "distributed"',
                                                   'noise = "distributed"\naccountant = "prv"'))
    with pytest.raises(ProtocolError, match="PRV accountant does not cover"):
        load_protocol(str(path))
    path.write_text(_distributed_spec(3, 3))
    protocol = load_protocol(str(path))
    with pytest.raises(ProtocolError, match="no honest client"):
        protocol.noise_geometry("gradient", {f"c{i}": 1.0 for i in range(5)},
                                {f"c{i}": 1.0 for i in range(5)}, 10)


def test_grid_sensitivity_covers_rounding_of_neighbouring_inputs():
    rng = np.random.default_rng(0)
    step, dim, sens = 0.01, 50, 0.3
    l2, l1 = grid_sensitivity(sens, 1.0, step, dim)
    for _ in range(200):
        a = rng.normal(size=dim)
        b = a + rng.normal(size=dim) * sens / math.sqrt(dim) * rng.uniform(0, 1)
        b = a + (b - a) * min(1.0, sens / np.linalg.norm(b - a))
        u = rng.random(dim)  # shared uniforms: the coupling of the two roundings
        diff = np.floor(a / step + u) - np.floor(b / step + u)
        assert np.linalg.norm(diff) <= l2 and np.abs(diff).sum() <= l1


@pytest.mark.parametrize("method", ["vanilla", "got"])
def test_a_distributed_noise_run_meets_its_target_with_skellam_accounting(small_config, method):
    result = run(small_config(method=method, protocol="dp-secagg-distributed", rounds=20,
                              potential_every=5, target_epsilon=4.0, insecure_deterministic=False))
    report = json.loads((result.out / "privacy.json").read_text())
    for row in report["clients"].values():
        assert row["target_held"] and 3.5 < row["rdp"]["total"] <= 4.0
        assert row["prv"]["total"] is None and "Skellam" in row["prv"]["error"]
        assert "gradient" in row["skellam_schedule"]
