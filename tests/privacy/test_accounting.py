import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant

from secureffm.errors import ConfigError
from secureffm.privacy import calibrate_noise, epsilon


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


def test_delta_must_be_well_below_one_over_the_shard_size():
    from secureffm.privacy.accounting import check_delta

    check_delta(1e-5, 10_000)  # the shipped protocols' delta at the default shard size
    check_delta(1e-5, 400)
    with pytest.raises(ConfigError, match="not well below 1 / N"):
        check_delta(1e-4, 10_000)


@settings(max_examples=20, deadline=None)  # 16 (sigma, q) pairs; the reference is slow
@given(schedule=st.lists(st.tuples(st.sampled_from([0.4, 0.8, 1.2, 3.0]),
                                   st.sampled_from([0.01, 0.0256, 0.3, 1.0]),
                                   st.integers(0, 5000)), min_size=1, max_size=4),
       delta=st.sampled_from([1e-5, 1e-3]))
def test_rdp_epsilon_is_opacus_rdp_accountants_to_the_bit(schedule, delta):
    """epsilon computes one step's RDP once per (sigma, q) and scales it by the steps; Opacus'
    RDPAccountant over the same history is the reference, and must agree exactly."""
    reference = RDPAccountant()
    reference.history = [(s, q, n) for s, q, n in schedule if n > 0]
    expected = float(reference.get_epsilon(delta)) if reference.history else 0.0
    assert epsilon(schedule, delta, "rdp") == expected
