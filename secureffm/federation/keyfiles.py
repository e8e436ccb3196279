"""Each party's long-term keys on disk, and the registry every party pins (for engines whose
parties run in processes of their own).

:func:`provision` makes fresh keys (OS entropy) for the server and the clients: one file per
party, ``<id>.key`` (mode 0600: the private Ed25519 and X25519 keys, hex JSON), and
``parties.json``, the public keys in federation order (server first), in the format of a run's
parties.json. :func:`provision_parties` writes the same into one folder per party,
``<id>/<id>.key`` and ``<id>/parties.json``, so that each party is handed only its own folder
(what ``secureffm flower-keys`` does). A party loads its own keys (:func:`load_party_keys`) and
pins the registry (:func:`load_registry`), so no server ever relays the keys it is checked
against.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import ConfigError
from .crypto import Identity, KeyPair, new_key_pair, private_bytes, private_from_bytes
from .message import SERVER
from .parties import Registry

__all__ = ["provision", "provision_parties", "load_party_keys", "load_registry",
           "REGISTRY_FILE"]

REGISTRY_FILE = "parties.json"
_RAW = serialization.Encoding.Raw


def _key_file(folder: Path, party: str) -> Path:
    return folder / f"{party}.key"


def _fresh(clients: list[str]) -> tuple[dict[str, str], Registry]:
    """Fresh keys of the server and ``clients``: each party's key-file text, and the registry."""
    texts, sign, seal = {}, {}, {}
    for party in [SERVER, *clients]:
        identity, sealing = Identity(), new_key_pair()
        texts[party] = json.dumps({"party": party, "sign": identity._private.private_bytes(
            _RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()).hex(),
            "seal": private_bytes(sealing.private).hex()})
        sign[party], seal[party] = identity.public, sealing.public
    return texts, Registry(sign, seal)


def _write(folder: Path, party: str, text: str) -> None:
    """``party``'s key file in ``folder``, readable by its owner only (mode 0600)."""
    path = _key_file(folder, party)
    path.touch(mode=0o600)
    path.write_text(text)


def _write_registry(folder: Path, registry: Registry) -> None:
    (folder / REGISTRY_FILE).write_text(json.dumps(
        {p: {"sign": registry.sign[p].hex(), "seal": registry.seal[p].hex()}
         for p in registry.sign}, indent=1))


def _empty(folder: Path, pattern: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.glob(pattern)):
        raise ConfigError(f"{folder} already holds key files; provision into an empty folder")


def provision(folder: str | Path, clients: list[str]) -> Registry:
    """Fresh keys for the server and ``clients`` written to ``folder`` (which must not hold
    keys already); returns the registry written to its parties.json."""
    folder = Path(folder)
    _empty(folder, "*.key")
    texts, registry = _fresh(clients)
    for party, text in texts.items():
        _write(folder, party, text)
    _write_registry(folder, registry)
    return registry


def provision_parties(folder: str | Path, clients: list[str]) -> Registry:
    """Fresh keys for the server and ``clients``, one folder per party: ``folder/<id>/``
    holds that party's key file and parties.json only (``folder`` must not hold keys already);
    returns the registry."""
    folder = Path(folder)
    _empty(folder, "**/*.key")
    texts, registry = _fresh(clients)
    for party, text in texts.items():
        (folder / party).mkdir(mode=0o700, exist_ok=True)
        _write(folder / party, party, text)
        _write_registry(folder / party, registry)
    return registry


def load_party_keys(folder: str | Path, party: str) -> tuple[Identity, KeyPair]:
    """``party``'s own signing identity and sealing key pair from ``folder``."""
    path = _key_file(Path(folder), party)
    try:
        table = json.loads(path.read_text())
        if table.get("party") != party:
            raise ValueError(f"it holds the keys of {table.get('party')!r}")
        identity = Identity(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(table["sign"])))
        sealing = KeyPair(private_from_bytes(bytes.fromhex(table["seal"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"cannot load {party}'s keys from {path}: {err}; provision them with "
                          "secureffm.federation.keyfiles.provision") from None
    return identity, sealing


def load_registry(folder: str | Path) -> Registry:
    """The pinned public keys of ``folder``'s parties.json, in its order."""
    path = Path(folder) / REGISTRY_FILE
    try:
        table = json.loads(path.read_text())
        return Registry({p: bytes.fromhex(k["sign"]) for p, k in table.items()},
                        {p: bytes.fromhex(k["seal"]) for p, k in table.items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"cannot read the registry {path}: {err}") from None
