"""Federated Wasserstein coresets (FedWAD Sec. 4, App. D.2; Claici et al. 2018).

The server learns K points C = (c_1, ..., c_K) minimising the mean over clients of
W_p(1/K sum_k delta_{c_k}, mu_i), with ``clients_per_epoch`` clients drawn per epoch and each
client optionally subsampling its data. The server holds C, so FedWAD runs between the server
and one client at a time (:func:`engine_fedwad`): the server sends xi, the client returns
its interpolating measure xi_i between its data and xi (``measure``), the server interpolates
between C and xi itself and then between the two; after K iterations the client sends
W_p(xi, mu_i) (``scalar``), the only distance it reveals. :func:`engine_fedwad` also runs
between two clients' row sets (federated OTDD uses it on class subsets and augmented rows).

Gradient: with xi on the geodesic from C to mu_i, W_p(C, xi) = t W_p(C, mu_i) and the optimal
plans agree, so d W_p(C, xi) / dC at fixed xi equals d W_p(C, mu_i) / dC (envelope theorem: the
plan is held fixed). The server takes it through POT's plan and torch, and steps C with Adam.
``exact = True`` is the non-federated reference of the paper's Fig. 4: the server reads each
sampled client's (sub)sample and uses W_p(C, mu_i) directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ConfigError, DataError, MessageError
from ..federation.engine import InProcessEngine
from ..federation.message import SERVER
from ..federation.parties import Client
from ..protocols.protocol import Protocol
from ..transport import emd_plan
from .fedwad import (
    FedWADConfig,
    Measure,
    add_noise,
    draw_t,
    ground_cost,
    initial_measure,
    interpolate,
    wasserstein,
)
from .fedwad_federated import measure_payload, payload_measure

__all__ = ["CoresetConfig", "CoresetResult", "Side", "engine_fedwad", "coreset_distance",
           "learn_coreset"]


@dataclass(frozen=True)
class CoresetConfig:
    """``size``: K coreset points. ``epochs``: gradient steps. ``clients_per_epoch``: clients
    drawn (without replacement) per step. ``samples_per_client``: rows each drawn client
    subsamples per step (0: all). ``lr``: Adam's step size. ``fedwad``: the distance's settings.
    ``seed``: the server's generator (client draws, xi^(0), its t)."""

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


Side = Measure | tuple[Client, np.ndarray]


def _interpolate_at(engine, protocol, round_, side: Side, xi: Measure, config: FedWADConfig,
                    rng: np.random.Generator) -> Measure | None:
    """The side's interpolating measure between its data and ``xi``: computed by the server
    for a measure it holds, else by the client from the xi it received (``measure`` both ways,
    t and noise from the client's ``protocol_rng``)."""
    p, exact, tol = config.p, config.exact, config.prune_tol
    if isinstance(side, Measure):
        return interpolate(side, xi, draw_t(config, rng), p, exact, tol)
    client, rows = side
    sent = protocol.send(engine, round_, "broadcast", "measure", SERVER, client.id,
                         measure_payload(xi))
    if sent is None:
        return None
    own = interpolate(Measure.uniform(rows), payload_measure(sent, SERVER, xi.dim),
                      draw_t(config, client.protocol_rng), p, exact, tol)
    own = add_noise(own, config.noise_std, client.protocol_rng)
    returned = protocol.send(engine, round_, "upload", "measure", client.id, SERVER,
                             measure_payload(own))
    return None if returned is None else payload_measure(returned, client.id, xi.dim)


def _distance_to(engine, protocol, round_, side: Side, xi: Measure,
                 config: FedWADConfig) -> float | None:
    """W_p(side's data, xi): the server's own, or the one ``scalar`` the client reveals."""
    if isinstance(side, Measure):
        return wasserstein(side, xi, config.p)
    client, rows = side
    sent = protocol.send(engine, round_, "broadcast", "measure", SERVER, client.id,
                         measure_payload(xi))
    if sent is None:
        return None
    own = wasserstein(Measure.uniform(rows), payload_measure(sent, SERVER, xi.dim), config.p)
    scalar = protocol.send(engine, round_, "upload", "scalar", client.id, SERVER,
                           {"distance": np.array([own])})
    if scalar is None:
        return None
    value = scalar.get("distance")
    if value is None or value.shape != (1,) or not np.isfinite(value[0]) or value[0] < 0:
        raise MessageError(f"distance from {client.id} must be one finite non-negative number")
    return float(value[0])


def engine_fedwad(engine: InProcessEngine, protocol: Protocol, round_: int, first: Side,
                  second: Side, config: FedWADConfig,
                  rng: np.random.Generator) -> tuple[float, Measure] | None:
    """Algorithm 1 through the engine between two sides, each a measure the server holds (a
    coreset) or ``(client, rows [N, d])`` that the client holds and never sends.

    Uses rounds ``round_`` .. ``round_ + K`` (phases ``broadcast`` and ``upload``); ``rng`` is
    the server's (xi^(0), its t). Distances are revealed only for the last iterate (one
    ``scalar`` per client side); a ``randomized-t`` stage on ``measure`` sets the t range and
    the noise on returned support points. Returns (W_p(first, xi) + W_p(xi, second), xi), or
    None when a message was lost (the engine's log says why).
    """
    stage = protocol.stage_for("randomized-t", "measure")
    if stage is not None:
        config = replace(config, t_range=stage.t_range, noise_std=stage.noise_std)
    dim = first.dim if isinstance(first, Measure) else first[1].shape[1]
    xi = initial_measure(config, dim, rng)
    for k in range(config.iterations):
        ends = [_interpolate_at(engine, protocol, round_ + k, side, xi, config, rng)
                for side in (first, second)]
        if any(end is None for end in ends):
            return None
        xi = interpolate(ends[0], ends[1], draw_t(config, rng), config.p, config.exact,
                         config.prune_tol)
    last = round_ + config.iterations
    parts = [_distance_to(engine, protocol, last, side, xi, config) for side in (first, second)]
    if any(part is None for part in parts):
        return None
    return parts[0] + parts[1], xi


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


def _sample(client: Client, count: int) -> np.ndarray:
    rows = client.minibatch(count) if 0 < count < client.size else client.data
    return rows.detach().cpu().double().numpy()


def learn_coreset(engine: InProcessEngine, protocol: Protocol, initial: np.ndarray,
                  config: CoresetConfig, exact: bool = False,
                  show_progress: bool = True) -> CoresetResult:
    """Learn ``config.size`` points from ``initial`` [K, d] over ``engine``'s clients (module
    docstring); ``exact``: the non-federated reference (the server reads the clients' rows)."""
    initial = np.asarray(initial, dtype=np.float64)
    dim = int(engine.clients[0].data.shape[1])
    if initial.shape != (config.size, dim):
        raise DataError(f"initial coreset has shape {initial.shape}; need ({config.size}, "
                        f"{dim}) for size = {config.size} in the clients' dimension")
    if config.clients_per_epoch > len(engine.clients):
        raise ConfigError(f"clients_per_epoch = {config.clients_per_epoch} but the federation "
                          f"has {len(engine.clients)} clients; draw at most that many")
    rng = np.random.default_rng(config.seed)
    points = torch.tensor(initial, requires_grad=True)
    optimizer = torch.optim.Adam([points], lr=config.lr)
    p, round_, losses = config.fedwad.p, 1, []
    bar = tqdm(range(config.epochs), desc="coreset (exact W)" if exact else "coreset (FedWAD)",
               disable=not show_progress, unit="epoch", leave=False)
    for _ in bar:
        chosen = rng.choice(len(engine.clients), config.clients_per_epoch, replace=False)
        held = Measure.uniform(points.detach().numpy())
        terms, values = [], []
        for index in chosen:
            client = engine.clients[int(index)]
            data = _sample(client, config.samples_per_client)
            if exact:
                target = Measure.uniform(data)
                terms.append(coreset_distance(points, target, p))
                values.append(float(terms[-1].detach()))
                continue
            outcome = engine_fedwad(engine, protocol, round_, held, (client, data),
                                    config.fedwad, rng)
            round_ += config.fedwad.iterations + 1
            if outcome is None:
                continue
            distance, xi = outcome
            terms.append(coreset_distance(points, xi, p))
            values.append(distance)
        if not terms:
            continue
        optimizer.zero_grad(set_to_none=True)
        torch.stack(terms).mean().backward()
        optimizer.step()
        losses.append(float(np.mean(values)))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return CoresetResult(points.detach().numpy().copy(), initial, tuple(losses))
