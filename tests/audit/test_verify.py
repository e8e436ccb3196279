"""The log verifier on real logs written through the channel and transport, intact and
tampered with in every way."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from secureffm.audit import AuditReport, verify_run
from secureffm.audit import verify as verify_module
from secureffm.audit.verify import signed_bytes
from secureffm.cli import main as cli_main
from secureffm.errors import SecureFFMError
from secureffm.federation import SERVER, Client, MessageLog, Party, Registry
from secureffm.federation.crypto import Identity, verify_signature
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.log import canonical
from secureffm.federation.pin import RunPin, pin_of
from secureffm.protocols import load_protocol
from secureffm.runs.scaffold import open_channel

VECTOR3 = {"gradient": ((3,), np.dtype(np.float32))}


def main(argv: list[str]) -> int:
    """``secureffm audit ARGV`` through the CLI, its exit code."""
    return cli_main(["audit", *argv])


@dataclass
class Run:
    """A run folder and the parties whose private keys signed its log (kept only by the test)."""

    path: Path
    keys: dict[str, Party]
    summary: dict
    head: str | None = None

    @property
    def log(self) -> Path:
        return self.path / "messages.jsonl"

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.lines()]

    def write(self, lines: list[str]) -> None:
        self.log.write_text("".join(line + "\n" for line in lines))

    def copy(self, to: Path) -> Run:
        shutil.copytree(self.path, to)
        return Run(to, self.keys, self.summary, self.head)


def build_run(path: Path, protocol: str, faults: FaultPlan | None = None) -> Run:
    """Two rounds of broadcast + aggregation among three clients, payloads kept."""
    gen = torch.Generator().manual_seed(0)
    clients = [Client(f"client-{i}", torch.randn(20, 2, generator=gen), torch.Generator())
               for i in (1, 2, 3)]
    log = MessageLog(path / "messages.jsonl", keep_payloads=True)
    channel = open_channel(load_protocol(protocol), clients, log, faults)
    for r in (1, 2):
        channel.broadcast(r, "global_model", {"theta": np.zeros(4, np.float32)})
        channel.aggregate(r, "gradient", lambda c: {"gradient": np.ones(3, np.float32)},
                          {c.id: 1 / 3 for c in clients}, VECTOR3)
    head = channel.close()
    return Run(path, dict(channel.parties), log.summary(), head)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("runs")
    return {protocol: build_run(base / protocol, protocol) for protocol in ("secagg", "plaintext")}


@pytest.fixture
def run(runs, tmp_path) -> Run:
    """A fresh copy of the secure-aggregation run, free to tamper with."""
    return runs["secagg"].copy(tmp_path / "run")


@pytest.fixture
def plain_run(runs, tmp_path) -> Run:
    """A fresh copy of the plaintext run (no signed views: only the chain pins its records)."""
    return runs["plaintext"].copy(tmp_path / "run")


def dump(record: dict) -> str:
    """A record as the log writes it."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def resign(record: dict, key: Party | Identity) -> dict:
    return record | {"sig": key.sign(canonical(record)).hex()}


def upload_seq(run: Run, sender: str = "client-2", round_: int = 2) -> int:
    """The seq of ``sender``'s first message to the server in ``round_`` (mid-log)."""
    return next(r["seq"] for r in run.records()
                if r["sender"] == sender and r["round"] == round_ and r["recipient"] == SERVER)


def assert_first_bad(report: AuditReport, seq: int | None, line: int, *words: str) -> None:
    assert not report.ok
    assert report.first_bad is not None
    assert (report.first_bad.seq, report.first_bad.line) == (seq, line), report.first_bad
    for word in words:
        assert word in report.first_bad.problem, report.first_bad.problem
    assert report.records == line - 1


# -- intact logs ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol, count", [("secagg", 63), ("plaintext", 15)])
def test_intact_log_verifies_with_its_record_count(runs, protocol, count):
    run = runs[protocol]
    report = verify_run(run.path)
    assert report.ok and report.first_bad is None
    assert report.records == report.lines == len(run.lines()) == count
    assert report.payloads == count - 3  # two aggregated events and the closing record
    assert report.kinds == {k: v["messages"] for k, v in run.summary["kinds"].items()}
    assert report.events == {"aggregated": 2, "closed": 1}
    assert report.head == run.head == hashlib.sha256(run.lines()[-1].encode()).hexdigest()
    assert report.summary().splitlines()[0].startswith(f"OK: log intact: {count} records")


def test_event_records_are_verified_and_counted(tmp_path):
    faults = FaultPlan(faults=(Fault("corrupt", "client-2", "masked_input", (1,)),
                               Fault("drop", "client-3", "unmask", (2,))))
    run = build_run(tmp_path / "run", "secagg", faults)
    report = verify_run(run.path)
    assert report.ok, report.first_bad
    # client-2's corrupted input is rejected and dropped; client-3, offline only at unmask in
    # round 2, stays in that round's sum.
    assert report.events == run.summary["events"] == {"rejected": 1, "dropped": 1,
                                                      "aggregated": 2, "closed": 1}
    assert report.records == len(run.lines())
    assert report.payloads == report.records - 5  # event records carry no payload


# -- edits, deletions, insertions, reordering ------------------------------------------------


@pytest.mark.parametrize("protocol", ["secagg", "plaintext"])
@pytest.mark.parametrize("field, value", [("round", 1), ("bytes", 4), ("recipient", "client-1")])
def test_edited_field_without_resigning_fails_its_signature(runs, tmp_path, protocol, field,
                                                            value):
    run = runs[protocol].copy(tmp_path / "run")
    k = upload_seq(run)
    lines = run.lines()
    lines[k] = dump(json.loads(lines[k]) | {field: value})
    run.write(lines)
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"record {k}: signature does not verify with client-2's key")


@pytest.mark.parametrize("k", [0, 16, 46])
def test_deleted_record_is_caught_where_it_was(run, k):
    lines = run.lines()
    del lines[k]
    run.write(lines)
    assert_first_bad(verify_run(run.path), k + 1, k + 1,
                     f"seq is {k + 1}, expected {k}", "deleted, inserted or reordered")


def test_deletion_with_renumbered_seq_breaks_the_chain(run):
    k = 16
    records = run.records()
    del records[k]
    run.write([dump(r | {"seq": i}) for i, r in enumerate(records)])
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"line {k + 1}: chain broken: prev does not match the hash of line {k}",
                     "deleted, inserted, reordered or edited")


def rechain(run: Run, records: list[dict]) -> list[str]:
    """``records`` as log lines with ``seq`` and ``prev`` rewritten so that every line's own
    link is consistent; neither field is signed, so no key is needed."""
    prev = hashlib.sha256((run.path / "parties.json").read_bytes()).hexdigest()
    lines = []
    for seq, record in enumerate(records):
        lines.append(dump(record | {"seq": seq, "prev": prev}))
        prev = hashlib.sha256(lines[-1].encode()).hexdigest()
    return lines


def broadcast_seq(run: Run, recipient: str, round_: int = 2) -> int:
    """The seq of the server's round-``round_`` global model delivery to ``recipient``."""
    return next(r["seq"] for r in run.records() if r["kind"] == "global_model"
                and r["recipient"] == recipient and r["round"] == round_)


@pytest.mark.parametrize("edit", ["delete", "duplicate", "swap"])
def test_a_rechained_edit_by_a_folder_writer_fails_the_closing_records_signed_chain(plain_run,
                                                                                   edit):
    """Adversary: someone who can write the run folder but holds no party's key. They delete a
    delivery record in the middle (the server's round-2 model to client-2), or duplicate it, or
    swap it with its neighbour, then rewrite seq and prev of every later line. Every line but
    the last passes its own checks (seq, link, signature: seq and prev are not signed); the
    closing record's ``chain``, which the server signed, still names the line that preceded it
    in the real log, so the audit fails there, with keys pinned or not."""
    run = plain_run
    keys = RunPin(fingerprints=pin_of(run.path, run.head).fingerprints)  # pinned at the end
    records = run.records()
    k = broadcast_seq(run, "client-2")
    assert 0 < k < len(records) - 2 and records[k]["sender"] == SERVER
    if edit == "delete":
        del records[k]
    elif edit == "duplicate":
        records.insert(k + 1, dict(records[k]))
    else:
        records[k], records[k + 1] = records[k + 1], records[k]
    lines = rechain(run, records)
    run.write(lines)
    last = len(lines)
    for pin in (None, keys):
        assert_first_bad(verify_run(run.path, pin), last - 1, last,
                         f"record {last - 1}: the closing record signed chain",
                         "not the log before it")


def delete_and_reclose(run: Run, seq: int) -> None:
    """The server's key holder deletes record ``seq``, rechains, and re-signs the closing
    record over the new chain."""
    records = run.records()
    del records[seq]
    closing = records[-1]
    records[-1] = closing | {"records": closing["records"] - 1}
    lines = rechain(run, records)
    closing = json.loads(lines[-1])
    lines[-1] = dump(resign(closing | {"chain": closing["prev"]}, run.keys[SERVER]))
    run.write(lines)


def test_a_server_key_holder_can_rechain_and_reclose_but_not_past_a_pinned_head(plain_run):
    """Adversary: the server's key holder with write access to the folder. It deletes a
    delivery, rechains and re-signs the closing record over the new chain: the log verifies
    (the documented limit of a key holder), but not against the head pinned at the run's end."""
    run = plain_run
    delete_and_reclose(run, broadcast_seq(run, "client-2"))
    assert verify_run(run.path).ok
    report = verify_run(run.path, RunPin(head=run.head))
    assert not report.ok and "differs from the pinned head" in report.first_bad.problem


def test_a_deleted_broadcast_contradicts_the_views_the_clients_signed(run):
    """Adversary: the server's key holder with write access to the folder deletes its
    round-2 model to client-2 from a secure-aggregation log (malicious-server variant, payloads
    kept), rechains and re-closes, as above. The log no longer matches what client-2 was
    told when it answered its unmask request: the survivors' signatures it checked covered
    the model, and the audit re-checks them over the logged view. Before this rule the log
    verified (the key holder's limit above)."""
    k = broadcast_seq(run, "client-2")
    delete_and_reclose(run, k)
    report = verify_run(run.path)
    assert not report.ok, report.summary()
    assert report.first_bad.problem.endswith(
        "without client-1's valid signature of the survivor set, parameters, graph and "
        "broadcasts the log shows client-2 was told")


@pytest.mark.parametrize("source", [40, 15, 3])
def test_inserted_copy_of_another_record_is_caught_at_the_insertion(run, source):
    k = 16
    lines = run.lines()
    lines.insert(k, lines[source])
    run.write(lines)
    assert_first_bad(verify_run(run.path), source, k + 1, f"seq is {source}, expected {k}")


def test_inserted_forged_record_with_right_seq_and_prev_fails_its_signature(run):
    k = 16
    lines = run.lines()
    forged = resign(json.loads(lines[k]), Identity())  # a key no party owns
    lines.insert(k, dump(forged))
    run.write(lines)
    assert_first_bad(verify_run(run.path), k, k + 1, "signature does not verify")


@pytest.mark.parametrize("k", [0, 16, 46])
def test_swapped_neighbours_are_caught_at_the_first(run, k):
    lines = run.lines()
    lines[k], lines[k + 1] = lines[k + 1], lines[k]
    run.write(lines)
    assert_first_bad(verify_run(run.path), k + 1, k + 1, f"seq is {k + 1}, expected {k}")


@pytest.mark.parametrize("signer", ["client-1", "client-3", SERVER])
def test_edit_resigned_with_another_partys_key_fails_its_signature(run, signer):
    k = upload_seq(run)
    lines = run.lines()
    edited = json.loads(lines[k]) | {"bytes": 1}
    lines[k] = dump(resign(edited, run.keys[signer]))
    run.write(lines)
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"record {k}: signature does not verify with client-2's key")


def test_edit_resigned_with_the_senders_key_breaks_the_next_link(run):
    """Signatures alone cannot catch this edit: the chain does."""
    k = upload_seq(run)
    lines = run.lines()
    record = json.loads(lines[k])
    edited = resign(record | {"round": record["round"] + 1}, run.keys["client-2"])
    assert verify_signature(run.keys["client-2"].identity.public, bytes.fromhex(edited["sig"]),
                            canonical(edited))
    lines[k] = dump(edited)
    run.write(lines)
    assert_first_bad(verify_run(run.path), k + 1, k + 2,
                     f"line {k + 2}: chain broken: prev does not match the hash of line {k + 1}")


def test_reformatted_line_is_caught_even_at_the_end(run):
    """Same record and signature, other bytes: only the exact-form check sees the last line."""
    lines = run.lines()
    lines[-1] = json.dumps(json.loads(lines[-1]), sort_keys=True)  # spaces after , and :
    run.write(lines)
    assert_first_bad(verify_run(run.path), 62, 63, "line 63 is not in the log's exact form")


@pytest.mark.parametrize("keep", [0, 30, -1])
def test_a_cut_short_log_is_caught_by_its_missing_closing_record(run, keep):
    run.write(run.lines()[:keep])
    report = verify_run(run.path)
    assert not report.ok and "without its signed closing record" in report.first_bad.problem


def test_records_after_the_closing_record_are_caught(run):
    lines = run.lines()
    run.write(lines + [lines[3]])
    assert "after the closing record" in verify_run(run.path).first_bad.problem


def test_replaced_keys_break_the_chain_at_its_start(run):
    parties = json.loads((run.path / "parties.json").read_text())
    parties["client-1"]["sign"] = Identity().public.hex()
    (run.path / "parties.json").write_text(json.dumps(parties, indent=1, sort_keys=True))
    report = verify_run(run.path)
    assert report.first_bad.line == 1 and "parties.json" in report.first_bad.problem


# -- payloads, parties, malformed lines ------------------------------------------------------


def test_altered_payload_bytes_are_named(run):
    k = upload_seq(run)
    record = run.records()[k]
    payloads = bytearray((run.path / "payloads.bin").read_bytes())
    payloads[record["offset"] + record["bytes"] - 1] ^= 0x01
    (run.path / "payloads.bin").write_bytes(bytes(payloads))
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"record {k}: payload in payloads.bin does not match its sha256")


def test_truncated_payload_file_is_named(run):
    k = upload_seq(run)
    record = run.records()[k]
    path = run.path / "payloads.bin"
    path.write_bytes(path.read_bytes()[:record["offset"] + 1])
    assert_first_bad(verify_run(run.path), k, k + 1, f"record {k}: payloads.bin ends before")


def test_deleted_payloads_bin_fails_at_the_first_record_with_an_offset(run):
    (run.path / "payloads.bin").unlink()
    assert_first_bad(verify_run(run.path), 0, 1,
                     "record 0 has a payload offset but payloads.bin is missing")


def test_unknown_sender_is_named(run):
    k = upload_seq(run)
    lines = run.lines()
    lines[k] = dump(json.loads(lines[k]) | {"sender": "client-9"})
    run.write(lines)
    assert_first_bad(verify_run(run.path), k, k + 1,
                     f"record {k}: sender 'client-9' is not in parties.json")


def test_party_removed_from_parties_json_breaks_the_chain_start(run):
    path = run.path / "parties.json"
    parties = json.loads(path.read_text())
    del parties["client-2"]
    path.write_text(json.dumps(parties))
    assert_first_bad(verify_run(run.path), 0, 1, "prev does not match the sha256 of parties.json")


def test_replaced_key_in_parties_json_breaks_the_chain_start(run):
    path = run.path / "parties.json"
    parties = json.loads(path.read_text())
    parties["client-2"]["sign"] = Identity().public.hex()
    path.write_text(json.dumps(parties))
    assert_first_bad(verify_run(run.path), 0, 1, "prev does not match the sha256 of parties.json")


@pytest.mark.parametrize("garbage, problem", [
    ("not json{", "line 17 is not valid JSON"),
    ("", "line 17 is not valid JSON"),
    ("[1, 2]", "line 17 is not a JSON object"),
])
def test_garbage_line_is_named(run, garbage, problem):
    lines = run.lines()
    lines[16] = garbage
    run.write(lines)
    assert_first_bad(verify_run(run.path), None, 17, problem)


@pytest.mark.parametrize("change, seq, problem", [
    ({"sig": None}, 16, "missing field(s) 'sig'"),
    ({"seq": "16"}, None, "field 'seq' must be an integer"),
    ({"bytes": True}, 16, "field 'bytes' must be an integer"),
    ({"prev": "ab"}, 16, "field 'prev' is not 64 lowercase hex digits"),
    ({"offset": -1}, 16, "field 'offset' must be a non-negative integer"),
])
def test_malformed_record_is_named(run, change, seq, problem):
    lines = run.lines()
    record = json.loads(lines[16]) | change
    lines[16] = dump({k: v for k, v in record.items() if v is not None})
    run.write(lines)
    assert_first_bad(verify_run(run.path), seq, 17, "line 17: ", problem)


@pytest.mark.parametrize("name, content", [
    ("parties.json", None),
    ("parties.json", "{not json"),
    ("parties.json", '{"client-1": "xyz"}'),
    ("parties.json", '{"client-1": {"sign": "ab"}}'),
    ("messages.jsonl", None),
])
def test_missing_or_malformed_run_files_raise(run, name, content):
    path = run.path / name
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(SecureFFMError, match=name.replace(".", r"\.")):
        verify_run(run.path)


# -- protocol rules on logs written by the real writer ----------------------------------------


def test_server_rejecting_an_unregistered_sender_verifies(tmp_path):
    faults = FaultPlan(faults=(Fault("unknown_sender", "client-99", "upload", (1,)),))
    run = build_run(tmp_path / "run", "plaintext", faults)
    report = verify_run(run.path)
    assert report.ok, report.first_bad
    assert [r["party"] for r in run.records() if r.get("event") == "rejected"] == ["client-99"]


def test_an_honest_secure_aggregation_log_has_its_signed_views_checked(runs):
    """Every unmask answer of the two malicious-variant rounds (3 clients each) is checked."""
    report = verify_run(runs["secagg"].path)
    assert report.ok, report.first_bad
    signed = "secagg: every answered unmask request held the survivors' signatures of its view"
    assert report.checks[signed] == "done: 6 answer(s) checked"


def test_closing_count_re_signed_by_the_server_must_match(run):
    lines = run.lines()
    closing = json.loads(lines[-1])
    lines[-1] = dump(resign(closing | {"records": closing["records"] - 1}, run.keys[SERVER]))
    run.write(lines)
    assert_first_bad(verify_run(run.path), 62, 63, "states 61 records before it, but 62 precede")


def single_log(tmp_path: Path, parties: list[str]) -> tuple[MessageLog, dict[str, Party]]:
    """A log whose parties registered only signing keys (as a centralized run's party)."""
    keys = {party: Party(party) for party in parties}
    log = MessageLog(tmp_path / "messages.jsonl")
    log.register(Registry({party: key.identity.public for party, key in keys.items()}, {}))
    return log, keys


def test_a_single_party_run_closes_its_own_log(tmp_path):
    """A centralized run (secureffm/runs/ffm.py) has no server: its only party closes."""
    log, keys = single_log(tmp_path, ["central"])
    head = log.close(keys["central"])
    report = verify_run(tmp_path)
    assert report.ok and report.head == head
    assert json.loads((tmp_path / "parties.json").read_text()) == {
        "central": {"sign": keys["central"].identity.public.hex()}}


def test_several_parties_without_a_server_cannot_close(tmp_path):
    log, keys = single_log(tmp_path, ["client-1", "client-2"])
    log.close(keys["client-1"])
    assert_first_bad(verify_run(tmp_path), 0, 1, "parties.json has no server but 2 parties")


@pytest.mark.parametrize("event", ["dropped", "aborted", "aggregated"])
def test_server_events_signed_by_a_client_are_caught(tmp_path, event):
    log, keys = single_log(tmp_path, [SERVER, "client-1"])
    fields = {"included": [], "of_kind": "gradient"} if event == "aggregated" else None
    log.event(keys["client-1"].event(1, "aggregate", event, "client-1", "x", fields))
    log.close(keys[SERVER])
    assert_first_bad(verify_run(tmp_path), 0, 1,
                     f"a {event!r} event is the server's, but client-1 signed it")


def test_event_about_an_unregistered_party_is_caught(tmp_path):
    log, keys = single_log(tmp_path, [SERVER, "client-1"])
    log.event(keys[SERVER].event(1, "aggregate", "dropped", "client-99", "x"))
    log.close(keys[SERVER])
    assert_first_bad(verify_run(tmp_path), 0, 1, "party 'client-99' is not in parties.json")


def test_the_run_pins_both_keys_of_every_party(runs):
    run = runs["secagg"]
    parties = json.loads((run.path / "parties.json").read_text())
    assert set(parties) == {SERVER, "client-1", "client-2", "client-3"}
    assert parties == {p: {"sign": party.identity.public.hex(), "seal": party.sealing.public.hex()}
                       for p, party in run.keys.items()}


# -- the entry point -------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--pin", "{run}", "--expect-head", "ab"], "go with --verify"),
    (["--pin", "{run}", "--every-signature"], "--every-signature goes with --verify"),
    (["--verify", "{run}", "--expect-head", "ab"], "is not a sha256"),
    (["--verify", "{run}", "--parties", "{run}/messages.jsonl"], "is not valid JSON"),
    (["--verify", "{run}", "--parties", "{run}/nothing.json"], "nothing.json is missing"),
    (["--verify", "{run}", "--parties", "{run}/config.json"], "neither a pin file nor"),
])
def test_audit_options_that_do_not_fit_exit_2_naming_what_to_change(run, capsys, argv, message):
    (run.path / "config.json").write_text('{"rounds": 3}')
    assert main([a.format(run=run.path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("secureffm: error: ") and message in err


def test_a_log_that_does_not_verify_cannot_be_pinned(run, capsys):
    run.write(run.lines()[:-1])
    assert main(["--pin", str(run.path)]) == 2
    assert "cannot be pinned: the log ends at line 62" in capsys.readouterr().err


def test_main_prints_the_verdict_and_exits_by_it(run, capsys):
    assert main(["--verify", str(run.path)]) == 0
    assert capsys.readouterr().out.startswith("OK: log intact: 63 records")
    lines = run.lines()
    del lines[5]
    run.write(lines)
    assert main(["--verify", str(run.path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("FAILED: log not intact: line 6: seq is 6, expected 5 (a record was "
                      "deleted, inserted or reordered at or before this line)")
    assert out[1] == "5 of 62 lines verified before line 6"
    (run.path / "parties.json").unlink()
    assert main(["--verify", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("secureffm: error: ") and "parties.json is missing" in err


# -- the fast path: signed bytes cut out of the line, keys built once -------------------------

# Written by MessageLog at commit 923df5b, before the audit cut the signed bytes out of each line
# instead of serializing the record again: build_run(path, "secagg", faults) with client-2's
# masked input corrupted in round 1 and client-3 offline at unmask in round 2 (so the log holds
# rejected, dropped, aggregated and closed events), payloads kept. Its head, as the run printed it:
OLD_LOG = Path(__file__).parents[1] / "fixtures" / "audit_log"
OLD_HEAD = "c02335c69cc71e9cd9a4bd22d57827606a13376c67403185b95bb9c1f9840513"
EXACT = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def test_a_log_written_before_the_fast_audit_verifies_to_its_printed_head():
    report = verify_run(OLD_LOG, RunPin(head=OLD_HEAD))
    assert report.ok, report.first_bad
    assert (report.records, report.payloads) == (60, 55)
    assert report.events == {"rejected": 1, "dropped": 1, "aggregated": 2, "closed": 1}


def test_signed_bytes_of_every_old_line_are_its_canonical_form():
    """The documented rule (canonical JSON of every field but sig, seq, prev and offset),
    computed by serializing, against the bytes the audit cuts out of each line."""
    for line in (OLD_LOG / "messages.jsonl").read_bytes().splitlines():
        record = json.loads(line)
        assert signed_bytes(line, record) == canonical(record)


def _edit(field: str, value):
    """Another value of the same type, still well formed (a registered sender, hex digits)."""
    if field == "sender":
        return "client-1" if value != "client-1" else "client-2"
    if isinstance(value, int):
        return value + 1
    if isinstance(value, list):
        return [*value, "x"]
    return value[::-1] if field == "sha256" else value + "x"


def test_each_signed_field_edited_in_the_old_log_fails_at_that_record(tmp_path):
    """An edit of any signed field of a record, re-chained after it by a folder writer, is
    caught at that record by its signature."""
    lines = (OLD_LOG / "messages.jsonl").read_text().splitlines()
    k = 17
    record = json.loads(lines[k])
    for field in sorted(set(record) - {"sig", "seq", "prev", "offset"}):
        run = Path(shutil.copytree(OLD_LOG, tmp_path / field))
        edited = record | {field: _edit(field, record[field])}
        rewritten = lines[:k] + [EXACT(edited)] + lines[k + 1:]
        for i in range(k + 1, len(rewritten)):  # fix the chain after the edit
            rewritten[i] = EXACT(json.loads(rewritten[i]) | {"prev": hashlib.sha256(
                rewritten[i - 1].encode()).hexdigest()})
        (run / "messages.jsonl").write_text("".join(line + "\n" for line in rewritten))
        report = verify_run(run)
        assert report.first_bad is not None and report.first_bad.line == k + 1, (field, report)
        assert "signature does not verify" in report.first_bad.problem, field


_HEX = "0123456789abcdef"
_UNSIGNED = ("offset", "prev", "seq", "sig")
_TRICKY = st.text(st.sampled_from([*',":{}[]\\ seqprvoftig0123456789', "é", "\n", "\x00"]),
                  max_size=12) | st.text(max_size=6)
_VALUES = st.recursive(  # nested objects may use the unsigned fields' names and value forms
    st.none() | st.booleans() | st.integers() | st.text(_HEX, max_size=8) | _TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(_UNSIGNED) | _TRICKY, inner, max_size=3),
    max_leaves=8)


@given(st.fixed_dictionaries(
    {"bytes": st.integers(0), "seq": st.integers(0), "prev": st.text(_HEX, min_size=64,
                                                                     max_size=64),
     "sig": st.text(_HEX, min_size=128, max_size=128)},
    optional={"offset": st.integers(0)}),
    st.dictionaries(_TRICKY.filter(lambda k: k not in {"bytes", *_UNSIGNED}), _VALUES,
                    max_size=6))
@settings(max_examples=300, deadline=None)
def test_signed_bytes_equal_canonical_json_of_any_record(unsigned, content):
    """Strings that spell ``,"seq":1``, keys ending in a quote, nested objects and non-ASCII
    text: cutting the unsigned fields out of the exact form gives canonical()'s bytes."""
    record = content | unsigned
    assert signed_bytes(EXACT(record).encode(), record) == canonical(record)


_TEXT = (st.sampled_from(["event", "server", "client-1", "gradient", ""])
         | st.text(st.sampled_from(list("az09_-/ ")), max_size=6))
_MESSAGE_VALUES = {
    "bytes": st.integers(-1, 10**20), "kind": _TEXT, "phase": _TEXT, "recipient": _TEXT,
    "round": st.integers(-10**20, 10**20), "sender": _TEXT, "seq": st.integers(-1, 10**20),
    "prev": st.text(_HEX, min_size=64, max_size=64), "sha256": st.text(_HEX, min_size=64,
                                                                       max_size=64),
    "sig": st.text(_HEX, min_size=128, max_size=128), "stages": st.lists(_TEXT, max_size=3)}
# Other spellings JSON allows for the same record, each at one place: a character of a string
# escaped, zero as -0, white space after a colon or comma, a key given twice (the decoder keeps
# the last), and a character edited next to a delimiter (which may spell another record).
_RESPELL = st.tuples(st.sampled_from(["escape", "minus zero", "space", "twice", "edit"]),
                     st.integers(0, 10**4), st.sampled_from(list(' 0-e/"\\\n\u00e9')))


def _respelled(line: str, how: str, at: int, char: str) -> str:
    """``line`` spelled otherwise at its ``at``-th place (modulo their number) fit for ``how``."""
    if how == "twice":
        return '{"kind":"event",' + line[1:]
    fits = {"escape": lambda i: line[i].isalnum() or line[i] in "-/ ",
            "minus zero": lambda i: line[i] == "0" and line[i - 1] == ":",
            "space": lambda i: line[i - 1] in ":,",
            "edit": lambda i: line[i] == '"' or line[i - 1] in ':,["'}[how]
    places = [i for i in range(1, len(line)) if fits(i)]
    if not places:
        return line
    i = places[at % len(places)]
    new = {"escape": f"\\u{ord(line[i]):04x}", "minus zero": "-0", "space": " " + line[i],
           "edit": char + line[i]}[how]
    return line[:i] + new + line[i + 1:]


@given(st.fixed_dictionaries(_MESSAGE_VALUES, optional={
    "offset": st.integers(-1, 10**20), "origin": _TEXT, "extra": _VALUES,
    "last": st.text(_HEX, min_size=63, max_size=65) | _TEXT}),
    st.dictionaries(st.sampled_from(sorted(_MESSAGE_VALUES)), _VALUES | _TEXT, max_size=1),
    st.sampled_from([True, True, True, False]), st.lists(_RESPELL, max_size=2))
@settings(max_examples=600, deadline=None)
def test_a_line_the_fast_path_takes_is_the_exact_form_of_a_record_with_the_right_fields(
        record, other_types, sorted_keys, respellings):
    """The audit skips the exact-form and field checks for a line that decodes and matches
    _MESSAGE_LINE, and cuts its signed bytes at the match's groups: any such line, from
    message-like records with values of every type and form, their keys in any order and
    spelled in the other ways JSON allows, must be the exact form of a record that passes
    those checks, its groups joined canonical()'s bytes."""
    record = record | other_types
    line = json.dumps(record if sorted_keys else dict(reversed(record.items())),
                      sort_keys=sorted_keys, separators=(",", ":"))
    for respelling in respellings:
        line = _respelled(line, *respelling)
    try:
        decoded = json.loads(line)
    except ValueError:  # the audit names a line JSON cannot read before anything else
        return
    match = verify_module._MESSAGE_LINE.fullmatch(line.encode())
    event(f"fast path: {match is not None}")
    if match is None:
        return
    assert EXACT(decoded) == line
    assert verify_module._check_fields(decoded, 1) is None
    assert decoded["kind"] != "event"
    assert b"".join(match.groups()) == canonical(decoded)


_SPELLINGS = {  # name -> (field values, the line's exact form -> another spelling of it)
    "round -0": ({"round": 0}, lambda line: line.replace('"round":0', '"round":-0')),
    "an escaped letter": ({}, lambda line: line.replace('"kind":"gradient"',
                                                        '"kind":"gr\\u0061dient"')),
    "an escaped slash": ({"phase": "a/b"}, lambda line: line.replace("a/b", "a\\/b")),
    "a DEL written raw": ({"sender": "client\x7f"}, lambda line: line.replace("\\u007f",
                                                                             "\x7f")),
    "an e-acute written raw": ({"recipient": "\u00e9"}, lambda line: line.replace("\\u00e9",
                                                                                 "\u00e9")),
    "a space after a colon": ({}, lambda line: line.replace('"bytes":', '"bytes": ')),
    "keys out of order": ({}, lambda line: json.dumps(dict(reversed(json.loads(line).items())),
                                                      separators=(",", ":"))),
    "a key given twice": ({}, lambda line: '{"bytes":0,' + line[1:]),
    "bytes as a float": ({"bytes": 100}, lambda line: line.replace('"bytes":100',
                                                                   '"bytes":1e2')),
}


@pytest.mark.parametrize("name", sorted(_SPELLINGS))
def test_another_spelling_of_a_message_line_takes_the_full_checks(name):
    """Spellings JSON reads but the log's exact form never writes (or values of another type)
    do not match _MESSAGE_LINE, so the full exact-form and field checks name them."""
    values, respell = _SPELLINGS[name]
    record = json.loads((OLD_LOG / "messages.jsonl").read_text().splitlines()[16]) | values
    assert record["kind"] == "gradient"
    line = respell(EXACT(record))
    assert line != EXACT(record) and json.loads(line) is not None  # JSON, and another line
    assert verify_module._MESSAGE_LINE.fullmatch(line.encode()) is None
    assert (verify_module._MESSAGE_LINE.fullmatch(EXACT(record).encode()) is None) == (
        name in ("a DEL written raw", "an e-acute written raw"))  # exact form: \u escapes


def test_message_lines_as_the_writer_emits_them_take_the_fast_path(runs):
    """Every message line of the old log and of a new one, with and without an ``origin``
    (a relayed payload), matches _MESSAGE_LINE; event lines do not (they take the full
    checks)."""
    lines = [*(OLD_LOG / "messages.jsonl").read_text().splitlines(), *runs["secagg"].lines()]
    record = json.loads(lines[20])
    lines.append(dump(record | {"origin": "client-3"}))
    for line in lines:
        is_event = json.loads(line)["kind"] == "event"
        assert (verify_module._MESSAGE_LINE.fullmatch(line.encode()) is None) == is_event, line


def test_a_line_with_a_nested_object_is_verified_on_its_canonical_form(run):
    """A key holder may sign a record holding an object whose keys are those of unsigned
    fields: it verifies, and an edit inside that object does not."""
    lines = run.lines()
    record = json.loads(lines[16])
    nested = resign(record | {"extra": {"seq": record["seq"], "sig": record["sig"][:8]}},
                    run.keys[record["sender"]])
    lines[16] = dump(nested)
    rechained = [*lines[:17]]
    for line in lines[17:]:
        rechained.append(dump(json.loads(line) | {
            "prev": hashlib.sha256(rechained[-1].encode()).hexdigest()}))
    run.write(rechained)
    report = verify_run(run.path)
    assert report.first_bad is not None and report.first_bad.line == len(lines)  # closing chain
    assert report.records == len(lines) - 1
    lines[16] = dump(nested | {"extra": {"seq": record["seq"] + 1, "sig": "x"}})
    run.write(lines[:17])
    assert_first_bad(verify_run(run.path), 16, 17, "signature does not verify")


@pytest.mark.parametrize("line, problem", [
    ('{"seq":' + "1" * 5000 + "}", "a number too long"),
    ('{"seq":16,"x":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
    ("\xff".encode("latin-1"), "is not valid JSON"),
])
def test_a_line_json_cannot_read_is_named_not_raised(run, line, problem):
    lines = run.log.read_bytes().splitlines()
    lines[16] = line.encode() if isinstance(line, str) else line
    run.log.write_bytes(b"".join(text + b"\n" for text in lines))
    assert_first_bad(verify_run(run.path), None, 17, problem)


def test_nesting_too_deep_to_serialize_again_is_named_not_raised(run):
    """Near the interpreter's recursion limit a line may decode and then fail to encode in the
    exact-form check, deeper in the stack: every depth around it is a finding."""
    lines = run.lines()
    record = json.loads(lines[16])
    limit = sys.getrecursionlimit()
    for depth in range(limit - 120, limit + 5, 5):
        deep = EXACT(record).replace('"bytes":', '"a":' + "[" * depth + "]" * depth + ',"bytes":')
        run.write(lines[:16] + [deep])
        report = verify_run(run.path)
        assert report.first_bad is not None and report.first_bad.line == 17, depth


@pytest.mark.parametrize("change, problem", [
    ({"event": []}, "field 'event' must be a string"),
    ({"event": {"closed": 1}}, "field 'event' must be a string"),
])
def test_an_event_field_of_another_type_is_named(run, change, problem):
    lines = run.lines()
    event = next(i for i, line in enumerate(lines) if '"kind":"event"' in line)
    lines[event] = dump(json.loads(lines[event]) | change)
    run.write(lines)
    assert_first_bad(verify_run(run.path), event, event + 1, problem)


# -- signatures verified in batches: the same first problem as one record at a time -----------


def _tamper(run: Run, how: str, k: int) -> None:
    """One edit of line ``k`` (or of what it points at) that a given pass of the audit sees."""
    lines = run.lines()
    record = json.loads(lines[k])
    if how == "unsigned edit":  # signature pass
        lines[k] = dump(record | {"round": record["round"] + 7})
    elif how == "not json":  # reading pass
        lines[k] = "not json{"
    elif how == "unknown sender":  # reading pass, after the chain
        lines[k] = dump(resign(record | {"sender": "client-99"}, Identity()))
    elif how == "rule":  # last pass: re-signed by its sender, so only the rules see it
        lines[k] = dump(resign(record | {"recipient": "client-99"}, run.keys[record["sender"]]))
    elif how == "payload" and "offset" in record:  # last pass
        with (run.path / "payloads.bin").open("r+b") as payloads:
            payloads.seek(record["offset"])
            payloads.write(bytes([payloads.read(1)[0] ^ 1]))
    elif how == "after close":
        lines.append(lines[k])
    run.write(lines)


def _verdict(report: AuditReport) -> tuple:
    return (report.ok, report.first_bad, report.records, report.lines, report.payloads,
            report.events, report.kinds, report.head, report.checks)


HOWS = ["unsigned edit", "not json", "unknown sender", "rule", "payload", "after close"]


@given(st.lists(st.tuples(st.sampled_from(HOWS), st.integers(0, 62)), min_size=1, max_size=3,
                unique_by=lambda edit: edit[1]))
@settings(max_examples=40, deadline=None)
def test_batches_of_any_size_find_the_first_problem_of_one_record_at_a_time(runs, edits):
    """Edits that each pass sees (reading, signatures, payloads and rules) at up to three places,
    in any order: every batch size gives the verdict of batches of one line, which run a
    record's checks in the documented order before reading the next."""
    with tempfile.TemporaryDirectory() as tmp:
        run = runs["secagg"].copy(Path(tmp) / "run")
        for how, k in edits:
            _tamper(run, how, k)
        verdicts = {}
        for size in (1, 2, 3, 7, 64, verify_module.BATCH):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(verify_module, "BATCH", size)
                verdicts[size] = _verdict(verify_run(run.path))
        assert all(verdict == verdicts[1] for verdict in verdicts.values()), verdicts


@pytest.mark.parametrize("size", [1, 5, 62, 63])
def test_a_forged_record_at_a_batch_edge_is_named(run, monkeypatch, size):
    """The last record of a batch, the first of the next, and the closing record."""
    monkeypatch.setattr(verify_module, "BATCH", size)
    lines = run.lines()
    for k in sorted({size - 1, size % len(lines), len(lines) - 1}):
        forged = run.copy(run.path.parent / f"forged-{k}")
        forged.write(lines[:k] + [dump(json.loads(lines[k]) | {"bytes": 7})] + lines[k + 1:])
        assert_first_bad(verify_run(forged.path), k, k + 1, "signature does not verify")
    run.write(lines + [lines[3]])
    assert_first_bad(verify_run(run.path), None, 64, "comes after the closing record (line 63)")
