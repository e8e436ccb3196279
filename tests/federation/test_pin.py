"""Keys and pins kept apart from a run (secureffm/federation/pin.py).

Truths used: SHA-256 of the bytes and of canonical JSON computed here with hashlib and json,
and parties.json as MessageLog.register writes it.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from secureffm.errors import SecureFFMError
from secureffm.federation.crypto import Identity, new_key_pair
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Registry
from secureffm.federation.pin import (
    PartyKeys,
    RunPin,
    is_hex,
    load_parties,
    load_pin,
    parse_parties,
    pin_of,
    sha256_hex,
)

SIGN, SEAL = bytes(range(32)), bytes(range(32, 64))


def _run(tmp_path) -> tuple:
    """A run folder whose parties.json the log wrote: a server and one client."""
    log = MessageLog(tmp_path / "run" / "messages.jsonl")
    server, client = Identity(), Identity()
    seal = new_key_pair().public
    log.register(Registry({"server": server.public, "client-1": client.public},
                          {"client-1": seal}))
    log.close()
    return tmp_path / "run", {"server": (server.public, None), "client-1": (client.public, seal)}


def test_is_hex_accepts_only_lowercase_hex_of_the_length():
    assert is_hex("0a" * 32, 64) and sha256_hex(b"x") == hashlib.sha256(b"x").hexdigest()
    assert not is_hex("0A" * 32, 64) and not is_hex("0a" * 31, 64)
    assert not is_hex("zz" * 32, 64) and not is_hex(b"0a" * 32, 64) and not is_hex(None, 64)


def test_a_fingerprint_is_the_sha256_of_the_entry_as_canonical_json():
    both, sign_only = PartyKeys(SIGN, SEAL), PartyKeys(SIGN, None)
    assert both.entry() == {"sign": SIGN.hex(), "seal": SEAL.hex()}
    assert sign_only.entry() == {"sign": SIGN.hex()}
    text = '{"seal":"' + SEAL.hex() + '","sign":"' + SIGN.hex() + '"}'
    assert both.fingerprint == hashlib.sha256(text.encode()).hexdigest()
    assert sign_only.fingerprint != both.fingerprint


def test_the_parties_json_a_log_writes_parses_back_to_its_keys(tmp_path):
    run, keys = _run(tmp_path)
    parties, text = load_parties(run / "parties.json")
    assert text == (run / "parties.json").read_bytes()
    assert {p: (k.sign, k.seal) for p, k in parties.items()} == keys


@pytest.mark.parametrize("text, fragment", [
    (b"{not json", "is not valid JSON"),
    (b"\xff", "is not valid JSON"),
    (b"[1, 2]", "must map party id"),
    (b'{"c": {"sign": "' + b"AB" * 32 + b'"}}', "the keys of 'c' must be"),
    (b'{"c": {"sign": "' + b"ab" * 31 + b'"}}', "the keys of 'c' must be"),
    (b'{"c": {"seal": "' + b"ab" * 32 + b'"}}', "the keys of 'c' must be"),
    (b'{"c": {"sign": "' + b"ab" * 32 + b'", "seal": 1}}', "the keys of 'c' must be"),
    (b'{"c": {"sign": "' + b"ab" * 32 + b'", "role": "x"}}', "the keys of 'c' must be"),
])
def test_a_malformed_parties_file_is_refused_naming_where(text, fragment):
    with pytest.raises(SecureFFMError, match=f"here.*{fragment}"):
        parse_parties(text, "here")


def test_pin_of_pins_the_head_the_file_and_each_partys_keys(tmp_path):
    run, keys = _run(tmp_path)
    pin = pin_of(run, "ab" * 32)
    assert pin.head == "ab" * 32
    assert pin.parties_sha256 == hashlib.sha256((run / "parties.json").read_bytes()).hexdigest()
    assert pin.fingerprints == {p: PartyKeys(*k).fingerprint for p, k in keys.items()}


def test_key_differences_name_added_removed_and_changed_parties(tmp_path):
    run, _ = _run(tmp_path)
    pin = pin_of(run, "ab" * 32)
    parties, text = load_parties(run / "parties.json")
    assert pin.key_differences(parties, text) is None
    changed = dict(parties, **{"client-1": PartyKeys(SIGN, SEAL),
                               "mallory": PartyKeys(SIGN, None)})
    del changed["server"]
    assert pin.key_differences(changed, text) == (
        "parties added: mallory; parties removed: server; "
        "party client-1's keys differ from the pinned ones")
    assert pin.key_differences(parties, text + b" ") == (
        "parties.json was rewritten: its sha256 differs from the pinned one")
    assert RunPin().key_differences(changed, b"anything") is None  # nothing pinned


def test_a_pin_file_and_a_parties_json_copy_both_load(tmp_path):
    run, _ = _run(tmp_path)
    pin = pin_of(run, "cd" * 32)
    (tmp_path / "pin.json").write_text(json.dumps(pin.as_dict()))
    assert load_pin(tmp_path / "pin.json") == pin
    copy = tmp_path / "parties-copy.json"
    copy.write_bytes((run / "parties.json").read_bytes())
    assert load_pin(copy) == RunPin(fingerprints=pin.fingerprints)


@pytest.mark.parametrize("content, fragment", [
    (None, "is missing"),
    ("{", "is not valid JSON"),
    ('{"head": "xyz", "parties_sha256": "' + "ab" * 32 + '", "fingerprints": {}}',
     "a pin needs head and parties_sha256 as 64 hex digits"),
    ('{"head": "' + "ab" * 32 + '", "parties_sha256": "' + "ab" * 32
     + '", "fingerprints": {"c": "no"}}', "fingerprints mapping party -> 64 hex digits"),
    ('{"head": "x"}', "neither a pin file nor a parties.json copy"),
])
def test_a_bad_pin_file_is_refused_saying_what_it_needs(tmp_path, content, fragment):
    path = tmp_path / "pin.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SecureFFMError, match=fragment):
        load_pin(path)
