"""Verify a run's message log: every record well formed, in order, chained, signed, matching
its payload in ``payloads.bin``, and obeying the protocol rules; optionally against a pin kept
apart from the run folder.

What it proves depends on what was pinned:

- nothing pinned (``--verify RUN_DIR``): integrity against accidental damage only. Anyone who
  can write the run folder can regenerate every key, rewrite parties.json and re-sign a
  rebuilt log that passes; only the protocol rules (:mod:`secureffm.audit.rules`) can still
  catch a rebuild that breaks them.
- keys pinned (``--parties PINNED``: a parties.json copy or a pin file): every record was
  signed with the pinned keys, so a folder writer who holds none of the parties' private keys
  cannot rebuild the log. A key holder can still re-sign records that only it signed, e.g.
  the server the records after the last one a client signed.
- head pinned (``--expect-head HASH``, or a pin file): the log and parties.json are exactly
  those pinned, against anyone who can write the folder, key holders included.

The checks, in order, for each line of ``messages.jsonl`` (stopping at the first failure):

1. the line is a JSON object with every required field, of the right type;
2. ``seq`` equals the line's index (0-based);
3. ``prev`` equals the sha256 of the previous line's exact bytes (of parties.json for the first);
4. ``sender`` is a party of ``parties.json``;
5. the record is its sender's: ``sig`` is the sender's Ed25519 signature of
   :func:`~secureffm.federation.log.canonical` (the record's content: every field but sig, seq,
   prev and offset, which the sender cannot know when it signs), or (with ``links``, the
   default) a record of the same sender that is itself the sender's carries the sha256 of that
   content as its signed ``last`` (:func:`verify_run`); the closing record's signed ``chain``
   equals its ``prev``, so the closer's signature pins the place of every record before it;
6. a record with ``offset`` needs ``payloads.bin`` (its absence fails), and the ``bytes`` stored
   there hash to ``sha256``; message records carry offsets all or none;
7. the protocol rules of :class:`~secureffm.audit.rules.ProtocolRules`;

and, before the first line, parties.json against the pinned keys; after the last, the head
(sha256 of the closing line) against the pinned head.

A deleted, inserted or reordered line shows up as the first seq mismatch or broken chain link
(or, when the editor rewrote seq and prev after it, as the closing record's chain mismatch); an
edited field as a signature failure; replaced keys as a broken first link (its ``prev`` is the
sha256 of parties.json); lines cut off the end by the missing closing record.

Speed (``benchmarks/audit.py``, docs/benchmarks.md): the log is streamed in batches of
:data:`BATCH` lines. Each line is decoded once and hashed once (the chain). A message line as the
writer emits it matches one regular expression (``_MESSAGE_LINE``) whose match proves check 1
and the exact form, and whose groups are the signed bytes; any other line (events, anything
unusual) is checked field by field, encoded again for the exact-form check, and its signed
bytes cut out of it by :func:`signed_bytes`. Neither serializes the record again. Each signed
link is matched to the sender's records still pending (one sha256 of the signed bytes per
record), and the signatures of the records no link names are then verified back to back with
libsodium
(:func:`~secureffm.federation.crypto.verify_signatures`: one after another on one CPU, in
chunks on threads when the process may use several; no batch verification there either: a
loop of bare verifications is the one-CPU floor the benchmark compares with), and its records'
payloads and protocol rules checked last, in log order; each pass stops at the first problem, so
the first bad record is named as when each record is checked in full before the next
(tests/audit/test_verify.py compares every batch size with batches of one line).
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import SecureFFMError
from ..federation.crypto import verify_signatures
from ..federation.journal import verify_journal
from ..federation.keyfiles import load_registry
from ..federation.log import PARTIES_FILE, PAYLOADS_FILE, canonical, genesis
from ..federation.message import UNSIGNED_FIELDS, link_of
from ..federation.pin import PartyKeys, RunPin, is_hex, load_parties, pin_of
from .rules import ProtocolRules

__all__ = ["AuditFinding", "AuditReport", "verify_run", "pin_run", "signed_bytes", "LOG_FILE",
           "insecure_deterministic"]

LOG_FILE = "messages.jsonl"



class _Shape:
    """The fields one kind of record needs: name -> (type, what it must be, in words). JSON
    decodes to exact types, so a value has the right one when ``type(value) is`` it (which
    also keeps a bool from passing as an integer); ``values`` reads them all in one call."""

    def __init__(self, fields: dict[str, tuple[type, str]]):
        self.fields = fields
        self.values = itemgetter(*fields)
        self.types = [kind for kind, _ in fields.values()]


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
_EVENT_FIELDS = {**_FIELDS, "event": (str, "a string"), "party": (str, "a string"),
                 "detail": (str, "a string")}
_MESSAGE = _Shape(_FIELDS)
_EVENT = _Shape(_EVENT_FIELDS)
# Events with structured fields of their own.
_EVENTS = {
    "closed": _Shape({**_EVENT_FIELDS, "records": (int, "an integer"),
                      "chain": (str, "a string")}),
    "aggregated": _Shape({**_EVENT_FIELDS, "included": (list, "a list"),
                          "of_kind": (str, "a string")}),
}
_HEX = re.compile("[0-9a-f]*")
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode  # the exact form
_DECODE = json.JSONDecoder().decode
_RAW_DECODE = json.JSONDecoder().raw_decode
# An unsigned field as the exact form writes it after the first field: a comma, the key, and a
# non-negative integer or a lowercase hex string (all that _check_fields lets these fields be).
_UNSIGNED_ITEM = re.compile(rb',"(?:%s)":(?:[0-9]+|"[0-9a-f]*")' % b"|".join(
    re.escape(name.encode()) for name in sorted(UNSIGNED_FIELDS)))
# A message record's line as the writer emits it: the fields a message record has, in sorted
# order, each value in a form the exact form writes as is (non-negative integers without
# leading zeros, a round that may be negative, strings of printable ASCII without quote or
# backslash, lowercase hex of the right length, a list of such strings), and a kind other than
# "event". A line that matches it is the exact form of the record it decodes to, and that record
# passes _check_fields: both checks are skipped for it. Its groups are the line less its
# unsigned fields (offset, prev, seq, sig): joined, the signed bytes. Any other line, events
# included, takes the full checks.
_STRING = rb'"[ !#-\[\]-~]*"'
_COUNT = rb"(?:0|[1-9][0-9]*)"
_MESSAGE_LINE = re.compile(b"".join([
    rb'(\{"bytes":', _COUNT, rb',"kind":(?!"event")', _STRING,
    rb'(?:,"last":"[0-9a-f]{64}")?)',
    rb'(?:,"offset":', _COUNT, rb")?",
    rb'((?:,"origin":', _STRING, rb')?,"phase":', _STRING, rb")",
    rb',"prev":"[0-9a-f]{64}"',
    rb'(,"recipient":', _STRING, rb',"round":(?:0|-?[1-9][0-9]*),"sender":', _STRING, rb")",
    rb',"seq":', _COUNT,
    rb'(,"sha256":"[0-9a-f]{64}")',
    rb',"sig":"[0-9a-f]{128}"',
    rb'(,"stages":\[(?:', _STRING, rb"(?:,", _STRING, rb")*)?\]\})"]))
_CHAIN_HINT = "(a record was deleted, inserted, reordered or edited)"
_SCOPE = {
    (): ("integrity against accidental damage only: anyone who can write the run folder can "
         "rebuild it with new keys and pass this check; keep a pin apart (secureffm audit "
         "--pin) and verify with --expect-head or --parties"),
    ("keys",): ("every record is signed with the pinned keys: a folder writer holding none of "
                "the parties' private keys cannot rebuild the log; a key holder can re-sign "
                "what only it signed (pin the head too)"),
    ("head",): ("the log and parties.json are exactly the pinned ones, against anyone who can "
                "write the run folder"),
}


@dataclass(frozen=True)
class AuditFinding:
    """The first problem: the bad record's ``seq`` as written (None when unreadable or not a
    record), its 1-based ``line`` in messages.jsonl (None for a problem of the folder as a
    whole: keys or head differing from the pin), and a sentence saying what is wrong."""

    seq: int | None
    line: int | None
    problem: str


@dataclass(frozen=True)
class AuditReport:
    """The verdict on one run's log.

    ``records``: records that verified (all of them when ``ok``; those before ``first_bad``
    otherwise). ``events``: event records by their ``event`` field and ``kinds``: message
    records by kind, both over the verified records. ``payloads``: records whose payload bytes
    were checked against payloads.bin. ``lines``: lines in messages.jsonl. ``head``: sha256 of
    the closing line, once verified. ``pinned``: what was compared with a pin ("keys", "head").
    ``checks``: each protocol rule over many records -> what it checked, or why not done.
    ``randomness``: where the parties' secret streams came from, as config.toml states it.
    ``linked``: records authenticated by their signer's next record's signed back link
    (``last``) instead of their own signature (see :func:`verify_run`).
    """

    ok: bool
    records: int
    first_bad: AuditFinding | None
    events: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    payloads: int = 0
    lines: int = 0
    head: str | None = None
    pinned: tuple[str, ...] = ()
    checks: dict[str, str] = field(default_factory=dict)
    randomness: str = ""
    linked: int = 0

    @property
    def scope(self) -> str:
        """What an ``ok`` verdict proves, given what was pinned."""
        return _SCOPE[("head",) if "head" in self.pinned else self.pinned]

    def _verdict_ok(self) -> str:
        """The first line of an intact log's report: what was checked, and what was not."""
        undone = [rule for rule, status in self.checks.items() if "NOT DONE" in status]
        line = (f"OK: log intact: {self.records} records chained and signed by known parties "
                "and obeying the protocol rules")
        if not undone:
            return line
        why = ("payloads.bin was not kept; run with --keep-payloads to check them"
               if not self.payloads else "see their lines below")
        return f"{line}; {len(undone)} check(s) NOT DONE ({'; '.join(undone)}): {why}"

    def summary(self) -> str:
        """A few human lines, the verdict first: an OK names the checks that were NOT DONE."""
        if self.ok:
            out = [self._verdict_ok(), f"proves: {self.scope}",
                   f"head: {self.head}",
                   f"signatures: {self.records - self.linked} verified; {self.linked} records "
                   "authenticated by another signed record of their signer that holds their hash"]
        else:
            bad = self.first_bad
            assert bad is not None
            where = f" before line {bad.line}" if bad.line is not None else ""
            out = [f"FAILED: log not intact: {bad.problem}",
                   f"{self.records} of {self.lines} lines verified{where}"]
        if self.payloads:
            out.append(f"payloads: {self.payloads} matched their sha256 in {PAYLOADS_FILE}")
        else:
            out.append("payloads: not checked (no offsets in the log: payloads were not kept)")
        out += [f"{rule}: {status}" for rule, status in self.checks.items()]
        out.append(f"secret randomness: {self.randomness}")
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())) or "none"
        events = ", ".join(f"{k} {n}" for k, n in sorted(self.events.items())) or "none"
        out.append(f"messages by kind: {kinds}")
        out.append(f"server events: {events}")
        return "\n".join(out)


def _shape(record: dict) -> _Shape:
    """The fields ``record`` needs, by its kind and event."""
    if record.get("kind") != "event":
        return _MESSAGE
    event = record.get("event")
    return _EVENTS.get(event, _EVENT) if type(event) is str else _EVENT


def _check_fields(record: Any, line: int) -> str | None:
    """None when ``record`` has every required field with the right type, else the problem."""
    if type(record) is not dict:
        return f"line {line} is not a JSON object"
    shape = _shape(record)
    try:
        values = shape.values(record)
    except KeyError:
        missing = [name for name in shape.fields if name not in record]
        return f"line {line}: record is missing field(s) {', '.join(map(repr, missing))}"
    if list(map(type, values)) != shape.types:  # one pass; else name the first wrong field
        for name, (kind, words) in shape.fields.items():
            if type(record[name]) is not kind:
                return f"line {line}: field {name!r} must be {words}, got {record[name]!r}"
    if "included" in shape.fields and not all(type(c) is str for c in record["included"]):
        return f"line {line}: field 'included' must list client ids (strings)"
    if "offset" in record and not (type(record["offset"]) is int and record["offset"] >= 0):
        return f"line {line}: field 'offset' must be a non-negative integer"
    if record["bytes"] < 0:
        return f"line {line}: field 'bytes' must be non-negative"
    if "last" in record and not is_hex(record["last"], 64):
        return f"line {line}: field 'last' is not 64 lowercase hex digits"
    digest, prev, sig = record["sha256"], record["prev"], record["sig"]
    if not (len(digest) == len(prev) == 64 and len(sig) == 128
            and _HEX.fullmatch(digest + prev + sig)):  # one pass; else name the bad field
        for name, length in (("sha256", 64), ("prev", 64), ("sig", 128)):
            if not is_hex(record[name], length):
                return f"line {line}: field {name!r} is not {length} lowercase hex digits"
    return None


def signed_bytes(line: bytes, record: dict) -> bytes:
    """What the signer of ``record`` signed, :func:`~secureffm.federation.log.canonical` of it,
    cut out of ``line``: the record in the log's exact form, whose fields passed the audit's
    checks (the unsigned ones are non-negative integers and lowercase hex strings, and the first
    field, ``bytes``, is signed).

    The exact form is sorted-key compact JSON, so the signed form is the line less each unsigned
    field's ``,"name":value``. Outside a string, ``,"`` starts a key or a list item, and ``":``
    after it makes it a key; inside a string every quote is escaped. With no object nested in
    the record (no ``{`` after the first byte) every key is the record's own, so each match is
    one unsigned field. A line with a nested object, which the writer never produces, is
    serialized again instead.
    """
    if line.find(b"{", 1) >= 0:
        return canonical(record)
    return _UNSIGNED_ITEM.sub(b"", line)


def _parse(string: str) -> Any:
    """The JSON value of ``string``, read in one call when nothing surrounds it (as in the
    exact form); otherwise by the decoder that skips whitespace and names what is wrong."""
    try:
        value, end = _RAW_DECODE(string)
        if end == len(string):
            return value
    except json.JSONDecodeError:
        pass
    return _DECODE(string)


def _unreadable(line: int) -> str:
    return (f"line {line} is JSON that no record holds (a number too long or lists nested too "
            "deep to read)")


def _exact_form(record: dict, string: str, line: int) -> str | None:
    if string != _ENCODE(record):
        return (f"line {line} is not in the log's exact form (sorted keys, compact JSON): "
                "it was rewritten after signing")
    return None


def _closing_chain(record: dict) -> str | None:
    """The closing record signs the chain it closes: its ``chain`` must be its ``prev``."""
    if record.get("event") == "closed" and record["chain"] != record["prev"]:
        return (f"record {record['seq']}: the closing record signed chain {record['chain'][:16]}"
                f"..., not the log before it {_CHAIN_HINT}")
    return None


# Lines whose signatures are verified together, after their form and chain are read and before
# their payloads and rules are checked (see _Walk.batch).
BATCH = 256

_Signed = tuple[bytes, bytes, bytes]  # raw public key, signature, message
_Due = tuple[_Signed, int, int, str]  # a signature to verify, its record's seq, line and sender
# Lines after which a record no link named has its own signature verified (links in a log
# written in signing order name a record within a few messages of its sender).
WINDOW = 4096


def _first_forged(signed: list[_Signed]) -> int:
    """The index of the first signature that does not verify; ``len(signed)`` when all do."""
    return next((i for i, ok in enumerate(verify_signatures(signed)) if not ok), len(signed))


class _Walk:
    """State while reading one log front to back: the previous line's hash, the parties'
    raw Ed25519 public keys, the payload file, whether message records carry
    offsets, the protocol rules, and what verified so far: ``records``, ``payloads`` checked,
    ``kinds`` and ``events`` counted, the 1-based line of the closing record and the head.

    With ``links``, a record's signature is verified only when no other record of the same
    sender links to it (carries the sha256 of its signed bytes as ``last``). Links need not
    follow log order (a party may sign several messages before the log writes them):
    ``pending`` holds, per sender, the records no link named yet (by their link), ``ahead`` the
    links named before their record appeared (with the line that named them); ``due`` the
    records whose signatures must be verified: those still unnamed :data:`WINDOW` lines later,
    a second copy of a pending record, and at the closing record every record still pending.
    ``linked`` counts the records a link authenticated. A link is signed by its record, so the
    links form chains that cannot loop (a record would hold the hash of a record holding its
    own hash), and each chain starts at a record no link names, whose signature is verified:
    every record is authenticated by its own signature or a chain of its sender's signatures."""

    def __init__(self, parties: dict[str, PartyKeys], parties_text: bytes,
                 payloads: BinaryIO | None, links: bool = True):
        self.links = links
        self.pending: dict[str, dict[str, _Due]] = {}
        self.ahead: dict[str, dict[str, int]] = {}
        self.due: list[_Due] = []
        self.linked = 0
        self.keys = {party: keys.sign for party, keys in parties.items()}
        self.payload_file = payloads
        self.prev = genesis(parties_text)
        self.offsets: bool | None = None  # message records carry offsets (None: none seen)
        self.rules = ProtocolRules({party: keys.sign for party, keys in parties.items()})
        self.records = self.payloads = 0
        self.kinds: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.closed_at: int | None = None
        self.head: str | None = None

    def batch(self, start: int, texts: list[bytes]) -> AuditFinding | None:
        """Check lines ``start``, ``start + 1``, ... (0-based, without their newlines) and count
        the records that pass; the first problem in log order, or None.

        Three passes: each line's form, place in the chain and sender; the signatures, back to
        back (the verification code stays in the CPU's caches: about 5% faster than one record
        at a time); then each record's closing chain, payload and protocol rules. A record's
        checks run in the same order as one at a time, and each pass runs only over the records
        before the earlier passes' first problem, so the first problem found is the same.
        """
        if self.closed_at is not None and texts:
            return _after_close(start + 1, self.closed_at)
        read: list[tuple[dict, str]] = []  # record, sha256 of its line
        signed: list[_Signed] = []
        first = None
        for offset, text in enumerate(texts):
            record, message, first = self._read(start + offset, text)
            if first is not None:
                break
            read.append((record, self.prev))
            item = (self.keys[record["sender"]], bytes.fromhex(record["sig"]), message)
            if self.links:
                self._link(record, item, start + offset + 1)
            else:
                signed.append(item)
        forged = len(read) if self.links else _first_forged(signed)
        if forged < len(read):
            record = read[forged][0]
            first = AuditFinding(record["seq"], start + forged + 1, (
                f"record {record['seq']}: signature does not verify with {record['sender']}'s "
                "key (a signed field was edited, or another key signed it)"))
            del read[forged:]
        for offset, (record, digest) in enumerate(read):
            line = start + offset + 1
            problem = self._admit(record, line, digest)
            if problem is not None:
                return AuditFinding(record["seq"], line, problem)
            if self.closed_at is not None and offset + 1 < len(texts):
                return _after_close(line + 1, line)
        if first is None and self.links:
            first = self._verify_due(start + len(texts), final=self.closed_at is not None)
        return first

    def _link(self, record: dict, item: _Signed, line: int) -> None:
        """Note the link ``record`` carries and whether a link named it (``item``: what verifying
        its signature needs, ``item[2]`` its signed bytes)."""
        sender = record["sender"]
        pending = self.pending.setdefault(sender, {})
        ahead = self.ahead.setdefault(sender, {})
        last = record.get("last")
        if last is not None:
            if pending.pop(last, None) is not None:
                self.linked += 1
            else:
                ahead[last] = line
        link = link_of(item[2])
        due = (item, record["seq"], line, sender)
        if ahead.pop(link, None) is not None:
            self.linked += 1
        elif link in pending:
            self.due.append(due)  # a second copy (a replay): its signature is checked
        else:
            pending[link] = due

    def _verify_due(self, line: int, final: bool) -> AuditFinding | None:
        """Queue the records pending since before ``line - WINDOW`` (all of them when
        ``final``) and verify the queue once a batch's worth is there, or when ``final``; the
        first signature that does not verify, or None."""
        for sender, pending in self.pending.items():
            self.due += [due for due in pending.values() if final or due[2] < line - WINDOW]
            self.pending[sender] = {} if final else {
                link: due for link, due in pending.items() if due[2] >= line - WINDOW}
            self.ahead[sender] = {} if final else {
                link: at for link, at in self.ahead[sender].items() if at >= line - WINDOW}
        if not self.due or not (final or len(self.due) >= BATCH):
            return None
        due, self.due = sorted(self.due, key=itemgetter(1)), []
        forged = _first_forged([item for item, _, _, _ in due])
        if forged == len(due):
            return None
        _, seq, line, sender = due[forged]
        return AuditFinding(seq, line, f"record {seq}: signature does not verify with "
                            f"{sender}'s key (a signed field was edited, or another key signed it)")

    def _read(self, index: int, text: bytes) -> tuple[Any, bytes, AuditFinding | None]:
        """Line ``index`` parsed, its signed bytes, and the first problem of its form, its place
        in the chain or its sender; the chain moves past the line when there is none."""
        line = index + 1
        try:
            string = text.decode()
            record = _parse(string)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None, b"", AuditFinding(None, line, f"line {line} is not valid JSON")
        except (ValueError, RecursionError):
            return None, b"", AuditFinding(None, line, _unreadable(line))
        exact = _MESSAGE_LINE.fullmatch(text)  # a message line in the exact form, fields right
        try:
            problem = (None if exact else (_check_fields(record, line)
                                           or _exact_form(record, string, line)))
            problem = problem or self._chain(record, index) or self._sender(record)
        except RecursionError:  # encoding the exact form again nests deeper than decoding did
            problem = _unreadable(line)
        if problem is None:
            self.prev = hashlib.sha256(text).hexdigest()
            return record, b"".join(exact.groups()) if exact else signed_bytes(text, record), None
        seq = record.get("seq") if type(record) is dict else None
        return record, b"", AuditFinding(seq if type(seq) is int else None, line, problem)

    def _chain(self, record: dict, index: int) -> str | None:
        line, seq = index + 1, record["seq"]
        if seq != index:
            return (f"line {line}: seq is {seq}, expected {index} (a record was deleted, "
                    "inserted or reordered at or before this line)")
        if record["prev"] != self.prev:
            what = (f"the sha256 of {PARTIES_FILE} (keys replaced?)" if index == 0
                    else f"the hash of line {line - 1}")
            return f"line {line}: chain broken: prev does not match {what} {_CHAIN_HINT}"
        return None

    def _sender(self, record: dict) -> str | None:
        if record["sender"] not in self.keys:
            return f"record {record['seq']}: sender {record['sender']!r} is not in {PARTIES_FILE}"
        return None

    def _admit(self, record: dict, line: int, digest: str) -> str | None:
        """The first problem of a signed record's closing chain, payload or protocol rules;
        when none, count it (``digest``: the sha256 of its line, the head if it closes)."""
        problem = _closing_chain(record)
        if problem is not None:
            return problem
        payload, problem = self._payload(record)
        problem = problem or self.rules.check(record, payload)
        if problem is not None:
            return problem
        if record["kind"] == "event":
            self.events[record["event"]] += 1
            if record["event"] == "closed":
                self.closed_at, self.head = line, digest
        else:
            self.kinds[record["kind"]] += 1
        self.payloads += "offset" in record
        self.records += 1
        return None

    def _payload(self, record: dict) -> tuple[bytes | None, str | None]:
        """The record's payload bytes from payloads.bin (None when it has no offset), and the
        problem with them."""
        seq = record["seq"]
        if record["kind"] != "event":
            has = "offset" in record
            if self.offsets is not None and has != self.offsets:
                return None, (f"record {seq} {'has' if has else 'has no'} payload offset, "
                              f"unlike the message records before it: payloads are kept for "
                              "all messages or none")
            self.offsets = has
        if "offset" not in record:
            return None, None
        if self.payload_file is None:
            return None, (f"record {seq} has a payload offset but {PAYLOADS_FILE} is missing: "
                          "the payloads were deleted, so no payload can be checked")
        self.payload_file.seek(record["offset"])
        data = self.payload_file.read(record["bytes"])
        if len(data) != record["bytes"]:
            return None, (f"record {seq}: {PAYLOADS_FILE} ends before its payload "
                          f"({record['bytes']} bytes at offset {record['offset']})")
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            return None, f"record {seq}: payload in {PAYLOADS_FILE} does not match its sha256"
        return data, None


def _after_close(line: int, closed_at: int) -> AuditFinding:
    return AuditFinding(None, line, f"line {line} comes after the closing record (line "
                        f"{closed_at})")


def verify_run(run_dir: str | Path, pin: RunPin | None = None, *,
               links: bool = True) -> AuditReport:
    """Check ``RUN_DIR/messages.jsonl`` against ``RUN_DIR/parties.json`` (and payloads.bin),
    and against ``pin`` (kept apart from the folder) when given.

    ``links``: authenticate a record through its signer's next record when that one carries
    the hash of its signed bytes (``last``) and is itself authenticated, verifying only the
    signatures at the end of each such chain (about one per sender when every message was
    logged): the same records are authenticated as by verifying each signature, at the cost of
    a sha256 per record (the bytes a link names are what the sender signed, so only the signer
    can make a record its link matches), but a ``sig`` field that a link makes unnecessary is
    not read. A log with any problem is audited again record by record (``links=False``, every
    signature verified in log order), so the first problem reported is the same either way.

    Raises SecureFFMError when parties.json or messages.jsonl is missing or unreadable; every
    problem inside the log, or with respect to the pin, is reported in the returned report.
    """
    run_dir = Path(run_dir)
    pin = pin or RunPin()
    parties, parties_text = load_parties(run_dir / PARTIES_FILE)
    log_path = run_dir / LOG_FILE
    if not log_path.is_file():
        raise SecureFFMError(f"{log_path} is missing: is {run_dir} a run folder?")
    payload_path = run_dir / PAYLOADS_FILE
    lines = 0
    differs = pin.key_differences(parties, parties_text)
    finding = None if differs is None else AuditFinding(
        None, None, f"{PARTIES_FILE} differs from the pinned parties: {differs} (a log signed "
        "under other keys than the pinned ones proves nothing about the run)")
    with ExitStack() as stack:
        log = stack.enter_context(log_path.open("rb"))
        payloads = stack.enter_context(payload_path.open("rb")) if payload_path.is_file() else None
        walk = _Walk(parties, parties_text, payloads, links)
        while finding is None and (texts := [raw.removesuffix(b"\n")
                                             for raw in islice(log, BATCH)]):
            finding = walk.batch(lines, texts)
            lines += len(texts)
        lines += sum(1 for _ in log)  # after a problem, the remaining lines are only counted
    if finding is None and walk.closed_at is None:
        finding = AuditFinding(None, lines, f"the log ends at line {lines} without its signed "
                               "closing record: it was cut short, or the run never finished")
    if finding is None and pin.head is not None and walk.head != pin.head:
        finding = AuditFinding(None, None, f"the log's head {walk.head} differs from the pinned "
                               f"head {pin.head}: the log was rebuilt or changed after it was "
                               "pinned")
    checks = walk.rules.status()
    if finding is None and (run_dir / JOURNALS_DIR).is_dir():
        finding, checks[JOURNALS_RULE] = _journals(run_dir / JOURNALS_DIR, log_path)
    if finding is not None and links:
        return verify_run(run_dir, pin, links=False)
    pinned = tuple(name for name, value in (("keys", pin.fingerprints), ("head", pin.head))
                   if value is not None)
    return AuditReport(ok=finding is None, records=walk.records, first_bad=finding,
                       events=dict(walk.events), kinds=dict(walk.kinds), payloads=walk.payloads,
                       lines=lines, head=walk.head if finding is None else None, pinned=pinned,
                       checks=checks, randomness=_randomness(run_dir), linked=walk.linked)


JOURNALS_DIR = "journals"
JOURNALS_RULE = "clients' journals: chained, signed, and every message they received is logged"


def _journals(folder: Path, log_path: Path) -> tuple[AuditFinding | None, str]:
    """Each client's own journal in ``folder`` (secureffm/federation/journal.py) verifies
    against parties.json, and every server message it says it received is the server log's
    record at that seq, with the same signature (what the client saw is what the log says)."""
    registry = load_registry(folder.parent)
    logged = {}
    for text in log_path.read_text().splitlines():
        record = json.loads(text)
        logged[record["seq"]] = record.get("sig")
    journals = sorted(folder.glob("*.jsonl"))
    for path in journals:
        owner = path.stem
        if owner not in registry.sign:
            return AuditFinding(None, None, f"journal {path.name}: {owner} is not a party of "
                                "parties.json"), "failed"
        problems = verify_journal(path, owner, registry)
        if problems:
            return AuditFinding(None, None, f"journal {path.name}: {problems[0]}"), "failed"
        for text in path.read_text().splitlines():
            line = json.loads(text)
            record = line["record"]
            if line["direction"] == "received" and logged.get(record.get("seq")) != record["sig"]:
                return AuditFinding(record.get("seq"), None, (
                    f"{owner} received a {record['kind']} message of round {record['round']} "
                    f"that the server's log does not hold at seq {record.get('seq')} (the "
                    "server showed the client something else than it logged)")), "failed"
    return None, f"{len(journals)} journal(s) verified against the log"


def insecure_deterministic(run_dir: str | Path) -> bool | None:
    """Whether config.toml says the run was made with ``--insecure-deterministic`` (every
    secret stream derived from the published seed, so no privacy claim holds); None when
    config.toml is missing or unreadable. The log does not sign config.toml."""
    try:
        config = tomllib.loads((Path(run_dir) / "config.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return config.get("insecure_deterministic") is True


def _randomness(run_dir: Path) -> str:
    """What config.toml says of the parties' secret streams (``insecure_deterministic``)."""
    insecure = insecure_deterministic(run_dir)
    if insecure is None:
        return "unknown (config.toml missing or unreadable)"
    if insecure:
        return ("INSECURE: config.toml says insecure_deterministic = true: DP noise, sampling, "
                "rounding and t were derived from the published seed; no privacy claim holds")
    return ("OS entropy, as config.toml states (the log does not sign config.toml: a folder "
            "writer could change this line, not the streams)")


def pin_run(run_dir: str | Path) -> RunPin:
    """The pin of a finished run whose log verifies: its head, the sha256 of parties.json and
    each party's key fingerprint. Keep it apart from the run folder (print it, store it
    elsewhere) to verify the folder later with ``verify_run(run_dir, pin)``.

    Raises SecureFFMError when the log does not verify: there is nothing sound to pin.
    """
    report = verify_run(run_dir)
    if not report.ok:
        assert report.first_bad is not None
        raise SecureFFMError(f"{run_dir}: the log does not verify, so it cannot be pinned: "
                             f"{report.first_bad.problem}")
    return pin_of(Path(run_dir), report.head)
