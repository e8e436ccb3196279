"""Parties, their keys and their secret streams (secureffm/federation/parties.py).

Truths used: the ChaCha20 keystream from `cryptography` read word by word with Python
integers, HMAC-SHA256 and SHA-256 from the standard library, scipy's KS test for U[0, 1), and
Ed25519 verification with `cryptography` over canonical JSON written out here.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from scipy import stats

from secureffm.federation import parties
from secureffm.federation.parties import (
    Party,
    Registry,
    SecretStreams,
    keyed_uniforms,
    new_client,
)

KEY = bytes(range(32))
CONTEXT = (3, "gradient", "example")


def _chacha_words(key: bytes, words: int) -> list[int]:
    """The first ``words`` little-endian uint64 words of ChaCha20(key), counter and nonce 0."""
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(
        bytes(8 * words))
    return [int.from_bytes(stream[8 * i:8 * i + 8], "little") for i in range(words)]


@pytest.mark.parametrize("width", [1, 3, 8, 9])
def test_keyed_uniforms_read_each_rows_own_keystream_blocks(width):
    """Row r owns blocks r*m .. r*m + m - 1 (m = ceil(8 width / 64)); uniform i of a row is
    the top 53 bits of its i-th uint64 word times 2^-53 (a wrong offset, word order or bit
    shift breaks the equality)."""
    row_words = 8 * -(-8 * width // 64)  # 8 words per 64-byte block
    rows = np.array([0, 4, 2, 11])
    words = _chacha_words(KEY, 12 * row_words)
    u = keyed_uniforms(KEY, rows, width)
    for i, r in enumerate(rows):
        start = int(r) * row_words
        assert u[i].tolist() == [(w >> 11) * 2.0**-53 for w in words[start:start + width]]


def test_whole_table_and_per_row_branches_agree(monkeypatch):
    """Small spans read one keystream table, large ones each row on its own: the same numbers."""
    rows = np.array([9, 0, 400, 3, 9])
    table = keyed_uniforms(KEY, rows, 5)
    monkeypatch.setattr(parties, "_WHOLE_TABLE_BYTES", 0)
    per_row = keyed_uniforms(KEY, rows, 5)
    assert np.array_equal(table, per_row)


def test_an_examples_uniforms_do_not_depend_on_the_other_rows_asked_for():
    """Example 5's uniforms are the same alone, within a range, after another order, and beside
    a row far enough away to switch to the per-row branch (the per-example DP premise)."""
    alone = keyed_uniforms(KEY, np.array([5]), 3)[0]
    far = 2**20  # 2^20 rows of 64 bytes: past the whole-table limit
    for rows in ([5], list(range(40)), [7, 5, 1], [5, far], [far, 5, 5]):
        u = keyed_uniforms(KEY, np.array(rows), 3)
        for i in np.flatnonzero(np.array(rows) == 5):
            assert np.array_equal(u[i], alone), rows


def test_keyed_uniforms_refuse_rows_outside_the_keystream_and_allow_none():
    with pytest.raises(ValueError, match="example indices"):
        keyed_uniforms(KEY, np.array([-1]), 2)
    with pytest.raises(ValueError, match="example indices"):
        keyed_uniforms(KEY, np.array([2**32]), 2)
    assert keyed_uniforms(KEY, np.array([], dtype=np.int64), 4).shape == (0, 4)


def test_example_uniforms_are_uniform_on_the_unit_interval():
    """KS test against U[0, 1) and the first two moments (mean 1/2, variance 1/12)."""
    u = SecretStreams("client-1", 0).example_uniforms(CONTEXT, np.arange(5000), 4).ravel()
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(u.mean() - 0.5) < 4 * np.sqrt(1 / 12 / u.size)
    assert abs(u.var() - 1 / 12) < 0.005


@pytest.mark.parametrize("other", [
    ("client-1", 0, (4, "gradient", "example")),      # another round
    ("client-1", 0, (3, "dual_update", "example")),   # another message kind
    ("client-1", 0, (3, "gradient", "pool")),         # another use
    ("client-2", 0, CONTEXT),                         # another party's key
    ("client-1", 1, CONTEXT),                         # another seed
])
def test_different_contexts_and_keys_give_uncorrelated_streams(other):
    """Same rows, one thing changed: the uniforms differ everywhere and their correlation is
    within 5 standard errors of 0 (a stream reused across rounds or kinds would give 1)."""
    rows = np.arange(4000)
    base = SecretStreams("client-1", 0).example_uniforms(CONTEXT, rows, 1).ravel()
    party, seed, context = other
    changed = SecretStreams(party, seed).example_uniforms(context, rows, 1).ravel()
    assert not np.any(base == changed)
    assert abs(np.corrcoef(base, changed)[0, 1]) < 5 / np.sqrt(rows.size)


def test_os_entropy_streams_differ_and_deterministic_ones_replay_the_documented_key():
    first, second = SecretStreams("client-1"), SecretStreams("client-1")
    assert not first.deterministic and first.key != second.key and len(first.key) == 32
    rows = np.arange(8)
    assert not np.array_equal(first.example_uniforms(CONTEXT, rows, 2),
                              second.example_uniforms(CONTEXT, rows, 2))
    seeded = SecretStreams("client-1", 42)
    assert seeded.deterministic
    assert seeded.key == hashlib.sha256(b"secureffm-stream|42|client-1").digest()
    assert np.array_equal(seeded.example_uniforms(CONTEXT, rows, 2),
                          SecretStreams("client-1", 42).example_uniforms(CONTEXT, rows, 2))


def test_seed_for_is_the_top_bits_of_the_hmac_of_purpose_and_context():
    streams = SecretStreams("client-1", 5)
    digest = hmac.new(streams.key, b"dp|7|gradient", hashlib.sha256).digest()
    assert streams.seed_for("dp", 64, 7, "gradient") == int.from_bytes(digest, "big") >> 192
    assert streams.torch("dp", "cpu", 7, "gradient").initial_seed() == int.from_bytes(
        digest, "big") >> 192
    with pytest.raises(ValueError, match="unknown stream purpose 'chat'"):
        streams.seed_for("chat", 64)


def test_new_client_draws_its_streams_from_its_secret_key():
    """A seeded client replays SecretStreams(party, seed)'s training and protocol streams; two
    clients have distinct signing and sealing keys."""
    data = torch.arange(20.0).reshape(10, 2)
    client = new_client("client-3", data, deterministic_seed=9)
    replay = SecretStreams("client-3", 9)
    assert client.id == "client-3" and client.size == 10 and client.data is data
    assert client.streams.key == replay.key
    assert torch.equal(torch.rand(5, generator=client.generator),
                       torch.rand(5, generator=replay.torch("training")))
    assert np.array_equal(client.protocol_rng.random(5), replay.numpy("protocol").random(5))
    other = new_client("client-4", data)
    assert not other.streams.deterministic
    assert other.identity.public != client.identity.public
    assert other.sealing.public != client.sealing.public


def test_minibatch_rows_are_drawn_without_replacement_and_uniformly():
    """Each batch has distinct in-range rows; over 2,000 batches every row appears about
    equally often (chi-square against the uniform count)."""
    client = new_client("client-1", torch.arange(40.0).reshape(20, 2), deterministic_seed=1)
    counts = np.zeros(20)
    for _ in range(2000):
        rows = client.minibatch_rows(7)
        assert rows.shape == (7,) and len(set(rows.tolist())) == 7
        assert 0 <= rows.min() and rows.max() < 20
        counts += np.bincount(rows.numpy(), minlength=20)
    assert stats.chisquare(counts).pvalue > 1e-3
    batch = client.minibatch(20)
    assert sorted(batch[:, 0].tolist()) == list(range(0, 40, 2))  # all rows, each once


def test_secret_randomness_states_when_no_privacy_claim_holds():
    assert parties.secret_randomness(True).startswith("INSECURE")
    assert parties.secret_randomness(False).startswith("os-entropy")


# -- each party's own keys: what it signs, and the registry of public keys ------------------


def _verifies(public: bytes, signature: bytes, data: bytes) -> bool:
    """Ed25519 verification with `cryptography` directly (not the library's helper)."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
        return True
    except InvalidSignature:
        return False


def _signed_bytes(record: dict) -> bytes:
    """The canonical JSON of a record's content, written out here: every field but sig, seq,
    prev and offset, sorted keys, no spaces."""
    body = {k: v for k, v in record.items() if k not in ("sig", "seq", "prev", "offset")}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def test_an_envelope_is_signed_by_its_sender_over_its_header_and_by_no_one_else():
    alice, bob = Party("client-1"), Party("client-2")
    envelope = alice.envelope(4, "relay", "model", "client-2", b"bytes", ("sealed",),
                              origin="client-3")
    assert (envelope.sender, envelope.recipient, envelope.round, envelope.phase,
            envelope.kind, envelope.data, envelope.stages, envelope.origin) == (
        "client-1", "client-2", 4, "relay", "model", b"bytes", ("sealed",), "client-3")
    header = {"round": 4, "phase": "relay", "kind": "model", "sender": "client-1",
              "recipient": "client-2", "stages": ["sealed"], "bytes": 5,
              "sha256": hashlib.sha256(b"bytes").hexdigest(), "origin": "client-3"}
    assert envelope.header() == header
    assert _verifies(alice.identity.public, envelope.sig, _signed_bytes(header))
    assert not _verifies(bob.identity.public, envelope.sig, _signed_bytes(header))
    # any signed field changed: the signature no longer holds
    for field, value in (("round", 5), ("recipient", "client-3"), ("sha256", "0" * 64),
                         ("stages", []), ("origin", "client-2")):
        assert not _verifies(alice.identity.public, envelope.sig,
                             _signed_bytes(header | {field: value})), field
    # the same content signed by another party verifies only with that party's key
    forged = bob.envelope(4, "relay", "model", "client-2", b"bytes", ("sealed",), "client-3")
    assert not _verifies(alice.identity.public, forged.sig, _signed_bytes(header | {
        "sender": "client-2"}))


def test_an_event_is_signed_by_the_party_that_raises_it_and_by_no_one_else():
    server, client = Party("server"), Party("client-1")
    record = server.event(2, "aggregate", "aggregated", "*", "2 of 3 clients counted",
                          {"included": ["client-1", "client-2"], "of_kind": "gradient"})
    assert {k: v for k, v in record.items() if k != "sig"} == {
        "round": 2, "phase": "aggregate", "kind": "event", "sender": "server",
        "recipient": "log", "stages": [], "bytes": 0,
        "sha256": hashlib.sha256(b"").hexdigest(), "event": "aggregated", "party": "*",
        "detail": "2 of 3 clients counted", "included": ["client-1", "client-2"],
        "of_kind": "gradient"}
    signature = bytes.fromhex(record["sig"])
    assert _verifies(server.identity.public, signature, _signed_bytes(record))
    assert not _verifies(client.identity.public, signature, _signed_bytes(record))
    assert not _verifies(server.identity.public, signature,
                         _signed_bytes(record | {"included": ["client-1"]}))
    # its place in the log is not signed: seq and prev may be added without breaking it
    placed = record | {"seq": 12, "prev": "ab" * 32}
    assert _verifies(server.identity.public, signature, _signed_bytes(placed))
    rejected = client.event(2, "relay", "rejected", "server", "altered")
    assert rejected["sender"] == "client-1"
    assert _verifies(client.identity.public, bytes.fromhex(rejected["sig"]),
                     _signed_bytes(rejected))
    assert not _verifies(server.identity.public, bytes.fromhex(rejected["sig"]),
                         _signed_bytes(rejected))


def test_every_party_has_its_own_keys_and_the_registry_holds_only_their_public_halves():
    server = parties.new_server()
    clients = [new_client(f"client-{i}", torch.zeros(2, 2)) for i in (1, 2)]
    everyone = [server, *clients]
    assert server.id == "server" and not isinstance(server, parties.Client)
    assert len({p.identity.public for p in everyone}) == 3
    assert len({p.sealing.public for p in everyone}) == 3
    registry = Registry.of(everyone)
    assert registry.sign == {p.id: p.identity.public for p in everyone}
    assert registry.seal == {p.id: p.sealing.public for p in everyone}
    for party in everyone:  # the raw 32-byte public keys of the party's private keys
        assert registry.sign[party.id] == party.identity._private.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)
        assert registry.seal[party.id] == party.sealing.private.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)
    assert all(isinstance(k, bytes) and len(k) == 32
               for k in (*registry.sign.values(), *registry.seal.values()))
    assert Registry.of([]) == Registry({}, {})
