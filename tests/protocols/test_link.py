"""`Link` (secureffm/protocols/link.py): what a stage sends through. Each message is signed by
its sender's own key, and each refusal the transport returns is logged as the recipient's own
signed ``rejected`` event.

Truths used: Ed25519 verification with `cryptography` against the keys pinned in parties.json.
"""

from __future__ import annotations

import json

import pytest
import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secureffm.federation import (
    SERVER,
    Client,
    InProcessTransport,
    MessageLog,
    Party,
    Registry,
)
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.log import canonical
from secureffm.protocols.link import Link

PHASES = ("broadcast", "upload", "relay")
IDS = ("client-1", "client-2", "client-3")


def make_link(tmp_path, faults: FaultPlan | None = None, stages=("dp",)) -> Link:
    clients = [Client(c, torch.zeros(1, 2), torch.Generator()) for c in IDS]
    parties = {SERVER: Party(SERVER), **{c.id: c for c in clients}}
    log = MessageLog(tmp_path / "messages.jsonl")
    transport = InProcessTransport(Registry.of(list(parties.values())), list(IDS), log, PHASES,
                                   faults)
    return Link(transport, parties, clients, 4, "model", stages)


def records(link: Link) -> list[dict]:
    return [json.loads(line) for line in link.transport.log.path.read_text().splitlines()]


def key(tmp_path, party: str) -> Ed25519PublicKey:
    pinned = json.loads((tmp_path / "parties.json").read_text())
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(pinned[party]["sign"]))


def signed_by(tmp_path, record: dict) -> list[str]:
    """Every party whose pinned key verifies ``record``'s signature."""
    out = []
    for party in (SERVER, *IDS):
        try:
            key(tmp_path, party).verify(bytes.fromhex(record["sig"]), canonical(record))
            out.append(party)
        except InvalidSignature:
            pass
    return out


@pytest.mark.parametrize("sender, recipient", [("client-2", SERVER), (SERVER, "client-3"),
                                               ("client-1", "client-2")])
def test_send_is_signed_by_the_senders_own_key_and_only_by_it(tmp_path, sender, recipient):
    link = make_link(tmp_path)
    assert link.send("upload", sender, recipient, b"bytes", origin="") == b"bytes"
    [record] = records(link)
    assert (record["sender"], record["recipient"], record["round"], record["kind"],
            record["phase"], record["stages"]) == (sender, recipient, 4, "model", "upload",
                                                   ["dp"])
    assert signed_by(tmp_path, record) == [sender]


def test_a_relayed_message_names_its_origin_under_the_relays_signature(tmp_path):
    link = make_link(tmp_path)
    link.send("relay", SERVER, "client-2", b"copy", origin="client-1")
    [record] = records(link)
    assert record["origin"] == "client-1" and signed_by(tmp_path, record) == [SERVER]


@pytest.mark.parametrize("sender, recipient", [("client-1", SERVER), (SERVER, "client-2")])
def test_a_refusal_is_logged_as_the_recipients_signed_rejected_event(tmp_path, sender,
                                                                     recipient):
    faults = FaultPlan("t", (Fault("corrupt", sender, "upload", (4,)),))
    link = make_link(tmp_path, faults)
    assert link.send("upload", sender, recipient, b"bytes") is None
    delivery, rejected = records(link)
    assert delivery["sender"] == sender
    assert (rejected["event"], rejected["sender"], rejected["party"], rejected["round"],
            rejected["phase"]) == ("rejected", recipient, sender, 4, "upload")
    assert "altered in transit" in rejected["detail"]
    assert signed_by(tmp_path, rejected) == [recipient]


def test_a_forgery_by_an_unregistered_party_is_rejected_by_the_server_naming_it(tmp_path):
    faults = FaultPlan("t", (Fault("unknown_sender", "mallory", "upload", (4,)),))
    link = make_link(tmp_path, faults)
    assert link.send("upload", "client-1", SERVER, b"bytes") == b"bytes"
    delivery, rejected = records(link)
    assert delivery["sender"] == "client-1"
    assert (rejected["sender"], rejected["party"]) == (SERVER, "mallory")
    assert signed_by(tmp_path, rejected) == [SERVER]


def test_reject_and_event_are_signed_by_the_party_that_raises_them(tmp_path):
    link = make_link(tmp_path)
    link.reject("relay", "client-1", "cannot open", by="client-3")
    link.reject("upload", "client-2", "bad update")  # the server by default
    link.event("aggregate", "clipped", "client-2", "3 coordinates", by="client-2")
    link.event("aggregate", "aggregated", "*", "2 of 3", fields={"included": ["client-1"],
                                                                  "of_kind": "model"})
    logged = records(link)
    assert [(r["event"], r["sender"], r["party"]) for r in logged] == [
        ("rejected", "client-3", "client-1"), ("rejected", SERVER, "client-2"),
        ("clipped", "client-2", "client-2"), ("aggregated", SERVER, "*")]
    assert [signed_by(tmp_path, r) for r in logged] == [["client-3"], [SERVER], ["client-2"],
                                                        [SERVER]]
    assert logged[-1]["included"] == ["client-1"] and logged[-1]["of_kind"] == "model"


def test_alive_asks_the_transport_for_the_links_round(tmp_path):
    link = make_link(tmp_path, FaultPlan("t", (Fault("drop", "client-2", "upload", (4,)),)))
    assert link.alive("client-2", "broadcast") and not link.alive("client-2", "relay")
    assert link.alive("client-1", "relay")
    assert link.send("upload", "client-2", SERVER, b"x") is None and records(link) == []
