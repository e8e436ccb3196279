"""The gradient-inversion attack on an FFM image run's log (``--attack inversion``).

Adversary: the honest-but-curious server of the run. In the attacked round it holds the model
theta it broadcast, every message a client sent it, and the sum the aggregation revealed. It
attacks two targets:

- **message**: each client's own upload: the plaintext gradient (``plaintext``), the clipped
  and noised one (``dp``), or the masked vector (``secagg``, ``dp-secagg``; read as numbers
  centred on their mean, the best an attacker without the masks can do);
- **sum**: the lambda-weighted sum of the clients' gradients, as a batch of every client's
  examples. In the clear (and under ``dp``) the server forms it from the logged uploads; under
  secure aggregation it is what unmasking reveals, recomputed here from the replayed gradients
  (equal to the unmasked sum up to the quantizer's rounding and clipping). Distributed noise
  (added inside the aggregation) is not replayed, so the sum target is left out there.

Each target is attacked by the informed attacker (knows every example's x0 and t) and the
uninformed one (:mod:`.inversion`). Scores are PSNR and SSIM (dB; [-1, 1] images) of each
reconstruction against the example it came from (the uninformed attacker's batch order is
matched to the examples' first, by least squared error), averaged over examples; ``prior_*``
is the score of the test set's mean image, what an attacker gets without any message. The
truth comes from replaying the clients (:meth:`~.ffm_run.ImageRun.replay`), which needs a run
made with ``--insecure-deterministic``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ...errors import SecureFFMError
from ...federation.parties import ClientInfo
from ...methods.ffm import client_weights
from ...metrics.image_quality import psnr, ssim
from ...models.params import load_flat_params
from ...protocols.protocol import load_protocol
from ...runs.scaffold import resolve_dp
from .ffm_run import ClientStep, ImageRun, load_image_run
from .inversion import invert_gradient
from .pictures import write_rows

__all__ = ["gradient_inversion", "message_target", "ATTACKS_DIR"]

ATTACKS_DIR = "attacks"  # where attacks write their pictures, inside the run folder


def message_target(run: ImageRun, client: str, round_: int) -> torch.Tensor:
    """What ``client`` sent the server for its gradient in ``round_``, as a vector [P]: the
    upload in the clear, or its masked vector centred on its mean."""
    uploads = run.view.messages(kind="gradient", sender=client, round=round_, phase="upload")
    if uploads:
        return torch.as_tensor(run.view.payload(uploads[0])["gradient"], dtype=torch.float32)
    masked = run.view.messages(kind="gradient", sender=client, round=round_,
                               phase="masked_input")
    if masked:
        y = run.view.payload(masked[0])["y"].astype(np.float64)
        return torch.as_tensor(y - y.mean(), dtype=torch.float32)
    raise SecureFFMError(f"{run.folder}: {client} sent no gradient upload or masked input in "
                         f"round {round_}; pick a round it took part in")


def _first_full_round(run: ImageRun, clients: list[str], round_: int) -> list[ClientStep]:
    """The clients' replayed steps of the first round >= ``round_`` in which each used at least
    one example (under DP's Poisson sampling a batch can be empty)."""
    last = run.config.rounds
    replays = [run.replay(cid, last) for cid in clients]
    for steps in zip(*replays, strict=False):
        if (steps[0].round >= round_ and all(len(s.rows) for s in steps)
                and len({s.round for s in steps}) == 1):
            return list(steps)
    raise SecureFFMError(f"{run.folder}: no round from {round_} to {last} in which every "
                         "attacked client used an example; pick an earlier round")


def _check_replay(run: ImageRun, client: str, step: ClientStep) -> None:
    """A plaintext upload must equal its replay, or the truth would be of another step."""
    uploads = run.view.messages(kind="gradient", sender=client, round=step.round,
                                phase="upload")
    if uploads and not np.allclose(run.view.payload(uploads[0])["gradient"], step.gradient,
                                   rtol=1e-4, atol=1e-6):
        raise SecureFFMError(f"{run.folder}: the replay of {client} in round {step.round} does "
                             "not reproduce its logged upload; was the run made by this "
                             "version of secureffm?")


def _scores(found: torch.Tensor, truth: torch.Tensor,
            match: bool) -> tuple[float, float, torch.Tensor]:
    """Mean PSNR and SSIM of ``found`` against ``truth`` [b, C, H, W], and ``found`` as
    scored; ``match``: first put ``found`` in the order of least total squared error."""
    if match and len(found) > 1:
        cost = torch.cdist(found.flatten(1).double(), truth.flatten(1).double()).pow(2)
        rows, cols = linear_sum_assignment(cost.numpy())
        found = found[torch.as_tensor(rows)][torch.as_tensor(np.argsort(cols))]
    return float(psnr(found, truth).mean()), float(ssim(found, truth).mean()), found


def _attack(model, target, shape, x0, t, weights, stream: int, options) -> dict:
    """Informed and (``options['uninformed']``) uninformed inversions of one target, each
    from its own generator seeded by (``options['seed']``, ``stream``), so that equal targets
    (the sum in the clear and under secagg) get equal starts."""
    def generator(who: int) -> torch.Generator:
        return torch.Generator().manual_seed(1000 * options["seed"] + 2 * stream + who)

    out = {"informed": invert_gradient(model, target, shape, len(x0), generator(0), x0, t,
                                       weights, restarts=options["restarts"],
                                       **options["search"])}
    if options["uninformed"]:
        out["uninformed"] = invert_gradient(model, target, shape, len(x0), generator(1),
                                            weights=weights,
                                            restarts=options["uninformed_restarts"],
                                            **options["search"])
    return out


def gradient_inversion(run_dir: str | Path, first_round: int = 1, steps: int = 300,
                       restarts: int = 3, uninformed_restarts: int = 1, tv: float = 1e-2,
                       lr: float = 0.1, uninformed: bool = True, aggregate: bool = True,
                       clients: int = 0, seed: int = 0) -> dict[str, float]:
    """Attack the clients' gradients of the first round >= ``first_round`` in which each used an
    example (module docstring); write attacks/inversion.png (originals, then each attacker's
    reconstructions) into the run folder and return the mean scores: ``{message,sum}_
    {informed,uninformed}_{psnr,ssim}``, ``prior_psnr``, ``prior_ssim``, ``round`` and
    ``batch`` (examples per client). ``steps``, ``tv``, ``lr`` and ``restarts`` (the
    informed attacker's; ``uninformed_restarts`` the uninformed one's): the search
    (:func:`~.inversion.invert_gradient`); ``clients``: attack the first this many (0: all);
    ``aggregate``: also attack the sum; ``uninformed``: also the uninformed attacker;
    ``seed``: the attacker's own random starts."""
    run = load_image_run(run_dir)
    ids = [f"client-{i}" for i in range(1, len(run.shards) + 1)]
    attacked = ids[:clients] if clients else ids
    replayed = ids if aggregate else attacked
    steps_ = _first_full_round(run, replayed, first_round)
    by_id = dict(zip(replayed, steps_, strict=True))
    round_ = steps_[0].round
    model = run.network()
    load_flat_params(model, steps_[0].theta)
    options = {"uninformed": uninformed, "restarts": restarts, "seed": seed,
               "uninformed_restarts": uninformed_restarts,
               "search": {"steps": steps, "tv": tv, "lr": lr}}
    shape = run.pair.shape
    found: dict[str, list] = {}
    for stream, cid in enumerate(attacked, start=1):
        step = by_id[cid]
        _check_replay(run, cid, step)
        target = message_target(run, cid, round_)
        for who, inv in _attack(model, target, shape, step.x0, step.t, None, stream,
                                options).items():
            found.setdefault(f"message_{who}", []).append((inv.x1, step.x1, who))
    truth = torch.cat([by_id[cid].x1 for cid in attacked])
    if aggregate:
        found.update(_sum_attack(run, model, by_id, ids, options))
    prior = run.pair.test.x.mean(dim=0, keepdim=True).expand_as(truth)
    results = {"round": float(round_), "batch": len(truth) / len(attacked)}
    results["prior_psnr"], results["prior_ssim"], _ = _scores(prior, truth, False)
    pictures = [("original", truth)]
    for name, parts in found.items():
        images = torch.cat([p[0] for p in parts])
        wanted = torch.cat([p[1] for p in parts])
        results[f"{name}_psnr"], results[f"{name}_ssim"], images = _scores(
            images, wanted, parts[0][2] == "uninformed")
        if name.startswith("sum"):
            images = images[:len(truth)]  # the attacked clients' examples come first
        pictures.append((name.replace("_", "\n"), images))
    write_rows(Path(run_dir) / ATTACKS_DIR / "inversion.png", pictures,
               f"gradient inversion, {run.config.protocol}, round {round_}")
    return results


def _sum_attack(run: ImageRun, model, by_id: dict[str, ClientStep], ids: list[str],
                options: dict) -> dict[str, list]:
    """Both attackers on the lambda-weighted sum of every client's gradient, as one batch."""
    protocol = load_protocol(run.config.protocol)
    dp = resolve_dp(run.config, protocol, run.settings.sent_kinds)
    if dp is not None and dp.noise == "distributed":
        return {}
    weights = client_weights([ClientInfo(cid, len(s)) for cid, s in zip(ids, run.shards,
                                                                         strict=True)],
                             run.config.weighting, equal=dp is not None
                             or protocol.aggregator("gradient") is not None)
    steps = [by_id[cid] for cid in ids]
    vectors = []
    for cid, s in zip(ids, steps, strict=True):
        upload = run.view.messages(kind="gradient", sender=cid, round=s.round, phase="upload")
        vectors.append(torch.as_tensor(run.view.payload(upload[0])["gradient"] if upload
                                       else s.gradient))
    target = sum(weights[cid] * v.double() for cid, v in zip(ids, vectors, strict=True))
    per_example = torch.cat([torch.full((len(s.rows),), weights[cid] / len(s.rows))
                             for cid, s in zip(ids, steps, strict=True)])
    x0 = torch.cat([s.x0 for s in steps])
    t = torch.cat([s.t for s in steps])
    truth = torch.cat([s.x1 for s in steps])
    return {f"sum_{who}": [(inv.x1, truth, who)] for who, inv in _attack(
        model, target.float(), run.pair.shape, x0, t, per_example, 0, options).items()}
