"""Parties of a federation, each holding only its own keys. A client owns its shard; the server
owns no data.

A :class:`Party` signs what it sends and every event it raises with its own Ed25519 identity,
and opens what is sealed to it with its own X25519 key; other parties, the transport and the
log know only the public halves (a :class:`Registry`, pinned in parties.json).

A party's private random streams (which mini-batches it draws, its source noise and times, its
DP sampling and noise, stochastic rounding, FedWAD's randomized t and support noise) must be
unpredictable to every other party, so :class:`SecretStreams` seeds them from the OS CSPRNG.
The run seed is published in config.toml and drives only public choices (data generation,
partition, initial weights, graphs). Only ``--insecure-deterministic`` derives the secret
streams from the run seed, for reproducible debugging, and the run records that it did.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from .crypto import Identity, KeyPair, new_key_pair
from .message import SERVER, Envelope, Payload, canonical, link_of

__all__ = ["Party", "Client", "ClientInfo", "Registry", "SecretStreams", "new_client",
           "new_clients", "new_server", "secret_randomness", "keyed_uniforms",
           "STREAM_PURPOSES", "EMPTY_SHA256"]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

# What each purpose seeds: "training": mini-batches without DP, and what methods draw per
# batch; "examples": per-example randomness keyed by (round, kind) and example index (source
# noise x0, times t, candidate pools); "dp": Poisson sampling and Gaussian noise of DP-SGD;
# "protocol": stochastic rounding, randomized t and support-point noise.
STREAM_PURPOSES = ("training", "examples", "dp", "protocol")


@dataclass(frozen=True)
class SecretStreams:
    """One party's secret key and the random streams derived from it.

    ``seed``: None (the default) draws the 32-byte key from the OS CSPRNG (``secrets``). An
    integer, only under ``--insecure-deterministic``, derives it as
    SHA-256("secureffm-stream|seed|party"): reproducible, and replayable by anyone who reads
    config.toml. Every stream is keyed by HMAC-SHA256(key, purpose and context), so streams of
    different purposes, rounds or message kinds are independent.
    """

    party: str = ""
    seed: int | None = None
    key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (secrets.token_bytes(32) if self.seed is None else
               hashlib.sha256(f"secureffm-stream|{self.seed}|{self.party}".encode()).digest())
        object.__setattr__(self, "key", key)

    @property
    def deterministic(self) -> bool:
        return self.seed is not None

    def _derive(self, purpose: str, context: tuple) -> bytes:
        if purpose not in STREAM_PURPOSES:
            raise ValueError(f"unknown stream purpose {purpose!r}; use one of {STREAM_PURPOSES}")
        label = "|".join([purpose, *map(str, context)]).encode()
        return hmac.new(self.key, label, hashlib.sha256).digest()

    def seed_for(self, purpose: str, bits: int, *context) -> int:
        """A ``bits``-bit seed for ``purpose`` (one of :data:`STREAM_PURPOSES`) in ``context``."""
        return int.from_bytes(self._derive(purpose, context), "big") >> (256 - bits)

    def torch(self, purpose: str, device: torch.device | str = "cpu",
              *context) -> torch.Generator:
        """A torch generator on ``device`` for ``purpose`` in ``context`` (64-bit seed, the
        most torch takes)."""
        return torch.Generator(device=device).manual_seed(self.seed_for(purpose, 64, *context))

    def numpy(self, purpose: str, *context) -> np.random.Generator:
        """A numpy generator for ``purpose`` in ``context`` (128-bit seed)."""
        return np.random.default_rng(self.seed_for(purpose, 128, *context))

    def example_uniforms(self, context: tuple, rows, width: int) -> np.ndarray:
        """U[0, 1) float64 [len(rows), width]: row i belongs to example index ``rows[i]``.

        ChaCha20 keyed by HMAC(key, "examples" and ``context``), read at the keystream position
        of each example index, so an example's uniforms depend on the key, the context and its
        own index only: never on which or how many other examples were drawn (the premise of a
        per-example DP bound), and never on an earlier call's consumption.
        """
        return keyed_uniforms(self._derive("examples", context),
                              np.asarray(rows, dtype=np.int64), width)


_WHOLE_TABLE_BYTES = 8 * 2**20


def keyed_uniforms(key: bytes, rows: np.ndarray, width: int) -> np.ndarray:
    """[len(rows), width] float64 in [0, 1) from the ChaCha20 keystream of ``key``: row index r
    owns keystream blocks r*m .. r*m + m - 1 (m = ceil(8 width / 64)); each uniform is a uint64
    word's top 53 bits times 2^-53."""
    blocks = -(-8 * width // 64)
    row_bytes = 64 * blocks
    if rows.size and (rows.min() < 0 or (int(rows.max()) + 1) * blocks > 2**32):
        raise ValueError("example indices must lie in [0, 2^32 / blocks per example)")
    if not rows.size:
        return np.zeros((0, width))
    span = (int(rows.max()) + 1) * row_bytes
    if span <= _WHOLE_TABLE_BYTES:
        table = _keystream(key, 0, span).reshape(-1, row_bytes)[rows]
    else:
        table = np.stack([_keystream(key, int(r) * blocks, row_bytes) for r in rows])
    words = table[:, :8 * width].copy().view("<u8")
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _keystream(key: bytes, block: int, length: int) -> np.ndarray:
    """``length`` bytes of ChaCha20(key) from block counter ``block``, as uint8."""
    nonce = block.to_bytes(4, "little") + bytes(12)
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(length)), dtype=np.uint8)


@dataclass
class Party:
    """One party with its own long-term keys.

    ``identity``: its Ed25519 signing key; it signs every message and event the party sends.
    ``sealing``: its long-term X25519 key; sealed messages to the party are opened with it.
    ``memory``: what the party's protocol stages keep between messages (for example the
    counters of sealed messages it sent and accepted), never shared.
    ``streams``: where the party's secret random streams come from.
    ``last``: :func:`~secureffm.federation.message.link_of` the bytes it signed for its latest
    message or event, which its next one carries ("" before its first).
    """

    id: str
    identity: Identity = field(default_factory=Identity, repr=False, kw_only=True)
    sealing: KeyPair = field(default_factory=new_key_pair, repr=False, kw_only=True)
    memory: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)
    streams: SecretStreams = field(default_factory=SecretStreams, repr=False, kw_only=True)
    last: str = field(default="", repr=False, kw_only=True)

    def sign(self, data: bytes) -> bytes:
        return self.identity.sign(data)

    def _sign_record(self, content: bytes) -> bytes:
        """Sign the canonical bytes of a message or event record and remember their link."""
        sig = self.sign(content)
        self.last = link_of(content)
        return sig

    def envelope(self, round_: int, phase: str, kind: str, recipient: str, data: bytes,
                 stages: tuple[str, ...] = (), origin: str = "",
                 digest: str | None = None) -> Envelope:
        """A delivery from this party, signed by it (over :meth:`Envelope.header`).
        ``digest``: the hex SHA-256 of ``data`` when the party already computed it (the same
        bytes sent to several recipients are hashed once)."""
        unsigned = Envelope(kind, self.id, recipient, round_, phase, data, stages, origin,
                            last=self.last)
        if digest is not None:
            unsigned.__dict__["sha256"] = digest  # what Envelope.sha256 caches
        return unsigned.signed(self._sign_record(canonical(unsigned.header())))

    def event(self, round_: int, phase: str, event: str, about: str, detail: str,
              fields: dict | None = None) -> dict:
        """A log event raised by this party about ``about`` (``rejected``, ``dropped``,
        ``aborted``, ``aggregated``, ``clipped``, ``closed``), signed by it; ``fields``: the
        event's structured fields (``included``, ``of_kind``, ``records``, ``chain``)."""
        record = {"round": round_, "phase": phase, "kind": "event", "sender": self.id,
                  "recipient": "log", "stages": [], "bytes": 0, "sha256": EMPTY_SHA256,
                  "event": event, "party": about, "detail": detail, **(fields or {})}
        if self.last:
            record["last"] = self.last
        record["sig"] = self._sign_record(canonical(record)).hex()
        return record


def new_clients(shards: list[torch.Tensor],
                deterministic_seed: int | None = None) -> list[Client]:
    """Clients ``client-1``, ``client-2``, ... holding ``shards`` in order (see
    :func:`new_client`)."""
    return [new_client(f"client-{i}", shard, deterministic_seed)
            for i, shard in enumerate(shards, start=1)]


def new_server(deterministic_seed: int | None = None) -> Party:
    """The server: keys from the OS CSPRNG, no data; its random choices (the secure-aggregation
    neighbour graph) from ``SecretStreams(SERVER, deterministic_seed)``."""
    return Party(SERVER, streams=SecretStreams(SERVER, deterministic_seed))


@dataclass(frozen=True)
class Registry:
    """The public keys every party pins (parties.json): party id -> raw Ed25519 key (``sign``)
    and raw X25519 key (``seal``), 32 bytes each."""

    sign: dict[str, bytes]
    seal: dict[str, bytes]

    @classmethod
    def of(cls, parties: list[Party]) -> Registry:
        return cls({p.id: p.identity.public for p in parties},
                   {p.id: p.sealing.public for p in parties})


@dataclass
class Client(Party):
    """One data silo.

    ``data``: the client's finite shard, shape [N, d], on the run's device.
    ``generator``: the client's training stream (mini-batches, source noise, t).
    ``inbox``: the last payload received per message kind.
    ``gathered``: kind -> (round, author -> payload): the peers' payloads of the latest
    all-gather of that kind that reached this client.
    ``state``: the method's client-side objects (model replicas), set up by the method.
    ``protocol_rng``: the client's stream for protocol randomness that is not key material
    (stochastic rounding, randomized t), kept apart so a protocol never shifts training.
    ``kept``: the method's stateful objects whose state must outlive a message as it is (its own
    trained model, optimizer, EMA: anything with ``state_dict()`` and ``load_state_dict()``);
    the method makes them, a snapshot carries their state (``state`` holds what the method
    rebuilds or reloads from broadcasts).
    """

    data: torch.Tensor
    generator: torch.Generator
    inbox: dict[str, Payload] = field(default_factory=dict)
    gathered: dict[str, tuple[int, dict[str, Payload]]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    protocol_rng: np.random.Generator = field(default_factory=np.random.default_rng)
    kept: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.data.shape[0])

    def keep_gathered(self, round_: int, kind: str, author: str, payload: Payload) -> None:
        """Keep ``author``'s payload of the all-gather of ``kind`` in ``round_`` (the copies of
        an earlier round of that kind are dropped)."""
        held_round, held = self.gathered.get(kind, (round_, {}))
        held = held if held_round == round_ else {}
        held[author] = payload
        self.gathered[kind] = (round_, held)

    def peers(self, round_: int, kind: str) -> dict[str, Payload]:
        """author -> payload: the peers' payloads of the all-gather of ``kind`` in ``round_``
        that this client accepted (empty when none reached it)."""
        held_round, held = self.gathered.get(kind, (None, {}))
        return dict(held) if held_round == round_ else {}

    def example_uniforms(self, context: tuple, rows: torch.Tensor, width: int) -> torch.Tensor:
        """:meth:`SecretStreams.example_uniforms` of the shard rows ``rows`` [b]: float64
        [b, width] on the shard's device."""
        u = self.streams.example_uniforms(context, rows.cpu().numpy(), width)
        return torch.as_tensor(u, dtype=torch.float64, device=self.data.device)

    def minibatch_rows(self, batch_size: int) -> torch.Tensor:
        """Indices [batch_size] of shard rows drawn uniformly without replacement."""
        index = torch.randperm(self.size, generator=self.generator, device=self.data.device)
        return index[:batch_size]

    def minibatch(self, batch_size: int) -> torch.Tensor:
        """Rows of the shard drawn uniformly without replacement, shape [batch_size, d]."""
        return self.data[self.minibatch_rows(batch_size)]


@dataclass(frozen=True)
class ClientInfo:
    """What a server knows of a client that runs elsewhere: its ``id`` and the ``size`` it
    is weighted by (the run's nominal shard size: the server never sees the shard)."""

    id: str
    size: int


def new_client(party: str, data: torch.Tensor, deterministic_seed: int | None = None) -> Client:
    """A client holding ``data`` whose training and protocol streams come from
    ``SecretStreams(party, deterministic_seed)`` (OS entropy unless a seed is given)."""
    streams = SecretStreams(party, deterministic_seed)
    return Client(party, data, streams.torch("training", data.device),
                  protocol_rng=streams.numpy("protocol"), streams=streams)


def secret_randomness(deterministic: bool) -> str:
    """What a run's privacy.json says about where the parties' secret streams came from."""
    if deterministic:
        return ("INSECURE: derived from the published run seed (--insecure-deterministic); "
                "anyone with config.toml can replay DP noise and sampling, rounding and "
                "randomized t, so no privacy claim of this run holds")
    return "os-entropy: every party's secret streams are seeded from the OS CSPRNG"
