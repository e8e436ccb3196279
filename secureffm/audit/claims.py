"""Claims about one finished run, each judged against a threat model's adversary
(:mod:`secureffm.audit.threat`) from the run's message log: PASS, FAIL or NOT COVERED, with the
evidence (record numbers, values) and a one-line reason.

1. ``intact``: the log verifies (:func:`~secureffm.audit.verify.verify_run`, against a pin
   when given). NOT COVERED when the adversary can write the run folder and nothing was
   pinned: it could rebuild the log with keys of its own.
2. ``hidden``: no message of a kind the adversary must not see, written by a client, reached it
   readable. Who can read a message is what the first of its logged stages that hides it says
   (:meth:`~secureffm.protocols.stage.Stage.readers`: a ``secagg`` input is masked; ``ckks``
   is readable by whoever holds the clients' key, the server with a colluding client;
   ``sealed`` only by its recipients); a message no stage hides (or naming a stage this
   process does not know) by the server (it handles every delivery), the wire, a client it is
   delivered to, and the folder when ``payloads.bin`` holds it. A kept payload that a hiding
   stage claims but that holds floating-point arrays is readable whatever its stages say.
3. ``epsilon``: each client's epsilon, per kind and in total, recomputed with Opacus from the
   server-signed ``charged`` records (:func:`~secureffm.privacy.ledger.charged_entries`), is
   within the target those records state; every client input to an aggregation is charged.
   privacy.json's value is shown beside it, never used.

4. ``broadcast``: every clear public broadcast of one kind in one round has one digest.
5. ``parameters``: what each stage protecting a kind the adversary must not see requires of
   its parameters (:meth:`~secureffm.protocols.stage.Stage.audit_parameters`: secure
   aggregation needs more shares than the colluders hold, a sparse graph gives each client
   more neighbours than there are colluders, the quantizer holds the sum of every client, a
   malicious server meets the malicious-server variant), and distributed noise is sized for
   the colluders. Values come from the protocol named in config.toml, which the log does not
   sign, unless the clients' signed ``keys`` parameters (payloads kept) confirm them; the
   colluders of distributed noise from the ``charged`` records.

On a run whose config.toml says ``insecure_deterministic = true`` no privacy claim PASSes:
``hidden`` is NOT COVERED and a charged ``epsilon`` FAILs (the noise replays from the seed).

The verdicts read the log as written; when it does not verify, the report says so above them.
"""

from __future__ import annotations

import json
import mmap
import tomllib
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import MessageError, ProtocolError, SecureFFMError
from ..federation.joint import kind_parts
from ..federation.log import PARTIES_FILE, PAYLOADS_FILE
from ..federation.message import RELAY_PHASE, SERVER, deserialize_payload
from ..federation.pin import RunPin, load_parties
from ..privacy.ledger import CHARGED, PrivacyLedger, charged_entries
from ..protocols.protocol import input_phases, load_protocol, stage_classes
from ..protocols.stage import READERS, Stage
from .rules import PUBLIC_KINDS
from .threat import Adversary
from .verify import LOG_FILE, AuditReport, insecure_deterministic, verify_run

__all__ = ["Verdict", "ClaimsReport", "audit_claims", "PASS", "FAIL", "NOT_COVERED"]

PASS, FAIL, NOT_COVERED = "PASS", "FAIL", "NOT COVERED"
_SHOWN = 5  # offending records listed as evidence
_FIELDS = {"seq", "round", "phase", "kind", "sender", "recipient", "stages", "sha256"}


@dataclass(frozen=True)
class Verdict:
    """One claim: ``status`` PASS / FAIL / NOT COVERED, a one-line ``reason``, and the
    ``evidence`` lines (record numbers, values, where a value came from)."""

    claim: str
    title: str
    status: str
    reason: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimsReport:
    """The verdicts on one run under one adversary. ``epsilon``: client -> kind (and
    ``total``) -> epsilon recomputed from the log; ``target``: the target the log states."""

    run_dir: Path
    adversary: Adversary
    verification: AuditReport
    verdicts: tuple[Verdict, ...]
    epsilon: dict[str, dict[str, float]] = field(default_factory=dict)
    target: float | None = None

    @property
    def failed(self) -> bool:
        return any(v.status == FAIL for v in self.verdicts)

    def summary(self) -> str:
        """A line per claim, the evidence indented under it."""
        out = [f"threat model {self.adversary.name}: {self.adversary.describe()}"]
        if not self.verification.ok:
            out.append("the log does not verify: the verdicts below read records nobody vouches "
                       "for")
        for verdict in self.verdicts:
            out.append(f"{verdict.status}: {verdict.title}: {verdict.reason}")
            out += [f"  {line}" for line in verdict.evidence]
        return "\n".join(out)


class _Log:
    """A run's records as written (the JSON objects with the fields the claims read; the
    intact claim reports any other line) and its kept payloads, mapped, not read whole."""

    def __init__(self, run_dir: Path, stack: ExitStack):
        self.records: list[dict] = []
        for text in (run_dir / LOG_FILE).read_text(errors="replace").splitlines():
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and _FIELDS <= record.keys() and (
                    record["kind"] != "event" or "event" in record):
                self.records.append(record)
        path = run_dir / PAYLOADS_FILE
        self.payloads = None
        if path.is_file() and path.stat().st_size:
            handle = stack.enter_context(path.open("rb"))
            self.payloads = stack.enter_context(mmap.mmap(handle.fileno(), 0,
                                                          access=mmap.ACCESS_READ))
        self.messages = [r for r in self.records if r["kind"] != "event"]
        self.events = [r for r in self.records if r["kind"] == "event"]

    def payload(self, record: dict) -> bytes | None:
        """The record's bytes from payloads.bin, None when not kept."""
        offset, size = record.get("offset"), record.get("bytes")
        if self.payloads is None or not isinstance(offset, int) or not isinstance(size, int):
            return None
        return self.payloads[offset:offset + size]


def audit_claims(run_dir: str | Path, adversary: Adversary,
                 pin: RunPin | None = None) -> ClaimsReport:
    """Every claim about ``run_dir`` under ``adversary``; ``pin``: kept apart from the folder.
    Raises SecureFFMError when the folder holds no readable log or parties.json."""
    run_dir = Path(run_dir)
    pin = pin or RunPin()
    verification = verify_run(run_dir, pin)
    parties, _ = load_parties(run_dir / PARTIES_FILE)
    clients = sorted(p for p in parties if p != SERVER)
    with ExitStack() as stack:
        log = _Log(run_dir, stack)
        epsilon, target, spent = _epsilon(log, run_dir, verification.randomness)
        hidden = _hidden(log, adversary)
        if insecure_deterministic(run_dir):
            hidden = _insecure(hidden, NOT_COVERED)
            spent = _insecure(spent, FAIL) if epsilon else spent  # only DP that was charged
        verdicts = (_intact(verification, adversary), hidden, spent,
                    _broadcast(log), _parameters(log, run_dir, adversary, len(clients)))
    return ClaimsReport(run_dir, adversary, verification, verdicts, epsilon, target)


def _insecure(verdict: Verdict, status: str) -> Verdict:
    """``verdict`` on a run whose config.toml says ``insecure_deterministic = true``: what
    would PASS (or, for a charged epsilon, is not covered for want of a target) becomes
    ``status``, since the secret streams replay from the published seed."""
    judged = verdict.status == PASS or (
        verdict.claim == "epsilon" and verdict.status == NOT_COVERED)
    if not judged:
        return verdict
    what = ("the DP noise and sampling replay from the published seed, so anyone can "
            "subtract them: no epsilon holds" if verdict.claim == "epsilon" else
            "the run claims no privacy, so nothing passes")
    return Verdict(verdict.claim, verdict.title, status, f"config.toml says "
                   f"insecure_deterministic = true: {what}",
                   (f"as judged without that: {verdict.status}: {verdict.reason}",
                    *verdict.evidence))


# -- 1. the log is intact ------------------------------------------------------------------

def _intact(report: AuditReport, adversary: Adversary) -> Verdict:
    title = "the log is intact"
    evidence = [f"{rule}: {status}" for rule, status in report.checks.items()]
    if not report.ok:
        bad = report.first_bad
        assert bad is not None
        where = f"line {bad.line}" if bad.line is not None else "the folder"
        return Verdict("intact", title, FAIL, bad.problem,
                       (f"{report.records} of {report.lines} lines verified; first problem at "
                        f"{where}", *evidence))
    evidence = [f"{report.records} records chained and signed, head {report.head}",
                f"proves: {report.scope}", *evidence]
    if "folder" in adversary.parties and not report.pinned:
        return Verdict("intact", title, NOT_COVERED, "nothing was pinned, and a folder writer can "
                       "rebuild the log under keys of its own; give --expect-head or --parties "
                       "from a pin kept apart", tuple(evidence))
    pinned = " and ".join(report.pinned) or "nothing (integrity against accidents only)"
    return Verdict("intact", title, PASS, f"every record verifies; pinned: {pinned}",
                   tuple(evidence))


# -- 2. nothing individual reached the adversary readable ----------------------------------

def _hidden(log: _Log, adversary: Adversary) -> Verdict:
    title = f"no client's {', '.join(adversary.must_not_see)} reached the adversary readable"
    gathered = {(r["round"], r["kind"], r.get("origin")) for r in log.messages
                if r["phase"] == RELAY_PHASE}
    seen, checked, payloads = [], 0, 0
    classes = {cls.name: cls for cls in stage_classes()}
    for record in log.messages:
        author = record.get("origin") or record["sender"]
        if not set(kind_parts(record["kind"])) & set(adversary.must_not_see) or (
                author == SERVER):
            continue
        checked += 1
        readers, why = _readers(record, gathered, classes)
        payload = log.payload(record)
        if payload is not None:
            payloads += 1
            floats = _float_fields(payload)
            if floats and not readers.intersection(("server", "wire")):
                readers |= {"server", "wire", "folder", "recipient"}
                why = (f"stages {record['stages']} but its kept payload holds floating-point "
                       f"field(s) {', '.join(floats)}: readable")
        who = _reads(adversary, readers, record)
        if who:
            seen.append(f"record {record['seq']}: round {record['round']} {record['kind']} of "
                        f"{author}, {record['sender']} -> {record['recipient']}, "
                        f"{why}; read by the {who}")
    basis = (f"{checked} client message(s) of those kinds checked from their logged stages, "
             f"{payloads} also from their kept payloads")
    if seen:
        return Verdict("hidden", title, FAIL, f"{len(seen)} of {checked} reached it readable",
                       (basis, *seen[:_SHOWN], *([f"... and {len(seen) - _SHOWN} more"]
                                                  if len(seen) > _SHOWN else [])))
    if not checked:
        return Verdict("hidden", title, PASS, "no client sent a message of those kinds", ())
    return Verdict("hidden", title, PASS, "every one was masked, encrypted or sealed against it",
                   (basis,))


def _readers(record: dict, gathered: set, classes: dict[str, type[Stage]]
             ) -> tuple[set[str], str]:
    """Who can read ``record``'s payload as is (:data:`~secureffm.protocols.stage.READERS`)
    and why, in words: what the first of its stages that hides it says, else everyone who
    handles it. ``gathered``: (round, kind, author) of relayed all-gathers; ``classes``: the
    registered stage classes by name."""
    relayed = (record["round"], record["kind"], record["sender"]) in gathered
    for name in record["stages"]:
        cls = classes.get(name)
        hidden = None if cls is None else cls.readers(record, relayed)
        if hidden is not None and not hidden[0] <= READERS:
            raise ProtocolError(f"stage {name!r} says {sorted(hidden[0] - READERS)} can read "
                                f"a message, which the audit does not know; name readers from "
                                f"{sorted(READERS)} (protocols/stage.py)")
        if hidden is not None:
            return set(hidden[0]), hidden[1]
    readers = {"server", "wire"} | ({"recipient"} if record["recipient"] != SERVER else set())
    if "offset" in record:
        readers.add("folder")
    return readers, f"in the clear (stages {record['stages']})"


def _reads(adversary: Adversary, readers: set[str], record: dict) -> str:
    """Which of the adversary's parties reads a record readable by ``readers`` ('' none)."""
    coalition = adversary.colluding_clients > 0
    if "server" in adversary.parties and (
            "server" in readers or (coalition and "key-holders" in readers)):
        return "server" + (" and its colluding client" if "server" not in readers else "")
    if "clients" in adversary.parties and "recipient" in readers and (
            record["recipient"] != (record.get("origin") or record["sender"])):
        return f"colluding client {record['recipient']}"
    if "wire" in adversary.parties and "wire" in readers:
        return "eavesdropper on the wire"
    if "folder" in adversary.parties and "folder" in readers:
        return f"folder writer (in {PAYLOADS_FILE})"
    return ""


def _float_fields(payload: bytes) -> list[str]:
    """The floating-point arrays of a payload (none in a masked, encrypted or sealed one)."""
    try:
        arrays = deserialize_payload(payload)
    except MessageError:
        return []
    return sorted(name for name, array in arrays.items()
                  if np.issubdtype(array.dtype, np.floating))


# -- 3. epsilon within the target -----------------------------------------------------------

def _epsilon(log: _Log, run_dir: Path, randomness: str
             ) -> tuple[dict[str, dict[str, float]], float | None, Verdict]:
    """epsilon per client and kind from the ``charged`` records, the target, the verdict;
    ``randomness``: where the DP noise came from, as config.toml states it (shown)."""
    title = "every client's epsilon, recomputed from the logged schedule, is within its target"
    charged = [r for r in log.events if r.get("event") == CHARGED]
    if not charged:
        stated = _stated(run_dir)
        why = ("privacy.json states an epsilon, but this method does not sign its ledger into "
               "the log (only FFM does)" if "privacy.json states: client" in stated else
               "the run applied no DP")
        return {}, None, Verdict("epsilon", title, NOT_COVERED, f"the log holds no charged "
                                 f"records: {why}", (stated,))
    forged = [r["seq"] for r in charged if r.get("sender") != SERVER]
    terms = {(r.get("delta"), r.get("accountant"), r.get("target_epsilon")) for r in charged}
    if forged or len(terms) != 1:
        why = (f"charged record(s) {forged} are not the server's" if forged else
               f"the charged records disagree on (delta, accountant, target): {sorted(terms)}")
        return {}, None, Verdict("epsilon", title, FAIL, why, ())
    delta, accountant, target = terms.pop()
    ledger = PrivacyLedger(delta)
    try:
        for record in charged:
            for entry in charged_entries(record):
                ledger.record(entry)
        epsilon = {client: {**{kind: ledger.epsilon(client, accountant, (kind,))
                               for kind in sorted({e.kind for e in ledger.entries
                                                   if e.client == client})},
                            "total": ledger.epsilon(client, accountant)}
                   for client in ledger.clients()}
    except (KeyError, TypeError, ValueError, SecureFFMError) as err:
        return {}, None, Verdict("epsilon", title, FAIL, f"a charged record cannot be accounted: "
                                 f"{type(err).__name__}: {err}", ())
    evidence = [f"{len(charged)} charged record(s), seq {charged[0]['seq']}..{charged[-1]['seq']}"
                f", signed by the server; delta {delta:g}, accountant {accountant} (Opacus)"]
    for client, kinds in epsilon.items():
        parts = ", ".join(f"{kind} {value:.4g}" for kind, value in kinds.items())
        evidence.append(f"{client}: {parts}")
    evidence += [_stated(run_dir), f"secret randomness: {randomness}"]
    uncharged = _uncharged(log, ledger)
    over = {c: e["total"] for c, e in epsilon.items()
            if target is not None and e["total"] > target * (1 + 1e-9)}
    if uncharged:
        return epsilon, target, Verdict(
            "epsilon", title, FAIL, f"{len(uncharged)} client input(s) were charged to no "
            "one: the ledger understates", (*evidence, *uncharged[:_SHOWN]))
    if over:
        worst = max(over, key=over.get)
        return epsilon, target, Verdict(
            "epsilon", title, FAIL, f"{len(over)} client(s) exceed the target {target:g}: "
            f"{worst} spent {over[worst]:.4g}", tuple(evidence))
    if target is None:
        return epsilon, target, Verdict("epsilon", title, NOT_COVERED, "the run set no target "
                                        "epsilon (a fixed noise multiplier): nothing to hold "
                                        "the values to", tuple(evidence))
    most = max(e["total"] for e in epsilon.values())
    return epsilon, target, Verdict("epsilon", title, PASS, f"at most {most:.4g} of target "
                                    f"{target:g} at delta {delta:g}", tuple(evidence))


def _uncharged(log: _Log, ledger: PrivacyLedger) -> list[str]:
    """Client inputs to an aggregation (of a kind the ledger charges) that no entry covers."""
    covered = {(e.round, e.kind, e.client) for e in ledger.entries}
    kinds, phases = {e.kind for e in ledger.entries}, input_phases()
    return [f"record {r['seq']}: {r['sender']}'s round-{r['round']} {kind} input is in "
            "no charged record" for r in log.messages
            if r["phase"] in phases and r["recipient"] == SERVER
            for kind in kind_parts(r["kind"])  # a joint input: each part's
            if kind in kinds and (r["round"], kind, r["sender"]) not in covered]


def _stated(run_dir: Path) -> str:
    """What privacy.json states (not used: a folder writer can change it)."""
    try:
        accounting = json.loads((run_dir / "privacy.json").read_text())
        clients = accounting.get("clients") or {}
        used = accounting.get("enforced_by", "rdp")
        values = ", ".join(f"{c} {row[used]['total']:.4g}" for c, row in clients.items()
                           if row.get(used, {}).get("total") is not None)
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return "privacy.json: missing or unreadable (not used)"
    return f"privacy.json states: {values or 'no epsilon'} (shown only; the log does not sign it)"


# -- 4. one broadcast per round --------------------------------------------------------------

def _broadcast(log: _Log) -> Verdict:
    title = "every client received the same broadcast in each round"
    groups: dict[tuple[int, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    sealed = 0
    for r in log.messages:
        if r["phase"] != "broadcast" or r["sender"] != SERVER or r["kind"] not in PUBLIC_KINDS:
            continue
        if r["stages"]:
            sealed += 1
            continue
        groups[(r["round"], r["kind"])][r["sha256"]].append(f"{r['recipient']} (record "
                                                            f"{r['seq']})")
    note = [f"{sealed} broadcast(s) under stages not compared"] if sealed else []
    if not groups:
        return Verdict("broadcast", title, NOT_COVERED, "the log holds no clear public "
                       "broadcast", tuple(note))
    split = [(key, digests) for key, digests in sorted(groups.items()) if len(digests) > 1]
    compared = (f"{len(groups)} (round, kind) broadcast(s) compared by sha256 over "
                f"{sum(len(v) for d in groups.values() for v in d.values())} deliveries")
    if not split:
        return Verdict("broadcast", title, PASS, "one digest per round and kind",
                       (compared, *note))
    evidence = [compared]
    for (round_, kind), digests in split:
        for digest, recipients in digests.items():
            evidence.append(f"round {round_} {kind}: sha256 {digest[:16]}... to "
                            f"{', '.join(recipients)}")
    (round_, kind), _ = split[0]
    return Verdict("broadcast", title, FAIL, f"{len(split)} broadcast(s) differ between clients, "
                   f"first the round-{round_} {kind}", (*evidence, *note))


# -- 5. protocol parameters ------------------------------------------------------------------

def _parameters(log: _Log, run_dir: Path, adversary: Adversary, clients: int) -> Verdict:
    title = (f"the protocol's parameters meet the adversary ({adversary.colluding_clients} "
             "colluding client(s))")
    try:
        config = tomllib.loads((run_dir / "config.toml").read_text())
        protocol = load_protocol(config["protocol"])
    except (OSError, KeyError, tomllib.TOMLDecodeError, SecureFFMError) as err:
        return Verdict("parameters", title, NOT_COVERED, f"config.toml does not name a readable "
                       f"protocol ({type(err).__name__}: {err})", ())
    c = adversary.colluding_clients
    checks: list[tuple[bool, str]] = []  # (met, what)
    source = [f"protocol {protocol.name!r} from config.toml (the log does not sign it), "
              f"{clients} clients from {PARTIES_FILE}"]
    for stage in protocol.stages:
        if set(stage.protects) & set(adversary.must_not_see):
            logged = [r for r in log.messages if stage.name in r["stages"]]
            met, where = stage.audit_parameters(clients, c, adversary.malicious, logged,
                                                log.payload)
            checks += met
            source += where
    charged = [r for r in log.events if r.get("event") == CHARGED and r.get("sender") == SERVER]
    noise = {(r.get("noise"), r.get("colluders")) for r in charged}
    dp = protocol.dp.settings if protocol.dp else None
    if charged:
        source.append(f"DP noise split from {len(charged)} server-signed charged record(s)")
    elif dp is not None:
        noise = {(dp.noise, dp.colluders)}
        source.append("DP noise split from config.toml's protocol (no charged records)")
    for split, assumed in sorted(noise, key=str):
        if split == "distributed":
            checks.append((isinstance(assumed, int) and assumed >= c,
                           f"distributed noise sized for {assumed} colluder(s), >= {c}"))
    if not checks:
        return Verdict("parameters", title, NOT_COVERED, "no secure aggregation of the kinds it "
                       "must not see and no distributed noise: no parameter to hold to it",
                       tuple(source))
    failed = [what for met, what in checks if not met]
    lines = [*source, *(f"{'met' if met else 'NOT MET'}: {what}" for met, what in checks)]
    bad_source = [s for s in source if s.startswith("differs")]
    if failed or bad_source:
        return Verdict("parameters", title, FAIL, (failed or bad_source)[0], tuple(lines))
    return Verdict("parameters", title, PASS, f"{len(checks)} requirement(s) met",
                   tuple(lines))
