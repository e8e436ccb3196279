"""Requests and replies as bytes (secureffm/federation/codec.py): round trips, and every
malformed frame or header refused as a MessageError that names what is wrong.

Truths used: the frame layout the module documents (4-byte big-endian header length, a JSON
header, the raw message bytes), built here by hand with ``json`` for the malformed cases, and
Ed25519 signatures made by real parties (``Party.envelope``).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secureffm.errors import MessageError
from secureffm.federation.channel import Task
from secureffm.federation.codec import (
    CLIENT_EVENTS,
    client_event_problem,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from secureffm.federation.exchange import Incoming, Reply, Request
from secureffm.federation.message import SERVER, Envelope
from secureffm.federation.parties import Party
from secureffm.protocols.aggregation import template_json, template_of

SERVER_PARTY = Party(SERVER)
CLIENT = Party("client-1")
OTHER = Party("client-2")
TEMPLATE = {"gradient": ((3, 4), np.dtype(np.float32)), "bias": ((4,), np.dtype(np.float64))}


def frame(header, data: bytes = b"") -> bytes:
    """A frame as the codec documents it, built by hand."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(head).to_bytes(4, "big") + head + data


def server_message(data: bytes = b"model bytes", phase: str = "broadcast") -> Envelope:
    return SERVER_PARTY.envelope(3, phase, "gradient", "client-1", data, ("dp", "secagg"))


def request(envelope: Envelope | None = None, **args) -> Request:
    return Request(3, "gradient", "shares", "masked_input", "secagg.mask", ("dp", "secagg"),
                   envelope, args)


def header_of(encoded: bytes) -> dict:
    size = int.from_bytes(encoded[:4], "big")
    return json.loads(encoded[4:4 + size])


# -- round trips ------------------------------------------------------------------------------


def test_a_request_without_a_server_message_round_trips():
    sent = request(weight=2.5, template=template_json(TEMPLATE))
    got, incoming, _ = decode_request(encode_request(sent, None))
    assert incoming is None
    assert got == sent
    assert template_of(got.args["template"]) == TEMPLATE


def test_a_request_with_the_servers_message_round_trips_with_its_seq_and_signature():
    envelope = server_message(bytes(range(256)) * 3)
    sent = request(envelope, scale=0.5)
    got, incoming, _ = decode_request(encode_request(sent, Incoming(envelope, envelope.data, 17)))
    assert got == sent and got.envelope.sig == envelope.sig
    assert incoming == Incoming(envelope, envelope.data, 17)
    assert incoming.envelope.sha256 == envelope.sha256


def test_a_request_carries_the_server_message_with_no_log_seq():
    envelope = server_message()
    _, incoming, _ = decode_request(encode_request(request(envelope),
                                                Incoming(envelope, envelope.data, None)))
    assert incoming.seq is None and incoming.data == envelope.data


def test_a_task_crosses_as_its_name_and_arguments():
    task = Task("gradient", {"batch": 32, "kinds": ["gradient", "dual_update"]})
    sent = request(compute=task, template=template_json(TEMPLATE))
    encoded = encode_request(sent, None)
    assert header_of(encoded)["args"]["compute"] == {"task": "gradient", "args": task.args}
    got, _, _ = decode_request(encoded)
    assert got.args["compute"] == task and isinstance(got.args["compute"], Task)


def test_a_callable_compute_is_refused_saying_it_runs_only_in_process():
    with pytest.raises(MessageError, match="only on the in-process engine"):
        encode_request(request(compute=lambda client: {}), None)


def test_a_compute_that_is_not_a_named_task_does_not_decode():
    encoded = encode_request(request(), None)
    header = header_of(encoded)
    for bad in ["gradient", {"task": 3, "args": {}}, {"task": "g", "args": [1]}, {"args": {}}]:
        header["args"]["compute"] = bad
        with pytest.raises(MessageError, match="not a named task"):
            decode_request(frame(header))


def test_replies_round_trip_with_and_without_a_message():
    event = CLIENT.event(3, "masked_input", "clipped", "client-1", "2 of 12 coordinates")
    envelope = CLIENT.envelope(3, "masked_input", "gradient", SERVER, b"\x00masked\xff",
                               ("dp", "secagg"))
    for reply in [Reply(), Reply(None, (event,)), Reply(envelope, (event, event)),
                  Reply(envelope)]:
        assert decode_reply(encode_reply(reply), "client-1") == reply


# -- malformed frames -------------------------------------------------------------------------


def test_a_truncated_request_frame_is_refused():
    envelope = server_message(b"x" * 100)
    encoded = encode_request(request(envelope), Incoming(envelope, envelope.data, 4))
    size = int.from_bytes(encoded[:4], "big")
    with pytest.raises(MessageError, match="the request is not a secureffm frame"):
        decode_request(encoded[:4 + size // 2])  # cut inside the header
    with pytest.raises(MessageError, match="99 bytes follow, the header says 100"):
        decode_request(encoded[:-1])  # cut inside the message bytes
    with pytest.raises(MessageError, match="not a secureffm frame"):
        decode_request(encoded[:3])


def test_a_header_that_is_not_json_or_not_an_object_is_refused_naming_the_sender():
    for header in [b"\xff\xfe not json", b"[1, 2]", b"\"text\""]:
        with pytest.raises(MessageError, match="reply of client-1 is not a secureffm frame"):
            decode_reply(frame(header), "client-1")
        with pytest.raises(MessageError, match="request is not a secureffm frame"):
            decode_request(frame(header))


def test_a_bytes_count_that_does_not_match_the_data_is_refused():
    envelope = CLIENT.envelope(3, "masked_input", "gradient", SERVER, b"twelve bytes")
    encoded = encode_reply(Reply(envelope))
    header = header_of(encoded)
    for claimed in [11, 13, 0]:
        header["envelope"]["bytes"] = claimed
        with pytest.raises(MessageError, match=f"12 bytes follow, the header says {claimed}"):
            decode_reply(frame(header, envelope.data), "client-1")


def test_a_request_header_missing_a_field_or_of_the_wrong_type_is_refused():
    envelope = server_message()
    encoded = encode_request(request(envelope), Incoming(envelope, envelope.data, 1))
    data = envelope.data
    for change in [lambda h: h.pop("action"), lambda h: h.pop("seq"),
                   lambda h: h.update(round="three"), lambda h: h.update(args=[1]),
                   lambda h: h["envelope"].pop("sig"),
                   lambda h: h["envelope"].update(sig="not hex"),
                   lambda h: h["envelope"].pop("last"),
                   lambda h: h["envelope"].update(last="zz"),
                   lambda h: h["envelope"].update(last="A" * 64)]:
        header = header_of(encoded)
        change(header)
        with pytest.raises(MessageError, match="malformed"):
            decode_request(frame(header, data))


def test_a_reply_whose_events_name_another_sender_is_refused():
    own = CLIENT.event(3, "masked_input", "clipped", "client-1", "own")
    other = OTHER.event(3, "masked_input", "rejected", "client-1", "accuses client-1")
    for events in [[other], [own, other], ["not an event"], {"sender": "client-1"}]:
        with pytest.raises(MessageError, match="reply of client-1 carries events that are not "
                                               "its own"):
            decode_reply(frame({"events": events}), "client-1")
    with pytest.raises(MessageError, match="not its own"):
        decode_reply(frame({}), "client-1")  # no events list at all


def test_a_reply_whose_links_are_not_sha256_hex_is_refused():
    """Adversary: a malicious client node whose reply carries a ``last`` the log's format
    cannot hold (its own signature over it is valid). Logged, it would fail the audit of an
    honest server's log; the reply is refused on receipt instead, naming the client."""
    envelope = CLIENT.envelope(3, "masked_input", "gradient", SERVER, b"y")
    header = header_of(encode_reply(Reply(envelope)))
    header["envelope"]["last"] = "not a hash"
    with pytest.raises(MessageError, match="reply of client-1's envelope is malformed: last"):
        decode_reply(frame(header, b"y"), "client-1")


def test_the_events_an_honest_client_raises_have_the_shape_a_client_event_must_have():
    """The receipt check of client events (tests/federation/test_remote.py plays the
    malicious clients it refuses) lets through every event an honest client signs: each kind
    a client raises, with and without a refused seq and a link."""
    parties = {"client-1", "client-2", SERVER}
    events = [Party("client-3").event(3, "masked_input", "clipped", "client-3", "first")]
    CLIENT.envelope(3, "masked_input", "gradient", SERVER, b"y")  # a record to link to
    events += [CLIENT.event(3, "broadcast", event, "server", "why", fields)
               for event in CLIENT_EVENTS for fields in (None, {"refused": 12})]
    assert "last" not in events[0] and all("last" in e for e in events[1:])
    assert [client_event_problem(e, 3, parties | {"client-3"}) for e in events] == \
        [None] * len(events)
    assert client_event_problem({**events[1], "last": "x" * 64}, 3, parties) == (
        f"'last' is {'x' * 64!r}, not the sha256 of its previous record, in hex")
    assert client_event_problem(events[1], 4, parties) == (
        "'round' is 3, not 4 (the request's round)")


def test_a_reply_whose_envelope_names_another_sender_is_refused():
    forged = OTHER.envelope(3, "masked_input", "gradient", SERVER, b"y")
    with pytest.raises(MessageError, match="reply of client-1 carries a message of client-2"):
        decode_reply(encode_reply(Reply(forged)), "client-1")


def test_a_reply_envelope_missing_a_field_is_refused_naming_the_sender():
    envelope = CLIENT.envelope(3, "masked_input", "gradient", SERVER, b"y")
    header = header_of(encode_reply(Reply(envelope)))
    del header["envelope"]["phase"]
    with pytest.raises(MessageError, match="reply of client-1's envelope is malformed"):
        decode_reply(frame(header, b"y"), "client-1")


# -- property: any envelope survives the trip ---------------------------------------------------

_text = st.text(max_size=20)


@settings(max_examples=60, deadline=None)
@given(kind=_text, sender=_text, recipient=_text, round_=st.integers(-2**63, 2**63),
       phase=_text, data=st.binary(max_size=300), stages=st.lists(_text, max_size=4),
       origin=_text, sig=st.binary(max_size=80), seq=st.none() | st.integers(0, 2**40))
def test_any_envelope_round_trips_in_a_request_and_a_reply(kind, sender, recipient, round_, phase,
                                                           data, stages, origin, sig, seq):
    envelope = Envelope(kind, sender, recipient, round_, phase, data, tuple(stages), origin, sig)
    _, incoming, _ = decode_request(encode_request(request(envelope),
                                                Incoming(envelope, data, seq)))
    assert incoming == Incoming(envelope, data, seq)
    assert incoming.envelope.sha256 == envelope.sha256
    reply = decode_reply(encode_reply(Reply(envelope)), sender)
    assert reply.envelope == envelope


def test_a_request_carries_its_broadcasts_before_its_message():
    """Broadcasts folded into a request come back in order, each with its own bytes and seq,
    and the request's message after them."""
    server = Party(SERVER)
    carried = tuple(Incoming(server.envelope(3, "broadcast", kind, "client-1", data), data, seq)
                    for kind, data, seq in (("global_model", b"theta" * 9, 5),
                                            ("global_potential", b"", 6)))
    message = server.envelope(3, "keys", "gradient", "client-1", b"keys")
    sent = dataclasses.replace(request(message),
                               broadcasts=tuple(b.envelope for b in carried))
    got, incoming, broadcasts = decode_request(encode_request(sent, Incoming(message, b"keys", 7),
                                                              carried))
    assert got.broadcasts == sent.broadcasts and broadcasts == carried
    assert incoming == Incoming(message, b"keys", 7)
