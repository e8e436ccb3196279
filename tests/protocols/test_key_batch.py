"""Signed key batches (secureffm/protocols/key_batch.py) and the consistency signatures of
the malicious-server variant of secure aggregation: what one signature per batch must still
stop, and what it saves."""

from __future__ import annotations

import hashlib
import json
from tempfile import TemporaryDirectory

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import secureffm.protocols.key_batch as key_batch
import secureffm.protocols.secagg.keys_once as epoch
import secureffm.protocols.secagg.per_round as per_round
from secureffm.audit.verify import verify_run
from secureffm.errors import ProtocolError
from secureffm.federation import Client, deserialize_payload
from secureffm.federation.crypto import private_bytes
from secureffm.federation.faults import Fault
from secureffm.protocols import load_protocol
from secureffm.protocols.key_batch import KeyBatch, check_proof, commit, key_statement
from secureffm.protocols.quantize import Quantizer
from secureffm.protocols.secagg.session import ClientSession
from tests.protocols.test_endpoint import restarted
from tests.protocols.test_secagg import (
    KIND,
    LEVELS,
    logged_payloads,
    make_channel,
    make_clients,
    plain_mean,
    read_records,
    run_round,
    tolerance,
    uniform_updates,
    write_spec,
)

NAMES = ("b_commit", "c_pk", "s_pk")


def _client(name: str = "client-1") -> Client:
    return Client(name, torch.zeros(1, 2), torch.Generator().manual_seed(0))


def _advertised(batch: KeyBatch, round_: int) -> dict[str, bytes]:
    """What a client advertises for ``round_`` from its batch: its keys and their proof."""
    channel, mask, seed, proof = batch.take(round_)
    return {"c_pk": channel.public, "s_pk": mask.public, "b_commit": commit(seed)} | proof


def _reference_root(statements: list[bytes]) -> bytes:
    """An independent Merkle root: the hash of the two halves' roots, recursively, leaves
    SHA-256(0x00 || statement), inner nodes SHA-256(0x01 || left || right)."""
    if len(statements) == 1:
        return hashlib.sha256(b"\x00" + statements[0]).digest()
    half = len(statements) // 2
    return hashlib.sha256(b"\x01" + _reference_root(statements[:half])
                          + _reference_root(statements[half:])).digest()


@pytest.mark.parametrize("size", [1, 2, 8])
def test_every_round_of_a_batch_proves_its_keys_under_one_signed_root(size):
    client = _client()
    batch = KeyBatch.new(client, KIND, 5, size, NAMES)
    fields = [_advertised(batch, 5 + i) for i in range(size)]
    statements = [key_statement(5 + i, KIND, client.id, f, NAMES) for i, f in enumerate(fields)]
    assert {f["root"] for f in fields} == {_reference_root(statements)}
    assert len({f["sig"] for f in fields}) == 1
    assert len({f["c_pk"] for f in fields}) == size  # fresh keys every round
    for i, f in enumerate(fields):
        assert check_proof("client-2", client.identity.public, 5 + i, KIND, client.id, f, NAMES)


def test_a_relaying_server_cannot_pass_off_other_keys_under_a_signed_root():
    """Adversary: the server that relays client-1's advertisements to its neighbours and
    wants them to take keys other than client-1's own for this round: replays of another
    round's or kind's keys, a key of its own, an edited path or batch start, a root of its
    own signed with its key, or client-2's keys under client-1's name."""
    victim, other, server = _client("client-1"), _client("client-2"), _client("server")
    batch = KeyBatch.new(victim, KIND, 1, 4, NAMES)
    rounds = {r: _advertised(batch, r) for r in (1, 2, 3)}
    other_kind = _advertised(KeyBatch.new(victim, "dual_update", 1, 4, NAMES), 2)
    forged = _advertised(KeyBatch.new(server, KIND, 1, 4, NAMES), 2)
    theirs = _advertised(KeyBatch.new(other, KIND, 1, 4, NAMES), 2)

    def passes(fields: dict[str, bytes], round_: int = 2, kind: str = KIND,
               author: str = "client-1") -> bool:
        return check_proof("client-3", victim.identity.public, round_, kind, author, fields,
                           NAMES)

    assert passes(rounds[2])  # control: the real keys pass
    assert not passes(rounds[1]) and not passes(rounds[3])  # another round's keys
    assert not passes(rounds[2], round_=6)  # outside the batch
    assert not passes(other_kind)  # the keys it signed for another kind
    assert not passes(rounds[2], kind="dual_update")
    assert not passes(rounds[2] | {"c_pk": forged["c_pk"]})  # one key of the server's
    assert not passes(rounds[2] | {"b_commit": bytes(32)})
    path = rounds[2]["path"]
    assert not passes(rounds[2] | {"path": path[32:] + path[:32]})
    assert not passes(rounds[2] | {"path": path[:-32]})
    assert not passes(rounds[2] | {"path": path + bytes(32)})
    assert not passes(rounds[2] | {"first": (2).to_bytes(8, "big")})
    assert not passes(forged)  # a whole batch of its own, signed with its own key
    assert not passes(theirs)  # another client's genuine keys


def test_taking_a_round_removes_its_secrets_and_the_earlier_ones():
    """Adversary: whoever later reads a client's saved state (a stolen disk): it holds only
    the private keys of rounds still to come, never those of a round already used."""
    batch = KeyBatch.new(_client(), KIND, 10, 8, NAMES)
    channel, mask, seed, _ = batch.take(12)
    saved = json.dumps(batch.to_json())
    for secret in (private_bytes(channel.private), private_bytes(mask.private), seed):
        assert secret.hex() not in saved
    assert batch.take(12) is None and batch.take(11) is None and batch.take(18) is None
    restored = KeyBatch.from_json(json.loads(saved))
    assert restored.take(13) is not None and restored.take(17) is not None


def _count_root_checks(monkeypatch) -> list[int]:
    calls = [0]
    real = key_batch.verify_signature

    def counted(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(key_batch, "verify_signature", counted)
    key_batch.proven.cache_clear()
    return calls


@pytest.mark.parametrize("size", [1, 4])
def test_each_party_checks_each_batch_signature_once(tmp_path, monkeypatch, size):
    """Three exact rounds of 4 clients: with key_batch = 4 the server and each client check
    each peer's root signature once (4 + 4 x 3), with key_batch = 1 once per round."""
    calls = _count_root_checks(monkeypatch)
    n, rounds = 4, 3
    clients = make_clients(n)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, key_batch=size),
                                keep_payloads=True)
    weights = {cid: 1.0 for cid in ids}
    for r in range(1, rounds + 1):
        updates = uniform_updates(n, 6, seed=r)
        result = channel.aggregate(r, KIND, lambda c, u=updates: {KIND: u[c.id]}, weights,
                                   {KIND: ((6,), np.dtype(np.float32))})
        assert result.included == ids
        tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, ids, n)
        assert np.abs(result.payload[KIND] - plain_mean(updates, weights, ids)).max() <= tol
        if r == 1:  # a restarted client keeps its batch (what a Flower node does)
            channel.endpoints = {cid: restarted(e) for cid, e in channel.endpoints.items()}
    log.close()
    batches = 1 if size == 4 else rounds
    assert calls[0] == batches * (n + n * (n - 1))
    assert len(set(_advertised_roots(tmp_path))) == batches * n


def _advertised_roots(directory) -> list[tuple[str, bytes]]:
    return [(r["sender"], deserialize_payload(data)["root"].tobytes())
            for r, data in logged_payloads(directory, "advertise_keys")]


@pytest.mark.parametrize(("table", "message"), [
    ({"key_batch": 3}, "power of two"), ({"key_batch": 2048}, "power of two"),
    ({"key_batch": 4, "adversary": "semi-honest"}, "applies only"),
    ({"key_batch": 4, "setup": "once"}, "applies only")])
def test_key_batch_applies_only_to_signed_per_round_keys(tmp_path, table, message):
    with pytest.raises(ProtocolError, match=message):
        load_protocol(str(write_spec(tmp_path, **table)))


def _refusals(directory, client: str) -> list[str]:
    return [r["detail"] for r in read_records(directory)
            if r["kind"] == "event" and r["event"] == "rejected" and r["sender"] == client]


@pytest.mark.parametrize("forgery", ["reflected", "colluder"])
def test_a_survivor_confirmation_cannot_be_made_up_from_other_signatures(tmp_path,
                                                                         monkeypatch, forgery):
    """Adversary: a server that wants client-1 to answer an unmask request without client-2's
    confirmation of client-1's view (it told client-2 another survivor set, say). It relays as
    client-2's signature either the one client-1 itself made of the same view (reflected) or
    the one client-3, colluding, made. client-1 refuses, naming client-2; the others answer
    and the round stays exact."""
    real = per_round._request

    def tampered(stage, r, v, u3, gone, confirmations):
        if v == "client-1":
            made = confirmations["client-1" if forgery == "reflected" else "client-3"]
            confirmations = confirmations | {"client-2": made}
        return real(stage, r, v, u3, gone, confirmations)

    monkeypatch.setattr(per_round, "_request", tampered)
    clients = make_clients(4)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path))
    updates, weights = uniform_updates(4, 5), {cid: 1.0 for cid in ids}
    result = run_round(channel, updates, weights)
    log.close()
    assert any("client-2 did not confirm the survivor set" in why
               for why in _refusals(tmp_path, "client-1")), _refusals(tmp_path, "client-1")
    assert result.included == ids  # three answers reach the threshold of 3
    tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, ids, 4)
    assert np.abs(result.payload[KIND] - plain_mean(updates, weights, ids)).max() <= tol


def test_an_unmask_request_relaying_garbage_signatures_is_refused(tmp_path, monkeypatch):
    """Adversary: a server that relays garbage in place of the survivors' signatures. Each
    client refuses the request, naming a survivor whose signature does not verify, and the
    round aborts with nothing revealed. With that check removed (clients that check nothing)
    they answer, and the audit, which re-checks every answered request against the
    signatures the log shows, names it."""
    real = per_round._request
    monkeypatch.setattr(per_round, "_request", lambda stage, r, v, u3, gone, c: real(
        stage, r, v, u3, gone, {u: bytes(64) for u in c}))
    for checked in (False, True):
        folder = tmp_path / str(checked)
        folder.mkdir()
        clients = make_clients(4)
        channel, log = make_channel(folder, clients, write_spec(folder), keep_payloads=True)
        ids = [c.id for c in clients]
        with monkeypatch.context() as patch:
            if not checked:
                patch.setattr(ClientSession, "_signature_problem", lambda *args: "")
            result = run_round(channel, uniform_updates(4, 5), {c: 1.0 for c in ids})
        channel.close()
        report = verify_run(folder)
        if checked:
            assert result.payload is None and result.included == []
            refusals = [e for e in log.events if e["event"] == "rejected"
                        and e["sender"] != "server"]
            assert {e["sender"] for e in refusals} == set(ids)
            assert all("did not confirm the survivor set" in e["detail"] for e in refusals)
            assert report.ok, report.summary()
        else:
            assert result.included == ids
            assert not report.ok and "valid signature" in report.summary(), report.summary()


def test_under_setup_once_a_reflected_survivor_signature_is_refused(tmp_path, monkeypatch):
    """Adversary: a server that relays to client-1, as client-2's signature of the survivor
    set, the signature client-1 made of it itself (setup = "once", its consistency round).
    client-1 refuses, naming client-2; other holders answer in its place and the round stays
    exact."""
    real = epoch._request

    def tampered(stage, r, v, u3, gone, signed):
        if v == "client-1":
            signed = signed | {"client-2": signed["client-1"]}
        return real(stage, r, v, u3, gone, signed)

    monkeypatch.setattr(epoch, "_request", tampered)
    clients = make_clients(5)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, setup="once"))
    updates, weights = uniform_updates(5, 4), {cid: 1.0 for cid in ids}
    result = run_round(channel, updates, weights)
    log.close()
    assert any("client-2 did not confirm the survivor set, parameters, graph" in why
               for why in _refusals(tmp_path, "client-1")), _refusals(tmp_path, "client-1")
    assert result.included == ids
    tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, ids, 5)
    assert np.abs(result.payload[KIND] - plain_mean(updates, weights, ids)).max() <= tol


@settings(max_examples=12, deadline=None, database=None)
@given(size=st.sampled_from([2, 4]),
       drops=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4),
                                st.sampled_from(["advertise_keys", "share_keys", "masked_input",
                                                 "consistency_sign", "unmask"])),
                      max_size=4))
def test_rounds_across_key_batches_are_exact_or_abort_under_dropouts(size, drops):
    """Six rounds of 5 clients whose keys come from batches of 2 or 4 rounds (so rounds cross
    batch boundaries), with clients dropping in random rounds and phases: every round either
    aborts or is the exact mean of the clients it counts, and a round nobody drops in counts
    everyone (a client that dropped takes its next round's keys from its batch)."""
    ids = [f"client-{i}" for i in range(1, 6)]
    faults = [Fault("drop", ids[c], phase, (r,)) for r, c, phase in drops]
    weights = {cid: 1.0 for cid in ids}
    with TemporaryDirectory() as tmp:
        channel, log = make_channel(tmp, make_clients(5), write_spec(tmp, key_batch=size),
                                    faults)
        for r in range(1, 7):
            updates = uniform_updates(5, 4, seed=r)
            result = channel.aggregate(r, KIND, lambda c, u=updates: {KIND: u[c.id]}, weights,
                                       {KIND: ((4,), np.dtype(np.float32))})
            if not any(round_ == r for round_, _, _ in drops):
                assert result.included == ids
            if result.payload is not None:
                tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, result.included, 5)
                want = plain_mean(updates, weights, result.included)
                assert np.abs(result.payload[KIND] - want).max() <= tol
        log.close()
