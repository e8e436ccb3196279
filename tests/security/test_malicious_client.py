"""One malicious client (or a lossy network) against one real secure-aggregation round.

Each test plays its adversary with ``corrupt``: the adversary party (a client, or a faulty
server) rewrites its own bytes at one phase before it signs them with its own key, so they pass
every transport check (they are that party's own message); or with a fault plan that loses one
of the server's deliveries. Everything else is the real stage (``load_protocol``), real crypto
and a real signed log. Each test asserts no exception, the adversary named in a ``rejected``
event, and a round that is exact over the survivors (the plaintext weighted mean, up to
quantization) or aborts with a reason; and that the log still verifies with its closing
record. "Before the fix" in each docstring is what the same attack did to the code before
branch fix-secagg (run and observed, not inferred).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from secureffm.audit.verify import verify_run
from secureffm.federation import (
    SERVER,
    Aggregate,
    Client,
    MessageLog,
    Party,
    deserialize_payload,
)
from secureffm.federation.faults import Fault, FaultPlan, load_threat_model
from secureffm.federation.message import serialize_payload
from secureffm.privacy.settings import DistributedNoise
from secureffm.protocols import ProtectedChannel, key_batch, load_protocol
from secureffm.protocols.link import Link
from secureffm.protocols.secagg.common import ADVERTISED
from secureffm.protocols.shamir import PRIME, share_from_bytes, share_to_bytes
from secureffm.runs.scaffold import open_channel

KIND = "gradient"
D = 12
LOW_ORDER_POINTS = [  # X25519 points of order 1, 2, 4 or 8, and non-canonical encodings of them
    bytes(32),
    bytes([1]) + bytes(31),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ec" + "ff" * 30 + "7f"),  # p - 1
    bytes.fromhex("ed" + "ff" * 30 + "7f"),  # p
    bytes.fromhex("ee" + "ff" * 30 + "7f"),  # p + 1
]


def corrupt(party: Party, tamper: dict) -> None:
    """``party`` turns adversary: ``tamper[phase](data, recipient)`` replaces the bytes it
    sends at that phase before it signs them with its own key (so the transport, holding only
    public keys, sees that party's genuine message); every other message is untouched."""
    honest = party.envelope

    def envelope(round_, phase, kind, recipient, data, stages=(), origin="",
                 digest=None):  # digest dropped: the honest envelope hashes what is sent
        change = tamper.get(phase)
        if getattr(change, "signs", False):  # the adversary signs its own lie
            data = change(data, recipient, party, round_, kind)
        elif change is not None:
            data = change(data, recipient)
        return honest(round_, phase, kind, recipient, data, stages, origin)

    party.envelope = envelope


@dataclass
class Outcome:
    result: Aggregate
    events: list[dict]
    updates: dict[str, np.ndarray]
    weights: dict[str, float]
    channel: ProtectedChannel


def play(tmp_path: Path, tamper: dict, n: int = 5, protocol: str = "secagg", faults=(),
         round_: int = 1, values: dict[str, np.ndarray] | None = None,
         noise: DistributedNoise | None = None) -> Outcome:
    """One aggregation of ``n`` clients, ``tamper[(party, phase)]`` played by ``party`` (see
    :func:`corrupt`); checks the log closes and verifies afterwards. ``noise``: each client's
    own plan under distributed noise. Weights are equal: secure aggregation takes no other."""
    clients = [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator(),
                      protocol_rng=np.random.default_rng(i)) for i in range(1, n + 1)]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol(protocol), clients, log, FaultPlan("test", tuple(faults)))
    for endpoint in channel.endpoints.values():
        endpoint.noise = lambda *_: noise
    for adversary in {party for party, _ in tamper}:
        corrupt(channel.parties[adversary],
                {phase: change for (party, phase), change in tamper.items()
                 if party == adversary})
    rng = np.random.default_rng(7)
    updates = values or {c.id: rng.uniform(-1, 1, D).astype(np.float32) for c in clients}
    size = next(iter(updates.values())).size
    weights = dict.fromkeys((c.id for c in clients), 1.0)
    result = channel.aggregate(round_, KIND, lambda c: {KIND: updates[c.id]}, weights,
                               {KIND: ((size,), np.dtype(np.float32))}, noise)
    channel.close()
    report = verify_run(tmp_path)
    assert report.ok, report.summary()
    return Outcome(result, list(log.events), updates, weights, channel)


def assert_named(outcome: Outcome, party: str, phase: str, fragment: str,
                 by: str = "server") -> None:
    """A ``rejected`` event by ``by`` names ``party`` at ``phase`` for ``fragment``."""
    hits = [e for e in outcome.events if e["event"] == "rejected" and e["party"] == party
            and e["phase"] == phase and e["sender"] == by]
    assert any(fragment in e["detail"] for e in hits), (fragment, outcome.events)


def assert_exact(outcome: Outcome, included: list[str]) -> None:
    """The round completed over exactly ``included``, equal to their plaintext weighted mean
    within the quantizer's bound (the stage scales each input by w_u n / W first)."""
    result, weights = outcome.result, outcome.weights
    assert result.reason == "" and result.included == included, result
    assert set(result.dropped) == set(weights) - set(included)
    w_in = sum(weights[c] for c in included)
    mean = sum(weights[c] * outcome.updates[c].astype(np.float64) for c in included) / w_in
    stage = outcome.channel.protocol.aggregator(KIND)
    tol = (stage.quantizer.error_bound(len(included)) * sum(weights.values())
           / (len(weights) * w_in) + 2.0**-22)
    assert np.abs(result.payload[KIND].astype(np.float64) - mean).max() <= tol


def assert_aborted(outcome: Outcome, *fragments: str) -> None:
    result = outcome.result
    assert result.payload is None and result.included == []
    assert all(f in result.reason for f in fragments), result.reason
    assert [e["detail"] for e in outcome.events if e["event"] == "aborted"] == [result.reason]


def ids(n: int) -> list[str]:
    return [f"client-{i}" for i in range(1, n + 1)]


def edit(change):
    """A tamper function applying ``change`` to the message's fields (name -> bytes)."""
    def tamper(data: bytes, recipient: str) -> bytes:
        fields = {k: v.tobytes() for k, v in deserialize_payload(data).items()}
        change(fields)
        return serialize_payload({k: np.frombuffer(v, dtype=np.uint8)
                                  for k, v in fields.items()})
    return tamper


def resigned(change):
    """Like :func:`edit` on an advertisement, then signed again by the adversary with its own
    identity, as a client lying about its own keys would (the malicious-server variant checks
    that signature)."""
    def tamper(data: bytes, recipient: str, party: Party, round_: int, kind: str) -> bytes:
        fields = {k: v.tobytes() for k, v in deserialize_payload(data).items()}
        change(fields)
        names = tuple(n for n in ADVERTISED if n in fields)  # per-round: all three
        leaf = key_batch._leaf(key_batch.key_statement(round_, kind, party.id, fields, names))
        statement = key_batch._root_statement(kind, party.id, round_, 0, leaf)  # one round
        fields |= {"first": round_.to_bytes(8, "big"), "path": b"", "root": leaf,
                   "sig": party.sign(statement)}
        return serialize_payload({k: np.frombuffer(v, dtype=np.uint8)
                                  for k, v in fields.items()})
    tamper.signs = True
    return tamper


def replace_with(data: bytes):
    return lambda _, recipient: data


# -- unmask replies ---------------------------------------------------------------------------

def flip_low_bit(fields):
    blob = fields["b:client-1"]
    fields["b:client-1"] = blob[:-1] + bytes([blob[-1] ^ 1])


def claim_other_x(fields):
    share = share_from_bytes(fields["b:client-1"])
    fields["b:client-1"] = share_to_bytes(type(share)(share.x + 1, share.y))


@pytest.mark.parametrize("n", [4, 5])  # 4: one spare share, placed with the commitment
@pytest.mark.parametrize("change, fragment", [
    (flip_low_bit, "share of client-1's b (self-mask seed) is off the polynomial"),
    (claim_other_x, "claims x = 3, not its x = 2"),
])
def test_an_altered_unmask_share_is_left_out_and_its_holder_named(tmp_path, n, change,
                                                                  fragment):
    """Adversary: client-2, a survivor, alters its revealed share of client-1's self-mask seed
    (one bit of y, or its x set to another holder's). Before the fix: uncaught ProtocolError
    (the wrong seed left masks that did not cancel: 'aggregate entry ... exceeds n * (levels -
    1)'; a claimed x = 3 next to client-3's: 'two shares at x = 3 have different y')."""
    outcome = play(tmp_path, {("client-2", "unmask"): edit(change)}, n=n)
    assert_named(outcome, "client-2", "unmask", fragment)
    # client-2's input stays: it arrived masked before the reply (removing it needs both
    # of client-2's secrets); its shares of the other secrets were honest and count.
    assert_exact(outcome, ids(n))


def test_an_altered_share_of_a_dropped_clients_mask_key_is_placed_through_its_s_pk(tmp_path):
    """Adversary: client-2 flips a bit of its share of s_sk of client-5, which dropped before
    its masked input; four holders answer (t = 3), so only the check of the rebuilt key
    against client-5's advertised s_pk places the lie. Before the fix: uncaught ProtocolError
    (the wrong key left client-5's pairwise masks in the sum: 'the masks did not cancel')."""
    def flip(fields):
        blob = fields["s:client-5"]
        fields["s:client-5"] = blob[:-1] + bytes([blob[-1] ^ 1])

    outcome = play(tmp_path, {("client-2", "unmask"): edit(flip)},
                   faults=[Fault("drop", "client-5", "masked_input")])
    assert_named(outcome, "client-2", "unmask",
                 "share of client-5's s (mask key, dropped) is off the polynomial")
    assert_exact(outcome, ids(4))


@pytest.mark.parametrize("tamper, fragment", [
    (edit(lambda f: f.update({"bclient-1": f.pop("b:client-1")})), "has field 'bclient-1'"),
    (edit(lambda f: f.update({"b:client-1": f["b:client-1"][:-1]})), "67 bytes, expected 68"),
    (edit(lambda f: f.update({"b:client-1": bytes(68)})), "x = 0 or y >= PRIME"),
    (replace_with(b"not a payload"), "not a valid payload"),
    (replace_with(serialize_payload({"b:client-1": np.zeros(17, np.float32)})), "byte string"),
])
def test_a_malformed_unmask_reply_is_discarded_whole_and_its_sender_named(tmp_path, tamper,
                                                                         fragment):
    """Adversary: client-2 answers the unmask request with a field name without ':', a
    truncated share, an all-zero share, bytes that are not a payload, or floats. Before the
    fix: each ended the run uncaught (ValueError: not enough values to unpack; ProtocolError:
    encoded share is 67 bytes; ProtocolError: x = 0; MessageError: not a valid payload; the
    floats parsed as 68 bytes of a bogus share and the masks did not cancel)."""
    outcome = play(tmp_path, {("client-2", "unmask"): tamper})
    assert_named(outcome, "client-2", "unmask", fragment)
    assert_named(outcome, "client-2", "unmask", "all its shares were discarded")
    assert_exact(outcome, ids(5))


# -- sealed shares ----------------------------------------------------------------------------

def zero_sealed_for(*recipients):
    return edit(lambda f: f.update({v: bytes(len(f[v])) for v in recipients}))


def test_a_zeroed_share_ciphertext_is_refused_by_its_recipient(tmp_path):
    """Adversary: client-2 seals garbage for client-3 (an all-zero ciphertext of the right
    length), which the relaying server cannot check. Before the fix: uncaught ProtocolError
    ('ciphertext failed authentication') when client-3 opened it to answer the unmask."""
    outcome = play(tmp_path, {("client-2", "share_keys"): zero_sealed_for("client-3")})
    assert_named(outcome, "client-2", "shares", "failed authentication", by="client-3")
    # client-3 still masks with client-2 (masks need only public keys), so the sum is exact;
    # client-2's secrets are rebuilt from its other four holders.
    assert_exact(outcome, ids(5))


def test_shares_most_holders_cannot_open_abort_the_round_naming_their_dealer(tmp_path):
    """Adversary: client-2 seals garbage for three of its four peers, so only two shares of
    its seed exist (its own and client-5's), t = 3. Before the fix: uncaught ProtocolError
    ('ciphertext failed authentication')."""
    outcome = play(tmp_path, {("client-2", "share_keys"): zero_sealed_for(
        "client-1", "client-3", "client-4")})
    for holder in ("client-1", "client-3", "client-4"):
        assert_named(outcome, "client-2", "shares", "failed authentication", by=holder)
    assert_aborted(outcome, "only 2 shares of client-2's b (self-mask seed) came back, 3 needed")


def test_a_client_that_shares_another_seed_than_it_committed_to_aborts_named(tmp_path):
    """Adversary: client-2 advertises a commitment to a seed other than the one it shares
    and masks with (a dealer lying about its own secret). Its five shares agree with each
    other, but not with the commitment. Before the fix there was no commitment, and a client
    dealing shares of another seed than the one it masked with (run with its split patched)
    made the masks not cancel: uncaught ProtocolError."""
    outcome = play(tmp_path, {("client-2", "advertise_keys"): resigned(
        lambda f: f.update({"b_commit": hashlib.sha256(b"another seed").digest()}))})
    assert_aborted(outcome, "the 5 shares of client-2's b (self-mask seed) from client-1, "
                   "client-2, client-3, client-4, client-5 do not rebuild the seed it "
                   "committed to", "client-2 dealt other shares than it committed to")


def test_a_truncated_share_ciphertext_is_rejected_by_the_server(tmp_path):
    """Adversary: client-2 sends client-3 a ciphertext cut short by one byte. Before the fix:
    uncaught ProtocolError ('ciphertext failed authentication') at the unmask."""
    outcome = play(tmp_path, {("client-2", "share_keys"): edit(
        lambda f: f.update({"client-3": f["client-3"][:-1]}))})
    assert_named(outcome, "client-2", "share_keys", "sealed shares for client-3 are 163 bytes")
    assert_exact(outcome, ["client-1", "client-3", "client-4", "client-5"])


# -- advertised keys --------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["c_pk", "s_pk"])
@pytest.mark.parametrize("point", LOW_ORDER_POINTS, ids=lambda p: p.hex()[:8])
def test_a_low_order_public_key_is_rejected_at_advertise_time(tmp_path, field, point):
    """Adversary: client-2 advertises a low-order X25519 point (32 zero bytes and the other
    small-subgroup points), whose exchange yields the all-zero secret. Before the fix:
    uncaught ProtocolError ('invalid X25519 public key') when its peers derived channel keys
    (c_pk) or pairwise masks (s_pk) from it."""
    outcome = play(tmp_path, {("client-2", "advertise_keys"): edit(
        lambda f: f.update({field: point}))})
    assert_named(outcome, "client-2", "advertise_keys",
                 f"client-2's {field} is not a usable X25519 public key")
    assert_exact(outcome, ["client-1", "client-3", "client-4", "client-5"])


# -- the Lagrange-coefficient attack under distributed noise -------------------------------------

def lagrange_shift(fields):
    """Add 1 / lambda_2 to client-2's share of client-1's seed, lambda_2 its Lagrange
    coefficient at 0 among the first three holders (x = 1, 2, 3): plain interpolation of
    those shares then yields b_1 + 1, a seed whose PRG output is unrelated to b_1's."""
    share = share_from_bytes(fields["b:client-1"])
    coefficient = (1 * 3 * pow((1 - 2) * (3 - 2), -1, PRIME)) % PRIME
    fields["b:client-1"] = share_to_bytes(
        type(share)(share.x, (share.y + pow(coefficient, -1, PRIME)) % PRIME))


def distributed_round(tmp_path, n: int, faults=()) -> tuple[Outcome, float]:
    """A dp-secagg-distributed round on 0.01 everywhere with client-2 lying; returns the
    outcome and the std of the decoded mean's noise (update units)."""
    values = {cid: np.full(400, 0.01, dtype=np.float32) for cid in ids(n)}
    noise = DistributedNoise(1.0, {cid: 1e-3 for cid in ids(n)})
    outcome = play(tmp_path, {("client-2", "unmask"): edit(lagrange_shift)}, n=n,
                   protocol="dp-secagg-distributed", values=values, noise=noise, faults=faults)
    stage = outcome.channel.protocol.aggregator(KIND)
    share = stage.noise_geometry(outcome.weights, noise.sensitivity, 400, 0).share_variance(1.0)
    scales = stage.scales(outcome.weights)
    std = math.sqrt(share * n) * stage.quantizer.step / sum(scales.values())
    return outcome, std


@pytest.mark.parametrize("n", [4, 5])
def test_the_lagrange_coefficient_attack_is_caught_and_the_mean_does_not_move(tmp_path, n):
    """Adversary: client-2 adds the inverse of its public Lagrange coefficient to its share of
    client-1's self-mask seed, under dp-secagg-distributed (no range check on the noisy sum).
    Before the fix: no event, and the decoded mean moved from 0.01 to about 2000."""
    outcome, std = distributed_round(tmp_path, n)
    assert_named(outcome, "client-2", "unmask", "client-1's b (self-mask seed) is off")
    assert outcome.result.included == ids(n)
    error = outcome.result.payload[KIND].astype(np.float64) - 0.01
    assert np.abs(error).max() < 6 * std + 1e-5  # noise of the mean only; the attack was 2000
    assert std < 1e-2


def test_with_exactly_t_shares_the_lagrange_attack_aborts_the_round_naming_the_holders(
        tmp_path):
    """Adversary: as above, but client-4 goes offline at the unmask, so exactly t = 3 shares
    of client-1's seed come back and any three fit a polynomial: the lie cannot be placed,
    only seen through client-1's commitment. Before the fix: the mean moved silently."""
    outcome, _ = distributed_round(tmp_path, 4, [Fault("drop", "client-4", "unmask")])
    assert_aborted(outcome, "client-1's b (self-mask seed)", "client-1, client-2, client-3",
                   "do not rebuild the seed it committed to")


# -- the server's deliveries ------------------------------------------------------------------

@pytest.mark.parametrize("n", [3, 4])
def test_a_lost_shares_delivery_drops_its_recipient_before_it_masks(tmp_path, n):
    """Adversary: the network loses the server's ``shares`` delivery to client-2 (shipped
    threat model lose-shares-delivery, round 2). Before the fix (fault plans could not target
    the server; the delivery was made to fail by an engine returning None for it): client-2
    masked with no one while its peers masked with it, uncaught ProtocolError 'the masks did
    not cancel'."""
    plan = load_threat_model("lose-shares-delivery")
    outcome = play(tmp_path, {}, n=n, faults=plan.faults, round_=2)
    assert_exact(outcome, [c for c in ids(n) if c != "client-2"])
    assert "shares were lost or refused" in outcome.result.dropped["client-2"]


@pytest.mark.parametrize("action, fragment", [("corrupt", "altered in transit"),
                                              ("delay", "after the phase closed")])
def test_a_garbled_shares_delivery_is_refused_and_its_recipient_drops_out(tmp_path, action,
                                                                          fragment):
    """Adversary: the network corrupts or delays the server's shares delivery to client-2.
    Before the fix: such a fault could not be stated (party 'server' was refused)."""
    outcome = play(tmp_path, {}, faults=[Fault(action, "server", "shares", (),
                                               "client-2")])
    assert_named(outcome, "server", "shares", fragment, by="client-2")
    assert_exact(outcome, ["client-1", "client-3", "client-4", "client-5"])


def to_client_2(change):
    """Apply ``change`` only to the server's message for client-2."""
    return lambda data, to: change(data, to) if to == "client-2" else data


@pytest.mark.parametrize("phase, change, fragment", [
    ("keys", replace_with(b"garbage"), "not a valid payload"),
    ("keys", edit(lambda f: f.update({"s_pk:client-3": bytes(32)})),
     "keys of client-3 are not signed by client-3's pinned identity"),
    ("shares", replace_with(b"garbage"), "not a valid payload"),
    ("unmask_request", replace_with(b"garbage"), "not a valid payload"),
])
def test_a_garbled_server_message_makes_only_its_recipient_drop_out(tmp_path, phase, change,
                                                                   fragment):
    """Adversary: a faulty server signs garbage, or a low-order key, as its message to
    client-2 at one phase (it passes every transport check). Before the fix: uncaught
    MessageError ('not a valid payload') in client-2's parsing, or ProtocolError ('invalid
    X25519 public key') when client-2 derived its mask with client-3."""
    outcome = play(tmp_path, {("server", phase): to_client_2(change)})
    assert_named(outcome, "server", {"unmask_request": "unmask"}.get(phase, phase), fragment,
                 by="client-2")
    # client-2 drops out before masking, except at the unmask: its input is in by then, and
    # the other four holders reveal enough shares without it.
    assert_exact(outcome, ids(5) if phase == "unmask_request"
                 else ["client-1", "client-3", "client-4", "client-5"])


# -- what is not caught: a wrong masked input -------------------------------------------------

def garbage_masked_input(data: bytes, recipient: str) -> bytes:
    size = deserialize_payload(data)["y"].size
    words = np.random.default_rng(3).integers(0, 2**32, size, dtype=np.uint64)
    return serialize_payload({"y": words.astype(np.uint32)})


def test_a_garbage_masked_input_aborts_cleanly_but_unnamed(tmp_path):
    """Adversary: client-2 sends uniformly random words as its masked input. The sum then
    falls outside the quantizer's range, so the round aborts; nothing can tell whose input it
    was (input validation is out of scope). Before the fix: uncaught ProtocolError from
    dequantization ('the masks did not cancel')."""
    outcome = play(tmp_path, {("client-2", "masked_input"): garbage_masked_input})
    assert_aborted(outcome, "the unmasked sum is unusable")
    assert not [e for e in outcome.events if e["event"] == "rejected"]


def test_under_distributed_noise_a_garbage_masked_input_moves_the_mean_unseen(tmp_path):
    """What does NOT hold. Adversary: as above, under dp-secagg-distributed, where the noisy
    sum is read as the residue nearest its centre, with no range check. The round completes
    with a mean far from 0.01 and no event: the attack succeeds, before the fix and after."""
    values = {cid: np.full(400, 0.01, dtype=np.float32) for cid in ids(4)}
    outcome = play(tmp_path, {("client-2", "masked_input"): garbage_masked_input}, n=4,
                   protocol="dp-secagg-distributed", values=values,
                   noise=DistributedNoise(1.0, {cid: 1e-3 for cid in ids(4)}))
    assert outcome.result.included == ids(4)
    assert np.abs(outcome.result.payload[KIND] - 0.01).mean() > 1.0
    assert not [e for e in outcome.events if e["event"] in ("rejected", "aborted")]


# -- a forged envelope ------------------------------------------------------------------------

def test_a_forged_envelope_from_an_unregistered_party_is_rejected_by_name(tmp_path):
    """Adversary: mallory, whom no one registered, sends the server a real envelope (a
    payload in its own name, signed with a key of its own), directly and through the
    unknown_sender fault. Before the fix: KeyError: 'mallory' (the engine looked up its
    identity to log the delivery), and the fault only wrote a log line without any message
    crossing."""
    log = MessageLog(tmp_path / "messages.jsonl")
    clients = [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator()) for i in (1, 2)]
    faults = FaultPlan("forge", (Fault("unknown_sender", "eve", "upload"),))
    channel = open_channel(load_protocol("plaintext"), clients, log, faults)
    data = serialize_payload({KIND: np.ones(3, dtype=np.float32)})
    mallory = Party("mallory")
    link = Link(channel.transport, {**channel.parties, "mallory": mallory}, channel.clients, 1,
                KIND)
    assert link.send("upload", "mallory", SERVER, data) is None
    result = channel.aggregate(1, KIND, lambda c: {KIND: np.ones(3, dtype=np.float32)},
                               {"client-1": 1.0, "client-2": 1.0},
                               {KIND: ((3,), np.dtype(np.float32))})
    channel.close()
    assert result.included == ["client-1", "client-2"]
    rejected = [e for e in log.events if e["event"] == "rejected"]
    assert sorted((e["party"], e["sender"]) for e in rejected) == [("eve", "server"),
                                                                   ("mallory", "server")]
    # Both crossed the receive path as real envelopes: each event carries its bytes' hash
    # (eve's is a copy of client-1's upload, which equals ``data`` here).
    assert all(hashlib.sha256(data).hexdigest()[:16] in e["detail"]
               and "not registered" in e["detail"] for e in rejected)
    records = [json.loads(line) for line in
               (tmp_path / "messages.jsonl").read_text().splitlines()]
    assert {r["sender"] for r in records} == {"server", "client-1", "client-2"}
    assert verify_run(tmp_path).ok
