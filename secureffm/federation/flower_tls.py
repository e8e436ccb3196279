"""What Flower's transport needs for a deployment, made with ``cryptography``: TLS certificates
for the SuperLink and each SuperNode's authentication key.

- :func:`make_certificates`: a fresh certificate authority (``ca.pem``, the root every
  SuperNode and ``flwr`` trust) and the SuperLink's certificate signed by it (``superlink.pem``,
  its key ``superlink.key``, mode 0600), valid for the given host names and IP addresses
  (subject alternative names; Flower's own processes reach the SuperLink at 127.0.0.1). The CA's
  private key is not written: renewing means a new CA, handed to every party again.
- :func:`make_node_auth_key`: a SuperNode's key pair for Flower's node authentication (EC P-384
  in OpenSSH format, as ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode
  register`` read them).

Neither replaces our own keys (:mod:`~secureffm.federation.keyfiles`): every message of ours is
signed with those. TLS hides the wire from others; node authentication keeps machines whose key
the SuperLink's operator did not register from connecting, and binds a node's Flower id to its
key: a SuperNode started with a registered key is that node (a restarted one comes back as
itself, once the SuperLink lists it offline), so whoever steals the key receives that node's
messages, and is still refused by name for every reply its client did not sign (docs/flower.md).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import ConfigError

__all__ = ["make_certificates", "make_node_auth_key", "CA_FILE", "CERT_FILE", "KEY_FILE",
           "AUTH_KEY_FILE", "AUTH_PUBLIC_FILE"]

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "superlink.pem", "superlink.key"
AUTH_KEY_FILE, AUTH_PUBLIC_FILE = "supernode-auth.key", "supernode-auth.pub"


def _private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (mode 0600)."""
    path.touch(mode=0o600)
    path.write_bytes(data)


def _names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_certificates(folder: str | Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    """A fresh CA and the SuperLink's certificate for ``hosts`` (names or IP addresses), valid
    for ``days`` days, in ``folder`` (which must not hold them already): file role -> path
    (``ca``, ``cert``, ``key``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ca": folder / CA_FILE, "cert": folder / CERT_FILE, "key": folder / KEY_FILE}
    if any(p.exists() for p in paths.values()):
        raise ConfigError(f"{folder} already holds certificates; make them in an empty folder")
    if not hosts:
        raise ConfigError("name at least one host the SuperLink is reached at (--host)")
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secureffm deployment CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA384()))
    pem = serialization.Encoding.PEM
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["cert"].write_bytes(cert.public_bytes(pem))
    _private(paths["key"], key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    return paths


def make_node_auth_key(folder: str | Path) -> tuple[Path, Path]:
    """A SuperNode's fresh authentication key pair in ``folder``: (private key path, mode
    0600; public key path, the one to register with ``flwr supernode register``)."""
    folder = Path(folder)
    private, public = folder / AUTH_KEY_FILE, folder / AUTH_PUBLIC_FILE
    if private.exists():
        raise ConfigError(f"{private} exists already; make a node's key in an empty folder")
    key = ec.generate_private_key(ec.SECP384R1())
    _private(private, key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public
