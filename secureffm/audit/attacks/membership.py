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

import json
from pathlib import Path

import torch

from ...config import load_config
from ...data.silo import CLIENT_DATA
from ...errors import SecureFFMError
from ...models.params import load_flat_params
from ...progress import progress_bar
from .ffm_run import load_image_run
from .membership_report import RESULT_FILE, dp_claim, interpret
from .membership_scores import TARGET_FPR, auc_and_tpr, fm_losses, membership_scores

__all__ = ["fm_losses", "membership_scores", "auc_and_tpr", "membership_inference",
           "TARGET_FPR", "CHUNK"]

CHUNK = 50  # images scored at once: bounds memory, and the progress bar moves per chunk


def membership_inference(run_dir: str | Path, count: int | None = None, draws: int = 16,
                         seed: int = 0, samples: int | None = None) -> dict:
    """Score ``count`` (400) members (drawn at random from the clients' pooled shards) and
    ``count`` test images (fewer when a side has fewer) with the run's released model; returns
    ``{score}_auc`` and ``{score}_tpr_at_1pct_fpr`` for each score, ``members``,
    ``non_members``, what privacy.json claims and ``interpretation`` (plain words;
    :mod:`.membership_report`), and writes them to ``run_dir/attack-membership.json``. ``seed``:
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
    bar = progress_bar(total=2 * n, desc="membership", unit="image", delay=2)
    state = generator.get_state()
    inside = _scores(model, members, generator, draws, reference, bar)
    generator.set_state(state)  # the same draws for both sides
    outside = _scores(model, others, generator, draws, reference, bar)
    bar.close()
    results: dict = {"members": n, "non_members": n, "draws": draws}
    for name in inside:
        results[f"{name}_auc"], results[f"{name}_tpr_at_1pct_fpr"] = auc_and_tpr(
            inside[name], outside[name])
    privacy = run_dir / "privacy.json"
    results.update(dp_claim(json.loads(privacy.read_text()) if privacy.is_file() else {},
                            [f"client-{i + 1}" for i in range(run.config.clients)]))
    results["interpretation"] = interpret(results, "image", "test")
    (run_dir / RESULT_FILE).write_text(json.dumps(results, indent=1))
    return results


def _scores(model: torch.nn.Module, x: torch.Tensor, generator: torch.Generator, draws: int,
            reference: torch.nn.Module, bar) -> dict[str, torch.Tensor]:
    """:func:`membership_scores` of images ``x`` [N, C, H, W], :data:`CHUNK` at a time (the
    draws taken in the same order whatever N), advancing ``bar`` by the images scored."""
    parts = []
    for part in x.split(CHUNK):
        parts.append(membership_scores(model, part, generator, draws, reference))
        bar.update(len(part))
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
