"""A client's session of one aggregation (under setup = "once", of one key set-up): its keys
and seeds, what it derives from its neighbours' keys, the shares it holds, and the rules by
which it answers the server's consistency and unmask requests. Only its own client touches
it; :mod:`.client` keeps it between requests."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from dataclasses import dataclass, field

from ...errors import MessageError, ProtocolError
from ...federation.crypto import (
    KeyPair,
    agree,
    new_key_pair,
    open_sealed,
    private_bytes,
    private_from_bytes,
    seal,
    verify_signature,
)
from ...federation.message import SERVER
from ...federation.parties import Client, Registry
from ..key_batch import PROOF_FIELDS, check_proof, commit, field_length_ok
from ..link import broadcast_digest
from ..shamir import SHARE_BYTES, Share, share_from_bytes, share_to_bytes, split_bytes
from ..wire import bytes_payload as _bytes_payload
from ..wire import payload_bytes as _payload_bytes
from ..wire import payload_json as _payload_json
from .common import (
    CHANNEL_LABEL,
    MASK_LABEL,
    SEALED_BYTES,
    harary_neighbours,
    survivor_statement,
)
from .params import SecAggParams

__all__ = ["ClientSession", "Peer"]


def _id_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


def _parse_request(data: bytes, tables: tuple[str, ...]
                   ) -> tuple[set[str], set[str], dict[str, dict[str, bytes]]]:
    """(survivors, dropped, name -> survivor -> bytes for each of the hex ``tables`` the
    variant relays: ``signatures``) of an unmask request."""
    request = _payload_json(data, SERVER)
    keys = sorted(["dropped", "survivors", *tables])
    if (not isinstance(request, dict) or sorted(request) != keys
            or not (_id_list(request["survivors"]) and _id_list(request["dropped"]))):
        raise MessageError(f"the unmask request is not a table of {', '.join(keys)}")
    try:
        read = {name: {w: bytes.fromhex(value) for w, value in request[name].items()}
                for name in tables}
    except (AttributeError, TypeError, ValueError):
        raise MessageError(f"the unmask request's {' or '.join(tables)} are not hex strings by "
                           "client id") from None
    return set(request["survivors"]), set(request["dropped"]), read


def _parse_survivors(data: bytes) -> list[str]:
    request = _payload_json(data, SERVER)
    if not isinstance(request, dict) or sorted(request) != ["survivors"] or not _id_list(
            request["survivors"]):
        raise MessageError("the consistency message is not {'survivors': [ids]}")
    return request["survivors"]


@dataclass
class Peer:
    """What a client derives from one neighbour's public keys."""

    channel: bytes  # AES key for the shares between the two
    pair_seed: bytes  # seed of their pairwise mask
    first: bool  # whether this client precedes the neighbour (then it adds the mask)


@dataclass
class ClientSession:
    """What one client holds during one aggregation. Only its own client touches it.

    ``party``: the client (its own identity signs); ``registry``: the public keys it pinned,
    never the keys the server relays; ``stage``: the spec it loaded (parameters, threshold);
    ``round``, ``kind``: the aggregation.
    """

    party: Client
    registry: Registry
    stage: SecAggParams
    round: int
    kind: str
    channel: KeyPair = field(default_factory=lambda: new_key_pair())  # looked up when called
    mask: KeyPair = field(default_factory=lambda: new_key_pair())
    self_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    peers: dict[str, Peer] = field(default_factory=dict)
    holdings: dict[str, tuple[Share, Share]] = field(default_factory=dict)  # author -> (s, b)
    masks_with: tuple[str, ...] = ()
    graph: bytes = b""  # digest of the neighbour graph it was told (seed and U1)
    signed: tuple[str, ...] | None = None  # the survivor set it signed
    answered: bool = False
    # setup = "once" only: the round it last masked in (``round`` is the set-up's) and its own
    # share of that round's seed.
    current: int | None = None
    own: Share | None = None
    # malicious variant: the proof that its identity signed its keys (key_batch.PROOF_FIELDS)
    proof: dict[str, bytes] = field(default_factory=dict)
    tag = "secagg"  # its kind among what an endpoint keeps (SecAggStage.restore_session)

    def to_json(self) -> dict:
        """Everything this session holds, as JSON values (private keys and seeds in hex): what
        a client's own process keeps between the requests of one aggregation."""
        return {"round": self.round, "kind": self.kind,
                "channel": private_bytes(self.channel.private).hex(),
                "mask": private_bytes(self.mask.private).hex(), "self_seed": self.self_seed.hex(),
                "peers": {v: [p.channel.hex(), p.pair_seed.hex(), p.first]
                          for v, p in self.peers.items()},
                "holdings": {u: [share_to_bytes(s).hex(), share_to_bytes(b).hex()]
                             for u, (s, b) in self.holdings.items()},
                "masks_with": list(self.masks_with), "graph": self.graph.hex(),
                "signed": None if self.signed is None else list(self.signed),
                "answered": self.answered, "current": self.current,
                "own": None if self.own is None else share_to_bytes(self.own).hex(),
                "proof": {name: value.hex() for name, value in self.proof.items()}}

    @classmethod
    def from_json(cls, party: Client, registry: Registry, stage: SecAggParams,
                  table: dict) -> ClientSession:
        """The inverse of :meth:`to_json` for ``party``, under its own ``stage``."""
        return cls(party, registry, stage, int(table["round"]), str(table["kind"]),
                   KeyPair(private_from_bytes(bytes.fromhex(table["channel"]))),
                   KeyPair(private_from_bytes(bytes.fromhex(table["mask"]))),
                   bytes.fromhex(table["self_seed"]),
                   {v: Peer(bytes.fromhex(c), bytes.fromhex(p), bool(first))
                    for v, (c, p, first) in table["peers"].items()},
                   {u: (share_from_bytes(bytes.fromhex(s)), share_from_bytes(bytes.fromhex(b)))
                    for u, (s, b) in table["holdings"].items()},
                   tuple(table["masks_with"]), bytes.fromhex(table["graph"]),
                   None if table["signed"] is None else tuple(table["signed"]),
                   bool(table["answered"]),
                   None if table["current"] is None else int(table["current"]),
                   None if table["own"] is None else share_from_bytes(bytes.fromhex(
                       table["own"])),
                   {name: bytes.fromhex(value) for name, value in table["proof"].items()})

    @property
    def id(self) -> str:
        return self.party.id

    @property
    def malicious(self) -> bool:
        return self.stage.adversary == "malicious"

    @property
    def aggregation(self) -> int:
        """The round of the aggregation this session is in now (under setup = "once", the
        round it last masked in)."""
        return self.round if self.current is None else self.current

    def advertisement(self) -> bytes:
        fields = {"c_pk": self.channel.public, "s_pk": self.mask.public,
                  "b_commit": commit(self.self_seed)}
        fields = {name: fields[name] for name in self.stage.advertised}
        return _bytes_payload(fields | self.proof)

    def take_keys(self, data: bytes, order: dict[str, int]) -> None:
        """Derive channel keys and mask seeds from the server's ``keys`` message; raises
        MessageError for a malformed message or a key that is not a usable point, and under
        the malicious-server variant for keys not signed by their owner's pinned identity or
        neighbours other than the announced graph's."""
        fields = _payload_bytes(data, SERVER)
        expected = self._neighbours(fields) if self.malicious else None
        keys: dict[str, dict[str, bytes]] = {}
        for name, value in fields.items():
            kind, _, v = name.partition(":")
            if kind in ("graph_seed", "u1", "params") and self.malicious:
                continue
            if (kind not in self.stage.advertised + PROOF_FIELDS or v not in order
                    or v == self.id or not field_length_ok(kind, value)):
                raise MessageError(f"the keys message has field {name!r} ({len(value)} bytes)")
            keys.setdefault(v, {})[kind] = value
        wanted = {"c_pk", "s_pk"} | ({*PROOF_FIELDS, *self.stage.advertised} if self.malicious
                                     else set())
        if not keys or any(set(k) != wanted for k in keys.values()):
            raise MessageError(f"the keys message lacks one of {', '.join(sorted(wanted))} of "
                               "some neighbour")
        if expected is not None:
            self._check_keys(keys, expected)
        try:
            self.peers = {v: Peer(agree(self.channel.private, k["c_pk"], CHANNEL_LABEL),
                                   agree(self.mask.private, k["s_pk"], MASK_LABEL),
                                   order[self.id] < order[v]) for v, k in keys.items()}
        except ProtocolError as err:
            raise MessageError(f"the keys message holds an unusable key: {err}") from None

    def _neighbours(self, fields: dict[str, bytes]) -> set[str]:
        """This client's neighbours in the graph the server announced (a seed and U1): every
        client derives the same graph from the same announcement, and signs its digest. The
        announced parameters must be this client's own."""
        if fields.get("params") != self.stage.parameters():
            raise MessageError(f"the keys message announces parameters {fields.get('params')!r}"
                               f", this client's spec has {self.stage.parameters()!r}")
        seed, u1 = fields.get("graph_seed", b""), fields.get("u1", b"")
        try:
            ids = json.loads(u1)
        except ValueError:
            ids = None
        if len(seed) != 32 or not _id_list(ids) or self.id not in ids or len(set(ids)) != len(
                ids):
            raise MessageError("the keys message lacks a 32-byte graph_seed and a u1 list of "
                               "distinct client ids holding this client")
        self.graph = hashlib.sha256(seed + u1).digest()
        graph = harary_neighbours(ids, self.stage.degree(len(ids)),
                                  random.Random(int.from_bytes(seed, "big")))
        return graph[self.id]

    def _check_keys(self, keys: dict[str, dict[str, bytes]], expected: set[str]) -> None:
        if set(keys) != expected:
            raise MessageError(f"the keys message carries keys of {sorted(keys)}, but the "
                               f"announced graph gives this client {sorted(expected)}")
        for v, k in keys.items():
            if v not in self.registry.sign or not check_proof(
                    self.id, self.registry.sign[v], self.round, self.kind, v, k,
                    self.stage.advertised):
                raise MessageError(f"the keys of {v} are not signed by {v}'s pinned identity "
                                   "(substituted or altered in relay)")

    def deal(self, members: list[str], t: int, context) -> bytes:
        """Shares of s_sk and b_u for each of ``members`` (S(u), in client order), t needed;
        each peer's pair sealed under their channel key, this client's own kept."""
        key_shares = split_bytes(private_bytes(self.mask.private), t, len(members))
        seed_shares = split_bytes(self.self_seed, t, len(members))
        sealed = {}
        for v, ks, bs in zip(members, key_shares, seed_shares, strict=True):
            if v == self.id:
                self.holdings[v] = (ks, bs)
            else:
                sealed[v] = seal(self.peers[v].channel, share_to_bytes(ks) + share_to_bytes(bs),
                                 context(self.id, v), secrets.token_bytes(12))
        return _bytes_payload(sealed)

    def take_shares(self, data: bytes, context) -> dict[str, str]:
        """Open the shares the server routed; returns why each unusable author's failed.
        Raises MessageError when the bundle itself is malformed (then it does not mask)."""
        bundle = _payload_bytes(data, SERVER)
        strangers = sorted(set(bundle) - set(self.peers))
        if strangers:
            raise MessageError(f"the server routed shares from {strangers[0]}, not a neighbour")
        group = len(self.peers) + 1
        if len(bundle) + 1 < self.stage.shares_needed(group):
            raise MessageError(
                f"the server routed shares of {len(bundle)} peers; with itself that is fewer "
                f"than the threshold {self.stage.shares_needed(group)}, and a client masking "
                "with so few peers could be unmasked by naming them dropped")
        failed = {}
        for u, sealed in bundle.items():
            try:
                if len(sealed) != SEALED_BYTES:
                    raise ProtocolError(f"{len(sealed)} bytes sealed, expected {SEALED_BYTES}")
                plain = open_sealed(self.peers[u].channel, sealed, context(u, self.id))
                key_share = share_from_bytes(plain[:SHARE_BYTES])
                seed_share = share_from_bytes(plain[SHARE_BYTES:])
            except ProtocolError as err:
                failed[u] = str(err)
                continue
            self.holdings[u] = (key_share, seed_share)
        self.masks_with = tuple(bundle)
        return failed

    def mask_seeds(self) -> tuple[list[bytes], list[bytes]]:
        """(plus, minus): the seeds whose masks its input gets added and subtracted, for
        y = q + PRG(b_u) + sum_v +-PRG(s_uv) mod 2^bits over the peers it masks with (+ when
        it precedes v)."""
        peers = [self.peers[v] for v in self.masks_with]
        return ([self.self_seed] + [p.pair_seed for p in peers if p.first],
                [p.pair_seed for p in peers if not p.first])

    def _statement(self, survivors: list[str]) -> bytes:
        """The consistency statement of ``survivors`` over what this client saw this round."""
        return survivor_statement(self.aggregation, self.kind, survivors,
                                  self.stage.parameters(), self.graph,
                                  broadcast_digest(self.party, self.aggregation))

    def sign_survivors(self, data: bytes) -> bytes:
        """Consistency round, once: the reply to the server's survivor set, its statement
        (:meth:`_statement`) signed with this client's identity (``sig``: what each peer checks
        before it answers an unmask request, and the audit after)."""
        survivors = _parse_survivors(data)
        if self.signed is not None:
            raise MessageError("asked to sign a second survivor set in this aggregation")
        if self.id not in survivors:
            raise MessageError("the announced survivor set leaves out this client, which sent "
                               "its masked input")
        self.signed = tuple(sorted(survivors))
        return _bytes_payload({"sig": self.party.sign(self._statement(survivors))})

    def answer(self, data: bytes) -> bytes:
        """The unmask reply, at most once per aggregation; raises MessageError (a refusal,
        logged by this client) for a request that is malformed, names this client as dropped,
        names a peer both alive and dropped or a party this client did not mask with,
        counts fewer survivors in the group than the threshold, or (malicious-server variant)
        lists other survivors than the set it signed, or lacks a valid signature of that set,
        of what it saw, from every survivor in its group."""
        survivors, gone = self.admit(data)
        answer = {}
        for u, (key_share, seed_share) in self.holdings.items():
            if u in survivors:
                answer[f"b:{u}"] = share_to_bytes(seed_share)
            elif u in gone:
                answer[f"s:{u}"] = share_to_bytes(key_share)
        return _bytes_payload(answer)

    def admit(self, data: bytes) -> tuple[set[str], set[str]]:
        """The survivors and dropped of an unmask request this client may answer (see
        :meth:`answer`), now marked answered; raises MessageError for one it may not."""
        survivors, gone, read = _parse_request(
            data, ("signatures",) if self.malicious else ())
        group = set(self.masks_with) | {self.id}  # whom it masked with, and itself
        needed = self.stage.shares_needed(len(self.peers) + 1)
        problem = ("it already answered an unmask request in this aggregation" if self.answered
                   else self._request_problem(survivors, gone, group, needed))
        if not problem and self.malicious:
            problem = self._consistency_problem(survivors, group, read["signatures"])
        if problem:
            raise MessageError(problem)
        self.answered = True
        return survivors, gone

    def _request_problem(self, survivors: set[str], gone: set[str], group: set[str],
                         needed: int) -> str:
        if self.id in gone:
            return "the request names this client itself as dropped, which would reveal its key"
        both = sorted(survivors & gone)
        if both:
            return f"the request names {both[0]} both alive and dropped, which would reveal it"
        strangers = sorted((survivors | gone) - group)
        if strangers:
            return (f"the request names {strangers[0]}, whom this client did not mask with "
                    f"(it masked with {sorted(group - {self.id})})")
        if len(survivors) < needed:
            return (f"only {len(survivors)} survivors among the clients it masked with and "
                    f"itself, threshold {needed}")
        return ""

    def _consistency_problem(self, survivors: set[str], group: set[str],
                             signatures: dict[str, bytes]) -> str:
        """Why the request's survivors may not be answered: not the set this client signed, or
        a survivor's relayed signature of the statement this client signed is missing or does
        not verify (:meth:`_signature_problem`)."""
        if self.signed is None:
            return "it signed no survivor set in this aggregation"
        if survivors != set(self.signed) & group:
            return (f"the request's survivors {sorted(survivors)} are not those of the set it "
                    f"signed ({sorted(set(self.signed) & group)} among the clients it masked "
                    "with and itself)")
        return self._signature_problem(
            survivors, signatures, self._statement(list(self.signed)),
            "the survivor set, parameters, graph and broadcasts this client saw (a split view, "
            "another broadcast, or it left)")

    def _signature_problem(self, survivors: set[str], signatures: dict[str, bytes],
                           statement: bytes, what: str) -> str:
        """Which survivor, if any, did not confirm ``statement`` (this client's view, ``what``
        in words): its relayed signature of it is missing or does not verify with its pinned
        key. Every survivor the request names, this client included (the server relays its
        own back): the audit holds a client that answered to exactly this."""
        for w in sorted(survivors):
            if not verify_signature(self.registry.sign.get(w, b""), signatures.get(w, b""),
                                    statement):
                return f"{w} did not confirm {what}"
        return ""
