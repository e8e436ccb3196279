"""Method families by name: which runner trains each ``method`` a run config names.

A :class:`Family` is a runner and the methods it trains. The runner is named as
``module:function`` and imported when a run of the family starts, so that ``secureffm.config``
and the command line load without torch (secureffm/names.py). Built in: FFM (FFM-vanilla, LOT,
GOT and the centralized baselines) and DCFM with its baselines; FedWAD runs from its own
config (``secureffm fedwad``). :func:`register` adds a family with no other file changed (the
toy family of tests/runs/test_method_family.py); an unknown method is refused naming the known
ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from .errors import ConfigError
from .spelling import did_you_mean

__all__ = ["Family", "FFM", "DCFM", "FAMILIES", "register", "known_methods", "family_of"]


@dataclass(frozen=True)
class Family:
    """A method family: its ``name``, the ``methods`` (``RunConfig.method`` values) it trains,
    and its ``runner``, ``module:function`` taking (the run config, ``connect``: the channel to
    clients that run elsewhere, None in-process) and returning the run's
    :class:`~secureffm.runs.scaffold.RunResult`."""

    name: str
    methods: tuple[str, ...]
    runner: str

    def run(self, config, connect=None) -> Any:
        """Train and evaluate ``config`` with the family's runner."""
        module, function = self.runner.split(":")
        return getattr(import_module(module), function)(config, connect)


FFM = Family("ffm", ("vanilla", "lot", "got", "icfm", "otcfm"), "secureffm.runs.ffm:run_ffm")
# DCFM and its baselines run on conditional data sets only (secureffm/runs/dcfm.py).
DCFM = Family("dcfm", ("dcfm-a", "dcfm-b", "fedflow", "fedflow-l", "ddm", "ddm-l"),
              "secureffm.runs.dcfm:run_dcfm")
FAMILIES: dict[str, Family] = {FFM.name: FFM, DCFM.name: DCFM}


def register(family: Family) -> None:
    """Add ``family``; a name or a method another family holds is refused."""
    taken = set(family.methods) & set(known_methods())
    if family.name in FAMILIES or taken:
        raise ConfigError(f"method family {family.name!r}: the name or the methods "
                          f"{sorted(taken)} are taken; choose others")
    FAMILIES[family.name] = family


def known_methods() -> tuple[str, ...]:
    """Every method a registered family trains, in registration order."""
    return tuple(m for family in FAMILIES.values() for m in family.methods)


def family_of(method: str) -> Family:
    """The family that trains ``method``; ConfigError naming the known methods."""
    for family in FAMILIES.values():
        if method in family.methods:
            return family
    raise ConfigError(f"method = {method!r}: choose one of {', '.join(known_methods())}"
                      + did_you_mean(method, known_methods()))
