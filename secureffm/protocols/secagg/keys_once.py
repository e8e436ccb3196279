"""Secure aggregation with keys agreed once (``setup = "once"``): many rounds, one set-up.

Bonawitz et al.'s protocol (per_round.py) agrees fresh keys and deals shares of two secrets in
every aggregation: four message exchanges (five under the malicious-server variant) and, for
small models, a round many times a plaintext one. In the spirit of Flamingo (Ma, Woods, Angel,
Polychroniadou and Rabin, IEEE S&P 2023), this variant agrees the keys once per kind and
derives each round's masks from them and the round:

Set-up (the first aggregation of a kind, or again when fewer than t members remain):

1. ``advertise_keys``: each client u sends X25519 public keys c_pk (channel) and s_pk (mask);
   under the malicious-server variant it signs them with its long-term identity.
2. ``keys`` -> ``keys_taken``: the server sends u its neighbours' keys (and, malicious variant,
   their signatures, the graph's seed and U1 and the parameters), as in per_round.py; u checks
   them, derives per neighbour v the channel key HKDF(X25519(c_sk_u, c_pk_v)) and the pair
   secret k_uv = HKDF(X25519(s_sk_u, s_pk_v)), and answers with the neighbours it took.

Each round r, among the members of the set-up:

3. ``mask_request`` -> ``masked_input``: the server asks each member to mask with the members
   among its neighbours it asks this round (``peers``, an argument of the request; a client
   refuses fewer than t - 1, others than its neighbours, and a round it already masked in or
   before). u draws a fresh self-mask seed b_u^r from the OS CSPRNG and sends
   y_u = q_u + PRG(b_u^r) + sum_v +-PRG(k_uv^r) mod 2^bits, with k_uv^r = HMAC-SHA256(k_uv,
   round seed label || [r, kind]) (+ if u precedes v), a commitment SHA-256(label || b_u^r),
   the peers it masked with, and t-of-|S(u)| Shamir shares of b_u^r, each AES-GCM-sealed for
   its holder under their channel key, bound to (r, kind, u, holder).
4. ``consistency`` -> ``consistency_sign`` (malicious variant), server.py's consistency round:
   the server announces the survivors U3 (the members whose masked inputs it took); each
   signs, once per round, U3 with the digest of what it saw (:func:`~secureffm.protocols.
   secagg.survivor_statement`: the parameters, the set-up's graph, the broadcasts it took),
   and refuses a set that leaves itself out.
5. ``unmask_request`` -> ``unmask``: the server asks enough survivors (every survivor that
   masked with a client that dropped, then holders until each survivor's seed has t) and
   routes each the sealed shares of the survivors among its peers, in the order it lists
   them (and, malicious variant, their signatures of the survivor set). A holder answers
   once per round, under per_round.py's rules: it refuses a request naming itself dropped, a
   peer both alive and dropped, anyone it did not mask with, fewer survivors than t, and,
   malicious variant, survivors other than those of the set it signed (among its peers and
   itself) or any of them without a valid signature of that set over what the holder saw
   itself. It reveals, for each survivor, its share of b_u^r, and for each dropped peer u,
   k_uv^r (that round's pairwise seed only, never a long-term secret): of one peer, one kind
   of secret in a round.

Why the consistency round: a pair's round seed k_uv^r is known to both ends, u and v. To read
a survivor u's input a server needs t shares of b_u^r and every k_uv^r of the peers u masked
with. Without a signed survivor set (issue 37), a server alone tells u that t - 1 of its
peers dropped (u reveals its round seeds with them and its own share of b_u^r), asks those
peers honestly (they reveal their shares of b_u^r: t with u's) and tells the other peers that
u dropped (they reveal their round seeds with u): u's input, with no client refusing. With
the consistency round, a peer v that reveals a share of b_u^r was told u survived, so it
checked u's signature of the set v signed itself, which names v a survivor. u signs one set a
round and answers only to the set it signed, so it does not name v dropped, and v, answering
once, reveals no k_uv^r either: the server needs t >= 2 shares, at least one from a peer, and
that pair's mask stays on y_u. For u named dropped, its peers reveal their round seeds with
it and no holder a share of b_u^r: a masked input that arrived late stays hidden behind
b_u^r. The same statement carries the digest of the broadcasts (a server that sends one
client another model to isolate its update, Pasquini et al. CCS 2022). The semi-honest
variant has no consistency round: it trusts the server to tell every client the same
survivors, and a server that does not reads an input as above.

What a dropped client exposes: for the round it dropped in, the pairwise seeds k_uv^r of its
peers that survived. Its keys, pair secrets and every other round's masks stay secret, so it
masks again in the next round with the same set-up.

What is weaker than per-round set-up: a dropped client's masks are revealed by the peers that
masked with it, one by one, not rebuilt from any t shares, so a survivor that leaves between
its masked input and its unmask answer while one of its peers dropped aborts the round (the
next round goes on). A survivor that reveals a wrong k_uv^r corrupts the sum unnoticed (it
could as well send a wrong input); wrong seed shares are caught by the commitment. A client
that missed the set-up joins at the next one, which runs when fewer than t members remain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...errors import MessageError, ProtocolError
from ...federation.channel import Aggregate, Compute, Template
from ...federation.crypto import open_sealed, seal
from ...federation.message import SERVER
from ...privacy.settings import DistributedNoise
from ..aggregation import template_json, unflatten
from ..key_batch import commit
from ..link import Ask, Link, silence
from ..masking import masked_payload, parse_masked, unmask_sum
from ..prg import word_dtype
from ..shamir import SHARE_BYTES, Share, decode, share_from_bytes, share_to_bytes, split_bytes
from ..step import Handler, Step
from ..wire import bytes_payload as _bytes_payload
from ..wire import json_payload as _json_payload
from ..wire import payload_bytes as _payload_bytes
from ..wire import payload_json as _payload_json
from .client import (
    client_input,
    client_order,
    epoch_session,
    report_clipped,
    session_of,
    taken_keys,
)
from .common import Confirmation, share_context
from .params import SecAggParams
from .server import Round, advertise, choose_graph, consistency, keys_message, masked_inputs
from .session import ClientSession

__all__ = ["CLIENT_ACTIONS", "aggregate", "round_label", "round_seed"]

_ROUND_SEED = b"secureffm/secagg/round-seed/v1"
_SEALED_SHARE = 12 + SHARE_BYTES + 16  # nonce, one share, GCM tag
_EPOCHS = "secagg-epochs"  # the server's memory: kind -> its current set-up


def round_label(round_: int, kind: str) -> bytes:
    """What a pair's round seed is derived for: the label, the round and the kind."""
    return _ROUND_SEED + json.dumps([round_, kind]).encode()


def round_seed(pair_secret: bytes, label: bytes) -> bytes:
    """k_uv^r: the 32-byte mask seed of a pair for one :func:`round_label`, HMAC-SHA256 keyed
    by their pair secret (a PRF: one round's seed says nothing of another's)."""
    return hmac.new(pair_secret, label, hashlib.sha256).digest()


# -- the server's side --------------------------------------------------------------------------

@dataclass
class _Epoch:
    """One set-up as the server keeps it: its round, the members that took their keys (in
    federation order), the neighbour graph over U1 (the clients that advertised keys, as each
    client was told it) and the client order."""

    round: int
    members: list[str]
    graph: dict[str, set[str]]
    order: dict[str, int]

    def group(self, u: str) -> list[str]:
        """S(u): u and its neighbours in U1 in client order; the holder at index i has x = i + 1
        (u deals t of |S(u)| shares of each round's seed, to the peers it masks with)."""
        return sorted(self.graph[u] | {u}, key=self.order.get)

    def peers(self, u: str) -> set[str]:
        """u's neighbours that are members: whom it masks with when all are asked."""
        return self.graph[u] & set(self.members)


@dataclass
class _RoundState:
    """What the server learns in one round of an epoch."""

    epoch: _Epoch
    link: Link
    dropped: dict[str, str] = field(default_factory=dict)
    peers: dict[str, list[str]] = field(default_factory=dict)  # whom each asked member masks with
    masked: dict[str, np.ndarray] = field(default_factory=dict)
    commits: dict[str, bytes] = field(default_factory=dict)
    sealed: dict[str, dict[str, bytes]] = field(default_factory=dict)  # author -> holder -> share

    def reject(self, phase: str, party: str, reason: str) -> None:
        self.link.reject(phase, party, reason)


def aggregate(stage: SecAggParams, link: Link, compute: Compute,
                   weights: dict[str, float], template: Template,
                   noise: DistributedNoise | None) -> Aggregate:
    """One round of ``stage`` (``setup = "once"``) over ``link``'s clients, setting up first
    when the kind has no set-up with at least t members."""
    ids = [c.id for c in link.clients]
    size = sum(int(np.prod(shape)) for shape, _ in template.values())
    share_variance = stage.share_variance(noise, weights, size, len(ids))
    needed = stage.shares_needed(stage.group_size(len(ids)))
    epochs = link.parties[SERVER].memory.setdefault(_EPOCHS, {})
    dropped: dict[str, str] = {}

    def abort(reason: str, asked: list[str], set_up_again: bool = False) -> Aggregate:
        if set_up_again:  # too few members answer: the next aggregation sets up afresh
            epochs.pop(link.kind, None)
        return Aggregate(None, [], dropped, reason, asked)

    epoch = epochs.get(link.kind)
    if epoch is None or len(epoch.members) < needed:
        epoch = _set_up(stage, link, ids, dropped)
        if len(epoch.members) < needed:
            return abort(f"only {len(epoch.members)} clients took their keys, threshold is "
                         f"{needed}", [], set_up_again=True)
        epochs[link.kind] = epoch
    for u in ids:
        if u not in epoch.members and u not in dropped:
            dropped[u] = (f"not a member of the {link.kind} key set-up of round {epoch.round} "
                          "(it joins at the next set-up)")
    r = _RoundState(epoch, link, dropped)
    _masked_inputs(stage, r, compute, weights, template, share_variance)
    asked = list(r.peers)
    u3 = [u for u in asked if u in r.masked]
    if len(u3) < needed:
        return abort(f"only {len(u3)} masked inputs arrived, threshold is {needed}", asked,
                     set_up_again=True)
    gone = [u for u in asked if u not in r.masked]
    # malicious variant: every survivor signs the survivor set (server.py's consistency round)
    confirmations = (consistency(Round(link, epoch.order, dropped), u3)
                     if stage.adversary == "malicious" else {})
    seeds, pair_seeds, reason = _unmask(stage, r, u3, gone, confirmations)
    if reason:
        return abort(reason, asked)
    plus, minus = [], [seeds[u] for u in u3]
    for (v, u), seed in pair_seeds.items():  # v added PRG(k_uv^r) if it precedes u
        (minus if epoch.order[v] < epoch.order[u] else plus).append(seed)
    total = unmask_sum([r.masked[u] for u in u3], stage.quantizer, size, plus, minus)
    try:
        summed = stage.quantizer.dequantize_sum(total, len(u3), noisy=bool(share_variance))
    except ProtocolError as err:
        return abort(f"the unmasked sum is unusable ({err}): a survivor masked its input "
                     "wrongly, revealed a wrong round seed or sent an input outside the "
                     "quantizer's range", asked)
    scale = stage.scales(weights)
    mean = summed / sum(scale[u] for u in u3)
    return Aggregate(unflatten(mean, template), u3, dropped, asked=asked)


def _set_up(stage: SecAggParams, link: Link, ids: list[str], dropped: dict[str, str]) -> _Epoch:
    """Phases advertise_keys, keys and keys_taken: the members are the clients that took
    their neighbours' keys (fewer than t: the caller aborts)."""
    r = Round(link, {c: i for i, c in enumerate(ids)}, dropped)
    u1 = advertise(stage, r, ids)
    epoch = _Epoch(link.round, [], {}, r.order)
    if len(u1) < 2:
        return epoch
    choose_graph(stage, r, u1)
    replies = link.exchange("keys", "keys_taken", "secagg.epoch.keys",
                            {u: Ask(keys_message(stage, r, u, u1)) for u in u1})
    for u in u1:
        if u not in replies or replies[u].data is None:
            dropped[u] = silence(replies[u], u, "took no keys") if u in replies else (
                "took no keys (offline, or its keys message was lost)")
            continue
        try:
            taken = _payload_bytes(replies[u].data, u)
            if sorted(taken) != ["json"] or json.loads(taken["json"]) != sorted(
                    r.graph[u], key=r.order.get):
                raise MessageError(f"{u}'s keys_taken names other neighbours than its "
                                   f"{sorted(r.graph[u])}")
        except (MessageError, ValueError) as err:
            r.reject("keys_taken", u, str(err))
            dropped[u] = str(err)
            continue
        epoch.members.append(u)
    epoch.graph = r.graph
    return epoch


def _masked_inputs(stage: SecAggParams, r: _RoundState, compute: Compute,
                   weights: dict[str, float], template: Template,
                   share_variance: float) -> None:
    """Phases mask_request and masked_input: every member is asked to mask with its member
    neighbours; fills ``r.peers``, ``r.masked``, ``r.commits`` and ``r.sealed``."""
    epoch, scale = r.epoch, stage.scales(weights)
    asks = {}
    for v in epoch.members:
        r.peers[v] = sorted(epoch.peers(v), key=epoch.order.get)
        asks[v] = Ask(None, {
            "compute": compute, "template": template_json(template), "scale": scale[v],
            "share_variance": share_variance, "epoch": epoch.round, "peers": r.peers[v]})
    replies = r.link.exchange("mask_request", "masked_input", "secagg.epoch.mask", asks)
    size = sum(int(np.prod(shape)) for shape, _ in template.values())
    wire = word_dtype(stage.quantizer.bits)
    parsed = masked_inputs(r, replies, epoch.members,
                           lambda data, v: _parse_masked(data, v, size, wire, r.peers[v]),
                           "sent no masked input (offline)")
    for v, (y, b_commit, sealed) in parsed.items():
        r.masked[v], r.commits[v], r.sealed[v] = y, b_commit, sealed


def _parse_masked(data: bytes, v: str, size: int, wire: np.dtype, peers: list[str]
                  ) -> tuple[np.ndarray, bytes, dict[str, bytes]]:
    """v's masked input: ``y`` (shape ``[size]``, words ``wire``), ``b_commit`` (32 bytes),
    ``peers`` (the JSON list of whom it masked with: exactly the ``peers`` it was asked, in
    that order) and ``shares`` (its sealed seed shares for them, in that order,
    concatenated). Returns y, the commitment and holder -> sealed share."""
    listed = json.dumps(peers).encode()
    lengths = {"b_commit": 32, "peers": len(listed), "shares": len(peers) * _SEALED_SHARE}
    got = parse_masked(data, v, size, wire, lengths)
    for name in ("b_commit", "shares"):
        if got[name].size != lengths[name]:
            raise MessageError(f"{v}'s {name} is {got[name].size} bytes, expected "
                               f"{lengths[name]}")
    if got["peers"].tobytes() != listed:
        try:
            said = json.loads(got["peers"].tobytes())
        except ValueError:
            said = None
        if said != peers:
            raise MessageError(f"{v} says it masked with {said!r}, not the peers it was asked "
                               f"({peers})")
    blob = got["shares"].tobytes()
    sealed = {w: blob[i * _SEALED_SHARE:(i + 1) * _SEALED_SHARE] for i, w in enumerate(peers)}
    return got["y"], got["b_commit"].tobytes(), sealed


def _unmask_holders(stage: SecAggParams, r: _RoundState, u3: list[str], gone: list[str],
                    asked: set[str]) -> list[str]:
    """Survivors to ask next: every survivor that masked with a dropped client (only it can
    reveal that pair's seed), then holders in client order until each survivor's seed has t
    asked holders (all of them if ``asked`` already holds some: a second try)."""
    if asked:
        return [v for v in u3 if v not in asked]
    survivors, lost = set(u3), set(gone)
    picked = {v for v in u3 if set(r.peers[v]) & lost}
    for u in u3:
        holders = [v for v in r.epoch.group(u) if v in survivors and (v == u or v in r.peers[u])]
        t = stage.shares_needed(len(r.epoch.group(u)))
        for v in holders:
            if len(picked.intersection(holders)) >= t:
                break
            picked.add(v)
    return sorted(picked, key=r.epoch.order.get)


def _request(stage: SecAggParams, r: _RoundState, v: str, u3: list[str], gone: list[str],
             confirmations: dict[str, Confirmation]) -> bytes:
    """The unmask request to v: ``json``, among the clients v masked with and v itself, the
    survivors, the dropped and (malicious variant) the survivors' signatures of the survivor
    set (what v checks, and the audit after); ``shares``, the sealed seed shares for v of
    the other survivors, in the order the survivors are listed."""
    group = set(r.peers[v]) | {v}
    survivors = [u for u in u3 if u in group]
    request = {"survivors": survivors, "dropped": [u for u in gone if u in group]}
    if stage.adversary == "malicious":
        request["signatures"] = {u: confirmations[u].hex() for u in survivors
                                 if u in confirmations}
    return _bytes_payload({"json": json.dumps(request, sort_keys=True).encode(),
                           "shares": b"".join(r.sealed[u][v] for u in survivors if u != v)})


def _unmask(stage: SecAggParams, r: _RoundState, u3: list[str], gone: list[str],
            confirmations: dict[str, Confirmation]
            ) -> tuple[dict[str, bytes], dict[tuple[str, str], bytes], str]:
    """Phases unmask_request and unmask: (survivor -> its seed b_u^r, (survivor v, dropped u)
    -> k_uv^r, the reason to abort or "")."""
    shares: dict[str, dict[str, Share]] = {u: {} for u in u3}
    pair_seeds: dict[tuple[str, str], bytes] = {}
    asked: set[str] = set()
    seeds: dict[str, bytes] = {}
    for _ in range(2):  # a second exchange asks the survivors not asked yet
        asks = {v: Ask(_request(stage, r, v, u3, gone, confirmations))
                 for v in _unmask_holders(stage, r, u3, gone, asked)}
        if not asks:
            break
        asked |= set(asks)
        replies = r.link.exchange("unmask_request", "unmask", "secagg.epoch.answer", asks)
        for v, delivery in replies.items():
            if delivery.data is not None:
                _take_answer(r, v, delivery.data, u3, gone, shares, pair_seeds)
        seeds, reason = _rebuild_seeds(stage, r, u3, shares)
        if not reason:
            break
    if reason:
        return {}, {}, reason
    missing = [(v, u) for v in u3 for u in gone if u in r.peers[v] and (v, u) not in pair_seeds]
    if missing:
        v, u = missing[0]
        return {}, {}, (f"{v} masked with {u}, which dropped, and revealed no round seed of "
                        "that pair; the masked sum stays masked")
    return seeds, pair_seeds, ""


def _take_answer(r: _RoundState, v: str, data: bytes, u3: list[str], gone: list[str],
                 shares: dict[str, dict[str, Share]],
                 pair_seeds: dict[tuple[str, str], bytes]) -> None:
    """v's unmask reply, the JSON {"b": {survivor: share hex}, "k": {dropped: seed hex}}:
    shares of the seeds of survivors among itself and its peers, this round's seeds of its
    dropped peers; a malformed reply is discarded whole."""
    mine = set(r.peers[v]) | {v}
    try:
        reply = _payload_json(data, v)
        if not isinstance(reply, dict) or sorted(reply) != ["b", "k"] or not all(
                isinstance(reply[w], dict) for w in "bk"):
            raise MessageError(f"{v}'s unmask reply is not a table of b and k")
        strangers = sorted(set(reply["b"]) - (set(u3) & mine) | set(reply["k"]) - (
            set(gone) & mine))
        if strangers:
            raise MessageError(f"{v}'s unmask reply names {strangers[0]}; it may reveal seed "
                               "shares of survivors and round seeds of dropped clients among "
                               "those it masked with")
        found = {u: share_from_bytes(bytes.fromhex(h)) for u, h in reply["b"].items()}
        seeds = {u: bytes.fromhex(h) for u, h in reply["k"].items()}
        if any(len(seed) != 32 for seed in seeds.values()):
            raise MessageError(f"{v}'s unmask reply has a round seed that is not 32 bytes")
    except (MessageError, ProtocolError, TypeError, ValueError) as err:
        r.reject("unmask", v, f"{err}; all its shares were discarded")
        return
    for u, share in found.items():
        shares[u][v] = share
    for u, seed in seeds.items():
        pair_seeds[v, u] = seed


def _rebuild_seeds(stage: SecAggParams, r: _RoundState, u3: list[str],
                   shares: dict[str, dict[str, Share]]) -> tuple[dict[str, bytes], str]:
    """Each survivor's seed b_u^r from its holders' shares, checked against its commitment;
    holders of shares at the wrong x or off the polynomial are named."""
    seeds, reason = {}, ""
    for u in u3:
        group = r.epoch.group(u)
        t = stage.shares_needed(len(group))
        usable = {}
        for v, share in list(shares[u].items()):
            if share.x == group.index(v) + 1:
                usable[v] = share
            else:
                del shares[u][v]
                r.reject("unmask", v, f"its share of {u}'s round seed claims x = {share.x}, "
                         f"not its x = {group.index(v) + 1}: it was left out")
        if len(usable) < t:
            reason = reason or (f"only {len(usable)} shares of {u}'s round seed came back, {t} "
                                "needed; the masked sum stays masked")
            continue
        holders = sorted(usable, key=r.epoch.order.get)
        try:
            found = decode([usable[v] for v in holders], t,
                           partial(_committed, commitment=r.commits[u]))
        except ProtocolError as err:
            reason = reason or (f"the shares of {u}'s round seed from {', '.join(holders)} do "
                                f"not rebuild the seed it committed to ({err}); the masked sum "
                                "stays masked")
            continue
        for v in holders:
            if usable[v].x in found.inconsistent:
                del shares[u][v]
                r.reject("unmask", v, f"its share of {u}'s round seed is off the polynomial "
                         "of the others: it was left out")
        seeds[u] = found.secret.to_bytes(32, "big")
    return seeds, reason


def _committed(value: int, commitment: bytes) -> bool:
    """Whether the rebuilt ``value`` is the 32-byte seed whose commitment is ``commitment``."""
    return value < 2**256 and commit(value.to_bytes(32, "big")) == commitment


# -- the client's side --------------------------------------------------------------------------

def _client_keys(step: Step) -> bytes | None:
    """Set-up: take the neighbours' keys (checked as per_round.py's ``keys`` message is) and
    derive the channel keys and pair secrets; answer with the neighbours taken."""
    session = taken_keys(step)
    if session is None:
        return None
    order = client_order(step.endpoint.registry)
    return _bytes_payload({"json": json.dumps(sorted(session.peers, key=order.get)).encode()})


def _epoch_of(step: Step) -> ClientSession:
    """The set-up session the mask request names, checked: one this client took keys in,
    for a round after any it masked in."""
    round_, kind = step.request.round, step.request.kind
    session = epoch_session(step.endpoint.sessions, kind)
    epoch = step.args.get("epoch")
    if session is None or session.round != epoch or not session.peers:
        raise MessageError(f"the mask request names the {kind} set-up of round {epoch!r}, in "
                           "which this client took no keys")
    if round_ <= (session.current if session.current is not None else session.round - 1):
        raise MessageError(f"asked to mask in round {round_}, but it already masked in round "
                           f"{session.current} of this set-up (a second mask of one round "
                           "would let the server subtract the two)")
    return session


def _checked_peers(session: ClientSession, peers) -> list[str]:
    needed = session.stage.shares_needed(len(session.peers) + 1)
    if (not isinstance(peers, list) or not all(isinstance(v, str) for v in peers)
            or len(set(peers)) != len(peers)):
        raise MessageError("the mask request's peers are not a list of distinct client ids")
    strangers = sorted(set(peers) - set(session.peers))
    if strangers:
        raise MessageError(f"the mask request names {strangers[0]}, not a neighbour")
    if len(peers) + 1 < needed:
        raise MessageError(f"the mask request names {len(peers)} peers; with itself that is "
                           f"fewer than the threshold {needed}, and a client masking with so "
                           "few peers could be unmasked by naming them dropped")
    return peers


def _client_mask(step: Step) -> bytes | None:
    """One round: compute the input, quantize it, mask it with a fresh seed and this round's
    pair seeds, and deal sealed shares of the seed to the peers."""
    u, round_, kind = step.client.id, step.request.round, step.request.kind
    try:
        session = _epoch_of(step)
        peers = _checked_peers(session, step.args.get("peers"))
    except MessageError as err:
        step.reject(SERVER, f"{u} refused the mask request: {err}", phase="masked_input")
        return None
    quantizer = session.stage.quantizer
    computed = client_input(step, session.stage)
    if computed is None:
        return None
    x, scale, noise = computed
    seed = secrets.token_bytes(32)
    order = client_order(step.endpoint.registry)
    group = sorted([u, *session.peers], key=order.get)
    shares = dict(zip(group, split_bytes(seed, session.stage.shares_needed(len(group)),
                                         len(group)), strict=True))
    session.current, session.own = round_, shares[u]
    session.masks_with, session.signed, session.answered = tuple(peers), None, False
    label = round_label(round_, kind)
    pairs = {v: round_seed(session.peers[v].pair_seed, label) for v in peers}
    sealed = b"".join(seal(session.peers[v].channel, share_to_bytes(shares[v]),
                           share_context(round_, kind, u, v), secrets.token_bytes(12))
                      for v in peers)
    extra = {"b_commit": commit(seed), "peers": json.dumps(peers).encode(), "shares": sealed}
    # quantized, noised and masked chunk by chunk straight into its payload
    data, clipped = masked_payload(
        x, quantizer, step.client.protocol_rng, scale,
        [seed] + [pairs[v] for v in peers if session.peers[v].first],
        [pairs[v] for v in peers if not session.peers[v].first], noise, extra)
    report_clipped(step, clipped, x.size, quantizer)
    return data


def _client_answer(step: Step) -> bytes | None:
    """Unmasking: once per round, under per_round.py's request rules (malicious variant: only
    the survivors of the set it signed, each survivor's signature of that set checked);
    reveals, per peer, its share of the seed of a survivor or this round's pair seed of a
    dropped peer, never both."""
    u, round_, kind = step.client.id, step.request.round, step.request.kind
    try:
        session = session_of(step)
        fields = _payload_bytes(step.data, SERVER)
        if sorted(fields) != ["json", "shares"]:
            raise MessageError(f"the unmask request has fields {sorted(fields)}, expected json "
                               "and shares")
        survivors, gone = session.admit(_bytes_payload({"json": fields["json"]}))
        listed = json.loads(fields["json"])["survivors"]  # admitted: a list of ids
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}", phase="unmask")
        return None
    authors = [w for w in listed if w != u]
    blob = fields["shares"]
    if len(blob) != len(authors) * _SEALED_SHARE:
        step.reject(SERVER, f"refused: the unmask request carries {len(blob)} bytes of seed "
                    f"shares for {len(authors)} survivors", phase="unmask")
        return None
    b = {u: share_to_bytes(session.own).hex()} if u in survivors else {}
    for i, author in enumerate(authors):
        try:
            b[author] = open_sealed(session.peers[author].channel,
                                    blob[i * _SEALED_SHARE:(i + 1) * _SEALED_SHARE],
                                    share_context(round_, kind, author, u)).hex()
        except ProtocolError as err:
            step.reject(author, f"{u} cannot open {author}'s round seed share ({err})",
                        phase="unmask")
    label = round_label(round_, kind)
    k = {v: round_seed(session.peers[v].pair_seed, label).hex() for v in sorted(gone)}
    return _json_payload({"b": b, "k": k})


# The keys-once variant's own client steps (:attr:`.stage.SecAggStage.client_actions`).
CLIENT_ACTIONS: dict[str, Handler] = {"secagg.epoch.keys": _client_keys,
                                      "secagg.epoch.mask": _client_mask,
                                      "secagg.epoch.answer": _client_answer}
