import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from secureffm.errors import ConfigError
from secureffm.privacy import LedgerEntry, PrivacyLedger, calibrate_noise, epsilon


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


def test_composition_spends_more_than_either_mechanism():
    one = epsilon([(1.0, 0.05, 200)], 1e-5)
    both = epsilon([(1.0, 0.05, 200), (1.0, 0.05, 40)], 1e-5)
    assert both > one > 0
    assert epsilon([], 1e-5) == 0.0


def test_calibrated_noise_is_the_smallest_that_meets_the_target():
    plan = [(256 / 10_000, 500), (256 / 10_000, 100)]
    sigma = calibrate_noise(4.0, 1e-5, plan, tolerance=1e-3)
    assert epsilon([(sigma, q, n) for q, n in plan], 1e-5) <= 4.0
    assert epsilon([(sigma - 2e-3, q, n) for q, n in plan], 1e-5) > 4.0


def test_a_schedule_prv_cannot_evaluate_is_reported_not_fatal():
    ledger = PrivacyLedger(delta=1e-5)
    ledger.record(LedgerEntry("client-1", "gradient", 1, 0.0256, 0.05, 1.0, steps=1000))
    row = ledger.report(target=None)["clients"]["client-1"]
    assert row["rdp"]["total"] > 1000  # almost no noise: a huge but finite RDP bound
    assert row["prv"]["total"] is None and "PRV accountant could not" in row["prv"]["error"]


def test_delta_must_be_well_below_one_over_the_shard_size():
    from secureffm.privacy.accounting import check_delta

    check_delta(1e-5, 10_000)  # the shipped protocols' delta at the default shard size
    check_delta(1e-5, 400)
    with pytest.raises(ConfigError, match="not well below 1 / N"):
        check_delta(1e-4, 10_000)
