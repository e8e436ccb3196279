"""The audit of a run whose GOT rounds aggregate the velocity gradient and the dual update in
one secure aggregation (their joint kind, "gradient+dual_update"): each part is still
counted, charged and hidden on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from secureffm.audit.claims import FAIL, PASS, audit_claims
from secureffm.audit.threat import load_adversary
from secureffm.cli import main as cli_main
from tests.audit.test_claims import _copy, _edit, _run, _verdicts

JOINT = "gradient+dual_update"


@pytest.fixture(scope="module")
def joint(tmp_path_factory) -> Path:
    """FFM-GOT under dp-secagg (malicious-server secagg), 3 clients, a dual update every
    round: one secure aggregation of both kinds a round, each charged."""
    return _run(tmp_path_factory.mktemp("joint") / "joint", method="got",
                protocol="dp-secagg", clients=3, potential_every=1)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "messages.jsonl").read_text().splitlines()]


def test_a_joint_aggregation_run_keeps_every_claim_against_a_malicious_server(joint, capsys):
    """Every client input is of the joint kind; the log verifies (each ``aggregated`` event
    of either kind counts only clients that sent a joint input), every claim passes against a
    malicious server, and the epsilon recomputed from the charged records, per kind and in
    total, is privacy.json's."""
    inputs = {r["kind"] for r in _records(joint) if r["phase"] == "masked_input"}
    assert inputs == {JOINT}
    aggregated = [r["of_kind"] for r in _records(joint) if r.get("event") == "aggregated"]
    assert aggregated == ["gradient", "dual_update"] * 2
    assert cli_main(["audit", "--verify", str(joint)]) == 0
    report = audit_claims(joint, load_adversary("malicious-server"))
    assert [(v.claim, v.status) for v in report.verdicts] == [
        ("intact", PASS), ("hidden", PASS), ("epsilon", PASS), ("broadcast", PASS),
        ("parameters", PASS)]
    stated = json.loads((joint / "privacy.json").read_text())["clients"]
    for client, row in report.epsilon.items():
        assert row["total"] == pytest.approx(stated[client]["rdp"]["total"], rel=1e-9)
        for kind in ("gradient", "dual_update"):
            assert row[kind] == pytest.approx(stated[client]["rdp"]["by_kind"][kind],
                                              rel=1e-9)
    capsys.readouterr()


def test_a_joint_input_is_charged_for_each_of_its_kinds(joint, tmp_path):
    """Adversary: the server's key holder drops round 2's dual_update charged record to
    understate the ledger: the joint inputs of round 2 carry a dual update charged by no
    record, and the audit names it (before, inputs of a joint kind were matched against
    no charged kind and went unchecked)."""
    copy = _copy(joint, tmp_path / "uncharged")
    _edit(copy, lambda r: None if r.get("event") == "charged" and r["round"] == 2 and (
        r["of_kind"] == "dual_update") else r)
    epsilon = _verdicts(copy, "honest-but-curious-server")["epsilon"]
    assert epsilon.status == FAIL
    assert epsilon.reason == "3 client input(s) were charged to no one: the ledger understates"
    assert "client-1's round-2 dual_update input is in no charged record" in " ".join(
        epsilon.evidence)


def test_a_joint_input_relabelled_as_clear_reaches_the_server_readable(joint, tmp_path):
    """Adversary: a folder writer who strips the stages off the joint masked inputs (as if
    they had travelled in the clear): the hidden claim checks them as messages of the kinds
    they carry and fails (before, a joint kind was not among the kinds the adversary must
    not see, so they were skipped)."""
    copy = _copy(joint, tmp_path / "relabelled")
    _edit(copy, lambda r: {**r, "stages": []} if r["kind"] == JOINT and (
        r["phase"] == "masked_input") else r)
    hidden = _verdicts(copy, "honest-but-curious-server")["hidden"]
    assert hidden.status == FAIL
    assert f"round 1 {JOINT} of client-1" in " ".join(hidden.evidence)
