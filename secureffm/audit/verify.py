"""Verify a run's message log: every record well formed, in order, chained, signed and, when the
payloads were kept, matching the bytes stored in ``payloads.bin``.

The checks, in order, for each line of ``messages.jsonl`` (stopping at the first failure):

1. the line is a JSON object with every required field, of the right type;
2. ``seq`` equals the line's index (0-based);
3. ``prev`` equals the sha256 of the previous line's exact bytes (of parties.json for the first);
4. ``sender`` is a party of ``parties.json``;
5. ``sig`` is the sender's Ed25519 signature of :func:`~secureffm.federation.log.canonical`;
6. if ``payloads.bin`` exists and the record has ``offset``, the ``bytes`` stored there hash to
   ``sha256``.

A deleted, inserted or reordered line shows up as the first seq mismatch or broken chain link;
an edited field as a signature failure (or, when the editor re-signed it with the sender's key,
as a broken link on the next line); replaced keys as a broken first link (its ``prev`` is the
sha256 of parties.json); lines cut off the end by the missing closing record, which only the
server's key can sign. What the chain cannot show: a log rebuilt end to end by someone holding
the keys, which is why its last hash is worth keeping elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import SecureFFMError
from ..federation.log import PARTIES_FILE, PAYLOADS_FILE, canonical, genesis
from ..protocols.crypto import verify_signature

__all__ = ["AuditFinding", "AuditReport", "verify_run", "main", "LOG_FILE"]

LOG_FILE = "messages.jsonl"

# Required field -> (type(s), what it must be, in words).
_FIELDS: dict[str, tuple[type, str]] = {
    "seq": (int, "an integer"),
    "round": (int, "an integer"),
    "phase": (str, "a string"),
    "kind": (str, "a string"),
    "sender": (str, "a string"),
    "recipient": (str, "a string"),
    "stages": (list, "a list"),
    "bytes": (int, "an integer"),
    "sha256": (str, "a string"),
    "prev": (str, "a string"),
    "sig": (str, "a string"),
}
_EVENT_FIELDS: dict[str, tuple[type, str]] = {
    "event": (str, "a string"),
    "party": (str, "a string"),
    "detail": (str, "a string"),
}
_HEX = frozenset("0123456789abcdef")
_CHAIN_HINT = "(a record was deleted, inserted, reordered or edited)"


@dataclass(frozen=True)
class AuditFinding:
    """The first bad record: its ``seq`` as written (None when unreadable), its 1-based ``line``
    in messages.jsonl, and a sentence saying what is wrong."""

    seq: int | None
    line: int
    problem: str


@dataclass(frozen=True)
class AuditReport:
    """The verdict on one run's log.

    ``records``: records that verified (all of them when ``ok``; those before ``first_bad``
    otherwise). ``events``: event records by their ``event`` field and ``kinds``: message
    records by kind, both over the verified records. ``payloads``: records whose payload bytes
    were checked against payloads.bin. ``lines``: lines in messages.jsonl.
    """

    ok: bool
    records: int
    first_bad: AuditFinding | None
    events: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    payloads: int = 0
    lines: int = 0

    def summary(self) -> str:
        """A few human lines, the verdict first."""
        if self.ok:
            out = [f"OK: log intact: {self.records} records chained and signed by known parties"]
        else:
            bad = self.first_bad
            assert bad is not None
            out = [f"FAILED: log not intact: {bad.problem}",
                   f"{self.records} of {self.lines} lines verified before line {bad.line}"]
        if self.payloads:
            out.append(f"payloads: {self.payloads} matched their sha256 in {PAYLOADS_FILE}")
        else:
            out.append(f"payloads: not checked (no {PAYLOADS_FILE} or no offsets in the log)")
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())) or "none"
        events = ", ".join(f"{k} {n}" for k, n in sorted(self.events.items())) or "none"
        out.append(f"messages by kind: {kinds}")
        out.append(f"server events: {events}")
        return "\n".join(out)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hex(value: str, length: int) -> bool:
    return len(value) == length and set(value) <= _HEX


def _load_parties(run_dir: Path) -> dict[str, bytes]:
    path = run_dir / PARTIES_FILE
    if not path.is_file():
        raise SecureFFMError(f"{path} is missing: a run folder needs {PARTIES_FILE} (the "
                             "parties' public keys) beside messages.jsonl")
    try:
        parties = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SecureFFMError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(parties, dict):
        raise SecureFFMError(f"{path} must map party id -> hex Ed25519 public key")
    keys = {}
    for party, key in parties.items():
        if not isinstance(key, str) or not _is_hex(key, 64):
            raise SecureFFMError(f"{path}: the key of {party!r} is not a 32-byte hex Ed25519 "
                                 "public key")
        keys[party] = bytes.fromhex(key)
    return keys


def _check_fields(record: Any, line: int) -> str | None:
    """None when ``record`` has every required field with the right type, else the problem."""
    if not isinstance(record, dict):
        return f"line {line} is not a JSON object"
    fields = dict(_FIELDS)
    if record.get("kind") == "event":
        fields.update(_EVENT_FIELDS)
    missing = [name for name in fields if name not in record]
    if missing:
        return f"line {line}: record is missing field(s) {', '.join(map(repr, missing))}"
    for name, (kind, words) in fields.items():
        value = record[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"line {line}: field {name!r} must be {words}, got {value!r}"
    if "offset" in record and not (_is_int(record["offset"]) and record["offset"] >= 0):
        return f"line {line}: field 'offset' must be a non-negative integer"
    if record["bytes"] < 0:
        return f"line {line}: field 'bytes' must be non-negative"
    for name, length in (("sha256", 64), ("prev", 64), ("sig", 128)):
        if not _is_hex(record[name], length):
            return f"line {line}: field {name!r} is not {length} lowercase hex digits"
    return None


def verify_run(run_dir: str | Path) -> AuditReport:
    """Check ``RUN_DIR/messages.jsonl`` against ``RUN_DIR/parties.json`` (and payloads.bin).

    Raises SecureFFMError when parties.json or messages.jsonl is missing or unreadable; every
    problem inside the log is reported in the returned report instead.
    """
    run_dir = Path(run_dir)
    parties = _load_parties(run_dir)
    log_path = run_dir / LOG_FILE
    if not log_path.is_file():
        raise SecureFFMError(f"{log_path} is missing: is {run_dir} a run folder?")
    payload_path = run_dir / PAYLOADS_FILE
    kinds: Counter[str] = Counter()
    events: Counter[str] = Counter()
    checked = verified = lines = 0
    prev = genesis((run_dir / PARTIES_FILE).read_bytes())
    finding = None
    closed_at = None
    with ExitStack() as stack:
        log = stack.enter_context(log_path.open("rb"))
        payloads = stack.enter_context(payload_path.open("rb")) if payload_path.is_file() else None
        for index, raw in enumerate(log):
            lines += 1
            if finding is not None:
                continue  # only count the remaining lines
            text = raw[:-1] if raw.endswith(b"\n") else raw
            if closed_at is not None:
                finding = AuditFinding(None, index + 1, f"line {index + 1} comes after the "
                                       f"closing record (line {closed_at})")
                continue
            record, finding = _check_line(index, text, prev, parties, payloads)
            if finding is not None:
                continue
            if record["kind"] == "event":
                events[record["event"]] += 1
                if record["event"] == "closed":
                    closed_at = index + 1
            else:
                kinds[record["kind"]] += 1
            checked += payloads is not None and "offset" in record
            verified += 1
            prev = hashlib.sha256(text).hexdigest()
    if finding is None and closed_at is None:
        finding = AuditFinding(None, lines, f"the log ends at line {lines} without its signed "
                               "closing record: it was cut short, or the run never finished")
    return AuditReport(ok=finding is None, records=verified, first_bad=finding,
                       events=dict(events), kinds=dict(kinds), payloads=checked, lines=lines)


def _check_line(index: int, text: bytes, prev: str, parties: dict[str, bytes],
                payloads: BinaryIO | None) -> tuple[Any, AuditFinding | None]:
    """Line ``index`` (0-based) parsed, and its first problem given the previous line's hash."""
    line = index + 1
    try:
        record = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, AuditFinding(None, line, f"line {line} is not valid JSON")
    seq = record.get("seq") if isinstance(record, dict) else None
    seq = seq if _is_int(seq) else None
    problem = _check_record(record, index, text, prev, parties, payloads)
    return record, None if problem is None else AuditFinding(seq, line, problem)


def _check_record(record: Any, index: int, text: bytes, prev: str, parties: dict[str, bytes],
                  payloads: BinaryIO | None) -> str | None:
    line = index + 1
    problem = _check_fields(record, line)
    if problem:
        return problem
    seq = record["seq"]
    if text != json.dumps(record, sort_keys=True, separators=(",", ":")).encode():
        return (f"line {line} is not in the log's exact form (sorted keys, compact JSON): it "
                "was rewritten after signing")
    if seq != index:
        return (f"line {line}: seq is {seq}, expected {index} (a record was deleted, inserted "
                "or reordered at or before this line)")
    if record["prev"] != prev:
        what = (f"the sha256 of {PARTIES_FILE} (keys replaced?)" if index == 0
                else f"the hash of line {line - 1}")
        return f"line {line}: chain broken: prev does not match {what} {_CHAIN_HINT}"
    sender = record["sender"]
    if sender not in parties:
        return f"record {seq}: sender {sender!r} is not in {PARTIES_FILE}"
    if not verify_signature(parties[sender], bytes.fromhex(record["sig"]), canonical(record)):
        return (f"record {seq}: signature does not verify with {sender}'s key (a signed field "
                "was edited, or another key signed it)")
    if payloads is not None and "offset" in record:
        payloads.seek(record["offset"])
        data = payloads.read(record["bytes"])
        if len(data) != record["bytes"]:
            return (f"record {seq}: {PAYLOADS_FILE} ends before its payload "
                    f"({record['bytes']} bytes at offset {record['offset']})")
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            return f"record {seq}: payload in {PAYLOADS_FILE} does not match its sha256"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``secureffm audit``."""
    parser.add_argument("--verify", metavar="RUN_DIR", required=True,
                        help="run folder holding messages.jsonl and parties.json")


def audit_command(args: argparse.Namespace) -> int:
    """Print the verdict; 0 intact, 1 tampered, 2 when the folder cannot be read."""
    try:
        report = verify_run(args.verify)
    except SecureFFMError as err:
        print(f"secureffm: error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


def main(argv: list[str]) -> int:
    """``secureffm audit --verify RUN_DIR`` as a function (see :func:`audit_command`)."""
    parser = argparse.ArgumentParser(prog="secureffm audit",
                                     description="Verify a run's signed, hash-chained log.")
    add_arguments(parser)
    return audit_command(parser.parse_args(argv))
