"""Secure aggregation with dropout recovery: Bonawitz et al. (CCS 2017), with the SecAgg+
neighbour graph of Bell et al. (CCS 2020). The server learns only the weighted sum of the
updates of the clients that survive a round, or, below the threshold, nothing.

One aggregation (a fresh session, fresh keys) runs these phases:

1. ``advertise_keys``: each client u sends X25519 public keys c_pk (channel) and s_pk (mask)
   and a commitment SHA-256(label || b_u) to a fresh self-mask seed b_u from the OS CSPRNG;
   under the malicious-server variant it signs them, bound to the round, kind and its id, with
   its long-term Ed25519 identity.
2. ``keys``: the server picks each client's neighbours N(u) (all others, or a random
   ``neighbours``-regular graph from a seed) and sends u their public keys; the malicious
   variant also sends their commitments and signatures, the seed and U1 and the stage's
   parameters; u re-derives its neighbours from them, refuses parameters other than its own
   spec's and checks every signature against the identities it pinned (not keys the server
   relays): a substituted key makes u refuse the message and drop out.
3. ``share_keys``: u Shamir-shares its mask secret key s_sk and b_u among S(u) = N(u) + {u},
   t of |S(u)|; the share for v travels AES-GCM-encrypted under HKDF(X25519(c_sk_u, c_pk_v)),
   relayed by the server, which cannot read it.
4. ``shares``: the server routes the ciphertexts; each recipient opens them at once, and
   refuses to mask when they come from fewer than t - 1 peers (t of its group of |S(u)|).
5. ``masked_input``: u clips and quantizes its input x_u to Z_{2^bits} at its own weight, 1
   (it refuses a server's other ``scale``: one that chose the weights could send 0 to all
   clients but one and read that one's input as the sum); under distributed DP noise it adds
   its share of integer Skellam noise, whose variance it derives from its own spec and noise
   plan (it refuses a server's other value); and it adds
   PRG(b_u) and, for each neighbour v whose shares the server routed to u,
   +-PRG(HKDF(X25519(s_sk_u, s_pk_v))) (+ if u precedes v).
6. ``consistency`` and ``consistency_sign`` (malicious variant): the server announces the
   survivors U3; each survivor signs U3 once, with a digest of the parameters, the graph and
   the broadcasts it received this round.
7. ``unmask_request``: the server names, among the clients each survivor masked with, the
   survivors and the dropped (and relays the survivors' signatures).
8. ``unmask``: each survivor answers one request per aggregation, revealing per peer the share
   of b for survivors or of s_sk for the dropped, never both. It refuses a request that names it
   dropped, names a peer both alive and dropped or a party it did not mask with, counts fewer
   survivors than the threshold among those it masked with and itself, or (malicious variant)
   lists other survivors than those it signed or lacks a valid signature of what it saw from
   every survivor among them. With step 5's rule (Bonawitz et al.'s "|U2| >= t"), a server
   that routes a client few peers and then names them dropped gets too few shares of its seed.

The server rebuilds each secret with :func:`~secureffm.protocols.shamir.decode`, checks it
(b_u against u's commitment, s_sk against u's advertised s_pk), removes the self masks and the
dropped clients' pairwise masks, and dequantizes: the mean of the survivors' x_u, at equal
weights (unequal ones are refused before the round).

Every message is parsed under a guard, by the server or by the client it is for. A bad one is
rejected by name (a ``rejected`` event, signed by whoever rejected it), and then:

- a client whose advertisement (keys that are not X25519 points of large order, a missing
  commitment), shares or masked input the server rejects is dropped from the round;
- a client that cannot use the server's keys or shares message drops out before it masks, and
  the server removes its pairwise masks as for any client that dropped before masking;
- a recipient that cannot open a peer's share (failed authentication, wrong length) names the
  peer and holds no share of it; it still masks with the peer (the masks need only public keys);
- an unmask reply that is malformed is discarded whole; a share that does not lie on the
  polynomial of the others, or claims the wrong x, is left out and its holder named (the
  holder altered it, or the dealer dealt it so). The holder's input stays in the sum: it
  arrived masked before the reply, and taking it out would need both of its secrets.

Each clipped coordinate is counted; a client with any logs a ``clipped`` event with the count,
except under distributed noise (the count is of its update before its noise share). The round
then is exact over the survivors or aborts with a reason (``Aggregate.payload`` None). The clip
binds honest clients only: a client may send any masked words, and the server checks only that
the unmasked total lies in the quantizer's range (none under distributed noise), so one client
can weigh up to about n x clip per coordinate in the sum (half the modulus under distributed
noise); per-client range proofs would be needed to enforce the clip, and none are built.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import secrets
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import ConfigError, MessageError, ProtocolError
from ..federation.channel import Aggregate, Compute, Template
from ..federation.crypto import (
    KeyPair,
    agree,
    new_key_pair,
    open_sealed,
    private_bytes,
    private_from_bytes,
    seal,
    verify_signature,
)
from ..federation.crypto import public_bytes as public_of
from ..federation.message import SERVER
from ..federation.parties import Client, Registry
from ..privacy.settings import DistributedNoise, NoiseGeometry
from ..privacy.skellam import grid_sensitivity
from .adversary import repeated_requests
from .aggregation import check_payload, template_json, template_of, unflatten
from .endpoint import SESSIONS, Step, client_action
from .key_batch import PROOF_FIELDS, KeyBatch, check_proof, commit, field_length_ok
from .link import Call, Link, broadcast_digest, silence
from .masking import as_vector, masked_payload, parse_masked, unmask_sum
from .neighbourhood import TOLERANCE_KEYS, Tolerance, check_degree, degree_for, tolerance_from_table
from .prg import word_dtype
from .quantize import Quantizer
from .registry import check_protects, check_table, register_stage
from .shamir import (
    SHARE_BYTES,
    Share,
    decode,
    share_from_bytes,
    share_to_bytes,
    split_bytes,
)
from .wire import bytes_payload as _bytes_payload
from .wire import json_payload as _json_payload
from .wire import payload_bytes as _payload_bytes
from .wire import payload_json as _payload_json

__all__ = ["SecAggStage", "harary_neighbours", "survivor_statement", "MALICIOUS_PHASES",
           "check_scale"]

PHASES = ("advertise_keys", "keys", "share_keys", "shares", "masked_input", "unmask_request",
          "unmask")
# setup = "once" (secagg_epoch.py): keys in the first aggregation of a kind (advertise_keys,
# keys, keys_taken), then per round an unsigned mask request, masked inputs that carry the
# round's seed shares, and unmasking.
EPOCH_PHASES = ("advertise_keys", "keys", "keys_taken", "mask_request", "masked_input",
                "unmask_request", "unmask")
# The malicious-server variant adds a consistency round between masked inputs and unmasking,
# under either set-up.
MALICIOUS_PHASES = ("advertise_keys", "keys", "share_keys", "shares", "masked_input",
                    "consistency", "consistency_sign", "unmask_request", "unmask")
EPOCH_MALICIOUS_PHASES = EPOCH_PHASES[:5] + MALICIOUS_PHASES[5:]
ADVERSARIES = ("malicious", "semi-honest")
_KEYS = {"stage", "protects", "threshold", "neighbours", "clip", "levels", "bits", "adversary",
         "setup", "key_batch"} | TOLERANCE_KEYS
_SURVIVOR_STATEMENT = b"secureffm/secagg/survivors/v1"
_MASK, _CHANNEL = b"mask-seed", b"share-channel"
# A client's confirmation of what it saw (malicious variant): its Ed25519 signature of the
# statement, which its peers check before they answer and the audit checks again.
Confirmation = bytes
_ADVERTISED = ("b_commit", "c_pk", "s_pk")  # 32 bytes each
# Under setup = "once" a client advertises no self-mask commitment: it draws a fresh seed per
# round and commits to it with its masked input (secagg_epoch.py).
_ADVERTISED_ONCE = ("c_pk", "s_pk")
SETUPS = ("per-round", "once")
# Rounds of keys a client signs at once under the malicious variant (key_batch.py): each
# neighbour verifies one signature per client per 32 rounds instead of one per round.
KEY_BATCH = 32
# setup = "once" runs secagg_epoch.aggregate_once, which builds on this module and puts itself
# here when imported (protocol.py imports every stage module before a protocol is built).
EPOCH_AGGREGATE: list = []
_SEALED_BYTES = 12 + 2 * SHARE_BYTES + 16  # nonce, the two shares, GCM tag
# Headroom for distributed noise: the decoded sum must stay within half the modulus of the
# centre of its noiseless range for this many standard deviations of the total noise.
_NOISE_SIGMAS = 12.0
# Why a secure-aggregation stage (secagg, ckks) refuses unequal weights before a round.
EQUAL_WEIGHTS = ("secure aggregation needs equal weights: each client weighs its own input 1 "
                 "and refuses any other scale, so the server cannot weigh out all clients but "
                 "one. Give every client the same weight (weighting = 'uniform')")
# Each secret the server rebuilds: how reasons name it, and what the rebuilt value must match.
_SECRETS = {"b": ("b (self-mask seed)", "the seed it committed to"),
            "s": ("s (mask key, dropped)", "the key of its advertised s_pk")}


def harary_neighbours(ids: list[str], k: int, rng: random.Random) -> dict[str, set[str]]:
    """A random k-regular graph (Bell et al.): a Harary graph H(n, k) on a random cyclic order.

    k is rounded up to even; k >= n - 1 gives the complete graph.
    """
    n = len(ids)
    if k <= 0 or k >= n - 1:
        return {u: set(ids) - {u} for u in ids}
    half = (k + 1) // 2
    order = ids[:]
    rng.shuffle(order)
    graph = {u: set() for u in ids}
    for i, u in enumerate(order):
        for step in range(1, half + 1):
            v = order[(i + step) % n]
            graph[u].add(v)
            graph[v].add(u)
    return graph


# -- wire formats: each parser raises MessageError naming the problem ---------------------------

def survivor_statement(round_: int, kind: str, survivors: list[str], parameters: bytes,
                       graph: bytes, broadcasts: bytes) -> bytes:
    """What a survivor signs in the consistency round (and what the audit re-checks): the
    survivor set it was told, bound to the digest of what it saw this round: the stage's
    ``parameters`` (:meth:`SecAggStage.parameters`), the ``graph`` it was announced
    (sha256 of seed and U1) and the ``broadcasts`` it accepted (:func:`~secureffm.protocols.
    link.broadcast_digest`)."""
    seen = hashlib.sha256(parameters + graph + broadcasts).digest()
    return (_SURVIVOR_STATEMENT + json.dumps([round_, kind, sorted(survivors)]).encode()
            + seen)


def _matches(which: str, value: int, advertised: dict[str, bytes]) -> bool:
    """Whether ``value`` is the 32-byte secret its owner advertised: b_u hashes to its
    commitment; s_sk_u has its advertised s_pk as public key."""
    if value >= 2**256:
        return False
    secret = value.to_bytes(32, "big")
    if which == "b":
        return commit(secret) == advertised["b_commit"]
    return public_of(private_from_bytes(secret)) == advertised["s_pk"]


def _check_point(key: bytes, what: str) -> None:
    """Refuse a public key that is not an X25519 point of large order: an exchange with it
    yields the all-zero secret, which ``cryptography`` refuses (a fresh private key tries)."""
    try:
        agree(private_from_bytes(secrets.token_bytes(32)), key, b"key-check")
    except ProtocolError as err:
        raise MessageError(f"{what} is not a usable X25519 public key ({err})") from None


def _parse_advertisement(data: bytes, u: str, signed: bool,
                         names: tuple[str, ...] = _ADVERTISED) -> dict[str, bytes]:
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


def _parse_dealt(data: bytes, u: str, neighbours: set[str]) -> dict[str, bytes]:
    dealt = _payload_bytes(data, u)
    if set(dealt) != neighbours:
        raise MessageError(f"{u} sent shares for {sorted(dealt)}, expected its neighbours "
                           f"{sorted(neighbours)}")
    for v, sealed in dealt.items():
        if len(sealed) != _SEALED_BYTES:
            raise MessageError(f"{u}'s sealed shares for {v} are {len(sealed)} bytes, expected "
                               f"{_SEALED_BYTES}")
    return dealt


def _shaped(shape, dtype) -> np.ndarray:
    """A reference array of ``shape`` and ``dtype`` for :func:`check_payload`, which reads only
    those: one zero broadcast (no memory per entry)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def _parse_masked(data: bytes, u: str, size: int, wire: np.dtype) -> np.ndarray:
    """u's masked input, shape ``[size]``, in the mask word type ``wire`` (read in place;
    the format is :mod:`~secureffm.protocols.masking`'s)."""
    return parse_masked(data, u, size, wire)["y"]


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


def _parse_reply(data: bytes, v: str, allowed: set[tuple[str, str]]) -> dict[tuple, Share]:
    """(which, peer) -> share from v's unmask reply; ``allowed``: what v may reveal."""
    out = {}
    for name, blob in _payload_bytes(data, v).items():
        which, colon, peer = name.partition(":")
        if not colon or (which, peer) not in allowed:
            raise MessageError(f"{v}'s unmask reply has field {name!r}; it may reveal only "
                               "b:<survivor> or s:<dropped> for peers whose shares it holds")
        try:
            out[which, peer] = share_from_bytes(blob)
        except ProtocolError as err:
            raise MessageError(f"{v}'s unmask reply field {name!r}: {err}") from None
    return out


# -- one client ---------------------------------------------------------------------------------

@dataclass
class _Peer:
    """What a client derives from one neighbour's public keys."""

    channel: bytes  # AES key for the shares between the two
    pair_seed: bytes  # seed of their pairwise mask
    first: bool  # whether this client precedes the neighbour (then it adds the mask)


@dataclass
class _ClientSession:
    """What one client holds during one aggregation. Only its own client touches it.

    ``party``: the client (its own identity signs); ``registry``: the public keys it pinned,
    never the keys the server relays; ``stage``: the spec it loaded (parameters, threshold);
    ``round``, ``kind``: the aggregation.
    """

    party: Client
    registry: Registry
    stage: SecAggStage
    round: int
    kind: str
    channel: KeyPair = field(default_factory=lambda: new_key_pair())  # looked up when called
    mask: KeyPair = field(default_factory=lambda: new_key_pair())
    self_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    peers: dict[str, _Peer] = field(default_factory=dict)
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
    tag = "secagg"  # its kind among the sessions an endpoint keeps (endpoint.SESSIONS)

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
    def from_json(cls, party: Client, registry: Registry, stage: SecAggStage,
                  table: dict) -> _ClientSession:
        """The inverse of :meth:`to_json` for ``party``, under its own ``stage``."""
        return cls(party, registry, stage, int(table["round"]), str(table["kind"]),
                   KeyPair(private_from_bytes(bytes.fromhex(table["channel"]))),
                   KeyPair(private_from_bytes(bytes.fromhex(table["mask"]))),
                   bytes.fromhex(table["self_seed"]),
                   {v: _Peer(bytes.fromhex(c), bytes.fromhex(p), bool(first))
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
            self.peers = {v: _Peer(agree(self.channel.private, k["c_pk"], _CHANNEL),
                                   agree(self.mask.private, k["s_pk"], _MASK),
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
                if len(sealed) != _SEALED_BYTES:
                    raise ProtocolError(f"{len(sealed)} bytes sealed, expected {_SEALED_BYTES}")
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


# -- one aggregation ----------------------------------------------------------------------------

def _context(round_: int, kind: str, author: str, recipient: str) -> bytes:
    """Associated data binding a sealed share to its round, kind and pair."""
    return f"{round_}|{kind}|{author}|{recipient}".encode()


@dataclass
class _Round:
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


@register_stage
class SecAggStage:
    """Pairwise-mask secure aggregation with dropout recovery (see module docstring).

    ``threshold``: shares needed to rebuild a secret, an integer or a fraction of |S(u)|.
    ``neighbours``: 0 masks with every other client (Bonawitz), k > 0 with k random
    neighbours (SecAgg+), None with as many as Bell et al.'s bound gives ``tolerance``
    (the spec's ``corrupt`` and ``dropout`` fractions; neighbourhood.py). ``clip``,
    ``levels``, ``bits``: the quantizer of each input x_u.
    ``key_batch`` (malicious variant, per-round set-up): rounds of keys a client signs at once
    (key_batch.py; 1 signs every round's).
    """

    name = "secagg"
    role = "aggregate"
    can_protect = frozenset({"gradient", "dual_update", "update", "scalar"})

    def __init__(self, protects: tuple[str, ...], threshold: float, neighbours: int | None,
                 quantizer: Quantizer, adversary: str = "malicious", setup: str = "per-round",
                 key_batch: int = KEY_BATCH, tolerance: Tolerance | None = None):
        self.protects = protects
        self.threshold = threshold
        self.neighbours = neighbours
        self.quantizer = quantizer
        self.adversary = adversary
        self.setup = setup
        self.key_batch = key_batch
        self.tolerance = tolerance

    @property
    def phases(self) -> tuple[str, ...]:
        """This variant's phases, in round order."""
        if self.setup == "once":
            return EPOCH_MALICIOUS_PHASES if self.adversary == "malicious" else EPOCH_PHASES
        return MALICIOUS_PHASES if self.adversary == "malicious" else PHASES

    @property
    def advertised(self) -> tuple[str, ...]:
        """The fields a client advertises besides its signature (32 bytes each)."""
        return _ADVERTISED_ONCE if self.setup == "once" else _ADVERTISED

    def parameters(self) -> bytes:
        """Canonical bytes of the parameters every client must share (signed in the
        consistency round, so a server that tells clients different ones is caught)."""
        q = self.quantizer
        values = [self.threshold, self.neighbours, q.clip, q.levels, q.bits, self.adversary]
        if self.tolerance:
            t = self.tolerance
            values += [t.corrupt, t.dropout, t.security, t.correctness]
        return json.dumps(values + (["once"] if self.setup == "once" else [])).encode()

    @classmethod
    def from_table(cls, table: dict, source: str) -> SecAggStage:
        where = f"{source} (stage 'secagg')"
        check_table(table, _KEYS, ("protects", "threshold"), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "it reveals only a sum, and such messages are "
                       "needed one by one")
        threshold = table["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or (
                isinstance(threshold, float) and not 0.5 < threshold <= 1) or (
                isinstance(threshold, int) and threshold < 2):
            raise ProtocolError(f"{source}: threshold = {threshold!r}; give an integer >= 2 "
                                "(shares needed) or a fraction in (0.5, 1] of each share group: "
                                "at half or below, a server that tells two halves of the group "
                                "different survivor lists collects both secrets of a client")
        neighbours = table.get("neighbours", None if TOLERANCE_KEYS & set(table) else 0)
        if neighbours is not None and (not isinstance(neighbours, int) or neighbours < 0):
            raise ProtocolError(f"{source}: neighbours = {neighbours!r}; give 0 (all clients) "
                                "or a positive number of neighbours (SecAgg+; odd is rounded up)")
        try:
            quantizer = Quantizer(float(table.get("clip", 8.0)), int(table.get("levels", 2**22)),
                                  int(table.get("bits", 32)))
        except ProtocolError as err:
            raise ProtocolError(f"{source}: {err}") from None
        adversary = table.get("adversary", "malicious")
        if adversary not in ADVERSARIES:
            raise ProtocolError(f"{source}: adversary = {adversary!r}; use 'malicious' (keys "
                                "signed, a consistency round: holds against a server that "
                                "deviates) or 'semi-honest' (faster; holds only against a server "
                                "that follows the protocol)")
        setup = table.get("setup", "per-round")
        if setup not in SETUPS:
            raise ProtocolError(f"{source}: setup = {setup!r}; use 'per-round' (fresh keys and "
                                "shares in every aggregation, Bonawitz et al.) or 'once' (keys "
                                "agreed once per kind, masks derived per round: fewer messages "
                                "for many rounds of small models; docs/protocols.md)")
        key_batch = table.get("key_batch", KEY_BATCH)
        if "key_batch" in table and (adversary, setup) != ("malicious", "per-round"):
            raise ProtocolError(f"{source}: key_batch applies only to keys signed every round "
                                "(adversary = 'malicious', setup = 'per-round'); remove it")
        if isinstance(key_batch, bool) or not isinstance(key_batch, int) or not (
                1 <= key_batch <= 1024 and key_batch & (key_batch - 1) == 0):
            raise ProtocolError(f"{source}: key_batch = {key_batch!r}; give a power of two from "
                                "1 (every round's keys signed on their own) to 1024 (rounds "
                                "of keys a client signs at once)")
        tolerance = tolerance_from_table(table, adversary == "malicious", where)
        return cls(protects, threshold, neighbours, quantizer, adversary, setup, key_batch,
                   tolerance)

    # -- parameters ------------------------------------------------------------------------

    def degree(self, clients: int) -> int:
        """k, the neighbours each of ``clients`` clients gets (0: all others)."""
        return degree_for(clients, self.neighbours, self.tolerance, self.shares_needed)

    def group_size(self, clients: int) -> int:
        """|S(u)|: a client's neighbours plus itself."""
        k = self.degree(clients)
        k += k % 2
        return clients if k <= 0 or k >= clients - 1 else k + 1

    def shares_needed(self, group: int) -> int:
        if isinstance(self.threshold, float):
            return max(2, math.ceil(self.threshold * group - 1e-9))
        return int(self.threshold)

    def validate_for(self, clients: int) -> None:
        group = self.group_size(clients)
        needed = self.shares_needed(group)
        if clients < 2:
            raise ProtocolError("secure aggregation needs at least 2 clients: the sum of one "
                                "update is the update")
        if 2 * needed <= group:
            raise ProtocolError(
                f"threshold = {self.threshold!r} needs only {needed} of {group} shares; it must "
                f"exceed half the share group ({group // 2 + 1} or more), or a server that tells "
                "two halves of the group different survivor lists collects both secrets of one "
                "client")
        if needed > group:
            raise ProtocolError(
                f"threshold = {self.threshold!r} needs {needed} shares but each client shares "
                f"among {group} parties ({clients} clients, neighbours = {self.neighbours}); "
                f"lower threshold to at most {group} or raise neighbours")
        check_degree(clients, self.neighbours, self.tolerance, self.shares_needed)
        self.quantizer.check(clients)

    @staticmethod
    def scales(weights: dict[str, float]) -> dict[str, float]:
        """w_u, the factor each client multiplies its input by: 1 for every client, the only
        one a client takes (:func:`check_scale`), so the server obtains the equally weighted
        sum. Unequal ``weights`` are refused (ProtocolError): a weight the server chose would
        let it weigh out all but one client and read that client's input as the "sum"."""
        if len(set(weights.values())) > 1:
            raise ProtocolError(EQUAL_WEIGHTS)
        return dict.fromkeys(weights, 1.0)

    def noise_geometry(self, weights: dict[str, float], sensitivity: dict[str, float],
                       size: int, colluders: int) -> NoiseGeometry:
        """Distributed-noise geometry for inputs of ``size`` coordinates whose L2 sensitivity
        is ``sensitivity[u]`` in the update's units; see :class:`NoiseGeometry`."""
        scale = self.scales(weights)
        honest = self.shares_needed(self.group_size(len(weights))) - colluders
        if honest < 1:
            raise ProtocolError(
                f"colluders = {colluders} leaves no honest client among the "
                f"{honest + colluders} whose inputs a round needs at least; distributed noise "
                "then protects nobody. Lower colluders or raise the secagg threshold")
        return NoiseGeometry({u: grid_sensitivity(sensitivity[u], scale[u], self.quantizer.step,
                                                  size) for u in weights}, honest)

    # -- one aggregation -------------------------------------------------------------------

    def aggregate(self, link: Link, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None) -> Aggregate:
        """One aggregation over ``link``'s clients. ``noise``: each client's share of
        distributed DP noise, or None."""
        self.scales(weights)  # unequal weights are refused before the round
        if self.setup == "once":
            return EPOCH_AGGREGATE[0](self, link, compute, weights, template, noise)
        ids = [c.id for c in link.clients]
        size = sum(int(np.prod(shape)) for shape, _ in template.values())
        share_variance = self._share_variance(noise, weights, size, len(ids))
        r = _Round(link, {c: i for i, c in enumerate(ids)})
        needed = self.shares_needed(self.group_size(len(ids)))

        def abort(reason: str) -> Aggregate:
            return Aggregate(None, [], r.dropped, reason, list(r.routed))

        u1 = self._advertise(r, ids)
        if len(u1) < needed:
            return abort(f"only {len(u1)} clients advertised keys, threshold is {needed}")
        self.choose_graph(r, u1)
        dealt = self._share_keys(r, u1)
        u2 = list(dealt)
        if len(u2) < needed:
            return abort(f"only {len(u2)} clients shared keys, threshold is {needed}")
        masked = self._masked_inputs(r, dealt, compute, weights, template, share_variance)
        u3 = [u for u in u2 if u in masked]
        if len(u3) < needed:
            return abort(f"only {len(u3)} masked inputs arrived, threshold is {needed}")
        gone = [u for u in u2 if u not in masked]
        confirmations = self._consistency(r, u3) if self.adversary == "malicious" else {}
        revealed = self._unmask(r, u3, gone, confirmations)
        rebuilt, reason = self._rebuild(r, u3, gone, revealed)
        if reason:
            return abort(reason)
        total = self._unmasked_sum(r, masked, gone, rebuilt, size)
        try:
            summed = self.quantizer.dequantize_sum(total, len(u3), noisy=bool(share_variance))
        except ProtocolError as err:
            return abort(f"the unmasked sum is unusable ({err}): a survivor masked its input "
                         "wrongly or sent one outside the quantizer's range")
        scale = self.scales(weights)
        mean = summed / sum(scale[u] for u in u3)
        return Aggregate(unflatten(mean, template), u3, r.dropped, asked=list(r.routed))

    def choose_graph(self, r: _Round, u1: list[str]) -> None:
        """The neighbour graph over U1 from a seed of the server's own secret stream, which the
        malicious variant's ``keys`` message announces to every client."""
        link = r.link
        r.graph_seed = link.parties[SERVER].streams.seed_for(
            "protocol", 256, link.round, link.kind, "graph").to_bytes(32, "big")
        r.graph = harary_neighbours(u1, self.degree(len(u1)),
                                    random.Random(int.from_bytes(r.graph_seed, "big")))

    def _advertise(self, r: _Round, ids: list[str]) -> list[str]:
        """Phase 1. Returns U1, the clients whose keys and commitment the server accepted."""
        replies = r.link.exchange("advertise_keys", "advertise_keys", "secagg.advertise",
                                  {u: Call() for u in ids})
        for u in ids:
            data = replies[u].data if u in replies else None
            if data is None:
                r.dropped[u] = "dropped before advertising keys"
                continue
            try:
                r.advertised[u] = self._accept_advertisement(r, data, u)
            except MessageError as err:
                r.reject("advertise_keys", u, str(err))
                r.dropped[u] = str(err)
        return [u for u in ids if u in r.advertised]

    def _accept_advertisement(self, r: _Round, data: bytes, u: str) -> dict[str, bytes]:
        """The server's check of u's advertisement (the clients check the signature again
        against their own pinned keys)."""
        fields = _parse_advertisement(data, u, self.adversary == "malicious", self.advertised)
        if "sig" in fields and not check_proof(SERVER, r.link.transport.registry.sign[u],
                                               r.link.round, r.link.kind, u, fields,
                                               self.advertised):
            raise MessageError(f"{u}'s keys are not signed by its pinned identity")
        return fields

    def _keys_message(self, r: _Round, u: str, u1: list[str]) -> bytes:
        """Phase 2's message to u: its neighbours' keys; under the malicious-server variant
        also their commitments and signatures, the graph's seed and U1, and the parameters."""
        signed = tuple(name for name in self.advertised if name not in ("c_pk", "s_pk"))
        fields = ("c_pk", "s_pk") + ((*signed, *PROOF_FIELDS) if self.adversary == "malicious"
                                     else ())
        message = {f"{kind}:{v}": r.advertised[v][kind] for v in sorted(r.graph[u])
                   for kind in fields}
        if self.adversary == "malicious":
            message |= {"graph_seed": r.graph_seed, "u1": json.dumps(u1).encode(),
                        "params": self.parameters()}
        return _bytes_payload(message)

    def _share_keys(self, r: _Round, u1: list[str]) -> dict[str, dict[str, bytes]]:
        """Phases 2-3: each client gets its neighbours' keys and deals shares of its secrets.
        Returns author -> recipient -> sealed shares for U2, the clients whose shares the
        server accepted, in client order."""
        replies = r.link.exchange("keys", "share_keys", "secagg.deal",
                                  {u: Call(self._keys_message(r, u, u1)) for u in u1})
        dealt: dict[str, dict[str, bytes]] = {}
        for u in u1:
            if u not in replies:
                r.dropped[u] = ("sent no shares (offline, or its keys message was lost or "
                                "refused)")
                continue
            if replies[u].data is None:
                r.dropped[u] = "its shares were rejected or never arrived"
                continue
            try:
                dealt[u] = _parse_dealt(replies[u].data, u, r.graph[u])
            except MessageError as err:
                r.reject("share_keys", u, str(err))
                r.dropped[u] = str(err)
        return dealt

    def _masked_inputs(self, r: _Round, dealt: dict[str, dict[str, bytes]], compute: Compute,
                       weights: dict[str, float], template: Template,
                       share_variance: float) -> dict[str, np.ndarray]:
        """Phases 4-5: each client of U2 gets the ciphertexts addressed to it, opens them,
        computes its input and masks it. Returns the masked inputs the server accepted;
        ``r.routed[v]``: the authors v masks with."""
        scale = self.scales(weights)
        calls = {}
        for v in dealt:
            bundle = {u: to[v] for u, to in dealt.items() if v in to}
            r.routed[v] = set(bundle)
            calls[v] = Call(_bytes_payload(bundle), {
                "compute": compute, "template": template_json(template), "scale": scale[v],
                "share_variance": share_variance})
        replies = r.link.exchange("shares", "masked_input", "secagg.mask", calls)
        size = sum(int(np.prod(shape)) for shape, _ in template.values())
        wire = word_dtype(self.quantizer.bits)
        masked = {}
        for v in dealt:
            if v not in replies:
                r.dropped[v] = ("sent no masked input (offline, or its shares were lost or "
                                "refused)")
                continue
            if replies[v].data is None:
                r.dropped[v] = silence(replies[v], v, "its masked input was rejected or never "
                                       "arrived")
                continue
            try:
                masked[v] = _parse_masked(replies[v].data, v, size, wire)
            except MessageError as err:
                r.reject("masked_input", v, str(err))
                r.dropped[v] = str(err)
        return masked

    def _consistency(self, r: _Round, u3: list[str]) -> dict[str, Confirmation]:
        """Phases consistency and consistency_sign (malicious-server variant): each survivor
        signs the survivor set U3 with what it saw. Returns survivor -> signature, relayed
        unverified: each client checks them against its own view."""
        announcement = _json_payload({"survivors": u3})
        replies = r.link.exchange("consistency", "consistency_sign", "secagg.sign",
                                  {v: Call(announcement) for v in u3})
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

    def _request(self, r: _Round, v: str, u3: list[str], gone: list[str],
                 confirmations: dict[str, Confirmation]) -> bytes:
        """Phase 6's message to v, among the clients v masked with and v itself: the
        survivors, the dropped, and (malicious-server variant) each survivor's consistency
        signature (what v checks, and the audit after)."""
        group = r.routed[v] | {v}
        survivors = [u for u in u3 if u in group]
        request = {"survivors": survivors, "dropped": [u for u in gone if u in r.routed[v]]}
        if self.adversary == "malicious":
            confirmed = [u for u in survivors if u in confirmations]
            request["signatures"] = {u: confirmations[u].hex() for u in confirmed}
        return _json_payload(request)

    def _unmask(self, r: _Round, u3: list[str], gone: list[str],
                confirmations: dict[str, Confirmation]
                ) -> dict[tuple[str, str], dict[str, Share]]:
        """Phases 6-7. Returns (which, peer) -> holder -> share, from the well-formed replies."""
        revealed: dict[tuple[str, str], dict[str, Share]] = {}
        requests = [(v, self._request(r, v, u3, gone, confirmations), "") for v in u3]
        rounds = [{v: Call(data) for v, data, _ in requests}]
        rounds += [{v: Call(data, origin=origin)}  # a deviation: asked again
                   for v, data, origin in repeated_requests(r.link.deviations, r.link.round,
                                                            requests)]
        for calls in rounds:
            replies = r.link.exchange("unmask_request", "unmask", "secagg.answer", calls)
            for v, delivery in replies.items():
                if delivery.data is None:
                    continue  # still included: its input is in the sum, it sends no shares
                allowed = ({("b", u) for u in u3 if v in r.graph[u] | {u}}
                           | {("s", u) for u in gone if v in r.graph[u]})
                try:
                    shares = _parse_reply(delivery.data, v, allowed)
                except MessageError as err:
                    r.reject("unmask", v, f"{err}; all its shares were discarded")
                    continue
                for key, share in shares.items():
                    revealed.setdefault(key, {})[v] = share
        return revealed

    def _rebuild(self, r: _Round, u3: list[str], gone: list[str],
                 revealed: dict) -> tuple[dict[tuple[str, str], bytes], str]:
        """Every secret the server needs, checked, and the reason to abort ("" if none).
        Holders of shares off the polynomial, or at the wrong x, are named."""
        rebuilt, blamed, reason = {}, {}, ""
        for key in [("b", u) for u in u3] + [("s", u) for u in gone]:
            which, u = key
            secret, problem = self._rebuild_one(r, which, u, revealed.get(key, {}), blamed)
            if secret is None:
                reason = reason or problem
            rebuilt[key] = secret
        for v, problems in blamed.items():
            r.reject("unmask", v, "; ".join(problems) + ": those shares were left out")
        return rebuilt, reason

    def _rebuild_one(self, r: _Round, which: str, u: str, shares: dict[str, Share],
                     blamed: dict[str, list[str]]) -> tuple[bytes | None, str]:
        """u's secret ``which`` from its holders' shares, or None and why not."""
        (what, check), members = _SECRETS[which], r.members(u)
        t = self.shares_needed(len(members))
        usable = {}
        for v, share in shares.items():
            x = members.index(v) + 1  # where u dealt v's share
            if share.x == x:
                usable[v] = share
            else:
                blamed.setdefault(v, []).append(
                    f"its share of {u}'s {what} claims x = {share.x}, not its x = {x} ({v} "
                    f"altered it, or {u} dealt it so)")
        if len(usable) < t:
            return None, (f"only {len(usable)} shares of {u}'s {what} came back, {t} needed; "
                          "the masked sum stays masked")
        holders = sorted(usable, key=r.order.get)
        try:
            found = decode([usable[v] for v in holders], t,
                           lambda value: _matches(which, value, r.advertised[u]))
        except ProtocolError as err:
            return None, (f"the {len(holders)} shares of {u}'s {what} from "
                          f"{', '.join(holders)} do not rebuild {check} ({err}; a holder "
                          f"altered its share, or {u} dealt other shares than it committed "
                          "to); the masked sum stays masked")
        for v in holders:
            if usable[v].x in found.inconsistent:
                blamed.setdefault(v, []).append(
                    f"its share of {u}'s {what} is off the polynomial of the others ({v} "
                    f"altered it, or {u} dealt it so)")
        return found.secret.to_bytes(32, "big"), ""

    def _unmasked_sum(self, r: _Round, masked: dict[str, np.ndarray], gone: list[str],
                      rebuilt: dict[tuple[str, str], bytes], size: int) -> np.ndarray:
        """sum_u y_u minus every survivor's PRG(b_u) and every pairwise mask a survivor
        shares with a dropped client: shape ``[size]``, mod 2^bits, in the mask word type."""
        plus, minus = [], [rebuilt["b", u] for u in masked]
        for u in gone:
            mask_key = private_from_bytes(rebuilt["s", u])
            for v in r.graph[u]:
                if v in masked and u in r.routed[v]:  # v added the mask if it precedes u
                    seed = agree(mask_key, r.advertised[v]["s_pk"], _MASK)
                    (minus if r.order[v] < r.order[u] else plus).append(seed)
        return unmask_sum(list(masked.values()), self.quantizer, size, plus, minus)

    def _share_variance(self, noise: DistributedNoise | None, weights: dict[str, float],
                        size: int, n: int) -> float:
        """Each client's Skellam noise variance in levels (0 without distributed noise),
        after checking that the weights are equal (:meth:`scales`) and that the noisy sum of
        all n clients cannot wrap the modulus. Each client derives the same value from its own
        spec and noise plan (:func:`client_input`); the server's is only what they check."""
        if noise is None:
            return 0.0
        geometry = self.noise_geometry(weights, noise.sensitivity, size, noise.colluders)
        variance = geometry.share_variance(noise.multiplier)
        centre = n * (self.quantizer.levels - 1) / 2
        if centre + _NOISE_SIGMAS * math.sqrt(n * variance) >= self.quantizer.modulus / 2:
            raise ProtocolError(
                f"bits = {self.quantizer.bits} leaves no room for distributed noise of std "
                f"{math.sqrt(variance):.3g} levels per client on {n} clients; raise bits or "
                "lower levels in the secagg stage")
        return variance


def _skellam(variance: float, size: int) -> np.ndarray:
    """Integer Skellam noise Poisson(v/2) - Poisson(v/2) (variance v per coordinate) in two's
    complement (uint64: residues mod 2^64, so mod 2^bits once added), from a generator seeded
    by the OS CSPRNG: neither the server nor the run's published seed can predict it."""
    rng = np.random.default_rng(secrets.randbits(128))
    noise = rng.poisson(variance / 2, size) - rng.poisson(variance / 2, size)
    return noise.astype(np.int64).astype(np.uint64)


# -- the client's side ----------------------------------------------------------------------

def _session(step: Step) -> _ClientSession:
    """The client's session of the request's aggregation (under setup = "once", the set-up's
    session if the client masked in the request's round); refuses a request for an
    aggregation it never advertised keys for."""
    round_, kind = step.request.round, step.request.kind
    session = step.endpoint.sessions.get((round_, kind))
    if not isinstance(session, _ClientSession):
        session = epoch_session(step.endpoint.sessions, kind)
        if session is not None and session.current != round_:
            session = None
    if not isinstance(session, _ClientSession):
        raise MessageError(f"{step.client.id} advertised no keys for {kind} in round {round_}")
    return session


def _keeps_epoch(session) -> bool:
    return isinstance(session, _ClientSession) and session.stage.setup == "once"


def epoch_session(sessions: dict, kind: str) -> _ClientSession | None:
    """The client's latest setup = "once" session of ``kind``, if any."""
    found = [s for (_, k), s in sessions.items() if k == kind and _keeps_epoch(s)]
    return max(found, key=lambda s: s.round, default=None)


def _order(registry: Registry) -> dict[str, int]:
    """Client id -> position in the federation, as the client's pinned registry lists them."""
    return {cid: i for i, cid in enumerate(c for c in registry.sign if c != SERVER)}


@client_action("secagg.advertise")
def _client_advertise(step: Step) -> bytes:
    """Phase 1: fresh keys for this aggregation, under the client's own spec."""
    stage = step.endpoint.protocol.aggregator(step.request.kind)
    if not isinstance(stage, SecAggStage):
        raise ProtocolError(f"{step.client.id}'s protocol does not aggregate "
                            f"{step.request.kind!r} with secagg")
    sessions = step.endpoint.sessions
    for key in [k for k, s in sessions.items() if k[0] < step.request.round and (
            k[1] == step.request.kind or not _keeps_epoch(s))]:
        del sessions[key]  # an older aggregation's: a request for it is refused from now on
    return step.session(lambda: _new_session(step, stage)).advertisement()


def _new_session(step: Step, stage: SecAggStage) -> _ClientSession:
    """Fresh keys for the request's aggregation; under the malicious variant they come with
    the proof that the client's identity signed them: the next round of its batch of
    ``stage.key_batch`` rounds of this kind (one round under setup = "once"), a new batch when
    the last one is spent."""
    round_, kind = step.request.round, step.request.kind
    registry = step.endpoint.registry
    if stage.adversary != "malicious":
        return _ClientSession(step.client, registry, stage, round_, kind)
    batches = step.endpoint.lasting
    batch = batches.get((KeyBatch.tag, kind))
    taken = None if batch is None else batch.take(round_)
    if taken is None:
        size = stage.key_batch if stage.setup == "per-round" else 1
        batch = batches[(KeyBatch.tag, kind)] = KeyBatch.new(step.client, kind, round_, size,
                                                             stage.advertised)
        taken = batch.take(round_)
    channel, mask, seed, proof = taken
    return _ClientSession(step.client, registry, stage, round_, kind, channel, mask, seed,
                          proof=proof)


def _load_session(endpoint, kind: str, table: dict) -> _ClientSession:
    stage = endpoint.protocol.aggregator(kind)
    return _ClientSession.from_json(endpoint.client, endpoint.registry, stage, table)


SESSIONS[_ClientSession.tag] = _load_session
SESSIONS[KeyBatch.tag] = lambda endpoint, kind, table: KeyBatch.from_json(table)


def taken_keys(step: Step) -> _ClientSession | None:
    """The client's session with its neighbours' keys taken from the server's ``keys``
    message (both set-ups), or None when it refused the message (a signed refusal)."""
    try:
        session = _session(step)
        session.take_keys(step.data, _order(step.endpoint.registry))
    except MessageError as err:
        step.reject(SERVER, f"{step.client.id} refused the keys message: {err}")
        return None
    return session


@client_action("secagg.deal")
def _client_deal(step: Step) -> bytes | None:
    """Phases 2-3: take the neighbours' keys, deal shares of this client's secrets."""
    u = step.client.id
    session = taken_keys(step)
    if session is None:
        return None
    order = _order(step.endpoint.registry)
    members = sorted([u, *session.peers], key=order.get)  # u's view of S(u)
    return session.deal(members, session.stage.shares_needed(len(members)),
                        lambda a, b: _context(step.request.round, step.request.kind, a, b))


@client_action("secagg.mask")
def _client_mask(step: Step) -> bytes | None:
    """Phases 4-5: open the routed shares, compute the input, quantize and mask it."""
    u = step.client.id
    context = partial(_context, step.request.round, step.request.kind)
    try:
        session = _session(step)
        failed = session.take_shares(step.data, context)
    except MessageError as err:
        step.reject(SERVER, f"{u} refused the shares message: {err}")
        return None
    for author, why in failed.items():
        step.reject(author, f"{u} cannot use {author}'s shares ({why}); it holds none of them "
                    f"and still masks with {author}")
    quantizer = session.stage.quantizer
    computed = client_input(step, session.stage)
    if computed is None:
        return None
    x, scale, noise = computed
    # quantized, noised and masked chunk by chunk straight into its payload
    data, clipped = masked_payload(x, quantizer, step.client.protocol_rng, scale,
                                   *session.mask_seeds(), noise)
    report_clipped(step, clipped, x.size, quantizer)
    return data


def client_input(step: Step, stage: SecAggStage
                 ) -> tuple[np.ndarray, float, np.ndarray | None] | None:
    """The client's update for a masked input: its 1-D float vector, the scale it multiplies
    it by and its share of distributed noise (integers in the mask word type, or None without
    distributed noise); None after a signed refusal: of the server's scale or share variance
    (:func:`own_parameters`), or of an update that does not fit the template (withheld)."""
    u = step.client.id
    template = template_of(step.args["template"])
    try:
        scale, variance = own_parameters(step, stage, sum(
            int(np.prod(shape)) for shape, _ in template.values()))
    except MessageError as err:
        step.reject(SERVER, f"{u} refused the mask request: {err}", phase="masked_input")
        return None
    payload = step.compute()
    try:
        check_payload(u, payload, {name: _shaped(shape, dtype)
                                   for name, (shape, dtype) in template.items()})
    except MessageError as err:
        step.reject(u, f"withheld its update: {err}", phase="masked_input")
        return None
    x = as_vector(payload, template)
    if not variance:
        return x, scale, None
    # two's complement integers: wrap to residues
    return x, scale, _skellam(variance, x.size).astype(word_dtype(stage.quantizer.bits))


def _distributed(step: Step) -> bool:
    """Whether the client's own protocol adds distributed noise to the request's kind."""
    own = step.endpoint.protocol.dp_for(step.request.kind)
    return own is not None and own.noise == "distributed"


def own_parameters(step: Step, stage: SecAggStage, size: int) -> tuple[float, float]:
    """(scale, share variance in levels) for the request's input of ``size`` coordinates,
    from the client's own spec: the server's ``scale`` and ``share_variance`` are only
    checked. The scale is its own weight, 1 (:func:`check_scale`). Without distributed noise
    the variance must be 0; under it, the one the client derives itself: its own noise plan
    (tau, sensitivity, colluders) and its own stage over the federation it pinned, at equal
    weights. Raises MessageError naming what differs."""
    kind, asked = step.request.kind, step.args["share_variance"]
    check_scale(step.args.get("scale"))
    if not _distributed(step):
        if asked:
            raise MessageError(f"share_variance = {asked!r}, but its own protocol adds no "
                               f"distributed noise to {kind}")
        return 1.0, 0.0
    clients = list(_order(step.endpoint.registry))
    try:
        noise = step.endpoint.own_noise(kind, clients)
        variance = stage._share_variance(noise, dict.fromkeys(clients, 1.0), size, len(clients))
    except (ConfigError, ProtocolError) as err:  # its own settings admit no noise share here
        raise MessageError(f"it cannot size its own noise share: {err}") from None
    if (isinstance(asked, bool) or not isinstance(asked, (int, float))
            or not math.isclose(asked, variance, rel_tol=1e-9)):
        raise MessageError(f"share_variance = {asked!r} levels^2, not the {variance:.6g} it "
                           "derives from its own spec and noise plan")
    return 1.0, variance


def check_scale(asked: object) -> None:
    """A client's check of the server's ``scale`` for its input: under secure aggregation
    (every secagg variant, ckks) each client weighs its own input 1, so the server obtains the
    equally weighted sum; any other value is refused (MessageError), since a server that chose
    the scales could send 0 to all clients but one and read that one's input as the "sum"."""
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked != 1:
        raise MessageError(f"scale = {asked!r}: under secure aggregation it weighs its own "
                           "input 1 (a server choosing the weights could weigh out all other "
                           "clients and read its input alone), so it takes no scale but 1")


def report_clipped(step: Step, clipped: int, size: int, quantizer: Quantizer) -> None:
    """A signed ``clipped`` event when the quantizer clipped coordinates of the input, except
    under distributed noise: there the count is of the update before its noise share, a
    function of the client's data that no mechanism accounts for, so it is not released."""
    if clipped and not _distributed(step):
        step.event("masked_input", "clipped", step.client.id,
                   f"{clipped} of {size} coordinates of its scaled update lay outside "
                   f"[-{quantizer.clip:g}, {quantizer.clip:g}] and were clipped")


@client_action("secagg.sign")
def _client_sign(step: Step) -> bytes | None:
    """Consistency round: sign the announced survivor set with what this client saw."""
    try:
        return _session(step).sign_survivors(step.data)
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}")
        return None


@client_action("secagg.answer")
def _client_answer(step: Step) -> bytes | None:
    """Phase 7: the shares the unmask request may have, once (see _ClientSession.answer)."""
    try:
        return _session(step).answer(step.data)
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}", phase="unmask")
        return None
