"""A restarted node's claim to run a client: signed, fresh, bound to the run and to the node.

A SuperNode that restarts is a new Flower node (a new node id). The server moves a client id to
it only on a hello that the client signs with its identity key (the one ``parties.json`` pins):
the server sends the new node a fresh 32-byte challenge from OS entropy; the node answers its
client id and the Ed25519 signature of :func:`statement` (purpose, client, the Flower run id,
its own node id, the challenge). A node cannot claim another client's id (it holds no other
key), a signature made for another node, run or challenge does not verify (a replayed hello, a
hello relayed to another node), and an unsigned or unregistered claim moves nothing
(:func:`check`). What the rejoined client may then do is the node's own rule
(:mod:`.node_state`: it takes no part in a round it crashed in).
"""

from __future__ import annotations

import json

from ..errors import MessageError
from .crypto import verify_signature
from .keyfiles import load_party_keys
from .parties import Registry

__all__ = ["statement", "prove", "check", "PURPOSE"]

PURPOSE = "secureffm/rejoin"


def statement(client: str, run: str, node: int, challenge: bytes) -> bytes:
    """What a client signs to run on ``node`` (a Flower node id) in ``run`` (a Flower run id)."""
    return json.dumps({"purpose": PURPOSE, "client": client, "run": str(run), "node": int(node),
                       "challenge": challenge.hex()}, sort_keys=True,
                      separators=(",", ":")).encode()


def prove(keys: str, client: str, run: str, node: int, challenge: bytes) -> bytes:
    """``client``'s signature of :func:`statement`, with its identity key from ``keys``."""
    identity, _ = load_party_keys(keys, client)
    return identity.sign(statement(client, run, node, challenge))


def check(registry: Registry, clients: set[str] | dict[str, int], run: str, node: int,
          challenge: bytes, claim: dict) -> str:
    """The client id that ``claim`` (a hello's answer: ``client-id``, ``proof``) proves for
    ``node`` against ``challenge`` in ``run``; a MessageError naming why it proves none. Only
    one of ``clients`` (the run's) can move."""
    client = str(claim.get("client-id", ""))
    if client not in clients:
        raise MessageError(f"node {node} says it runs {client!r}, which is not a client of this "
                           "run: ignored")
    if "refused" in claim:
        raise MessageError(f"node {node} (as {client}) refuses the run: {claim['refused']}")
    proof = claim.get("proof", b"")
    if client not in registry.sign or not isinstance(proof, bytes) or not verify_signature(
            registry.sign[client], proof, statement(client, run, node, challenge)):
        raise MessageError(f"node {node}'s hello as {client} is not signed by {client} over this "
                           f"run, this node and the server's fresh challenge (forged, replayed "
                           f"or relayed): {client} stays where it was")
    return client
