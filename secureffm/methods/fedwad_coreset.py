"""Federated Wasserstein coresets (FedWAD Sec. 4, App. D.2; Claici et al. 2018).

The server learns K points C = (c_1, ..., c_K) minimising the mean over clients of
W_p(1/K sum_k delta_{c_k}, mu_i), with ``clients_per_epoch`` clients drawn per epoch and each
client optionally subsampling its data. The server holds C, so FedWAD runs between the server
and one client at a time (``federated_distance`` with the coreset as the server's side): the
server sends xi, the client returns its interpolating measure between its data and xi
(``measure``), the server interpolates between C and xi itself and then between the two; the
client reveals W_p(its data, xi) as a ``scalar`` (only at the last iteration under
``randomized-t``).

Gradient: with xi on the geodesic from C to mu_i, W_p(C, xi) = t W_p(C, mu_i) and the optimal
plans agree, so d W_p(C, xi) / dC at fixed xi equals d W_p(C, mu_i) / dC (envelope theorem: the
plan is held fixed). The server takes it through POT's plan and torch, and steps C with Adam.
``exact = True`` is the non-federated reference of the paper's Fig. 4: the server reads each
sampled client's (sub)sample and uses W_p(C, mu_i) directly (in-process only).

Each client runs :func:`coreset_client` (its own program, on any engine): it draws its own
subsample (:class:`~.fedwad_federated.Rows` ``sample``) and refuses a count other than its own
config's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError, DataError, ProtocolError
from ..federation.channel import Channel
from ..federation.parties import Client
from ..ot import emd_plan
from ..privacy.settings import GeodesicPrivacy
from ..progress import progress_bar
from .fedwad import FedWADConfig, Measure, ground_cost
from .fedwad_federated import (
    FedWADClient,
    Rows,
    federated_distance,
    rounds_per_distance,
    sample_dim,
)

__all__ = ["CoresetConfig", "CoresetResult", "coreset_distance", "learn_coreset",
           "coreset_client"]


@dataclass(frozen=True)
class CoresetConfig:
    """``size``: K coreset points. ``epochs``: gradient steps. ``clients_per_epoch``: clients
    drawn (without replacement) per step. ``samples_per_client``: rows each drawn client
    subsamples per step (0: all). ``lr``: Adam's step size. ``fedwad``: the distance's settings.
    ``seed``: the server's draws of clients per epoch (FedWAD's own draws follow
    ``fedwad.seed`` and the round)."""

    size: int = 10
    epochs: int = 100
    clients_per_epoch: int = 10
    samples_per_client: int = 0
    lr: float = 0.05
    fedwad: FedWADConfig = field(default_factory=lambda: FedWADConfig(iterations=5,
                                                                      support_size=10))
    seed: int = 0

    def __post_init__(self):
        for name in ("size", "epochs", "clients_per_epoch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"CoresetConfig.{name} = {getattr(self, name)!r}: need an "
                                  "integer >= 1")
        if self.samples_per_client < 0:
            raise ConfigError(f"samples_per_client = {self.samples_per_client}: use 0 (all "
                              "rows) or a positive count")
        if not self.lr > 0:
            raise ConfigError(f"lr = {self.lr}: must be > 0")


@dataclass(frozen=True)
class CoresetResult:
    """``points`` [K, d]: the learned coreset; ``initial`` [K, d]: where it started;
    ``losses``: per epoch, the mean distance (FedWAD's, or exact W_p) over the clients heard."""

    points: np.ndarray
    initial: np.ndarray
    losses: tuple[float, ...]


def coreset_distance(points: torch.Tensor, target: Measure, p: int) -> torch.Tensor:
    """W_p between the uniform measure on ``points`` [K, d] and ``target``, differentiable in
    ``points`` with the optimal plan held fixed (envelope theorem)."""
    weights = np.full(len(points), 1.0 / len(points))
    support = torch.as_tensor(target.support, dtype=points.dtype)
    plan = torch.as_tensor(emd_plan(ground_cost(points.detach().double().numpy(),
                                                target.support, p), weights, target.weights),
                           dtype=points.dtype)
    squared = (points[:, None, :] - support[None, :, :]).pow(2).sum(-1)
    ground = squared if p == 2 else squared.clamp_min(1e-24).sqrt()  # finite gradient at 0
    return (plan * ground).sum().clamp_min(1e-12).pow(1.0 / p)


def coreset_client(config: CoresetConfig, privacy: GeodesicPrivacy | None) -> FedWADClient:
    """A client's program for :func:`learn_coreset`, from its own copy of ``config`` and of the
    protocol's randomized-t protections (``privacy``)."""
    return FedWADClient(config.fedwad, privacy, samples=config.samples_per_client)


def _sample(client: Client, count: int) -> np.ndarray:
    """The exact reference's rows: the server draws them from a client in its process."""
    if not isinstance(client, Client):
        raise ConfigError(f"{client.id} runs elsewhere: the exact reference reads clients' "
                          "rows, so it runs in-process only; drop exact")
    rows = client.minibatch(count) if 0 < count < client.size else client.data
    return rows.detach().cpu().double().numpy()


def learn_coreset(channel: Channel, privacy: GeodesicPrivacy | None, initial: np.ndarray,
                  config: CoresetConfig, exact: bool = False, show_progress: bool = True,
                  dim: int | None = None) -> CoresetResult:
    """Learn ``config.size`` points from ``initial`` [K, d] over ``channel``'s clients (module
    docstring), each running :func:`coreset_client`; ``privacy``: the randomized-t protections
    of measure messages, or None; ``exact``: the non-federated reference (the server reads the
    clients' rows, in-process only); ``dim``: d by the public data recipe, needed when the
    clients run elsewhere (on Flower)."""
    initial = np.asarray(initial, dtype=np.float64)
    dim = sample_dim(channel.clients[0], dim)
    if initial.shape != (config.size, dim):
        raise DataError(f"initial coreset has shape {initial.shape}; need ({config.size}, "
                        f"{dim}) for size = {config.size} in the clients' dimension")
    if config.clients_per_epoch > len(channel.clients):
        raise ConfigError(f"clients_per_epoch = {config.clients_per_epoch} but the federation "
                          f"has {len(channel.clients)} clients; draw at most that many")
    rng = np.random.default_rng(config.seed)
    points = torch.tensor(initial, requires_grad=True)
    optimizer = torch.optim.Adam([points], lr=config.lr)
    p, round_, losses = config.fedwad.p, 1, []
    bar = progress_bar(range(config.epochs),
                       desc="coreset (exact W)" if exact else "coreset (FedWAD)",
                       disable=not show_progress, unit="epoch", leave=False)
    for _ in bar:
        chosen = rng.choice(len(channel.clients), config.clients_per_epoch, replace=False)
        held = Measure.uniform(points.detach().numpy())
        terms, values = [], []
        for index in chosen:
            client = channel.clients[int(index)]
            if exact:
                target = Measure.uniform(_sample(client, config.samples_per_client))
                terms.append(coreset_distance(points, target, p))
                values.append(float(terms[-1].detach()))
                continue
            side = Rows(client.id, sample=config.samples_per_client)
            try:
                result = federated_distance(channel, privacy, held, side, config.fedwad, round_,
                                            dim=dim)
            except ProtocolError:  # a lost message (logged): this client sits the epoch out
                continue
            finally:
                round_ += rounds_per_distance(config.fedwad)
            terms.append(coreset_distance(points, result.measure, p))
            values.append(result.distance)
        if not terms:
            continue
        optimizer.zero_grad(set_to_none=True)
        torch.stack(terms).mean().backward()
        optimizer.step()
        losses.append(float(np.mean(values)))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return CoresetResult(points.detach().numpy().copy(), initial, tuple(losses))
