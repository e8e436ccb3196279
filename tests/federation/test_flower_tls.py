"""TLS certificates and SuperNode authentication keys for a Flower deployment
(secureffm/federation/flower_tls.py).

Adversary: a machine that answers in the SuperLink's place (on the path, or at its address).
A client trusting only the deployment's ca.pem completes a TLS handshake with the SuperLink's
certificate, at each name and address it was made for, and refuses one signed by another CA
and a name the certificate does not hold. Truths used: Python's ``ssl`` (OpenSSL) handshake
over a local socket pair, and ``cryptography``'s OpenSSH key loader (what Flower reads).
"""

from __future__ import annotations

import socket
import ssl
import stat
import threading

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_ssh_private_key,
    load_ssh_public_key,
)

from secureffm.errors import ConfigError
from secureffm.federation.flower_tls import make_certificates, make_node_auth_key


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
