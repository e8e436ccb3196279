"""The runners: one per family (FFM, DCFM, FedWAD) over one shared scaffold (the run folder,
its pin, privacy.json). ``run(config)`` picks the family by method."""

import torch

from ..config import DCFM_METHODS, RunConfig
from .dcfm import load_dcfm, run_dcfm
from .fedwad import FedWADRun, FedWADRunResult, run_fedwad
from .ffm import load_velocity, run_ffm
from .scaffold import RunResult

__all__ = ["run", "run_ffm", "run_dcfm", "run_fedwad", "RunResult", "FedWADRun",
           "FedWADRunResult", "load_velocity", "load_dcfm"]


def run(config: RunConfig) -> RunResult:
    """Train and evaluate as ``config`` says (DCFM methods on conditional data, else FFM);
    write everything to the run folder."""
    torch.set_num_threads(config.threads)
    if config.engine == "flower":
        from .flower_server import run_on_flower  # Flower is an optional extra

        return run_on_flower(config)
    return run_dcfm(config) if config.method in DCFM_METHODS else run_ffm(config)
