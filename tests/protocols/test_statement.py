"""privacy.json states every run's claim, and only the claims its protocol makes."""

from __future__ import annotations

from secureffm.protocols import load_protocol
from secureffm.protocols.statement import privacy_statement


def _statement(name: str, kinds: tuple[str, ...], **extra) -> dict:
    return privacy_statement(load_protocol(name), kinds, secret_randomness="os-entropy",
                             **extra)


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
