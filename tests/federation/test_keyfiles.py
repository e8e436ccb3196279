"""Provisioned key files and the pinned parties.json (secureffm/federation/keyfiles.py).

Truths used: file modes from ``os.stat``, the JSON of parties.json as written on disk, and
Ed25519 / X25519 from `cryptography` (a signature made with a loaded key verifies against the
registry's public key with Ed25519PublicKey.verify; an X25519 exchange with the loaded sealing
key agrees with one made against the registry's public key).
"""

from __future__ import annotations

import json
import stat

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from secureffm.errors import ConfigError
from secureffm.federation.keyfiles import (
    REGISTRY_FILE,
    load_party_keys,
    load_registry,
    provision,
)
from secureffm.federation.message import SERVER


def clients(n: int) -> list[str]:
    return [f"client-{i}" for i in range(1, n + 1)]


def test_one_private_key_file_per_party_readable_by_its_owner_only(tmp_path):
    provision(tmp_path, clients(3))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted([f"{p}.key" for p in [SERVER, *clients(3)]] + [REGISTRY_FILE])
    for party in [SERVER, *clients(3)]:
        mode = stat.S_IMODE((tmp_path / f"{party}.key").stat().st_mode)
        assert mode & 0o077 == 0, (party, oct(mode))  # no group or other access
        assert json.loads((tmp_path / f"{party}.key").read_text())["party"] == party


def test_parties_json_lists_the_server_then_clients_in_federation_order_past_nine(tmp_path):
    """Sorted order would put client-10 before client-2, and secure aggregation pairs (who adds
    and who subtracts a mask) by the registry's order: every party must read the same one."""
    ids = clients(12)
    returned = provision(tmp_path, ids)
    on_disk = list(json.loads((tmp_path / REGISTRY_FILE).read_text()))
    assert on_disk == [SERVER, *ids] != [SERVER, *sorted(ids)]
    loaded = load_registry(tmp_path)
    assert list(loaded.sign) == list(loaded.seal) == list(returned.sign) == [SERVER, *ids]
    assert loaded == returned


def test_loaded_keys_sign_and_open_against_the_registry(tmp_path):
    registry = provision(tmp_path, clients(2))
    message = b"round 1 upload"
    for party in [SERVER, *clients(2)]:
        identity, sealing = load_party_keys(tmp_path, party)
        assert identity.public == registry.sign[party]
        Ed25519PublicKey.from_public_bytes(registry.sign[party]).verify(
            identity.sign(message), message)
        peer = X25519PrivateKey.generate()
        assert sealing.private.exchange(peer.public_key()) == peer.exchange(
            X25519PublicKey.from_public_bytes(registry.seal[party]))
    first, _ = load_party_keys(tmp_path, "client-1")
    with pytest.raises(InvalidSignature):
        Ed25519PublicKey.from_public_bytes(registry.sign["client-2"]).verify(
            first.sign(message), message)


def test_two_provisionings_draw_different_keys(tmp_path):
    a = provision(tmp_path / "a", clients(2))
    b = provision(tmp_path / "b", clients(2))
    assert not set(a.sign.values()) & set(b.sign.values())
    assert not set(a.seal.values()) & set(b.seal.values())


def test_the_key_file_of_another_party_is_refused_naming_the_file(tmp_path):
    provision(tmp_path, clients(2))
    (tmp_path / "client-1.key").write_text((tmp_path / "client-2.key").read_text())
    with pytest.raises(ConfigError, match=r"client-1\.key.*keys of 'client-2'"):
        load_party_keys(tmp_path, "client-1")


def test_a_missing_key_file_is_refused_naming_the_file(tmp_path):
    provision(tmp_path, clients(2))
    with pytest.raises(ConfigError, match=r"client-3's keys from .*client-3\.key"):
        load_party_keys(tmp_path, "client-3")


@pytest.mark.parametrize("content", ["", "{not json", '{"party": "client-1"}',
                                     '{"party": "client-1", "sign": "zz", "seal": "00"}',
                                     '{"party": "client-1", "sign": "00", "seal": "00"}'])
def test_a_corrupt_key_file_is_refused_naming_the_file(tmp_path, content):
    provision(tmp_path, clients(1))
    (tmp_path / "client-1.key").write_text(content)
    with pytest.raises(ConfigError, match=r"client-1\.key"):
        load_party_keys(tmp_path, "client-1")


@pytest.mark.parametrize("content", ["[1, 2]", '"client-1"', "3"])
def test_a_key_file_holding_json_that_is_not_an_object_is_refused_naming_the_file(tmp_path,
                                                                                  content):
    provision(tmp_path, clients(1))
    (tmp_path / "client-1.key").write_text(content)
    with pytest.raises(ConfigError, match=r"client-1\.key"):
        load_party_keys(tmp_path, "client-1")


@pytest.mark.parametrize("content", ["", "[1]", '{"server": {"sign": "zz"}}',
                                     '{"server": "x"}'])
def test_a_corrupt_registry_is_refused_naming_the_file(tmp_path, content):
    provision(tmp_path, clients(1))
    (tmp_path / REGISTRY_FILE).write_text(content)
    with pytest.raises(ConfigError, match=r"parties\.json"):
        load_registry(tmp_path)


def test_provisioning_into_a_folder_that_holds_keys_is_refused_and_keeps_them(tmp_path):
    provision(tmp_path, clients(2))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="already holds key files"):
        provision(tmp_path, clients(2))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
