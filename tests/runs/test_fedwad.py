"""The FedWAD runner (secureffm/runs/fedwad.py): the run folder, the protocol's randomized-t
protections reaching Algorithm 1 through the runner, and the log closed by the server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from secureffm.audit import verify_run
from secureffm.errors import ProtocolError
from secureffm.methods.fedwad import FedWADConfig
from secureffm.runs import FedWADRun, run_fedwad


def _run(tmp_path, protocol: str, clients: int = 2) -> tuple[dict, list[dict]]:
    result = run_fedwad(FedWADRun(FedWADConfig(iterations=4, support_size=40), samples=120,
                                  clients=clients, protocol=protocol, out=str(tmp_path / protocol),
                                  check_exact=True, progress=False))
    records = [json.loads(line) for line in
               (result.out / "messages.jsonl").read_text().splitlines()]
    assert verify_run(result.out).ok
    return result.result, records


def test_plaintext_sends_a_distance_every_iteration_and_lands_near_exact(tmp_path):
    result, records = _run(tmp_path, "plaintext")
    scalars = [r for r in records if r["kind"] == "scalar"]
    assert len(scalars) == 2 * (4 + 1)  # both clients, every iteration and the final one
    assert result["evaluated"] == [0, 1, 2, 3, 4]
    assert abs(result["distance"] / result["exact"] - 1) < 0.1
    assert records[-1]["event"] == "closed" and records[-1]["sender"] == "server"


def test_randomized_t_from_the_protocol_reaches_the_method(tmp_path):
    """Under fedwad-private the runner hands the stage's protections to Algorithm 1: clients
    send distances only at the end, and every measure is labelled with the stage."""
    result, records = _run(tmp_path, "fedwad-private")
    scalars = [r for r in records if r["kind"] == "scalar"]
    assert [r["round"] for r in scalars] == [5, 5]
    assert result["evaluated"] == [4]
    uploads = [r for r in records if r["kind"] == "measure" and r["phase"] == "upload"]
    assert uploads and all(r["stages"] == ["randomized-t"] for r in uploads)
    privacy = json.loads((tmp_path / "fedwad-private" / "privacy.json").read_text())
    assert "measure" in privacy["mechanisms"]


def test_pairwise_matrix_over_three_clients(tmp_path):
    result, _ = _run(tmp_path, "plaintext", clients=3)
    matrix = result["matrix"]
    assert len(matrix) == 3 and all(matrix[i][i] == 0 for i in range(3))
    assert matrix[0][1] < matrix[0][2]  # client 3's Gaussian is twice as far from client 1's


def test_pairwise_brackets_hold_against_exact_w(tmp_path):
    """With bracket, each pair's lower bound is at most exact W_p, its upper bound at least."""
    result = run_fedwad(FedWADRun(FedWADConfig(iterations=3, support_size=30, bracket=True),
                                  samples=80, clients=3, out=str(tmp_path / "run"),
                                  check_exact=True, progress=False)).result
    lower, upper, exact = (np.array(result[k]) for k in ("lower_matrix", "matrix", "exact"))
    off = ~np.eye(3, dtype=bool)
    assert (lower[off] > 0).all() and (lower <= exact * (1 + 1e-9)).all()
    assert (exact <= upper * (1 + 1e-9)).all()


def test_a_protocol_that_only_sums_scalars_is_refused_and_the_log_still_closes(tmp_path):
    """A spec whose secagg stage protects ``scalar`` lets the server learn only sums of them,
    so FedWAD's individual distances are refused by name rather than sent in the clear."""
    spec = tmp_path / "sum-scalars.toml"
    spec.write_text('name = "sum-scalars"\n[[stages]]\nstage = "secagg"\n'
                    'protects = ["scalar"]\nthreshold = 2\n')
    out = tmp_path / "run"
    with pytest.raises(ProtocolError, match="'scalar' is protected by the 'secagg' stage"):
        run_fedwad(FedWADRun(FedWADConfig(iterations=2, support_size=10), samples=50,
                             protocol=str(spec), out=str(out), progress=False))
    records = (out / "messages.jsonl").read_text().splitlines()
    assert json.loads(records[-1])["event"] == "closed"
