"""Methods: federated flow matching and its centralized baselines."""

from .centralized import CentralizedFlowMatching
from .couplings import (
    ExactOTCoupling,
    IndependentCoupling,
    SemiDualCoupling,
    half_squared_cost,
    sample_from_plan,
    semidual_assignment,
)
from .ffm import FederatedFlowMatching, client_weights, velocity_gradient
from .flow_matching import PathSample, flow_matching_loss, sample_path
from .semidual import c_transform, semidual_value

FEDERATED = ("vanilla", "lot", "got")
CENTRALIZED = ("icfm", "otcfm")

__all__ = ["FederatedFlowMatching", "CentralizedFlowMatching", "IndependentCoupling",
           "ExactOTCoupling", "SemiDualCoupling", "semidual_assignment", "sample_from_plan",
           "half_squared_cost", "velocity_gradient", "client_weights", "PathSample",
           "sample_path", "flow_matching_loss", "c_transform", "semidual_value", "FEDERATED",
           "CENTRALIZED"]
