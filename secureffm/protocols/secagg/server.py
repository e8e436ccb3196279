"""The server's side of secure aggregation that both variants share: one aggregation's state
(:class:`Round`), the key advertisements it accepts, the neighbour graph it announces, the
``keys`` message and the consistency round of the malicious-server variant. The variants'
round flows are :mod:`.per_round`'s and :mod:`.keys_once`'s."""

from __future__ import annotations

import json
import random
import secrets
from dataclasses import dataclass, field

from ...errors import MessageError, ProtocolError
from ...federation.crypto import agree, private_from_bytes
from ...federation.message import SERVER
from ..key_batch import PROOF_FIELDS, check_proof, field_length_ok
from ..link import Ask, Link, silence
from ..wire import bytes_payload as _bytes_payload
from ..wire import json_payload as _json_payload
from ..wire import payload_bytes as _payload_bytes
from .common import ADVERTISED, Confirmation, harary_neighbours
from .params import SecAggParams

__all__ = ["Round", "advertise", "choose_graph", "keys_message", "consistency"]


@dataclass
class Round:
    """One aggregation as the server runs it: how to reach the clients and what it has learnt
    so far."""

    link: Link
    order: dict[str, int]  # client id -> position in the federation's client list
    dropped: dict[str, str] = field(default_factory=dict)
    advertised: dict[str, dict[str, bytes]] = field(default_factory=dict)
    graph: dict[str, set[str]] = field(default_factory=dict)
    graph_seed: bytes = b""
    routed: dict[str, set[str]] = field(default_factory=dict)  # whom each client masks with

    def reject(self, phase: str, party: str, reason: str) -> None:
        self.link.reject(phase, party, reason)

    def members(self, u: str) -> list[str]:
        """S(u): u and its neighbours in client order; v's share of u's secrets is at x =
        position + 1."""
        return sorted(self.graph[u] | {u}, key=self.order.get)


def advertise(stage: SecAggParams, r: Round, ids: list[str]) -> list[str]:
    """Phase 1. Returns U1, the clients whose keys and commitment the server accepted."""
    replies = r.link.exchange("advertise_keys", "advertise_keys", "secagg.advertise",
                              {u: Ask() for u in ids})
    for u in ids:
        data = replies[u].data if u in replies else None
        if data is None:
            r.dropped[u] = "dropped before advertising keys"
            continue
        try:
            r.advertised[u] = _accept_advertisement(stage, r, data, u)
        except MessageError as err:
            r.reject("advertise_keys", u, str(err))
            r.dropped[u] = str(err)
    return [u for u in ids if u in r.advertised]


def _accept_advertisement(stage: SecAggParams, r: Round, data: bytes, u: str
                          ) -> dict[str, bytes]:
    """The server's check of u's advertisement (the clients check the signature again
    against their own pinned keys)."""
    fields = _parse_advertisement(data, u, stage.adversary == "malicious", stage.advertised)
    if "sig" in fields and not check_proof(SERVER, r.link.transport.registry.sign[u],
                                           r.link.round, r.link.kind, u, fields,
                                           stage.advertised):
        raise MessageError(f"{u}'s keys are not signed by its pinned identity")
    return fields


def _check_point(key: bytes, what: str) -> None:
    """Refuse a public key that is not an X25519 point of large order: an exchange with it
    yields the all-zero secret, which ``cryptography`` refuses (a fresh private key tries)."""
    try:
        agree(private_from_bytes(secrets.token_bytes(32)), key, b"key-check")
    except ProtocolError as err:
        raise MessageError(f"{what} is not a usable X25519 public key ({err})") from None


def _parse_advertisement(data: bytes, u: str, signed: bool,
                         names: tuple[str, ...] = ADVERTISED) -> dict[str, bytes]:
    """u's keys and commitment (``names``; and, when ``signed``, the proof that u signed
    them: key_batch.PROOF_FIELDS)."""
    fields = _payload_bytes(data, u)
    expected = sorted([*names, *(PROOF_FIELDS if signed else ())])
    if sorted(fields) != expected or not all(
            field_length_ok(name, v) for name, v in fields.items()):
        raise MessageError(f"{u} advertised fields {sorted(fields)} with lengths "
                           f"{[len(v) for v in fields.values()]}, expected 32 bytes each of "
                           f"{', '.join(names)}" + (" and a key-batch proof (8-byte first, "
                                                   "path of 32-byte hashes, 32-byte root, "
                                                   "64-byte sig)" if signed else ""))
    for name in ("c_pk", "s_pk"):
        _check_point(fields[name], f"{u}'s {name}")
    return fields


def choose_graph(stage: SecAggParams, r: Round, u1: list[str]) -> None:
    """The neighbour graph over U1 from a seed of the server's own secret stream, which the
    malicious variant's ``keys`` message announces to every client."""
    link = r.link
    r.graph_seed = link.parties[SERVER].streams.seed_for(
        "protocol", 256, link.round, link.kind, "graph").to_bytes(32, "big")
    r.graph = harary_neighbours(u1, stage.degree(len(u1)),
                                random.Random(int.from_bytes(r.graph_seed, "big")))


def keys_message(stage: SecAggParams, r: Round, u: str, u1: list[str]) -> bytes:
    """Phase 2's message to u: its neighbours' keys; under the malicious-server variant
    also their commitments and signatures, the graph's seed and U1, and the parameters."""
    signed = tuple(name for name in stage.advertised if name not in ("c_pk", "s_pk"))
    fields = ("c_pk", "s_pk") + ((*signed, *PROOF_FIELDS) if stage.adversary == "malicious"
                                 else ())
    message = {f"{kind}:{v}": r.advertised[v][kind] for v in sorted(r.graph[u])
               for kind in fields}
    if stage.adversary == "malicious":
        message |= {"graph_seed": r.graph_seed, "u1": json.dumps(u1).encode(),
                    "params": stage.parameters()}
    return _bytes_payload(message)


def consistency(r: Round, u3: list[str]) -> dict[str, Confirmation]:
    """Phases consistency and consistency_sign (malicious-server variant): each survivor
    signs the survivor set U3 with what it saw. Returns survivor -> signature, relayed
    unverified: each client checks them against its own view."""
    announcement = _json_payload({"survivors": u3})
    replies = r.link.exchange("consistency", "consistency_sign", "secagg.sign",
                              {v: Ask(announcement) for v in u3})
    confirmations = {}
    for v in u3:
        if v not in replies or replies[v].data is None:
            continue
        try:
            fields = _payload_bytes(replies[v].data, v)
            if sorted(fields) != ["sig"] or len(fields["sig"]) != 64:
                raise MessageError(f"{v}'s consistency reply is not a 64-byte sig")
        except MessageError as err:
            r.reject("consistency_sign", v, str(err))
            continue
        confirmations[v] = fields["sig"]
    return confirmations


def masked_inputs(r: Round, replies: dict, senders, parse, offline: str) -> dict:
    """Each of ``senders``' masked input as ``parse(data, sender)`` reads it. A sender with
    no reply is dropped as ``offline``; one whose reply was rejected or never arrived is
    dropped saying so; one whose reply ``parse`` refuses (a MessageError) is rejected by name
    and dropped."""
    parsed = {}
    for v in senders:
        if v not in replies:
            r.dropped[v] = offline
            continue
        if replies[v].data is None:
            r.dropped[v] = silence(replies[v], v, "its masked input was rejected or never "
                                   "arrived")
            continue
        try:
            parsed[v] = parse(replies[v].data, v)
        except MessageError as err:
            r.reject("masked_input", v, str(err))
            r.dropped[v] = str(err)
    return parsed
