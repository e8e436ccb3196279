"""Gradients of per-example losses: plain, or DP-SGD through Opacus' ghost clipping.

Both take per-example losses [b] (each term depending on one data example, computed with
``forward_module``) and the batch size b, and return a flat float32 gradient [P]: the gradient of
sum_i loss_i / b for :class:`PlainGradient`; for :class:`DPGradient`,
(sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / E[b], the DP-SGD estimate with Poisson sampling of
expected batch size E[b] (Abadi et al. 2016).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn

from ..errors import ConfigError
from ..models.params import flat_grad

__all__ = ["PlainGradient", "DPGradient", "poisson_batch"]


def poisson_batch(data: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Each row of ``data`` [N, ...] independently with probability ``rate`` (the sampling
    that privacy amplification by subsampling assumes). Returns [b, ...], b ~ Bin(N, rate)."""
    keep = torch.rand(data.shape[0], generator=generator, device=data.device) < rate
    return data[keep]


class PlainGradient:
    """The mean of the per-example losses, differentiated."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.forward_module = model

    def __call__(self, losses: torch.Tensor, examples: int) -> np.ndarray:
        self.model.zero_grad(set_to_none=True)
        (losses.sum() / max(examples, 1)).backward()
        return flat_grad(self.model)


class DPGradient:
    """DP-SGD on ``model``: per-example clipping to ``clip`` (L2, all parameters together) and
    Gaussian noise of std ``noise_multiplier * clip``, through Opacus.

    ``mode``: ``ghost`` (ghost clipping: two backward passes, no per-example gradients stored;
    each example must be one row of a single forward pass) or ``hooks`` (per-example gradients
    accumulated over several forward passes whose row j belongs to example j: for losses that
    evaluate the model at several points per example).
    ``expected_batch``: E[b] = sample rate x shard size, the divisor of the noisy sum.
    ``generator``: the noise source; it must be secret (not derived from a published seed).
    Layers Opacus cannot handle are refused with Opacus' own explanation.
    """

    def __init__(self, model: nn.Module, clip: float, noise_multiplier: float,
                 expected_batch: float, generator: torch.Generator, mode: str = "ghost"):
        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ConfigError("this model cannot be trained with DP-SGD: "
                              + "; ".join(str(e) for e in errors))
        self.model = model
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.expected_batch = expected_batch
        self.generator = generator
        self.mode = mode
        self.params = [p for p in model.parameters() if p.requires_grad]
        if mode == "ghost":
            self.forward_module = GradSampleModuleFastGradientClipping(
                model, max_grad_norm=clip, use_ghost_clipping=True, loss_reduction="sum")
        elif mode == "hooks":
            self.forward_module = GradSampleModule(model, batch_first=True, loss_reduction="sum")
            self.optimizer = DPOptimizer(
                torch.optim.SGD(self.params, lr=0.0), noise_multiplier=noise_multiplier,
                max_grad_norm=clip, expected_batch_size=int(round(expected_batch)),
                loss_reduction="sum", generator=generator)
        else:
            raise ConfigError(f"DP gradient mode {mode!r} is unknown; use 'ghost' or 'hooks'")

    def __call__(self, losses: torch.Tensor, examples: int) -> np.ndarray:
        """``examples`` is unused: the divisor is E[b], which does not depend on the data."""
        if self.mode == "hooks":
            return self._hooks(losses)
        return self._ghost(losses)

    def _ghost(self, losses: torch.Tensor) -> np.ndarray:
        """Opacus' ghost clipping: a first backward gives each example's gradient norm (hooks),
        the clipped sum is the gradient of sum_i min(1, C / |g_i|) loss_i; then one draw of
        N(0, sigma^2 C^2 I) over all P parameters."""
        for p in self.params:
            p.grad = None
        if losses.numel():
            with warnings.catch_warnings():  # Opacus' hooks fire on outputs: expected here
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                losses.sum().backward(retain_graph=True)
                for p in self.params:
                    p.grad = None
                with torch.no_grad():
                    coefficients = self.forward_module.get_clipping_coef().to(losses.device)
                self.forward_module.disable_hooks()
                try:
                    (coefficients * losses).sum().backward()
                finally:
                    self.forward_module.enable_hooks()
        total = flat_grad(self.model)
        noise = torch.normal(0.0, self.noise_multiplier * self.clip, (total.size,),
                             generator=self.generator, device=self.generator.device)
        return (total + noise.cpu().numpy()) / np.float32(self.expected_batch)

    def _hooks(self, losses: torch.Tensor) -> np.ndarray:
        """Opacus' per-example gradients (summed over forward passes), clipped and noised by
        its DPOptimizer."""
        self.optimizer.zero_grad(set_to_none=True)
        if losses.numel() == 0:  # an empty Poisson batch: the noise alone
            std = self.noise_multiplier * self.clip
            for p in self.params:
                p.grad = torch.normal(0.0, std, p.shape, generator=self.generator,
                                      device=p.device)
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                losses.sum().backward()
            self.optimizer.pre_step()
        return flat_grad(self.model) / np.float32(self.expected_batch)
