"""The message log: one signed, hash-chained JSON line per delivery or server event.

Each record holds seq, round, phase, kind, sender, recipient, stages, bytes, sha256 (of the
payload bytes as sent), prev (sha256 of the previous line; of parties.json for the first) and
sig: the sender's Ed25519 signature, hex, over the canonical JSON of the record's content
(every field but sig, seq, prev and offset;
:func:`~secureffm.federation.message.canonical`). The
sender signs before its message reaches the transport, so it cannot know the record's place;
the server's closing record signs the place of every record (its ``chain`` field).
Events (a rejected message, a dropped client, an aborted round, an ``aggregated`` round naming
the clients counted in ``included``) are records of kind ``event``. ``parties.json`` beside the log
pins every party's public keys, ``{party: {"sign": hex Ed25519, "seal": hex X25519}}`` (``seal``
absent for a party registered without one, such as a centralized run's single party); the first
record's ``prev`` is the sha256 of that file, so the keys are bound into the chain. The last
record is a ``closed`` event, signed by the server, whose ``records`` field states how many
records precede it and whose ``chain`` field repeats its ``prev``, so a cut-short or reordered log
is detectable; :meth:`MessageLog.close` returns the sha256 of that line, the log's head, which
pins the whole chain when kept apart from the run folder.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from .message import Envelope, canonical
from .parties import Party, Registry

__all__ = ["MessageLog", "canonical", "genesis", "PARTIES_FILE", "PAYLOADS_FILE"]

PARTIES_FILE = "parties.json"
PAYLOADS_FILE = "payloads.bin"


def genesis(parties_text: bytes) -> str:
    """The first record's ``prev``: sha256 of parties.json as written."""
    return hashlib.sha256(parties_text).hexdigest()


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
        self.register(Registry({}, {}))

    def register(self, registry: Registry) -> None:
        """Pin parties' public keys in parties.json, before any record, written as
        ``{party: {"sign": hex, "seal": hex}}`` (``seal`` for the parties that have one); a
        later call adds parties."""
        if self._seq:
            raise RuntimeError("parties must be registered before the first record")
        for party, key in registry.sign.items():
            entry = {"sign": key.hex()}
            if party in registry.seal:
                entry["seal"] = registry.seal[party].hex()
            self._parties[party] = entry
        path = self.path.parent / PARTIES_FILE
        path.write_text(json.dumps(self._parties, indent=1, sort_keys=True))

    def _write(self, record: dict) -> dict:
        """Place a signed record: its ``seq`` and ``prev`` (which its signature leaves out)."""
        if self._seq == 0:
            self._prev = genesis((self.path.parent / PARTIES_FILE).read_bytes())
        self._round = max(self._round, record["round"])
        record["seq"] = self._seq
        record["prev"] = self._prev
        line = json.dumps(record, sort_keys=True, separators=(",", ":"))
        self._file.write(line + "\n")
        self._prev = hashlib.sha256(line.encode()).hexdigest()
        self._seq += 1
        return record

    def append(self, envelope: Envelope) -> dict:
        """Log a delivery with its sender's signature (``envelope.sig``)."""
        record = {**envelope.header(), "sig": envelope.sig.hex()}
        if self._payloads is not None:
            record["offset"] = self._payloads.tell()
            self._payloads.write(envelope.data)
            self._payloads.flush()  # on disk before the record that points at it
        self.bytes_by_kind[envelope.kind] += len(envelope.data)
        self.count_by_kind[envelope.kind] += 1
        return self._write(record)

    def event(self, record: dict) -> dict:
        """Log an event record signed by the party that raised it (:meth:`Party.event`)."""
        self.events.append(record)
        return self._write(dict(record))

    def summary(self) -> dict:
        """Messages and bytes per kind so far, and the count of server events by type."""
        kinds = {kind: {"messages": self.count_by_kind[kind], "bytes": self.bytes_by_kind[kind]}
                 for kind in sorted(self.count_by_kind)}
        return {"kinds": kinds, "events": dict(Counter(e["event"] for e in self.events))}

    def close(self, closer: Party | None = None) -> str | None:
        """Write the closing record (signed by ``closer``, the server or a centralized run's
        single party) and close the files. The record's ``chain`` is the hash of the line
        before it, so the closer's signature pins every record's place.

        Returns the log's head, the sha256 of the closing line (hex), to be kept apart from the
        run folder; None when no closer was given (the log then stays without its closing
        record, and the audit reports it cut short).
        """
        if not self._file.closed:
            if closer is not None:
                if self._seq == 0:
                    self._prev = genesis((self.path.parent / PARTIES_FILE).read_bytes())
                self.event(closer.event(self._round, "close", "closed", "*",
                                        f"{self._seq} records precede this closing record",
                                        {"records": self._seq, "chain": self._prev}))
                self.head = self._prev
            self._file.close()
            if self._payloads is not None:
                self._payloads.close()
        return self.head
