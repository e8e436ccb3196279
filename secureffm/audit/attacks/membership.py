"""Membership inference on a run's released model (``--attack membership``); on a tabular run
it is :mod:`.tabular_membership`, which reuses these scores on encoded rows.

Adversary: anyone holding the released velocity field v (checkpoint.pt) and a candidate image x,
asking whether x was in a client's training shard. Members are images of the clients' shards
(rebuilt from the public seed: the experimenter knows them), non-members held-out test images
of the same distribution. Scores, higher meaning "member":

- ``loss``: minus the flow-matching loss of x at one draw of noise x0 and time t (the loss
  threshold attack, Yeom et al. 2018);
- ``averaged``: minus the loss averaged over ``draws`` draws of (x0, t), the flow-matching
  analogue of a diffusion model's averaged denoising loss (less noise from the draw);
- ``calibrated``: the averaged loss of the model the run started from (the round-1 broadcast)
  minus that of the released one, at the same draws: how much training lowered x's loss, which
  takes out how hard x is for any model (difficulty calibration, Watson et al. 2022).

Each score is summarised by its ROC AUC over members against non-members and its TPR at 1%
FPR (the largest true-positive rate whose false-positive rate is at most 0.01).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from torch import nn

from ...config import load_config
from ...data.silo import CLIENT_DATA
from ...errors import SecureFFMError
from ...methods.flow_matching import flow_matching_loss
from ...models.params import load_flat_params
from .ffm_run import load_image_run

__all__ = ["fm_losses", "membership_scores", "auc_and_tpr", "membership_inference",
           "TARGET_FPR"]

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


def membership_inference(run_dir: str | Path, count: int | None = None, draws: int = 16,
                         seed: int = 0, samples: int | None = None) -> dict[str, float]:
    """Score ``count`` (400) members (drawn at random from the clients' pooled shards) and
    ``count`` test images (fewer when a side has fewer) with the run's released model; returns
    ``{score}_auc`` and ``{score}_tpr_at_1pct_fpr`` for each score, and ``members``. ``seed``:
    the attacker's draws and choice of images. A tabular run goes to
    :func:`~.tabular_membership.tabular_membership` (``count`` rows per client and side, 1000;
    ``samples`` synthetic rows for DCR, 2000)."""
    run_dir = Path(run_dir)
    config = load_config(run_dir / "config.toml") if (run_dir / "config.toml").is_file() else None
    if config is not None and config.data == CLIENT_DATA:
        from .tabular_membership import tabular_membership  # here: it imports this module

        options = {k: v for k, v in (("count", count), ("samples", samples)) if v is not None}
        return tabular_membership(run_dir, draws=draws, seed=seed, **options)
    if config is not None and not config.images:
        raise SecureFFMError(f"{run_dir} trained on data = {config.data!r}: membership scores "
                             "FFM image runs (e.g. --data digits) and runs on the clients' own "
                             "tables (--client-data)")
    if samples is not None:
        raise SecureFFMError("samples (synthetic rows for the distance to closest record) "
                             "applies to tabular runs only; drop it")
    count = 400 if count is None else count
    run = load_image_run(run_dir)
    generator = torch.Generator().manual_seed(seed)
    pool = torch.cat(run.shards)
    test = run.pair.test.x
    n = min(count, len(pool), len(test))
    members = pool[torch.randperm(len(pool), generator=generator)[:n]]
    others = test[torch.randperm(len(test), generator=generator)[:n]]
    model = run.released()
    reference = run.network()
    load_flat_params(reference, run.theta("client-1", 1))
    reference.eval()
    state = generator.get_state()
    inside = membership_scores(model, members, generator, draws, reference)
    generator.set_state(state)  # the same draws for both sides
    outside = membership_scores(model, others, generator, draws, reference)
    results: dict[str, float] = {"members": float(n)}
    for name in inside:
        results[f"{name}_auc"], results[f"{name}_tpr_at_1pct_fpr"] = auc_and_tpr(
            inside[name], outside[name])
    return results
