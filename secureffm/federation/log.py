"""The message log: one JSON line per delivery, hash-chained.

``prev`` in each record is the sha256 of the line before it (64 zeros for the first).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from .message import Envelope

__all__ = ["MessageLog", "GENESIS"]

GENESIS = "0" * 64


class MessageLog:
    """Appends a record per delivered envelope to ``path`` (JSON Lines) and counts traffic."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._seq = 0
        self._prev = GENESIS
        self.bytes_by_kind: Counter[str] = Counter()
        self.count_by_kind: Counter[str] = Counter()

    def append(self, envelope: Envelope) -> dict:
        record = {
            "seq": self._seq,
            "round": envelope.round,
            "phase": envelope.phase,
            "kind": envelope.kind,
            "sender": envelope.sender,
            "recipient": envelope.recipient,
            "stages": list(envelope.stages),
            "bytes": len(envelope.data),
            "sha256": envelope.sha256,
            "prev": self._prev,
        }
        line = json.dumps(record, sort_keys=True, separators=(",", ":"))
        self._file.write(line + "\n")
        self._prev = hashlib.sha256(line.encode()).hexdigest()
        self._seq += 1
        self.bytes_by_kind[envelope.kind] += len(envelope.data)
        self.count_by_kind[envelope.kind] += 1
        return record

    def summary(self) -> dict:
        """Messages and bytes per kind so far."""
        return {
            kind: {"messages": self.count_by_kind[kind], "bytes": self.bytes_by_kind[kind]}
            for kind in sorted(self.count_by_kind)
        }

    def close(self) -> None:
        self._file.close()
