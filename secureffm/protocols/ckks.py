"""The ``ckks`` stage: homomorphic aggregation with CKKS (TenSEAL). Clients encrypt their
weighted updates under one shared secret key; the server adds ciphertexts, holding only the
public context (the parameters: with symmetric encryption there is no public key, so the
server holds no key at all); decryptor clients decrypt the sum and return it.

One aggregation (round ``r``, one message kind) runs these phases:

0. ``he_keys``, once per key epoch (the run, or ``rotate_every`` rounds): the key holder, the
   first client online, makes a fresh CKKS context (SEAL draws the secret key and all
   encryption noise from the OS through its own generator) and uploads in one message the
   public context for the server and the secret-key context sealed end to end for every other
   online client (the ``sealed`` transport: signed by the key holder, one content key wrapped
   per recipient under X25519 with its pinned key; the server cannot read it). The server
   keeps the public context and relays each recipient its part (phase ``relay``, naming the
   key holder as ``origin``, as every relayed payload does). A client online later that
   holds no key of the epoch gets one the same way, from the key holder, at its next
   aggregation. Each client keeps its own context in its ``memory``; one of another epoch is
   dropped.
1. ``upload``: each client with the key packs its update at its own weight, 1 (it refuses a
   server's other ``scale``, as under secagg: unequal weights are refused before the round),
   into ceil(d / (N/2)) ciphertexts, every slot used (the last one padded with zeros), and
   sends them. The server checks every ciphertext (count, slots,
   scale, level) and adds it to the running sum.
2. ``he_sum``: the server sends the summed ciphertexts to the decryptors: the first
   ``decryptors`` clients, in federation order, online and holding the key.
3. ``he_decrypted``: each decryptor decrypts, floods every slot with Gaussian noise from
   the OS (standard deviation :meth:`.CKKSParams.flood_sigma` for the federation's clients
   and the spec's decryptors, both read from its own registry and spec) and returns the sum
   (float64), which the log records as that delivery. An exact decryption would give the
   server the secret key (Li and Micciancio; tests/security/test_ckks_key_recovery.py). The
   server accepts the decryptors' mean when every answer lies within ``AGREE`` flood
   deviations of the first (honest ones differ by noise alone) and within the range honest
   inputs can reach (a ciphertext under another key decrypts to noise spread over the whole
   range); the mean is that sum over the number of included clients.

A client whose update has a coordinate beyond ``input_limit`` (beyond it, the sum could
wrap the modulus: :mod:`.ckks_params`) or NaN/Inf withholds it and logs why (never the value).
The server logs no statistic of any update: only counts and which client was left out.

Dropouts cost nothing: one that drops before ``upload`` is left out of the sum; one that drops
after uploading is counted, and no recovery phase follows. The round aborts only when no key
set-up or no upload reaches the server, no decryptor answers, or the decrypted sum is refused
(decryptors disagree, or it is out of range).

Threat model (docs/protocols.md): the server learns the sum of the uploads and
nothing else while no client colludes with it. Every client holds the secret key: a client
that colludes with the server decrypts every other client's upload from the server's view, and
a server that deviates can ask a decryptor to decrypt one client's upload in place of the sum.
With local DP (``dp-he``) every upload is DP on its own even then. The flooding keeps the key
from the server's view of exact decryptions (statistically, for an error within the bound of
:meth:`.CKKSParams.flood_sigma`; a deviating server can scale a ciphertext's error up).

Spec keys: ``protects`` (summable kinds), ``poly_modulus_degree``, ``coeff_mod_bit_sizes``,
``scale_bits`` (checked against the HE security standard, :mod:`.ckks_params`),
``decryptors`` (default 1), ``rotate_every`` (rounds per key epoch; 0, the default, keeps one
key for the run).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ..errors import MessageError, ProtocolError
from ..federation.channel import Aggregate, Compute, Template
from ..federation.memory import MemoryCodec
from ..federation.message import RELAY_PHASE, SERVER, deserialize_payload, serialize_payload
from ..federation.parties import Client, Party
from ..privacy.settings import DistributedNoise, NoiseGeometry
from .aggregation import check_payload, flatten, template_json, template_of, unflatten
from .ckks_params import CKKSParams
from .link import Ask, Link, accepted, silence
from .registry import check_protects, check_table
from .sealed import SealedStage
from .secagg import SecAggStage, check_scale
from .stage import StageDefaults
from .step import Handler, Step
from .wire import bytes_payload, payload_bytes

if TYPE_CHECKING:
    import tenseal as ts

__all__ = ["CKKSStage", "CLIENT_ACTIONS", "PHASES", "AGREE", "new_context", "public_context",
           "secret_context", "load_context", "encrypt", "read_ciphertexts", "write_ciphertexts",
           "decrypt", "flood", "load_tenseal"]

PHASES = ("he_keys", "he_sum", "he_decrypted")
_KEYS = {"stage", "protects", "poly_modulus_degree", "coeff_mod_bit_sizes", "scale_bits",
         "decryptors", "rotate_every"}
_MEMORY = "ckks"
# Two honest decryptors' answers differ by N(0, 2 sigma^2) per coordinate: beyond 13 sqrt(2)
# sigma with probability 1.2e-38 each.
AGREE = 13 * math.sqrt(2)
# What TenSEAL raises on bytes it cannot parse or ciphertexts it cannot combine.
_TENSEAL_ERRORS = (ValueError, RuntimeError, TypeError)
_NO_DISTRIBUTED_NOISE = ("distributed DP noise holds only inside secure aggregation (stage "
                         "'secagg'); with 'ckks' use noise = 'local'")


NEEDS_HE_EXTRA = ("the ckks stage (protocols he, dp-he) needs TenSEAL, which is not installed; "
                  "run `pip install secureffm[he]` or choose another protocol")


def load_tenseal() -> ModuleType:
    """The TenSEAL module, imported when a ckks stage first needs it (the ``he`` extra), so
    that the package imports and runs every other protocol without it."""
    try:
        import tenseal as ts
    except ImportError as err:
        raise ProtocolError(NEEDS_HE_EXTRA) from err
    return ts


# -- contexts: pure functions of TenSEAL objects ------------------------------------------------

def new_context(params: CKKSParams) -> ts.Context:
    """A fresh CKKS context with a new secret key (symmetric encryption, one thread)."""
    ts = load_tenseal()
    context = ts.context(ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree,
                         coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
                         encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC, n_threads=1)
    context.global_scale = params.scale
    return context


def public_context(context: ts.Context) -> bytes:
    """The parameters and scale, never the secret key (nor relinearization or Galois keys,
    which addition does not need)."""
    return context.serialize(save_public_key=False, save_secret_key=False,
                             save_galois_keys=False, save_relin_keys=False)


def secret_context(context: ts.Context) -> bytes:
    """The parameters, scale and secret key: what a client encrypts and decrypts with."""
    return context.serialize(save_public_key=False, save_secret_key=True,
                             save_galois_keys=False, save_relin_keys=False)


def load_context(data: bytes, params: CKKSParams, private: bool, sender: str) -> ts.Context:
    """A context from ``sender``'s bytes; MessageError unless it parses, has ``params`` and
    holds a secret key exactly when ``private``."""
    try:
        context = load_tenseal().context_from(data, n_threads=1)
        key_data = context.seal_context().data.key_context_data()
        found = (key_data.parms().poly_modulus_degree(), key_data.total_coeff_modulus_bit_count(),
                 context.global_scale)
    except _TENSEAL_ERRORS as err:
        raise MessageError(f"{sender} sent no valid CKKS context: {err}") from None
    wanted = (params.poly_modulus_degree, sum(params.coeff_mod_bit_sizes), params.scale)
    if found != wanted:
        raise MessageError(f"{sender}'s CKKS context has (degree, modulus bits, scale) "
                           f"{found}, not the spec's {wanted}")
    if context.is_private() != private:
        why = "lacks the secret key a client needs" if private else (
            "holds the secret key, which the server must never hold")
        raise MessageError(f"{sender}'s CKKS context {why}")
    return context


# -- ciphertexts --------------------------------------------------------------------------------

def encrypt(context: ts.Context, x: np.ndarray, params: CKKSParams) -> list[ts.CKKSVector]:
    """x [d] float64 as ceil(d / (N/2)) ciphertexts of N/2 slots each (zeros pad the last)."""
    count = params.ciphertexts(x.size)
    padded = np.zeros(count * params.slots)
    padded[:x.size] = x
    ts = load_tenseal()
    return [ts.ckks_vector(context, chunk) for chunk in padded.reshape(count, params.slots)]


def write_ciphertexts(vectors: list[ts.CKKSVector]) -> bytes:
    """Serialized ciphertexts as a payload: ``lengths`` (uint64 [k]) and their concatenated
    bytes ``ciphertexts``."""
    blobs = [v.serialize() for v in vectors]
    return serialize_payload({
        "lengths": np.array([len(b) for b in blobs], dtype=np.uint64),
        "ciphertexts": np.frombuffer(b"".join(blobs), dtype=np.uint8)})


def read_ciphertexts(context: ts.Context, data: bytes, count: int, params: CKKSParams,
                     sender: str) -> list[ts.CKKSVector]:
    """``count`` ciphertexts from ``sender``'s payload; MessageError unless each parses under
    ``context`` and is a fresh two-part ciphertext of N/2 slots at the spec's scale and level."""
    fields = deserialize_payload(data, sender)
    lengths, blob = fields.get("lengths"), fields.get("ciphertexts")
    if (sorted(fields) != ["ciphertexts", "lengths"] or lengths.dtype != np.uint64
            or lengths.shape != (count,) or blob.dtype != np.uint8 or blob.ndim != 1
            or int(lengths.sum()) != blob.size):
        raise MessageError(f"{sender} sent no {count} ciphertexts (fields lengths: uint64 "
                           f"[{count}], ciphertexts: their bytes)")
    ends = np.cumsum(lengths.astype(np.int64))
    raw = blob.tobytes()
    return [_read_one(context, raw[end - size:end], params, f"{sender}'s ciphertext {i}")
            for i, (end, size) in enumerate(zip(ends, lengths.astype(np.int64), strict=True))]


def _read_one(context: ts.Context, data: bytes, params: CKKSParams, what: str) -> ts.CKKSVector:
    try:
        vector = load_tenseal().ckks_vector_from(context, data)
        parts = vector.ciphertext()
        shape = (vector.size(), len(parts), parts[0].size(), parts[0].coeff_modulus_size(),
                 parts[0].scale)
    except _TENSEAL_ERRORS as err:
        raise MessageError(f"{what} does not parse: {err}") from None
    wanted = (params.slots, 1, 2, len(params.coeff_mod_bit_sizes) - 1, params.scale)
    if shape != wanted:
        raise MessageError(f"{what} has (slots, ciphertexts, parts, primes, scale) {shape}, "
                           f"expected {wanted}")
    return vector


def decrypt(context: ts.Context, vectors: list[ts.CKKSVector], size: int) -> np.ndarray:
    """The first ``size`` slots of ``vectors``, decrypted with ``context``'s secret key: [size]
    float64."""
    return np.concatenate([np.asarray(v.decrypt(context.secret_key()), dtype=np.float64)
                           for v in vectors])[:size]


def flood(x: np.ndarray, sigma: float) -> np.ndarray:
    """x [d] plus Gaussian noise of standard deviation ``sigma`` per coordinate, drawn from a
    generator seeded with 128 bits of OS entropy."""
    return x + np.random.default_rng(secrets.randbits(128)).normal(0.0, sigma, x.shape)


# -- one aggregation ------------------------------------------------------------------------------

@dataclass
class _Round:
    """One aggregation: the link, the key epoch, who was left out and why."""

    link: Link
    epoch: int
    dropped: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)  # who was asked to compute

    def key(self, cid: str) -> ts.Context | None:
        """The context a party holds for this epoch (another epoch's is forgotten)."""
        return _held(self.link.parties[cid], self.epoch)

    def hold(self, party: Party, context: ts.Context, **extra) -> None:
        party.memory[_MEMORY] = {"epoch": self.epoch, "context": context, **extra}


def _held(party: Party, epoch: int) -> ts.Context | None:
    """The context ``party`` holds for key ``epoch`` (another epoch's is forgotten). A client
    restored from its saved state holds the secret context's bytes (``secret``) until it
    first uses the key."""
    memory = party.memory
    held = memory.get(_MEMORY)
    if held is not None and held["epoch"] != epoch:
        del memory[_MEMORY]
        return None
    if held is not None and "context" not in held:
        # its own saved key, not a message
        held["context"] = load_tenseal().context_from(held["secret"])
    return None if held is None else held["context"]


def _keep_key(client: Client, epoch: int, context: ts.Context, secret: bytes) -> None:
    """A client keeps its key for ``epoch``: the context, and its secret context's bytes
    (``secret``, what its saved state carries)."""
    client.memory[_MEMORY] = {"epoch": epoch, "context": context, "secret": secret}


def _save_key(held: dict) -> tuple[dict, dict[str, np.ndarray]]:
    return {"epoch": held["epoch"]}, {"secret": np.frombuffer(held["secret"], dtype=np.uint8)}


def _load_key(saved: dict, arrays: dict[str, np.ndarray]) -> dict:
    return {"epoch": int(saved["epoch"]), "secret": arrays["secret"].tobytes()}


# A client's key across a snapshot: its epoch and the secret context's bytes (the context is
# rebuilt from them when first used, :func:`_held`).
KEY = MemoryCodec(_MEMORY, _save_key, _load_key)


class CKKSStage(StageDefaults):
    """Homomorphic aggregation under one shared CKKS key; see the module docstring."""

    name = "ckks"
    role = "aggregate"
    phases = PHASES
    can_protect = frozenset({"gradient", "dual_update", "update", "scalar"})
    input_phase = "upload"
    memory = (KEY,)

    @property
    def client_actions(self) -> dict[str, Handler]:
        """Its clients' steps: key set-up, upload, decryption (:data:`CLIENT_ACTIONS`)."""
        return CLIENT_ACTIONS

    def __init__(self, protects: tuple[str, ...], params: CKKSParams, decryptors: int = 1,
                 rotate_every: int = 0):
        self.protects = protects
        self.params = params
        self.decryptors = decryptors
        self.rotate_every = rotate_every

    @classmethod
    def from_table(cls, table: dict, source: str) -> CKKSStage:
        where = f"{source} (stage 'ckks')"
        check_table(table, _KEYS, ("protects", "poly_modulus_degree", "coeff_mod_bit_sizes",
                                   "scale_bits"), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "the server decrypts only the sum, and such "
                       "messages are needed one by one")
        if not protects:
            raise ProtocolError(f"{where}: protects is empty; name the kinds to aggregate")
        params = CKKSParams.from_table(table, where)
        load_tenseal()  # refused here, when the spec is read, rather than in round 0
        counts = {key: table.get(key, default) for key, default in
                  (("decryptors", 1), ("rotate_every", 0))}
        for key, value in counts.items():
            low = 1 if key == "decryptors" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ProtocolError(f"{where}: {key} = {value!r}; give an integer >= {low}")
        return cls(protects, params, counts["decryptors"], counts["rotate_every"])

    def validate_for(self, clients: int) -> None:
        if clients < 2:
            raise ProtocolError("homomorphic aggregation needs at least 2 clients: the sum of "
                                "one update is the update")
        if self.decryptors > clients:
            raise ProtocolError(f"stage 'ckks': decryptors = {self.decryptors} but the "
                                f"federation has {clients} clients; lower decryptors")

    def claim(self, kind: str) -> tuple[str, str]:
        return ("CKKS homomorphic aggregation: the server adds ciphertexts and holds no secret "
                "key; a decryptor client returns the weighted sum of the uploads; it adds no DP "
                "by itself",
                "no client colludes with the server (every client holds the one shared secret "
                "key and could decrypt any upload the server saw); an honest-but-curious server "
                "(a deviating one can ask a decryptor to decrypt a single upload)")

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str]:
        """Whoever holds the clients' key: every client (the server, with one colluding)."""
        return frozenset({"key-holders"}), "CKKS-encrypted under the key every client holds"

    def noise_geometry(self, weights: dict[str, float], sensitivity: dict[str, float],
                       size: int, colluders: int) -> NoiseGeometry:
        raise ProtocolError(_NO_DISTRIBUTED_NOISE)

    def epoch(self, round_: int) -> int:
        """The key epoch of ``round_``: 0 for the whole run, or round // rotate_every."""
        return round_ // self.rotate_every if self.rotate_every else 0

    # w_u = 1 for every client, the only factor a client takes; unequal weights are refused.
    scales = staticmethod(SecAggStage.scales)

    def aggregate(self, link: Link, compute: Compute, weights: dict[str, float],
                  template: Template, noise: DistributedNoise | None = None) -> Aggregate:
        """One aggregation over ``link``'s clients (distributed noise is refused at load)."""
        if noise is not None:
            raise ProtocolError(_NO_DISTRIBUTED_NOISE)
        self.scales(weights)  # unequal weights are refused before the round
        r = _Round(link, self.epoch(link.round))
        self._keys(r)
        server_key = r.key(SERVER)
        if server_key is None:
            return Aggregate(None, [], r.dropped, "no key set-up reached the server (no client "
                             "online, or the key holder's message was lost or rejected)")
        size = sum(int(np.prod(shape)) for shape, _ in template.values())
        total, included = self._uploads(r, server_key, compute, weights, template, size)
        if not included:
            return Aggregate(None, [], r.dropped, "no encrypted update was accepted", r.asked)
        summed, reason = self._decrypted(r, total, size)
        if summed is None:
            return Aggregate(None, [], r.dropped, reason, r.asked)
        scale = self.scales(weights)
        mean = summed / sum(scale[u] for u in included)
        return Aggregate(unflatten(mean, template), included, r.dropped, asked=r.asked)

    # -- phase he_keys --------------------------------------------------------------------------

    def _keys(self, r: _Round) -> None:
        """Set up this epoch's keys, or have the key holder hand them to online clients that
        lack them (as far as the server knows: those that did not accept one)."""
        link, server = r.link, r.link.parties[SERVER]
        online = [c.id for c in link.clients if link.alive(c.id, "he_keys")]
        if r.key(SERVER) is None:
            if online:
                self._send_keys(r, online[0], online[1:], fresh=True)
            return
        holder = server.memory[_MEMORY]["holder"]
        missing = [c for c in online if c not in server.memory[_MEMORY]["holders"]]
        if missing and holder in online:
            self._send_keys(r, holder, missing, fresh=False)

    def _send_keys(self, r: _Round, holder: str, recipients: list[str], fresh: bool) -> None:
        """``holder`` uploads the public context (at set-up, ``fresh``) and its secret context
        sealed for ``recipients`` (``ckks.keys``); the server keeps the first and relays the
        second (``ckks.key``)."""
        link = r.link
        expected = sorted((["public"] if fresh else []) + (["sealed"] if recipients else []))
        delivery = link.exchange("he_keys", "he_keys", "ckks.keys", {holder: Ask(args={
            "epoch": r.epoch, "fresh": fresh, "recipients": recipients})}).get(holder)
        if delivery is None or delivery.data is None:
            return
        try:
            fields = payload_bytes(delivery.data, holder)
            if sorted(fields) != expected:
                raise MessageError(f"{holder}'s key message has fields {sorted(fields)}, "
                                   f"expected {expected}")
            if fresh:
                r.hold(link.parties[SERVER], load_context(fields["public"], self.params, False,
                                                          holder),
                       holder=holder, holders={holder})
        except MessageError as err:
            link.reject("he_keys", holder, str(err))
            return
        if not recipients:
            return
        sealer = SealedStage((link.kind,))
        try:
            parts = {v: sealer.relay(fields["sealed"], v, holder) for v in recipients}
        except MessageError as err:
            link.reject("he_keys", holder, str(err))
            return
        relayed = link.exchange(RELAY_PHASE, RELAY_PHASE, "ckks.key", {
            v: Ask(part, {"epoch": r.epoch}, origin=holder) for v, part in parts.items()})
        holders = link.parties[SERVER].memory[_MEMORY]["holders"]
        holders.update(v for v in recipients if accepted(relayed.get(v), v))

    # -- phase upload ---------------------------------------------------------------------------

    def _uploads(self, r: _Round, server_key: ts.Context, compute: Compute,
                 weights: dict[str, float], template: Template,
                 size: int) -> tuple[list[ts.CKKSVector] | None, list[str]]:
        """Every client's encrypted upload, added up by the server: (the sum, who is in it)."""
        link, scale = r.link, self.scales(weights)
        limit = self.params.input_limit(len(link.clients))
        count = self.params.ciphertexts(size)
        replies = link.exchange("upload", "upload", "ckks.upload", {
            c.id: Ask(args={"compute": compute, "template": template_json(template),
                             "scale": scale[c.id], "limit": limit, "epoch": r.epoch})
            for c in link.clients})
        total, included = None, []
        for client in link.clients:
            u = client.id
            if u not in replies:
                r.dropped[u] = "offline at phase upload"
                continue
            r.asked.append(u)
            data = replies[u].data
            if data is None:
                r.dropped[u] = silence(replies[u], u, "its upload was rejected or never "
                                       "arrived")
                continue
            try:
                vectors = read_ciphertexts(server_key, data, count, self.params, u)
                total = vectors if total is None else [_add(s, v, u) for s, v in
                                                       zip(total, vectors, strict=True)]
            except MessageError as err:
                link.reject("upload", u, str(err))
                r.dropped[u] = str(err)
                continue
            included.append(u)
        return total, included

    # -- phases he_sum and he_decrypted ---------------------------------------------------------

    def _decrypted(self, r: _Round, total: list[ts.CKKSVector],
                   size: int) -> tuple[np.ndarray | None, str]:
        """The decryptors' plaintext sum [d] float64, or None and why not."""
        link = r.link
        holders = link.parties[SERVER].memory[_MEMORY]["holders"]
        chosen = [c.id for c in link.clients
                  if link.alive(c.id, "he_sum") and c.id in holders][:self.decryptors]
        replies = link.exchange("he_sum", "he_decrypted", "ckks.decrypt", {
            v: Ask(write_ciphertexts(total), {"epoch": r.epoch, "size": size}) for v in chosen})
        answers: dict[str, np.ndarray] = {}
        for v in chosen:
            reply = replies.get(v)
            if reply is None or reply.data is None:
                continue
            try:
                got = deserialize_payload(reply.data, v)
                check_payload(v, got, {"sum": np.zeros(size, np.float64)})
            except MessageError as err:
                link.reject("he_decrypted", v, str(err))
                continue
            answers[v] = got["sum"]
        if not answers:
            return None, (f"no decryptor returned the sum (asked: {', '.join(chosen) or 'none'}"
                          " online with the key)")
        first = next(iter(answers.values()))
        apart = AGREE * self.params.flood_sigma(len(link.clients), self.decryptors)
        if any(np.abs(a - first).max(initial=0.0) > apart for a in answers.values()):
            return None, (f"the decryptors {', '.join(answers)} returned sums more than "
                          f"{apart:.3g} apart (honest ones differ by their flooding noise "
                          "alone); one of them decrypted wrongly or lied")
        summed = np.mean(list(answers.values()), axis=0)
        if np.abs(summed).max(initial=0.0) > self.params.sum_limit:
            return None, ("the decrypted sum lies outside the range honest inputs reach: an "
                          "upload was encrypted under another key or altered")
        return summed, ""


def _add(total: ts.CKKSVector, vector: ts.CKKSVector, sender: str) -> ts.CKKSVector:
    """total + vector, or MessageError naming ``sender`` (TenSEAL refuses, say, other scales)."""
    try:
        return total + vector
    except _TENSEAL_ERRORS as err:
        raise MessageError(f"{sender}'s ciphertext cannot be added to the sum: {err}") from None


def _client_upload(step: Step) -> bytes | None:
    """The client's update encrypted under the key it holds for the request's epoch, at its
    own weight 1: it refuses a server's other ``scale`` (a ``rejected`` event naming the
    server, :func:`.secagg.check_scale`), withholds (a ``rejected`` event of its own, naming
    the rule, never a value) an update that is malformed or beyond the decodable range, and
    sends nothing without a key."""
    u, args = step.client.id, step.args
    try:
        check_scale(args.get("scale"))
    except MessageError as err:
        step.reject(SERVER, f"{u} refused the upload request: {err}")
        return None
    context = _held(step.client, int(args["epoch"]))
    if context is None:
        step.reject(u, f"holds no key of key epoch {args['epoch']}, so it did not encrypt")
        return None
    stage = step.endpoint.protocol.aggregator(step.request.kind)
    template = template_of(args["template"])
    payload = step.compute()
    limit = float(args["limit"])
    try:
        check_payload(u, payload, {name: np.zeros(shape, dtype)
                                   for name, (shape, dtype) in template.items()})
        x = flatten(payload, template)
        if np.abs(x).max(initial=0.0) > limit:
            raise MessageError(f"a coordinate of {u}'s update exceeds +-{limit:g}, "
                               "beyond which the encrypted sum could wrap the modulus")
    except MessageError as err:
        step.reject(u, f"withheld its update: {err}")
        return None
    return write_ciphertexts(encrypt(context, x, stage.params))


def _peers_or_refuse(step: Step, recipients) -> bool:
    """Whether ``recipients`` are distinct registered clients other than this one (sealing a
    key for the server or an unregistered party would hand it the key); refused otherwise."""
    me, registry = step.client.id, step.endpoint.registry
    if (isinstance(recipients, list) and len(set(recipients)) == len(recipients)
            and all(isinstance(v, str) and v not in (SERVER, me) and v in registry.sign
                    for v in recipients)):
        return True
    step.reject(SERVER, f"{me} refused to seal its key context for {recipients!r}: recipients "
                "must be distinct registered clients other than itself")
    return False


def _client_keys(step: Step) -> bytes | None:
    """The key holder's key message: the public context of a fresh key (``fresh``; the key it
    already holds for the epoch, if any, is kept) and its secret context sealed end to end for
    ``recipients``."""
    u, args, kind = step.client.id, step.args, step.request.kind
    epoch = int(args["epoch"])
    if not _peers_or_refuse(step, args["recipients"]):
        return None
    stage = step.endpoint.protocol.aggregator(kind)
    context = _held(step.client, epoch)
    fields = {}
    if args["fresh"]:
        if context is None:
            context = new_context(stage.params)
            _keep_key(step.client, epoch, context, secret_context(context))
        fields["public"] = public_context(context)
    elif context is None:
        step.reject(u, f"holds no key of key epoch {epoch} to hand on")
        return None
    if args["recipients"]:
        fields["sealed"] = SealedStage((kind,)).seal(
            step.client, step.endpoint.registry,
            {"context": np.frombuffer(step.client.memory[_MEMORY]["secret"], dtype=np.uint8)},
            kind, step.request.round, "he_keys", args["recipients"])
    return bytes_payload(fields)


def _client_key(step: Step) -> None:
    """A client opens the key holder's sealed secret context the server relays and keeps it."""
    v, kind = step.client.id, step.request.kind
    holder = step.request.envelope.origin
    stage = step.endpoint.protocol.aggregator(kind)
    try:
        opened = SealedStage((kind,)).open(step.client, step.endpoint.registry, step.data, kind,
                                           step.request.round, "he_keys", holder)
        if sorted(opened) != ["context"] or opened["context"].dtype != np.uint8:
            raise MessageError(f"{holder}'s sealed key message holds {sorted(opened)}")
        secret = opened["context"].tobytes()
        context = load_context(secret, stage.params, True, holder)
    except (MessageError, ProtocolError, KeyError) as err:
        step.reject(SERVER, f"{v} rejected the key context of {holder}: {err}",
                    refused=step.seq)
        return None
    _keep_key(step.client, int(step.args["epoch"]), context, secret)
    return None


def _client_decrypt(step: Step) -> bytes | None:
    """A decryptor decrypts the summed ciphertexts under the key it holds and returns the
    plaintext sum [size] float64, flooded for the federation's clients (its registry) and the
    spec's decryptors."""
    v, args = step.client.id, step.args
    context = _held(step.client, int(args["epoch"]))
    if context is None:
        step.reject(v, f"holds no key of key epoch {args['epoch']}, so it cannot decrypt")
        return None
    stage = step.endpoint.protocol.aggregator(step.request.kind)
    params = stage.params
    size = int(args["size"])
    try:
        vectors = read_ciphertexts(context, step.data, params.ciphertexts(size), params, SERVER)
    except MessageError as err:
        step.reject(SERVER, f"{v} refused the summed ciphertexts: {err}", refused=step.seq)
        return None
    clients = sum(1 for p in step.endpoint.registry.sign if p != SERVER)
    sigma = params.flood_sigma(clients, stage.decryptors)
    return serialize_payload({"sum": flood(decrypt(context, vectors, size), sigma)})


# A ckks client's steps (:attr:`CKKSStage.client_actions`).
CLIENT_ACTIONS: dict[str, Handler] = {"ckks.keys": _client_keys, "ckks.key": _client_key,
                                      "ckks.upload": _client_upload,
                                      "ckks.decrypt": _client_decrypt}
