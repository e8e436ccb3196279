"""The Flower side of the batched call (secureffm/federation/flower.py), with the toy node of
tests/federation/flower_toy.py (per-node Ed25519 key from OS entropy and a counter, both kept in
the node's state bytes; every reply signed).

The simulation tests share one ``run_simulation`` of three nodes (module-scoped fixture
``simulated``): Ray starts once, about 15 to 25 s here, and each test then takes well under a
second, so they stay in the default suite. The deployment test starts a SuperLink and three
SuperNodes as processes and is ``slow`` (about 2 to 3 minutes on this machine: each exchange
starts a Python process per node).
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from secureffm.errors import ConfigError, MessageError  # noqa: E402
from secureffm.federation import flower  # noqa: E402
from tests.federation.flower_toy import opened  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVE = "tests.federation.flower_toy:serve"
CLIENTS = ["client-1", "client-2", "client-3"]


# -- without an engine ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, flower.ARRAY_ABOVE, flower.ARRAY_ABOVE + 1, 4_000_000])
def test_bytes_survive_their_flower_record(size):
    from flwr.app import ArrayRecord, ConfigRecord

    data = os.urandom(size)
    content = flower._pack(data)
    assert flower._unpack(content) == data and flower._size(content) == size
    kind = ArrayRecord if size > flower.ARRAY_ABOVE else ConfigRecord
    assert isinstance(content["bytes"], kind)


def test_resolve_names_a_function_or_says_what_is_wrong():
    import json

    assert flower.resolve("json:dumps") is json.dumps
    for bad in ("json", "no_such_module_here:f", "json:no_such_function", "json:__name__"):
        with pytest.raises(ConfigError):
            flower.resolve(bad)


def test_client_id_from_the_node_config():
    assert flower.client_id({"client-id": "hospital-a", "partition-id": 4}) == "hospital-a"
    assert flower.client_id({"partition-id": 0, "num-partitions": 3}) == "client-1"
    with pytest.raises(ConfigError, match="client-id"):
        flower.client_id({})


def test_secureffm_imports_without_flower():
    """flwr is an optional extra: the package and this module import without it, and making an
    app says how to install it."""
    code = ("import sys; sys.modules['flwr'] = None\n"
            "import secureffm, secureffm.federation.flower as f\n"
            "from secureffm.errors import ConfigError\n"
            "try:\n    f.make_client_app('json:dumps')\nexcept ConfigError as e:\n"
            "    print(e)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "pip install 'secureffm[flower]'" in out


# -- on Flower's simulation engine -----------------------------------------------------------


@pytest.fixture(scope="module")
def simulated():
    """The FlowerCalls of one simulation of three nodes, its ServerApp main kept waiting in
    Flower's thread until the module's tests are done."""
    handed: queue.Queue = queue.Queue()
    stop = threading.Event()

    def main(calls, run_config):
        calls.hello(120.0, clients=3)
        handed.put(calls)
        stop.wait()

    def run():
        try:
            flower.simulate(main, SERVE, 3, backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": 2, "object_store_memory": 200 * 2**20}})
        except BaseException as error:  # noqa: BLE001 (handed to the test that waits)
            handed.put(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    calls = handed.get(timeout=300)
    if isinstance(calls, BaseException):
        raise calls
    yield calls
    stop.set()
    thread.join(120)


def _opened(replies: dict) -> dict:
    """client -> (counter, public key, request echoed), each reply's signature checked."""
    return {c: opened(c, reply) for c, reply in replies.items()}


def test_hello_maps_each_client_to_its_own_node(simulated):
    assert sorted(simulated.nodes) == CLIENTS
    assert len(set(simulated.nodes.values())) == 3


def test_state_persists_across_calls_and_nodes(simulated):
    rounds = [_opened(simulated.call({c: f"{c} {i}".encode() for c in CLIENTS}, 60.0))
              for i in range(3)]
    for client in CLIENTS:
        counters = [r[client][0] for r in rounds]
        assert counters == [counters[0], counters[0] + 1, counters[0] + 2]
        assert len({r[client][1] for r in rounds}) == 1  # the key made once is kept
        assert [r[client][2] for r in rounds] == [f"{client} {i}".encode() for i in range(3)]
    assert len({rounds[0][c][1] for c in CLIENTS}) == 3  # one key per node



def test_the_engine_asks_only_the_nodes_with_a_request_waiting(simulated, monkeypatch):
    """Flower 1.42's engine asked the in-memory SuperLink for a request of every node every
    0.1 s, each ask walking the whole message store (the server's CPU grew as n^2,
    docs/benchmarks.md "Scale"); :mod:`secureffm.federation.engine_dispatch` asks only the
    nodes with one waiting: no ask comes back empty, between calls as during them."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    original, asks = InMemoryLinkState.get_message_ins, []

    def counted(self, node_id, limit, **options):
        found = original(self, node_id, limit, **options)
        asks.append(len(found))
        return found

    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", counted)
    for i in range(3):
        _opened(simulated.call({c: f"ask {i}".encode() for c in CLIENTS}, 60.0))
        time.sleep(0.5)  # idle ticks: Flower's loop asks 3 nodes each
    assert sum(asks) == 9 and asks.count(0) == 0


def test_the_dispatch_is_used_only_on_the_flower_it_was_written_for():
    """The engine's loop is replaced only where it is as read (flwr 1.42, the loop asking each
    node, the in-memory state's store and lock); the installed Flower is."""
    from secureffm.federation import engine_dispatch

    module = engine_dispatch.engine_as_read()
    assert module is not None
    before = module.add_messages_to_queue  # a simulation of this module may be running
    with engine_dispatch.indexed_dispatch() as indexed:
        assert indexed and module.add_messages_to_queue is engine_dispatch.dispatch_waiting
    assert module.add_messages_to_queue is before

def test_4mb_requests_and_replies_round_trip_intact(simulated):
    requests = {c: os.urandom(4_000_000) for c in CLIENTS}
    replies = simulated.call(requests, 120.0)
    assert {c: e for c, (_, _, e) in _opened(replies).items()} == requests
    assert simulated.last.sent == 12_000_000
    assert simulated.last.received == sum(len(r) for r in replies.values())


def test_a_raising_node_gives_none_and_the_others_answer(simulated):
    before = _opened(simulated.call({c: b"" for c in CLIENTS}, 60.0))
    replies = simulated.call({"client-1": b"a", "client-2": b"raise", "client-3": b"c"}, 60.0)
    assert replies["client-2"] is None
    assert "asked to fail" in simulated.errors["client-2"]
    assert "CLIENT_APP_RAISED_EXCEPTION" in simulated.errors["client-2"]  # Flower's code, named
    assert [opened(c, replies[c])[2] for c in ("client-1", "client-3")] == [b"a", b"c"]
    after = _opened(simulated.call({c: b"" for c in CLIENTS}, 60.0))
    assert after["client-2"][0] == before["client-2"][0] + 1  # the failed call kept no state
    assert after["client-1"][0] == before["client-1"][0] + 2
    assert "client-2" not in simulated.errors


def test_a_timeout_gives_none_without_waiting_for_the_late_node(simulated, caplog):
    started = time.perf_counter()
    replies = simulated.call({"client-1": b"a", "client-2": b"sleep:2.5|", "client-3": b"c"}, 0.5)
    waited = time.perf_counter() - started
    assert replies["client-2"] is None and waited < 2.5  # returned before the node could answer
    # why, as far as Flower says: the node is still connected, its ClientApp was late
    assert simulated.errors["client-2"].startswith(
        "no reply within 0.5 s: the SuperLink lists it connected")
    # and the server's log says so (a deployment's flwr log / flwr run --stream shows it)
    assert "client-2 gave no query.secureffm reply: no reply within 0.5 s" in caplog.text
    assert [opened(c, replies[c])[2] for c in ("client-1", "client-3")] == [b"a", b"c"]
    time.sleep(2.5)  # the late reply arrives now; the next call must not take it for its own
    again = _opened(simulated.call({c: c.encode() for c in CLIENTS}, 60.0))
    assert {c: e for c, (_, _, e) in again.items()} == {c: c.encode() for c in CLIENTS}


def test_a_request_lives_only_as_long_as_its_phase_waits(simulated, monkeypatch):
    """Each request carries the phase's timeout as its Flower TTL (Flower's default is 12 h):
    the SuperLink drops it unread once the phase has given up on the node, so a node that
    comes back later cannot run a stale request and move its state past the server's round.
    (Flower's expiry itself is Flower's; this checks what FlowerCalls asks of it.)"""
    pushed, push = [], simulated.grid.push_messages
    monkeypatch.setattr(simulated.grid, "push_messages",
                        lambda messages: pushed.extend(messages) or push(messages))
    assert all(simulated.call({c: b"ttl" for c in CLIENTS}, 30.0).values())
    simulated.call({"client-1": b"ttl"}, 0.2)
    assert [m.metadata.ttl for m in pushed] == [30.0] * 3 + [1.0]  # at least 1 s


def test_a_long_wait_pulls_a_number_of_times_logarithmic_then_once_a_second(simulated,
                                                                              monkeypatch):
    """Each pull makes the SuperLink check every pending message, so pulling every 10 ms while
    n nodes compute for T s cost O(n T / 10 ms) in the server process (29 s CPU a round at
    n = 300 in issue 39). The sleep between pulls that bring nothing grows by a quarter a pull
    to 1 s: about 21 pulls reach 1 s sleeps (after about 4 s), then one a second, whatever the
    machine's load; a pull that brings replies (here at most two) is followed by a short sleep."""
    pulls, pull = [], simulated.grid.pull_messages
    monkeypatch.setattr(simulated.grid, "pull_messages",
                        lambda ids: pulls.append(len(ids)) or pull(ids))
    started = time.perf_counter()
    replies = simulated.call({"client-1": b"a", "client-2": b"sleep:2.5|", "client-3": b"c"},
                             60.0)
    waited = time.perf_counter() - started
    assert all(replies.values())
    growing = math.ceil(math.log(flower.PULL_MAX_S / 0.01, flower.PULL_GROWTH))
    assert len(pulls) <= 1 + 3 * (growing + math.ceil(waited / flower.PULL_MAX_S))


def test_a_client_hello_did_not_find_is_an_error(simulated):
    with pytest.raises(MessageError, match="client-9"):
        simulated.call({"client-9": b""}, 1.0)


# -- deployment: SuperLink and SuperNodes as processes ---------------------------------------


def _wait_for(path: Path, out: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert not out.exists(), out.read_text()  # the run ended without pausing
        assert time.monotonic() < deadline, f"no {path.name} within {seconds} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_local_deployment_survives_a_killed_supernode(tmp_path):
    pause = tmp_path / "pause"
    pause.mkdir()
    with flower.LocalDeployment("tests.federation.flower_toy:deployed", SERVE, CLIENTS,
                                home=str(tmp_path / "flwr"), tls=True) as deployment:
        out = deployment.submit({"timeout": 45.0, "clients": 3, "pause": str(pause)})
        _wait_for(pause / "ready", out, 500)
        deployment.kill("client-2")
        (pause / "go").touch()
        result = deployment.wait(out, 300)
        started = [pid for p in deployment.processes.values()
                   for pid in (*flower._descendants(p.pid), p.pid)]
    assert not [pid for pid in started if flower._alive(pid)], "a Flower process outlived it"
    link = (tmp_path / "flwr" / "superlink.log").read_text()  # TLS and node auth were on
    assert "--insecure" not in link and "SuperNode authentication is disabled" not in link
    assert result["nodes"] == CLIENTS
    *before, last = result["results"]
    for i, call in enumerate(before):
        assert sorted(call) == CLIENTS
        assert all(call[c][0] == i + 1 and call[c][2] for c in CLIENTS)  # counter, echo intact
        assert all(call[c][1] == before[0][c][1] for c in CLIENTS)  # the same key every call
    assert last["client-2"] is None and "client-2" in result["errors"]
    assert all(last[c][0] == 5 and last[c][2] for c in ("client-1", "client-3"))
    print("deployment call seconds (empty, 4 MB, empty, 4 MB, after the kill):",
          [round(s, 2) for s in result["seconds"]])
