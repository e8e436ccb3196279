"""Membership inference on a run's released model (``--attack membership``); on a tabular run
it is :mod:`.tabular_membership`, which reuses these scores on encoded rows.

Adversary: anyone holding the released velocity field v (checkpoint.safetensors) and a candidate
image x, asking whether x was in a client's training shard. Members are images of the clients'
shards (rebuilt from the public seed: the experimenter knows them), non-members held-out test images
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

import torch

from ...config import load_config
from ...data.silo import CLIENT_DATA
from ...errors import SecureFFMError
from ...models.params import load_flat_params
from .ffm_run import load_image_run
from .membership_scores import TARGET_FPR, auc_and_tpr, fm_losses, membership_scores

__all__ = ["fm_losses", "membership_scores", "auc_and_tpr", "membership_inference",
           "TARGET_FPR"]

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
        from .tabular_membership import tabular_membership

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
