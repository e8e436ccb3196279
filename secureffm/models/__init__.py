"""Networks: velocity fields and dual potentials."""

from .mlp import PotentialMLP, VelocityMLP
from .params import flat_grad, flat_params, load_flat_params, set_flat_grad
from .unet import UNet

__all__ = ["VelocityMLP", "PotentialMLP", "UNet", "flat_params", "load_flat_params", "flat_grad",
           "set_flat_grad"]
