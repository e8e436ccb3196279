"""A restarted client moves to its new Flower node only on a hello it signs (secureffm/federation/
rejoin.py, FlowerCalls.rejoin in secureffm/federation/flower.py), without Flower processes: a
small in-process grid hands each pushed message to a node's handler (our real ClientApp, or an
adversary's function) with a Flower Context, as the SuperLink and SuperNodes would.

Adversaries: another node of the run, which holds another client's key and claims the
restarted client's id (a forged hello), and a network attacker who captured the restarted
node's genuine signed answer and replays it from its own node or against a later challenge.
Before issue 39 the map was fixed at the first hello: no node could move a client at all, so a
restarted node received nothing, and these attacks had no map to move.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402

from secureffm.errors import MessageError  # noqa: E402
from secureffm.federation import rejoin  # noqa: E402
from secureffm.federation.flower import FlowerCalls, make_client_app  # noqa: E402
from secureffm.federation.keyfiles import load_party_keys, load_registry, provision  # noqa: E402

CLIENTS = ["client-1", "client-2", "client-3"]
RUN = 4242


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, CLIENTS)
    return folder


@pytest.fixture(autouse=True)
def server_process(monkeypatch):
    """What Flower sets in a ServerApp's process: the run, node and task ids messages read."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", RUN)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


@dataclass
class FlowerRun:
    run_id: int


class Grid:
    """Nodes in this process: node id -> handler(message, context); replies kept for pulls."""

    def __init__(self):
        self.run = FlowerRun(RUN)
        self.handlers: dict[int, object] = {}
        self.contexts: dict[int, Context] = {}
        self.replies: list[Message] = []

    def add(self, node: int, handler, node_config: dict) -> None:
        self.handlers[node] = handler
        self.contexts[node] = Context(RUN, node, node_config, RecordDict(), {})

    def get_node_ids(self) -> list[int]:
        return list(self.handlers)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            node = message.metadata.dst_node_id
            self.replies.append(self.handlers[node](message, self.contexts[node]))
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, ids) -> list[Message]:
        out = [r for r in self.replies if r.metadata.reply_to_message_id in set(ids)]
        self.replies = [r for r in self.replies if r not in out]
        return out


def answering(content: dict):
    """An adversary's node: it answers every hello with ``content``."""
    def handler(message: Message, context: Context) -> Message:
        return Message(RecordDict({"hello": ConfigRecord(content)}), reply_to=message)
    return handler


def deployed(keys: Path) -> tuple[Grid, FlowerCalls]:
    """Three honest nodes (ids 11, 12, 13) mapped by the first hello, the registry pinned."""
    grid = Grid()
    app = make_client_app("secureffm.runs.flower_node:serve")
    for i, cid in enumerate(CLIENTS):
        grid.add(11 + i, app, {"client-id": cid, "keys": str(keys)})
    calls = FlowerCalls(grid)
    assert calls.hello(5.0, 3) == {"client-1": 11, "client-2": 12, "client-3": 13}
    calls.registry = load_registry(keys)
    return grid, calls


def restarted(grid: Grid, keys: Path, node: int = 23) -> None:
    """client-3's SuperNode comes back as Flower node ``node`` (node 13 is gone)."""
    grid.handlers.pop(13)
    grid.add(node, make_client_app("secureffm.runs.flower_node:serve"),
             {"client-id": "client-3", "keys": str(keys)})


def test_a_restarted_client_moves_to_its_new_node_on_its_signed_hello(keys):
    grid, calls = deployed(keys)
    restarted(grid, keys)
    assert calls.rejoin(5.0) == {"client-3": 23}
    assert calls.nodes == {"client-1": 11, "client-2": 12, "client-3": 23}
    assert calls.rejoin(5.0) == {}  # asked once: the map holds node 23 now


def test_a_node_claiming_another_clients_id_with_its_own_key_moves_nothing(keys):
    """Adversary: the node of client-2, a client of the run, claims client-3's id on a new
    Flower node and signs the hello with the key it holds (client-2's)."""
    grid, calls = deployed(keys)
    identity, _ = load_party_keys(keys, "client-2")
    pending = {}

    def forger(message: Message, context: Context) -> Message:
        challenge = bytes(message.content["hello"]["challenge"])
        proof = identity.sign(rejoin.statement("client-3", str(RUN), context.node_id, challenge))
        pending["proof"] = proof
        return answering({"client-id": "client-3", "proof": proof})(message, context)

    grid.add(31, forger, {})
    grid.add(32, answering({"client-id": "client-3"}), {})  # no signature at all
    grid.add(33, answering({"client-id": "client-9", "proof": b"\0" * 64}), {})  # not of the run
    assert calls.rejoin(5.0) == {}
    assert calls.nodes["client-3"] == 13
    assert "not signed by client-3" in calls.strangers[31]
    assert "not signed by client-3" in calls.strangers[32]
    assert "not a client of this run" in calls.strangers[33]
    assert pending["proof"]  # the forger did answer: its signature was refused


def test_a_replayed_signed_hello_moves_nothing(keys):
    """Adversary: a network attacker who captured client-3's genuine signed answer (to the
    challenge node 23 was sent) and replays it from its own node, and to a later challenge."""
    grid, calls = deployed(keys)
    restarted(grid, keys)
    sent = []
    push = grid.push_messages

    def recording(messages):
        ids = push(messages)
        sent.extend(grid.replies)
        return ids

    grid.push_messages = recording
    assert calls.rejoin(5.0) == {"client-3": 23}
    captured = dict(sent[-1].content["hello"])
    assert set(captured) == {"client-id", "proof"}
    grid.add(41, answering(captured), {})  # the same answer from another node
    assert calls.rejoin(5.0) == {}
    assert "not signed by client-3" in calls.strangers[41]
    assert calls.nodes["client-3"] == 23
    challenge = secrets.token_bytes(32)  # the same node asked again: a fresh challenge
    with pytest.raises(MessageError, match="not signed by client-3"):
        rejoin.check(calls.registry, calls.nodes, str(RUN), 23, challenge, captured)
    with pytest.raises(MessageError, match="not signed by client-3"):  # another run's
        rejoin.check(calls.registry, calls.nodes, str(RUN + 1), 23, challenge, captured)


def test_no_client_moves_before_the_registry_is_pinned(keys):
    """Without the pinned keys there is no way to check a claim: the first hello's map holds."""
    grid, calls = deployed(keys)
    calls.registry = None
    restarted(grid, keys)
    assert calls.rejoin(5.0) == {}
    assert calls.nodes["client-3"] == 13
