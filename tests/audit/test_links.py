"""Signed back links: each record a party signs carries ``last``, the sha256 of the bytes it
signed for its previous record, and the audit authenticates a record through a later record
of the same sender that links to it, verifying one signature at the end of each chain."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from secureffm.audit import verify as verify_module
from secureffm.audit import verify_run
from secureffm.cli import main as cli_main
from secureffm.federation import SERVER, MessageLog, Party, Registry
from secureffm.federation.log import canonical
from secureffm.federation.message import link_of
from secureffm.protocols.wire import json_payload, payload_json
from tests.audit.test_verify import Run, assert_first_bad, build_run, dump, rechain, resign


@pytest.fixture(scope="module")
def secagg_run(tmp_path_factory) -> Run:
    return build_run(tmp_path_factory.mktemp("links") / "secagg", "secagg")


@pytest.fixture
def run(secagg_run, tmp_path) -> Run:
    return secagg_run.copy(tmp_path / "run")


def reclose(run: Run, records: list[dict]) -> None:
    """Write ``records`` rechained, the closing record re-signed by the server over the new
    chain (what the server's key holder with write access to the folder can do)."""
    lines = rechain(run, records)
    closing = json.loads(lines[-1])
    lines[-1] = dump(resign(closing | {"chain": closing["prev"]}, run.keys[SERVER]))
    run.write(lines)


def test_an_intact_log_needs_one_signature_per_sender(secagg_run):
    records = secagg_run.records()
    senders = {r["sender"] for r in records}
    report = verify_run(secagg_run.path)
    assert report.ok, report.first_bad
    assert report.records == len(records) and report.records - report.linked == len(senders)
    every = verify_run(secagg_run.path, links=False)
    assert every.ok and every.linked == 0 and every.records == report.records
    assert f"signatures: {len(senders)} verified" in report.summary()


def keyed_log(folder: Path, parties: tuple[str, ...]) -> tuple[MessageLog, dict[str, Party]]:
    keys = {party: Party(party) for party in parties}
    log = MessageLog(folder / "messages.jsonl")
    log.register(Registry({p: key.identity.public for p, key in keys.items()},
                          {p: key.sealing.public for p, key in keys.items()}))
    return log, keys


def test_links_hold_when_the_log_writes_messages_out_of_signing_order(tmp_path):
    """The engine may log a party's messages in another order than it signed them (the
    server signs the shares it relays before the broadcasts the log writes first): a link may
    name a record the log writes later. Three messages logged last-signed first are authenticated
    by the signature of the one signed last."""
    log, keys = keyed_log(tmp_path, (SERVER, "client-1"))
    signed = [keys["client-1"].envelope(1, "upload", "gradient", SERVER, bytes([i]))
              for i in range(3)]
    for envelope in (signed[2], signed[0], signed[1]):
        log.append(envelope)
    log.close(keys[SERVER])
    report = verify_run(tmp_path)
    assert report.ok, report.first_bad
    assert (report.records, report.linked) == (4, 2)


def test_an_edited_linked_record_is_caught_by_its_own_signature(run):
    """Adversary: the server's key holder who can write the run folder. It edits the round of
    client-2's masked input in the middle of the log, rechains and re-signs the closing record.
    client-2's next record links to the bytes client-2 signed, not to the edited ones, so no
    link names the edited record and its signature is verified: the audit fails there, as when
    every signature is verified."""
    records = run.records()
    k = next(r["seq"] for r in records if r["sender"] == "client-2" and r["round"] == 1
             and r["phase"] == "masked_input")
    records[k] = records[k] | {"round": 2}
    reclose(run, records)
    for links in (True, False):
        assert_first_bad(verify_run(run.path, links=links), k, k + 1,
                         f"record {k}: signature does not verify with client-2's key")


def test_a_party_cannot_vouch_for_another_partys_record(tmp_path):
    """Adversary: a malicious client-1 who also writes the log (colluding with the server's
    key holder). It logs a message claiming to be client-2's under a garbage signature and
    signs its own next message with ``last`` set to that record's hash, so that a link would
    authenticate it. A link counts only between two records of the same sender: the forged
    record's own signature is verified and fails. (Without that rule the log verified.)"""
    log, keys = keyed_log(tmp_path, (SERVER, "client-1", "client-2"))
    log.append(keys["client-2"].envelope(1, "upload", "gradient", SERVER, b"honest"))
    forged = keys["client-2"].envelope(1, "upload", "gradient", SERVER, b"forged")
    forged = forged.signed(bytes(64))
    log.append(forged)
    keys["client-1"].last = link_of(canonical(forged.header()))
    log.append(keys["client-1"].envelope(1, "upload", "gradient", SERVER, b"mine"))
    log.close(keys[SERVER])
    assert_first_bad(verify_run(tmp_path), 1, 2,
                     "record 1: signature does not verify with client-2's key")


def test_records_no_link_names_are_each_verified(tmp_path):
    """A sender whose records carry no links (a party that lost its state between messages)
    has every record's signature verified; a bad one among them is named."""
    log, keys = keyed_log(tmp_path, (SERVER, "client-1"))
    for r in range(1, 6):
        keys["client-1"].last = ""
        envelope = keys["client-1"].envelope(r, "upload", "gradient", SERVER, b"x")
        log.append(envelope.signed(bytes(64)) if r == 3 else envelope)
    log.close(keys[SERVER])
    assert_first_bad(verify_run(tmp_path), 2, 3,
                     "record 2: signature does not verify with client-1's key")


def test_a_link_beyond_the_window_costs_a_signature_not_an_error(secagg_run, monkeypatch):
    """Records still unnamed ``WINDOW`` lines on are verified by their signatures (checked
    after each batch of lines): with a window of one line and batches of one, links that name
    records further back are not used, and the log still verifies."""
    wide = verify_run(secagg_run.path)
    monkeypatch.setattr(verify_module, "WINDOW", 1)
    monkeypatch.setattr(verify_module, "BATCH", 1)
    narrow = verify_run(secagg_run.path)
    assert narrow.ok and narrow.records == wide.records
    assert 0 < narrow.linked < wide.linked


def test_a_linked_records_signature_field_is_not_read(run):
    """What links do not check (docs/log-format.md): the server's key holder replaces the
    ``sig`` of a client record that the client's next record links to with zeros, rechains and
    re-closes. The record's content is still the one the client signed (the link is the hash
    of those bytes), so the audit with links passes; its ``sig`` is no longer a signature,
    which only the audit with ``links=False`` names."""
    records = run.records()
    k = next(r["seq"] for r in records if r["sender"] == "client-2" and r["round"] == 1
             and r["phase"] == "masked_input")
    records[k] = records[k] | {"sig": "00" * 64}
    reclose(run, records)
    assert verify_run(run.path).ok
    assert_first_bad(verify_run(run.path, links=False), k, k + 1, "signature does not verify")
    assert cli_main(["audit", "--verify", str(run.path)]) == 0
    assert cli_main(["audit", "--verify", str(run.path), "--every-signature"]) == 1


def test_the_writer_links_each_record_to_the_one_its_party_signed_before(tmp_path):
    """A party's messages and events carry the hash of the bytes it signed before each, its
    first one none; the link is signed (editing ``last`` fails the signature)."""
    log, keys = keyed_log(tmp_path, (SERVER, "client-1"))
    party = keys["client-1"]
    first = party.envelope(1, "upload", "gradient", SERVER, b"a")
    event = party.event(1, "upload", "clipped", "client-1", "3 coordinates")
    second = party.envelope(2, "upload", "gradient", SERVER, b"b")
    assert "last" not in first.header()
    assert event["last"] == link_of(canonical(first.header()))
    assert second.last == link_of(canonical(event))
    assert party.last == link_of(canonical(second.header()))
    for envelope in (first, second):
        log.append(envelope)
    log.close(keys[SERVER])
    run = Run(tmp_path, keys, {})
    records = run.records()
    records[1] |= {"last": "0" * 64}
    reclose(run, records)
    assert_first_bad(verify_run(tmp_path), 1, 2, "signature does not verify with client-1's key")


def test_a_malformed_link_is_named(run):
    records = run.records()
    k = next(r["seq"] for r in records if r["sender"] == "client-1" and "last" in r)
    records[k] = records[k] | {"last": "ZZ"}
    reclose(run, records)
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"line {k + 1}: field 'last' is not 64 lowercase hex digits")


def test_a_relayed_signature_that_is_not_a_string_is_named(run):
    """Adversary: the server's key holder who can write the run folder. It rewrites an unmask
    request so that a survivor's relayed signature is a JSON list, re-signs the request,
    rechains and re-closes. The audit names the answer as held without that survivor's valid
    signature, as for any bad signature; it must not crash on the value (the rules remember
    the signatures they verified, keyed by their bytes)."""
    records = run.records()
    k = next(r["seq"] for r in records if r["phase"] == "unmask_request")
    payloads = run.path / "payloads.bin"
    blob = payloads.read_bytes()
    record = records[k]
    request = payload_json(blob[record["offset"]:record["offset"] + record["bytes"]], SERVER)
    survivor = sorted(request["signatures"])[0]
    request["signatures"][survivor] = [1, 2]
    data = json_payload(request)
    records[k] = resign(record | {"offset": len(blob), "bytes": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest()},
                        run.keys[SERVER])
    payloads.write_bytes(blob + data)
    reclose(run, records)
    report = verify_run(run.path)
    assert not report.ok
    assert f"without {survivor}'s valid signature" in report.first_bad.problem
