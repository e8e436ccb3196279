"""The server's side over a batched call (secureffm/federation/remote.py), against real client
endpoints behind a loopback, and against malicious clients answering the server.

The loopback is what a Flower node does with the bytes, minus Flower: decode_request ->
the client's own ClientEndpoint (its own keys, its own copy of the protocol, its program) ->
encode_reply. Each attack rewrites the malicious client's reply frame on its way back (the
client controls every byte it answers). Each attack test first shows the attack succeeds
against a transport with the check removed (monkeypatched away), then that the real transport
refuses it by name in a server ``rejected`` event (or drops the client), the round completes
exactly over the others, and the audit (``verify_run``) accepts the log.

Truths used: the in-process engine (secureffm.runs.scaffold.open_channel), which the
existing secure-aggregation tests check against plaintext means, and which, with the same
protocol streams and the same client offline at the same phase (a ``drop`` fault), must give
the bit-identical aggregate.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from secureffm.audit.verify import verify_run
from secureffm.errors import MessageError, ProtocolError
from secureffm.federation import exchange as exchange_module
from secureffm.federation import remote as remote_module
from secureffm.federation.channel import Aggregate, Task
from secureffm.federation.codec import decode_reply, decode_request, encode_reply
from secureffm.federation.exchange import Incoming, Reply
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.log import MessageLog
from secureffm.federation.message import SERVER, canonical, deserialize_payload, serialize_payload
from secureffm.federation.parties import Client, ClientInfo, Party, Registry, new_server
from secureffm.federation.remote import RemoteTransport
from secureffm.protocols import ProtectedChannel, load_protocol
from secureffm.protocols.endpoint import ClientEndpoint
from secureffm.protocols.secagg.session import ClientSession
from secureffm.runs.scaffold import open_channel

KIND = "gradient"
D = 6
TEMPLATE = {KIND: ((D,), np.dtype(np.float32))}
ADVERSARY = "client-2"
VICTIM = "client-1"  # the honest client a malicious server's rewritten requests reach


def ids(n: int) -> list[str]:
    return [f"client-{i}" for i in range(1, n + 1)]


def updates(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {cid: rng.uniform(-1, 1, D).astype(np.float32) for cid in ids(n)}


def weights(n: int) -> dict[str, float]:
    """Equal: secure aggregation takes no other."""
    return dict.fromkeys(ids(n), 1.0)


def clients(n: int) -> list[Client]:
    """Clients whose protocol streams (stochastic rounding) are seeded the same in both
    engines, so that equal inputs give bit-equal quantized aggregates."""
    return [Client(cid, torch.zeros(1, 2), torch.Generator(),
                   protocol_rng=np.random.default_rng(i)) for i, cid in enumerate(ids(n), 1)]


class Loopback:
    """The ``calls`` of a remote transport, answered by real endpoints through the codec."""

    def __init__(self, endpoints: dict[str, ClientEndpoint], tamper=None, server=None,
                 tamper_request=None):
        self.endpoints = endpoints
        self.tamper = tamper
        self.server = server  # the server's Party, for a malicious server's rewritten requests
        self.tamper_request = tamper_request
        self.asked: list[tuple[str, str]] = []  # (client, action) in the order asked

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for cid, frame in requests.items():
            request, incoming, broadcasts = decode_request(frame)
            self.asked.append((cid, request.action))
            if self.tamper_request is not None and cid == VICTIM and incoming is not None:
                incoming = self.tamper_request(request, incoming, self.server)
            reply: bytes | None = encode_reply(self.endpoints[cid](request, incoming,
                                                                   broadcasts))
            if self.tamper is not None and cid == ADVERSARY:
                reply = self.tamper(request, reply, self.endpoints)
            out[cid] = reply
        return out


@dataclasses.dataclass
class Run:
    result: Aggregate
    events: list[dict]
    loop: Loopback
    transport: RemoteTransport
    folder: Path

    def audit(self):
        return verify_run(self.folder)


def remote(tmp_path: Path, protocol: str, n: int = 4, tamper=None,
           keep_payloads: bool = False, tamper_request=None) -> Run:
    """One aggregation with every client behind the loopback; the log closed (with
    payloads.bin when ``keep_payloads``, so that the audit's rules read the payloads).
    ``tamper``: rewrites the adversary's reply frames; ``tamper_request``: rewrites the
    server's messages to the victim (a malicious server, with the server's key)."""
    values = updates(n)
    server, members = new_server(), clients(n)
    registry = Registry.of([server, *members])

    def program(client: Client, task: Task) -> dict[str, np.ndarray]:
        assert task == Task("update", {"scale": 1})
        return {KIND: values[client.id]}

    endpoints = {c.id: ClientEndpoint(c, registry, load_protocol(protocol), program)
                 for c in members}
    loop = Loopback(endpoints, tamper, server, tamper_request)
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads)
    transport = RemoteTransport(registry, tuple(ids(n)), log, loop, timeout=1.0)
    channel = ProtectedChannel(load_protocol(protocol), transport, server,
                               [ClientInfo(cid, 1) for cid in ids(n)], remote=True)
    result = channel.aggregate(1, KIND, Task("update", {"scale": 1}), weights(n), TEMPLATE)
    channel.close()
    return Run(result, list(log.events), loop, transport, tmp_path)


def in_process(tmp_path: Path, protocol: str, n: int = 4, drop: str = "",
               phase: str = "") -> Aggregate:
    """The same aggregation on the in-process engine; ``drop`` goes offline at ``phase``."""
    values = updates(n)
    faults = FaultPlan("t", (Fault("drop", drop, phase),)) if drop else None
    folder = tmp_path / "in-process"
    folder.mkdir()
    channel = open_channel(load_protocol(protocol), clients(n),
                           MessageLog(folder / "messages.jsonl"), faults)
    result = channel.aggregate(1, KIND, lambda c: {KIND: values[c.id]}, weights(n), TEMPLATE)
    channel.close()
    assert verify_run(folder).ok
    return result


def assert_same(got: Aggregate, expected: Aggregate) -> None:
    assert got.included == expected.included and set(got.dropped) == set(expected.dropped)
    np.testing.assert_array_equal(got.payload[KIND], expected.payload[KIND])


# -- honest runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol,n", [("plaintext", 3), ("secagg", 3), ("secagg", 4)])
def test_a_remote_aggregation_gives_the_in_process_sum(tmp_path, protocol, n):
    run = remote(tmp_path, protocol, n)
    assert run.result.included == ids(n) and run.result.dropped == {}
    assert_same(run.result, in_process(tmp_path, protocol, n))
    expected = sum(w * updates(n)[c].astype(np.float64) for c, w in weights(n).items())
    np.testing.assert_allclose(run.result.payload[KIND], expected / sum(weights(n).values()),
                               atol=1e-5)
    assert [e["event"] for e in run.events] == ["aggregated", "closed"]
    report = run.audit()
    assert report.ok, report.summary()
    asked = {action for _, action in run.loop.asked}
    assert asked == ({"upload"} if protocol == "plaintext" else
                     {"secagg.advertise", "secagg.deal", "secagg.mask", "secagg.sign",
                      "secagg.answer"})


def test_a_callable_compute_is_refused_on_a_remote_transport(tmp_path):
    server, members = new_server(), clients(3)
    registry = Registry.of([server, *members])
    transport = RemoteTransport(registry, tuple(ids(3)), MessageLog(tmp_path / "m.jsonl"),
                                Loopback({}), 1.0)
    channel = ProtectedChannel(load_protocol("plaintext"), transport, server,
                               [ClientInfo(c, 1) for c in ids(3)], remote=True)
    with pytest.raises(MessageError, match="only on the in-process engine"):
        channel.aggregate(1, KIND, lambda c: {}, weights(3), TEMPLATE)
    with pytest.raises(ProtocolError, match="reaches its clients itself"):
        transport.exchange({}, {})


# -- attacks: a malicious client answering the server -------------------------------------------


def at(action: str, change):
    """The adversary rewrites its reply to ``action`` with ``change(request, frame,
    endpoints)``; every other reply passes untouched."""

    def tamper(request, frame, endpoints):
        return change(request, frame, endpoints) if request.action == action else frame

    return tamper


def reframe(frame: bytes, change_header=None, data: bytes | None = None) -> bytes:
    """The frame with its JSON header changed (and its message bytes replaced)."""
    size = int.from_bytes(frame[:4], "big")
    header = json.loads(frame[4:4 + size])
    if change_header is not None:
        change_header(header)
    head = json.dumps(header).encode()
    return len(head).to_bytes(4, "big") + head + (frame[4 + size:] if data is None else data)


def assert_refused(run: Run, fragment: str, phase: str = "masked_input") -> None:
    """The server names the adversary in a ``rejected`` event of ``phase`` for
    ``fragment``, and the round is exact over the others (the in-process round where the
    adversary went offline at that phase), and the audit accepts the log."""
    hits = [e for e in run.events if e["event"] == "rejected" and e["party"] == ADVERSARY
            and e["sender"] == SERVER and e["phase"] == phase]
    assert any(fragment in e["detail"] for e in hits), (fragment, run.events)
    report = run.audit()
    assert report.ok, report.summary()


def assert_exact_without_adversary(run: Run, tmp_path: Path) -> None:
    others = [c for c in ids(4) if c != ADVERSARY]
    assert run.result.included == others
    assert_same(run.result, in_process(tmp_path, "secagg", 4, ADVERSARY, "masked_input"))


def test_a_reply_frame_that_does_not_parse_is_refused(tmp_path, monkeypatch):
    """Adversary: a malicious client answers its masked-input request with bytes that are no
    frame. Unchecked (a server that decodes replies without catching), it takes the whole
    round down; checked, only its own input is lost."""
    garbage = at("secagg.mask", lambda request, frame, endpoints: b"\x00\x00\x00\x05{oops")
    real = RemoteTransport._reply

    def trusting(self, cid, request, frame):
        decode_reply(frame, cid)  # a server that trusts its clients' frames
        return real(self, cid, request, frame)

    with monkeypatch.context() as patch:
        patch.setattr(RemoteTransport, "_reply", trusting)
        with pytest.raises(MessageError, match="not a secureffm frame"):
            remote(tmp_path / "unchecked", "secagg", tamper=garbage)
    run = remote(tmp_path, "secagg", tamper=garbage)
    assert_refused(run, "refused the reply of client-2: the reply of client-2 is not a "
                   "secureffm frame")
    assert_exact_without_adversary(run, tmp_path)


def foreign_event(request, frame, endpoints):
    """client-2 slips into its reply a genuine event client-3 signed (an accusation of
    client-1, as client-3 would have signed it), to have the server log it."""
    framed = endpoints["client-3"].client.event(request.round, "masked_input", "rejected",
                                                "client-1", "client-3 says client-1 cheated")
    return reframe(frame, lambda header: header["events"].append(framed))


def lax_decode(frame: bytes, sender: str) -> Reply:
    """A codec without the check that every event is the sender's own."""
    size = int.from_bytes(frame[:4], "big")
    events = json.loads(frame[4:4 + size])["events"]
    own = decode_reply(reframe(frame, lambda header: header.update(events=[])), sender)
    return Reply(own.envelope, tuple(events))


def test_an_event_signed_by_another_client_is_refused(tmp_path, monkeypatch):
    """Adversary: client-2 carries client-3's genuinely signed accusation of client-1 in its
    reply. Unchecked (no sender check in the codec, no signer check in the transport), the
    server logs client-3 accusing client-1, and the audit cannot tell: the signature is
    client-3's. Checked, the reply is refused and the accusation never reaches the log."""
    tamper = at("secagg.mask", foreign_event)
    with monkeypatch.context() as patch:
        patch.setattr(remote_module, "decode_reply", lax_decode)
        patch.setattr(remote_module, "verify_signature", lambda *args: True)
        unchecked = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
    accusations = [e for e in unchecked.events if e["sender"] == "client-3"]
    assert [e["detail"] for e in accusations] == ["client-3 says client-1 cheated"]
    assert unchecked.audit().ok  # the forged context is invisible to the audit

    run = remote(tmp_path, "secagg", tamper=tamper)
    assert_refused(run, "carries events that are not its own")
    assert not [e for e in run.events if e["sender"] == "client-3"]
    assert_exact_without_adversary(run, tmp_path)


def bad_signature(request, frame, endpoints):
    """client-2 adds an event in its own name whose signature does not verify (it was signed
    over other content: the detail was edited afterwards)."""
    event = endpoints[ADVERSARY].client.event(request.round, "masked_input", "rejected",
                                              "client-1", "client-1 sent garbage")
    event["detail"] = "client-1 sent garbage and lied about it"
    return reframe(frame, lambda header: header["events"].append(event))


def test_an_event_with_a_bad_signature_is_refused(tmp_path, monkeypatch):
    """Adversary: client-2's reply carries an event whose signature does not match it.
    Unchecked, the server writes a record into its log that no key signed, and the log no
    longer verifies; checked, the reply is refused by name and the log verifies."""
    tamper = at("secagg.mask", bad_signature)
    with monkeypatch.context() as patch:
        patch.setattr(remote_module, "verify_signature", lambda *args: True)
        unchecked = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
    report = unchecked.audit()
    assert not report.ok and "signature does not verify with client-2's key" in report.summary()

    run = remote(tmp_path, "secagg", tamper=tamper)
    assert_refused(run, "an event in the reply of client-2 is not signed by client-2")
    assert not [e for e in run.events if "lied" in e.get("detail", "")]
    assert_exact_without_adversary(run, tmp_path)


def relabel(**labels):
    """client-2 answers with its genuine masked input, signed by itself, but labelled for
    another round, phase or kind than the request's."""

    def change(request, frame, endpoints):
        sent = decode_reply(frame, ADVERSARY).envelope
        party = endpoints[ADVERSARY].client
        fields = {"round_": sent.round, "phase": sent.phase, "kind": sent.kind, **labels}
        envelope = party.envelope(fields["round_"], fields["phase"], fields["kind"], SERVER,
                                  sent.data, sent.stages)
        return encode_reply(Reply(envelope))

    return change


@pytest.mark.parametrize("labels,named,audit", [
    ({"round_": 2}, "of round 2",
     "takes part in the round-2 gradient secure aggregation (masked_input) without advertising"),
    ({"phase": "unmask"}, "phase unmask",
     "is counted in the round-1 gradient aggregate but sent no input"),
    ({"kind": "dual_update"}, "a dual_update message",
     "takes part in the round-1 dual_update secure aggregation (masked_input) without")])
def test_a_reply_for_another_round_phase_or_kind_is_refused(tmp_path, monkeypatch, labels,
                                                            named, audit):
    """Adversary: client-2 answers its masked-input request with a message it labelled for
    another round, phase or kind. Unchecked (the server takes the reply for what it asked),
    the aggregate counts an input the log files elsewhere, which the audit then rejects;
    checked, the reply is refused by name and the log verifies."""
    tamper = at("secagg.mask", relabel(**labels))
    real = RemoteTransport._reply

    def unchecked_reply(self, cid, request, frame):
        sent = decode_reply(frame, cid).envelope  # the request taken to be what was answered
        return real(self, cid, dataclasses.replace(
            request, round=sent.round, kind=sent.kind, reply_phase=sent.phase), frame)

    with monkeypatch.context() as patch:
        patch.setattr(RemoteTransport, "_reply", unchecked_reply)
        unchecked = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
    assert unchecked.result.included == ids(4)
    report = unchecked.audit()
    assert not report.ok and f"client-2 {audit}" in report.summary()

    run = remote(tmp_path, "secagg", tamper=tamper)
    assert_refused(run, named)
    assert_exact_without_adversary(run, tmp_path)


def foreign_key(request, frame, endpoints):
    """client-2's reply signed with a key that is not in the registry (its name, another
    key: what someone who stole the name but not the key sends)."""
    sent = decode_reply(frame, ADVERSARY).envelope
    stranger = Party(ADVERSARY)
    return encode_reply(Reply(stranger.envelope(sent.round, sent.phase, sent.kind, SERVER,
                                                sent.data, sent.stages)))


def test_a_reply_signed_by_a_key_not_in_the_registry_is_refused(tmp_path, monkeypatch):
    """Adversary: a party holding client-2's name but not its key answers for it. Unchecked
    (no signature check on receipt), the server counts its input; checked, it is refused by
    name before it is logged (the log holds only what its signers signed: it still passes
    the audit) and the round is exact over the others."""
    tamper = at("secagg.mask", foreign_key)
    with monkeypatch.context() as patch:
        patch.setattr(exchange_module, "verify_signature", lambda *args: True)
        patch.setattr(remote_module, "verify_signature", lambda *args: True)
        unchecked = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
    assert unchecked.result.included == ids(4)

    run = remote(tmp_path, "secagg", tamper=tamper)
    hits = [e for e in run.events if e["event"] == "rejected" and e["party"] == ADVERSARY
            and e["phase"] == "masked_input"]
    assert any("not signed by client-2" in e["detail"] for e in hits), run.events
    assert_exact_without_adversary(run, tmp_path)


def test_a_refused_reply_signed_by_a_foreign_key_leaves_a_log_that_verifies(tmp_path):
    """Adversary: as above; the run's log must still pass the audit."""
    run = remote(tmp_path, "secagg", tamper=at("secagg.mask", foreign_key))
    assert run.result.included == [c for c in ids(4) if c != ADVERSARY]
    report = run.audit()
    assert report.ok, report.summary()


@pytest.mark.parametrize("action,phase", [("secagg.advertise", "advertise_keys"),
                                          ("secagg.mask", "masked_input")])
def test_a_client_that_answers_nothing_is_offline_for_the_rest_of_the_round(tmp_path, action,
                                                                            phase):
    """Adversary (or a crash): client-2 answers nothing. It is offline for the rest of the
    round (never asked again), dropped by name, and the round is exact over the others."""
    run = remote(tmp_path, "secagg", tamper=at(action, lambda *args: None))
    asked = [a for cid, a in run.loop.asked if cid == ADVERSARY]
    assert asked[-1] == action
    assert not run.transport.alive(ADVERSARY, 1, "unmask")
    assert run.transport.alive(ADVERSARY, 2, "advertise_keys")  # back next round
    assert run.transport.alive("client-1", 1, "unmask")
    dropped = [e for e in run.events if e["event"] == "dropped" and e["party"] == ADVERSARY]
    assert len(dropped) == 1
    others = [c for c in ids(4) if c != ADVERSARY]
    assert_same(run.result, in_process(tmp_path, "secagg", 4, ADVERSARY, phase))
    assert run.result.included == others
    report = run.audit()
    assert report.ok, report.summary()


def own_event(**changes):
    """client-2 adds to its reply an event in its own name, signed by its own key over the
    content as changed (``None`` removes a field): a well-signed record of a shape no honest
    client raises."""

    def change(request, frame, endpoints):
        party = endpoints[ADVERSARY].client
        event = party.event(request.round, "masked_input", "rejected", "client-1",
                            "client-1 sent garbage")
        del event["sig"]
        for name, value in changes.items():
            if value is None:
                event.pop(name)
            else:
                event[name] = value
        event["sig"] = party.sign(canonical(event)).hex()
        return reframe(frame, lambda header: header["events"].append(event))

    return change


MALFORMED_EVENTS = [  # the change, the field named, what the unchecked server does with it
    ({"bytes": -1}, "bytes", "audit"),            # 'bytes' must be non-negative
    ({"detail": ["a", "list"]}, "detail", "audit"),  # 'detail' must be a string
    ({"event": "closed", "records": 0, "chain": "0" * 64}, "event", "audit"),  # a closing record
    ({"event": "aggregated", "included": [], "of_kind": KIND}, "event", "audit"),  # the server's
    ({"party": "nobody"}, "party", "audit"),      # party not in parties.json
    ({"offset": 0}, "offset", "audit"),           # a payload the log does not hold
    ({"event": None}, "event", "audit"),          # a record missing a field
    ({"round": "1"}, "round", "crash"),           # the log compares rounds
    ({"kind": KIND}, "kind", "logged"),           # an event posing as a gradient message
    ({"refused": -3}, "refused", "logged"),       # a refusal of no record's seq
    ({"round": 7}, "round", "logged"),            # an accusation dated in a later round
]


@pytest.mark.parametrize("changes,field,unchecked", MALFORMED_EVENTS,
                         ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(MALFORMED_EVENTS)])
def test_a_well_signed_event_of_a_shape_no_client_raises_is_refused(tmp_path, monkeypatch,
                                                                    changes, field, unchecked):
    """Adversary: a malicious client (a Flower node) signs, with its own key, an event whose
    fields no honest client writes, and adds it to its reply. Unchecked (events checked for
    sender and signature only), the honest server crashes, or logs a record that makes its
    log fail the audit, or logs a record in the client's name that no honest client signs;
    checked, the reply is refused by name on receipt, the round is exact over the others,
    and the log passes the audit."""
    tamper = at("secagg.mask", own_event(**changes))
    with monkeypatch.context() as patch:
        patch.setattr(remote_module, "client_event_problem", lambda *args: None)
        if unchecked == "crash":
            with pytest.raises(TypeError):
                remote(tmp_path / "unchecked", "secagg", tamper=tamper)
        else:
            run = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
            assert run.audit().ok is (unchecked == "logged")
            assert [e for e in run.events
                    if e["sender"] == ADVERSARY and all(e.get(k) == v for k, v in changes.items()
                                                        if v is not None)]
    run = remote(tmp_path, "secagg", tamper=tamper)
    assert_refused(run, f"carries an event whose {field!r}")
    assert not [e for e in run.events if e["sender"] == ADVERSARY]
    assert_exact_without_adversary(run, tmp_path)


def garbage_signature():
    """client-2 replaces its signature of the survivor set and what it saw (``sig``, 64 bytes,
    in its consistency reply) with 64 zero bytes, signing the reply itself as usual."""

    def change(request, frame, endpoints):
        sent = decode_reply(frame, ADVERSARY)
        fields = deserialize_payload(sent.envelope.data)
        fields["sig"] = np.zeros(64, dtype=np.uint8)
        e, party = sent.envelope, endpoints[ADVERSARY].client
        envelope = party.envelope(e.round, e.phase, e.kind, e.recipient,
                                  serialize_payload(fields), e.stages, e.origin)
        return encode_reply(Reply(envelope, sent.events))

    return change


@pytest.mark.parametrize("protocol", ["secagg", "secagg-once"])
def test_a_survivor_whose_signature_does_not_verify_is_refused_by_the_clients(
        tmp_path, monkeypatch, protocol):
    """Adversary: a malicious client (client-2) confirms the survivor set (under either
    set-up) with a signature that does not verify, which the server relays in each unmask
    request. Unchecked (clients that do not verify the relayed signatures, as when they
    trusted MACs alone), every honest client answers, and the honest server's log then fails
    the audit, which blames client-1 for answering without client-2's valid signature.
    Checked, each honest client refuses the request naming client-2, the round aborts
    cleanly (as when a survivor does not confirm), and the log passes the audit with its
    payloads read."""
    tamper = at("secagg.sign", garbage_signature())
    with monkeypatch.context() as patch:
        patch.setattr(ClientSession, "_signature_problem",
                      lambda *args: "")
        unchecked = remote(tmp_path / "unchecked", protocol, tamper=tamper, keep_payloads=True)
    assert unchecked.result.included == ids(4)
    report = unchecked.audit()
    assert not report.ok and "without client-2's valid signature" in report.summary()

    run = remote(tmp_path, protocol, tamper=tamper, keep_payloads=True)
    assert run.result.payload is None and run.result.included == []
    refusals = [e for e in run.events if e["event"] == "rejected" and e["sender"] != SERVER]
    assert refusals and all("client-2 did not confirm" in e["detail"] for e in refusals), (
        run.events)
    report = run.audit()
    assert report.ok, report.summary()


REPLY_ACTIONS = {"secagg": ("secagg.advertise", "secagg.deal", "secagg.mask", "secagg.sign",
                            "secagg.answer"),
                 "secagg-once": ("secagg.epoch.keys", "secagg.epoch.mask", "secagg.sign",
                                 "secagg.epoch.answer"),
                 "plaintext": ("upload",)}


def mutated(data: bytes, draw) -> bytes:
    """``data`` (a reply's payload) changed the way ``draw`` picks: a flipped bit, cut short,
    bytes appended, or one field of the safetensors payload removed, shortened, lengthened,
    retyped or with a byte of its value flipped (re-encoded)."""
    try:
        fields = dict(deserialize_payload(data))
    except MessageError:
        fields = {}
    how = draw(st.sampled_from(("flip", "cut", "extend") + (
        ("remove", "shorter", "longer", "retype", "value") if fields else ())))
    if how in ("flip", "cut", "extend"):
        raw = bytearray(data)
        if how == "flip" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            raw = raw[:draw(st.integers(0, len(raw)))]
        else:
            raw += draw(st.binary(min_size=1, max_size=40))
        return bytes(raw)
    name = draw(st.sampled_from(sorted(fields)))
    value = fields[name].reshape(-1)
    if how == "remove":
        del fields[name]
    elif how == "shorter":
        fields[name] = value[:-1]
    elif how == "longer":
        fields[name] = np.concatenate([value, value[:1]]) if value.size else np.zeros(2)
    elif how == "retype":
        fields[name] = value.astype(np.float64 if value.dtype != np.float64 else np.int64)
    elif value.size:
        raw = value.copy().view(np.uint8)
        raw[draw(st.integers(0, raw.size - 1))] ^= 0xFF
        fields[name] = raw.view(value.dtype)
    return serialize_payload(fields)


@pytest.mark.parametrize("protocol,action", [(protocol, action) for protocol, actions in
                                             REPLY_ACTIONS.items() for action in actions])
@settings(max_examples=4, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_malicious_client_s_signed_replies_never_crash_the_server_or_its_audit(protocol,
                                                                                 action, data):
    """Adversary: a malicious client that answers one of its requests (each action of secagg,
    secagg-once and plaintext in turn) with a payload it mangled (bits flipped, cut, extended,
    a field removed, resized, retyped or altered) and signed with its own key, so that only
    the protocol's parsing stands in its way. The server never raises: the aggregation
    returns (the client counted, refused by name, or the round aborted), and the honest
    server's log, payloads kept, passes the audit. (A scratch run of 540 such replies, 60
    per action, found none that crashed; run more examples when a parser changes.)"""

    def change(request, frame, endpoints):
        sent = decode_reply(frame, ADVERSARY)
        e, party = sent.envelope, endpoints[ADVERSARY].client
        envelope = party.envelope(e.round, e.phase, e.kind, e.recipient,
                                  mutated(e.data, data.draw), e.stages, e.origin)
        return encode_reply(Reply(envelope, sent.events))

    with tempfile.TemporaryDirectory() as folder:
        run = remote(Path(folder), protocol, tamper=at(action, change), keep_payloads=True)
        assert isinstance(run.result, Aggregate)
        report = run.audit()
        assert report.ok, report.summary()


def restage(**header):
    """client-2 answers with its genuine payload under its own signature, but with another
    ``stages`` or ``origin`` in the signed header than an honest reply carries."""

    def change(request, frame, endpoints):
        sent = decode_reply(frame, ADVERSARY)
        e, party = sent.envelope, endpoints[ADVERSARY].client
        fields = {"stages": e.stages, "origin": e.origin, **header}
        envelope = party.envelope(e.round, e.phase, e.kind, e.recipient, e.data,
                                  fields["stages"], fields["origin"])
        return encode_reply(Reply(envelope, sent.events))

    return change


@pytest.mark.parametrize("header,audit", [
    ({"origin": "nobody"}, "origin 'nobody' is not in parties.json"),
    ({"origin": "client-1"}, ""),       # client-2's input filed as written by client-1
    ({"stages": ("dp",)}, ""),          # a dp stage the protocol never applied
    ({"stages": ()}, ""),               # the secagg stage left out
])
def test_a_reply_with_another_origin_or_stages_is_refused_before_it_is_logged(
        tmp_path, monkeypatch, header, audit):
    """Adversary: client-2 signs its masked input with an ``origin`` (the author of a
    payload the server relays; a client relays nothing) or ``stages`` (the protection stages
    the request applies) an honest reply never carries. Unchecked (the server compares round,
    kind, phase and recipient only), the honest server logs the record as signed, with an
    unregistered origin that makes its log fail the audit, or filed as another client's or
    under stages it never went through. Checked, the reply is refused by name before it is
    logged, the round is exact over the others and the log passes the audit."""
    tamper = at("secagg.mask", restage(**header))
    real = remote_module.unexpected

    def unchecked(sent, request):  # round, kind, phase and recipient only
        return real(dataclasses.replace(sent, stages=request.stages, origin=""), request)

    def logged(run: Run) -> list[dict]:
        lines = (run.folder / "messages.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["sender"] == ADVERSARY
                and r["phase"] == "masked_input" and r["kind"] == KIND]

    with monkeypatch.context() as patch:
        patch.setattr(remote_module, "unexpected", unchecked)
        unchecked_run = remote(tmp_path / "unchecked", "secagg", tamper=tamper)
    (record,) = logged(unchecked_run)
    assert all(record.get(name, "") == (list(value) if name == "stages" else value)
               for name, value in header.items())
    report = unchecked_run.audit()
    assert report.ok if not audit else (not report.ok and audit in report.summary())

    run = remote(tmp_path, "secagg", tamper=tamper)
    assert not logged(run)
    assert_refused(run, "stages" if "stages" in header else "origin")
    assert_exact_without_adversary(run, tmp_path)


REQUEST_ACTIONS = {"secagg": ("secagg.deal", "secagg.mask", "secagg.sign", "secagg.answer"),
                   "secagg-once": ("secagg.epoch.keys", "secagg.epoch.answer")}


@pytest.mark.parametrize("protocol,action", [(protocol, action) for protocol, actions in
                                             REQUEST_ACTIONS.items() for action in actions])
@settings(max_examples=3, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_malicious_server_s_mangled_requests_never_crash_an_honest_client(protocol, action,
                                                                           data):
    """Adversary: a malicious server that sends an honest client (client-1) the message of a
    request (each secagg and secagg-once action that carries one) mangled as the replies are
    in the test above, and signed with the server's own key, so that only the client's
    parsing stands in its way. The client never raises: it answers or refuses by name (a
    crash would take an honest Flower node down), and the aggregation returns. (A scratch run
    of 36 such requests found none that crashed.)"""

    def change(request, incoming, server):
        if request.action != action:
            return incoming
        e = incoming.envelope
        mangled = mutated(incoming.data, data.draw)
        envelope = server.envelope(e.round, e.phase, e.kind, e.recipient, mangled, e.stages,
                                   e.origin)
        return Incoming(envelope, mangled, incoming.seq)

    with tempfile.TemporaryDirectory() as folder:
        run = remote(Path(folder), protocol, tamper_request=change)
        assert isinstance(run.result, Aggregate)
        assert (VICTIM, action) in run.loop.asked
