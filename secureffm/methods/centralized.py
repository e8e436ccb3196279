"""Centralized baselines on pooled data: I-CFM (independent coupling) and OT-CFM (exact
mini-batch OT, Tong et al. 2023). No federation: one party holds every shard."""

from __future__ import annotations

import torch

from ..data.pairs import DataPair
from ..federation.parties import Client
from ..models.mlp import VelocityMLP
from .couplings import ExactOTCoupling, IndependentCoupling
from .ffm import FFMSettings, velocity_gradient
from .global_model import GlobalModel
from .round_report import RoundReport

__all__ = ["CentralizedFlowMatching"]


class CentralizedFlowMatching:
    """Trains one velocity field on the pooled shards, ``batch_size`` pairs per step."""

    potential = None

    def __init__(self, settings: FFMSettings, pair: DataPair, pooled: Client,
                 device: torch.device):
        self.settings = settings
        self.pair = pair
        self.party = pooled
        self.device = device
        self.velocity = GlobalModel(VelocityMLP(pair.dim, settings.hidden).to(device),
                                    settings.lr, settings.ema_decay, settings.lr_warmup)
        self.coupling = IndependentCoupling() if settings.method == "icfm" else ExactOTCoupling()

    def train_round(self, round_: int) -> RoundReport:
        generator = self.party.generator
        x0 = self.pair.source.sample(self.settings.batch_size, generator, self.device)[0]
        x1 = self.party.minibatch(self.settings.batch_size)
        grad, loss = velocity_gradient(self.velocity.module, self.coupling, x0, x1, generator)
        self.velocity.apply(grad)
        return RoundReport(diagnostics={"loss": loss})

    def state_dict(self) -> dict:
        return {"velocity": self.velocity.state_dict()}
