"""A run on the clients' own data (tables, or image folders): each client reads its own file or
folder, and evaluates the trained model on its own held-out rows or images (docs/data.md).

The server holds no row, image or statistic of any client's data. After training it publishes
the released model (kind ``released_model``, the EMA velocity it evaluates, as a broadcast)
and asks each client, one message each, to run :data:`EVALUATE`: the client samples synthetic
rows from that model, decodes them through the public schema and scores them against its
held-out rows (:func:`~secureffm.metrics.tabular.evaluate_table`); on images it samples
synthetic images and scores their Frechet distance to its held-out images
(:func:`score_images`). Only the numbers of that report leave the client, as kind
``evaluation``: a release that no DP mechanism covers, which privacy.json names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..config import RunConfig
from ..data.schema import Schema
from ..data.silo import ImageSilo, Silo, folder_pair, load_image_silo, load_silo, table_pair
from ..federation.channel import Channel, Task, TaskRefused, task_count
from ..federation.message import SERVER
from ..federation.parties import Client
from ..methods.ffm import FFMClient, FFMSettings, velocity_network
from ..metrics.fid import fid, image_features, inception_features, pixel_features
from ..metrics.sampling import integrate
from ..metrics.tabular import evaluate_table
from ..models.params import flat_params, load_flat_params
from ..privacy.settings import DPSettings

__all__ = ["EVALUATE", "RELEASED", "EVALUATION", "SiloProgram", "own_silo", "hold_silo",
           "silo_program", "table_nfe", "evaluate_on_silos", "UNACCOUNTED_EVALUATION",
           "UNACCOUNTED_IMAGE_EVALUATION", "folder_shape", "score_images"]

EVALUATE = "silo.evaluate"
RELEASED = "released_model"  # kind of the model the clients evaluate
EVALUATION = "evaluation"  # kind of each client's numbers
_SILO = "silo"  # where a client keeps its own data (client.state)
_EVALUATED = "evaluated rounds"

UNACCOUNTED_EVALUATION = (
    "evaluation: each client's scores of the released model on its own held-out rows (W2 and "
    "its floor, per-column KS and TV, correlation difference, ML efficacy) go to the server in "
    "the clear; no DP mechanism covers them and no epsilon is charged for them")
UNACCOUNTED_IMAGE_EVALUATION = (
    "evaluation: each client's Frechet distance between the released model's images and its own "
    "held-out images (and its floor, held-out half against half) goes to the server in the "
    "clear; no DP mechanism covers it and no epsilon is charged for it")


def folder_shape(config: RunConfig) -> tuple[int, int, int]:
    """The public (C, H, W) of an image-folder run's images, from its config alone."""
    return (config.image_channels, config.image_size, config.image_size)


def own_silo(config: RunConfig, path: str, schema: Schema | None = None) -> Silo | ImageSilo:
    """A client's own file (``schema``: its table's) or, with no schema, its own image folder
    at ``path``, read and checked by the client, split by the run's public ``holdout`` and seed
    (:func:`~secureffm.data.silo.load_silo`, :func:`~secureffm.data.silo.load_image_silo`)."""
    if schema is None:
        return load_image_silo(path, folder_shape(config), config.image_labels, config.holdout,
                               config.seed, config.batch_size)
    return load_silo(path, schema, config.holdout, config.seed, config.batch_size)


def hold_silo(client: Client, silo: Silo | ImageSilo) -> None:
    """``client`` keeps its own ``silo``: its training rows (images) are its shard, its
    held-out ones stay for :data:`EVALUATE`."""
    client.data = silo.x.to(client.data.device)
    client.state[_SILO] = silo


def table_nfe(config: RunConfig) -> int:
    """The Euler steps of a tabular run's synthetic rows: the largest evaluated NFE, at most
    100."""
    return min(max(config.nfe), 100)


def silo_program(config: RunConfig, schema: Schema | None, dp: DPSettings | None,
                 device: torch.device) -> SiloProgram:
    """A client's program on its own data: FFM's client (:class:`FFMClient`) on the public pair
    (the schema's, or with no schema the image folders' :func:`folder_shape`), and the
    evaluation on its held-out rows or images; from public settings only, so every engine
    builds the same one."""
    settings = FFMSettings.of(config)
    if schema is None:
        pair = folder_pair(folder_shape(config))
        score = partial(score_images, fid_weights=config.fid_weights, device=device,
                        seed=config.seed)
    else:
        pair = table_pair(schema)
        score = partial(_score_table, schema=schema, target_column=config.target_column or None)
    # Its weights come from the released model; drawing initial ones must not shift the global
    # generator, which draws the server's initial model next (the engines would differ).
    with torch.random.fork_rng(devices=[]):
        network = velocity_network(settings, pair)
    shape = pair.shape if schema is None else (schema.dim,)
    return SiloProgram(FFMClient(settings, dp, pair, device), network, config.eval_samples,
                       table_nfe(config), shape, score, device)


def _score_table(silo: Silo, synthetic: torch.Tensor, schema: Schema,
                 target_column: str | None) -> dict:
    """The tabular report of ``synthetic`` rows [n, schema.dim] on the silo's held-out rows."""
    return evaluate_table(silo.holdout, synthetic.numpy(), schema, train=silo.train,
                          target_column=target_column).to_dict()


def score_images(silo: ImageSilo, synthetic: torch.Tensor, fid_weights: str = "",
                 device: torch.device | str = "cpu", seed: int = 0) -> dict:
    """A client's report on ``synthetic`` images [n, C, H, W]: the Frechet distance of their
    features to its held-out images', and its floor (the first half of the held-out images
    against the second). Features: Inception with ``fid_weights``, else a classifier trained on
    the silo's own labelled training images, else (no labels) raw pixels."""
    unlabelled = "the folder has no labels (or one class) to train a classifier on"
    if silo.train_labels is not None and len(silo.classes) >= 2:
        features = image_features(silo.x, silo.train_labels, len(silo.classes), fid_weights,
                                  device, seed)
    elif fid_weights:
        try:
            features = inception_features(fid_weights, torch.device(device))
        except (ImportError, RuntimeError, OSError) as err:  # torchvision's import fails here
            features = pixel_features(f"pytorch-fid could not run ({type(err).__name__}) and "
                                      f"{unlabelled}")
    else:
        features = pixel_features(f"{unlabelled}; --image-labels names or csv gives them")
    half = len(silo.holdout) // 2
    return {"fid": fid(features, synthetic.float(), silo.holdout),
            "fid_floor": fid(features, silo.holdout[:half], silo.holdout[half:]),
            "features": features.describe(), "heldout_images": len(silo.holdout),
            "synthetic_images": len(synthetic)}


@dataclass
class SiloProgram:
    """A client's program on its own data: the method's tasks (``method``), and
    :data:`EVALUATE` (args ``{"round": r}``) once in the run: ``samples`` synthetic points of
    ``shape`` from the broadcast ``released_model`` (``network``: the velocity architecture),
    ``nfe`` Euler steps, scored by ``score(silo, synthetic)`` on the client's held-out data."""

    method: object
    network: torch.nn.Module
    samples: int
    nfe: int
    shape: tuple[int, ...]
    score: Callable[[Silo | ImageSilo, torch.Tensor], dict]
    device: torch.device

    def __call__(self, client: Client, task: Task) -> dict[str, np.ndarray]:
        if task.name != EVALUATE:
            return self.method(client, task)
        round_ = task_count(client.id, task, "round")
        done = client.state.setdefault(_EVALUATED, [])
        if done:
            raise TaskRefused(f"{client.id} refused {EVALUATE} for round {round_}: it evaluated "
                              f"the model of round {done[0]} already, and it evaluates once a "
                              "run (each evaluation releases scores of its held-out data)")
        released = client.inbox.get(RELEASED)
        if released is None or "theta" not in released:
            raise TaskRefused(f"{client.id} refused {EVALUATE}: no released model reached it")
        done.append(round_)
        load_flat_params(self.network, released["theta"])
        x0 = torch.randn(self.samples, *self.shape, generator=client.generator,
                         device=client.generator.device).to(self.device)
        network = self.network.to(self.device)
        if len(self.shape) == 3:  # images, in chunks, live in [-1, 1]
            synthetic = torch.cat([integrate(network, chunk, self.nfe)[0].cpu()
                                   for chunk in x0.split(500)]).clamp(-1, 1)
        else:
            synthetic = integrate(network, x0, self.nfe)[0].cpu()
        report = self.score(client.state[_SILO], synthetic)
        return {"report": np.frombuffer(json.dumps(report).encode(), dtype=np.uint8)}


def evaluate_on_silos(channel: Channel, model: torch.nn.Module, round_: int) -> dict:
    """The server publishes ``model`` and asks each client for its evaluation: client id -> its
    report (a dict), or ``{"missing": why}`` when none arrived."""
    channel.broadcast(round_, RELEASED, {"theta": flat_params(model)})
    reports = {}
    for client in channel.clients:
        payload = channel.send(round_, "evaluate", EVALUATION, client.id, SERVER,
                               Task(EVALUATE, {"round": round_}))
        reports[client.id] = _report(payload)
    return reports


def _report(payload: dict | None) -> dict:
    if payload is None:
        return {"missing": "no evaluation arrived (the log says why)"}
    try:
        report = json.loads(np.asarray(payload["report"], dtype=np.uint8).tobytes())
    except (KeyError, ValueError, UnicodeDecodeError) as err:
        return {"missing": f"unreadable evaluation: {err}"}
    return report if isinstance(report, dict) else {"missing": "the evaluation is not a table"}
