"""A deployed node's warm process (secureffm/federation/warm.py): one long-lived process of the
node serves its messages, the state still travels as bytes with each message, a refusal and an
error come back as such, and the process ends with its SuperNode.

Here a ``sleep`` child plays the SuperNode and this module's functions the node's ``serve``
and ``admit``; the real ClientApp path runs in tests/runs/test_flower_deployment.py (slow).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from secureffm.errors import PolicyError
from secureffm.federation.warm import Warm

SERVE = "tests.federation.test_warm:serve"
ADMIT = "tests.federation.test_warm:admit"


def serve(node_config: dict, run_config: dict, state: bytes | None,
          request: bytes) -> tuple[bytes, bytes]:
    """Appends the request to the state; replies with this process's pid, or raises."""
    if request == b"fail":
        raise ValueError("asked to fail")
    return (state or b"") + request, str(os.getpid()).encode()


def admit(node_config: dict, run_config: dict) -> None:
    if run_config.get("protocol") != node_config["protocol"]:
        raise PolicyError(f"{node_config['client-id']} refuses the run: protocol differs")


@pytest.fixture
def supernode():
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


def _listening(path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
            return True
        except OSError:
            return False


def test_one_warm_process_serves_every_message_and_the_state_travels_as_bytes(supernode):
    node = {"client-id": "client-1", "protocol": "dp-secagg"}
    warm = Warm(SERVE, ADMIT, supernode.pid, node)
    header, (state, pid) = warm.call("serve", node, {}, None, b"a")
    assert state == b"a" and int(pid) != os.getpid()
    header, (state, again) = warm.call("serve", node, {}, state, b"b")
    assert state == b"ab" and again == pid  # the same process, not a fresh one
    assert warm.call("admit", node, {"protocol": "dp-secagg"}, None, b"")[0] == {}
    refused, _ = warm.call("admit", node, {"protocol": "plaintext"}, None, b"")
    assert refused == {"refused": "client-1 refuses the run: protocol differs"}
    failed, _ = warm.call("serve", node, {}, state, b"fail")
    assert failed == {"error": "ValueError: asked to fail"}
    other = Warm(SERVE, ADMIT, supernode.pid, {**node, "client-id": "client-2"})
    assert other.path != warm.path  # each node of the host its own process

    supernode.kill()
    supernode.wait()
    deadline = time.monotonic() + 30
    while _listening(warm.path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listening(warm.path), "the warm process outlived its SuperNode"
    assert not warm.path.exists()  # nor is its socket left behind


def test_a_warm_process_that_cannot_start_is_named_with_its_log(supernode):
    node = {"client-id": "client-1"}
    warm = Warm("tests.federation.test_warm:no_such_function", None, supernode.pid, node)
    with pytest.raises(RuntimeError, match="(did not answer|ended before).*no_such_function"):
        warm.call("serve", node, {}, None, b"a")
    warm.path.with_suffix(".log").unlink()


@pytest.mark.parametrize("mode", [0o777, 0o750])
def test_a_warm_folder_others_can_enter_is_refused(tmp_path, monkeypatch, mode):
    """Adversary: another user of the node's machine who made the warm processes' folder first
    (or widened it), to plant a socket of their own that a ClientApp would hand the client's
    state and requests to. A folder that is not this user's alone is refused before any
    socket in it is used."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    folder = tmp_path / f"secureffm-warm-{os.getuid()}"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(PermissionError, match="must belong to this user alone"):
        Warm("secureffm.runs.flower_node:serve", None, os.getpid(), {"client-id": "client-1"})
