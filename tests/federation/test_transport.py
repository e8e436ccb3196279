"""The in-process transport (secureffm/federation/transport.py): signed envelopes in, accepted
bytes and refusals out; injected faults; the receipt checks a recipient's network stack makes.

Truths used: Ed25519 verification with `cryptography` against the keys pinned in parties.json,
SHA-256 from hashlib, and the log's lines as written on disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secureffm.errors import ConfigError, MessageError
from secureffm.federation import SERVER, Client, InProcessTransport, MessageLog, Party, Registry
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.message import Envelope, canonical
from secureffm.federation.transport import Delivery, Refusal
from secureffm.protocols import load_protocol
from secureffm.runs.scaffold import open_channel

PHASES = ("broadcast", "upload", "relay")
DATA = b"some payload bytes"


@dataclasses.dataclass
class Net:
    transport: InProcessTransport
    parties: dict[str, Party]
    log: MessageLog

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.path.read_text().splitlines()]

    def upload(self, sender: str = "client-1", round_: int = 1, data: bytes = DATA) -> Delivery:
        """``sender`` signs an upload to the server and hands it to the transport."""
        return self.transport.send(self.parties[sender].envelope(round_, "upload", "gradient",
                                                                 SERVER, data))


def make_net(tmp_path, faults: FaultPlan | None = None, n: int = 3) -> Net:
    parties = {p.id: p for p in [Party(SERVER), *(Party(f"client-{i}") for i in range(1, n + 1))]}
    log = MessageLog(tmp_path / "messages.jsonl")
    transport = InProcessTransport(Registry.of(list(parties.values())),
                                   [p for p in parties if p != SERVER], log, PHASES, faults)
    return Net(transport, parties, log)


def plan(*faults: Fault) -> FaultPlan:
    return FaultPlan("t", faults)


def pinned_key(tmp_path, party: str) -> Ed25519PublicKey:
    keys = json.loads((tmp_path / "parties.json").read_text())
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(keys[party]["sign"]))


# -- clean deliveries ---------------------------------------------------------------------------


def test_a_signed_envelope_is_delivered_and_logged_with_its_senders_signature(tmp_path):
    net = make_net(tmp_path)
    envelope = net.parties["client-1"].envelope(1, "upload", "gradient", SERVER, DATA, ("dp",))
    assert net.transport.send(envelope) == Delivery(DATA, (), 0)
    [record] = net.records()
    assert {k: record[k] for k in ("round", "phase", "kind", "sender", "recipient", "stages",
                                   "bytes", "sha256", "seq", "sig")} == {
        "round": 1, "phase": "upload", "kind": "gradient", "sender": "client-1",
        "recipient": SERVER, "stages": ["dp"], "bytes": len(DATA),
        "sha256": hashlib.sha256(DATA).hexdigest(), "seq": 0, "sig": envelope.sig.hex()}
    pinned_key(tmp_path, "client-1").verify(envelope.sig, canonical(record))
    with pytest.raises(InvalidSignature):
        pinned_key(tmp_path, "client-2").verify(envelope.sig, canonical(record))
    assert net.log.events == []


def test_parties_json_pins_every_partys_public_keys_before_any_record(tmp_path):
    net = make_net(tmp_path)
    pinned = json.loads((tmp_path / "parties.json").read_text())
    assert pinned == {p.id: {"sign": p.identity.public.hex(), "seal": p.sealing.public.hex()}
                      for p in net.parties.values()}
    assert net.transport.clients == ("client-1", "client-2", "client-3")


# -- receipt checks -------------------------------------------------------------------------


def test_an_envelope_signed_by_another_party_or_unsigned_is_refused_by_its_recipient(tmp_path):
    """Adversary: a party (or the relay) sending in client-1's name with a key not client-1's."""
    net = make_net(tmp_path)
    unsigned = Envelope("gradient", "client-1", SERVER, 1, "upload", DATA)
    forged = dataclasses.replace(unsigned,
                                 sig=net.parties["client-2"].sign(canonical(unsigned.header())))
    for round_, envelope in ((1, forged), (2, dataclasses.replace(unsigned, round=2))):
        delivery = net.transport.send(envelope)
        assert delivery.data is None
        [refusal] = delivery.refusals
        assert (refusal.recipient, refusal.party) == (SERVER, "client-1")
        assert f"message seq {round_ - 1} has an invalid signature" in refusal.reason
    assert net.log.events == []  # the transport logs no rejection: the recipient signs it


def test_bytes_swapped_after_signing_are_refused(tmp_path):
    """Adversary: the relay, keeping the sender's signature and replacing the bytes."""
    net = make_net(tmp_path)
    envelope = net.parties["client-1"].envelope(1, "upload", "gradient", SERVER, DATA)
    delivery = net.transport.send(dataclasses.replace(envelope, data=b"other bytes"))
    assert delivery.data is None and "invalid signature" in delivery.refusals[0].reason
    assert net.transport.send(envelope) == Delivery(DATA, (), 1)  # the real one still arrives


def test_a_second_copy_is_refused_and_the_first_stands(tmp_path):
    net = make_net(tmp_path)
    first = net.upload(data=b"first")
    second = net.upload(data=b"second")
    assert first == Delivery(b"first", (), 0)
    assert second.data is None
    assert second.refusals == (Refusal(SERVER, "client-1", "duplicate or replayed gradient "
                                       "message (round 1, phase upload); the first copy stands"),)
    assert net.upload(round_=2, data=b"second").data == b"second"  # another round is new


def test_an_unregistered_sender_is_refused_by_name_and_never_logged(tmp_path):
    net = make_net(tmp_path)
    delivery = net.transport.send(Party("mallory").envelope(1, "upload", "gradient", SERVER, DATA))
    assert delivery.data is None
    [refusal] = delivery.refusals
    assert (refusal.recipient, refusal.party) == (SERVER, "mallory")
    assert "not registered in this federation" in refusal.reason
    assert net.records() == []


# -- injected faults ------------------------------------------------------------------------


def test_a_dropped_client_goes_offline_from_its_phase_to_the_end_of_the_round(tmp_path):
    net = make_net(tmp_path, plan(Fault("drop", "client-2", "upload", (1,))))
    alive = net.transport.alive
    assert alive("client-2", 1, "broadcast")
    assert not alive("client-2", 1, "upload") and not alive("client-2", 1, "relay")
    assert alive("client-2", 2, "upload") and alive("client-1", 1, "upload")
    assert alive(SERVER, 1, "upload")
    assert net.upload("client-2") == Delivery(None, ())
    assert net.records() == []  # an offline client sends nothing
    assert net.upload("client-2", round_=2).data == DATA


def test_a_lost_message_leaves_only_its_senders_record(tmp_path):
    net = make_net(tmp_path, plan(Fault("lose", "client-1", "upload", (1,))))
    assert net.upload() == Delivery(None, (), 0)
    assert [(r["sender"], r["phase"]) for r in net.records()] == [("client-1", "upload")]
    assert net.transport.alive("client-1", 1, "relay")  # it stays online


@pytest.mark.parametrize("action, reason", [
    ("delay", "gradient message seq 0 arrived after the phase closed"),
    ("corrupt", "message seq 0 was altered in transit"),
])
def test_a_delayed_or_corrupted_message_is_refused_by_its_recipient(tmp_path, action, reason):
    net = make_net(tmp_path, plan(Fault(action, "client-1", "upload", (1,))))
    delivery = net.upload()
    assert delivery.data is None
    [refusal] = delivery.refusals
    assert (refusal.recipient, refusal.party, refusal.refused) == (SERVER, "client-1", 0)
    assert reason in refusal.reason
    assert len(net.records()) == 1 and net.log.events == []
    assert net.upload("client-2") == Delivery(DATA, (), 1)  # other senders are untouched


def test_a_replayed_message_arrives_once_and_its_copy_is_refused(tmp_path):
    net = make_net(tmp_path, plan(Fault("replay", "client-1", "upload", (1,))))
    delivery = net.upload()
    assert delivery.data == DATA
    [refusal] = delivery.refusals
    assert (refusal.recipient, refusal.party) == (SERVER, "client-1")
    assert "duplicate or replayed gradient message (round 1, phase upload)" in refusal.reason
    assert refusal.refused is None  # the copy is not in the log; its original was accepted
    assert len(net.records()) == 1


def test_an_unknown_sender_fault_forges_one_copy_to_the_server_per_round_and_phase(tmp_path):
    net = make_net(tmp_path, plan(Fault("unknown_sender", "client-99", "upload", (1,))))
    to_peer = net.transport.send(net.parties["client-1"].envelope(1, "upload", "gradient",
                                                                  "client-2", DATA))
    assert to_peer == Delivery(DATA, (), 0)  # only deliveries to the server draw the forgery
    first = net.upload("client-1")
    assert first.data == DATA  # the real message still arrives
    [refusal] = first.refusals
    assert (refusal.recipient, refusal.party) == (SERVER, "client-99")
    assert "from a party that is not registered" in refusal.reason
    assert net.upload("client-2") == Delivery(DATA, (), 2)  # once per round and phase
    assert net.upload("client-1", round_=2) == Delivery(DATA, (), 3)  # not in other rounds
    assert all(r["sender"] != "client-99" for r in net.records())


def test_the_server_reaches_no_one_when_it_is_lost_but_stays_online(tmp_path):
    net = make_net(tmp_path, plan(Fault("lose", SERVER, "broadcast", (), "client-2")))
    server = net.parties[SERVER]
    got = {c: net.transport.send(server.envelope(1, "broadcast", "model", c, DATA)).data
           for c in ("client-1", "client-2", "client-3")}
    assert got == {"client-1": DATA, "client-2": None, "client-3": DATA}


# -- refusals become the recipient's signed events -----------------------------------------


def test_reject_logs_an_event_signed_by_the_refusing_party_only(tmp_path):
    net = make_net(tmp_path)
    net.transport.reject(net.parties["client-2"], 3, "relay", SERVER, "altered")
    net.transport.record(net.parties[SERVER].event(3, "aggregate", "dropped", "client-1", "x"))
    head = net.transport.close(net.parties[SERVER])
    rejected, dropped, closing = net.records()
    assert (rejected["event"], rejected["sender"], rejected["party"], rejected["round"],
            rejected["phase"], rejected["detail"]) == ("rejected", "client-2", SERVER, 3,
                                                       "relay", "altered")
    pinned_key(tmp_path, "client-2").verify(bytes.fromhex(rejected["sig"]), canonical(rejected))
    with pytest.raises(InvalidSignature):
        pinned_key(tmp_path, SERVER).verify(bytes.fromhex(rejected["sig"]), canonical(rejected))
    assert dropped["sender"] == SERVER and dropped["event"] == "dropped"
    assert closing["event"] == "closed" and closing["sender"] == SERVER
    assert head == hashlib.sha256(net.log.path.read_text().splitlines()[-1].encode()).hexdigest()


@pytest.mark.parametrize("action, event", [("lose", None), ("corrupt", "altered in transit"),
                                           ("delay", "after the phase closed")])
def test_a_fault_on_the_servers_delivery_is_refused_and_signed_by_its_recipient(tmp_path, action,
                                                                                event):
    """Through the channel: the transport returns the refusal, and the channel logs it as the
    recipient's own ``rejected`` event, signed with the recipient's key, not the server's."""
    gen = torch.Generator().manual_seed(0)
    clients = [Client(f"client-{i}", torch.randn(3, 2, generator=gen), torch.Generator())
               for i in (1, 2, 3)]
    faults = plan(Fault(action, SERVER, "broadcast", (1,), "client-2"))
    log = MessageLog(tmp_path / "messages.jsonl")
    channel = open_channel(load_protocol("plaintext"), clients, log, faults)
    for round_ in (1, 2):
        for c in clients:
            c.inbox.clear()
        channel.broadcast(round_, "global_model", {"theta": np.arange(2, dtype=np.float32)})
        got = [c.id for c in clients if "global_model" in c.inbox]
        assert got == (["client-1", "client-3"] if round_ == 1 else [c.id for c in clients])
    channel.close()
    records = [json.loads(line) for line in log.path.read_text().splitlines()]
    rejected = [r for r in records if r.get("event") == "rejected"]
    if event is None:  # a lost message leaves only the server's record of sending it
        assert rejected == []
    else:  # the recipient, not the server, rejects what it received, with its own key
        assert [(e["sender"], e["party"], e["round"]) for e in rejected] == [
            ("client-2", SERVER, 1)]
        assert event in rejected[0]["detail"]
        pinned_key(tmp_path, "client-2").verify(bytes.fromhex(rejected[0]["sig"]),
                                                canonical(rejected[0]))
    assert sum(r["kind"] == "global_model" for r in records) == 6


# -- what the transport refuses to start with -------------------------------------------------


def test_client_ids_must_be_unique_registered_and_not_the_server(tmp_path):
    parties = [Party(SERVER), Party("client-1"), Party("client-2")]
    registry = Registry.of(parties)
    for ids, fragment in ((["client-1", "client-1"], "unique"), ([SERVER, "client-1"], "unique"),
                          (["client-1", "client-3"], "no public key registered for client-3")):
        log = MessageLog(tmp_path / "messages.jsonl")
        with pytest.raises(MessageError, match=fragment):
            InProcessTransport(registry, ids, log, PHASES)


@pytest.mark.parametrize("fault, fragment", [
    (Fault("drop", "server", "upload"), "the server cannot go offline; use action 'lose'"),
    (Fault("drop", "client-9", "upload"), "party 'client-9' does not exist"),
    (Fault("corrupt", "client-1", "masked_input"), "phase 'masked_input' is not a phase"),
    (Fault("unknown_sender", "client-1", "upload"), "'client-1' is registered"),
    (Fault("unknown_sender", "server", "upload"), "'server' is registered"),
    (Fault("drop", "client-1", "upload", (), "server"), "recipient 'server' is not possible"),
    (Fault("lose", "server", "broadcast", (), "client-9"), "recipient 'client-9' is not"),
    (Fault("lose", "server", "broadcast", (), "server"), "recipient 'server' is not"),
])
def test_a_fault_the_federation_cannot_suffer_is_refused_by_the_transport(tmp_path, fault,
                                                                          fragment):
    with pytest.raises(ConfigError, match=fragment):
        make_net(tmp_path, FaultPlan("m", (fault,)), n=2)


def test_an_author_named_outside_the_relay_phase_is_refused(tmp_path):
    """Adversary: a server that names another party as a message's author (``origin``) to
    make a second copy look new to the recipient's duplicate check; only a payload relayed
    in the relay phase has an author other than its sender."""
    net = make_net(tmp_path)
    server = net.parties[SERVER]
    first = net.transport.send(server.envelope(1, "unmask_request", "gradient", "client-1", b"ask"))
    again = net.transport.send(server.envelope(1, "unmask_request", "gradient", "client-1", b"ask",
                                     origin="client-2"))
    assert first.data == b"ask" and again.data is None
    assert "names an author (client-2) in phase unmask_request" in again.refusals[0].reason
    relayed = net.transport.send(server.envelope(1, "relay", "gradient", "client-1", b"x",
                                       origin="client-2"))
    assert relayed.data == b"x" and relayed.refusals == ()
