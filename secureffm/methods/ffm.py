"""Federated Flow Matching: FFM-vanilla (Alg. 1), FFM-LOT (Alg. 2), FFM-GOT (Alg. 3-5).

One round = one global step. The server broadcasts theta, each client couples a mini-batch of
source noise with a mini-batch of its shard and uploads its gradient; the server applies the
lambda-weighted sum. GOT also keeps the global potential f_phi, updated every
``potential_every`` rounds from federated ``dual_update`` gradients.

When the protocol asks for DP on a kind, clients compute those updates with DP-SGD (Poisson
sampling at rate q = batch_size / shard size, per-example clipping, noise) and the ledger
records each invocation. Local noise: each client adds Gaussian noise to its own update.
Distributed noise: clients send clipped sums and secure aggregation adds each client's share of
Skellam noise. Every per-example loss below depends on one data example only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from ..data.pairs import DataPair
from ..errors import ConfigError
from ..federation.channel import Channel
from ..federation.parties import Client
from ..models.mlp import PotentialMLP, VelocityMLP
from ..models.params import load_flat_params
from ..ot import c_transform
from ..privacy.accounting import check_delta, epsilon, smallest_multiplier
from ..privacy.dpsgd import DPGradient, PlainGradient, poisson_rate, poisson_rows
from ..privacy.ledger import LedgerEntry, PrivacyLedger
from ..privacy.settings import DistributedNoise, DPSettings
from ..privacy.skellam import SkellamStep, skellam_epsilon
from .couplings import ExactOTCoupling, IndependentCoupling, SemiDualCoupling
from .flow_matching import flow_matching_loss
from .global_model import GlobalModel

__all__ = ["FederatedFlowMatching", "FFMSettings", "client_weights", "velocity_gradient",
           "LOT_DP_REFUSAL"]

LOT_DP_REFUSAL = (
    "method 'lot' cannot run under DP-SGD: its mini-batch OT plan couples every example with "
    "every other, so adding or removing one example can change every pair and per-example "
    "clipping does not bound the update's sensitivity. Use 'vanilla' or 'got' (whose pairs each "
    "depend on one example), or a protocol without a 'dp' stage (docs/privacy.md)."
)


def velocity_gradient(model, coupling, x0, x1, generator) -> tuple[np.ndarray, float]:
    """Couple (x0, x1), take the mean flow matching loss at t ~ U[0, 1) from ``generator``,
    return (flat gradient [P], loss)."""
    estimator = PlainGradient(model)
    x0, x1 = coupling.couple(x0, x1, generator)
    t = torch.rand(len(x0), generator=generator, device=x0.device)
    losses = flow_matching_loss(model, x0, x1, t)
    return estimator(losses, len(losses)), float(losses.detach().mean())


def client_weights(clients: list[Client], weighting: str,
                   private: bool = False) -> dict[str, float]:
    """lambda_i: proportional to shard sizes (``size``) or equal (``uniform``); sums to 1.

    ``private`` (a dp stage protects the weighted updates): equal, whatever ``weighting``, since
    weights by true shard size would release each size, which adding or removing one example
    changes (add/remove adjacency holds at the public nominal size only)."""
    size = weighting == "size" and not private
    raw = {c.id: float(c.size) if size else 1.0 for c in clients}
    total = sum(raw.values())
    return {cid: w / total for cid, w in raw.items()}


def _template(model: GlobalModel) -> dict:
    """The payload a gradient upload must match: one flat float32 vector [P]."""
    count = sum(p.numel() for p in model.module.parameters())
    return {"gradient": ((count,), np.dtype(np.float32))}


@dataclass(frozen=True)
class FFMSettings:
    """What FFM and its centralized baselines need from a run; the runner builds it.

    ``method``: vanilla | lot | got (federated), icfm | otcfm (centralized). ``rounds``: the
    planned rounds (DP calibrates sigma for them). ``batch_size`` B; ``shard_size``: the public
    nominal shard size (q = B / shard_size under DP). ``weighting``: size | uniform. The
    velocity MLP: ``hidden``, ``lr``, ``ema_decay``. GOT's potential: ``potential_hidden``,
    ``potential_lr``, updated every ``potential_every`` rounds, ``candidates`` K, and the
    c-transform's ``ctransform_steps`` and ``ctransform_lr``. No defaults: the run config holds
    them, and :meth:`of` reads them from it.
    """

    method: str
    rounds: int
    batch_size: int
    shard_size: int
    weighting: str
    hidden: int
    lr: float
    ema_decay: float
    potential_hidden: int
    potential_lr: float
    potential_every: int
    candidates: int
    ctransform_steps: int
    ctransform_lr: float

    @classmethod
    def of(cls, values) -> FFMSettings:
        """The settings of ``values`` (any object with these attributes, e.g. a run config)."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls)})

    @property
    def sent_kinds(self) -> tuple[str, ...]:
        """The kinds of message clients derive from their data: what DP must cover."""
        return ("gradient", "dual_update") if self.method == "got" else ("gradient",)


class FederatedFlowMatching:
    """FFM with coupling ``vanilla``, ``lot`` or ``got`` over a channel's clients."""

    def __init__(self, settings: FFMSettings, dp: DPSettings | None, pair: DataPair,
                 channel: Channel, device: torch.device):
        """``dp``: the DP settings of every kind in ``settings.sent_kinds``, resolved by the
        runner from the protocol (None: no DP)."""
        self.settings = settings
        self.pair = pair
        self.channel = channel
        self.device = device
        self.velocity = GlobalModel(VelocityMLP(pair.dim, settings.hidden).to(device),
                                    settings.lr, settings.ema_decay)
        self.potential = None
        if settings.method == "got":
            self.potential = GlobalModel(
                PotentialMLP(pair.dim, settings.potential_hidden).to(device),
                settings.potential_lr)
        self.dp = dp
        if dp is not None:
            self._check_dp()
        self.weights = client_weights(channel.clients, settings.weighting, private=bool(dp))
        self.ledger = PrivacyLedger(self.dp.delta) if self.dp else None
        self.noise_multipliers: dict[str, float] = {}
        self.distributed = self.dp is not None and self.dp.noise == "distributed"
        self.geometry, self.noise = {}, {}
        for client in channel.clients:
            self._setup_client(client)
        if self.distributed:
            self._plan_distributed_noise()
        if self.potential is not None:
            self.channel.broadcast(0, "global_potential", {"phi": self.potential.flat()})

    # -- set-up --------------------------------------------------------------------------

    def _check_dp(self) -> None:
        """Refuse what DP-SGD cannot bound or run for this method."""
        if self.settings.method == "lot":
            raise ConfigError(LOT_DP_REFUSAL)
        if self.settings.method == "got" and self.settings.ctransform_steps:
            raise ConfigError("ctransform_steps > 0 refines f^c by gradient steps through the "
                              "potential, which DP-SGD's per-example hooks cannot run; use "
                              "ctransform_steps = 0 under a dp protocol")
        check_delta(self.dp.delta, self.settings.shard_size)

    def planned_steps(self, rounds: int | None = None) -> dict[str, int]:
        """DP mechanism invocations per client over ``rounds`` (the run's), by message kind."""
        rounds = self.settings.rounds if rounds is None else rounds
        steps = {"gradient": rounds}
        if self.potential is not None:
            steps["dual_update"] = rounds // self.settings.potential_every
        return steps

    def client_epsilon(self, client: Client, multiplier: float, rounds: int) -> float:
        """The epsilon ``client`` spends in ``rounds`` rounds at noise ``multiplier`` (sigma
        for local noise, tau for distributed noise)."""
        rate, steps = client.state["rate"], self.planned_steps(rounds)
        if not self.distributed:
            return epsilon([(multiplier, rate, n) for n in steps.values()], self.dp.delta,
                           self.dp.accountant)
        schedule = []
        for kind, n in steps.items():
            l2, l1 = self.geometry[kind].sensitivity[client.id]
            schedule.append(SkellamStep(rate, l2, l1,
                                        self.geometry[kind].sum_variance(multiplier), n))
        return skellam_epsilon(schedule, self.dp.delta)

    def _plan_distributed_noise(self) -> None:
        """Geometry of each kind's noise in quantization levels, and one multiplier tau for
        every client and kind: the given one, or the smallest keeping every client within the
        target."""
        clients = self.channel.clients
        sensitivity = {c.id: self.dp.clip / self.settings.batch_size for c in clients}
        sizes = {"gradient": self.velocity.flat().size}
        if self.potential is not None:
            sizes["dual_update"] = self.potential.flat().size
        self.geometry = {kind: self.channel.noise_geometry(kind, self.weights, sensitivity, size)
                         for kind, size in sizes.items()}
        tau = self.dp.noise_multiplier or smallest_multiplier(
            lambda m: max(self.client_epsilon(c, m, self.settings.rounds) for c in clients),
            self.dp.target_epsilon, self.dp.delta)
        self.noise_multipliers = {c.id: tau for c in clients}
        self.noise = {kind: DistributedNoise(tau, sensitivity, self.dp.colluders)
                      for kind in sizes}

    def rounds_within_budget(self) -> int:
        """The most rounds every client can run without its epsilon exceeding the target
        (all rounds when sigma was calibrated to the target, or when there is no target)."""
        if self.dp is None or self.dp.target_epsilon is None:
            return self.settings.rounds

        def fits(rounds: int) -> bool:
            return all(self.client_epsilon(c, self.noise_multipliers[c.id], rounds)
                       <= self.dp.target_epsilon for c in self.channel.clients)

        low, high = 0, self.settings.rounds
        if fits(high):
            return high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low

    def _setup_client(self, client: Client) -> None:
        c = self.settings
        velocity = VelocityMLP(self.pair.dim, c.hidden).to(self.device)
        client.state["velocity"] = velocity
        if self.potential is not None:
            potential = PotentialMLP(self.pair.dim, c.potential_hidden).to(self.device)
            client.state["potential"] = potential
        client.state["coupling"] = self._coupling(client)
        if self.dp is None:
            client.state["velocity_grad"] = PlainGradient(velocity)
            if self.potential is not None:
                client.state["dual_grad"] = PlainGradient(potential)
            return
        rate = poisson_rate(c.batch_size, c.shard_size)  # the public nominal shard size
        client.state["rate"] = rate
        if self.dp.noise == "distributed":  # the clipped sum; secure aggregation adds noise
            sigma = 0.0
        else:
            sigma = self.dp.noise_multiplier or smallest_multiplier(
                lambda m: self.client_epsilon(client, m, c.rounds), self.dp.target_epsilon,
                self.dp.delta)
            self.noise_multipliers[client.id] = sigma
        # Sampling and noise must be unpredictable: OS entropy, never the published seed.
        secret = client.streams.torch("dp", self.device)
        client.state["dp_rng"] = secret
        # The divisor is the expected batch at the nominal size, q * shard_size = batch_size.
        client.state["velocity_grad"] = DPGradient(velocity, self.dp.clip, sigma,
                                                   c.batch_size, secret)
        if self.potential is not None:  # f at two points per example: linear mode's two passes
            client.state["dual_grad"] = DPGradient(potential, self.dp.clip, sigma,
                                                   c.batch_size, secret)

    def _coupling(self, client: Client):
        if self.settings.method == "vanilla":
            return IndependentCoupling()
        if self.settings.method == "lot":
            return ExactOTCoupling()
        return SemiDualCoupling(client.state["potential"])

    # -- client side ---------------------------------------------------------------------

    def _rows(self, client: Client) -> torch.Tensor:
        """Indices [b] of this step's examples: Poisson sampling under DP (rate q, the secret
        dp stream), else a uniform mini-batch."""
        if self.dp is None:
            return client.minibatch_rows(self.settings.batch_size)
        rows = poisson_rows(client.size, client.state["rate"], client.state["dp_rng"])
        return rows.to(client.data.device)

    def example_noise(self, client: Client, round_: int, kind: str,
                      rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Source points x0 [b, d] and times t [b] of the examples ``rows``: example r's draw
        is keyed by (the client's secret key, round, kind, r) alone, so adding or removing an
        example never changes another's noise, this round or later."""
        u = client.example_uniforms((round_, kind, "example"), rows, self.pair.source.uniforms + 1)
        return self.pair.source.from_uniforms(u[:, 1:])[0], u[:, 0].to(torch.float32)

    def candidate_pool(self, client: Client, round_: int, kind: str) -> torch.Tensor:
        """GOT's K candidate source points [K, d] for one round and kind: K draws keyed by
        (the client's secret key, round, kind), whatever the batch."""
        rows = torch.arange(self.settings.candidates)
        u = client.example_uniforms((round_, kind, "pool"), rows, self.pair.source.uniforms)
        return self.pair.source.from_uniforms(u)[0]

    def velocity_losses(self, client: Client, round_: int, rows: torch.Tensor) -> torch.Tensor:
        """Per-example flow matching losses [b] of the examples ``rows``; term j depends on
        example rows[j], its keyed noise and (GOT) the round's keyed candidate pool only."""
        x1 = client.data[rows]
        x0, t = self.example_noise(client, round_, "gradient", rows)
        if self.settings.method == "got":
            x0 = self.candidate_pool(client, round_, "gradient")
        x0, x1 = client.state["coupling"].couple(x0, x1, client.generator)
        return flow_matching_loss(client.state["velocity_grad"].forward_module, x0, x1, t)

    def dual_losses(self, client: Client, round_: int, rows: torch.Tensor) -> torch.Tensor:
        """Ascent on the semi-dual: per example j, loss_j = -(f(x0_j) + f^c(x1_j)) with x0_j the
        example's keyed source draw and f^c the minimum over the round's K keyed candidates, so
        each term (and each clipped gradient under DP) belongs to one data example."""
        c = self.settings
        f = client.state["dual_grad"].forward_module
        x0, _ = self.example_noise(client, round_, "dual_update", rows)
        pool = self.candidate_pool(client, round_, "dual_update")
        return -(f(x0) + c_transform(f, pool, client.data[rows], c.ctransform_steps,
                                     c.ctransform_lr))

    def _record(self, client: Client, kind: str, round_: int) -> None:
        if self.ledger is None:
            return
        rate, multiplier = client.state["rate"], self.noise_multipliers[client.id]
        if not self.distributed:
            self.ledger.record(LedgerEntry(client.id, kind, round_, rate, multiplier,
                                           self.dp.clip))
            return
        l2, l1 = self.geometry[kind].sensitivity[client.id]
        self.ledger.record(LedgerEntry(client.id, kind, round_, rate, multiplier, self.dp.clip,
                                       mechanism="skellam", l2=l2, l1=l1,
                                       variance=self.geometry[kind].sum_variance(multiplier)))

    def _sync(self, client: Client) -> None:
        """Load the latest broadcast parameters into the client's replicas."""
        load_flat_params(client.state["velocity"], client.inbox["global_model"]["theta"])
        if "global_potential" in client.inbox:
            load_flat_params(client.state["potential"], client.inbox["global_potential"]["phi"])

    def _client_velocity(self, client: Client, round_: int) -> dict[str, np.ndarray]:
        self._sync(client)
        losses = self.velocity_losses(client, round_, self._rows(client))
        grad = client.state["velocity_grad"](losses, len(losses))
        self._record(client, "gradient", round_)
        client.state["last_loss"] = float(losses.detach().mean()) if len(losses) else 0.0
        return {"gradient": grad}

    def _client_dual(self, client: Client, round_: int) -> dict[str, np.ndarray]:
        losses = self.dual_losses(client, round_, self._rows(client))
        grad = client.state["dual_grad"](losses, len(losses))
        self._record(client, "dual_update", round_)
        client.state["last_dual"] = float(-losses.detach().mean()) if len(losses) else 0.0
        return {"gradient": grad}

    # -- rounds --------------------------------------------------------------------------

    def train_round(self, round_: int) -> dict[str, float]:
        """One communication round; returns the clients' mean diagnostics (simulator's view)
        and ``aborted`` = 1 for each aggregation that aborted (the model then stays put)."""
        self.channel.broadcast(round_, "global_model", {"theta": self.velocity.flat()})
        update = self.channel.aggregate(round_, "gradient",
                                        lambda client: self._client_velocity(client, round_),
                                        self.weights, _template(self.velocity),
                                        self.noise.get("gradient"))
        report = {"aborted": 0.0}
        # Client losses are not privatized: under DP the simulator does not report them.
        diagnostics = self.dp is None
        if update.payload is not None:
            self.velocity.apply(update.payload["gradient"])
            if diagnostics:
                report["loss"] = self._mean_state("last_loss", update.included)
        else:
            report["aborted"] += 1
        if self.potential is not None and round_ % self.settings.potential_every == 0:
            dual = self.channel.aggregate(round_, "dual_update",
                                          lambda client: self._client_dual(client, round_),
                                          self.weights, _template(self.potential),
                                          self.noise.get("dual_update"))
            if dual.payload is not None:
                self.potential.apply(dual.payload["gradient"])
                self.channel.broadcast(round_, "global_potential",
                                       {"phi": self.potential.flat()})
                if diagnostics:
                    report["dual"] = self._mean_state("last_dual", dual.included)
            else:
                report["aborted"] += 1
        return report

    def _mean_state(self, key: str, included: list[str]) -> float:
        total = sum(self.weights[cid] for cid in included)
        states = {c.id: c.state for c in self.channel.clients}
        return sum(self.weights[cid] * states[cid][key] for cid in included) / total

    def state_dict(self) -> dict:
        state = {"velocity": self.velocity.state_dict()}
        if self.potential is not None:
            state["potential"] = self.potential.state_dict()
        if self.ledger is not None:
            state["ledger"] = self.ledger.state_dict()
        return state
