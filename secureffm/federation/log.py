"""The message log: one signed, hash-chained JSON line per delivery or server event.

Each record holds seq, round, phase, kind, sender, recipient, stages, bytes, sha256 (of the
payload bytes as sent), prev (sha256 of the previous line; of parties.json for the first) and
sig (the sender's Ed25519 signature, hex, over the canonical JSON of every other field).
Events (a rejected message, a dropped client, an aborted round, an ``aggregated`` round naming
the clients counted in ``included``) are records of kind ``event``. ``parties.json`` beside the log
pins every party's public keys, ``{party: {"sign": hex Ed25519, "seal": hex X25519}}`` (``seal``
absent for a party registered without one, such as a centralized run's single party); the first
record's ``prev`` is the sha256 of that file, so the keys are bound into the chain. The last
record is a ``closed`` event whose ``records`` field states how many records precede it, so a
cut-short log is detectable; :meth:`MessageLog.close` returns the sha256 of that line, the log's
head, which pins the whole chain when kept apart from the run folder.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from .crypto import Identity
from .message import Envelope

__all__ = ["MessageLog", "canonical", "genesis", "PARTIES_FILE", "PAYLOADS_FILE"]

PARTIES_FILE = "parties.json"
PAYLOADS_FILE = "payloads.bin"


def genesis(parties_text: bytes) -> str:
    """The first record's ``prev``: sha256 of parties.json as written."""
    return hashlib.sha256(parties_text).hexdigest()


def canonical(record: dict) -> bytes:
    """The signed bytes: sorted-key compact JSON of the record without ``sig``."""
    body = {k: v for k, v in record.items() if k != "sig"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class MessageLog:
    """Appends signed records to ``path`` and counts traffic per kind.

    ``keep_payloads``: also append each delivered payload to payloads.bin (record ``offset``).
    """

    def __init__(self, path: Path, keep_payloads: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered: every record is on disk once written (readers, crashes).
        self._file = self.path.open("w", encoding="utf-8", buffering=1)
        self._payloads = (self.path.parent / PAYLOADS_FILE).open("wb") if keep_payloads else None
        self._seq = 0
        self._prev = ""
        self._round = 0
        self._parties: dict[str, dict[str, str]] = {}
        self.head: str | None = None
        self.bytes_by_kind: Counter[str] = Counter()
        self.count_by_kind: Counter[str] = Counter()
        self.events: list[dict] = []
        self.register({})

    def register(self, signing: dict[str, bytes], sealing: dict[str, bytes] | None = None) -> None:
        """Pin parties' public keys in parties.json, before any record.

        ``signing``: raw Ed25519 public key (32 bytes) by party; ``sealing``: raw X25519 public
        key (32 bytes) by party, for the parties that have one. Written as
        ``{party: {"sign": hex, "seal": hex}}``; a later call adds parties.
        """
        if self._seq:
            raise RuntimeError("parties must be registered before the first record")
        sealing = sealing or {}
        for party, key in signing.items():
            entry = {"sign": key.hex()}
            if party in sealing:
                entry["seal"] = sealing[party].hex()
            self._parties[party] = entry
        path = self.path.parent / PARTIES_FILE
        path.write_text(json.dumps(self._parties, indent=1, sort_keys=True))

    def _write(self, record: dict, signer: Identity) -> dict:
        if self._seq == 0:
            self._prev = genesis((self.path.parent / PARTIES_FILE).read_bytes())
        self._round = max(self._round, record["round"])
        record["seq"] = self._seq
        record["prev"] = self._prev
        record["sig"] = signer.sign(canonical(record)).hex()
        line = json.dumps(record, sort_keys=True, separators=(",", ":"))
        self._file.write(line + "\n")
        self._prev = hashlib.sha256(line.encode()).hexdigest()
        self._seq += 1
        return record

    def append(self, envelope: Envelope, signer: Identity) -> dict:
        """Log a delivery, signed by its sender."""
        record = {
            "round": envelope.round,
            "phase": envelope.phase,
            "kind": envelope.kind,
            "sender": envelope.sender,
            "recipient": envelope.recipient,
            "stages": list(envelope.stages),
            "bytes": len(envelope.data),
            "sha256": envelope.sha256,
        }
        if envelope.origin:
            record["origin"] = envelope.origin
        if self._payloads is not None:
            record["offset"] = self._payloads.tell()
            self._payloads.write(envelope.data)
        self.bytes_by_kind[envelope.kind] += len(envelope.data)
        self.count_by_kind[envelope.kind] += 1
        return self._write(record, signer)

    def event(self, round_: int, phase: str, event: str, party: str, detail: str,
              signer: Identity, sender: str = "server", fields: dict | None = None) -> dict:
        """Log an event (``rejected``, ``dropped``, ``aborted``, ``aggregated``, ``closed``)
        about ``party``, signed by ``sender``; ``fields``: the event's structured fields
        (``included`` and ``of_kind`` of ``aggregated``, ``records`` of ``closed``)."""
        record = {"round": round_, "phase": phase, "kind": "event", "sender": sender,
                  "recipient": "log", "stages": [], "bytes": 0,
                  "sha256": hashlib.sha256(b"").hexdigest(), "event": event, "party": party,
                  "detail": detail, **(fields or {})}
        self.events.append(record)
        return self._write(record, signer)

    def summary(self) -> dict:
        """Messages and bytes per kind so far, and the count of server events by type."""
        kinds = {kind: {"messages": self.count_by_kind[kind], "bytes": self.bytes_by_kind[kind]}
                 for kind in sorted(self.count_by_kind)}
        return {"kinds": kinds, "events": dict(Counter(e["event"] for e in self.events))}

    def close(self, closer: Identity | None = None, party: str = "server") -> str | None:
        """Write the closing record (signed by ``closer``, as ``party``) and close the files.

        Returns the log's head, the sha256 of the closing line (hex), to be kept apart from the
        run folder; None when no closer was given (the log then stays without its closing
        record, and the audit reports it cut short).
        """
        if not self._file.closed:
            if closer is not None:
                self.event(self._round, "close", "closed", "*",
                           f"{self._seq} records precede this closing record", closer,
                           sender=party, fields={"records": self._seq})
                self.head = self._prev
            self._file.close()
            if self._payloads is not None:
                self._payloads.close()
        return self.head
