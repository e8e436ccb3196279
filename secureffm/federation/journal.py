"""A client's own record of what it received and what it sent, kept on its own node.

The server's log is the server's: a client cannot rely on it to show what the server told it.
Each line of a client's journal holds one message header as signed by its sender (the
server's signature over what it sent, the client's over what it answered) or one event the
client raised, chained by the sha256 of the previous line (the first line's ``prev`` is 64
zeros) and signed by the client. Anyone with the pinned keys can then check, from the journal
alone, that the server signed a given message to this client, and that the client kept the
lines in this order (:func:`verify_journal`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..errors import ConfigError
from .crypto import verify_signature
from .message import Envelope, canonical
from .parties import Party, Registry

__all__ = ["Journal", "verify_journal", "gather", "GENESIS"]

GENESIS = "0" * 64


def _signed_part(line: dict) -> bytes:
    """What the owner signs of a line: all of it but ``sig`` (``prev`` included)."""
    return json.dumps({k: v for k, v in line.items() if k != "sig"}, sort_keys=True,
                      separators=(",", ":")).encode()


def _line_hash(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()


def _last_line(path: Path) -> str:
    if not path.is_file() or path.stat().st_size == 0:
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 65536))
        return f.read().decode().rstrip("\n").rsplit("\n", 1)[-1]


class Journal:
    """``party``'s journal at ``path`` (appended to; a later process continues the chain)."""

    def __init__(self, path: str | Path, party: Party):
        self.path = Path(path)
        self.party = party
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def note(self, direction: str, record: dict) -> None:
        """Append ``record`` (``direction``: received, sent or event), chained and signed."""
        last = _last_line(self.path)
        line = {"n": json.loads(last)["n"] + 1 if last else 0,
                "prev": _line_hash(last) if last else GENESIS, "direction": direction,
                "record": record}
        line["sig"] = self.party.sign(_signed_part(line)).hex()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n")

    def message(self, direction: str, envelope: Envelope, seq: int | None = None) -> None:
        """A message as its sender signed it (and, received, its place in the server's log)."""
        record = {**envelope.header(), "sig": envelope.sig.hex()}
        if seq is not None:
            record["seq"] = seq
        self.note(direction, record)


def verify_journal(path: str | Path, owner: str, registry: Registry) -> list[str]:
    """What is wrong with ``owner``'s journal at ``path`` against the pinned ``registry``:
    a broken chain, a line the owner did not sign, a message its sender did not sign; empty
    when it verifies."""
    problems, prev = [], GENESIS
    for i, text in enumerate(Path(path).read_text().splitlines()):
        line = json.loads(text)
        if line.get("n") != i or line.get("prev") != prev:
            problems.append(f"line {i} does not follow line {i - 1} (cut, reordered or edited)")
        if not verify_signature(registry.sign[owner], bytes.fromhex(line.get("sig", "")),
                                _signed_part(line)):
            problems.append(f"line {i} is not signed by {owner}")
        record = line.get("record", {})
        signer = record.get("sender")
        if signer not in registry.sign or not verify_signature(
                registry.sign[signer], bytes.fromhex(record.get("sig", "")), canonical(record)):
            problems.append(f"line {i}: its {record.get('kind')} record is not signed by "
                            f"its sender {signer}")
        prev = _line_hash(text)
    return problems


def gather(paths: list[str | Path], folder: str | Path, registry: Registry) -> dict[str, Path]:
    """Copy each journal of ``paths`` into ``folder`` as ``<owner>.jsonl``, where the audit
    reads it: owner -> the copy. The owner is the party of ``registry`` whose key signed the
    journal's first line; the whole journal must then verify (:func:`verify_journal`). Refused
    by name: a journal that is empty, signed by no party or does not verify, two journals of
    one owner, and a different journal already in ``folder`` under the owner's name."""
    folder, found = Path(folder), {}
    for path in map(Path, paths):
        try:
            first = json.loads(path.read_text().splitlines()[0])
            signature = bytes.fromhex(first["sig"])
        except (OSError, IndexError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path} is not a client's journal ({err}): give the file "
                              "each node's --node-config journal=PATH names") from None
        owners = [p for p, key in registry.sign.items()
                  if verify_signature(key, signature, _signed_part(first))]
        if not owners:
            raise ConfigError(f"{path} is signed by no party of the run's parties.json: a "
                              "journal of another run, or not a journal")
        owner = owners[0]
        problems = verify_journal(path, owner, registry)
        if problems:
            raise ConfigError(f"{path} ({owner}'s journal) does not verify: {problems[0]}")
        if owner in found:
            raise ConfigError(f"{found[owner]} and {path} are both {owner}'s journal: give "
                              "each node's journal once")
        found[owner] = path
    folder.mkdir(parents=True, exist_ok=True)
    for owner, path in found.items():
        target = folder / f"{owner}.jsonl"
        if target.exists() and target.read_bytes() != path.read_bytes():
            raise ConfigError(f"{target} holds another journal of {owner}; remove it first "
                              f"if {path} is the one to audit")
    copies = {}
    for owner, path in found.items():
        copies[owner] = folder / f"{owner}.jsonl"
        shutil.copyfile(path, copies[owner])
    return copies
