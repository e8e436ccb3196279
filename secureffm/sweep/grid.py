"""A sweep file: a grid of methods x protocols x epsilons x seeds over one set of run settings.

```toml
root = "runs/sweep"      # run folders, sweep.csv, frontier.png (default runs/<file stem>)
workers = 2              # runs at a time, one process each (default 1)
attacks = ["name"]       # optional: attacks on each run's log (secureffm.audit.attacks)

[grid]
methods = ["vanilla", "got"]
protocols = ["dp", "dp-secagg"]
epsilons = [1, 8, inf]   # target epsilon per client; inf: the protocol without its dp stage
seeds = [0, 1, 2]        # default [0]

[run]                    # any run setting (secureffm run --help) but those the grid sets
rounds = 1000
nfe = [2, 32]
```

Everything is checked when the file is read, before any run starts: an unknown key, method or
protocol, an epsilon <= 0, or a cell that cannot run raises :class:`ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import METHODS, RunConfig, config_from_dict, read_toml
from ..errors import ConfigError, SecureFFMError
from ..protocols.protocol import load_protocol, without_dp
from ..specs import check_keys

__all__ = ["SweepSpec", "Cell", "load_sweep", "sweep_from_dict", "smoke_spec", "SMOKE"]

# --smoke: the smallest runs that still go through every step of a sweep.
SMOKE = {"rounds": 2, "eval_samples": 100, "batch_size": 64, "trajectories": 20}
# Run settings each cell sets itself (the grid, or the sweep's folder layout).
SET_BY_SWEEP = ("method", "protocol", "target_epsilon", "seed", "out", "overwrite", "progress",
                "pin_to", "resume")
_TOP = {"grid", "run", "workers", "root", "attacks"}
_GRID = {"methods", "protocols", "epsilons", "seeds"}


@dataclass(frozen=True)
class Cell:
    """One run of the grid: ``protocol`` as asked; ``epsilon`` inf runs :attr:`protocol_run`."""

    method: str
    protocol: str
    epsilon: float
    seed: int

    @property
    def label(self) -> str:
        """The epsilon as the CSV and the folder name write it: ``8``, ``0.5`` or ``inf``."""
        return "inf" if math.isinf(self.epsilon) else f"{self.epsilon:g}"

    @property
    def name(self) -> str:
        return f"{self.method}-{Path(self.protocol).stem}-e{self.label}-s{self.seed}"

    @property
    def protocol_run(self) -> str:
        """The protocol the run uses: the asked one, or at epsilon inf the shipped one that
        runs its stages but dp (:func:`~secureffm.protocols.protocol.without_dp`)."""
        return (without_dp(self.protocol) or self.protocol) if math.isinf(self.epsilon) \
            else self.protocol


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file. ``run``: the base settings every cell starts from."""

    methods: tuple[str, ...]
    protocols: tuple[str, ...]
    epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    run: RunConfig
    root: Path
    workers: int = 1
    attacks: tuple[str, ...] = ()

    def cells(self) -> list[Cell]:
        """Every cell, seed by seed (a first seed's whole grid finishes early)."""
        return [Cell(m, p, e, s) for s in self.seeds for e in self.epsilons
                for m in self.methods for p in self.protocols]

    def config(self, cell: Cell) -> RunConfig:
        """The run settings of ``cell``; runs that attacks read keep their payloads."""
        return dataclasses.replace(
            self.run, method=cell.method, protocol=cell.protocol_run, seed=cell.seed,
            target_epsilon=0.0 if math.isinf(cell.epsilon) else cell.epsilon,
            out=str(self.root / cell.name), overwrite=True, progress=False,
            keep_payloads=self.run.keep_payloads or bool(self.attacks))


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Read the sweep file at ``path``; ``overrides`` replace its top-level keys and, for the
    ``grid`` and ``run`` tables, single keys inside them (a script's options)."""
    path = Path(path)
    values = read_toml(path, "sweep")
    for key, value in (overrides or {}).items():
        if key in ("grid", "run"):
            values[key] = {**values.get(key, {}), **value}
        else:
            values[key] = value
    values.setdefault("root", str(Path("runs") / path.stem))
    return sweep_from_dict(values, str(path))


def sweep_from_dict(values: dict[str, Any], where: str = "sweep") -> SweepSpec:
    """Check a parsed sweep file (see the module docstring) and build its spec."""
    check_keys(values, _TOP, ("grid", "root"), where, ConfigError)
    grid = _table(values, "grid", where)
    check_keys(grid, _GRID, ("methods", "protocols", "epsilons"), f"{where} [grid]", ConfigError)
    methods = _names(grid, "methods", where)
    protocols = _names(grid, "protocols", where)
    epsilons = _epsilons(grid.get("epsilons"), where)
    seeds = grid.get("seeds", [0])
    if not _list_of(seeds, int) or any(s < 0 for s in seeds):
        raise ConfigError(f"{where} [grid] seeds = {seeds!r}: list seeds >= 0, e.g. [0, 1, 2]")
    attacks = values.get("attacks", [])
    if not isinstance(attacks, list) or not all(isinstance(a, str) and a for a in attacks):
        raise ConfigError(f"{where} attacks = {attacks!r}: list attack names, e.g. [\"name\"]")
    workers = values.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"{where} workers = {workers!r}: give a positive number of processes")
    if not isinstance(values["root"], str) or not values["root"]:
        raise ConfigError(f"{where} root = {values['root']!r}: give a folder for the runs")
    spec = SweepSpec(methods, protocols, epsilons, tuple(seeds), _base(values, where),
                     Path(values["root"]), workers, tuple(attacks))
    _check_cells(spec, where)
    return spec


def smoke_spec(spec: SweepSpec, root: Path) -> SweepSpec:
    """The grid with tiny runs (:data:`SMOKE`), its first seed and one worker, under ``root``:
    checks that a sweep goes through; its numbers are not results."""
    return dataclasses.replace(spec, run=dataclasses.replace(spec.run, **SMOKE),
                               seeds=spec.seeds[:1], workers=1, root=Path(root))


def _table(values: dict, key: str, where: str) -> dict:
    table = values.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: {key} must be a table ([{key}] with keys below it)")
    return table


def _list_of(value: Any, kind: type) -> bool:
    return (isinstance(value, list) and len(value) > 0 and len(set(value)) == len(value)
            and all(isinstance(v, kind) and not isinstance(v, bool) for v in value))


def _names(grid: dict, key: str, where: str) -> tuple[str, ...]:
    if not _list_of(grid[key], str):
        raise ConfigError(f"{where} [grid] {key} = {grid[key]!r}: list distinct names")
    return tuple(grid[key])


def _epsilons(value: Any, where: str) -> tuple[float, ...]:
    numbers = isinstance(value, list) and all(
        isinstance(e, (int, float)) and not isinstance(e, bool) for e in value)
    if not numbers or not value or len(set(value)) != len(value) \
            or not all(e > 0 for e in value):  # NaN fails e > 0 too
        raise ConfigError(f"{where} [grid] epsilons = {value!r}: list distinct target epsilons "
                          "> 0 per client, inf for no DP, e.g. [1, 8, inf]")
    return tuple(float(e) for e in value)


def _base(values: dict, where: str) -> RunConfig:
    run = _table(values, "run", where)
    taken = [k for k in SET_BY_SWEEP if k in run]
    if taken:
        raise ConfigError(f"{where} [run] {taken[0]}: each cell sets it (the grid or the "
                          "sweep's folders); remove it from [run]")
    try:
        return config_from_dict(run)
    except ConfigError as err:
        raise ConfigError(f"{where} [run]: {err}") from None


def _check_cells(spec: SweepSpec, where: str) -> None:
    """Every method and protocol known, every epsilon meaningful for its protocol, every
    cell's run settings valid."""
    for method in spec.methods:
        if method not in METHODS:
            raise ConfigError(f"{where} [grid] methods: {method!r} is not a flow-matching "
                              f"method a sweep measures (W2 or FID); choose from "
                              f"{', '.join(METHODS)}")
    finite = [e for e in spec.epsilons if not math.isinf(e)]
    for name in spec.protocols:
        try:
            has_dp = load_protocol(name).dp is not None
        except SecureFFMError as err:
            raise ConfigError(f"{where} [grid] protocols: {err}") from None
        if finite and not has_dp:
            raise ConfigError(f"{where} [grid] protocols: {name!r} has no dp stage, so epsilon "
                              f"{finite[0]:g} means nothing; list its DP version (e.g. dp or "
                              f"dp-secagg), whose epsilon = inf cells run without DP")
        if has_dp and len(finite) < len(spec.epsilons) and without_dp(name) is None:
            raise ConfigError(f"{where} [grid] protocols: epsilon inf runs the shipped protocol "
                              f"with {name!r}'s stages but its dp stage, and {name!r} has no "
                              "known counterpart (none, or more than one, with equal "
                              "parameters); drop inf from epsilons or sweep the no-DP protocol "
                              "separately")
    names = [cell.name for cell in spec.cells()]
    if len(set(names)) < len(names):
        raise ConfigError(f"{where} [grid] protocols: two protocols share a file name, so their "
                          "cells would share run folders; rename one spec file")
    for cell in spec.cells():
        try:
            spec.config(cell)  # the RunConfig checks itself
        except ConfigError as err:
            raise ConfigError(f"{where}: cell {cell.name}: {err}") from None
