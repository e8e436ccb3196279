"""The signed, hash-chained message log (secureffm/federation/log.py).

Truths used: SHA-256 of the bytes on disk (parties.json, each line) and Ed25519 verification
with `cryptography` against the keys pinned in parties.json.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from secureffm.federation.crypto import Identity, new_key_pair
from secureffm.federation.log import PARTIES_FILE, PAYLOADS_FILE, MessageLog, canonical, genesis
from secureffm.federation.message import Envelope


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parties():
    return {"server": Identity(), "client-1": Identity(), "client-2": Identity()}


def _log(tmp_path, parties, keep_payloads=False) -> MessageLog:
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads)
    log.register({p: i.public for p, i in parties.items()},
                 {p: new_key_pair().public for p in parties if p != "server"})
    return log


def _traffic(log: MessageLog, parties) -> None:
    """Two uploads, a broadcast and an event."""
    log.append(Envelope("gradient", "client-1", "server", 1, "upload", b"g1"), parties["client-1"])
    log.append(Envelope("gradient", "client-2", "server", 1, "upload", b"g22"),
               parties["client-2"])
    log.append(Envelope("global_model", "server", "client-1", 2, "broadcast", b"theta"),
               parties["server"])
    log.event(2, "aggregate", "dropped", "client-2", "offline", parties["server"])


def _lines(tmp_path) -> list[str]:
    return (tmp_path / "messages.jsonl").read_text().splitlines()


def test_register_pins_both_keys_of_each_party_and_only_before_the_first_record(tmp_path,
                                                                                parties):
    log = MessageLog(tmp_path / "messages.jsonl")
    seal = new_key_pair().public
    log.register({"client-1": parties["client-1"].public}, {"client-1": seal})
    log.register({"server": parties["server"].public})  # a later call adds parties
    pinned = json.loads((tmp_path / PARTIES_FILE).read_text())
    assert pinned == {"client-1": {"sign": parties["client-1"].public.hex(), "seal": seal.hex()},
                      "server": {"sign": parties["server"].public.hex()}}
    log.event(0, "setup", "note", "*", "", parties["server"])
    with pytest.raises(RuntimeError, match="before the first record"):
        log.register({"client-2": parties["client-2"].public})


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


def test_every_record_is_signed_by_its_sender_over_the_other_fields(tmp_path, parties):
    log = _log(tmp_path, parties)
    _traffic(log, parties)
    keys = json.loads((tmp_path / PARTIES_FILE).read_text())
    for line in _lines(tmp_path):
        record = json.loads(line)
        body = {k: v for k, v in record.items() if k != "sig"}
        signed = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        assert canonical(record) == signed
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(keys[record["sender"]]["sign"]))
        public.verify(bytes.fromhex(record["sig"]), signed)  # raises when not the sender's


def test_a_delivery_record_states_what_crossed_the_engine(tmp_path, parties):
    log = _log(tmp_path, parties, keep_payloads=True)
    log.append(Envelope("model", "server", "client-2", 3, "relay", b"sealed", ("sealed",),
                        origin="client-1"), parties["server"])
    log.append(Envelope("model", "server", "client-1", 3, "relay", b"other"), parties["server"])
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
