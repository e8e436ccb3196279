"""The scores of membership inference on flow-matching models (``--attack membership``), for
images [N, C, H, W] and encoded rows [N, d] alike: the image attack (:mod:`.membership`) and the
tabular one (:mod:`.tabular_membership`) share them. Scores, higher meaning "member": ``loss``
(minus the flow-matching loss at one draw), ``averaged`` (over ``draws`` draws) and
``calibrated`` (a reference model's averaged loss minus the released one's); each summarised by
ROC AUC and the TPR at 1% FPR."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from torch import nn

from ...methods.flow_matching import flow_matching_loss

__all__ = ["fm_losses", "membership_scores", "auc_and_tpr", "TARGET_FPR"]

TARGET_FPR = 0.01


@torch.no_grad()
def fm_losses(model: nn.Module, x: torch.Tensor, x0: torch.Tensor,
              t: torch.Tensor) -> torch.Tensor:
    """Flow-matching losses [N, K] of examples x [N, ...] (images [N, C, H, W], encoded rows
    [N, d]) at K draws: noise x0 [K, N, ...] and times t [K, N]."""
    return torch.stack([flow_matching_loss(model, x0[k], x, t[k]) for k in range(len(x0))],
                       dim=1)


def _draws(x: torch.Tensor, draws: int, generator: torch.Generator):
    noise = torch.randn((draws, *x.shape), generator=generator)
    return noise, torch.rand((draws, len(x)), generator=generator)


def membership_scores(model: nn.Module, x: torch.Tensor, generator: torch.Generator,
                      draws: int = 16, reference: nn.Module | None = None
                      ) -> dict[str, torch.Tensor]:
    """The scores [N] of examples ``x`` [N, ...] (module docstring): ``loss``, ``averaged``
    and, with a ``reference`` model, ``calibrated``; the draws come from the attacker's
    ``generator``."""
    noise, t = _draws(x, draws, generator)
    losses = fm_losses(model, x, noise, t)
    scores = {"loss": -losses[:, 0], "averaged": -losses.mean(dim=1)}
    if reference is not None:
        scores["calibrated"] = fm_losses(reference, x, noise, t).mean(dim=1) - losses.mean(dim=1)
    return scores


def auc_and_tpr(members: torch.Tensor, others: torch.Tensor) -> tuple[float, float]:
    """ROC AUC and TPR at :data:`TARGET_FPR` of scores [n] of members against [m] of others."""
    labels = np.r_[np.ones(len(members)), np.zeros(len(others))]
    scores = torch.cat([members, others]).double().numpy()
    fpr, tpr, _ = roc_curve(labels, scores)
    return float(roc_auc_score(labels, scores)), float(tpr[fpr <= TARGET_FPR].max())
