"""FedWAD through a ProtectedChannel: accuracy against POT, what the server's log holds, the
randomized-t protocol, pairwise distances, the CLI's run folder, and clear errors."""

import copy
import json

import numpy as np
import ot
import pytest
import torch

from secureffm.audit.verify import verify_run
from secureffm.cli import main
from secureffm.errors import ConfigError, DataError, ProtocolError
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.log import PAYLOADS_FILE, MessageLog
from secureffm.federation.message import SERVER, deserialize_payload
from secureffm.federation.parties import Client
from secureffm.methods.fedwad import FedWADConfig, Measure, interpolate, wasserstein
from secureffm.methods.fedwad_federated import (
    LABELS,
    FedWADClient,
    Rows,
    federated_distance,
    pairwise_distances,
)
from secureffm.protocols.protocol import load_protocol
from secureffm.runs.scaffold import open_channel

CONFIG = FedWADConfig(iterations=8, support_size=100)


def pot_w2(x, y):
    cost = ot.dist(x, y)
    return ot.emd2(ot.unif(len(x)), ot.unif(len(y)), cost, numItermax=10_000_000) ** 0.5


def federation(tmp_path, arrays, protocol="plaintext", faults=None, config=CONFIG):
    """A channel over clients holding ``arrays`` (seeded protocol streams) that run FedWAD's
    client program with ``config``, and the protocol's randomized-t protections (None without
    that stage)."""
    clients = [Client(f"client-{i}", torch.as_tensor(x), torch.Generator().manual_seed(i),
                      protocol_rng=np.random.default_rng([3, i]))
               for i, x in enumerate(arrays, start=1)]
    spec = load_protocol(protocol)
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads=True)
    privacy = spec.geodesic_privacy()
    channel = open_channel(spec, clients, log, faults, program=FedWADClient(config, privacy))
    return channel, privacy


def records(tmp_path):
    lines = (tmp_path / "messages.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def payload(tmp_path, record):
    with (tmp_path / PAYLOADS_FILE).open("rb") as f:
        f.seek(record["offset"])
        return deserialize_payload(f.read(record["bytes"]))


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(200, 2)), 0.8 * rng.normal(size=(100, 2)) + np.array([2.0, 0.5])]


def test_estimate_matches_pot_and_log_holds_only_measures_and_scalars(tmp_path, data):
    channel, privacy = federation(tmp_path, data)
    result = federated_distance(channel, privacy, "client-1", "client-2", CONFIG)
    channel.close()
    assert result.distance == pytest.approx(pot_w2(*data), rel=0.01)
    assert len(result.iterates) == CONFIG.iterations + 1  # plaintext: every iterate's bound
    assert verify_run(tmp_path).ok
    messages = [r for r in records(tmp_path) if r["kind"] != "event"]
    assert {r["kind"] for r in messages} == {"measure", "scalar"}
    assert all(SERVER in (r["sender"], r["recipient"]) for r in messages)
    wire = (tmp_path / PAYLOADS_FILE).read_bytes()
    for x in data:  # no sample, in any precision, crossed the engine
        for row in x:
            assert row.tobytes() not in wire and row.astype(np.float32).tobytes() not in wire
    for r in messages:
        if r["kind"] == "measure":
            got = payload(tmp_path, r)
            assert set(got) == {"support", "weights"} and got["support"].shape == (100, 2)


def test_client_t_never_appears_in_any_message(tmp_path, data):
    channel, privacy = federation(tmp_path, data, "fedwad-private")
    stage = channel.protocol.stage_for("randomized-t", "measure")
    replay = copy.deepcopy(channel.clients[0].protocol_rng)
    federated_distance(channel, privacy, "client-1", "client-2", CONFIG)
    channel.close()
    ts = [replay.uniform(stage.t_low, stage.t_high) for _ in range(CONFIG.iterations)]
    log = records(tmp_path)
    first_in = next(r for r in log if r["recipient"] == "client-1" and r["kind"] == "measure")
    first_out = next(r for r in log if r["sender"] == "client-1" and r["kind"] == "measure")
    xi0 = Measure(**payload(tmp_path, first_in))
    # the replayed t is the client's: it reproduces the measure the client sent
    expected = interpolate(Measure.uniform(data[0]), xi0, ts[0])
    np.testing.assert_allclose(payload(tmp_path, first_out)["support"], expected.support)
    wire = (tmp_path / PAYLOADS_FILE).read_bytes()
    text = (tmp_path / "messages.jsonl").read_text()
    for t in ts:
        assert np.float64(t).tobytes() not in wire and np.float32(t).tobytes() not in wire
        assert repr(t)[:10] not in text
    assert all("randomized-t" in r["stages"] for r in log
               if r["kind"] == "measure" and r["sender"] != SERVER)


def test_private_protocol_sends_distances_only_at_the_last_iteration(tmp_path, data):
    channel, privacy = federation(tmp_path, data, "fedwad-private")
    private = federated_distance(channel, privacy, "client-1", "client-2", CONFIG)
    channel.close()
    scalars = [r for r in records(tmp_path) if r["kind"] == "scalar"]
    assert len(scalars) == 2 and {r["round"] for r in scalars} == {CONFIG.iterations + 1}
    assert private.evaluated == (CONFIG.iterations,)
    plain_dir = tmp_path / "plain"
    channel, privacy = federation(plain_dir, data)
    plain = federated_distance(channel, privacy, "client-1", "client-2", CONFIG)
    channel.close()
    truth = pot_w2(*data)
    assert private.distance == pytest.approx(truth, rel=0.02)
    assert private.distance == pytest.approx(plain.distance, rel=0.02)


def test_pairwise_matrix_is_symmetric_with_zero_diagonal(tmp_path, data):
    arrays = [*data, np.random.default_rng(1).normal(size=(100, 2)) - 1.5]
    channel, privacy = federation(tmp_path, arrays)
    matrix = pairwise_distances(channel, privacy, FedWADConfig(iterations=5, support_size=100))
    channel.close()
    assert verify_run(tmp_path).ok
    np.testing.assert_array_equal(matrix, matrix.T)
    np.testing.assert_array_equal(np.diag(matrix), 0.0)
    for i in range(3):
        for j in range(i + 1, 3):
            assert matrix[i, j] == pytest.approx(pot_w2(arrays[i], arrays[j]), rel=0.02)


@pytest.mark.parametrize("arrays, a, b, error, match", [
    ([np.zeros((0, 2)), np.ones((5, 2))], "client-1", "client-2", DataError, "non-empty"),
    ([np.ones((5, 2)), np.ones((5, 3))], "client-1", "client-2", DataError, "3-dimensional"),
    ([np.full((5, 2), np.nan), np.ones((5, 2))], "client-1", "client-2", DataError, "NaN"),
    ([np.ones((5, 2)), np.ones((5, 2))], "client-1", "client-9", ConfigError, "no client"),
    ([np.ones((5, 2)), np.ones((5, 2))], "client-1", "client-1", ConfigError, "two parties"),
])
def test_bad_input_is_a_clear_error(tmp_path, arrays, a, b, error, match):
    channel, privacy = federation(tmp_path, arrays)
    with pytest.raises(error, match=match):
        federated_distance(channel, privacy, a, b, CONFIG)


def test_a_client_dropping_out_stops_the_distance(tmp_path, data):
    faults = FaultPlan("drop", (Fault("drop", "client-2", "upload", (3,)),))
    channel, privacy = federation(tmp_path, data, faults=faults)
    with pytest.raises(ProtocolError, match="client-2 must stay online"):
        federated_distance(channel, privacy, "client-1", "client-2", CONFIG)


def test_cli_writes_a_run_folder_that_audits(tmp_path, data, capsys):
    files = []
    for i, x in enumerate(data):
        files += ["--client-file", str(tmp_path / f"c{i}.npy")]
        np.save(tmp_path / f"c{i}.npy", x)
    out = tmp_path / "run"
    code = main(["fedwad", *files, "--iterations", "5", "--protocol", "fedwad-private",
                 "--check-exact", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "FedWAD W_2 <=" in printed and "(an upper bound)" in printed
    assert "To tighten: --support above 100" in printed
    result = json.loads((out / "result.json").read_text())
    assert result["accuracy"]["upper_bound"] is True
    assert result["accuracy"]["still_falling"] is None  # fedwad-private: one bound
    assert result["exact"] == pytest.approx(pot_w2(*data), rel=1e-9)
    assert result["distance"] >= result["exact"] * (1 - 1e-9)
    # the CLI's default bracket: a lower bound from the clients' means and spreads, a release
    assert 0 < result["lower_bound"] <= result["exact"] * (1 + 1e-9)
    assert "(a lower bound from the clients' means and spreads)" in printed
    assert "above W_p (the bracket)" in printed
    privacy = json.loads((out / "privacy.json").read_text())
    assert any("mean (d floats)" in line for line in privacy["exclusions"])
    assert (out / "config.toml").is_file()
    assert main(["audit", "--verify", str(out)]) == 0
    assert main(["fedwad", "--p", "3", "--out", str(tmp_path / "bad")]) == 2
    assert "use p = 1 or 2" in capsys.readouterr().err


def test_plaintext_distances_let_the_server_recover_each_t(tmp_path, data):
    """Why fedwad-private withholds distances (docs/fedwad.md): from xi^(0), the client's
    measure and W(data, xi^(0)), the server gets t = 1 - W(xi_mu, xi^(0)) / W(data, xi^(0))."""
    exact = FedWADConfig(iterations=1, support_size=100, exact=True, prune_tol=1e-6)
    channel, privacy = federation(tmp_path, data, config=exact)
    replay = copy.deepcopy(channel.clients[0].protocol_rng)
    federated_distance(channel, privacy, "client-1", "client-2", exact)
    channel.close()
    true_t = replay.uniform(*CONFIG.t_range)
    log = records(tmp_path)
    sent = next(r for r in log if r["recipient"] == "client-1" and r["kind"] == "measure")
    back = next(r for r in log if r["sender"] == "client-1" and r["kind"] == "measure")
    distance = next(r for r in log if r["sender"] == "client-1" and r["kind"] == "scalar")
    xi0, xi_mu = Measure(**payload(tmp_path, sent)), Measure(**payload(tmp_path, back))
    t = 1 - wasserstein(xi_mu, xi0, 2) / payload(tmp_path, distance)["distance"][0]
    assert t == pytest.approx(true_t, abs=1e-6)


def test_a_client_selects_one_class_of_its_rows_itself(tmp_path, data):
    """Rows(client, label): the client picks the rows of a class from its own labels; the
    distance and the log equal those of clients that hold only those rows, and a class it does
    not hold is refused by the client."""
    labels = [np.arange(len(x)) % 2 for x in data]
    chosen = [x[y == cls] for x, y, cls in zip(data, labels, (0, 1), strict=True)]
    results, logs = [], []
    for folder, named in ((tmp_path / "named", True), (tmp_path / "held", False)):
        channel, privacy = federation(folder, data if named else chosen, "fedwad-private")
        for client, y in zip(channel.clients, labels, strict=True):
            client.state[LABELS] = y
        sides = ([Rows("client-1", 0), Rows("client-2", 1)] if named else
                 ["client-1", "client-2"])
        results.append(federated_distance(channel, privacy, *sides, CONFIG).distance)
        channel.close()
        logs.append([(r["round"], r["kind"], r["sender"], r["recipient"], r["bytes"])
                     for r in records(folder)])
    assert results[0] == results[1]
    assert logs[0] == logs[1]
    assert results[0] == pytest.approx(pot_w2(data[0][labels[0] == 0], data[1][labels[1] == 1]),
                                       rel=0.03)
    channel, privacy = federation(tmp_path / "absent", data, "fedwad-private")
    for client, y in zip(channel.clients, labels, strict=True):
        client.state[LABELS] = y
    with pytest.raises(ProtocolError, match="did not arrive"):
        federated_distance(channel, privacy, Rows("client-1", 7), "client-2", CONFIG)
    assert any(r.get("event") == "rejected" and "no rows of class 7" in r["detail"]
               for r in records(tmp_path / "absent"))


def moved_row(moved: dict, xi: Measure) -> np.ndarray:
    """The one row x whose exact interpolation toward ``xi`` is ``moved``: every atom is
    (1 - t) x + t xi_j, so the spread gives t and the mean x."""
    atoms, w = moved["support"], moved["weights"]
    mean = w @ atoms
    t = np.sqrt(w @ ((atoms - mean) ** 2).sum(1) / (xi.weights @ ((
        xi.support - xi.weights @ xi.support) ** 2).sum(1)))
    return (mean - t * (xi.weights @ xi.support)) / (1 - t)


@pytest.mark.parametrize("args, allowance, refusal", [
    ({"sample": 1}, ("samples", 1), "its own config allows none"),
    ({"label": 1}, ("min_class_rows", 1), "fewer than its min_class_rows = 10")])
def test_a_server_naming_one_row_is_refused_and_would_get_it(tmp_path, data, args, allowance,
                                                             refusal):
    """Attack: the server asks client-1 to interpolate a single row: a subsample of 1
    (``sample``), or a class it holds one row of (``label``). Every atom is then (1 - t) x +
    t xi_j (exact interpolation), so the measure's mean and spread give t and the row x. With
    the check removed (the client's own allowance lowered to what the server names) the row
    leaks; with the client's own config it refuses in its signed event."""
    from secureffm.federation.channel import Task
    from secureffm.federation.message import SERVER
    from secureffm.methods.fedwad_federated import measure_payload

    xi = Measure.uniform(np.random.default_rng(9).normal(size=(6, 2)))
    labels = np.zeros(len(data[0]), dtype=np.int64)
    labels[3] = 1  # class 1: one row
    for removed in (True, False):
        folder = tmp_path / ("removed" if removed else "checked")
        channel, _ = federation(folder, data, config=FedWADConfig(exact=True))
        channel.clients[0].state[LABELS] = labels
        if removed:
            setattr(channel.endpoints["client-1"].program, *allowance)
        channel.send(1, "broadcast", "measure", SERVER, "client-1", measure_payload(xi))
        got = channel.send(1, "upload", "measure", "client-1", SERVER,
                           Task("fedwad.interpolate", {**args, "round": 1}))
        channel.close()
        if not removed:
            assert got is None
            assert any(r.get("event") == "rejected" and refusal in r["detail"]
                       for r in records(folder))
            continue
        row = moved_row(got, xi)
        assert np.min(np.linalg.norm(data[0] - row, axis=1)) < 1e-9  # a client's row, leaked
