"""Signed key batches: one Ed25519 signature authenticates a client's keys for many rounds.

Under the malicious-server variant of secure aggregation (secagg/) every recipient checks
that a client's fresh per-round keys (c_pk, s_pk, and the commitment to its self-mask seed)
were signed by that client's pinned identity. Signing each round's keys costs every neighbour
one verification per round. Here a client draws the keys of its next ``size`` rounds of one
kind at once (``size`` a power of two), hashes each round's key statement into a leaf of a
Merkle tree and signs only the root, bound to (kind, client, first round, depth). Each round's
advertisement carries that round's keys, the root, its signature and the leaf's
authentication path; a verifier recomputes the root from the keys it was given (log2(size)
hashes) and checks the root's signature once per batch (:func:`proven`, remembered per
verifier).

Why a server cannot substitute keys: to pass round r's check for client v it must show keys
whose leaf, bound to (r, kind, v) in the statement, hashes along a path to a root that v
signed for that kind (EUF-CMA of Ed25519), at the position r - first of v's tree (leaves
and inner nodes hash with different prefixes, so a node cannot pose as a leaf). With SHA-256
collision resistance that leaf is the one v put there: v's own keys for round r. Every key is
still fresh per round (the leaves hold distinct keys), and a leaf's private keys leave the
batch when its round's session takes them (:meth:`KeyBatch.take`), so a client's saved state
holds only the secrets of its rounds to come.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from functools import lru_cache

from ..errors import MessageError
from ..federation.crypto import (
    KeyPair,
    new_key_pair,
    private_bytes,
    private_from_bytes,
    verify_signature,
)
from ..federation.parties import Party

__all__ = ["KeyBatch", "PROOF_FIELDS", "key_statement", "commit", "proven", "check_proof"]

_KEY_STATEMENT = b"secureffm/secagg/keys/v1"
_ROOT_STATEMENT = b"secureffm/secagg/key-batch/v1"
_COMMIT = b"secureffm/self-mask-seed"
_LEAF, _NODE = b"\x00", b"\x01"
# What an advertisement adds to its keys: the batch's first round (8 bytes, big-endian), the
# leaf's authentication path (32 bytes per level, leaf upwards), the root and its signature.
PROOF_FIELDS = ("first", "path", "root", "sig")
MAX_DEPTH = 16


def key_statement(round_: int, kind: str, u: str, keys: dict[str, bytes],
                  names: tuple[str, ...]) -> bytes:
    """What client u's keys for one aggregation are bound to: its fresh keys and commitment
    (the fields ``names``), this aggregation (round and kind) and u."""
    return (_KEY_STATEMENT + json.dumps([round_, kind, u]).encode()
            + b"".join(keys[name] for name in names))


def commit(seed: bytes) -> bytes:
    """The commitment a client advertises to its 32-byte self-mask seed."""
    return hashlib.sha256(_COMMIT + seed).digest()


def _root_statement(kind: str, u: str, first: int, depth: int, root: bytes) -> bytes:
    return _ROOT_STATEMENT + json.dumps([kind, u, first, depth]).encode() + root


def _leaf(statement: bytes) -> bytes:
    return hashlib.sha256(_LEAF + statement).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _levels(leaves: list[bytes]) -> list[list[bytes]]:
    """The tree, leaves first, root last (a level of one)."""
    levels = [leaves]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([_node(below[i], below[i + 1]) for i in range(0, len(below), 2)])
    return levels


def _root_of(leaf: bytes, index: int, path: bytes) -> bytes:
    """The root that ``leaf`` at ``index`` hashes to along ``path`` (32-byte siblings)."""
    node = leaf
    for level in range(len(path) // 32):
        sibling = path[32 * level:32 * level + 32]
        node = _node(sibling, node) if (index >> level) & 1 else _node(node, sibling)
    return node


@lru_cache(maxsize=2**17)  # the in-process engine holds every party: n^2 roots, 90,000 at 300
def proven(verifier: str, public: bytes, signature: bytes, statement: bytes) -> bool:
    """:func:`verify_signature`, remembered per ``verifier`` (a party's own memory of the
    roots it checked: public values only; a verifier never profits from another's check)."""
    return verify_signature(public, signature, statement)


def check_proof(verifier: str, public: bytes, round_: int, kind: str, u: str,
                fields: dict[str, bytes], names: tuple[str, ...]) -> bool:
    """Whether ``fields`` (the keys ``names`` and :data:`PROOF_FIELDS`, lengths already
    checked) are u's keys for (round_, kind) under a root u signed with ``public``."""
    depth = len(fields["path"]) // 32
    first = int.from_bytes(fields["first"], "big")
    index = round_ - first
    if not 0 <= index < 2**depth:
        return False
    root = _root_of(_leaf(key_statement(round_, kind, u, fields, names)), index,
                    fields["path"])
    return root == fields["root"] and proven(
        verifier, public, fields["sig"], _root_statement(kind, u, first, depth, root))


def field_length_ok(name: str, value: bytes) -> bool:
    """Whether an advertised field has its length: 64 bytes for ``sig``, 8 for ``first``,
    32 per level (at most :data:`MAX_DEPTH`) for ``path``, 32 for every key."""
    if name == "sig":
        return len(value) == 64
    if name == "first":
        return len(value) == 8
    if name == "path":
        return len(value) % 32 == 0 and len(value) <= 32 * MAX_DEPTH
    return len(value) == 32


@dataclass
class KeyBatch:
    """A client's keys for rounds ``first`` to ``first + size - 1`` of one ``kind``:
    ``secrets[i]`` (channel key, mask key, self-mask seed; None once taken or skipped), the
    public ``leaves`` (one hash per round) and the ``signature`` of their root. Only its own
    client holds it."""

    kind: str
    first: int
    secrets: list[tuple[KeyPair, KeyPair, bytes] | None]
    leaves: list[bytes]
    signature: bytes
    tag = "secagg-key-batch"  # its kind among what an endpoint keeps (SecAggStage.restore_session)

    @classmethod
    def new(cls, party: Party, kind: str, first: int, size: int,
            names: tuple[str, ...]) -> KeyBatch:
        """Fresh keys (OS entropy) for ``size`` rounds from ``first``, signed by ``party``."""
        drawn = [(new_key_pair(), new_key_pair(), secrets.token_bytes(32)) for _ in range(size)]
        leaves = [_leaf(key_statement(first + i, kind, party.id, _public(keys), names))
                  for i, keys in enumerate(drawn)]
        root = _levels(leaves)[-1][0]
        depth = size.bit_length() - 1
        signature = party.sign(_root_statement(kind, party.id, first, depth, root))
        return cls(kind, first, list(drawn), leaves, signature)

    def take(self, round_: int) -> tuple[KeyPair, KeyPair, bytes, dict[str, bytes]] | None:
        """Round ``round_``'s keys and its proof (:data:`PROOF_FIELDS`), once; this and every
        earlier round's secrets leave the batch. None when the batch does not hold them."""
        index = round_ - self.first
        if not 0 <= index < len(self.secrets) or self.secrets[index] is None:
            return None
        channel, mask, seed = self.secrets[index]
        for i in range(index + 1):
            self.secrets[i] = None
        levels = _levels(self.leaves)
        path = b"".join(level[(index >> depth) ^ 1]
                        for depth, level in enumerate(levels[:-1]))
        proof = {"first": self.first.to_bytes(8, "big"), "path": path, "root": levels[-1][0],
                 "sig": self.signature}
        return channel, mask, seed, proof

    def to_json(self) -> dict:
        """Everything it holds, as JSON values (private keys and seeds in hex)."""
        return {"kind": self.kind, "first": self.first, "signature": self.signature.hex(),
                "leaves": [leaf.hex() for leaf in self.leaves],
                "secrets": [None if s is None else [private_bytes(s[0].private).hex(),
                                                    private_bytes(s[1].private).hex(),
                                                    s[2].hex()] for s in self.secrets]}

    @classmethod
    def from_json(cls, table: dict) -> KeyBatch:
        """The inverse of :meth:`to_json`; raises MessageError for a table that is not one."""
        try:
            drawn = [None if s is None else (KeyPair(private_from_bytes(bytes.fromhex(s[0]))),
                                             KeyPair(private_from_bytes(bytes.fromhex(s[1]))),
                                             bytes.fromhex(s[2])) for s in table["secrets"]]
            leaves = [bytes.fromhex(leaf) for leaf in table["leaves"]]
            return cls(str(table["kind"]), int(table["first"]), drawn, leaves,
                       bytes.fromhex(table["signature"]))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise MessageError(f"a saved key batch does not load: {err}") from None


def _public(keys: tuple[KeyPair, KeyPair, bytes]) -> dict[str, bytes]:
    channel, mask, seed = keys
    return {"c_pk": channel.public, "s_pk": mask.public, "b_commit": commit(seed)}
