"""CKKSStage: the aggregate against the plaintext weighted mean, dropouts, key set-up and
rotation, what the server receives, refusals.

Truths used: the plaintext ``sum_i w_i x_i / sum_i w_i`` in float64 of the same inputs, the
bound of :meth:`CKKSParams.error_bound` (tested on its own in test_ckks_params.py), the fault
plan (who is offline where) and the message log as written to disk.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
import torch

from secureffm.errors import MessageError, ProtocolError
from secureffm.federation import SERVER, Client, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.message import deserialize_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.ckks import (
    CKKSStage,
    encrypt,
    new_context,
    read_ciphertexts,
    write_ciphertexts,
)
from secureffm.protocols.ckks_params import CKKSParams
from secureffm.runs import run
from secureffm.runs.scaffold import open_channel

KIND = "gradient"
SHIPPED = {"stage": "ckks", "protects": [KIND], "poly_modulus_degree": 8192,
           "coeff_mod_bit_sizes": [60, 40, 40], "scale_bits": 60}
PARAMS = CKKSParams(8192, (60, 40, 40), 60)


def write_spec(directory: Path, *stages: dict) -> Path:
    """A spec of ``stages`` (TOML written by hand: values are ints, strings and lists)."""
    lines = ['name = "test-he"']
    for stage in stages or (SHIPPED,):
        lines += ["", "[[stages]]"] + [f"{k} = {json.dumps(v)}" for k, v in stage.items()]
    path = Path(directory) / "spec.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_clients(n: int) -> list[Client]:
    return [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator().manual_seed(i))
            for i in range(1, n + 1)]


def make_channel(directory: Path, n: int = 3, faults=(), **stage):
    spec = write_spec(directory, {**SHIPPED, **stage})
    log = MessageLog(Path(directory) / "messages.jsonl", keep_payloads=True)
    return open_channel(load_protocol(str(spec)), make_clients(n), log,
                        FaultPlan("test", tuple(faults)))


def updates(n: int, d: int, seed: int = 0, scale: float = 3.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"client-{i}": rng.uniform(-scale, scale, d).astype(np.float32)
            for i in range(1, n + 1)}


def aggregate(channel, round_: int, xs: dict[str, np.ndarray], weights: dict[str, float]):
    d = next(iter(xs.values())).size
    return channel.aggregate(round_, KIND, lambda c: {KIND: xs[c.id]}, weights,
                             {KIND: ((d,), np.dtype(np.float32))})


def plain_mean(xs, weights, ids) -> np.ndarray:
    return sum(weights[c] * xs[c].astype(np.float64) for c in ids) / sum(weights[c] for c in ids)


def tolerance(xs, weights, ids, decryptors: int = 1) -> float:
    """The stage encrypts z_u = s_u x_u (s_u = w_u n / W); the decrypted sum is within
    error_bound of sum z_u plus the decryptor's flooding noise (within 8 of its standard
    deviations: 1.2e-15 a coordinate), and the mean divides it by sum of s_u over ``ids``;
    then the output is rounded to float32 (|mean| < 4: one ulp is 2^-22, twice the
    rounding)."""
    n, total = len(xs), sum(weights.values())
    s = {c: weights[c] * n / total for c in xs}
    magnitude = sum(s[c] * float(np.abs(xs[c]).max()) for c in ids)
    noise = 8 * PARAMS.flood_sigma(n, decryptors)
    return (PARAMS.error_bound(len(ids), magnitude) + noise) / sum(s[c] for c in ids) + 2.0**-22


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in
            (Path(directory) / "messages.jsonl").read_text().splitlines()]


def payload_of(directory: Path, record: dict) -> bytes:
    blob = (Path(directory) / "payloads.bin").read_bytes()
    return blob[record["offset"]:record["offset"] + record["bytes"]]


# -- the aggregate -------------------------------------------------------------------------------

@pytest.mark.parametrize("n, d, seed", [(2, 1, 0), (3, 4096, 1), (3, 4097, 2), (5, 9000, 3)])
def test_the_aggregate_is_the_plaintext_mean_within_the_ckks_bound(tmp_path, n, d, seed):
    channel = make_channel(tmp_path, n)
    xs = updates(n, d, seed)
    weights = dict.fromkeys(xs, 1.0)  # secure aggregation takes no other
    result = aggregate(channel, 1, xs, weights)
    ids = list(xs)
    assert result.included == ids and result.dropped == {}
    error = np.abs(result.payload[KIND].astype(np.float64) - plain_mean(xs, weights, ids)).max()
    assert error <= tolerance(xs, weights, ids)


def test_every_upload_fills_every_slot_and_is_57_bytes_per_slot(tmp_path):
    channel = make_channel(tmp_path, 2)
    d = 3 * 4096
    aggregate(channel, 1, updates(2, d), {"client-1": 1.0, "client-2": 1.0})
    uploads = [r for r in records(tmp_path) if r["phase"] == "upload"]
    assert len(uploads) == 2
    for r in uploads:
        context = new_context(PARAMS)  # any key: the count and shape are public
        with pytest.raises(MessageError, match="ciphertexts"):
            read_ciphertexts(context, payload_of(tmp_path, r), 2, PARAMS, r["sender"])
        # 2 x 8192 coefficients per 4096 slots, 8 bytes mod the 60-bit prime and 40 bits
        # (after SEAL's zstd) mod the 40-bit one
        assert 57 * d < r["bytes"] < 58 * d


# -- dropouts ------------------------------------------------------------------------------------

def test_a_dropout_after_upload_costs_nothing(tmp_path):
    """client-1 (the decryptor by default) drops after its upload: it is still counted, another
    client decrypts, and no phase beyond the normal three follows."""
    channel = make_channel(tmp_path, 3, [Fault("drop", "client-1", "he_sum", (2,))])
    xs = updates(3, 500)
    weights = dict.fromkeys(xs, 1.0)
    for round_ in (1, 2):
        result = aggregate(channel, round_, xs, weights)
        assert result.included == list(xs) and result.dropped == {}
        assert np.abs(result.payload[KIND] - plain_mean(xs, weights, list(xs))).max() <= \
            tolerance(xs, weights, list(xs))
    by_round = {rd: [(r["phase"], r["sender"], r["recipient"]) for r in records(tmp_path)
                     if r["round"] == rd and r["kind"] == KIND] for rd in (1, 2)}
    assert by_round[2] == [
        ("upload", "client-1", SERVER), ("upload", "client-2", SERVER),
        ("upload", "client-3", SERVER), ("he_sum", SERVER, "client-2"),
        ("he_decrypted", "client-2", SERVER)]
    assert len(by_round[1]) == 3 + 3 + 2  # key set-up (1 up, 2 relays), uploads, decryption


def test_a_dropout_before_upload_leaves_the_survivors_sum(tmp_path):
    channel = make_channel(tmp_path, 3, [Fault("drop", "client-2", "upload")])
    xs = updates(3, 300)
    weights = dict.fromkeys(xs, 1.0)
    result = aggregate(channel, 1, xs, weights)
    ids = ["client-1", "client-3"]
    assert result.included == ids and set(result.dropped) == {"client-2"}
    assert np.abs(result.payload[KIND] - plain_mean(xs, weights, ids)).max() <= \
        tolerance(xs, weights, ids)


def test_without_a_decryptor_online_the_round_aborts(tmp_path):
    faults = [Fault("drop", c, "he_sum") for c in ("client-1", "client-2")]
    channel = make_channel(tmp_path, 2, faults)
    result = aggregate(channel, 1, updates(2, 10), {"client-1": 1.0, "client-2": 1.0})
    assert result.payload is None and "no decryptor returned the sum" in result.reason


# -- keys ----------------------------------------------------------------------------------------

def _held(party) -> ts.Context | None:
    held = party.memory.get("ckks")
    return None if held is None else held["context"]


def _secret_key_bytes(context: ts.Context, tmp_path: Path) -> bytes:
    path = tmp_path / "sk.bin"
    context.secret_key().data.save(str(path))
    return path.read_bytes()


def test_the_key_set_up_is_logged_once_per_run_and_every_client_holds_one_key(tmp_path):
    channel = make_channel(tmp_path, 3)
    xs = updates(3, 20)
    for round_ in (1, 2, 3):
        assert aggregate(channel, round_, xs, dict.fromkeys(xs, 1.0)).payload is not None
    setup = [r for r in records(tmp_path) if r["phase"] in ("he_keys", "relay")]
    assert [(r["round"], r["phase"], r["sender"], r["recipient"], r.get("origin"))
            for r in setup] == [
        (1, "he_keys", "client-1", SERVER, None), (1, "relay", SERVER, "client-2", "client-1"),
        (1, "relay", SERVER, "client-3", "client-1")]
    assert all(r["stages"] == ["ckks"] for r in setup)
    keys = {_secret_key_bytes(_held(c), tmp_path) for c in channel.clients}
    assert len(keys) == 1  # one shared secret key
    assert not _held(channel.server).is_private()


def test_rotate_every_makes_fresh_keys_each_epoch(tmp_path):
    channel = make_channel(tmp_path, 2, rotate_every=2)
    xs = updates(2, 20)
    seen = []
    for round_ in range(1, 6):
        assert aggregate(channel, round_, xs, dict.fromkeys(xs, 1.0)).payload is not None
        seen.append(_secret_key_bytes(_held(channel.clients[0]), tmp_path))
    setup_rounds = sorted({r["round"] for r in records(tmp_path) if r["phase"] == "he_keys"})
    assert setup_rounds == [1, 2, 4]  # epochs round // 2: 0, 1, 2
    assert seen[1] == seen[2] and seen[3] == seen[4]
    assert len({seen[0], seen[1], seen[3]}) == 3


def test_a_client_offline_at_set_up_gets_the_key_when_it_is_back(tmp_path):
    channel = make_channel(tmp_path, 3, [Fault("drop", "client-3", "upload", (1,))])
    xs, weights = updates(3, 50), {"client-1": 1.0, "client-2": 1.0, "client-3": 1.0}
    first = aggregate(channel, 1, xs, weights)
    assert first.included == ["client-1", "client-2"] and _held(channel.clients[2]) is None
    second = aggregate(channel, 2, xs, weights)
    assert second.included == list(xs)
    late = [(r["sender"], r["recipient"]) for r in records(tmp_path)
            if r["phase"] in ("he_keys", "relay") and r["round"] == 2]
    assert late == [("client-1", SERVER), (SERVER, "client-3")]


def test_a_server_that_alters_a_relayed_key_is_refused_by_its_recipient(tmp_path):
    channel = make_channel(tmp_path, 3, [Fault("corrupt", SERVER, "relay", (1,), "client-2")])
    xs = updates(3, 10)
    result = aggregate(channel, 1, xs, dict.fromkeys(xs, 1.0))
    assert result.included == ["client-1", "client-3"]
    assert "holds no key" in result.dropped["client-2"]
    rejected = [r for r in records(tmp_path) if r.get("event") == "rejected"]
    # it refuses the altered key, then says (signed) why it sends no upload
    assert [(r["sender"], r["phase"]) for r in rejected] == [("client-2", "relay"),
                                                             ("client-2", "upload")]


# -- what reaches the server ---------------------------------------------------------------------

def _numbers(record) -> list[float]:
    """Every number in a log record but its hashes, links and signatures (hex): its JSON numbers and
    those written in its strings."""
    if isinstance(record, dict):
        return [x for k, v in record.items() if k not in ("sha256", "prev", "sig", "last")
                for x in _numbers(v)]
    if isinstance(record, list):
        return [x for v in record for x in _numbers(v)]
    if isinstance(record, bool):
        return []
    if isinstance(record, (int, float)):
        return [float(record)]
    if isinstance(record, str):
        return [float(m) for m in re.findall(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", record)]
    return []


def test_no_statistic_of_an_update_appears_in_the_log(tmp_path):
    """The server side logs no min, max, mean or norm of any update, scaled or not, and the
    uploads carry no update in the clear; a client whose update is out of range says so
    without its value."""
    channel = make_channel(tmp_path, 3, scale_bits=87)  # input limit 2^9 / 3, not whole
    xs = updates(3, 400, seed=5, scale=7.0)
    xs["client-3"][7] = 1e6  # beyond the input limit: withheld
    weights = dict.fromkeys(xs, 1.0)
    result = aggregate(channel, 1, xs, weights)
    assert result.included == ["client-1", "client-2"]
    s = CKKSStage.scales(weights)
    stats = []
    for c, x in xs.items():
        for v in (x.astype(np.float64), s[c] * x.astype(np.float64)):
            stats += [v.min(), v.max(), v.mean(), np.linalg.norm(v), np.abs(v).max()]
    logged = [x for r in records(tmp_path) for x in _numbers(r) if x != round(x)]
    assert logged  # the limit in the withheld update's reason, at least
    for stat in stats:
        assert not any(np.isclose(x, stat, rtol=1e-4, atol=0) for x in logged), stat
    withheld = [r for r in records(tmp_path) if r.get("event") == "rejected"]
    assert [(r["sender"], r["party"]) for r in withheld] == [("client-3", "client-3")]
    assert "exceeds" in withheld[0]["detail"]
    blob = (tmp_path / "payloads.bin").read_bytes()
    for c, x in xs.items():
        for v in (x, (s[c] * x.astype(np.float64))):
            assert v[:4].tobytes() not in blob


def test_the_server_refuses_malformed_ciphertexts_by_name():
    context = new_context(PARAMS)
    good = write_ciphertexts(encrypt(context, np.ones(10), PARAMS))
    assert len(read_ciphertexts(context, good, 1, PARAMS, "client-1")) == 1
    with pytest.raises(MessageError, match="client-1 sent no 2 ciphertexts"):
        read_ciphertexts(context, good, 2, PARAMS, "client-1")
    other = CKKSParams(8192, (60, 40), 30)
    scaled = write_ciphertexts(encrypt(new_context(other), np.ones(10), other))
    with pytest.raises(MessageError, match=r"client-1's ciphertext 0 has .* expected"):
        read_ciphertexts(context, scaled, 1, PARAMS, "client-1")
    wider = CKKSParams(8192, (60, 40, 40), 40)
    with pytest.raises(MessageError, match="client-1's ciphertext 0"):
        read_ciphertexts(context, write_ciphertexts(encrypt(new_context(wider), np.ones(10),
                                                            wider)), 1, PARAMS, "client-1")
    garbage = bytearray(good)
    garbage[-200:] = bytes(200)
    with pytest.raises(MessageError, match="client-1's ciphertext 0 does not parse"):
        read_ciphertexts(context, bytes(garbage), 1, PARAMS, "client-1")


def test_an_upload_under_another_key_makes_the_round_abort_not_lie(tmp_path):
    """A client encrypting under a key of its own: its ciphertext looks valid to the server,
    but the decrypted sum is noise over the whole range, which the server refuses."""
    channel = make_channel(tmp_path, 3)
    xs = updates(3, 200)
    aggregate(channel, 1, xs, dict.fromkeys(xs, 1.0))
    channel.clients[1].memory["ckks"]["context"] = new_context(PARAMS)
    result = aggregate(channel, 2, xs, dict.fromkeys(xs, 1.0))
    assert result.payload is None and "outside the range honest inputs reach" in result.reason


def test_decryptors_that_disagree_abort_the_round_and_agreeing_ones_are_accepted(tmp_path):
    channel = make_channel(tmp_path, 3, decryptors=2)
    xs = updates(3, 100)
    weights = dict.fromkeys(xs, 1.0)
    agreed = aggregate(channel, 1, xs, weights)
    assert agreed.included == list(xs)
    assert [r["recipient"] for r in records(tmp_path) if r["phase"] == "he_sum"] == [
        "client-1", "client-2"]
    # each floods with noise of its own, so honest answers differ, yet agree
    answers = [deserialize_payload(payload_of(tmp_path, r))["sum"]
               for r in records(tmp_path) if r["phase"] == "he_decrypted"]
    assert len(answers) == 2 and not np.array_equal(*answers)
    assert np.abs(agreed.payload[KIND] - plain_mean(xs, weights, list(xs))).max() <= \
        tolerance(xs, weights, list(xs), decryptors=2)
    channel.clients[1].memory["ckks"]["context"] = new_context(PARAMS)  # it decrypts wrongly
    lied = aggregate(channel, 2, xs, weights)
    assert lied.payload is None and "decryptors client-1, client-2 returned sums more than" \
        in lied.reason


# -- the spec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["model", "measure"])
def test_kinds_needed_one_by_one_are_refused_by_name(tmp_path, kind):
    spec = write_spec(tmp_path, {**SHIPPED, "protects": [kind]})
    with pytest.raises(ProtocolError, match=rf"stage 'ckks' cannot protect kind '{kind}'"):
        load_protocol(str(spec))


def test_weak_parameters_name_the_stage_and_the_limit(tmp_path):
    spec = write_spec(tmp_path, {**SHIPPED, "coeff_mod_bit_sizes": [60, 60, 60, 40]})
    with pytest.raises(ProtocolError, match=r"stage 'ckks'.*220 bits.*at most 218 bits"):
        load_protocol(str(spec))


@pytest.mark.parametrize("change, fragment", [
    ({"decryptors": 0}, "decryptors = 0; give an integer >= 1"),
    ({"rotate_every": -1}, "rotate_every = -1"),
    ({"protects": []}, "protects is empty"),
    ({"threshold": 0.6}, "unknown key 'threshold'"),
])
def test_bad_stage_keys_are_refused(tmp_path, change, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        load_protocol(str(write_spec(tmp_path, {**SHIPPED, **change})))


def test_clients_and_decryptors_are_checked_for_the_federation(tmp_path):
    stage = load_protocol(str(write_spec(tmp_path, {**SHIPPED, "decryptors": 3}))).stages[0]
    stage.validate_for(3)
    with pytest.raises(ProtocolError, match="decryptors = 3 but the federation has 2"):
        stage.validate_for(2)
    with pytest.raises(ProtocolError, match="at least 2 clients"):
        stage.validate_for(1)


def test_distributed_noise_is_refused_with_ckks(tmp_path):
    dp = {"stage": "dp", "protects": [KIND], "clip": 1.0, "delta": 1e-5,
          "noise_multiplier": 1.0, "noise": "distributed"}
    with pytest.raises(ProtocolError, match="distributed noise on kind 'gradient' holds only "
                                            "inside secure aggregation"):
        load_protocol(str(write_spec(tmp_path, dp, SHIPPED)))


def test_the_shipped_protocols():
    he, dp_he = load_protocol("he"), load_protocol("dp-he")
    assert [s.name for s in he.stages] == ["ckks"]
    assert [s.name for s in dp_he.stages] == ["dp", "ckks"]
    assert dp_he.dp.settings.noise == "local"
    for protocol in (he, dp_he):
        stage = protocol.stages[-1]
        assert stage.params == PARAMS and stage.decryptors == 1 and stage.rotate_every == 0
        assert set(protocol.phases) >= {"upload", "he_keys", "he_sum", "he_decrypted"}


# -- a real run ----------------------------------------------------------------------------------

def test_a_got_run_under_he_matches_plaintext_and_passes_the_audit(small_config, tmp_path):
    from secureffm.audit import verify_run

    # uniform: secure aggregation weighs clients equally, so plaintext must too to compare
    common = dict(method="got", rounds=10, potential_every=2, eval_samples=300, nfe=(1, 8),
                  weighting="uniform")
    plain = run(small_config(protocol="plaintext", out=str(tmp_path / "plain"), **common))
    he = run(small_config(protocol="he", out=str(tmp_path / "he"), **common))
    for nfe in ("1", "8"):
        a, b = plain.metrics["eval"]["w2"][nfe], he.metrics["eval"]["w2"][nfe]
        assert b == pytest.approx(a, rel=1e-3)
    uploads = [r for r in records(he.out) if r["kind"] in (KIND, "dual_update")
               and r["recipient"] == SERVER and r["phase"] == "upload"]
    assert uploads and all(r["stages"] == ["ckks"] for r in uploads)
    assert verify_run(he.out).ok


def test_without_tenseal_the_he_spec_is_refused_naming_the_extra(monkeypatch):
    """A user who installed only the core package (no ``he`` extra) asks for protocol ``he``:
    the spec is refused with a ProtocolError naming ``pip install secureffm[he]``, while a
    protocol without CKKS still builds (TenSEAL is imported only by the ckks stage)."""
    monkeypatch.setitem(sys.modules, "tenseal", None)  # `import tenseal` now raises ImportError
    assert load_protocol("plaintext").name == "plaintext"
    for name in ("he", "dp-he"):
        with pytest.raises(ProtocolError, match=r"pip install secureffm\[he\]"):
            load_protocol(name)
