"""FedWAD's bracket: the lower bound from each side's mean and spread (fedwad_bounds.py), its
federated release (in the final distance's message), a client that keeps them when its own
config says so, and what the server could already compute without them."""

import copy

import numpy as np
import ot
import pytest

from secureffm.errors import MessageError
from secureffm.methods.fedwad import FedWADConfig, Measure, fedwad
from secureffm.methods.fedwad_bounds import lower_bound, moment_bound, moments
from secureffm.methods.fedwad_federated import federated_distance

from .test_fedwad_federated import federation, payload, records


def exact_wp(x, y, p):
    cost = ot.dist(x, y, metric="sqeuclidean" if p == 2 else "euclidean")
    return ot.emd2(ot.unif(len(x)), ot.unif(len(y)), cost, numItermax=10_000_000) ** (1 / p)


@pytest.fixture
def data():
    rng = np.random.default_rng(4)
    return [rng.normal(size=(150, 3)) * [0.3, 1.0, 2.0],
            0.7 * rng.normal(size=(90, 3)) + [1.0, -0.5, 0.2]]


@pytest.mark.parametrize("p", [1, 2])
def test_the_moment_bound_is_exact_for_a_translated_copy(p):
    x = np.random.default_rng(1).normal(size=(60, 3))
    shift = np.array([0.4, -1.2, 0.3])
    assert moment_bound(moments(x), moments(x + shift), p) == pytest.approx(
        exact_wp(x, x + shift, p), rel=1e-9)


def test_the_w2_bound_counts_each_coordinate_spread_and_stays_below_w2():
    """Copies scaled per coordinate, equal means: W_1's mean bound is 0, W_2's is exact; a
    rotated copy (same spread in total, not per coordinate) stays below W_2."""
    x = np.random.default_rng(2).normal(size=(80, 2)) * [0.5, 2.0]
    y = [2.0, 0.5] * (x - x.mean(0)) + x.mean(0)
    truth = exact_wp(x, y, 2)
    assert moment_bound(moments(x), moments(y), 1) == pytest.approx(0, abs=1e-12)
    assert moment_bound(moments(x), moments(y), 2) == pytest.approx(truth, rel=1e-9)
    turned = x[:, ::-1]
    assert 0 < moment_bound(moments(x), moments(turned), 2) <= exact_wp(x, turned, 2)


@pytest.mark.parametrize("p", [1, 2])
def test_federated_bracket_matches_the_pooled_moments_and_holds(tmp_path, data, p):
    config = FedWADConfig(p=p, iterations=5, support_size=40, bracket=True)
    channel, privacy = federation(tmp_path, data, "fedwad-private", config=config)
    found = federated_distance(channel, privacy, "client-1", "client-2", config)
    channel.close()
    truth = exact_wp(*data, p)
    assert found.lower_bound <= truth * (1 + 1e-9) <= found.distance * (1 + 1e-9)
    assert found.lower_bound >= moment_bound(moments(data[0]), moments(data[1]), p) - 1e-12
    scalars = [r for r in records(tmp_path) if r["kind"] == "scalar"]
    assert len(scalars) == 2 and {r["round"] for r in scalars} == {config.iterations + 1}


def test_in_process_bracket_uses_the_final_distances():
    x = np.random.default_rng(3).normal(size=(120, 2))
    y = np.random.default_rng(4).normal(size=(70, 2)) * 0.5 + 1.0
    found = fedwad(x, y, FedWADConfig(iterations=3, support_size=30, bracket=True))
    final = found.iterates[-1]
    assert found.lower_bound >= moment_bound(moments(x), moments(y), 2)
    assert found.lower_bound <= exact_wp(x, y, 2) <= found.distance <= final
    assert fedwad(x, y, FedWADConfig(iterations=3, support_size=30)).lower_bound is None
    assert lower_bound(moments(x), moments(y), 2, [(5.0, 1.0), (2.0, 3.0)]) == 4.0  # triangle


def test_a_client_whose_config_keeps_its_moments_does_not_send_them(tmp_path, data):
    """Adversary: a server whose config asks for the bracket, facing clients whose own run
    config says bracket = false. Their final messages hold the distance only; the server stops
    with an error naming the setting, and the log keeps its closing record."""
    server = FedWADConfig(iterations=2, support_size=20, bracket=True)
    channel, privacy = federation(tmp_path, data, "plaintext",
                                  config=FedWADConfig(iterations=2, support_size=20))
    with pytest.raises(MessageError, match="does not release them"):
        federated_distance(channel, privacy, "client-1", "client-2", server)
    channel.close()
    log = records(tmp_path)
    final = [r for r in log if r["kind"] == "scalar" and r["round"] == 3]
    assert final and all(set(payload(tmp_path, r)) == {"distance"} for r in final)
    assert log[-1]["event"] == "closed"


def test_under_fedwad_private_the_measures_already_give_each_client_mean(tmp_path, data):
    """Adversary: the honest-but-curious server under fedwad-private, with only the measures it
    sent and received. Every interpolation keeps the mean on the line through the client's
    mean and xi's: mean(xi_mu) = (1 - t) m_mu + t mean(xi). Two rounds' lines meet at m_mu
    (d >= 2, no noise), and then each t follows: the mean a bracket releases is no news to it,
    and randomized-t does not hide t (docs/fedwad.md, "What the server learns")."""
    config = FedWADConfig(iterations=2, support_size=30)
    channel, privacy = federation(tmp_path, data, "fedwad-private", config=config)
    replay = copy.deepcopy(channel.clients[0].protocol_rng)
    federated_distance(channel, privacy, "client-1", "client-2", config)
    channel.close()
    log = [r for r in records(tmp_path) if r["kind"] == "measure" and r["round"] <= 2]
    sent = [payload(tmp_path, r) for r in log if r["recipient"] == "client-1"]
    back = [payload(tmp_path, r) for r in log if r["sender"] == "client-1"]
    means = [[Measure(**m).weights @ Measure(**m).support for m in pair]
             for pair in zip(sent, back, strict=True)]
    (a1, b1), (a2, b2) = means
    solve = np.linalg.lstsq(np.stack([b1 - a1, a2 - b2], 1), a2 - a1, rcond=None)[0]
    recovered = a1 + solve[0] * (b1 - a1)
    assert recovered == pytest.approx(data[0].mean(0), abs=1e-8)
    t = 1 - np.linalg.norm(b1 - a1) / np.linalg.norm(recovered - a1)
    assert t == pytest.approx(replay.uniform(privacy.t_low, privacy.t_high), abs=1e-8)
