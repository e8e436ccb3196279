"""TLS certificates and SuperNode authentication keys for a Flower deployment
(secureffm/federation/flower_tls.py).

Adversary: a machine that answers in the SuperLink's place (on the path, or at its address).
A client trusting only the deployment's ca.pem completes a TLS handshake with the SuperLink's
certificate, at each name and address it was made for, and refuses one signed by another CA
and a name the certificate does not hold. Truths used: Python's ``ssl`` (OpenSSL) handshake
over a local socket pair, and ``cryptography``'s OpenSSH key loader (what Flower reads).

The deployment test (``slow``) plays a machine that is not a registered SuperNode against a
real SuperLink and SuperNodes (:class:`~secureffm.federation.flower.LocalDeployment`); one that
holds a registered node's stolen key is played in tests/runs/test_flower_rejoin_tls.py.
"""

from __future__ import annotations

import json
import socket
import ssl
import stat
import subprocess
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_ssh_private_key,
    load_ssh_public_key,
)

from secureffm.errors import ConfigError
from secureffm.federation.flower_tls import AUTH_KEY_FILE, make_certificates, make_node_auth_key


def _handshake(paths: dict, ca, name: str) -> None:
    """A TLS handshake of a client trusting ``ca`` only, asking for ``name``, with a server
    presenting ``paths``' certificate; raises ssl.SSLError when the client refuses it."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths["cert"], paths["key"])
    client = ssl.create_default_context(cafile=str(ca))
    left, right = socket.socketpair()
    served = threading.Thread(target=lambda: _serve(server, right), daemon=True)
    served.start()
    try:
        with client.wrap_socket(left, server_hostname=name):
            pass
    finally:
        served.join(5)
        right.close()


def _serve(context: ssl.SSLContext, sock: socket.socket) -> None:
    try:
        with context.wrap_socket(sock, server_side=True):
            pass
    except (ssl.SSLError, OSError):
        pass  # the client refused: its side raises


def test_a_node_trusting_the_deployments_ca_accepts_the_superlink_and_no_impostor(tmp_path):
    paths = make_certificates(tmp_path / "certs", ["localhost", "127.0.0.1"])
    for name in ("localhost", "127.0.0.1"):
        _handshake(paths, paths["ca"], name)
    impostor = make_certificates(tmp_path / "other", ["localhost", "127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake(impostor, paths["ca"], "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(paths, paths["ca"], "superlink.example.org")
    assert stat.S_IMODE(paths["key"].stat().st_mode) & 0o077 == 0


def test_certificates_are_not_made_over_existing_ones(tmp_path):
    paths = make_certificates(tmp_path, ["localhost"])
    before = paths["key"].read_bytes()
    with pytest.raises(ConfigError, match="already holds certificates"):
        make_certificates(tmp_path, ["localhost"])
    assert paths["key"].read_bytes() == before


def test_a_node_auth_key_is_a_p384_openssh_pair_readable_by_its_owner_only(tmp_path):
    private, public = make_node_auth_key(tmp_path)
    key = load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert load_ssh_public_key(public.read_bytes()).public_numbers() == \
        key.public_key().public_numbers()
    assert stat.S_IMODE(private.stat().st_mode) & 0o077 == 0
    with pytest.raises(ConfigError, match="exists already"):
        make_node_auth_key(tmp_path)


def _online(deployment) -> int:
    """How many SuperNodes the SuperLink lists online (``flwr supernode ls``)."""
    listed = json.loads(deployment._flwr("supernode", "ls", "local", "--format", "json"))
    return sum(node["status"] == "online" for node in listed["nodes"])


def _refused(node: subprocess.Popen, log, code: int) -> None:
    """The intruder gave up with Flower's exit code 305 and the SuperLink's error ``code``."""
    assert node.wait(timeout=300) != 0, log.read_text()
    assert "Exit Code: 305" in log.read_text() and f"[code: {code}]" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("node_auth", [True, False])
def test_a_supernode_nobody_registered_is_refused_by_the_superlink(tmp_path, node_auth):
    """Adversary: a machine on the network that is not a registered SuperNode. It holds the
    deployment's ca.pem, so TLS does not keep it out, and either a key of make_node_auth_key
    that nobody registered with ``flwr supernode register`` or no key at all; it runs the same
    ClientApp and calls itself ``intruder-*``. With SuperNode authentication on, the SuperLink
    refuses both before they become nodes (the keyed one's activation: no node has its key;
    the keyless one's self-registration: disabled): each exits with Flower's code 305 before
    the run is submitted, so it receives no message; the SuperLink logs each refusal (ApiError
    2004, 2001) and lists only the registered nodes, and the run's hello finds and calls only
    them.
    With authentication off (``node_auth=False``, the same TLS deployment) the keyless
    intruder registers itself, is listed, answers hello and is called: the attack succeeds
    (the unregistered key still fails there: no node was made for it)."""
    pytest.importorskip("flwr")
    from secureffm.federation import flower

    home = tmp_path / "flwr"
    with flower.LocalDeployment("tests.federation.flower_toy:met",
                                "tests.federation.flower_toy:serve", ["client-1", "client-2"],
                                home=str(home), tls=True, node_auth=node_auth) as deployment:
        (home / "stolen").mkdir()
        make_node_auth_key(home / "stolen")
        keyed = deployment.start_node("intruder-keyed", home / "stolen" / AUTH_KEY_FILE)
        keyless = deployment.start_node("intruder-keyless")
        _refused(keyed, home / "intruder-keyed.log", 2004)  # activation: no such node
        if node_auth:
            _refused(keyless, home / "intruder-keyless.log", 2001)  # registration: disabled
        for _ in range(300):  # until the registered nodes (and a keyless one let in) are up
            if _online(deployment) == 3 - node_auth:
                break
            assert node_auth or keyless.poll() is None, (home / "intruder-keyless.log").read_text()
            time.sleep(1)
        listed = _online(deployment)
        result = deployment.run({"clients": 2, "timeout": 120.0}, timeout=500)
        link = (home / "superlink.log").read_text()
    assert "[ApiError:2004]" in link and "No SuperNode found with the given public key" in link
    assert ("[ApiError:2001]" in link) == node_auth
    registered = ["client-1", "client-2"]
    if node_auth:
        assert listed == 2 and result == {"nodes": registered, "answered": registered}
    else:  # the attack succeeds: the intruder is a node of the run and is called
        both = [*registered, "intruder-keyless"]
        assert listed == 3 and result == {"nodes": both, "answered": both}
