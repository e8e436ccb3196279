"""Networks: velocity fields and dual potentials."""

from .mlp import PotentialMLP, VelocityMLP
from .params import flat_grad, flat_params, load_flat_params, set_flat_grad

__all__ = ["VelocityMLP", "PotentialMLP", "flat_params", "load_flat_params", "flat_grad",
           "set_flat_grad"]
