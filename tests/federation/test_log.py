"""The signed, hash-chained message log (secureffm/federation/log.py).

Truths used: SHA-256 of the bytes on disk (parties.json, each line) and Ed25519 verification
with `cryptography` against the keys pinned in parties.json.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secureffm.federation.crypto import new_key_pair
from secureffm.federation.log import PARTIES_FILE, PAYLOADS_FILE, MessageLog, canonical, genesis
from secureffm.federation.parties import Party, Registry


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parties() -> dict[str, Party]:
    return {p: Party(p) for p in ("server", "client-1", "client-2")}


def _log(tmp_path, parties, keep_payloads=False) -> MessageLog:
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads)
    log.register(Registry.of(list(parties.values())))
    return log


def _traffic(log: MessageLog, parties) -> None:
    """Two uploads, a broadcast and an event, each signed by the party that sends it."""
    log.append(parties["client-1"].envelope(1, "upload", "gradient", "server", b"g1"))
    log.append(parties["client-2"].envelope(1, "upload", "gradient", "server", b"g22"))
    log.append(parties["server"].envelope(2, "broadcast", "global_model", "client-1", b"theta"))
    log.event(parties["server"].event(2, "aggregate", "dropped", "client-2", "offline"))


def _lines(tmp_path) -> list[str]:
    return (tmp_path / "messages.jsonl").read_text().splitlines()


def test_register_pins_both_keys_of_each_party_and_only_before_the_first_record(tmp_path,
                                                                                parties):
    log = MessageLog(tmp_path / "messages.jsonl")
    seal = new_key_pair().public
    client, server = parties["client-1"].identity, parties["server"].identity
    log.register(Registry({"client-1": client.public}, {"client-1": seal}))
    log.register(Registry({"server": server.public}, {}))  # a later call adds parties
    pinned = json.loads((tmp_path / PARTIES_FILE).read_text())
    assert pinned == {"client-1": {"sign": client.public.hex(), "seal": seal.hex()},
                      "server": {"sign": server.public.hex()}}
    log.event(parties["server"].event(0, "setup", "note", "*", ""))
    with pytest.raises(RuntimeError, match="before the first record"):
        log.register(Registry({"client-2": parties["client-2"].identity.public}, {}))


def test_registry_of_parties_pins_both_public_keys_of_each(tmp_path, parties):
    log = _log(tmp_path, parties)
    pinned = json.loads((tmp_path / PARTIES_FILE).read_text())
    assert pinned == {p: {"sign": party.identity.public.hex(),
                          "seal": party.sealing.public.hex()} for p, party in parties.items()}
    assert log.close() is None


def test_each_record_links_to_the_previous_line_and_the_first_to_parties_json(tmp_path,
                                                                              parties):
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    log.close(parties["server"])
    lines = _lines(tmp_path)
    records = [json.loads(line) for line in lines]
    assert records[0]["prev"] == _sha((tmp_path / PARTIES_FILE).read_bytes())
    assert records[0]["prev"] == genesis((tmp_path / PARTIES_FILE).read_bytes())
    for before, record in zip(lines, records[1:], strict=False):
        assert record["prev"] == _sha(before.encode())
    assert [r["seq"] for r in records] == list(range(len(records)))


def test_every_record_is_signed_by_its_sender_over_its_content(tmp_path, parties):
    """The sender signs before the log places its record: every field but sig, seq, prev and
    the payload's offset in payloads.bin (which only the log's writer knows) is signed."""
    log = _log(tmp_path, parties, keep_payloads=True)
    _traffic(log, parties)
    log.close(parties["server"])
    keys = json.loads((tmp_path / PARTIES_FILE).read_text())
    for line in _lines(tmp_path):
        record = json.loads(line)
        assert ("offset" in record) == (record["kind"] != "event")
        body = {k: v for k, v in record.items() if k not in ("sig", "seq", "prev", "offset")}
        signed = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        assert canonical(record) == signed
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(keys[record["sender"]]["sign"]))
        public.verify(bytes.fromhex(record["sig"]), signed)  # raises when not the sender's
        # the place (seq, prev, offset) is left out: the same content elsewhere keeps its
        # signature (the closing record's chain pins seq and prev, the signed sha256 the bytes)
        moved = record | {"seq": record["seq"] + 7, "prev": "0" * 64, "offset": 99}
        assert canonical(moved) == signed


def test_the_closing_record_signs_the_chain_before_it(tmp_path, parties):
    """Its ``chain`` repeats its ``prev`` inside the server's signature, so the closer's key
    pins the place of every record that precedes it."""
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    log.close(parties["server"])
    lines = _lines(tmp_path)
    closing = json.loads(lines[-1])
    assert closing["chain"] == closing["prev"] == _sha(lines[-2].encode())
    assert closing["sender"] == "server"
    public = Ed25519PublicKey.from_public_bytes(parties["server"].identity.public)
    public.verify(bytes.fromhex(closing["sig"]), canonical(closing))
    with pytest.raises(InvalidSignature):
        public.verify(bytes.fromhex(closing["sig"]), canonical(closing | {"chain": "0" * 64}))


def test_an_empty_log_closes_on_the_hash_of_parties_json(tmp_path, parties):
    log = _log(tmp_path, parties)
    head = log.close(parties["server"])
    [line] = _lines(tmp_path)
    closing = json.loads(line)
    genesis_hash = _sha((tmp_path / PARTIES_FILE).read_bytes())
    assert closing["chain"] == closing["prev"] == genesis_hash and closing["records"] == 0
    assert head == _sha(line.encode())


def test_a_delivery_record_states_what_crossed_the_engine(tmp_path, parties):
    log = _log(tmp_path, parties, keep_payloads=True)
    log.append(parties["server"].envelope(3, "relay", "model", "client-2", b"sealed",
                                          ("sealed",), origin="client-1"))
    log.append(parties["server"].envelope(3, "relay", "model", "client-1", b"other"))
    log.close()
    first, second = (json.loads(line) for line in _lines(tmp_path))
    assert {k: first[k] for k in ("round", "phase", "kind", "sender", "recipient", "stages",
                                  "bytes", "sha256", "origin", "offset")} == {
        "round": 3, "phase": "relay", "kind": "model", "sender": "server",
        "recipient": "client-2", "stages": ["sealed"], "bytes": 6, "sha256": _sha(b"sealed"),
        "origin": "client-1", "offset": 0}
    assert "origin" not in second and second["offset"] == 6
    assert (tmp_path / PAYLOADS_FILE).read_bytes() == b"sealedother"


def test_close_writes_the_count_and_returns_the_sha256_of_the_closing_line(tmp_path, parties):
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    head = log.close(parties["server"])
    closing = _lines(tmp_path)[-1]
    assert head == _sha(closing.encode()) == log.head
    record = json.loads(closing)
    assert (record["event"], record["records"], record["seq"], record["round"]) == (
        "closed", 4, 4, 2)
    assert log.close(parties["server"]) == head  # closing twice writes nothing more
    assert len(_lines(tmp_path)) == 5


def test_a_log_closed_without_a_closer_has_no_closing_record_and_no_head(tmp_path, parties):
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    assert log.close() is None
    assert all(json.loads(line).get("event") != "closed" for line in _lines(tmp_path))


def test_summary_counts_messages_bytes_and_events(tmp_path, parties):
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    assert log.summary() == {
        "kinds": {"global_model": {"messages": 1, "bytes": 5},
                  "gradient": {"messages": 2, "bytes": 5}},
        "events": {"dropped": 1}}
