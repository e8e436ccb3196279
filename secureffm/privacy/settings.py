"""The values a DP mechanism runs with, resolved from a protocol's dp stage and the run config:
what methods receive (they never read the protocol)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DPSettings", "DistributedNoise"]


@dataclass(frozen=True)
class DPSettings:
    """The resolved DP parameters of a run (spec values overridden by the run config)."""

    clip: float
    delta: float
    target_epsilon: float | None
    noise_multiplier: float | None
    accountant: str
    noise: str = "local"
    colluders: int = 0


@dataclass(frozen=True)
class DistributedNoise:
    """What secure aggregation needs to add each client's share of distributed noise.

    ``multiplier``: tau; whenever the fewest honest clients survive, the sum's Skellam noise
    has std at least tau times the largest client's L2 sensitivity (in quantization levels).
    ``sensitivity``: client id -> L2 sensitivity of its payload in the payload's units (for
    DP-SGD, clip / E[b]). ``colluders``: clients whose noise the server may know.
    """

    multiplier: float
    sensitivity: dict[str, float]
    colluders: int = 0
