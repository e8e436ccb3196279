"""Each party's long-term keys on disk, and the registry every party pins (for engines whose
parties run in processes of their own).

:func:`provision` makes fresh keys (OS entropy) for the server and the clients: one file per
party, ``<id>.key`` (mode 0600: the private Ed25519 and X25519 keys, hex JSON), and
``parties.json``, the public keys in federation order (server first), in the format of a run's
parties.json. Give each party only its own key file and everyone the same parties.json; a
party loads its own keys (:func:`load_party_keys`) and pins the registry
(:func:`load_registry`), so no server ever relays the keys it is checked against.
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

__all__ = ["provision", "load_party_keys", "load_registry", "REGISTRY_FILE"]

REGISTRY_FILE = "parties.json"
_RAW = serialization.Encoding.Raw


def _key_file(folder: Path, party: str) -> Path:
    return folder / f"{party}.key"


def provision(folder: str | Path, clients: list[str]) -> Registry:
    """Fresh keys for the server and ``clients`` written to ``folder`` (which must not hold
    keys already); returns the registry written to its parties.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.glob("*.key")):
        raise ConfigError(f"{folder} already holds key files; provision into an empty folder")
    sign, seal = {}, {}
    for party in [SERVER, *clients]:
        identity, sealing = Identity(), new_key_pair()
        path = _key_file(folder, party)
        path.touch(mode=0o600)
        path.write_text(json.dumps({"party": party, "sign": identity._private.private_bytes(
            _RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()).hex(),
            "seal": private_bytes(sealing.private).hex()}))
        sign[party], seal[party] = identity.public, sealing.public
    (folder / REGISTRY_FILE).write_text(json.dumps(
        {p: {"sign": sign[p].hex(), "seal": seal[p].hex()} for p in sign}, indent=1))
    return Registry(sign, seal)


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
