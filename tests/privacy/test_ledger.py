"""The privacy ledger (secureffm/privacy/ledger.py).

Truths used: Opacus' RDP and PRV accountants stepped once per mechanism call, as its own
training loop steps them, and the Skellam bound computed from the steps as recorded.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from secureffm.privacy import LedgerEntry, PrivacyLedger
from secureffm.privacy.skellam import SkellamStep, skellam_epsilon

DELTA = 1e-5


def direct(accountant, steps, delta):
    """Opacus used the way its own training loop uses it: one step() per mechanism call."""
    for sigma, rate in steps:
        accountant.step(noise_multiplier=sigma, sample_rate=rate)
    return accountant.get_epsilon(delta)


def test_ledger_epsilon_equals_a_direct_opacus_computation():
    ledger = PrivacyLedger(delta=1e-5)
    steps = []
    for round_ in range(1, 301):
        ledger.record(LedgerEntry("client-1", "gradient", round_, 0.02, 1.1, 1.0))
        steps.append((1.1, 0.02))
        if round_ % 5 == 0:
            ledger.record(LedgerEntry("client-1", "dual_update", round_, 0.02, 1.1, 1.0))
            steps.append((1.1, 0.02))
    assert ledger.epsilon("client-1", "rdp") == pytest.approx(
        direct(RDPAccountant(), steps, 1e-5), rel=1e-9)
    assert ledger.epsilon("client-1", "prv") == pytest.approx(
        direct(PRVAccountant(), steps, 1e-5), rel=1e-2)
    only_gradient = [(1.1, 0.02)] * 300
    assert ledger.epsilon("client-1", "rdp", ("gradient",)) == pytest.approx(
        direct(RDPAccountant(), only_gradient, 1e-5), rel=1e-9)
    report = ledger.report(target=8.0)["clients"]["client-1"]
    assert report["rdp"]["total"] > report["rdp"]["by_kind"]["gradient"]
    assert report["target_held"] == (report["rdp"]["total"] <= 8.0)


def test_a_schedule_prv_cannot_evaluate_is_reported_not_fatal():
    ledger = PrivacyLedger(delta=1e-5)
    ledger.record(LedgerEntry("client-1", "gradient", 1, 0.0256, 0.05, 1.0, steps=1000))
    row = ledger.report(target=None)["clients"]["client-1"]
    assert row["rdp"]["total"] > 1000  # almost no noise: a huge but finite RDP bound
    assert row["prv"]["total"] is None and "PRV accountant could not" in row["prv"]["error"]


def test_target_held_tests_the_total_of_the_accountant_that_enforces_it():
    """At sigma 1, q 0.02 and 300 steps PRV gives 2.21 and RDP 2.56: a target of 2.4 is held
    when PRV enforces it and broken when RDP does."""
    ledger = PrivacyLedger(DELTA)
    ledger.record(LedgerEntry("client-1", "gradient", 1, 0.02, 1.0, 1.0, steps=300))
    prv = ledger.report(2.4, accountant="prv")
    rdp = ledger.report(2.4, accountant="rdp")
    assert prv["enforced_by"] == "prv" and rdp["enforced_by"] == "rdp"
    row = prv["clients"]["client-1"]
    assert row["prv"]["total"] < 2.4 < row["rdp"]["total"]
    assert row["prv"]["total"] == pytest.approx(direct(PRVAccountant(), [(1.0, 0.02)] * 300,
                                                       DELTA), rel=1e-2)
    assert row["target_held"] is True
    assert rdp["clients"]["client-1"]["target_held"] is False
    assert ledger.report(None)["clients"]["client-1"]["target_held"] is None


def test_consecutive_identical_steps_merge_and_a_change_starts_a_new_step():
    ledger = PrivacyLedger(DELTA)
    for sigma in (1.0, 1.0, 1.0, 2.0, 1.0):
        ledger.record(LedgerEntry("client-1", "gradient", 1, 0.1, sigma, 1.0))
    ledger.record(LedgerEntry("client-1", "gradient", 2, 0.2, 1.0, 1.0, steps=4))
    ledger.record(LedgerEntry("client-1", "dual_update", 2, 0.1, 1.0, 1.0))
    assert ledger.schedule("client-1", ("gradient",)) == [(1.0, 0.1, 3), (2.0, 0.1, 1),
                                                          (1.0, 0.1, 1), (1.0, 0.2, 4)]
    assert ledger.schedule("client-1") == ledger.schedule("client-1", ("gradient",)) + [
        (1.0, 0.1, 1)]
    assert len(ledger.entries) == 7
    assert ledger.state_dict() == {"delta": DELTA,
                                   "entries": [asdict(e) for e in ledger.entries]}


def test_clients_are_accounted_apart():
    ledger = PrivacyLedger(DELTA)
    ledger.record(LedgerEntry("client-2", "gradient", 1, 0.02, 1.0, 1.0, steps=50))
    ledger.record(LedgerEntry("client-1", "gradient", 1, 0.02, 1.0, 1.0, steps=10))
    assert ledger.clients() == ["client-1", "client-2"]
    assert ledger.epsilon("client-1") == pytest.approx(
        direct(RDPAccountant(), [(1.0, 0.02)] * 10, DELTA), rel=1e-9)
    assert ledger.epsilon("client-3") == 0.0


def test_skellam_steps_merge_and_compose_with_the_clients_gaussian_steps():
    """Distributed noise: identical consecutive Skellam entries merge; epsilon is the Skellam
    bound of the merged schedule composed with the client's Gaussian steps; PRV is refused
    (and reported as not evaluated, not as a number)."""
    ledger = PrivacyLedger(DELTA)
    skellam = dict(mechanism="skellam", l2=40.0, l1=900.0, variance=4e4)
    for round_ in (1, 2, 3):
        ledger.record(LedgerEntry("client-1", "gradient", round_, 0.05, 1.0, 1.0, **skellam))
    ledger.record(LedgerEntry("client-1", "dual_update", 3, 0.05, 1.0, 1.0, steps=2))
    merged = [SkellamStep(0.05, 40.0, 900.0, 4e4, 3)]
    assert ledger.skellam_schedule("client-1") == merged
    assert ledger.epsilon("client-1") == skellam_epsilon(merged, DELTA, [(1.0, 0.05, 2)])
    assert ledger.epsilon("client-1") > ledger.epsilon("client-1", kinds=("dual_update",)) > 0
    with pytest.raises(ValueError, match="PRV accountant does not cover the Skellam"):
        ledger.epsilon("client-1", "prv")
    row = ledger.report(None)["clients"]["client-1"]
    assert row["prv"]["total"] is None and "Skellam" in row["prv"]["error"]
    assert row["skellam_schedule"]["gradient"] == [asdict(merged[0])]


def test_a_clients_history_composes_like_its_entries_and_leaves_the_ledger_alone():
    """A resumed run plans on top of :meth:`PrivacyLedger.history`: the client's merged steps
    give the epsilon its entries give, and recording into the copy changes nothing here."""
    ledger = PrivacyLedger(1e-5)
    for round_ in range(1, 6):
        ledger.record(LedgerEntry("client-1", "gradient", round_, 0.02, 1.1, 1.0))
        ledger.record(LedgerEntry("client-2", "gradient", round_, 0.02, 0.9, 1.0))
    history = ledger.history("client-1")
    assert history.epsilon("client-1") == ledger.epsilon("client-1")
    history.record(LedgerEntry("client-1", "gradient", 6, 0.02, 1.1, 1.0, steps=5))
    assert history.epsilon("client-1") > ledger.epsilon("client-1")
    assert ledger.schedule("client-1") == [(1.1, 0.02, 5)]
    assert history.clients() == ["client-1"]
