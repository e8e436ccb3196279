"""A client's side of the boundary (secureffm/protocols/endpoint.py): what it refuses on
receipt, and what survives a save/restore between two messages.

Each refusal test plays a network or server adversary against one real ClientEndpoint: the
client must answer no message, and raise a ``rejected`` event that it signed itself (checked
with Ed25519 against the client's registered key). Truths used: real Ed25519 signatures from
real parties, and one real in-process secure aggregation for the unmask request.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from secureffm.federation.crypto import verify_signature
from secureffm.federation.exchange import Incoming, Request
from secureffm.federation.log import MessageLog
from secureffm.federation.message import RELAY_PHASE, SERVER, canonical, serialize_payload
from secureffm.federation.parties import Client, Party, Registry, new_client, new_server
from secureffm.protocols import load_protocol
from secureffm.protocols.endpoint import ClientEndpoint
from secureffm.runs.scaffold import open_channel

KIND = "gradient"


@dataclasses.dataclass
class World:
    server: Party
    client: Client
    endpoint: ClientEndpoint
    registry: Registry

    def broadcast(self, round_: int = 1, data: bytes | None = None, phase: str = "broadcast",
                  sender: Party | None = None, origin: str = "") -> tuple[Request, Incoming]:
        """The server's signed broadcast to client-1 and the request to accept it."""
        data = data if data is not None else serialize_payload({"w": np.ones(3, np.float32)})
        envelope = (sender or self.server).envelope(round_, phase, "model", "client-1", data,
                                                    (), origin)
        return (Request(round_, "model", phase, phase, "accept", (), envelope),
                Incoming(envelope, data, 5))


def world() -> World:
    server = new_server()
    client = new_client("client-1", torch.zeros(4, 2))
    registry = Registry.of([server, client, new_client("client-2", torch.zeros(4, 2))])
    return World(server, client, ClientEndpoint(client, registry, load_protocol("plaintext")),
                 registry)


def refused(w: World, request: Request, incoming: Incoming, fragment: str) -> dict:
    """The endpoint answers nothing and signs one ``rejected`` event naming ``fragment``."""
    reply = w.endpoint(request, incoming)
    assert reply.envelope is None
    [event] = reply.events
    assert event["event"] == "rejected" and event["sender"] == "client-1"
    assert fragment in event["detail"], event["detail"]
    assert verify_signature(w.registry.sign["client-1"], bytes.fromhex(event["sig"]),
                            canonical(event))
    assert "model" not in w.client.inbox  # nothing of the refused message was taken
    return event


def test_an_intact_broadcast_is_accepted_into_the_inbox_with_no_events():
    w = world()
    reply = w.endpoint(*w.broadcast())
    assert reply.envelope is None and reply.events == ()
    np.testing.assert_array_equal(w.client.inbox["model"]["w"], np.ones(3, np.float32))
    assert len(w.client.memory["broadcasts"][1]) == 1


def test_an_altered_message_is_refused_naming_its_seq():
    w = world()
    request, incoming = w.broadcast()
    bad = dataclasses.replace(incoming, data=b"X" + incoming.data[1:])
    event = refused(w, request, bad, "message seq 5 was altered in transit")
    assert event["party"] == SERVER and event["refused"] == 5


def test_a_replayed_message_is_refused_and_the_first_copy_stands():
    w = world()
    request, incoming = w.broadcast()
    assert w.endpoint(request, incoming).events == ()
    w.client.inbox.clear()
    event = refused(w, request, incoming, "duplicate or replayed model message")
    assert "refused" not in event  # the logged record itself was accepted once


def test_a_late_message_is_refused():
    w = world()
    request, incoming = w.broadcast()
    refused(w, request, dataclasses.replace(incoming, late=True),
            "arrived after the phase closed")


def test_a_message_signed_by_a_key_that_is_not_the_servers_is_refused():
    w = world()
    impostor = Party(SERVER)  # names itself the server, holds another key
    refused(w, *w.broadcast(sender=impostor), "invalid signature")
    client_2 = Party("client-2")  # a registered name with an unregistered key
    request, incoming = w.broadcast(sender=client_2)
    refused(w, request, incoming, "invalid signature")


def test_a_message_naming_an_author_outside_the_relay_phase_is_refused():
    w = world()
    refused(w, *w.broadcast(origin="client-2"), "names an author (client-2) in phase broadcast")
    # the same origin in the relay phase passes the receipt check (then the handler runs)
    request, incoming = w.broadcast(phase=RELAY_PHASE, origin="client-2")
    assert w.endpoint(request, incoming).events == ()


@pytest.mark.parametrize("protocol, kind, action", [
    ("plaintext", KIND, "ckks.decrypt"), ("plaintext", KIND, "secagg.answer"),
    ("dp-secagg", KIND, "ckks.keys"), ("dp-secagg", KIND, "secagg.epoch.answer"),
    ("dp-secagg-once", KIND, "secagg.answer"), ("he", "model", "ckks.decrypt"),
    ("plaintext", KIND, "steal.keys")])
def test_an_action_outside_the_clients_own_protocol_is_refused_by_name(protocol, kind, action):
    """Adversary: a malicious server asking a client to run a stage's step that the client's
    own protocol does not have (or has for other kinds, or in another variant): decrypt a sum
    under plaintext, reveal unmask shares or make a CKKS key under a secagg protocol it never
    set up. Before issue 40 every handler any imported module registered ran on any client
    (here with no ``args``: the handler failed on what it read, or refused by chance, having
    read the client's memory and sessions). Now the client refuses before any handler runs,
    in its own signed ``rejected`` event naming the action, and answers nothing."""
    w = world()
    w.endpoint = ClientEndpoint(w.client, w.registry, load_protocol(protocol))
    request = Request(1, kind, "unmask_request", "unmask", action, ())
    reply = w.endpoint(request, None)
    assert reply.envelope is None
    [event] = reply.events
    assert (event["event"], event["sender"], event["party"]) == ("rejected", "client-1", SERVER)
    assert f"refused action {action!r}" in event["detail"], event["detail"]
    assert f"protocol {protocol!r}" in event["detail"]
    assert verify_signature(w.registry.sign["client-1"], bytes.fromhex(event["sig"]),
                            canonical(event))
    assert w.endpoint.sessions == {} and w.client.memory.get("ckks") is None


def restarted(endpoint: ClientEndpoint, saved: dict | None = None) -> ClientEndpoint:
    """The endpoint as a fresh process rebuilds it from its JSON-saved state."""
    fresh = ClientEndpoint(endpoint.client, endpoint.registry, endpoint.protocol,
                           endpoint.program)
    fresh.restore(json.loads(json.dumps(saved if saved is not None else endpoint.saved())))
    return fresh


def test_a_restored_endpoint_still_refuses_a_replay_of_a_message_it_accepted():
    w = world()
    request, incoming = w.broadcast()
    w.endpoint(request, incoming)
    again = restarted(w.endpoint)
    w.client.inbox.clear()
    w.endpoint = again
    refused(w, request, incoming, "duplicate or replayed")
    w.endpoint = restarted(w.endpoint, {"seen": [], "sessions": []})  # control: forgotten
    assert w.endpoint(request, incoming).events == ()


def secagg_round(tmp_path, n: int = 4):
    """One real in-process secure aggregation; returns the channel and client-1's unmask
    request (as it arrived) with the endpoint that answered it."""
    clients = [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator(),
                      protocol_rng=np.random.default_rng(i)) for i in range(1, n + 1)]
    channel = open_channel(load_protocol("secagg"), clients, MessageLog(tmp_path / "m.jsonl"))
    endpoint = channel.endpoints["client-1"]
    seen = []

    def recording(request, incoming, broadcasts=()):
        if request.action == "secagg.answer":
            seen.append((request, incoming))
        return endpoint(request, incoming, broadcasts)

    channel.endpoints["client-1"] = recording
    result = channel.aggregate(1, KIND, lambda c: {KIND: np.full(6, 0.25, np.float32)},
                               {c.id: 1.0 for c in clients}, {KIND: ((6,), np.float32)})
    assert result.included == [c.id for c in clients]
    [(request, incoming)] = seen
    return endpoint, request, incoming


def test_answer_once_survives_a_restart_of_the_secagg_session(tmp_path):
    """A malicious server asks a second time for client-1's unmask shares in the same
    aggregation (after it restarted): the restored session must refuse as the original does,
    or the server could learn both shares of a client it calls dropped and one it calls
    alive."""
    endpoint, request, incoming = secagg_round(tmp_path)
    saved = endpoint.saved()
    [[round_, kind, tag, table]] = saved["sessions"]
    assert (round_, kind, tag, table["answered"]) == (1, KIND, "secagg", True)
    # the same request again: the duplicate check refuses it, before and after the restart
    original = endpoint(request, incoming)
    again = restarted(endpoint)(request, incoming)
    assert original.envelope is again.envelope is None
    assert ([e["detail"] for e in original.events] == [e["detail"] for e in again.events]
            and "duplicate or replayed" in original.events[0]["detail"])
    # the session alone (the receipts forgotten) still answers only once
    sessions_only = {"seen": [], "sessions": saved["sessions"]}
    for answering in (restarted(endpoint, sessions_only), restarted(endpoint, sessions_only)):
        reply = answering(request, incoming)
        assert reply.envelope is None
        assert "already answered an unmask request" in reply.events[0]["detail"]
    # control: a session that had not answered would answer (so the check above can fail)
    fresh = copy.deepcopy(sessions_only)
    fresh["sessions"][0][3]["answered"] = False
    assert restarted(endpoint, fresh)(request, incoming).envelope is not None
