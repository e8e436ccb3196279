"""Secure aggregation with fresh keys in every aggregation (``setup = "per-round"``), with
dropout recovery: Bonawitz et al. (CCS 2017), with the SecAgg+
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
   every survivor among them. With step 4's rule (Bonawitz et al.'s "|U2| >= t"), a server
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
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...errors import MessageError, ProtocolError
from ...federation.channel import Aggregate, Compute, Template
from ...federation.crypto import agree, private_from_bytes
from ...federation.crypto import public_bytes as public_of
from ...federation.message import SERVER
from ...privacy.settings import DistributedNoise
from ..adversary import repeated_requests
from ..aggregation import template_json, unflatten
from ..key_batch import commit
from ..link import Ask, Link
from ..masking import masked_payload, parse_masked, unmask_sum
from ..prg import word_dtype
from ..shamir import Share, decode, share_from_bytes
from ..step import Handler, Step
from ..wire import bytes_payload as _bytes_payload
from ..wire import json_payload as _json_payload
from ..wire import payload_bytes as _payload_bytes
from .client import client_input, client_order, report_clipped, session_of, taken_keys
from .common import MASK_LABEL, SEALED_BYTES, Confirmation, share_context
from .params import SecAggParams
from .server import Round, advertise, choose_graph, consistency, keys_message, masked_inputs

__all__ = ["CLIENT_ACTIONS", "aggregate"]

# Each secret the server rebuilds: how reasons name it, and what the rebuilt value must match.
_SECRETS = {"b": ("b (self-mask seed)", "the seed it committed to"),
            "s": ("s (mask key, dropped)", "the key of its advertised s_pk")}


# -- the server's side --------------------------------------------------------------------------

def aggregate(stage: SecAggParams, link: Link, compute: Compute, weights: dict[str, float],
              template: Template, noise: DistributedNoise | None) -> Aggregate:
    """One aggregation of ``stage`` (``setup = "per-round"``) over ``link``'s clients, at
    equal ``weights``. ``noise``: each client's share of distributed DP noise, or None."""
    ids = [c.id for c in link.clients]
    size = sum(int(np.prod(shape)) for shape, _ in template.values())
    share_variance = stage.share_variance(noise, weights, size, len(ids))
    r = Round(link, {c: i for i, c in enumerate(ids)})
    needed = stage.shares_needed(stage.group_size(len(ids)))

    def abort(reason: str) -> Aggregate:
        return Aggregate(None, [], r.dropped, reason, list(r.routed))

    u1 = advertise(stage, r, ids)
    if len(u1) < needed:
        return abort(f"only {len(u1)} clients advertised keys, threshold is {needed}")
    choose_graph(stage, r, u1)
    dealt = _share_keys(stage, r, u1)
    u2 = list(dealt)
    if len(u2) < needed:
        return abort(f"only {len(u2)} clients shared keys, threshold is {needed}")
    masked = _masked_inputs(stage, r, dealt, compute, weights, template, share_variance)
    u3 = [u for u in u2 if u in masked]
    if len(u3) < needed:
        return abort(f"only {len(u3)} masked inputs arrived, threshold is {needed}")
    gone = [u for u in u2 if u not in masked]
    confirmations = consistency(r, u3) if stage.adversary == "malicious" else {}
    revealed = _unmask(stage, r, u3, gone, confirmations)
    rebuilt, reason = _rebuild(stage, r, u3, gone, revealed)
    if reason:
        return abort(reason)
    total = _unmasked_sum(stage, r, masked, gone, rebuilt, size)
    try:
        summed = stage.quantizer.dequantize_sum(total, len(u3), noisy=bool(share_variance))
    except ProtocolError as err:
        return abort(f"the unmasked sum is unusable ({err}): a survivor masked its input "
                     "wrongly or sent one outside the quantizer's range")
    scale = stage.scales(weights)
    mean = summed / sum(scale[u] for u in u3)
    return Aggregate(unflatten(mean, template), u3, r.dropped, asked=list(r.routed))


def _share_keys(stage: SecAggParams, r: Round, u1: list[str]) -> dict[str, dict[str, bytes]]:
    """Phases 2-3: each client gets its neighbours' keys and deals shares of its secrets.
    Returns author -> recipient -> sealed shares for U2, the clients whose shares the
    server accepted, in client order."""
    replies = r.link.exchange("keys", "share_keys", "secagg.deal",
                              {u: Ask(keys_message(stage, r, u, u1)) for u in u1})
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


def _masked_inputs(stage: SecAggParams, r: Round, dealt: dict[str, dict[str, bytes]],
                   compute: Compute, weights: dict[str, float], template: Template,
                   share_variance: float) -> dict[str, np.ndarray]:
    """Phases 4-5: each client of U2 gets the ciphertexts addressed to it, opens them,
    computes its input and masks it. Returns the masked inputs the server accepted;
    ``r.routed[v]``: the authors v masks with."""
    scale = stage.scales(weights)
    asks = {}
    for v in dealt:
        bundle = {u: to[v] for u, to in dealt.items() if v in to}
        r.routed[v] = set(bundle)
        asks[v] = Ask(_bytes_payload(bundle), {
            "compute": compute, "template": template_json(template), "scale": scale[v],
            "share_variance": share_variance})
    replies = r.link.exchange("shares", "masked_input", "secagg.mask", asks)
    size = sum(int(np.prod(shape)) for shape, _ in template.values())
    wire = word_dtype(stage.quantizer.bits)
    return masked_inputs(r, replies, dealt, lambda data, v: _parse_masked(data, v, size, wire),
                         "sent no masked input (offline, or its shares were lost or refused)")


def _request(stage: SecAggParams, r: Round, v: str, u3: list[str], gone: list[str],
             confirmations: dict[str, Confirmation]) -> bytes:
    """Phase 7's message to v, among the clients v masked with and v itself: the
    survivors, the dropped, and (malicious-server variant) each survivor's consistency
    signature (what v checks, and the audit after)."""
    group = r.routed[v] | {v}
    survivors = [u for u in u3 if u in group]
    request = {"survivors": survivors, "dropped": [u for u in gone if u in r.routed[v]]}
    if stage.adversary == "malicious":
        confirmed = [u for u in survivors if u in confirmations]
        request["signatures"] = {u: confirmations[u].hex() for u in confirmed}
    return _json_payload(request)


def _unmask(stage: SecAggParams, r: Round, u3: list[str], gone: list[str],
            confirmations: dict[str, Confirmation]
            ) -> dict[tuple[str, str], dict[str, Share]]:
    """Phases 7-8. Returns (which, peer) -> holder -> share, from the well-formed replies."""
    revealed: dict[tuple[str, str], dict[str, Share]] = {}
    requests = [(v, _request(stage, r, v, u3, gone, confirmations), "") for v in u3]
    rounds = [{v: Ask(data) for v, data, _ in requests}]
    rounds += [{v: Ask(data, origin=origin)}  # a deviation: asked again
               for v, data, origin in repeated_requests(r.link.deviations, r.link.round,
                                                        requests)]
    for asks in rounds:
        replies = r.link.exchange("unmask_request", "unmask", "secagg.answer", asks)
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


def _rebuild(stage: SecAggParams, r: Round, u3: list[str], gone: list[str],
             revealed: dict) -> tuple[dict[tuple[str, str], bytes], str]:
    """Every secret the server needs, checked, and the reason to abort ("" if none).
    Holders of shares off the polynomial, or at the wrong x, are named."""
    rebuilt, blamed, reason = {}, {}, ""
    for key in [("b", u) for u in u3] + [("s", u) for u in gone]:
        which, u = key
        secret, problem = _rebuild_one(stage, r, which, u, revealed.get(key, {}), blamed)
        if secret is None:
            reason = reason or problem
        rebuilt[key] = secret
    for v, problems in blamed.items():
        r.reject("unmask", v, "; ".join(problems) + ": those shares were left out")
    return rebuilt, reason


def _rebuild_one(stage: SecAggParams, r: Round, which: str, u: str, shares: dict[str, Share],
                 blamed: dict[str, list[str]]) -> tuple[bytes | None, str]:
    """u's secret ``which`` from its holders' shares, or None and why not."""
    (what, check), members = _SECRETS[which], r.members(u)
    t = stage.shares_needed(len(members))
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


def _unmasked_sum(stage: SecAggParams, r: Round, masked: dict[str, np.ndarray], gone: list[str],
                  rebuilt: dict[tuple[str, str], bytes], size: int) -> np.ndarray:
    """sum_u y_u minus every survivor's PRG(b_u) and every pairwise mask a survivor
    shares with a dropped client: shape ``[size]``, mod 2^bits, in the mask word type."""
    plus, minus = [], [rebuilt["b", u] for u in masked]
    for u in gone:
        mask_key = private_from_bytes(rebuilt["s", u])
        for v in r.graph[u]:
            if v in masked and u in r.routed[v]:  # v added the mask if it precedes u
                seed = agree(mask_key, r.advertised[v]["s_pk"], MASK_LABEL)
                (minus if r.order[v] < r.order[u] else plus).append(seed)
    return unmask_sum(list(masked.values()), stage.quantizer, size, plus, minus)


# -- wire formats: each parser raises MessageError naming the problem ---------------------------

def _matches(which: str, value: int, advertised: dict[str, bytes]) -> bool:
    """Whether ``value`` is the 32-byte secret its owner advertised: b_u hashes to its
    commitment; s_sk_u has its advertised s_pk as public key."""
    if value >= 2**256:
        return False
    secret = value.to_bytes(32, "big")
    if which == "b":
        return commit(secret) == advertised["b_commit"]
    return public_of(private_from_bytes(secret)) == advertised["s_pk"]


def _parse_dealt(data: bytes, u: str, neighbours: set[str]) -> dict[str, bytes]:
    dealt = _payload_bytes(data, u)
    if set(dealt) != neighbours:
        raise MessageError(f"{u} sent shares for {sorted(dealt)}, expected its neighbours "
                           f"{sorted(neighbours)}")
    for v, sealed in dealt.items():
        if len(sealed) != SEALED_BYTES:
            raise MessageError(f"{u}'s sealed shares for {v} are {len(sealed)} bytes, expected "
                               f"{SEALED_BYTES}")
    return dealt


def _parse_masked(data: bytes, u: str, size: int, wire: np.dtype) -> np.ndarray:
    """u's masked input, shape ``[size]``, in the mask word type ``wire`` (read in place;
    the format is :mod:`~secureffm.protocols.masking`'s)."""
    return parse_masked(data, u, size, wire)["y"]


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


# -- the client's side ------------------------------------------------------------------------

def _client_deal(step: Step) -> bytes | None:
    """Phases 2-3: take the neighbours' keys, deal shares of this client's secrets."""
    u = step.client.id
    session = taken_keys(step)
    if session is None:
        return None
    order = client_order(step.endpoint.registry)
    members = sorted([u, *session.peers], key=order.get)  # u's view of S(u)
    return session.deal(members, session.stage.shares_needed(len(members)),
                        lambda a, b: share_context(step.request.round, step.request.kind, a, b))


def _client_mask(step: Step) -> bytes | None:
    """Phases 4-5: open the routed shares, compute the input, quantize and mask it."""
    u = step.client.id
    context = partial(share_context, step.request.round, step.request.kind)
    try:
        session = session_of(step)
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


def _client_answer(step: Step) -> bytes | None:
    """Phase 8: the shares the unmask request may have, once (see ClientSession.answer)."""
    try:
        return session_of(step).answer(step.data)
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}", phase="unmask")
        return None


# The per-round variant's own client steps (:attr:`.stage.SecAggStage.client_actions`).
CLIENT_ACTIONS: dict[str, Handler] = {"secagg.deal": _client_deal, "secagg.mask": _client_mask,
                                      "secagg.answer": _client_answer}
