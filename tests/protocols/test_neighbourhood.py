"""SecAgg+'s neighbourhood against the reference implementation's table, exact hypergeometric
tails, growth with n, and the refusal of a neighbourhood the stated fractions do not allow."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from secureffm.errors import ProtocolError
from secureffm.protocols import load_protocol
from secureffm.protocols.neighbourhood import Tolerance, least_degree, window
from secureffm.protocols.statement import privacy_statement
from tests.protocols.test_secagg import write_spec

# (n, corrupt, dropout, malicious server, degree, threshold): the expected values of Google's
# implementation of Bell et al. (google-parfait/federated-compute, fcp/secagg/server/
# graph_parameter_finder_test.cc; its threshold is the least t the window allows, at least 2).
REFERENCE = [
    (100, 0.45, 0.45, False, 92, 46),
    (1000, 0.33, 0.33, False, 286, 150),
    (10, 0.33, 0.33, False, 8, 4),
    (100, 0.3, 0.3, True, 92, 62),
    (10, 0.05, 0.33, False, 4, 2),
    (1000, 0.05, 0.33, False, 72, 24),
    (100, 0.05, 0.33, True, 72, 39),
    (1000, 0.05, 0.33, True, 398, 223),
    (100, 0.33, 0.05, False, 34, 29),
    (1000, 0.33, 0.05, True, 132, 109),
]


@pytest.mark.parametrize(("n", "corrupt", "dropout", "malicious", "degree", "threshold"),
                         REFERENCE)
def test_degree_and_threshold_match_the_reference_implementation(n, corrupt, dropout,
                                                                 malicious, degree, threshold):
    found = least_degree(n, Tolerance(corrupt, dropout, malicious=malicious))
    assert (found.degree, max(found.low + 1, 2)) == (degree, threshold)


def _tail(n: int, marked: int, k: int, above: int) -> Fraction:
    """P(X > above), X ~ Hypergeometric(n, marked, k), exactly."""
    return sum((Fraction(math.comb(marked, x) * math.comb(n - marked, k - x))
                for x in range(above + 1, k + 1)), Fraction(0)) / math.comb(n, k)


@pytest.mark.parametrize(("n", "k", "malicious"), [(300, 100, True), (1000, 148, True),
                                                   (1000, 72, False)])
def test_the_window_is_where_exact_hypergeometric_tails_cross_the_odds(n, k, malicious):
    """t1 and t2 against tails summed in exact rationals (math.comb): the odds that more than
    t1 of k neighbours are corrupt stay below 2^-41 / n, and more than k - t2 drop out
    below 2^-20 / n, while t1 - 1 and t2 + 1 would cross them."""
    tolerance = Tolerance(0.05, 0.2, malicious=malicious)
    found = window(n, k, tolerance)
    corrupt, survivors = math.floor(0.05 * n), math.ceil(0.8 * n)
    hide, fail = Fraction(1, 2**41 * n), Fraction(1, 2**20 * n)
    t1 = next(a for a in range(k + 1) if _tail(n, corrupt, k, a) < hide)
    assert _tail(n, corrupt, k, t1 - 1) >= hide
    assert found.low == (math.ceil((t1 + k - 1.25) / 2) if malicious else t1)
    dropped = n - survivors  # fewer than t survivors is more than k - t dropped neighbours
    assert _tail(n, dropped, k, k - found.high) < fail <= _tail(n, dropped, k, k - found.high - 1)


def test_the_shipped_neighbourhood_grows_with_n_slower_than_n():
    (stage,) = load_protocol("secagg-plus").stages
    sizes = [10, 20, 50, 100, 200, 300, 500, 1000]
    degrees = [stage.degree(n) for n in sizes]
    assert degrees == sorted(degrees)
    assert degrees[0] == 8 and degrees[-1] < 200  # 8 of 9 others at 10, under 20% at 1,000


def test_a_fixed_neighbourhood_below_the_bound_is_refused_by_name(tmp_path):
    """Adversary: a server colluding with up to 5% of 1,000 clients while 20% drop out. A spec
    that states those fractions but fixes 8 neighbours (the old secagg-plus) would claim a
    guarantee its graph does not give; validation refuses it, naming the least degree that
    does, and accepts that degree."""
    spec = write_spec(tmp_path, threshold=0.6, neighbours=8, corrupt=0.05, dropout=0.2)
    protocol = load_protocol(str(spec))
    with pytest.raises(ProtocolError, match=r"neighbours = 8 gives no Bell et al\. guarantee "
                                            r"for 1000 clients at corrupt = 0\.05.*least "
                                            r"degree that does is 148; remove neighbours"):
        protocol.validate_for(1000)
    load_protocol(str(write_spec(tmp_path, threshold=0.6, neighbours=148, corrupt=0.05,
                                 dropout=0.2))).validate_for(1000)


def test_privacy_json_states_the_bounds_inputs_or_that_a_fixed_degree_claims_none(tmp_path):
    """A fixed degree without fractions must not read as a sized neighbourhood; a derived one
    names the fractions it holds for, in the claim and in the trust."""
    derived = privacy_statement(load_protocol("secagg-plus"), ("gradient",),
                                deterministic=False)
    (claim,) = derived["mechanisms"]["gradient"]["claims"]
    assert ("neighbours derived by Bell et al.'s bound (CCS 2020) for corrupt = 0.05, "
            "dropout = 0.2, security = 40 bits, correctness = 20 bits") in claim
    assert any("at most a fraction 0.05 of the clients collude with the server and at most "
               "0.2 drop out" in t for t in derived["trust"])
    fixed = privacy_statement(load_protocol(str(write_spec(tmp_path, neighbours=8))),
                              ("gradient",), deterministic=False)
    (claim,) = fixed["mechanisms"]["gradient"]["claims"]
    assert "neighbours 8, fixed: the spec states no corrupt or dropout fraction, so no Bell " \
           "et al. bound is claimed" in claim


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"corrupt": 0.05}, r"give both corrupt and dropout"),
    ({"corrupt": 0.3, "dropout": 0.4}, r"corrupt \+ 2 x dropout = 1\.1 exceeds 0\.9"),
    ({"corrupt": 1.0, "dropout": 0.1}, r"corrupt = 1\.0; give a fraction in \[0, 1\)"),
    ({"corrupt": 0.05, "dropout": 0.1, "security": 0}, r"security = 0; give a positive"),
])
def test_bad_fractions_are_refused_by_name(tmp_path, changes, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        load_protocol(str(write_spec(tmp_path, threshold=0.6, **changes)))


def test_a_complete_graph_is_checked_against_the_fractions_too(tmp_path):
    """Too few clients for any k < n - 1: every client is everyone's neighbour, and the
    threshold must still exceed the corrupt majority and not exceed the survivors."""
    protocol = load_protocol(str(write_spec(tmp_path, threshold=0.6, neighbours=0,
                                            corrupt=0.3, dropout=0.3)))
    with pytest.raises(ProtocolError, match=r"threshold 12 of 20 shares is outside \(13, 14\]"):
        protocol.validate_for(20)
