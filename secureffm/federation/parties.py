"""Parties of the in-process federation. A client owns its shard; the server owns no data.

A party's private random streams (which mini-batches it draws, its source noise and times, its
DP sampling and noise, stochastic rounding, FedWAD's randomized t and support noise) must be
unpredictable to every other party, so :class:`SecretStreams` seeds them from the OS CSPRNG.
The run seed is published in config.toml and drives only public choices (data generation,
partition, initial weights, graphs). Only ``--insecure-deterministic`` derives the secret
streams from the run seed, for reproducible debugging, and the run records that it did.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..protocols.crypto import Identity, KeyPair, new_key_pair
from .message import Payload

__all__ = ["Client", "SecretStreams", "new_client", "secret_randomness", "STREAM_PURPOSES"]

# What each purpose seeds: "training": mini-batches (without DP), source noise x0, times t,
# DCFM's masks and routes; "dp": Poisson sampling and Gaussian noise of DP-SGD; "protocol":
# stochastic rounding, randomized t and support-point noise.
STREAM_PURPOSES = ("training", "dp", "protocol")


@dataclass(frozen=True)
class SecretStreams:
    """The seeds of one party's private random streams.

    ``seed``: None (the default) draws each stream's seed from the OS CSPRNG (``secrets``: 64
    bits for a torch generator, the most it takes; 128 for numpy). An integer, only under
    ``--insecure-deterministic``, derives it as SHA-256("secureffm-stream|seed|party|purpose"):
    reproducible, and replayable by anyone who reads config.toml.
    """

    party: str = ""
    seed: int | None = None

    @property
    def deterministic(self) -> bool:
        return self.seed is not None

    def seed_for(self, purpose: str, bits: int) -> int:
        """A ``bits``-bit seed for ``purpose`` (one of :data:`STREAM_PURPOSES`)."""
        if purpose not in STREAM_PURPOSES:
            raise ValueError(f"unknown stream purpose {purpose!r}; use one of {STREAM_PURPOSES}")
        if self.seed is None:
            return secrets.randbits(bits)
        digest = hashlib.sha256(f"secureffm-stream|{self.seed}|{self.party}|{purpose}".encode())
        return int.from_bytes(digest.digest(), "big") >> (256 - bits)

    def torch(self, purpose: str, device: torch.device | str = "cpu") -> torch.Generator:
        """A torch generator on ``device`` for ``purpose``."""
        return torch.Generator(device=device).manual_seed(self.seed_for(purpose, 64))

    def numpy(self, purpose: str) -> np.random.Generator:
        """A numpy generator for ``purpose``."""
        return np.random.default_rng(self.seed_for(purpose, 128))


@dataclass
class Client:
    """One data silo.

    ``data``: the client's finite shard, shape [N, d], on the run's device.
    ``generator``: the client's training stream (mini-batches, source noise, t).
    ``inbox``: the last payload received per message kind.
    ``state``: the method's client-side objects (model replicas), set up by the method.
    ``identity``: the client's Ed25519 signing key; it signs every message the client sends.
    ``sealing``: the client's long-term X25519 key for sealed (end-to-end encrypted) messages.
    ``protocol_rng``: the client's stream for protocol randomness that is not key material
    (stochastic rounding, randomized t), kept apart so a protocol never shifts training.
    ``streams``: where the client's secret streams come from (the DP stream is drawn from it).
    """

    id: str
    data: torch.Tensor
    generator: torch.Generator
    inbox: dict[str, Payload] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    identity: Identity = field(default_factory=Identity)
    sealing: KeyPair = field(default_factory=new_key_pair)
    protocol_rng: np.random.Generator = field(default_factory=np.random.default_rng)
    streams: SecretStreams = field(default_factory=SecretStreams)

    @property
    def size(self) -> int:
        return int(self.data.shape[0])

    def minibatch(self, batch_size: int) -> torch.Tensor:
        """Rows of the shard drawn uniformly without replacement, shape [batch_size, d]."""
        index = torch.randperm(self.size, generator=self.generator, device=self.data.device)
        return self.data[index[:batch_size]]


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
