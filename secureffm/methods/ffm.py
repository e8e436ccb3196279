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

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import torch

from ..data.images import ImagePair
from ..data.pairs import DataPair
from ..errors import ConfigError
from ..federation.channel import Channel, Task, TaskRefused, task_count
from ..federation.parties import Client
from ..models.dp_layers import dp_unsupported_layers
from ..models.mlp import PotentialMLP, VelocityMLP
from ..models.params import flat_params, load_flat_params
from ..models.unet import make_unet
from ..ot import c_transform
from ..privacy import budget
from ..privacy.accounting import check_delta
from ..privacy.budget import Plan, ServerLedger
from ..privacy.canaries import canary_sum
from ..privacy.dpsgd import Deferred, DPGradient, PlainGradient, poisson_rate, poisson_rows
from ..privacy.ledger import LedgerEntry, PrivacyLedger
from ..privacy.releases import Budget, ReleaseGuard, Rounds
from ..privacy.settings import DistributedNoise, DPSettings, NoiseGeometry
from .couplings import ExactOTCoupling, IndependentCoupling, SemiDualCoupling
from .flow_matching import flow_matching_loss
from .global_model import GlobalModel
from .round_report import RoundReport

__all__ = ["FederatedFlowMatching", "FFMClient", "FFMSettings", "planned_steps", "dp_plan",
           "local_noise_multiplier", "plan_distributed_noise", "client_weights",
           "velocity_gradient",
           "LOT_DP_REFUSAL", "velocity_network", "image_velocity", "potential_network",
           "autocast_dtype", "check_dp_layers"]

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
                   equal: bool = False) -> dict[str, float]:
    """lambda_i: proportional to shard sizes (``size``) or equal (``uniform``); sums to 1.

    ``equal``: equal, whatever ``weighting``, when a dp stage protects the weighted updates
    (weights by true shard size would release each size, which adding or removing one example
    changes: add/remove adjacency holds at the public nominal size only) or secure aggregation
    sums them (each client weighs its own input 1 and refuses another weight:
    :meth:`Channel.equal_weights`)."""
    size = weighting == "size" and not equal
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
    velocity MLP: ``hidden``, ``lr`` (raised linearly over ``lr_warmup`` rounds, 0: none),
    ``ema_decay``; on images the U-Net: ``unet_width``,
    ``unet_mult``, ``unet_blocks``, ``unet_attention``, ``unet_layout`` (see
    :func:`~secureffm.models.unet.make_unet`).
    GOT's potential: ``potential_hidden``, ``potential_lr``, updated every ``potential_every``
    rounds, ``candidates`` K, and the c-transform's ``ctransform_steps`` and ``ctransform_lr``.
    ``precision``: auto (bf16 autocast of the velocity's forward for images on CUDA, else
    float32) | fp32 | bf16. No defaults: the run config holds them, and :meth:`of` reads them
    from it.
    """

    method: str
    rounds: int
    batch_size: int
    shard_size: int
    weighting: str
    hidden: int
    lr: float
    lr_warmup: int
    ema_decay: float
    potential_hidden: int
    potential_lr: float
    potential_every: int
    candidates: int
    ctransform_steps: int
    ctransform_lr: float
    unet_width: int
    unet_mult: tuple[int, ...]
    unet_blocks: int
    unet_attention: tuple[int, ...]
    unet_layout: str
    precision: str

    @classmethod
    def of(cls, values) -> FFMSettings:
        """The settings of ``values`` (any object with these attributes, e.g. a run config)."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls)})

    def dual_round(self, round_: int) -> bool:
        """Whether GOT's potential takes a step in ``round_`` (every ``potential_every``)."""
        return self.method == "got" and round_ % self.potential_every == 0

    @property
    def sent_kinds(self) -> tuple[str, ...]:
        """The kinds of message clients derive from their data: what DP must cover."""
        return ("gradient", "dual_update") if self.method == "got" else ("gradient",)


def velocity_network(settings: FFMSettings, pair: DataPair | ImagePair) -> torch.nn.Module:
    """v_theta: the U-Net for images (:class:`ImagePair`), else the MLP on R^d."""
    if isinstance(pair, ImagePair):
        return image_velocity(settings, pair.shape)
    return VelocityMLP(pair.dim, settings.hidden)


def image_velocity(settings: FFMSettings, shape: tuple[int, int, int]) -> torch.nn.Module:
    """The U-Net of ``settings`` for images of ``shape`` (C, H, W)."""
    channels, size, _ = shape
    return make_unet(settings.unet_layout, channels, base_width=settings.unet_width,
                     channel_mult=settings.unet_mult, blocks=settings.unet_blocks,
                     attention=settings.unet_attention, image_size=size)


def potential_network(settings: FFMSettings, pair: DataPair | ImagePair) -> torch.nn.Module:
    """GOT's f_phi on the source: an MLP on the flattened source point (images included)."""
    return PotentialMLP(pair.dim, settings.potential_hidden)


def autocast_dtype(settings: FFMSettings, pair: DataPair | ImagePair,
                   device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the velocity's forward pass, or None for float32."""
    if settings.precision == "bf16" or (settings.precision == "auto" and device.type == "cuda"
                                        and isinstance(pair, ImagePair)):
        return torch.bfloat16
    return None


def check_dp_layers(model: torch.nn.Module, what: str) -> None:
    """Refuse, naming the layer, a ``what`` network that DP-SGD cannot clip per example."""
    problems = dp_unsupported_layers(model)
    if problems:
        raise ConfigError(f"the {what} network cannot be trained with DP-SGD: "
                          + "; ".join(problems))


def planned_steps(settings: FFMSettings, rounds: int | None = None) -> dict[str, int]:
    """DP mechanism invocations per client over ``rounds`` (the settings' by default), by
    message kind."""
    rounds = settings.rounds if rounds is None else rounds
    steps = {"gradient": rounds}
    if settings.method == "got":
        steps["dual_update"] = rounds // settings.potential_every
    return steps


def dp_plan(settings: FFMSettings, rounds: int | None = None) -> Plan:
    """A client's DP-SGD steps over ``rounds`` (the settings' by default), each kind's at
    q = batch_size / the public nominal shard size (:func:`planned_steps`)."""
    return Plan(poisson_rate(settings.batch_size, settings.shard_size),
                tuple(planned_steps(settings, rounds).items()))


def local_noise_multiplier(settings: FFMSettings, dp: DPSettings) -> float:
    """sigma of local-noise DP-SGD over the planned rounds
    (:func:`secureffm.privacy.budget.noise_multiplier`)."""
    return budget.noise_multiplier(dp, dp_plan(settings))


def plan_distributed_noise(settings: FFMSettings, dp: DPSettings, clients: list[str],
                           sizes: dict[str, int], noise_geometry: Callable
                           ) -> tuple[dict[str, NoiseGeometry], DistributedNoise]:
    """Each kind's distributed-noise geometry and the noise every client adds over the planned
    rounds (:func:`secureffm.privacy.budget.distributed_noise`), at L2 sensitivity
    clip / batch_size: the server plans with it and each client derives its own share."""
    return budget.distributed_noise(dp, dp_plan(settings), dp.clip / settings.batch_size,
                                    clients, sizes, noise_geometry)


class FFMClient:
    """FFM's client side: what a client computes in a round with its own shard and secret
    streams (:class:`~secureffm.federation.channel.Task` ``ffm.velocity`` and ``ffm.dual``,
    args ``{"round": r}``), from public settings only, so a client's own process builds the
    same program. Its replicas and DP state live in ``client.state``, set up on first use.

    ``releases``: what a client answers (:class:`~secureffm.privacy.releases.ReleaseGuard`),
    from these settings alone: ``ffm.velocity`` for rounds 1..rounds and GOT's ``ffm.dual``
    for its dual rounds, each once, and under local noise with a target, never past it.

    ``canaries`` (an audit run, set by :meth:`plant`): client id -> directions [k, P] of the
    gradient canaries included in that client's shard."""

    TASKS = ("ffm.velocity", "ffm.dual")

    def __init__(self, settings: FFMSettings, dp: DPSettings | None, pair: DataPair,
                 device: torch.device):
        self.settings = settings
        self.dp = dp
        self.pair = pair
        self.device = device
        self.canaries: dict[str, torch.Tensor] = {}
        self.sigma = 0.0
        if dp is not None and dp.noise != "distributed":  # distributed: secagg adds noise
            self.sigma = local_noise_multiplier(settings, dp)
        plan = {"ffm.velocity": Rounds(1, settings.rounds)}
        if settings.method == "got":
            every = settings.potential_every
            plan["ffm.dual"] = Rounds(every, settings.rounds, every)
        budget = None
        if self.sigma and dp.target_epsilon is not None:
            budget = Budget(self.sigma, poisson_rate(settings.batch_size, settings.shard_size),
                            dp.delta, dp.target_epsilon, dp.accountant)
        self.releases = ReleaseGuard(plan, budget)

    def __call__(self, client: Client, task: Task) -> dict[str, np.ndarray]:
        if task.name not in self.TASKS:
            raise TaskRefused(f"FFM clients run {', '.join(self.TASKS)}, not {task.name!r}")
        round_ = task_count(client.id, task, "round")
        refused = self.releases.admit(client.id, client.state, task.name, round_)
        if refused:
            raise TaskRefused(refused)
        if "velocity" not in client.state:
            self.setup(client)
        if task.name == "ffm.velocity":
            return self._velocity(client, round_)
        return self._dual(client, round_)

    def plant(self, canaries: dict[str, torch.Tensor]) -> None:
        """An audit run (:mod:`secureffm.privacy.canaries`): client id -> directions [k, P] of
        the gradient canaries in that client's shard. Each is Poisson-sampled at rate q every
        velocity step, from the client's secret dp stream, and adds clip * u to the clipped sum
        (beside the DP noise). DP only: without it there is no guarantee to audit."""
        if self.dp is None:
            raise ConfigError("canaries audit a DP guarantee: use a protocol with a dp stage "
                              "(dp, dp-secagg, dp-secagg-distributed)")
        self.canaries = dict(canaries)

    def setup(self, client: Client) -> None:
        """The client's replicas (their initial weights do not matter: every task loads the
        broadcast ones; drawn under a forked global generator so that setting up a client
        never shifts anyone else's draws) and its gradient estimators."""
        c = self.settings
        with torch.random.fork_rng(devices=[]):
            velocity = velocity_network(c, self.pair).to(self.device)
            potential = (potential_network(c, self.pair).to(self.device)
                         if c.method == "got" else None)
        client.state["velocity"] = velocity
        if potential is not None:
            client.state["potential"] = potential
        client.state["coupling"] = self._coupling(client)
        if self.dp is None:
            client.state["velocity_grad"] = PlainGradient(velocity)
            if potential is not None:
                client.state["dual_grad"] = PlainGradient(potential)
            return
        client.state["rate"] = poisson_rate(c.batch_size, c.shard_size)  # the nominal size
        # Sampling and noise must be unpredictable: OS entropy, never the published seed.
        secret = client.streams.torch("dp", self.device)
        client.state["dp_rng"] = secret

        def dp_gradient(model: torch.nn.Module, what: str) -> Deferred:
            """Checked and made at the task that trains (Opacus is imported then)."""
            def make() -> DPGradient:
                check_dp_layers(model, what)
                # The divisor is the expected batch at the nominal size: q * shard = batch.
                return DPGradient(model, self.dp.clip, self.sigma, c.batch_size, secret)
            return Deferred(make)

        client.state["velocity_grad"] = dp_gradient(velocity, "velocity")
        if potential is not None:  # f at two points per example: linear mode's two passes
            client.state["dual_grad"] = dp_gradient(potential, "potential")

    def distributed_noise(self, client: Client, kind: str, protocol,
                          clients: list[str]) -> DistributedNoise:
        """This client's own noise plan for ``kind`` under distributed noise
        (:class:`~secureffm.protocols.endpoint.ClientEndpoint`'s ``noise``): from its settings
        and dp, its replicas' sizes and ``protocol`` (its own copy) over the federation
        ``clients``, as :func:`plan_distributed_noise` plans it for the server."""
        if "velocity" not in client.state:
            self.setup(client)
        sizes = {"gradient": flat_params(client.state["velocity"]).size}
        if "potential" in client.state:
            sizes["dual_update"] = flat_params(client.state["potential"]).size
        return plan_distributed_noise(self.settings, self.dp, clients, sizes,
                                      protocol.noise_geometry)[1]

    def _coupling(self, client: Client):
        if self.settings.method == "vanilla":
            return IndependentCoupling()
        if self.settings.method == "lot":
            return ExactOTCoupling()
        return SemiDualCoupling(client.state["potential"])

    # -- one task ---------------------------------------------------------------------

    def batch_rows(self, client: Client) -> torch.Tensor:
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
        dtype = autocast_dtype(self.settings, self.pair, self.device)
        with (torch.autocast(self.device.type, dtype=dtype) if dtype is not None
              else contextlib.nullcontext()):  # the loss itself is float32 (type promotion)
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

    def sync_replicas(self, client: Client) -> None:
        """Load the latest broadcast parameters into the client's replicas."""
        load_flat_params(client.state["velocity"], client.inbox["global_model"]["theta"])
        if "global_potential" in client.inbox:
            load_flat_params(client.state["potential"], client.inbox["global_potential"]["phi"])

    def _velocity(self, client: Client, round_: int) -> dict[str, np.ndarray]:
        self.sync_replicas(client)
        losses = self.velocity_losses(client, round_, self.batch_rows(client))
        grad = client.state["velocity_grad"](losses, len(losses))
        planted = self.canaries.get(client.id)
        if planted is not None and len(planted):  # an audit run: beside the DP noise
            grad = grad + canary_sum(planted, client.state["rate"], self.dp.clip,
                                     client.state["dp_rng"]) / np.float32(self.settings.batch_size)
        client.state["last_loss"] = float(losses.detach().mean()) if len(losses) else 0.0
        if not self.settings.dual_round(round_):
            self._done_with_model(client)
        return {"gradient": grad}

    @staticmethod
    def _done_with_model(client: Client) -> None:
        """Forget the round's theta once its last task used it: every round's first task
        comes with a fresh one, so the client's saved state need not carry it (d float32 per
        message on Flower)."""
        client.inbox.pop("global_model", None)

    def _dual(self, client: Client, round_: int) -> dict[str, np.ndarray]:
        self.sync_replicas(client)
        losses = self.dual_losses(client, round_, self.batch_rows(client))
        grad = client.state["dual_grad"](losses, len(losses))
        client.state["last_dual"] = float(-losses.detach().mean()) if len(losses) else 0.0
        self._done_with_model(client)
        return {"gradient": grad}

class FederatedFlowMatching:
    """FFM's server with coupling ``vanilla``, ``lot`` or ``got``: it holds the global models
    and the privacy ledger and asks the channel's clients to run :class:`FFMClient`'s tasks;
    it never touches a client's data or state."""

    def __init__(self, settings: FFMSettings, dp: DPSettings | None, pair: DataPair,
                 channel: Channel, device: torch.device):
        """``dp``: the DP settings of every kind in ``settings.sent_kinds``, resolved by the
        runner from the protocol (None: no DP)."""
        self.settings = settings
        self.pair = pair
        self.channel = channel
        self.device = device
        self.velocity = GlobalModel(velocity_network(settings, pair).to(device),
                                    settings.lr, settings.ema_decay, settings.lr_warmup)
        self.potential = None
        if settings.method == "got":
            self.potential = GlobalModel(potential_network(settings, pair).to(device),
                                         settings.potential_lr)
        self.dp = dp
        if dp is not None:
            self._check_dp()
        self.weights = client_weights(channel.clients, settings.weighting, equal=bool(dp) or any(
            channel.equal_weights(kind) for kind in settings.sent_kinds))
        self.rate = poisson_rate(settings.batch_size, settings.shard_size) if dp else 0.0
        self.distributed = self.dp is not None and self.dp.noise == "distributed"
        self.noise: dict[str, DistributedNoise] = {}
        self.charges: ServerLedger | None = None  # the DP ledger the server charges (None: no DP)
        # the round and kinds aggregated but not charged yet
        self._pending: tuple[int, tuple[str, ...]] | None = None
        self.applied = 0  # the last round whose update the models hold
        self._applying = False  # an optimizer step is under way (the state is mixed)
        if self.distributed:
            self._plan_distributed_noise()
        elif dp is not None:
            sigma = local_noise_multiplier(settings, dp)
            self.charges = ServerLedger(dp, self.rate, {c.id: sigma for c in channel.clients},
                                       note=channel.note)

    # -- set-up --------------------------------------------------------------------------

    def _check_dp(self) -> None:
        """Refuse what DP-SGD cannot bound or run for this method."""
        if self.settings.method == "lot":
            raise ConfigError(LOT_DP_REFUSAL)
        if self.settings.method == "got" and self.settings.ctransform_steps:
            raise ConfigError("ctransform_steps > 0 refines f^c by gradient steps through the "
                              "potential, which DP-SGD's per-example hooks cannot run; use "
                              "ctransform_steps = 0 under a dp protocol")
        check_dp_layers(self.velocity.module, "velocity")
        check_delta(self.dp.delta, self.settings.shard_size)

    def planned_steps(self, rounds: int | None = None) -> dict[str, int]:
        """See :func:`planned_steps`."""
        return planned_steps(self.settings, rounds)

    @property
    def ledger(self) -> PrivacyLedger | None:
        """The DP ledger of every step the server asked each client to run (None without DP)."""
        return None if self.charges is None else self.charges.ledger

    @property
    def noise_multipliers(self) -> dict[str, float]:
        """Each client's noise multiplier (sigma, or tau under distributed noise; {} without
        DP)."""
        return {} if self.charges is None else self.charges.multipliers

    def client_epsilon(self, client: str, multiplier: float, rounds: int, first: int = 1,
                       past: bool = False) -> float:
        """The epsilon client ``client`` (its id) spends in rounds ``first`` to ``rounds`` at
        noise ``multiplier`` (sigma for local noise, tau for distributed noise), composed with
        what the ledger charged it when ``past`` (a resumed run's history)."""
        planned, before = self.planned_steps(rounds), self.planned_steps(first - 1)
        return self.charges.epsilon_after(
            client, {kind: total - before[kind] for kind, total in planned.items()}, first,
            multiplier, past)

    def _plan_distributed_noise(self) -> None:
        """Geometry of each kind's noise in quantization levels, and one multiplier tau for
        every client and kind (:func:`plan_distributed_noise`, which each client runs too)."""
        ids = [c.id for c in self.channel.clients]
        sizes = {"gradient": self.velocity.flat().size}
        if self.potential is not None:
            sizes["dual_update"] = self.potential.flat().size
        geometry, noise = plan_distributed_noise(self.settings, self.dp, ids, sizes,
                                                 self.channel.noise_geometry)
        self.charges = ServerLedger(self.dp, self.rate, dict.fromkeys(ids, noise.multiplier),
                                   geometry, self.channel.note)
        self.noise = dict.fromkeys(sizes, noise)

    def _epsilon_through(self, first: int) -> Callable[[int], float]:
        """Round r -> the largest epsilon any client will have spent after rounds ``first``..r,
        counting what the ledger charged."""
        return lambda rounds: max(self.client_epsilon(cid, multiplier, rounds, first, True)
                                  for cid, multiplier in self.noise_multipliers.items())

    def rounds_within_budget(self, first: int = 1) -> int:
        """The last round, at most ``settings.rounds``, that every client can reach from round
        ``first`` on without its epsilon, counting what the ledger has charged, exceeding the
        target (``settings.rounds`` when sigma was calibrated to the target of a fresh run, or
        when there is no target; ``first`` - 1 when not even round ``first`` fits)."""
        if self.dp is None or self.dp.target_epsilon is None:
            return self.settings.rounds
        return budget.affordable(self._epsilon_through(first), self.dp.target_epsilon, first,
                                 self.settings.rounds)

    def refuse_overspending(self) -> None:
        """Refuse a fresh run whose given noise multiplier would take a client past the target
        within the planned rounds (:func:`secureffm.privacy.budget.refuse_overspending`)."""
        if self.charges is not None:
            budget.refuse_overspending(self._epsilon_through(1), self.dp,
                                       max(self.noise_multipliers.values()), 1,
                                       self.settings.rounds, "rounds", "pass --rounds {fit}")

    def _record(self, asked: list[str], kind: str, round_: int) -> None:
        """Charge the clients asked to compute ``kind`` (each may have released it: a client
        that was offline then is counted too, which only overstates), signed into the log as a
        ``charged`` event, from which an audit recomputes epsilon."""
        if self.charges is not None:
            self.charges.charge(asked, kind, round_)
        if self._pending is not None:  # charged: no longer pending
            rest = tuple(k for k in self._pending[1] if k != kind)
            self._pending = (self._pending[0], rest) if rest else None

    def charge_pending(self) -> None:
        """Charge the round's aggregations a stop cut short before their charge (Ctrl-C while
        the clients' inputs were on their way): every kind of the round, to every client,
        since each may have sent its input, which only overstates. Nothing when no
        aggregation is open."""
        if self._pending is not None:
            round_, kinds = self._pending
            for kind in kinds:
                self._record(list(self.noise_multipliers), kind, round_)

    # -- rounds --------------------------------------------------------------------------

    def train_round(self, round_: int) -> RoundReport:
        """One communication round: its aborted aggregations (the model then stays put) and
        the clients' mean ``loss`` and ``dual`` (the in-process simulator's view, without DP).

        The request carries theta and (GOT) phi as the round starts; in GOT's dual rounds the
        velocity gradient and the dual update are aggregated together
        (:meth:`Channel.aggregate_many`: one secure aggregation where the protocol allows):
        neither reads the other's update, both read the broadcast models. Each kind is
        charged to the ledger on its own."""
        parts = {"gradient": (Task("ffm.velocity", {"round": round_}), _template(self.velocity),
                              self.noise.get("gradient"))}
        broadcast = {"global_model": {"theta": self.velocity.flat()}}
        if self.potential is not None:
            broadcast["global_potential"] = {"phi": self.potential.flat()}
            if self.settings.dual_round(round_):
                parts["dual_update"] = (Task("ffm.dual", {"round": round_}),
                                        _template(self.potential), self.noise.get("dual_update"))
        self._pending = (round_, tuple(parts))
        results = self.channel.aggregate_many(round_, parts, self.weights, broadcast)
        for kind, result in results.items():
            self._record(result.asked, kind, round_)
        report = RoundReport()
        models = {"gradient": (self.velocity, "loss", "last_loss"),
                  "dual_update": (self.potential, "dual", "last_dual")}
        for kind, result in results.items():
            model, name, key = models[kind]
            if result.payload is None:
                report.aborted += 1
                continue
            self._apply(model, result.payload["gradient"], round_)
            self._diagnose(report, name, key, result.included)
        return report

    def _apply(self, model: GlobalModel, gradient: np.ndarray, round_: int) -> None:
        self._applying = True
        model.apply(gradient)
        self.applied, self._applying = round_, False

    def checkpoint_round(self, completed: int) -> int | None:
        """The round whose end :meth:`state_dict` holds now, for a checkpoint after a stop:
        ``completed`` (the last round that ended), or the round in progress once one of its
        updates was applied (its aggregations after that count as aborted: the models stay
        put for them); None while an update is being applied."""
        return None if self._applying else max(completed, self.applied)

    def _diagnose(self, report: RoundReport, name: str, key: str, included: list[str]) -> None:
        """The weighted mean of the counted clients' ``key``, read from their state: only in
        the in-process simulator (the clients are objects here) and without DP (the losses
        are not privatized)."""
        clients = {c.id: c for c in self.channel.clients}
        if self.dp is not None or not all(isinstance(clients[cid], Client) for cid in included):
            return
        total = sum(self.weights[cid] for cid in included)
        report.diagnostics[name] = sum(self.weights[cid] * clients[cid].state[key]
                                       for cid in included) / total

    def state_dict(self) -> dict:
        state = {"velocity": self.velocity.state_dict()}
        if self.potential is not None:
            state["potential"] = self.potential.state_dict()
        if self.ledger is not None:
            state["ledger"] = self.ledger.state_dict()
        return state

    def load_state_dict(self, state: dict,
                        charged: list[list[LedgerEntry]] | None = None) -> None:
        """Continue from :meth:`state_dict`'s ``state`` (a checkpoint of
        the same settings): the models, their optimizers and EMA. ``charged``: what the
        continued run's log charged, one list per ``charged`` record (every round it released,
        also after its checkpoint), recorded in the ledger and signed into this run's log, so
        the privacy spent before counts. The clients load the models the next round's request
        carries."""
        pairs = [(self.velocity, state["velocity"])]
        if self.potential is not None:
            pairs.append((self.potential, state["potential"]))
        for model, saved in pairs:
            model.load_state_dict(saved)
        if self.charges is not None:
            for entries in charged or ():
                self.charges.record(entries)
