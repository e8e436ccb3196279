"""An FFM image run as the experimenter rebuilds it to score an attack: the config, the data
and each client's shard (from the public seed), the released model, and (runs made with
``--insecure-deterministic`` only) a replay of a client's step: which examples it used, their
noise x0 and times t, and the gradient it computed.

The replay is the ground truth an attack is scored against, and the informed attacker's
knowledge; it is not what a server of a real run knows (its clients' streams come from OS
entropy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...config import RunConfig, load_config
from ...data.images import ImagePair, image_pair
from ...errors import SecureFFMError
from ...federation.parties import new_client
from ...methods.ffm import FFMClient, FFMSettings, image_velocity
from ...names import IMAGE_FOLDER
from ...protocols.protocol import load_protocol
from ...runs.ffm import image_shards, load_velocity
from ...runs.scaffold import resolve_dp
from .view import ServerView

__all__ = ["ImageRun", "ClientStep", "load_image_run"]


@dataclass(frozen=True)
class ClientStep:
    """One client's velocity step in ``round``: shard ``rows`` [b], images ``x1`` [b, C, H, W],
    noise ``x0`` [b, C, H, W], times ``t`` [b], the model ``theta`` [P] it was computed at
    and the ``gradient`` [P] it computed (before any protocol stage)."""

    round: int
    rows: torch.Tensor
    x1: torch.Tensor
    x0: torch.Tensor
    t: torch.Tensor
    theta: np.ndarray
    gradient: np.ndarray


@dataclass(frozen=True)
class ImageRun:
    """A finished FFM image run: its ``config``, data ``pair``, the clients' ``shards``
    (client-1 first; [N_i, C, H, W]) and the server's ``view``."""

    folder: Path
    config: RunConfig
    pair: ImagePair
    shards: list[torch.Tensor]
    view: ServerView

    @property
    def settings(self) -> FFMSettings:
        return FFMSettings.of(self.config)

    def network(self) -> torch.nn.Module:
        """A fresh velocity U-Net of the run's shape (CPU, float32)."""
        return image_velocity(self.settings, self.pair.shape)

    def released(self) -> torch.nn.Module:
        """The model the run released: checkpoint.safetensors's EMA when kept, else its live weights
        (loaded with weights_only=True), in eval mode."""
        return load_velocity(self.folder)

    def theta(self, client: str, round_: int) -> np.ndarray:
        """The global model [P] the server broadcast to ``client`` in ``round_`` (the logged
        bytes)."""
        record = self.view.one(kind="global_model", recipient=client, round=round_)
        return self.view.payload(record)["theta"]

    def replay(self, client: str, last_round: int) -> Iterator[ClientStep]:
        """``client``'s velocity steps of rounds 1 .. ``last_round`` (those it was sent a model
        in), replayed from its streams (derived from the published seed: only under
        ``insecure_deterministic``) at the broadcast models the log holds."""
        c = self.config
        if not c.insecure_deterministic:
            raise SecureFFMError(f"{self.folder}: its clients' noise, times and batches came "
                                 "from OS entropy, so nobody can replay them to score the "
                                 "attack; rerun with --insecure-deterministic (for audits "
                                 "only: it voids the run's privacy)")
        if c.canaries:
            raise SecureFFMError(f"{self.folder} planted {c.canaries} canaries, which draw on "
                                 "the clients' DP stream and the replay does not plant; attack "
                                 "a run without canaries")
        if c.method != "vanilla":
            raise SecureFFMError(f"method = {c.method!r}: the inversion attack models "
                                 "FFM-vanilla's per-example noise; rerun with --method vanilla")
        index = int(client.removeprefix("client-")) - 1
        if not 0 <= index < len(self.shards):
            raise SecureFFMError(f"{client!r} is not a client of {self.folder}")
        dp = resolve_dp(c, load_protocol(c.protocol), self.settings.sent_kinds)
        program = FFMClient(self.settings, dp, self.pair, torch.device("cpu"))
        party = new_client(client, self.shards[index], c.deterministic_seed)
        program.setup(party)
        for round_ in range(1, last_round + 1):
            if not self.view.messages(kind="global_model", recipient=client, round=round_):
                continue
            theta = self.theta(client, round_)
            party.inbox["global_model"] = {"theta": theta}
            program.sync_replicas(party)  # what FFMClient._velocity does, keeping rows, x0 and t
            rows = program.batch_rows(party)
            x0, t = program.example_noise(party, round_, "gradient", rows)
            losses = program.velocity_losses(party, round_, rows)
            gradient = party.state["velocity_grad"](losses, len(losses))
            yield ClientStep(round_, rows.cpu(), party.data[rows].cpu(), x0.cpu(), t.cpu(),
                             theta, gradient)


def load_image_run(folder: str | Path) -> ImageRun:
    """The FFM image run in ``folder`` (config.toml, a log with kept payloads); its data and
    shards rebuilt from the config."""
    folder = Path(folder)
    if not (folder / "config.toml").is_file():
        raise SecureFFMError(f"{folder} has no config.toml: give the folder of an FFM run")
    config = load_config(folder / "config.toml")
    if not config.images:
        raise SecureFFMError(f"{folder} trained on data = {config.data!r}: this attack needs an "
                             "FFM image run (e.g. --data digits)")
    if config.data == IMAGE_FOLDER:
        raise SecureFFMError(f"{folder} trained on the clients' own image folders: the image "
                             "attacks rebuild the members from the public config and a named "
                             "image set (e.g. --data digits); no party here holds the folders")
    view = ServerView.read(folder)
    pair = image_pair(config.data, config.data_dir, config.seed, config.image_size,
                      config.clients * config.shard_size, config.eval_samples)
    return ImageRun(folder, config, pair, image_shards(pair, config), view)
