"""A rebuilt log: someone who can write the run folder regenerates every key, rewrites
parties.json and re-signs every record after changing what the run did.

Before this fix all three rebuilds below (a dropped masked input, a record from an injected
client-99, a client-signed closing record) and a deleted payloads.bin passed
``secureffm audit --verify``. Now the protocol rules catch what breaks them without any pin,
and a pin kept apart (head and/or keys) catches every rebuild.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from secureffm.audit import RunPin, load_pin, pin_run, verify_run
from secureffm.cli import main as cli_main
from secureffm.config import RunConfig
from secureffm.federation.crypto import Identity, new_key_pair
from secureffm.federation.log import canonical
from secureffm.federation.message import deserialize_payload, serialize_payload
from secureffm.runs import run


def main(argv: list[str]) -> int:
    """``secureffm audit ARGV`` through the CLI, its exit code."""
    return cli_main(["audit", *argv])


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> tuple[Path, RunPin, bytes]:
    """A real 2-round secagg run of 3 clients with payloads kept, its pin and a copy of its
    parties.json, both taken at the end of the run and kept apart from the folder."""
    out = tmp_path_factory.mktemp("honest") / "run"
    run(RunConfig(method="vanilla", protocol="secagg", clients=3, partition="iid", rounds=2,
                  keep_payloads=True, shard_size=200, batch_size=32, eval_samples=100, nfe=(1,),
                  trajectories=10, progress=False, device="cpu", out=str(out)))
    return out, pin_run(out), (out / "parties.json").read_bytes()


@pytest.fixture
def folder(honest, tmp_path) -> Path:
    """A copy of the honest run folder, for the attacker to write."""
    return Path(shutil.copytree(honest[0], tmp_path / "run"))


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]


def rebuild(folder: Path, log: list[dict], new_parties: tuple[str, ...] = (),
            strip_payloads: bool = False) -> None:
    """The folder writer's rebuild: fresh Ed25519 and X25519 keys for every party of
    parties.json plus ``new_parties``, parties.json rewritten, every record renumbered,
    rechained and re-signed with the new key of its sender, the closing count and chain fixed.
    ``strip_payloads``: also delete payloads.bin and the records' offsets into it. The
    payloads hold signatures by the old keys (key advertisements, the consistency signatures
    relayed in unmask requests) that the audit re-checks; dropping the file is simpler than
    re-making them, and the audit then reports those rules as not done."""
    if strip_payloads:
        (folder / "payloads.bin").unlink()
    names = [*json.loads((folder / "parties.json").read_text()), *new_parties]
    signing = {party: Identity() for party in names}
    text = json.dumps({p: {"sign": signing[p].public.hex(), "seal": new_key_pair().public.hex()}
                       for p in names}, indent=1, sort_keys=True)
    (folder / "parties.json").write_text(text)
    prev, lines = hashlib.sha256(text.encode()).hexdigest(), []
    for seq, record in enumerate(log):
        dropped = ("sig", "offset") if strip_payloads else ("sig",)
        record = {k: v for k, v in record.items() if k not in dropped} | {
            "seq": seq, "prev": prev}
        if record.get("event") == "closed":
            record |= {"records": seq, "chain": prev,
                       "detail": f"{seq} records precede this closing record"}
        signer = signing.get(record["sender"]) or Identity()  # an unregistered sender's own
        record["sig"] = signer.sign(canonical(record)).hex()
        line = json.dumps(record, sort_keys=True, separators=(",", ":"))
        lines.append(line)
        prev = hashlib.sha256(line.encode()).hexdigest()
    (folder / "messages.jsonl").write_text("".join(line + "\n" for line in lines))


def without_masked_input(log: list[dict], client: str, uncount: bool) -> list[dict]:
    """``log`` without ``client``'s round-1 masked input; ``uncount``: also take it out of
    that round's aggregated event, so the rebuild stays consistent."""
    out = [r for r in log if not (r["round"] == 1 and r["phase"] == "masked_input"
                                  and r["sender"] == client)]
    assert len(out) == len(log) - 1
    if uncount:
        out = [r | {"included": [c for c in r["included"] if c != client]}
               if r.get("event") == "aggregated" and r["round"] == 1 else r for r in out]
    return out


def with_record_from(log: list[dict], party: str, phase: str) -> list[dict]:
    """``log`` with a copy of client-1's first round-1 ``phase`` message, sent by ``party``."""
    k = next(i for i, r in enumerate(log) if r["phase"] == phase and r["sender"] == "client-1")
    return log[:k] + [log[k] | {"sender": party}] + log[k:]


def assert_pins_fail(folder: Path, pin: RunPin, parties_copy: bytes, tmp_path: Path,
                     *why: str) -> None:
    """Every pin kept apart fails the folder, through the library and the CLI; the keys pin
    names ``why`` before reading the log, the head pin names the head when the log is
    otherwise sound."""
    pin_file, copy_file = tmp_path / "pin.json", tmp_path / "parties-copy.json"
    pin_file.write_text(json.dumps(pin.as_dict()))
    copy_file.write_bytes(parties_copy)
    for pinned in (pin, load_pin(copy_file), load_pin(pin_file)):
        report = verify_run(folder, pinned)
        assert not report.ok and report.records == 0, report.first_bad
        assert report.first_bad.line is None
        assert report.first_bad.problem.startswith("parties.json differs from the pinned parties")
        for words in why:
            assert words in report.first_bad.problem, report.first_bad.problem
    by_head = verify_run(folder, RunPin(head=pin.head))
    assert not by_head.ok
    if verify_run(folder).ok:
        assert "differs from the pinned head" in by_head.first_bad.problem
    assert main(["--verify", str(folder), "--expect-head", pin.head]) == 1
    assert main(["--verify", str(folder), "--parties", str(pin_file)]) == 1
    assert main(["--verify", str(folder), "--parties", str(copy_file)]) == 1


def test_an_intact_run_verifies_against_its_pin_by_head_and_by_keys(honest, capsys, tmp_path):
    """The honest case the pins must not break: the pin printed by ``--pin`` verifies."""
    folder, pin, parties_copy = honest
    assert cli_main(["audit", "--pin", str(folder)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == pin.as_dict()
    assert printed["head"] == hashlib.sha256(
        (folder / "messages.jsonl").read_text().splitlines()[-1].encode()).hexdigest()
    assert set(printed["fingerprints"]) == {"server", "client-1", "client-2", "client-3"}
    (tmp_path / "pin.json").write_text(json.dumps(printed))
    (tmp_path / "copy.json").write_bytes(parties_copy)
    assert main(["--verify", str(folder), "--parties", str(tmp_path / "pin.json")]) == 0
    assert "proves: the log and parties.json are exactly the pinned ones" in capsys.readouterr().out
    assert main(["--verify", str(folder), "--parties", str(tmp_path / "copy.json")]) == 0
    assert "proves: every record is signed with the pinned keys" in capsys.readouterr().out
    assert main(["--verify", str(folder), "--expect-head", pin.head]) == 0
    report = verify_run(folder)
    assert report.ok and report.pinned == () and "accidental damage only" in report.scope
    assert report.checks == {
        "aggregates: every counted client sent its input": "done: 2 aggregated event(s) checked",
        "secagg: relayed keys equal the advertised ones": "done: 6 keys message(s) checked",
        "secagg: one graph and one survivor set announced to every client":
            "done: 12 announcement(s) compared",
        "secagg: every answered unmask request held the survivors' signatures of its view":
            "done: 6 answer(s) checked"}


def test_rebuild_dropping_a_masked_input_passes_unpinned_and_fails_every_pin(honest, folder,
                                                                             tmp_path):
    """Adversary: a folder writer drops client-2's round-1 masked input, takes client-2 out of
    that round's aggregated event, regenerates all keys and re-signs every record. Before the
    fix it passed --verify; with payloads.bin kept the audit re-checks the consistency
    signatures inside it, made with the old keys, and fails it; a rebuilder that also strips
    the payloads (or re-makes those signatures) passes an unpinned audit (which proves
    integrity against accidental damage only); the head or keys pinned apart fail it."""
    _, pin, parties_copy = honest
    log = without_masked_input(records(folder), "client-2", uncount=True)
    rebuild(folder, log)
    report = verify_run(folder)
    assert not report.ok and "valid signature of the survivor set" in report.first_bad.problem
    shutil.rmtree(folder)
    shutil.copytree(honest[0], folder)
    rebuild(folder, log, strip_payloads=True)
    report = verify_run(folder)
    assert report.ok, report.first_bad  # the attack succeeds against an unpinned audit
    assert "accidental damage only" in report.summary()
    assert_pins_fail(folder, pin, parties_copy, tmp_path, "party client-2's keys differ",
                     "party server's keys differ")


def test_dropped_masked_input_of_a_counted_client_is_caught_without_a_pin(folder):
    """Adversary: a folder writer drops client-2's round-1 masked input and re-signs the log
    with fresh keys, leaving the server's aggregated event that counts client-2. Before the fix
    it passed --verify; the counted-client rule catches it with no pin."""
    rebuild(folder, without_masked_input(records(folder), "client-2", uncount=False),
            strip_payloads=True)  # else the signed-view rule fires first
    report = verify_run(folder)
    assert not report.ok
    assert ("client-2 is counted in the round-1 gradient aggregate but sent no input to it"
            in report.first_bad.problem)
    assert records(folder)[report.first_bad.seq]["event"] == "aggregated"


def test_rebuild_injecting_client_99_fails_every_pin_naming_the_added_party(honest, folder,
                                                                            tmp_path):
    """Adversary: a folder writer adds client-99 to parties.json, injects an upload from it
    and re-signs every record with fresh keys. Before the fix it passed --verify, and an
    unpinned audit still passes it (the record breaks no protocol rule); every pin fails it,
    and the keys pin names client-99 as added."""
    _, pin, parties_copy = honest
    log = with_record_from(records(folder), "client-99", "masked_input")
    rebuild(folder, [r | {"phase": "upload"} if r["sender"] == "client-99" else r for r in log],
            new_parties=("client-99",), strip_payloads=True)
    assert verify_run(folder).ok  # the attack succeeds against an unpinned audit
    assert_pins_fail(folder, pin, parties_copy, tmp_path, "parties added: client-99")


@pytest.mark.parametrize("phase, registered, problem", [
    ("masked_input", True, "record {k}: client-99 takes part in the round-1 gradient secure "
                           "aggregation (masked_input) without advertising keys in it"),
    ("unmask", True, "record {k}: client-99 takes part in the round-1 gradient secure "
                     "aggregation (unmask) without advertising keys in it"),
    ("masked_input", False, "record {k}: sender 'client-99' is not in parties.json"),
])
def test_record_injected_from_client_99_into_secure_aggregation_is_caught_without_a_pin(
        folder, phase, registered, problem):
    """Adversary: a folder writer injects a secure-aggregation message from client-99 (added to
    parties.json or not) and re-signs every record with fresh keys. Before the fix the
    registered case passed --verify; the rule that a client joins an aggregation by
    advertising keys catches it with no pin."""
    log = with_record_from(records(folder), "client-99", phase)
    rebuild(folder, log, new_parties=("client-99",) if registered else ())
    k = next(i for i, r in enumerate(log) if r["sender"] == "client-99")
    report = verify_run(folder)
    assert not report.ok and report.first_bad.seq == k
    assert report.first_bad.problem == problem.format(k=k)


def test_record_naming_an_unregistered_recipient_is_caught_without_a_pin(folder):
    """Adversary: a folder writer turns a broadcast to client-1 into one to client-99, a party
    parties.json does not hold, and re-signs every record with fresh keys."""
    log = records(folder)
    k = next(i for i, r in enumerate(log) if r["phase"] == "broadcast")
    log[k]["recipient"] = "client-99"
    rebuild(folder, log)
    report = verify_run(folder)
    assert report.first_bad.problem == f"record {k}: recipient 'client-99' is not in parties.json"


def test_client_signed_closing_record_is_caught_by_rule_and_by_every_pin(honest, folder,
                                                                          tmp_path):
    """Adversary: a folder writer closes the log with a record signed by client-1 and re-signs
    every record with fresh keys. Before the fix it passed --verify; the closing rule (the
    server closes) catches it with no pin, and every pin fails it."""
    _, pin, parties_copy = honest
    log = records(folder)
    log[-1]["sender"] = "client-1"
    rebuild(folder, log, strip_payloads=True)  # else the signed-view rule fires first
    report = verify_run(folder)
    assert not report.ok and report.first_bad.seq == len(log) - 1
    assert "the closing record must be signed by server, but client-1 signed it" in (
        report.first_bad.problem)
    assert_pins_fail(folder, pin, parties_copy, tmp_path, "party client-1's keys differ")


def test_substituted_relayed_key_is_caught_without_a_pin(folder):
    """Adversary: a folder writer (or a server that swapped keys in transit) makes the
    server's round-1 keys message to client-1 carry another s_pk for client-2 than client-2
    advertised, storing the new payload, and re-signs every record with fresh keys. The
    relayed-keys rule, reading payloads.bin, catches it with no pin."""
    log = records(folder)
    k = next(i for i, r in enumerate(log) if r["phase"] == "keys" and r["recipient"] == "client-1")
    with (folder / "payloads.bin").open("rb") as payloads:
        payloads.seek(log[k]["offset"])
        keys = deserialize_payload(payloads.read(log[k]["bytes"]))
    keys["s_pk:client-2"] = np.frombuffer(new_key_pair().public, dtype=np.uint8)
    data = serialize_payload(keys)
    with (folder / "payloads.bin").open("ab") as payloads:
        offset = payloads.tell()
        payloads.write(data)
    log[k] |= {"offset": offset, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    rebuild(folder, log)
    report = verify_run(folder)
    assert not report.ok and report.first_bad.seq == k
    assert report.first_bad.problem == (f"record {k}: the server relayed to client-1 a s_pk for "
                                        "client-2 that client-2 did not advertise in this "
                                        "aggregation")


def test_deleted_payloads_bin_fails_the_audit(folder):
    """Adversary: a folder writer deletes payloads.bin. Before the fix every payload check was
    silently skipped and --verify passed; now the first record with an offset fails."""
    (folder / "payloads.bin").unlink()
    assert main(["--verify", str(folder)]) == 1
    report = verify_run(folder)
    assert report.first_bad.seq == 0
    assert "record 0 has a payload offset but payloads.bin is missing" in report.first_bad.problem


def test_payloads_stripped_by_a_rebuild_leave_the_key_check_not_done(honest, folder, tmp_path):
    """Adversary: a folder writer deletes payloads.bin and re-signs every record without its
    offset (fresh keys). An unpinned audit passes it but reports the relayed-key check as not
    done, never as passed; every pin fails it."""
    _, pin, parties_copy = honest
    rebuild(folder, records(folder), strip_payloads=True)
    report = verify_run(folder)
    assert report.ok and report.payloads == 0
    status = report.checks["secagg: relayed keys equal the advertised ones"]
    assert status.startswith("NOT DONE for 6 keys message(s): payloads.bin was not kept")
    assert status in report.summary()
    assert_pins_fail(folder, pin, parties_copy, tmp_path, "party client-3's keys differ")


def test_partly_stripped_offsets_are_caught_without_a_pin(folder):
    """Adversary: a folder writer strips the payload offset from the first masked input only
    (hiding its payload from the audit) and re-signs every record with fresh keys."""
    log = records(folder)
    k = next(i for i, r in enumerate(log) if r["phase"] == "masked_input")
    del log[k]["offset"]
    rebuild(folder, log)
    report = verify_run(folder)
    assert report.first_bad.seq == k
    assert "has no payload offset, unlike the message records before it" in (
        report.first_bad.problem)
