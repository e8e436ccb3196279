"""Federated Flow Matching: FFM-vanilla (Alg. 1), FFM-LOT (Alg. 2), FFM-GOT (Alg. 3-5).

One round = one global step. The server broadcasts theta, each client couples a mini-batch of
source noise with a mini-batch of its shard and uploads its gradient; the server applies the
lambda-weighted sum. GOT also keeps the global potential f_phi, updated every
``potential_every`` rounds from federated ``dual_update`` gradients.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import RunConfig
from ..data.pairs import DataPair
from ..federation.engine import InProcessEngine
from ..federation.parties import Client
from ..models.mlp import PotentialMLP, VelocityMLP
from ..models.params import flat_grad, load_flat_params
from .couplings import ExactOTCoupling, IndependentCoupling, SemiDualCoupling
from .flow_matching import flow_matching_loss
from .global_model import GlobalModel
from .semidual import semidual_value

__all__ = ["FederatedFlowMatching", "velocity_gradient", "client_weights"]


def _template(model: GlobalModel) -> dict:
    """The payload a gradient upload must match: one flat float32 vector [P]."""
    count = sum(p.numel() for p in model.module.parameters())
    return {"gradient": ((count,), np.dtype(np.float32))}


def velocity_gradient(model, coupling, x0, x1, generator) -> tuple[np.ndarray, float]:
    """Couple (x0, x1), take the mean flow matching loss, return (flat gradient [P], loss)."""
    model.zero_grad(set_to_none=True)
    x0, x1 = coupling.couple(x0, x1, generator)
    loss = flow_matching_loss(model, x0, x1, generator).mean()
    loss.backward()
    return flat_grad(model), float(loss.detach())


def client_weights(clients: list[Client], weighting: str) -> dict[str, float]:
    """lambda_i: proportional to shard sizes (``size``) or equal (``uniform``); sums to 1."""
    raw = {c.id: float(c.size) if weighting == "size" else 1.0 for c in clients}
    total = sum(raw.values())
    return {cid: w / total for cid, w in raw.items()}


class FederatedFlowMatching:
    """FFM with coupling ``vanilla``, ``lot`` or ``got`` over an engine's clients."""

    def __init__(self, config: RunConfig, pair: DataPair, engine: InProcessEngine,
                 device: torch.device):
        self.config = config
        self.pair = pair
        self.engine = engine
        self.device = device
        self.weights = client_weights(engine.clients, config.weighting)
        self.velocity = GlobalModel(VelocityMLP(pair.dim, config.hidden).to(device),
                                    config.lr, config.ema_decay)
        self.potential = None
        if config.method == "got":
            self.potential = GlobalModel(
                PotentialMLP(pair.dim, config.potential_hidden).to(device), config.potential_lr
            )
        for client in engine.clients:
            client.state["velocity"] = VelocityMLP(pair.dim, config.hidden).to(device)
            if self.potential is not None:
                client.state["potential"] = PotentialMLP(pair.dim, config.potential_hidden).to(
                    device)
            client.state["coupling"] = self._coupling(client)
        if self.potential is not None:
            self.engine.broadcast(0, "global_potential", {"phi": self.potential.flat()})

    def _coupling(self, client: Client):
        if self.config.method == "vanilla":
            return IndependentCoupling()
        if self.config.method == "lot":
            return ExactOTCoupling()
        return SemiDualCoupling(client.state["potential"])

    def _source(self, client: Client, n: int) -> torch.Tensor:
        return self.pair.source.sample(n, client.generator, self.device)[0]

    def _sync(self, client: Client) -> None:
        """Load the latest broadcast parameters into the client's replicas."""
        load_flat_params(client.state["velocity"], client.inbox["global_model"]["theta"])
        if "global_potential" in client.inbox:
            load_flat_params(client.state["potential"], client.inbox["global_potential"]["phi"])

    def _client_velocity(self, client: Client) -> dict[str, np.ndarray]:
        self._sync(client)
        n0 = self.config.candidates if self.config.method == "got" else self.config.batch_size
        x1 = client.minibatch(self.config.batch_size)
        grad, loss = velocity_gradient(client.state["velocity"], client.state["coupling"],
                                       self._source(client, n0), x1, client.generator)
        client.state["last_loss"] = loss
        return {"gradient": grad}

    def _client_dual(self, client: Client) -> dict[str, np.ndarray]:
        potential = client.state["potential"]
        potential.zero_grad(set_to_none=True)
        c = self.config
        x1 = client.minibatch(c.batch_size)
        value = semidual_value(potential, self._source(client, c.batch_size),
                               self._source(client, c.candidates), x1,
                               c.ctransform_steps, c.ctransform_lr)
        (-value).backward()
        client.state["last_dual"] = float(value.detach())
        return {"gradient": flat_grad(potential)}

    def train_round(self, round_: int) -> dict[str, float]:
        """One communication round; returns the clients' mean diagnostics (simulator's view)
        and ``aborted`` = 1 for each aggregation that aborted (the model then stays put)."""
        self.engine.broadcast(round_, "global_model", {"theta": self.velocity.flat()})
        update = self.engine.aggregate(round_, "gradient", self._client_velocity, self.weights,
                                       _template(self.velocity))
        report = {"aborted": 0.0}
        if update.payload is not None:
            self.velocity.apply(update.payload["gradient"])
            report["loss"] = self._mean_state("last_loss", update.included)
        else:
            report["aborted"] += 1
        if self.potential is not None and round_ % self.config.potential_every == 0:
            dual = self.engine.aggregate(round_, "dual_update", self._client_dual, self.weights,
                                         _template(self.potential))
            if dual.payload is not None:
                self.potential.apply(dual.payload["gradient"])
                self.engine.broadcast(round_, "global_potential", {"phi": self.potential.flat()})
                report["dual"] = self._mean_state("last_dual", dual.included)
            else:
                report["aborted"] += 1
        return report

    def _mean_state(self, key: str, included: list[str]) -> float:
        total = sum(self.weights[cid] for cid in included)
        states = {c.id: c.state for c in self.engine.clients}
        return sum(self.weights[cid] * states[cid][key] for cid in included) / total

    def state_dict(self) -> dict:
        state = {"velocity": self.velocity.state_dict()}
        if self.potential is not None:
            state["potential"] = self.potential.state_dict()
        return state
