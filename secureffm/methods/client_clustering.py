"""Client clustering for federated learning (FedWAD Sec. 4 and App. D.5).

The server clusters the clients by spectral clustering (scikit-learn) on an affinity built from
their pairwise distance matrix (federated OTDD or FedWAD, :mod:`.otdd`), then runs one FedAvg
per cluster, each cluster a sub-federation with its own channel and log. Global FedAvg is the
one-cluster case. FedAvg rounds go through the channel's ``aggregate`` (kind ``update``, weights
by client size or uniform, equal under secure aggregation, which takes no other), so a protocol
that protects ``update`` applies unchanged.
Each client trains with :class:`FedAvgClient` (its own program, on any engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.cluster import SpectralClustering
from torch import nn

from ..errors import ConfigError, DataError, ProtocolError
from ..federation.channel import Channel, Task, TaskRefused
from ..federation.message import Payload
from ..federation.parties import Client
from ..models.params import flat_params, load_flat_params
from ..privacy.settings import DPSettings
from ..progress import progress_bar
from .fedwad_federated import client_labels, sample_dim
from .ffm import client_weights

__all__ = ["AFFINITIES", "cluster_clients", "Classifier", "FedAvgConfig", "fedavg",
           "clustered_fedavg", "accuracy", "ChannelFactory", "FedAvgClient"]

AFFINITIES = ("rbf", "knn")


def _check_distances(distances: np.ndarray) -> np.ndarray:
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise DataError(f"distances must be a square [n, n] matrix, got shape {d.shape}")
    if not np.isfinite(d).all() or (d < 0).any():
        raise DataError("distances must be finite and non-negative; a client whose distance "
                        "failed must be left out before clustering")
    if not np.allclose(d, d.T, rtol=1e-6, atol=1e-9):
        raise DataError("distances must be symmetric; average it with its transpose first")
    return d


def cluster_clients(distances: np.ndarray, n_clusters: int, affinity: str = "rbf",
                    neighbours: int = 3, seed: int = 0) -> np.ndarray:
    """Cluster index per client, shape [n], from the pairwise distance matrix [n, n].

    ``rbf``: affinity exp(-(D_ij / s)^2) with s the median off-diagonal distance (the paper's
    "affinity" setting, a distance rescaled into a similarity). ``knn``: the binary graph of each
    client's ``neighbours`` nearest clients (the paper's "sparse graph").
    """
    d = _check_distances(distances)
    n = d.shape[0]
    if not 1 <= n_clusters <= n:
        raise ConfigError(f"n_clusters = {n_clusters}: need 1 <= n_clusters <= {n} clients")
    if n_clusters == 1:
        return np.zeros(n, dtype=np.int64)
    if affinity == "rbf":
        off = d[~np.eye(n, dtype=bool)]
        scale = float(np.median(off)) or 1.0
        model = SpectralClustering(n_clusters, affinity="precomputed", random_state=seed)
        return model.fit_predict(np.exp(-(d / scale) ** 2)).astype(np.int64)
    if affinity == "knn":
        if not 1 <= neighbours < n:
            raise ConfigError(f"neighbours = {neighbours}: need 1 <= neighbours < {n} clients")
        model = SpectralClustering(n_clusters, affinity="precomputed_nearest_neighbors",
                                   n_neighbors=neighbours, random_state=seed)
        return model.fit_predict(d).astype(np.int64)
    raise ConfigError(f"affinity = {affinity!r} is unknown; use one of {', '.join(AFFINITIES)}")


class Classifier(nn.Module):
    """Logits [B, classes] from features [B, d]: one hidden ReLU layer of ``hidden`` units."""

    def __init__(self, dim: int, classes: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class FedAvgConfig:
    """FedAvg (McMahan et al. 2017): ``rounds`` rounds of ``local_epochs`` epochs of SGD with
    mini-batches of ``batch_size`` on each client, then the mean of the updates weighted by
    ``weighting``: ``size`` (client sizes) or ``uniform`` (equal under secure aggregation, which
    takes no other weights, whatever this says)."""

    rounds: int = 30
    local_epochs: int = 1
    batch_size: int = 16
    lr: float = 0.05
    hidden: int = 64
    classes: int = 10
    weighting: str = "size"

    def __post_init__(self):
        for name in ("rounds", "local_epochs", "batch_size", "hidden", "classes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"FedAvgConfig.{name} = {getattr(self, name)}: must be >= 1")
        if not self.lr > 0:
            raise ConfigError(f"FedAvgConfig.lr = {self.lr}: must be > 0")
        if self.weighting not in ("size", "uniform"):
            raise ConfigError(f"FedAvgConfig.weighting = {self.weighting!r}: use 'size' or "
                              "'uniform'")


class FedAvgClient:
    """FedAvg's client side: the task ``fedavg.update`` (no arguments) trains a replica from the
    broadcast parameters ``global_model`` ``theta`` [P] on its own rows and labels, with the
    epochs, batch size, learning rate and architecture of its own copy of ``config``, and
    returns the change ``{"update": [P]}`` (float32)."""

    TASKS = ("fedavg.update",)

    def __init__(self, config: FedAvgConfig):
        self.config = config

    def __call__(self, client: Client, task: Task) -> Payload:
        if task.name not in self.TASKS or task.args:
            raise TaskRefused(f"{client.id} runs {self.TASKS[0]} with no arguments (its "
                              f"training settings are its own), not {task.name!r} "
                              f"{sorted(task.args)}")
        config = self.config
        theta = client.inbox.get("global_model", {}).get("theta")
        labels = torch.as_tensor(client_labels(client), device=client.data.device)
        with torch.random.fork_rng(devices=[]):  # weights come from theta, not the torch RNG
            model = Classifier(client.data.shape[1], config.classes, config.hidden)
        if theta is None or theta.shape != flat_params(model).shape:
            raise TaskRefused(f"{client.id} holds no global model of its classifier's "
                              f"{flat_params(model).size} parameters to train")
        load_flat_params(model, theta)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
        for _ in range(config.local_epochs):
            order = torch.randperm(client.size, generator=client.generator,
                                   device=client.data.device)
            for batch in order.split(config.batch_size):
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(client.data[batch]), labels[batch])
                loss.backward()
                optimizer.step()
        return {"update": flat_params(model) - theta}


# Opens a sub-federation's channel over ``members`` (clients, or what a server knows of clients
# that run elsewhere), logging under ``folder``, whose clients run ``program`` (in-process; on
# Flower each node runs its own).
ChannelFactory = Callable[[list[Client], Path, Callable[[Client, Task], Payload]], Channel]


def fedavg(channel: Channel, config: FedAvgConfig, *, dp: DPSettings | None, seed: int = 0,
           progress: Callable[[], None] | None = None, dim: int | None = None) -> Classifier:
    """Train one classifier over ``channel``'s clients (each running :class:`FedAvgClient` on
    its rows and ``state["labels"]``), weighted as ``config.weighting`` says (``size``: by
    ``client.size``, on Flower the nominal shard size the server knows them by), or equally
    where the channel takes only equal weights for ``update`` (secure aggregation).

    Rounds whose aggregation aborted leave the model unchanged. ``progress`` is called once per
    round. ``dp``: the DP settings the protocol asks of ``update`` messages; local training is
    plain SGD, so any is refused rather than claimed. ``dim``: the features' dimension d by the
    public data recipe, needed when the clients run elsewhere.
    """
    if dp is not None:
        raise ProtocolError("the protocol asks for DP on 'update', but FedAvg's local training "
                            "here is plain SGD, so no DP guarantee would hold; use 'plaintext', "
                            "'secagg' or 'secagg-plus'")
    dim = sample_dim(channel.clients[0], dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Classifier(dim, config.classes, config.hidden)
    weights = client_weights(channel.clients, config.weighting,
                             equal=channel.equal_weights("update"))
    count = sum(p.numel() for p in model.parameters())
    template = {"update": ((count,), np.dtype(np.float32))}
    for round_ in range(1, config.rounds + 1):
        theta = flat_params(model)
        channel.broadcast(round_, "global_model", {"theta": theta})
        result = channel.aggregate(round_, "update", Task("fedavg.update"), weights,
                                   template)
        if result.payload is not None:
            load_flat_params(model, theta + result.payload["update"])
        if progress is not None:
            progress()
    return model


def clustered_fedavg(clients: list[Client], assignment: np.ndarray,
                     open_channel: ChannelFactory, log_dir: Path, config: FedAvgConfig, *,
                     dp: DPSettings | None, seed: int = 0, show_progress: bool = True,
                     dim: int | None = None) -> dict[str, Classifier]:
    """One FedAvg per cluster of ``assignment`` (cluster index per client, shape [n]), each
    over its own channel from ``open_channel`` logging in ``log_dir/cluster-<k>/`` (one folder
    per sub-federation: a log keeps its parties' keys beside it), its clients running
    :class:`FedAvgClient` of ``config``. ``dp``, ``dim``: as for :func:`fedavg`.

    Returns client id -> the model of its cluster.
    """
    assignment = np.asarray(assignment)
    if assignment.shape != (len(clients),):
        raise DataError(f"assignment has shape {assignment.shape}; need one cluster index per "
                        f"client, shape ({len(clients)},)")
    clusters = sorted(set(int(k) for k in assignment))
    bar = progress_bar(total=config.rounds * len(clusters),
                       desc=f"FedAvg x {len(clusters)} cluster(s)", disable=not show_progress,
                       unit="round", leave=False)
    models: dict[str, Classifier] = {}
    for k in clusters:
        members = [c for c, a in zip(clients, assignment, strict=True) if a == k]
        channel = open_channel(members, Path(log_dir) / f"cluster-{k}", FedAvgClient(config))
        try:
            model = fedavg(channel, config, dp=dp, seed=seed, progress=bar.update, dim=dim)
        finally:
            channel.close()
        models.update({c.id: model for c in members})
    bar.close()
    return models


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` [N, d] whose arg-max logit is the label ``y`` [N]."""
    logits = model(torch.as_tensor(x, dtype=torch.float32))
    return float((logits.argmax(1).numpy() == np.asarray(y)).mean())
