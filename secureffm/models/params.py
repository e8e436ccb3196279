"""Parameters and gradients as flat float32 vectors: the form in which they travel."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["flat_params", "load_flat_params", "flat_grad", "set_flat_grad"]


def flat_params(module: nn.Module) -> np.ndarray:
    """All parameters concatenated, shape [P], float32, on the CPU."""
    return nn.utils.parameters_to_vector(module.parameters()).detach().float().cpu().numpy()


def load_flat_params(module: nn.Module, vector: np.ndarray) -> None:
    """Inverse of :func:`flat_params`. The parameters get their own copy: a later in-place
    step on the module never writes back into ``vector`` (a received message, say)."""
    device = next(module.parameters()).device
    nn.utils.vector_to_parameters(torch.tensor(vector, device=device), module.parameters())


def flat_grad(module: nn.Module) -> np.ndarray:
    """Gradients concatenated in parameter order, shape [P]; a missing grad counts as zero."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in module.parameters()
    ]
    return torch.cat(parts).detach().float().cpu().numpy()


def set_flat_grad(module: nn.Module, vector: np.ndarray) -> None:
    """Write ``vector`` (shape [P]) into each parameter's ``.grad``."""
    flat = torch.as_tensor(vector)
    offset = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = flat[offset:offset + n].reshape(p.shape).to(device=p.device, dtype=p.dtype)
        offset += n
