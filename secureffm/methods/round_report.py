"""What one training round of a method reports to its runner: :class:`RoundReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RoundReport"]


@dataclass
class RoundReport:
    """One round as the server saw it.

    ``aborted``: how many of the round's aggregations aborted (a count; the model stayed put for
    each). ``diagnostics``: name -> value the server may read about the round, each a mean over
    the clients counted in its aggregation, weighted as the update is; empty where it may read
    none (under DP the clients' losses are not privatized; on another engine they stay on the
    clients). FFM's names: ``loss``, the flow matching loss (mean squared velocity error, in
    squared data units per unit time), and GOT's ``dual``, the semi-dual objective
    f(x0) + f^c(x1) (in the cost's units, |x - y|^2 / 2)."""

    aborted: int = 0
    diagnostics: dict[str, float] = field(default_factory=dict)
