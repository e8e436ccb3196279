"""secureffm/privacy/budget.py: calibration, the one overspending policy, the server's charges."""

import json
import re

import pytest
from opacus.accountants import RDPAccountant

from secureffm.config import RunConfig
from secureffm.errors import BudgetError
from secureffm.privacy.budget import Plan, ServerLedger, affordable, noise_multiplier
from secureffm.privacy.ledger import CHARGED, charged_entries
from secureffm.privacy.settings import DPSettings
from secureffm.runs import run

DELTA = 1e-5


def _opacus(history: list[tuple[float, float, int]]) -> float:
    accountant = RDPAccountant()
    accountant.history = history
    return accountant.get_epsilon(DELTA)


def _dp(**changes) -> DPSettings:
    values = dict(clip=1.0, delta=DELTA, target_epsilon=3.0, noise_multiplier=None,
                  accountant="rdp")
    return DPSettings(**{**values, **changes})


def test_a_calibrated_sigma_composes_every_kind_of_the_plan_to_the_target():
    """sigma for 30 gradient and 6 dual steps at q = 0.05 keeps Opacus' composed epsilon within
    the target, and 2e-3 less does not; a given sigma is taken as it is."""
    plan = Plan(0.05, (("gradient", 30), ("dual_update", 6)))
    sigma = noise_multiplier(_dp(), plan)
    assert _opacus([(sigma, 0.05, 30), (sigma, 0.05, 6)]) <= 3.0
    assert _opacus([(sigma - 2e-3, 0.05, 30), (sigma - 2e-3, 0.05, 6)]) > 3.0
    assert noise_multiplier(_dp(noise_multiplier=0.9), plan) == 0.9


def test_affordable_is_the_last_count_within_the_target():
    spent = [0.0, 1.0, 2.0, 2.5, 4.0, 9.0]
    assert affordable(spent.__getitem__, 2.5, 1, 5) == 3
    assert affordable(spent.__getitem__, 9.0, 1, 5) == 5
    assert affordable(spent.__getitem__, 0.5, 1, 5) == 0  # not even the first fits


def test_a_charge_is_recorded_and_signed_as_the_entries_an_audit_rebuilds():
    notes = []
    ledger = ServerLedger(_dp(), 0.05, {"client-1": 1.1, "client-2": 1.1},
                         note=lambda *args: notes.append(args))
    ledger.charge(["client-1", "client-2"], "gradient", 4, steps=3)
    ledger.charge([], "gradient", 5)  # no client asked: nothing charged, nothing signed
    [(round_, event, _, fields)] = notes
    assert (round_, event) == (4, CHARGED)
    assert charged_entries({**fields, "round": round_}) == ledger.ledger.entries
    assert ledger.ledger.epsilon("client-1") == pytest.approx(_opacus([(1.1, 0.05, 3)]))
    assert ledger.accounting()["noise_multiplier"] == {"client-1": 1.1, "client-2": 1.1}


def test_ffm_refuses_a_fixed_noise_multiplier_that_would_pass_the_target(small_config):
    """At sigma = 1 and q = 16 / 400, 200 rounds pass epsilon 2: the run is refused before
    its first round, naming the last round that fits (before issue 40 FFM trained fewer rounds
    than asked and said so on stderr only)."""
    config = small_config(method="vanilla", protocol="dp", rounds=200, noise_multiplier=1.0,
                          target_epsilon=2.0, shard_size=400, batch_size=16)
    with pytest.raises(BudgetError, match="past the target 2") as refused:
        run(config)
    fit = int(re.search(r"pass --rounds (\d+)", str(refused.value)).group(1))
    assert 0 < fit < 200
    assert _opacus([(1.0, 16 / 400, fit)]) <= 2.0 < _opacus([(1.0, 16 / 400, fit + 1)])
    records = [json.loads(x) for x in open(f"{config.out}/messages.jsonl")]
    assert not [r for r in records if r["kind"] == "gradient"]  # no client computed a thing


def test_dcfm_refuses_a_fixed_noise_multiplier_the_same_way(tmp_path):
    """DCFM-B's 6 planned stage-I steps at sigma 1 and q = 32 / 150 pass epsilon 4 (5.0; two
    steps spend 3.6): refused with the same error, naming how many steps fit."""
    config = RunConfig(method="dcfm-b", protocol="dp-sealed", data="modes2d", shard_size=150,
                       batch_size=32, hidden=16, local_steps=6, distill_steps=4,
                       teacher_steps=4, eval_samples=50, nfe=(4,), progress=False,
                       device="cpu", noise_multiplier=1.0, target_epsilon=4.0,
                       out=str(tmp_path / "dcfm"))
    with pytest.raises(BudgetError, match="past the target 4") as refused:
        run(config)
    fit = int(re.search(r"plan at most (\d+) steps", str(refused.value)).group(1))
    assert fit == 2
    assert _opacus([(1.0, 32 / 150, fit)]) <= 4.0 < _opacus([(1.0, 32 / 150, fit + 1)])
