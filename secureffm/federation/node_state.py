"""A client's state on its node's own disk, sealed, so that a restarted node is the same client.

On Flower a client's state between two messages lives in the SuperNode's memory (the
ClientApp's ``context.state``) and dies with it. A node also writes it to its own disk, beside
its journal, before each reply leaves (:meth:`StateFile.save`: a temporary file, fsync,
``os.replace``), so a restarted SuperNode rebuilds the client as it was after the last message
it answered, with its secret streams, sessions, ledger and replay counters.

What is kept (:class:`NodeState`): the snapshot bytes (:mod:`.snapshot`), the client id, the
run (:func:`run_of`: the Flower run id and the digest of the run config the node admitted),
``seen``, the latest round of a request that reached the client (written before it computes
its answer), and ``held``, the latest round the client takes no part in because it crashed
during it (set when the state is read back from disk: :meth:`StateFile.returning`).

The file: ``SSTATE1`` magic, a 4-byte header length, the header (client, run, seen, held as
JSON) and the snapshot sealed with AES-256-GCM under a key derived by HKDF-SHA256 from the
client's X25519 secret in its own key file (:func:`state_key`), the header as associated data.
A file of another client or another run, or one whose bytes changed, is refused by name
(:class:`StateError`). Whoever can read the key file can read and rewrite the state: the seal
keeps the state from a copy of the disk without the key file (a backup) and from corruption;
it does not protect a node from its own operator.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import ProtocolError, SecureFFMError
from .crypto import open_sealed, private_bytes, seal
from .flower import RUN_KEY
from .keyfiles import load_party_keys

__all__ = ["NodeState", "StateFile", "StateError", "state_key", "run_of", "state_path"]

MAGIC = b"SSTATE1\n"


class StateError(SecureFFMError):
    """A node's saved state file is not this client's state of this run, or was altered."""


def state_key(keys: str | Path, client: str) -> bytes:
    """32 bytes for AES-256-GCM: HKDF-SHA256 of ``client``'s X25519 secret in its key file."""
    _, sealing = load_party_keys(keys, client)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"secureffm/node-state/" + client.encode()).derive(
                    private_bytes(sealing.private))


def run_of(run_config: dict) -> str:
    """The run a state belongs to: ``FLOWER_RUN_ID:DIGEST``, the Flower run id (``RUN_KEY``;
    absent off Flower) and the sha256 of the rest of the run config (sorted-key JSON)."""
    body = {k: v for k, v in run_config.items() if k != RUN_KEY}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return f"{run_config.get(RUN_KEY, '')}:{digest}"


def state_path(journal: str | Path, run: str) -> Path:
    """The state file beside ``journal``: its name, a digest of the run, ``.state``."""
    journal = Path(journal)
    return journal.with_name(f"{journal.stem}.{hashlib.sha256(run.encode()).hexdigest()[:16]}"
                             ".state")


@dataclass(frozen=True)
class NodeState:
    """What a node keeps between messages: ``snapshot`` (b"" before the first answer), the
    latest round ``seen`` in a request, and ``held``: the latest round it takes no part in
    (-1: none)."""

    client: str
    run: str
    snapshot: bytes = b""
    seen: int = -1
    held: int = -1

    def header(self) -> bytes:
        return json.dumps({"client": self.client, "run": self.run, "seen": self.seen,
                           "held": self.held}, sort_keys=True).encode()

    def to_bytes(self) -> bytes:
        """The plain frame kept in the node's memory: header length, header, snapshot."""
        head = self.header()
        return len(head).to_bytes(4, "big") + head + self.snapshot

    @classmethod
    def from_bytes(cls, frame: bytes, name: str = "the node's state") -> NodeState:
        size = int.from_bytes(frame[:4], "big")
        try:
            head = json.loads(frame[4:4 + size])
            return cls(str(head["client"]), str(head["run"]), frame[4 + size:],
                       int(head["seen"]), int(head["held"]))
        except (ValueError, KeyError, TypeError) as err:
            raise StateError(f"{name} does not decode ({err})") from None


class StateFile:
    """``client``'s sealed state of ``run`` at ``path``, under ``key`` (:func:`state_key`)."""

    def __init__(self, path: str | Path, key: bytes, client: str, run: str):
        self.path, self.key, self.client, self.run = Path(path), key, client, run

    def save(self, state: NodeState) -> None:
        """Write ``state`` sealed, atomically (the old file stays whole until the new one is)."""
        head = state.header()
        body = seal(self.key, state.snapshot, MAGIC + head, secrets.token_bytes(12))
        part = self.path.with_name(self.path.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        with part.open("wb") as out:
            out.write(MAGIC + len(head).to_bytes(4, "big") + head + body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, self.path)

    def load(self) -> NodeState | None:
        """The state saved at ``path`` (None when there is none); a StateError naming the file
        when it is another client's, another run's, or altered."""
        if not self.path.exists():
            return None
        data = self.path.read_bytes()
        if not data.startswith(MAGIC):
            raise StateError(f"{self.path} is not a secureffm node state file: move it away")
        size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "big")
        head = data[len(MAGIC) + 4:len(MAGIC) + 4 + size]
        try:
            table = json.loads(head)
            client, run = str(table["client"]), str(table["run"])
        except (ValueError, KeyError, TypeError):
            raise StateError(f"{self.path}'s header does not decode: the file was altered; "
                             "the node cannot rejoin from it (move it away to start afresh "
                             "only before the run's first round)") from None
        if client != self.client:
            raise StateError(f"{self.path} holds the state of {client}, not {self.client}: a "
                             "node loads only its own client's state")
        if run != self.run:
            raise StateError(f"{self.path} holds {client}'s state of run {run}, not of this run "
                             f"{self.run}: a node never loads another run's state")
        try:
            snapshot = open_sealed(self.key, data[len(MAGIC) + 4 + size:], MAGIC + head)
        except ProtocolError:
            raise StateError(f"{self.path} does not open under {self.client}'s key: the file "
                             "was altered, or sealed under another key file") from None
        return NodeState.from_bytes(len(head).to_bytes(4, "big") + head + snapshot,
                                    str(self.path))

    def returning(self) -> NodeState:
        """The state a node starts from when its memory holds none: the saved one, held out
        of every round it had seen (it may have crashed while answering one), or a fresh one."""
        saved = self.load()
        if saved is None:
            return NodeState(self.client, self.run)
        return replace(saved, held=max(saved.held, saved.seen))
