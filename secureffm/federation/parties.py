"""Parties of the in-process federation. A client owns its shard; the server owns no data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..protocols.crypto import Identity, KeyPair, new_key_pair
from .message import Payload

__all__ = ["Client"]


@dataclass
class Client:
    """One data silo.

    ``data``: the client's finite shard, shape [N, d], on the run's device.
    ``generator``: the client's own seeded random stream (mini-batches, source noise, t).
    ``inbox``: the last payload received per message kind.
    ``state``: the method's client-side objects (model replicas), set up by the method.
    ``identity``: the client's Ed25519 signing key; it signs every message the client sends.
    ``sealing``: the client's long-term X25519 key for sealed (end-to-end encrypted) messages.
    ``protocol_rng``: the client's stream for protocol randomness that is not key material
    (stochastic rounding), kept apart so a protocol never shifts the training stream.
    """

    id: str
    data: torch.Tensor
    generator: torch.Generator
    inbox: dict[str, Payload] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    identity: Identity = field(default_factory=Identity)
    sealing: KeyPair = field(default_factory=new_key_pair)
    protocol_rng: np.random.Generator = field(default_factory=np.random.default_rng)

    @property
    def size(self) -> int:
        return int(self.data.shape[0])

    def minibatch(self, batch_size: int) -> torch.Tensor:
        """Rows of the shard drawn uniformly without replacement, shape [batch_size, d]."""
        index = torch.randperm(self.size, generator=self.generator, device=self.data.device)
        return self.data[index[:batch_size]]
