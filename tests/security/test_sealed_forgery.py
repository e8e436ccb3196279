"""Attacks on the ``sealed`` protocol's authenticity (issue 13, item 2).

Each test plays a relaying server, alone or with a colluding recipient, against the real
channel, transport and stage, each party with its own keys; the relay is the adversary, so it
is the one part replaced.
"""

import json

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, Client, MessageLog
from secureffm.federation.crypto import agree, open_sealed, seal
from secureffm.federation.exchange import Request
from secureffm.federation.message import deserialize_payload, serialize_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.channel import ProtectedChannel
from secureffm.protocols.sealed import SealedStage, SealHeader
from secureffm.runs.scaffold import open_channel
from tests.gathering import gather

EVIL = {"weight": np.full((2, 3), 666.0, np.float32)}


def make_channel(tmp_path) -> tuple[ProtectedChannel, SealedStage]:
    clients = [Client(f"client-{i}", torch.zeros(4, 2), torch.Generator()) for i in (1, 2, 3)]
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol("sealed"), clients, log)
    return channel, channel.protocol.sealer("model")


def seal_as(channel, sealer, author: str, phase: str, recipients: list[str]) -> bytes:
    """``author`` seals EVIL as its round-7 model with its own keys."""
    return sealer.seal(channel.parties[author], channel.transport.registry, EVIL, "model", 7,
                       phase, recipients)


def open_as(channel, sealer, recipient: str, data: bytes, phase: str = "relay",
            kind: str = "model", round_: int = 7, author: str = "client-1"):
    """``recipient`` opens ``data`` as ``author``'s message, with its own keys and memory."""
    return sealer.open(channel.parties[recipient], channel.transport.registry, data, kind,
                       round_, phase, author)


def model_of(round_):
    """What each author computes in ``round_``: a model unique to (author, round)."""
    def compute(client):
        return {"weight": np.full((2, 3), 10 * round_ + int(client.id[-1]), np.float32)}
    return compute


def rejections(tmp_path):
    lines = (tmp_path / "messages.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == "rejected"]


def forge_with_recipients_key(channel, copy: bytes, colluder: str, victim_copy: bytes) -> bytes:
    """``colluder`` unwraps the content key of its own relayed copy, encrypts EVIL under it
    with the same header, and the relay puts that content into ``victim_copy``."""
    mine = deserialize_payload(copy)
    header = SealHeader("model", 7, "relay", "client-1",
                        tuple(json.loads(mine["recipients"].tobytes())), int(mine["counter"][0]))
    wrap = agree(channel.parties[colluder].sealing.private,
                 channel.transport.registry.seal["client-1"], b"sealed/wrap")
    content_key = open_sealed(wrap, mine["key"].tobytes(), header.wrap_context(colluder))
    theirs = deserialize_payload(victim_copy)
    theirs["content"] = np.frombuffer(seal(content_key, serialize_payload(EVIL), header.encode(),
                                           bytes(12)), np.uint8)
    return serialize_payload(theirs)


def test_colluding_recipient_and_relay_cannot_pass_off_a_model_as_the_authors(tmp_path):
    """Adversary: client-2 (a recipient of client-1's round-7 model) colluding with the relay.
    client-2 re-encrypts another model under the content key it shares with client-3, and the
    relay pairs that content with client-3's wrapped key. Before the fix client-3 accepted it as
    client-1's round-7 model; now client-3 refuses it, naming client-1, and the rest arrives."""
    channel, sealer = make_channel(tmp_path)
    honest = sealer.relay

    def relay(data, recipient, sender):
        copy = honest(data, recipient, sender)
        if (sender, recipient) != ("client-1", "client-3"):
            return copy
        return forge_with_recipients_key(channel, honest(data, "client-2", sender), "client-2",
                                         copy)

    sealer.relay = relay
    gathered = gather(channel, 7, "model", model_of(7))
    channel.close()
    assert "client-1" not in gathered["client-3"]
    np.testing.assert_array_equal(gathered["client-3"]["client-2"]["weight"], 72.0)
    np.testing.assert_array_equal(gathered["client-2"]["client-1"]["weight"], 71.0)
    [event] = rejections(tmp_path)
    assert event["sender"] == "client-3"
    assert "not signed by client-1" in event["detail"]
    assert json.loads((tmp_path / "messages.jsonl").read_text().splitlines()[-1])["event"] \
        == "closed"


def test_relay_cannot_pass_one_authors_message_off_as_anothers(tmp_path):
    """Adversary: the relay alone, swapping client-2's sealed model (whole, or only its
    content and signature) into client-1's slot for client-3. Already refused before the fix
    (the key wrap named the sender); kept as a regression against the new format."""
    channel, sealer = make_channel(tmp_path)
    ones = seal_as(channel, sealer, "client-1", "relay", ["client-2", "client-3"])
    twos = seal_as(channel, sealer, "client-2", "relay", ["client-1", "client-3"])
    theirs = deserialize_payload(sealer.relay(twos, "client-3", "client-2"))
    partial = deserialize_payload(sealer.relay(ones, "client-3", "client-1"))
    partial.update(content=theirs["content"], signature=theirs["signature"])
    for swapped in (serialize_payload(theirs), serialize_payload(partial)):
        with pytest.raises(ProtocolError, match="not signed by client-1"):
            open_as(channel, sealer, "client-3", swapped, "relay", "model")


def test_relay_cannot_replay_a_round_6_model_in_round_7(tmp_path):
    """Adversary: the relay, keeping client-1's round-6 copies and handing client-3 the
    round-6 one again in round 7 (to freeze client-1's model). Before the fix the round was
    already bound, so this one was refused then too; it now fails the author's signature."""
    channel, sealer = make_channel(tmp_path)
    honest, kept = sealer.relay, {}

    def relay(data, recipient, sender):
        copy = honest(data, recipient, sender)
        kept.setdefault((sender, recipient), copy)
        return kept[(sender, recipient)] if (sender, recipient) == ("client-1", "client-3") \
            else copy

    sealer.relay = relay
    channel.all_gather(6, "model", model_of(6))
    gathered = gather(channel, 7, "model", model_of(7))
    assert "client-1" not in gathered["client-3"]
    np.testing.assert_array_equal(gathered["client-2"]["client-1"]["weight"], 71.0)
    [event] = rejections(tmp_path)
    assert event["round"] == 7 and "not signed by client-1" in event["detail"]


def test_relay_cannot_replay_a_message_into_another_phase_kind_or_recipient_set(tmp_path):
    """Adversary: the relay, delivering client-1's message to client-2 in a phase, kind or
    recipient set it was not sealed for. Before the fix the phase was not bound, so a copy
    sealed for one phase opened in any other."""
    channel, sealer = make_channel(tmp_path)
    data = seal_as(channel, sealer, "client-1", "upload", ["client-2"])
    copy = sealer.relay(data, "client-2", "client-1")
    for kind, phase in (("model", "broadcast"), ("model", "relay"), ("measure", "upload")):
        with pytest.raises(ProtocolError, match="not signed by client-1"):
            open_as(channel, sealer, "client-2", copy, phase, kind)
    widened = deserialize_payload(copy)
    widened["recipients"] = np.frombuffer(b'["client-2","client-3"]', np.uint8)
    with pytest.raises(ProtocolError, match="not signed by client-1"):
        open_as(channel, sealer, "client-2", serialize_payload(widened), "upload", "model")
    np.testing.assert_array_equal(
        open_as(channel, sealer, "client-2", copy, "upload", "model")["weight"], 666)


def test_relay_cannot_deliver_a_copy_twice_or_out_of_order_in_one_phase(tmp_path):
    """Adversary: the relay, within one kind, round and phase, delivering client-1's first
    message again, or its earlier message after a later one, or a copy with a forged high
    counter to lock client-1 out. Before the fix the recipient opened the copy twice and in
    any order (only the relay's own transport dropped duplicates)."""
    channel, sealer = make_channel(tmp_path)
    first, second, third = (sealer.relay(seal_as(channel, sealer, "client-1", "upload",
                                                 ["client-2"]), "client-2", "client-1")
                            for _ in range(3))
    open_as(channel, sealer, "client-2", second, "upload", "model")
    for stale in (second, first):
        with pytest.raises(ProtocolError, match="replayed or out of order"):
            open_as(channel, sealer, "client-2", stale, "upload", "model")
    bumped = deserialize_payload(third)
    bumped["counter"] = np.array([2**64 - 1], np.uint64)
    with pytest.raises(ProtocolError, match="not signed by client-1"):
        open_as(channel, sealer, "client-2", serialize_payload(bumped), "upload", "model")
    open_as(channel, sealer, "client-2", third, "upload", "model")


def test_honest_all_gathers_and_sends_arrive_exactly(tmp_path):
    """No adversary: every honest copy of two all-gathers (rounds 6 and 7) and a direct send to
    the server (round 8) open to exactly what their author computed, with no rejection logged."""
    channel, _ = make_channel(tmp_path)
    for round_ in (6, 7):
        gathered = gather(channel, round_, "model", model_of(round_))
        for recipient in channel.clients:
            authors = [c for c in channel.clients if c is not recipient]
            assert sorted(gathered[recipient.id]) == [c.id for c in authors]
            for author in authors:
                np.testing.assert_array_equal(gathered[recipient.id][author.id]["weight"],
                                              model_of(round_)(author)["weight"])
    sent = channel.send(8, "upload", "model", "client-3", SERVER,
                        model_of(8)(channel.clients[2]))
    np.testing.assert_array_equal(sent["weight"], 83.0)
    assert rejections(tmp_path) == []


def test_relay_cannot_replay_a_message_from_an_earlier_run(tmp_path):
    """Adversary: a relay that kept client-1's round-7 copy from an earlier run of the same
    federation and hands it to client-2 in round 7 of a new run. Refused because each run makes
    fresh keys (the header carries no run id); so it was refused before the fix too."""
    old, old_sealer = make_channel(tmp_path / "old")
    kept = old_sealer.relay(seal_as(old, old_sealer, "client-1", "relay",
                                    ["client-2", "client-3"]), "client-2", "client-1")
    channel, sealer = make_channel(tmp_path)
    with pytest.raises(ProtocolError, match="not signed by client-1"):
        open_as(channel, sealer, "client-2", kept, "relay", "model")


def test_a_server_that_names_itself_a_peer_cannot_make_a_client_seal_for_it(tmp_path):
    """Adversary: the server, asking client-1 in ``gather.upload`` to seal its model for the
    peers [client-2, server]. Sealed that way (shown first, as the handler would without its
    check), the server unwraps its own copy and reads the model; the client's handler refuses
    the peer list in its own signed event and uploads nothing."""
    channel, sealer = make_channel(tmp_path)
    author = channel.parties["client-1"]
    peers = ["client-2", SERVER]
    leaked = sealer.seal(author, channel.transport.registry, EVIL, "model", 7, "relay", peers)
    opened = sealer.open(channel.server, channel.transport.registry,
                         sealer.relay(leaked, SERVER, "client-1"), "model", 7, "relay",
                         "client-1")
    np.testing.assert_array_equal(opened["weight"], EVIL["weight"])  # the attack, unchecked

    endpoint = channel.endpoints["client-1"]
    reply = endpoint(Request(7, "model", "upload", "upload", "gather.upload", ("sealed",), None,
                             {"compute": lambda c: EVIL, "peers": peers}), None)
    assert reply.envelope is None
    [event] = reply.events
    assert (event["event"], event["sender"], event["party"]) == ("rejected", "client-1", SERVER)
    assert "peers must be distinct registered clients" in event["detail"]
