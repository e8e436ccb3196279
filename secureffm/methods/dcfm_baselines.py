"""DCFM's baselines: FedFlow (FedAvg of one conditional flow) and DDM (independent experts with
a router built from marginal label statistics), each optionally with the local CI penalty (+L).

- FedFlow (Tun et al. 2023): each round the server publishes theta (``global_model``, carried
  by the aggregation's first exchange); every client runs ``fedflow_local_steps`` steps of
  :func:`~secureffm.methods.dcfm.expert_losses` from theta (task ``fedflow.update`` of
  :class:`~secureffm.methods.dcfm.DCFMClient`) and returns theta_i - theta as an ``update``,
  which the channel aggregates through the protocol (weighted mean); the server adds it to
  theta. Local step s of round r draws each example's x0, t and mask keyed by (r, s,
  ``update``) and its shard index, as every
  :class:`~secureffm.methods.dcfm.LocalExpert` step does.
- DDM (McAllister et al. 2025, without its data clustering step, which would break locality):
  stage-I experts uploaded once as ``model`` messages; a combination y is sampled from the
  mixture of velocities sum_b w_b(y) v_b(x, t, y) with w_b(y) proportional to
  n_b prod_i (n_b(y_i) + 1) / (n_b + |Y_i|) (naive Bayes on each expert's marginal label
  counts, add-one smoothed so a combination no expert holds still gets a mixture).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..federation.channel import Channel, Task
from ..models.params import flat_params, load_flat_params
from ..privacy.budget import ServerLedger
from ..progress import progress_bar

__all__ = ["FedFlow", "router_weights", "RouterField"]


class FedFlow:
    """The server's theta (``model``) and the FedAvg loop over the channel's clients, each
    starting every round from the broadcast theta; ``ledger`` (None without DP) is charged
    ``local_steps`` ``update`` steps per asked client and round."""

    def __init__(self, channel: Channel, model: nn.Module, weights: dict[str, float],
                 local_steps: int, ledger: ServerLedger | None = None):
        self.channel, self.model, self.weights = channel, model, weights
        self.local_steps, self.ledger = local_steps, ledger
        self.template = {"update": ((sum(p.numel() for p in model.parameters()),),
                                    np.dtype(np.float32))}

    def run(self, rounds: int, progress: bool) -> int:
        """``rounds`` FedAvg rounds; returns how many aborted (theta then stays put)."""
        aborted = 0
        bar = progress_bar(range(1, rounds + 1), desc="FedFlow rounds", disable=not progress,
                           unit="round", dynamic_ncols=True)
        for round_ in bar:
            result = self.channel.aggregate(
                round_, "update", Task("fedflow.update", {"round": round_}), self.weights,
                self.template, broadcast={"global_model": {"theta": flat_params(self.model)}})
            if self.ledger is not None:
                self.ledger.charge(result.asked, "update", round_, self.local_steps)
            if result.payload is None:
                aborted += 1
                continue
            load_flat_params(self.model, flat_params(self.model) + result.payload["update"])
        return aborted


def router_weights(counts: torch.Tensor, y: torch.Tensor,
                   cardinalities: Sequence[int]) -> torch.Tensor:
    """DDM's router: w [N, n] from counts [n, prod |Y_j|] and labels y [N, k] (rows sum to 1)."""
    n = counts.shape[0]
    table = counts.reshape(n, *cardinalities).double()
    sizes = counts.sum(dim=1).double()  # [n]
    k = len(cardinalities)
    log_w = torch.log(sizes.clamp_min(1)).expand(y.shape[0], n).clone()
    for j, card in enumerate(cardinalities):
        marginal = table.sum(dim=[d + 1 for d in range(k) if d != j])  # [n, card]
        log_w += torch.log((marginal[:, y[:, j].cpu()].T + 1) / (sizes + card))
    return torch.softmax(log_w, dim=1).float().to(y.device)


class RouterField(nn.Module):
    """v(x, t) = sum_b w_b(y) v_b(x, t, y) for fixed labels y [N, k] (DDM's sampler)."""

    def __init__(self, experts: Sequence[nn.Module], counts: torch.Tensor, y: torch.Tensor,
                 cardinalities: Sequence[int]):
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.y = y
        self.weights = router_weights(counts, y, cardinalities)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(-1).expand(x.shape[0])
        shape = (-1,) + (1,) * (x.dim() - 1)
        return sum(self.weights[:, b].reshape(shape) * expert(x, t, self.y)
                   for b, expert in enumerate(self.experts))
