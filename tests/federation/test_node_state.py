"""A client's sealed state on its node's disk (secureffm/federation/node_state.py).

Adversary: whoever can write the node's state file but not read its key file (a restored
backup, a neighbouring process, a corrupting disk): a state file altered in any byte, one of
another client, or one of another run put at this run's path, is refused by name, and the
file on disk never holds the state in the clear. Truths used: the bytes written, the
provisioned key files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from secureffm.federation.keyfiles import provision
from secureffm.federation.node_state import (
    NodeState,
    StateError,
    StateFile,
    run_of,
    state_key,
    state_path,
)

SECRET = b"client-1's stream key and session secrets " * 8


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, ["client-1", "client-2"])
    return folder


def stored(folder: Path, keys: Path, client: str = "client-1",
           run: dict | None = None) -> StateFile:
    run_id = run_of(run if run is not None else {"flwr-run-id": "7", "secureffm-config": "{}"})
    return StateFile(state_path(folder / f"{client}.jsonl", run_id), state_key(keys, client),
                     client, run_id)


def test_a_saved_state_reads_back_and_is_not_in_the_clear(tmp_path, keys):
    store = stored(tmp_path, keys)
    state = NodeState("client-1", store.run, SECRET, seen=3, held=-1)
    store.save(state)
    assert store.load() == state
    assert SECRET[:20] not in store.path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.path.name]  # no .part left
    assert store.path.name.startswith("client-1.") and store.path.suffix == ".state"


def test_a_node_restarted_from_its_file_is_held_out_of_the_rounds_it_had_seen(tmp_path, keys):
    store = stored(tmp_path, keys)
    assert store.returning() == NodeState("client-1", store.run)  # nothing saved: fresh
    store.save(NodeState("client-1", store.run, SECRET, seen=2, held=-1))
    assert store.returning() == NodeState("client-1", store.run, SECRET, seen=2, held=2)


@pytest.mark.parametrize("where", ["header", "body", "end"])
def test_an_altered_state_file_is_refused_by_name(tmp_path, keys, where):
    store = stored(tmp_path, keys)
    store.save(NodeState("client-1", store.run, SECRET, seen=2, held=-1))
    data = bytearray(store.path.read_bytes())
    at = {"header": data.index(b'"seen": 2') + 9, "body": len(data) // 2 + 40,
          "end": len(data) - 1}[where]
    data[at] ^= 0x01  # seen 2 -> 3 in the header; one bit of the sealed body or its tag
    store.path.write_bytes(bytes(data))
    with pytest.raises(StateError, match=rf"{store.path.name}.*(altered|does not open)"):
        store.load()


def test_another_runs_state_put_in_place_is_refused_by_name(tmp_path, keys):
    old = stored(tmp_path / "old", keys, run={"flwr-run-id": "6", "secureffm-config": "{}"})
    old.path.parent.mkdir()
    old.save(NodeState("client-1", old.run, SECRET, seen=9, held=-1))
    store = stored(tmp_path, keys)
    shutil.copy(old.path, store.path)
    with pytest.raises(StateError, match=f"state of run {old.run}, not of this run {store.run}"):
        store.load()


def test_another_clients_state_put_in_place_is_refused_by_name(tmp_path, keys):
    theirs = stored(tmp_path / "theirs", keys, client="client-2")
    theirs.path.parent.mkdir()
    theirs.save(NodeState("client-2", theirs.run, SECRET, seen=1, held=-1))
    store = stored(tmp_path, keys)
    shutil.copy(theirs.path, store.path)
    with pytest.raises(StateError, match="holds the state of client-2, not client-1"):
        store.load()


def test_a_state_sealed_under_another_key_file_does_not_open(tmp_path, keys):
    """The same client id and run, another key file: the seal is bound to the key file."""
    other = tmp_path / "other-keys"
    provision(other, ["client-1"])
    store = stored(tmp_path, keys)
    StateFile(store.path, state_key(other, "client-1"), "client-1", store.run).save(
        NodeState("client-1", store.run, SECRET, seen=1, held=-1))
    with pytest.raises(StateError, match="does not open under client-1's key"):
        store.load()


def test_a_run_is_its_flower_run_id_and_its_config():
    config = {"secureffm-config": '{"rounds": 3}'}
    assert run_of({**config, "flwr-run-id": "1"}) != run_of({**config, "flwr-run-id": "2"})
    assert run_of(config) != run_of({"secureffm-config": '{"rounds": 4}'})
    assert run_of({**config, "flwr-run-id": "1"}).startswith("1:")
