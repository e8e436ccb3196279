"""Secure aggregation with dropout recovery: Bonawitz et al. (CCS 2017), with the SecAgg+
neighbour graph of Bell et al. (CCS 2020). The server learns only the weighted sum of the
updates of the clients that survive a round, or, below the threshold, nothing.

One aggregation (a fresh session, fresh keys) runs these phases:

1. ``advertise_keys``: each client u sends X25519 public keys c_pk (channel) and s_pk (mask).
2. ``keys``: the server picks each client's neighbours N(u) (all others, or a random
   ``neighbours``-regular graph) and sends u their public keys.
3. ``share_keys``: u Shamir-shares its mask secret key s_sk and a fresh self-mask seed b_u among
   S(u) = N(u) + {u}, t of |S(u)|; the share for v travels AES-GCM-encrypted under
   HKDF(X25519(c_sk_u, c_pk_v)), relayed by the server, which cannot read it.
4. ``shares``: the server routes the ciphertexts.
5. ``masked_input``: u clips and quantizes w_u x_u to Z_{2^bits} (under distributed DP noise,
   adds its share of integer Skellam noise) and adds PRG(b_u) and, for each neighbour v that
   shared, +-PRG(HKDF(X25519(s_sk_u, s_pk_v))) (+ if u precedes v).
6. ``unmask_request``: the server names the survivors (sent a masked input) and the dropped.
7. ``unmask``: each survivor reveals, per peer, the share of b for survivors or the share of
   s_sk for the dropped, never both; a request naming a peer in both lists is refused.

The server reconstructs, removes the self masks and the dropped clients' pairwise masks, and
dequantizes: sum_{survivors} w_u x_u / sum_{survivors} w_u.
"""

from __future__ import annotations

import json
import math
import random
import secrets
from dataclasses import dataclass, field

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.message import SERVER, deserialize_payload, serialize_payload
from ..privacy.skellam import grid_sensitivity
from .aggregation import check_payload, flatten, unflatten
from .crypto import agree, new_key_pair, open_sealed, private_bytes, private_from_bytes, seal
from .prg import expand_seed
from .protocol import check_protects, check_table, register_stage
from .quantize import Quantizer
from .shamir import Share, reconstruct_bytes, share_from_bytes, share_to_bytes, split_bytes

__all__ = ["SecAggStage", "harary_neighbours", "NoiseGeometry"]

PHASES = ("advertise_keys", "keys", "share_keys", "shares", "masked_input", "unmask_request",
          "unmask")
_KEYS = {"stage", "protects", "threshold", "neighbours", "clip", "levels", "bits"}
_MASK, _CHANNEL = b"mask-seed", b"share-channel"
# Headroom for distributed noise: the decoded sum must stay within half the modulus of the
# centre of its noiseless range for this many standard deviations of the total noise.
_NOISE_SIGMAS = 12.0


@dataclass(frozen=True)
class NoiseGeometry:
    """Distributed Skellam noise in quantization levels for one kind of update.

    ``sensitivity``: client id -> (L2, L1) sensitivity of its quantized input, in levels;
    ``honest``: the fewest honest clients whose inputs (and noise shares) reach a sum the
    server can unmask: the secagg threshold minus the colluders.
    """

    sensitivity: dict[str, tuple[float, float]]
    honest: int

    def sum_variance(self, multiplier: float) -> float:
        """Noise variance per coordinate that the sum carries at least: (tau * max L2)^2."""
        return (multiplier * max(l2 for l2, _ in self.sensitivity.values())) ** 2

    def share_variance(self, multiplier: float) -> float:
        """Variance each client adds so that ``honest`` shares sum to :meth:`sum_variance`."""
        return self.sum_variance(multiplier) / self.honest


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


def _bytes_payload(items: dict[str, bytes]) -> bytes:
    return serialize_payload({k: np.frombuffer(v, dtype=np.uint8) for k, v in items.items()})


def _payload_bytes(data: bytes, sender: str) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in deserialize_payload(data, sender).items()}


def _json_payload(value) -> bytes:
    return _bytes_payload({"json": json.dumps(value, sort_keys=True).encode()})


def _payload_json(data: bytes, sender: str):
    return json.loads(_payload_bytes(data, sender)["json"])


@dataclass
class _ClientSession:
    """What one client holds during one aggregation. Only its own client touches it."""

    id: str
    channel: object = None
    mask: object = None
    self_seed: bytes = b""
    own_shares: tuple[Share, Share] | None = None
    neighbour_keys: dict[str, dict[str, bytes]] = field(default_factory=dict)
    channels: dict[str, bytes] = field(default_factory=dict)  # AES key per neighbour
    received: dict[str, bytes] = field(default_factory=dict)


@register_stage
class SecAggStage:
    """Pairwise-mask secure aggregation with dropout recovery (see module docstring).

    ``threshold``: shares needed to rebuild a secret, an integer or a fraction of |S(u)|.
    ``neighbours``: 0 masks with every other client (Bonawitz), k > 0 with k random
    neighbours (SecAgg+). ``clip``, ``levels``, ``bits``: the quantizer of each w_u x_u.
    """

    name = "secagg"
    role = "aggregate"
    phases = PHASES
    can_protect = frozenset({"gradient", "dual_update", "update", "scalar"})

    def __init__(self, protects: tuple[str, ...], threshold: float, neighbours: int,
                 quantizer: Quantizer):
        self.protects = protects
        self.threshold = threshold
        self.neighbours = neighbours
        self.quantizer = quantizer
        self._rng = random.SystemRandom()

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
        neighbours = table.get("neighbours", 0)
        if not isinstance(neighbours, int) or neighbours < 0:
            raise ProtocolError(f"{source}: neighbours = {neighbours!r}; give 0 (all clients) "
                                "or a positive number of neighbours (SecAgg+; odd is rounded up)")
        try:
            quantizer = Quantizer(float(table.get("clip", 8.0)), int(table.get("levels", 2**22)),
                                  int(table.get("bits", 32)))
        except ProtocolError as err:
            raise ProtocolError(f"{source}: {err}") from None
        return cls(protects, threshold, neighbours, quantizer)

    # -- parameters ------------------------------------------------------------------------

    def group_size(self, clients: int) -> int:
        """|S(u)|: a client's neighbours plus itself."""
        k = self.neighbours + (self.neighbours % 2)
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
        self.quantizer.check(clients)

    @staticmethod
    def scales(weights: dict[str, float]) -> dict[str, float]:
        """w_u = weight_u * n / sum of weights: the factor each client multiplies its input by
        (about 1 each, so the quantizer's clip range suits every client)."""
        total = sum(weights.values())
        return {cid: w * len(weights) / total for cid, w in weights.items()}

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

    def aggregate(self, engine, round_, kind, compute, weights, template, prior=(),
                  noise=None):
        """``noise``: a :class:`~secureffm.protocols.dp.DistributedNoise` when each client must
        add its share of distributed DP noise, else None."""
        from ..federation.engine import Aggregate

        ids = [c.id for c in engine.clients]
        order = {cid: i for i, cid in enumerate(ids)}
        clients = {c.id: c for c in engine.clients}
        n = len(ids)
        scale = self.scales(weights)
        size = sum(int(np.prod(shape)) for shape, _ in template.values())
        share_variance = self._share_variance(noise, weights, size, n)
        wire = np.uint32 if self.quantizer.bits <= 32 else np.uint64
        dropped: dict[str, str] = {}
        stages = (*prior, self.name)

        def send(phase, sender, recipient, data):
            return engine.send(round_, phase, kind, sender, recipient, data, stages)

        def abort(reason):
            return Aggregate(None, [], dropped, reason)

        # 1. advertise_keys
        sessions: dict[str, _ClientSession] = {}
        advertised: dict[str, dict[str, bytes]] = {}
        for cid in ids:
            s = _ClientSession(cid, new_key_pair(), new_key_pair())
            data = send("advertise_keys", cid, SERVER,
                        _bytes_payload({"c_pk": s.channel.public, "s_pk": s.mask.public}))
            if data is None:
                dropped[cid] = "dropped before advertising keys"
                continue
            try:
                keys = _payload_bytes(data, cid)
                if sorted(keys) != ["c_pk", "s_pk"] or any(len(v) != 32 for v in keys.values()):
                    raise MessageError(f"{cid} advertised malformed keys")
            except MessageError as err:
                engine.reject(round_, "advertise_keys", cid, str(err))
                dropped[cid] = str(err)
                continue
            sessions[cid], advertised[cid] = s, keys
        u1 = [cid for cid in ids if cid in advertised]
        group = self.group_size(n)
        needed = self.shares_needed(group)
        if len(u1) < needed:
            return abort(f"only {len(u1)} clients advertised keys, threshold is {needed}")

        # 2. keys: the server fixes the neighbour graph over U1 and sends each its neighbours.
        graph = harary_neighbours(u1, self.neighbours, self._rng)
        for u in u1:
            data = send("keys", SERVER, u, _bytes_payload(
                {f"{kind_}:{v}": advertised[v][kind_] for v in sorted(graph[u])
                 for kind_ in ("c_pk", "s_pk")}))
            if data is not None:
                for name, key in _payload_bytes(data, SERVER).items():
                    key_kind, v = name.split(":", 1)
                    sessions[u].neighbour_keys.setdefault(v, {})[key_kind] = key

        # 3. share_keys
        outgoing: dict[str, dict[str, bytes]] = {}
        for u in u1:
            s = sessions[u]
            if not engine.alive(u, round_, "share_keys") or len(s.neighbour_keys) < len(graph[u]):
                dropped[u] = "dropped before sharing keys"
                continue
            s.self_seed = secrets.token_bytes(32)
            members = sorted(graph[u] | {u}, key=order.get)
            t_u = self.shares_needed(len(members))
            key_shares = split_bytes(private_bytes(s.mask.private), t_u, len(members))
            seed_shares = split_bytes(s.self_seed, t_u, len(members))
            ciphertexts = {}
            for v, ks, bs in zip(members, key_shares, seed_shares, strict=True):
                if v == u:
                    s.own_shares = (ks, bs)
                    continue
                channel = s.channels[v] = agree(s.channel.private,
                                                s.neighbour_keys[v]["c_pk"], _CHANNEL)
                context = f"{round_}|{kind}|{u}|{v}".encode()
                ciphertexts[v] = seal(channel, share_to_bytes(ks) + share_to_bytes(bs), context,
                                      secrets.token_bytes(12))
            data = send("share_keys", u, SERVER, _bytes_payload(ciphertexts))
            if data is None:
                dropped[u] = "dropped while sharing keys"
                continue
            try:
                received = _payload_bytes(data, u)
                if set(received) != graph[u]:
                    raise MessageError(f"{u} sent shares for {sorted(received)}, expected its "
                                       f"neighbours {sorted(graph[u])}")
            except MessageError as err:
                engine.reject(round_, "share_keys", u, str(err))
                dropped[u] = str(err)
                continue
            outgoing[u] = received
        u2 = [u for u in u1 if u in outgoing]
        if len(u2) < needed:
            return abort(f"only {len(u2)} clients shared keys, threshold is {needed}")

        # 4. shares: route each ciphertext to its recipient; the server remembers what each
        # client accepted, since that is whom it masks with.
        routed: dict[str, set[str]] = {v: set() for v in u2}
        for v in u2:
            bundle = {u: outgoing[u][v] for u in u2 if v in outgoing[u]}
            data = send("shares", SERVER, v, _bytes_payload(bundle))
            if data is not None:
                sessions[v].received = _payload_bytes(data, SERVER)
                routed[v] = set(bundle)

        # 5. masked_input
        masked: dict[str, np.ndarray] = {}
        for u in u2:
            s = sessions[u]
            if not engine.alive(u, round_, "masked_input"):
                dropped[u] = "dropped before sending its masked input"
                continue
            client = clients[u]
            payload = compute(client)
            try:
                check_payload(u, payload, {name: np.zeros(shape, dtype)
                                           for name, (shape, dtype) in template.items()})
            except MessageError as err:
                engine.reject(round_, "masked_input", u, f"withheld its update: {err}", by=u)
                dropped[u] = str(err)
                continue
            y = self.quantizer.quantize(scale[u] * flatten(payload, template),
                                        client.protocol_rng)
            if share_variance:
                y = self.quantizer.add_mod(y, _skellam(share_variance, size))
            y = self.quantizer.add_mod(y, expand_seed(s.self_seed, size, self.quantizer.bits))
            for v in s.received:  # neighbours that shared with u
                pair_seed = agree(s.mask.private, s.neighbour_keys[v]["s_pk"], _MASK)
                mask = expand_seed(pair_seed, size, self.quantizer.bits)
                y = (self.quantizer.add_mod(y, mask) if order[u] < order[v]
                     else self.quantizer.sub_mod(y, mask))
            data = send("masked_input", u, SERVER, serialize_payload({"y": y.astype(wire)}))
            if data is None:
                dropped[u] = "its masked input was rejected or never arrived"
                continue
            try:
                got = deserialize_payload(data, u)
                check_payload(u, got, {"y": np.zeros(size, dtype=wire)})
            except MessageError as err:
                engine.reject(round_, "masked_input", u, str(err))
                dropped[u] = str(err)
                continue
            masked[u] = got["y"].astype(np.uint64)
        u3 = [u for u in u2 if u in masked]
        if len(u3) < needed:
            return abort(f"only {len(u3)} masked inputs arrived, threshold is {needed}")
        gone = [u for u in u2 if u not in masked]

        # 6-7. unmask_request / unmask
        revealed: dict[str, dict[str, list[Share]]] = {"b": {}, "s": {}}
        responders = 0
        for v in u3:
            s = sessions[v]
            data = send("unmask_request", SERVER, v, _json_payload({"survivors": u3,
                                                                   "dropped": gone}))
            if data is None or not engine.alive(v, round_, "unmask"):
                continue  # still included: its input is in the sum, it just sends no shares
            request = _payload_json(data, SERVER)
            answer = self._answer(engine, round_, kind, s, request, needed)
            if answer is None:
                continue
            reply = send("unmask", v, SERVER, _bytes_payload(answer))
            if reply is None:
                continue
            responders += 1
            for name, blob in _payload_bytes(reply, v).items():
                which, peer = name.split(":", 1)
                revealed[which].setdefault(peer, []).append(share_from_bytes(blob))

        total = np.zeros(size, dtype=np.uint64)
        for u in u3:
            total = self.quantizer.add_mod(total, masked[u])
        def rebuild(which: str, u: str) -> bytes | None:
            """u's secret from the revealed shares, or None with fewer than t_u of them."""
            shares, t_u = revealed[which].get(u, []), self.shares_needed(len(graph[u]) + 1)
            return reconstruct_bytes(shares, t_u, 32) if len(shares) >= t_u else None

        def too_few(what: str, u: str) -> Aggregate:
            return abort(f"only {len(revealed[what[0]].get(u, []))} shares of {u}'s {what} came "
                         f"back, {self.shares_needed(len(graph[u]) + 1)} needed; the masked "
                         "sum stays masked")

        for u in u3:
            seed = rebuild("b", u)
            if seed is None:
                return too_few("b (self-mask seed)", u)
            total = self.quantizer.sub_mod(total, expand_seed(seed, size, self.quantizer.bits))
        for u in gone:
            secret = rebuild("s", u)
            if secret is None:
                return too_few("s (mask key, dropped)", u)
            mask_key = private_from_bytes(secret)
            for v in graph[u]:
                if v not in masked or u not in routed[v]:
                    continue
                pair_seed = agree(mask_key, advertised[v]["s_pk"], _MASK)
                mask = expand_seed(pair_seed, size, self.quantizer.bits)
                # v added +mask if v precedes u, else -mask: take it back out.
                total = (self.quantizer.sub_mod(total, mask) if order[v] < order[u]
                         else self.quantizer.add_mod(total, mask))
        summed = self.quantizer.dequantize_sum(total, len(u3), noisy=bool(share_variance))
        mean = summed / sum(scale[u] for u in u3)
        return Aggregate(unflatten(mean, template), u3, dropped)

    def _share_variance(self, noise, weights, size: int, n: int) -> float:
        """Each client's Skellam noise variance in levels (0 without distributed noise),
        after checking that the noisy sum of all n clients cannot wrap the modulus."""
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

    def _answer(self, engine, round_, kind, s: _ClientSession, request: dict,
                needed: int) -> dict[str, bytes] | None:
        """A survivor's reply to an unmask request, or None when it refuses (logged)."""
        survivors, gone = set(request["survivors"]), set(request["dropped"])
        both = sorted(survivors & gone)
        if both:
            engine.reject(round_, "unmask", SERVER, f"refused: the request names {both[0]} both "
                          "alive and dropped, which would reveal its update", by=s.id)
            return None
        if len(survivors) < needed:
            engine.reject(round_, "unmask", SERVER, f"refused: only {len(survivors)} survivors, "
                          f"threshold {needed}", by=s.id)
            return None
        answer = {}
        holdings = {s.id: s.own_shares}
        for u, sealed in s.received.items():
            channel = s.channels[u]  # the key agreed with u while sharing (symmetric)
            plain = open_sealed(channel, sealed, f"{round_}|{kind}|{u}|{s.id}".encode())
            holdings[u] = (share_from_bytes(plain[:68]), share_from_bytes(plain[68:]))
        for u, (key_share, seed_share) in holdings.items():
            if u in survivors:
                answer[f"b:{u}"] = share_to_bytes(seed_share)
            elif u in gone:
                answer[f"s:{u}"] = share_to_bytes(key_share)
        return answer


def _skellam(variance: float, size: int) -> np.ndarray:
    """Integer Skellam noise Poisson(v/2) - Poisson(v/2) (variance v per coordinate) in two's
    complement (uint64: residues mod 2^64, so mod 2^bits once added), from a generator seeded
    by the OS CSPRNG: neither the server nor the run's published seed can predict it."""
    rng = np.random.default_rng(secrets.randbits(128))
    noise = rng.poisson(variance / 2, size) - rng.poisson(variance / 2, size)
    return noise.astype(np.int64).astype(np.uint64)
