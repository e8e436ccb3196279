"""Metrics: exact W2, sampling at a given NFE, straightness, evaluation reports, and a client's
evaluation of synthetic rows on its own held-out rows (tabular)."""

from .evaluate import EvalReport, evaluate_flow, potential_health
from .sampling import integrate, straightness, trajectories
from .tabular import TableReport, evaluate_table
from .w2 import gaussian_w2, w2, w2_many

__all__ = ["EvalReport", "evaluate_flow", "potential_health", "integrate", "straightness",
           "trajectories", "w2", "w2_many", "gaussian_w2", "TableReport", "evaluate_table"]
