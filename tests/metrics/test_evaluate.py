"""Evaluation of a trained flow (secureffm/metrics/evaluate.py) on fields with closed forms.

Truths used: for v(x, t) = x from N(0, I) in 2D, n Euler steps give (1 + 1/n)^n x0 and the
exact flow e x0, whose W2 to N(0, I) is sqrt(2) |s - 1| for scale s (the Gaussian closed form);
its straightness on Euler paths is a finite sum near E|x0|^2 (e - 1)(3 - e) / 2; a constant
field is straight (straightness 0) and Euler-exact at every NFE. For the potential: with f = 0
each target takes its nearest candidate (brute force with numpy), and a steep linear f sends
every target to one. The i.i.d. floor is W2 between two samples of the target: for the same
Gaussian on both sides, about as far from the exact flow's scale as the sampling error allows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from secureffm.data.pairs import DataPair
from secureffm.data.toy2d import DISTRIBUTIONS
from secureffm.metrics.evaluate import evaluate_flow, potential_health
from secureffm.metrics.w2 import w2

GAUSSIANS = DataPair(DISTRIBUTIONS["gaussian"], DISTRIBUTIONS["gaussian"])
CPU = torch.device("cpu")
SAMPLES = 1000


class _Identity(nn.Module):
    """v(x, t) = x."""

    def forward(self, x, t):
        return x


class _Constant(nn.Module):
    """v(x, t) = (3, 4): moves every point by 5."""

    def forward(self, x, t):
        return torch.tensor([3.0, 4.0]).expand_as(x)


class _Linear(nn.Module):
    """f(x) = a . x."""

    def __init__(self, a):
        super().__init__()
        self.a = torch.tensor(a)

    def forward(self, x):
        return x @ self.a


def _evaluate(model, nfes=(1, 4)):
    return evaluate_flow(model, GAUSSIANS, nfes, SAMPLES, torch.Generator().manual_seed(0), CPU)


def test_w2_per_nfe_follows_eulers_scale_and_the_adaptive_solve_the_exact_flow():
    """W2 between samples of 1,000 points errs by about 0.1; the NFEs differ by 0.4 or more."""
    report, generated = _evaluate(_Identity())
    for nfe in (1, 4):
        scale = (1 + 1 / nfe) ** nfe
        assert report.w2[nfe] == pytest.approx(math.sqrt(2) * (scale - 1), abs=0.2)
    assert report.adaptive["w2"] == pytest.approx(math.sqrt(2) * (math.e - 1), abs=0.2)
    assert report.adaptive["solver"] == "dopri5" and report.adaptive["nfe"] > 6
    assert torch.allclose(generated["adaptive"], generated["euler-1"] / 2 * math.e, atol=1e-3)


def test_straightness_of_the_exponential_flow_has_its_closed_form():
    """On 100 Euler steps z_k = 1.01^k x0, so the documented estimator (left Riemann sum) is
    E|x0|^2 sum_k (1.01^100 - 1 - 1.01^k)^2 / 100, near the exact flow's
    E|x0|^2 (e - 1)(3 - e) / 2."""
    report, _ = _evaluate(_Identity())
    x0 = GAUSSIANS.source.sample(SAMPLES, torch.Generator().manual_seed(0))[0]
    power = 1.01 ** np.arange(100)
    per_unit = np.mean((1.01**100 - 1 - power) ** 2)
    assert per_unit == pytest.approx((math.e - 1) * (3 - math.e) / 2, rel=0.05)
    assert report.straightness == pytest.approx(x0.pow(2).sum(1).mean().item() * per_unit,
                                                rel=1e-4)


def test_a_constant_field_is_straight_and_euler_exact_at_every_nfe():
    report, generated = _evaluate(_Constant(), nfes=(1, 8))
    assert report.straightness == pytest.approx(0.0, abs=1e-9)
    assert torch.allclose(generated["euler-8"], generated["euler-1"], atol=1e-5)
    assert report.w2[1] == pytest.approx(5.0, abs=0.2)
    assert report.w2[1] == pytest.approx(report.w2[8], abs=1e-4)


def test_the_report_names_every_sample_set_and_serializes_with_string_keys():
    report, generated = _evaluate(_Constant(), nfes=(1, 2))
    assert set(generated) == {"euler-1", "euler-2", "adaptive", "target"}
    assert all(v.shape == (SAMPLES, 2) and v.device.type == "cpu" for v in generated.values())
    data = report.to_dict()
    assert set(data["w2"]) == set(data["inference_seconds"]) == {"1", "2"}
    assert data["eval_samples"] == SAMPLES and data["potential"] == {}
    assert all(seconds >= 0 for seconds in report.inference_seconds.values())
    assert set(data["seconds"]) == {"sampling", "straightness", "w2"}
    assert data["iid_floor"] == report.iid_floor


def test_the_floor_is_w2_to_a_second_target_sample_from_its_own_generator():
    """With ``floor_generator`` the evaluator's generator draws only x0 and the target, so a
    caller's later draws are those it made before the floor existed."""
    evaluator, floor = torch.Generator().manual_seed(0), torch.Generator().manual_seed(9)
    report, generated = evaluate_flow(_Identity(), GAUSSIANS, (1,), SAMPLES, evaluator, CPU,
                                      floor_generator=floor)
    replay = torch.Generator().manual_seed(0)
    for _ in range(2):  # x0, then the target
        GAUSSIANS.source.sample(SAMPLES, replay)
    assert torch.equal(evaluator.get_state(), replay.get_state())
    second = GAUSSIANS.target.sample(SAMPLES, torch.Generator().manual_seed(9))[0]
    assert report.iid_floor == w2(second, generated["target"])
    # Two samples of N(0, I): far below the identity field's W2, above zero.
    assert 0.0 < report.iid_floor < 0.25 < report.w2[1]


def test_progress_shows_every_solve_and_w2_problem(capsys):
    """Two Euler NFEs, the adaptive solve and straightness, then four W2 problems."""
    evaluate_flow(_Constant(), GAUSSIANS, (1, 2), 200, torch.Generator().manual_seed(0), CPU,
                  progress=True)
    shown = capsys.readouterr().err
    assert "evaluation" in shown and "8/8" in shown


def test_with_a_zero_potential_each_target_takes_its_nearest_candidate():
    """The dual value is then the mean of min_k |c_k - x1|^2 / 2; the unused share counts the
    candidates nobody's nearest."""
    target = DISTRIBUTIONS["moons"].sample(40, torch.Generator().manual_seed(1))[0]
    zero = _Linear([0.0, 0.0])
    health = potential_health(zero, GAUSSIANS, target, 64, torch.Generator().manual_seed(2))
    replay = torch.Generator().manual_seed(2)
    GAUSSIANS.source.sample(40, replay)  # x0 is drawn first
    candidates = GAUSSIANS.source.sample(64, replay)[0].double().numpy()
    cost = 0.5 * ((candidates[:, None, :] - target.double().numpy()[None]) ** 2).sum(-1)
    assert health["dual_value"] == pytest.approx(cost.min(0).mean(), rel=1e-5)
    assert health["unused_candidates"] == pytest.approx(1 - len(np.unique(cost.argmin(0))) / 64)


def test_a_collapsed_potential_leaves_all_but_one_candidate_unused():
    target = DISTRIBUTIONS["moons"].sample(100, torch.Generator().manual_seed(1))[0]
    steep = _Linear([1e6, 0.0])
    health = potential_health(steep, GAUSSIANS, target, 32, torch.Generator().manual_seed(3))
    assert health["unused_candidates"] == pytest.approx(1 - 1 / 32)
