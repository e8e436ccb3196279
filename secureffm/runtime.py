"""Device selection and public random generators."""

from __future__ import annotations

import torch

from .errors import ConfigError

__all__ = ["resolve_device", "party_generator"]


def resolve_device(name: str) -> torch.device:
    """Map ``auto``/``cpu``/``cuda``/``cuda:N`` to a torch device; ``auto`` prefers CUDA."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device = {name!r} but CUDA is not available here; use 'auto' or 'cpu'")
        return torch.device(name)
    raise ConfigError(f"device = {name!r} is unknown; use 'auto', 'cpu' or 'cuda'")


def party_generator(seed: int, party_index: int, device: torch.device) -> torch.Generator:
    """A generator seeded from the public run seed, for public choices only (the evaluator's
    samples, the server's own draws): index 0 is the server, clients count from 1. A party's
    private streams come from :class:`~secureffm.federation.parties.SecretStreams` instead.

    Seeds are spread with a large odd multiplier so parties never share a stream.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + party_index * 7_919) % (2**63 - 1))
    return generator
