"""privacy.json states every run's claim, and only the claims its protocol makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from secureffm.privacy.ledger import LedgerEntry, PrivacyLedger
from secureffm.protocols import load_protocol
from secureffm.protocols.statement import INSECURE, SYBIL, privacy_statement


def _statement(name: str, kinds: tuple[str, ...], deterministic: bool = False, **extra) -> dict:
    return privacy_statement(load_protocol(name), kinds, deterministic=deterministic, **extra)


def _accounting(mechanism: str = "gaussian", clients: int = 2, variance: float = 0.0) -> dict:
    """A real ledger's report (one step per client, target 8) with the multipliers the runner
    adds, as privacy_statement receives it."""
    ledger = PrivacyLedger(1e-5)
    for i in range(1, clients + 1):
        ledger.record(LedgerEntry(f"client-{i}", "gradient", 1, 0.1, 2.0, 1.0,
                                  mechanism=mechanism, l2=3.0, l1=9.0, variance=variance))
    report = ledger.report(8.0)
    report["noise_multiplier"] = {f"client-{i}": 2.0 for i in range(1, clients + 1)}
    return report


def test_plaintext_claims_nothing_and_says_so():
    s = _statement("plaintext", ("gradient",))
    assert s["unit"] is None and s["adjacency"] is None and s["dp"].startswith("none")
    assert s["mechanisms"]["gradient"]["claims"][0].startswith("none")


def test_secagg_alone_is_not_called_dp():
    s = _statement("secagg", ("gradient", "dual_update"))
    assert s["dp"].startswith("none")
    assert all("adds no DP" in m["claims"][0] for m in s["mechanisms"].values())
    assert any("threshold" in t for t in s["trust"])


def test_distributed_noise_states_its_trust_and_the_adjacency():
    s = _statement("dp-secagg-distributed", ("gradient",), nominal_records=400,
                   accounting={"delta": 1e-5, "clients": {}})
    assert s["unit"].startswith("one example")
    assert "nominal shard size 400" in s["adjacency"]
    claims = " ".join(s["mechanisms"]["gradient"]["claims"])
    assert "distributed Skellam" in claims and "secure aggregation" in claims
    assert any("colluders" in t or "reveal their noise" in t for t in s["trust"])
    assert s["delta"] == 1e-5  # the ledger's report is merged in


def test_a_kind_the_protocol_leaves_alone_is_named_unprotected():
    s = _statement("dp", ("gradient", "model"), nominal_records=100)
    assert s["mechanisms"]["model"]["stages"] == []
    assert s["dp"] == "DP on kinds gradient"


def test_an_insecure_deterministic_run_says_that_no_claim_holds():
    """Reader: anyone who trusts privacy.json. Under --insecure-deterministic the secret
    streams replay from the published seed; before this, only ``secret_randomness`` said so,
    while the claims read "holds whatever the server does" and ``target_held`` was true."""
    s = _statement("dp-secagg", ("gradient",), deterministic=True, nominal_records=400,
                   sample_rate=0.16, accounting=_accounting())
    assert s["insecure_deterministic"] is True and s["secret_randomness"].startswith("INSECURE")
    sentences = [s["dp"], *s["trust"], *s["mechanisms"]["gradient"]["claims"]]
    assert len(sentences) == 5 and all(t.startswith(INSECURE) for t in sentences)
    for row in s["clients"].values():
        assert row["target_held"] is False and row["target_held_why"] == INSECURE
        assert row["rdp"]["total"] <= 8.0  # the arithmetic stays; it guarantees nothing
    secure = _statement("dp-secagg", ("gradient",), nominal_records=400, sample_rate=0.16,
                        accounting=_accounting())
    assert secure["insecure_deterministic"] is False
    assert not any(INSECURE in t for t in [secure["dp"], *secure["trust"]])
    assert all(row["target_held"] is True for row in secure["clients"].values())
    plaintext = _statement("plaintext", ("gradient",), deterministic=True)
    assert plaintext["dp"].startswith("none:")  # claims nothing, so it stays true
    assert plaintext["mechanisms"]["gradient"]["claims"][0].startswith("none:")


@pytest.mark.parametrize("name, expected", [
    ("plaintext", ["message sizes"]),
    ("secagg", ["message sizes", "a malicious client's input"]),
    ("dp", ["message sizes", "floating-point noise sampling", "client-level DP"]),
    ("dp-secagg", ["message sizes", "floating-point noise sampling", "client-level DP",
                   "a malicious client's input"]),
    ("dp-secagg-distributed", ["message sizes", "floating-point noise sampling",
                               "client-level DP", "a malicious client's input"]),
])
def test_exclusions_name_what_no_claim_of_the_protocol_covers(name, expected):
    s = _statement(name, ("gradient",), nominal_records=400, sample_rate=0.16)
    assert [e.split(":")[0].split(",")[0] for e in s["exclusions"]] == expected
    text = " ".join(s["exclusions"])
    if "secagg" in name:
        assert "no range proofs" in text and "n x clip" in text
    if name.startswith("dp"):
        sampler = "Skellam" if name.endswith("distributed") else "Gaussian"
        assert sampler in text and "example" in s["unit"]
    extra = _statement(name, ("gradient",), nominal_records=400, sample_rate=0.16,
                       exclusions=("label counts",))
    assert extra["exclusions"] == [*s["exclusions"], "label counts"]


def test_the_secure_aggregation_sentence_follows_the_specs_adversary(tmp_path):
    """Reader: someone choosing the semi-honest variant for speed. Its trust sentence must not
    borrow the malicious variant's protections (before this both said the same)."""
    spec = tmp_path / "semi.toml"
    shipped = Path(__file__).parents[2] / "protocols" / "secagg.toml"
    spec.write_text(shipped.read_text().replace(
        'adversary = "malicious"', 'adversary = "semi-honest"'))
    malicious = " ".join(_statement("secagg", ("gradient",))["trust"])
    semi = " ".join(privacy_statement(load_protocol(str(spec)), ("gradient",),
                                      deterministic=False)["trust"])
    assert 'adversary = "malicious"' in malicious and "consistency round" in malicious
    assert 'adversary = "semi-honest"' in semi and "follows the protocol" in semi
    assert "can unmask" in semi and "make the clients refuse" not in semi


def test_distributed_noise_states_threshold_survivors_share_variance_sybils_and_tau():
    """4 clients, threshold 0.6 of 4 = 3 shares, 0 colluders: m = 3 honest survivors, and each
    client's share is the sum's variance over m. The multiplier is tau, not sigma."""
    s = _statement("dp-secagg-distributed", ("gradient",), nominal_records=400,
                   sample_rate=0.16, accounting=_accounting("skellam", 4, variance=90.0))
    block = s["distributed_noise"]
    assert (block["threshold"], block["group"], block["colluders"]) == (3, 4, 0)
    assert block["honest_survivors_min"] == 3 and block["tau"] == 2.0
    assert block["sum_variance"] == {"gradient": 90.0}
    assert block["share_variance"] == {"gradient": 30.0}
    assert block["sybil"] == SYBIL and "Sybil" in SYBIL
    assert "noise_multiplier" not in s and s["tau"] == {f"client-{i}": 2.0 for i in range(1, 5)}
    assert any(SYBIL in t for t in s["trust"])


def test_the_adjacency_states_the_nominal_size_and_q_exactly():
    """DCFM's nominal size is a mean (99.75 here); the statement once rounded it to 100 while
    q used 99.75."""
    s = _statement("dp", ("gradient",), nominal_records=99.75, sample_rate=32 / 99.75)
    assert s["nominal_shard_size"] == 99.75 and s["sample_rate"] == 32 / 99.75
    assert "nominal shard size 99.75" in s["adjacency"] and "q = 0.320802" in s["adjacency"]
