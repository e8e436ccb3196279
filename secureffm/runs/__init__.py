"""The runners: one per family (FFM, DCFM, FedWAD) over one shared scaffold (the run folder,
its pin, privacy.json). ``run(config)`` picks the family by method
(:func:`secureffm.families.family_of`).

The runners are imported when first used: a Flower client's process (one per message in a
deployment) imports :mod:`.flower_node` through this package and needs none of the others
(about 2 s of imports per message on a 2-core machine, measured).
"""

import torch

from ..config import RunConfig
from ..families import family_of
from ..lazy import exports

__all__ = ["run", "run_ffm", "run_dcfm", "run_fedwad", "RunResult", "FedWADRun",
           "FedWADRunResult", "load_velocity", "load_dcfm"]

# exported name -> the module of this package that defines it
_WHERE = {"run_ffm": "ffm", "load_velocity": "ffm", "run_dcfm": "dcfm", "load_dcfm": "dcfm",
          "run_fedwad": "fedwad", "FedWADRun": "fedwad", "FedWADRunResult": "fedwad",
          "RunResult": "scaffold"}


__getattr__ = exports(__name__, _WHERE)


def run(config: RunConfig):
    """Train and evaluate as ``config`` says, with the runner of its method's family
    (:mod:`secureffm.families`); write everything to the run folder, with the summary in
    metrics.json (:mod:`.summary`); returns its :class:`~.scaffold.RunResult`."""
    from .preflight import preflight
    from .summary import add_summary

    # before any file is written; a start refused later is undone (scaffold.starting_run_folder)
    preflight(config)
    torch.set_num_threads(config.threads)
    if config.engine == "flower":
        from .flower_server import run_on_flower  # Flower is an optional extra

        result = run_on_flower(config)
    else:
        result = family_of(config.method).run(config)
    add_summary(result.out, result.metrics, result.pin)
    return result
