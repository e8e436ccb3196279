"""The values a DP mechanism runs with, resolved from a protocol's dp stage and the run config:
what methods receive (they never read the protocol)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DPSettings", "DistributedNoise", "NoiseGeometry", "GeodesicPrivacy"]


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
    """What secure aggregation needs to add each client's share of distributed noise: the
    server's plan, and each client's own (which it derives from its own settings and checks
    the server's share variance against).

    ``multiplier``: tau; whenever the fewest honest clients survive, the sum's Skellam noise
    has std at least tau times the largest client's L2 sensitivity (in quantization levels).
    ``sensitivity``: client id -> L2 sensitivity of its payload in the payload's units (for
    DP-SGD, clip / E[b]). ``colluders``: clients whose noise the server may know.
    """

    multiplier: float
    sensitivity: dict[str, float]
    colluders: int = 0


@dataclass(frozen=True)
class NoiseGeometry:
    """Distributed Skellam noise in quantization levels for one kind of update.

    ``sensitivity``: client id -> (L2, L1) sensitivity of its quantized input, in levels;
    ``honest``: the fewest honest clients whose inputs (and noise shares) reach a sum the
    server can unmask: the secure-aggregation threshold minus the colluders.
    """

    sensitivity: dict[str, tuple[float, float]]
    honest: int

    def sum_variance(self, multiplier: float) -> float:
        """Noise variance per coordinate that the sum carries at least: (tau * max L2)^2."""
        return (multiplier * max(l2 for l2, _ in self.sensitivity.values())) ** 2

    def share_variance(self, multiplier: float) -> float:
        """Variance each client adds so that ``honest`` shares sum to :meth:`sum_variance`."""
        return self.sum_variance(multiplier) / self.honest


@dataclass(frozen=True)
class GeodesicPrivacy:
    """FedWAD's client-side protections of interpolating measures (the ``randomized-t``
    stage): each client draws its own t ~ U(``t_low``, ``t_high``), may add N(0, noise_std^2)
    to every support point, and sends distances only at the last iteration."""

    t_low: float
    t_high: float
    noise_std: float = 0.0
