"""Sweeps: a grid of methods x protocols x epsilons x seeds from one TOML file, resumable, with
sweep.csv and the privacy-utility frontier (``secureffm sweep FILE``; docs/sweep.md).

:mod:`.grid` reads and checks the file, :mod:`.execute` runs the cells not finished earlier,
:mod:`.frontier` reads each run folder into a row and draws the frontier.
"""

from .execute import SweepResult, is_finished, run_sweep
from .frontier import plot_frontier, summary_table
from .grid import SMOKE, Cell, SweepSpec, load_sweep, smoke_spec, sweep_from_dict

__all__ = ["SweepSpec", "Cell", "SweepResult", "load_sweep", "sweep_from_dict", "smoke_spec",
           "run_sweep", "is_finished", "plot_frontier", "summary_table", "SMOKE"]
