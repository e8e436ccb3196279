"""Gradients of per-example losses: plain, or DP-SGD (per-example clipping and Gaussian noise).

Both take per-example losses [b] (each term depending on one data example, computed with
``forward_module``) and the batch size b, and return a flat float32 gradient [P]: the gradient of
sum_i loss_i / b for :class:`PlainGradient`; for :class:`DPGradient`,
(sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / E[b], the DP-SGD estimate with Poisson sampling of
expected batch size E[b] (Abadi et al. 2016).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from ..models.params import flat_grad

__all__ = ["PlainGradient", "DPGradient", "Deferred", "poisson_batch", "poisson_rows",
           "poisson_rate"]


def poisson_rate(batch_size: int, nominal_size: float) -> float:
    """DP-SGD's sampling rate q = batch_size / nominal_size, at most 1. ``nominal_size`` is a
    public shard size, never a client's true one (which adding an example changes)."""
    return min(1.0, batch_size / nominal_size)


def poisson_rows(count: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices [b] of rows 0..count-1, each kept independently with probability ``rate`` (the
    sampling that privacy amplification by subsampling assumes); b ~ Bin(count, rate)."""
    keep = torch.rand(count, generator=generator, device=generator.device) < rate
    return torch.nonzero(keep).squeeze(1)


def poisson_batch(data: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """The rows of ``data`` [N, ...] that :func:`poisson_rows` keeps, [b, ...]."""
    return data[poisson_rows(data.shape[0], rate, generator).to(data.device)]


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

    ``mode``: ``auto`` (``linear`` when every parameter sits in an ``nn.Linear`` layer, else
    ``ghost``), ``linear`` (one backward to the layers' outputs; each example's norm and the
    clipped sum from the layers' inputs and output gradients, exactly; every forward pass that
    needs gradients runs on [B, d] rows whose row j belongs to example j, once or several times
    per loss, e.g. f(x0) and f(x*) in GOT's dual loss), ``ghost`` (Opacus' ghost clipping: two
    backward passes; each example must be one row of a single forward pass) or ``hooks``
    (Opacus' per-example gradients accumulated over several forward passes whose row j belongs to
    example j; for models with other layers). On GOT's dual potential (two passes per loss,
    batch 256, one thread) ``hooks`` ran at 14.5x the plain step and ``linear`` at 1.54x, with
    clipped sums equal to 1e-6 (docs/benchmarks.md, "The README's main job").
    ``expected_batch``: E[b] = sample rate x shard size, the divisor of the noisy sum.
    ``generator``: the noise source; it must be secret (not derived from a published seed).
    Layers Opacus cannot handle are refused with Opacus' own explanation.
    """

    def __init__(self, model: nn.Module, clip: float, noise_multiplier: float,
                 expected_batch: float, generator: torch.Generator, mode: str = "auto"):
        from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizer
        from opacus.validators import ModuleValidator

        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ConfigError("this model cannot be trained with DP-SGD: "
                              + "; ".join(str(e) for e in errors))
        self.model = model
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.expected_batch = expected_batch
        self.generator = generator
        self.params = [p for p in model.parameters() if p.requires_grad]
        if mode == "auto":
            mode = "linear" if _linear_only(model) else "ghost"
        self.mode = mode
        if mode == "linear":
            if not _linear_only(model):
                raise ConfigError("DP gradient mode 'linear' needs a model whose parameters all "
                                  "sit in nn.Linear layers; use 'ghost' or 'hooks'")
            self.forward_module = model
            self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
            self._seen: dict[nn.Linear, list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for layer in self.layers:
                layer.register_forward_hook(self._capture)
        elif mode == "ghost":
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
        if self.mode == "linear":
            return self._linear(losses)
        return self._ghost(losses)

    def _capture(self, layer: nn.Module, inputs: tuple[torch.Tensor, ...],
                 output: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            if inputs[0].dim() != 2:
                raise ConfigError("DP gradient mode 'linear' needs [B, d] inputs to every Linear "
                                  "layer; use 'ghost'")
            self._seen.setdefault(layer, []).append((inputs[0].detach(), output))

    def _linear(self, losses: torch.Tensor) -> np.ndarray:
        """Example i's gradient in layer l is sum_f g_lfi a_lfi^T (weight) and sum_f g_lfi (bias)
        over the layer's forward passes f, with a_lfi its input and g_lfi the loss gradient at its
        output, so |g_i|^2 = sum_l sum_{f,f'} (g_lfi . g_lf'i) (a_lfi . a_lf'i + 1) and
        sum_i c_i g_i = sum_f (c * G_lf)^T A_lf per layer (Goodfellow 2015 for one pass; Opacus'
        Linear norm sampler computes the same norms). One backward."""
        seen, self._seen = self._seen, {}
        for p in self.params:
            p.grad = None
        layers = [m for m in self.layers if m in seen]
        if losses.numel() and layers:
            rows = {len(a) for m in layers for a, _ in seen[m]}
            if rows != {len(losses)}:
                raise ConfigError(f"DP gradient mode 'linear': Linear layers ran on {sorted(rows)} "
                                  f"rows for {len(losses)} per-example losses; every pass with "
                                  "gradients needs row j = example j (use 'hooks')")
            outputs = [o for m in layers for _, o in seen[m]]
            grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True)
            with torch.no_grad():
                passes, start = {}, 0  # layer -> [(input, output gradient)] per pass
                for m in layers:
                    mine = grads[start:start + len(seen[m])]
                    start += len(seen[m])
                    passes[m] = [(a, torch.zeros_like(o) if g is None else g)
                                 for (a, o), g in zip(seen[m], mine, strict=True)]
                squared = torch.zeros(len(losses), device=losses.device)
                for m, pairs in passes.items():
                    bias = 1.0 if m.bias is not None else 0.0
                    for a, g in pairs:
                        for b, h in pairs:
                            squared += (g * h).sum(1) * ((a * b).sum(1) + bias)
                # Passes that nearly cancel (GOT's dual at x0_j close to x*_j) can round a
                # squared norm of about 0 below 0: clamp it, or its sqrt is NaN.
                norms = squared.clamp(min=0.0).sqrt()
                coefficients = (self.clip / (norms + 1e-6)).clamp(max=1.0)
                for m, pairs in passes.items():
                    clipped = [(a, g * coefficients[:, None]) for a, g in pairs]
                    m.weight.grad = sum(g.T @ a for a, g in clipped)
                    if m.bias is not None:
                        m.bias.grad = sum(g.sum(0) for _, g in clipped)
        return self._noisy_mean()

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
        else:  # an empty Poisson batch ran forward only: drop what Opacus' hooks kept of it,
            # or the next forward reads as a second use of every layer (parameter tying)
            for module in self.forward_module.modules():
                if getattr(module, "activations", None):
                    module.activations = []
            for p in self.params:
                p._forward_counter = 0
        return self._noisy_mean()

    def _noisy_mean(self) -> np.ndarray:
        """(the clipped sum now in the parameters' grads + N(0, sigma^2 C^2 I)) / E[b], [P]."""
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


class Deferred:
    """A gradient estimator made by ``make()`` at its first use (``forward_module`` or a call),
    not before: a deployed client is rebuilt in a fresh process for every message, and making
    a :class:`DPGradient` imports Opacus (seconds on a 2-core machine), which only the message
    that trains needs."""

    def __init__(self, make: Callable[[], DPGradient | PlainGradient]):
        self._make = make
        self._made: DPGradient | PlainGradient | None = None

    def _estimator(self) -> DPGradient | PlainGradient:
        if self._made is None:
            self._made = self._make()
        return self._made

    @property
    def forward_module(self) -> nn.Module:
        return self._estimator().forward_module

    def __getattr__(self, name: str):
        """Any other attribute (``mode``, ``expected_batch``, ...) is the made estimator's."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._estimator(), name)

    def __call__(self, losses: torch.Tensor, examples: int) -> np.ndarray:
        return self._estimator()(losses, examples)


def _linear_only(model: nn.Module) -> bool:
    """True when every trainable parameter belongs to an nn.Linear layer."""
    covered = {id(p) for m in model.modules() if isinstance(m, nn.Linear)
               for p in m.parameters()}
    return all(id(p) in covered for p in model.parameters() if p.requires_grad)
