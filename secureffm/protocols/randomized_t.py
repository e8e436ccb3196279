"""The ``randomized-t`` stage: FedWAD's client-side protections of interpolating measures.

Each client draws its own t ~ U(t_low, t_high) for every interpolation and never sends it; the
range keeps t away from 0, where a client's measure would be its data (or its local means), and
its width is what the server does not know: knowing t it could invert the step and recover them.
Clients send their distances to the server only at the last iteration (with a distance per
iteration the server could compute every t), and may add N(0, noise_std^2 I) to every support
point they return. The stage sends no messages of its own: it changes what a client computes,
and the log names it on every measure message (docs/fedwad.md says what the server can still
learn).

Spec keys: ``protects`` (``["measure"]``), ``t_low``, ``t_high`` (0 < t_low < t_high < 1),
``noise_std`` (default 0).
"""

from __future__ import annotations

import math

from ..errors import ProtocolError
from .registry import check_protects, check_table
from .stage import StageDefaults

__all__ = ["RandomizedTStage"]

_KEYS = {"stage", "protects", "t_low", "t_high", "noise_std"}


class RandomizedTStage(StageDefaults):
    """Marks measure messages computed at a private random t; see the module docstring."""

    name = "randomized-t"
    role = "client"
    phases = ()
    can_protect = frozenset({"measure"})
    def __init__(self, protects: tuple[str, ...], t_low: float, t_high: float,
                 noise_std: float = 0.0):
        self.protects = protects
        self.t_low = t_low
        self.t_high = t_high
        self.noise_std = noise_std

    @property
    def t_range(self) -> tuple[float, float]:
        return (self.t_low, self.t_high)

    @classmethod
    def from_table(cls, table: dict, source: str) -> RandomizedTStage:
        where = f"{source} (stage 'randomized-t')"
        check_table(table, _KEYS, ("protects", "t_low", "t_high"), where)
        protects = tuple(table["protects"])
        check_protects(protects, cls, where, "a random interpolation time only hides FedWAD's "
                       "interpolating measures")
        if not protects:
            raise ProtocolError(f"{where}: protects is empty; use protects = [\"measure\"]")
        t_low, t_high = (_number(table[k], k, where) for k in ("t_low", "t_high"))
        if not 0.0 < t_low < t_high < 1.0:
            raise ProtocolError(f"{where}: t_low = {t_low}, t_high = {t_high}; use "
                                "0 < t_low < t_high < 1 (t near 0 makes a client's measure its "
                                "data; equal ends make t public)")
        noise_std = _number(table.get("noise_std", 0.0), "noise_std", where)
        if noise_std < 0:
            raise ProtocolError(f"{where}: noise_std = {noise_std}; give 0 or a positive "
                                "standard deviation")
        return cls(protects, t_low, t_high, noise_std)

    def validate_for(self, clients: int) -> None:
        """Each client draws its own t: any number of clients works."""

    def claim(self, kind: str) -> tuple[str, str]:
        return (f"randomized t in [{self.t_low}, {self.t_high}] and distances only at the "
                "end: the server does not know t. Not a formal guarantee (docs/fedwad.md "
                "measures what it can still reconstruct)",
                "t is drawn from the client's secret stream")


def _number(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{where}: {key} = {value!r}; give a finite number")
    return float(value)
