"""The server's side of a trained network: parameters, optimizer, and an EMA for evaluation."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..models.params import flat_params, set_flat_grad

__all__ = ["GlobalModel"]


class GlobalModel:
    """Holds ``module`` and applies aggregated gradients with Adam.

    ``ema_decay`` > 0 keeps an exponential moving average of the parameters (``averaged``).
    ``warmup`` W > 0 raises the learning rate linearly: step s (from 0) uses
    ``lr * min(1, (s + 1) / W)`` (the FFM paper's CIFAR-10 run: W = 5,000).
    """

    def __init__(self, module: nn.Module, lr: float, ema_decay: float = 0.0, warmup: int = 0):
        self.module = module
        self.optimizer = torch.optim.Adam(module.parameters(), lr=lr)
        self.schedule = (torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup)) if warmup > 0 else None)
        self.ema = (
            AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(ema_decay))
            if ema_decay > 0 else None
        )

    def apply(self, gradient: np.ndarray) -> None:
        """One optimizer step along ``gradient`` (flat, shape [P])."""
        set_flat_grad(self.module, gradient)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            self.schedule.step()
        if self.ema is not None:
            self.ema.update_parameters(self.module)

    @property
    def averaged(self) -> nn.Module:
        """The module to evaluate: the EMA when kept, else the live parameters."""
        return self.ema.module if self.ema is not None else self.module

    def flat(self) -> np.ndarray:
        return flat_params(self.module)

    def state_dict(self) -> dict:
        return {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "schedule": self.schedule.state_dict() if self.schedule is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """The inverse of :meth:`state_dict`, in place (the EMA and the warm-up only when
        kept; states saved before warm-ups existed have none)."""
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        for key, name, kept in (("ema", "EMA", self.ema), ("schedule", "warm-up", self.schedule)):
            saved = state.get(key)
            if (kept is None) != (saved is None):
                raise ValueError(f"the saved state and this model disagree on keeping a {name}")
            if kept is not None:
                kept.load_state_dict(saved)
