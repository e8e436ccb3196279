"""Methods: federated flow matching and its centralized baselines."""

from .centralized import CentralizedFlowMatching
from .couplings import ExactOTCoupling, IndependentCoupling, SemiDualCoupling, sample_from_plan
from .ffm import FederatedFlowMatching, client_weights, velocity_gradient
from .flow_matching import PathSample, flow_matching_loss, sample_path

FEDERATED = ("vanilla", "lot", "got")
CENTRALIZED = ("icfm", "otcfm")

__all__ = ["FederatedFlowMatching", "CentralizedFlowMatching", "IndependentCoupling",
           "ExactOTCoupling", "SemiDualCoupling", "sample_from_plan", "velocity_gradient",
           "client_weights", "PathSample", "sample_path", "flow_matching_loss", "FEDERATED",
           "CENTRALIZED"]
