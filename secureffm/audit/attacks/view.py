"""The server's view of a run, as an attacker reads it: the log's records and, for runs made
with ``--keep-payloads``, the bytes of every delivery (docs/log-format.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import SecureFFMError
from ...federation.message import Payload, deserialize_payload

__all__ = ["ServerView"]


@dataclass(frozen=True)
class ServerView:
    """``folder``'s messages.jsonl records (dicts, in delivery order) and payloads.bin."""

    folder: Path
    records: tuple[dict, ...]

    @classmethod
    def read(cls, folder: str | Path) -> ServerView:
        """The view of run folder ``folder``; a folder without a log or without kept payloads
        is a SecureFFMError saying how to make one."""
        folder = Path(folder)
        log = folder / "messages.jsonl"
        if not log.is_file():
            raise SecureFFMError(f"{folder} has no messages.jsonl: give the folder of a run")
        records = tuple(json.loads(line) for line in log.read_text().splitlines() if line)
        if not (folder / "payloads.bin").is_file() or not any("offset" in r for r in records):
            raise SecureFFMError(f"{folder} kept no payloads: attacks read what the server "
                                 "received, so rerun with --keep-payloads")
        return cls(folder, records)

    def messages(self, **match) -> list[dict]:
        """Message records (not events) whose fields equal ``match``, e.g. ``kind="gradient",
        sender="client-1", round=3``."""
        return [r for r in self.records if r["kind"] != "event"
                and all(r.get(k) == v for k, v in match.items())]

    def one(self, **match) -> dict:
        """The single record matching ``match``; none or several is a SecureFFMError."""
        found = self.messages(**match)
        if len(found) != 1:
            raise SecureFFMError(f"{self.folder}: {len(found)} messages match {match}, not one; "
                                 "pick a round and client the run delivered once")
        return found[0]

    def payload(self, record: dict) -> Payload:
        """The named arrays of ``record``'s delivery, checked against its logged sha256."""
        with open(self.folder / "payloads.bin", "rb") as stream:
            stream.seek(record["offset"])
            data = stream.read(record["bytes"])
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            raise SecureFFMError(f"{self.folder}: the payload of seq {record['seq']} does not "
                                 "match its logged sha256; run secureffm audit --verify first")
        return deserialize_payload(data, record["sender"])
