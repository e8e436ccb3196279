"""DCFM: decentralized compositional flow matching (stage I, DCFM-A, DCFM-B).

Conventions (docs/dcfm.md): x_t = (1 - t) x0 + t x1 with x0 ~ N(0, I) at t = 0, target x1 - x0
(the paper's Eq. 9 prints x_t - x0; that is not the target of this path). Labels y are long
[B, k]; index ``cardinalities[j]`` is attribute j's null token. A route r [B, k + 1] names, per
row, the expert answering the unconditional slot (column 0) and each attribute's marginal slot
(column i for attribute i - 1).

- Stage I: each client trains its expert on Eq. (9) with masked labels (Eq. 8) plus lambda times
  the local CI penalty (Eq. 10).
- DCFM-A: the experts are all-gathered as ``model`` messages; each client then trains its own
  expert on Eq. (9) plus lambda times the peer CI penalty (Eq. 12-14): peers are frozen, but
  the expert's own joint, marginal and unconditional outputs all carry gradient. Each attribute
  slot is routed only to experts whose data hold that label value. Repeated ``R`` rounds.
- DCFM-B: every client uploads its stage-I expert once; the server distills one student on
  teacher paths (Eq. 15) plus lambda times the student CI penalty (Eq. 16). Teacher paths cover
  every combination of the product space: an observed combination follows one expert holding
  it (full label), an unobserved one the experts composed with Eq. (5) under a route.
- Sampling a combination composes per-attribute guidance (Eq. 5).

Every per-example random quantity of a client's loss (x0, t, the label mask of Eq. 8, the
route of Eq. 12-13) is read from uniforms keyed by the client's secret key, the (round, local
step, message kind) and the example's index in the shard (``SecretStreams.example_uniforms``):
example r's draws depend on r alone, never on which or how many other examples a step drew.

Under a protocol whose ``dp`` stage protects ``model``, experts train with DP-SGD (Poisson
sampling at q = batch / nominal shard size, per-example clipping, Gaussian noise; Opacus hooks,
since each example's loss evaluates the expert several times) and every step is recorded in the
ledger. One example therefore moves a step's clipped sum by at most C
(tests/privacy/test_dcfm_per_example_premise.py). The student of DCFM-B is post-processing of
DP experts. Label counts travel in the clear (docs/dcfm.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ..data.toy2d import normals
from ..errors import ConfigError, DataError
from ..federation.channel import Channel
from ..federation.message import SERVER, Payload
from ..federation.parties import Client
from ..models.conditional import null_labels
from ..privacy.dpsgd import DPGradient, PlainGradient, poisson_rate, poisson_rows
from ..privacy.ledger import LedgerEntry, PrivacyLedger
from .flow_matching import sample_path
from .global_model import GlobalModel

__all__ = ["Masking", "mask_labels", "attribute_only", "compose", "slot_velocities",
           "combination_index", "all_combinations", "attribute_holders", "random_route",
           "ExampleDraws", "example_width", "split_uniforms",
           "expert_losses", "student_losses", "ComposedField", "LocalExpert", "model_payload",
           "load_payload_model", "gather_models", "upload_models", "train_experts", "DCFMA",
           "DCFMB", "label_counts"]

ModelFactory = Callable[[], nn.Module]


# -- labels ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Masking:
    """Eq. (8): probabilities of the full label, of one attribute kept (each with
    ``marginal / k``) and of the unconditional label; they must sum to 1."""

    full: float = 0.7
    marginal: float = 0.2
    uncond: float = 0.1

    def __post_init__(self) -> None:
        values = (self.full, self.marginal, self.uncond)
        if min(values) < 0 or not math.isclose(sum(values), 1.0, abs_tol=1e-9):
            raise ConfigError(f"label masking probabilities (full, marginal, unconditional) = "
                              f"{values}: each must be >= 0 and they must sum to 1")


def _index(u: torch.Tensor, count: int | torch.Tensor) -> torch.Tensor:
    """floor(u * count) clamped below ``count``: a uniform index from u in [0, 1] (long)."""
    return torch.minimum((u * count).long(), torch.as_tensor(count, device=u.device) - 1)


def mask_labels(y: torch.Tensor, cardinalities: Sequence[int], masking: Masking,
                u: torch.Tensor) -> torch.Tensor:
    """y [B, k] with each row kept whole, reduced to one uniformly chosen attribute, or made
    fully null, with the probabilities of ``masking`` (Eq. 8). Row j's choice is read from its
    uniforms u [B, 2] alone: u[j, 0] picks the case, u[j, 1] the attribute."""
    batch, k = y.shape
    case, which = u[:, 0], _index(u[:, 1], k)
    marginal = (case >= masking.full) & (case < masking.full + masking.marginal)
    columns = torch.arange(k, device=y.device)
    keep = ((case < masking.full)[:, None]
            | (marginal[:, None] & (columns[None] == which[:, None])))
    return torch.where(keep, y, null_labels(batch, tuple(cardinalities), y.device))


def attribute_only(y: torch.Tensor, cardinalities: Sequence[int], i: int) -> torch.Tensor:
    """The marginal label (null, ..., y_i, ..., null), shape [B, k]."""
    out = null_labels(y.shape[0], tuple(cardinalities), y.device)
    out[:, i] = y[:, i]
    return out


def combination_index(y: torch.Tensor, cardinalities: Sequence[int]) -> torch.Tensor:
    """Row-major index of each combination y [B, k] in the product space, shape [B]."""
    index = torch.zeros(y.shape[0], dtype=torch.long, device=y.device)
    for j, card in enumerate(cardinalities):
        index = index * card + y[:, j]
    return index


def all_combinations(cardinalities: Sequence[int]) -> torch.Tensor:
    """Every combination of the product space in row-major order, shape [prod |Y_j|, k]."""
    grids = torch.meshgrid(*[torch.arange(c) for c in cardinalities], indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=1)


def label_counts(labels: torch.Tensor, cardinalities: Sequence[int]) -> np.ndarray:
    """Examples per combination, int64 [prod |Y_j|]: the label statistics a client shares."""
    size = math.prod(cardinalities)
    index = combination_index(labels, cardinalities).cpu()
    return torch.bincount(index, minlength=size).numpy().astype(np.int64)


def attribute_holders(counts: torch.Tensor, cardinalities: Sequence[int]) -> list[torch.Tensor]:
    """From counts [n, prod |Y_j|], per attribute j a bool [n, |Y_j|]: expert b holds value v."""
    table = counts.reshape(counts.shape[0], *cardinalities)
    k = len(cardinalities)
    return [table.sum(dim=[d + 1 for d in range(k) if d != j]) > 0 for j in range(k)]


# -- composition ----------------------------------------------------------------------------

def compose(uncond: torch.Tensor, marginals: Sequence[torch.Tensor],
            weights: Sequence[float] | None = None) -> torch.Tensor:
    """Eq. (5): v(x) + sum_i w_i (v(x, y_i) - v(x)); ``weights`` default to 1."""
    weights = [1.0] * len(marginals) if weights is None else weights
    out = uncond
    for w, v in zip(weights, marginals, strict=True):
        out = out + w * (v - uncond)
    return out


def slot_velocities(experts: Sequence[nn.Module], route: torch.Tensor, x: torch.Tensor,
                    t: torch.Tensor, y: torch.Tensor, cardinalities: Sequence[int],
                    trainable: int | None = None) -> list[torch.Tensor]:
    """[v_{r0}(x), v_{r1}(x, y_1), ..., v_{rk}(x, y_k)], each [B, *shape], row j answered by
    the expert ``route[j, slot]``.

    Experts other than ``trainable`` run without gradient (frozen, Eq. 13) on their rows only;
    ``trainable`` runs on the whole batch (so row j of every forward pass is example j, as
    per-example DP clipping needs) and its rows are selected with ``torch.where``.
    """
    out = []
    shape = (-1,) + (1,) * (x.dim() - 1)
    for slot in range(len(cardinalities) + 1):
        labels = (null_labels(x.shape[0], tuple(cardinalities), x.device) if slot == 0
                  else attribute_only(y, cardinalities, slot - 1))
        frozen = torch.zeros_like(x)
        mine = None
        for b in torch.unique(route[:, slot]).tolist():
            rows = route[:, slot] == b
            if b == trainable:
                mine = (rows, experts[b](x, t, labels))
                continue
            with torch.no_grad():
                frozen[rows] = experts[b](x[rows], t[rows], labels[rows])
        out.append(frozen if mine is None
                   else torch.where(mine[0].reshape(shape), mine[1], frozen))
    return out


def _pick(eligible: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of eligible [B, n] (bool, each row with a True), the floor(u * count)-th
    eligible column: uniform over them for u ~ U[0, 1). Returns [B] long."""
    target = _index(u, eligible.sum(dim=1))
    rank = eligible.long().cumsum(dim=1) - 1
    return (eligible & (rank == target[:, None])).long().argmax(dim=1)


def random_route(y: torch.Tensor, holders: Sequence[torch.Tensor], u: torch.Tensor,
                 own: int | None = None) -> torch.Tensor:
    """A route [B, k + 1] (Eq. 12-13) from uniforms u [B, k + 2], row j from u[j] alone:
    column 0 uniform over all experts (u[:, 0]), column i uniform over the experts holding
    value y_{i-1} (u[:, i]). With ``own``, a row that would not use ``own`` gets it in the slot
    u[:, k + 1] picks (every assignment includes the training expert, Eq. 13); the rows must
    then be ``own``'s data, so it holds each of their values."""
    k, n = len(holders), holders[0].shape[0]
    columns = [_index(u[:, 0], n)]
    for j, held in enumerate(holders):
        eligible = held.to(y.device)[:, y[:, j]].T  # [B, n]
        if not eligible.any(dim=1).all():
            raise DataError(f"attribute {j} takes a value no client holds; every value needs "
                            "a holder (full marginal coverage) for composition")
        columns.append(_pick(eligible, u[:, j + 1]))
    route = torch.stack(columns, dim=1)
    if own is not None:
        missing = ~(route == own).any(dim=1)
        slot = _index(u[:, k + 1], k + 1)
        route[missing, slot[missing]] = own
    return route


# -- per-example draws ----------------------------------------------------------------------

@dataclass(frozen=True)
class ExampleDraws:
    """One batch's per-example draws, row j from example j's uniforms only: times t [B]
    (float32), source points x0 [B, *shape] ~ N(0, I) (float32), and the uniforms of the label
    mask [B, 2] (Eq. 8) and of the route [B, k + 2] (Eq. 12-13)."""

    t: torch.Tensor
    x0: torch.Tensor
    mask: torch.Tensor
    route: torch.Tensor


def example_width(shape: Sequence[int], k: int) -> int:
    """Uniforms per example that :func:`split_uniforms` reads: t (1), the mask (2), the route
    (k + 2) and x0 (prod(shape) rounded up to even: Box-Muller takes pairs)."""
    return 3 + (k + 2) + 2 * math.ceil(math.prod(shape) / 2)


def split_uniforms(u: torch.Tensor, shape: Sequence[int], k: int) -> ExampleDraws:
    """Read u [B, example_width(shape, k)] (U[0, 1), float64) as t, mask, route and x0 in that
    column order; x0 by Box-Muller, computed in float64 so no uniform rounds up to 1."""
    if u.dim() != 2 or u.shape[1] != example_width(shape, k):
        raise ValueError(f"need uniforms [B, {example_width(shape, k)}], got {tuple(u.shape)}")
    pairs = (u.shape[1] - k - 5) // 2
    z = normals(u[:, k + 5:k + 5 + pairs], u[:, k + 5 + pairs:]).reshape(len(u), -1)
    x0 = z[:, :math.prod(shape)].reshape(len(u), *shape).float()
    return ExampleDraws(t=u[:, 0].float(), x0=x0, mask=u[:, 1:3], route=u[:, 3:k + 5])


# -- losses ---------------------------------------------------------------------------------

def _per_example(error: torch.Tensor) -> torch.Tensor:
    return error.pow(2).flatten(1).mean(dim=1)


def expert_losses(model: nn.Module, x1: torch.Tensor, y: torch.Tensor,
                  cardinalities: Sequence[int], masking: Masking, u: torch.Tensor,
                  ci_weight: float, peers: Sequence[nn.Module] | None = None, own: int = 0,
                  holders: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Per-example loss [B]: Eq. (9) with masked labels plus ``ci_weight`` times the CI
    penalty, local (Eq. 10) without ``peers``, else against the experts ``peers`` (a list in
    which index ``own`` is replaced by ``model``) under a random route (Eq. 12-14).

    ``u`` [B, example_width(shape, k)]: row j holds example j's uniforms, read by
    :func:`split_uniforms` as its t, x0, mask and route. Term j depends on (x1_j, y_j, u_j)
    only, so DP clipping applies and one example never moves another's term.
    """
    if x1.shape[0] == 0:
        return x1.new_zeros(0)
    draws = split_uniforms(u, x1.shape[1:], len(cardinalities))
    t = draws.t
    path = sample_path(draws.x0, x1, t)
    masked = mask_labels(y, cardinalities, masking, draws.mask)
    losses = _per_example(model(path.x_t, t, masked) - path.u_t)
    if ci_weight == 0:
        return losses
    if peers is None:
        experts, own = [model], 0
        route = torch.zeros(y.shape[0], len(cardinalities) + 1, dtype=torch.long,
                            device=y.device)
    else:
        experts = list(peers)
        experts[own] = model
        route = random_route(y, holders, draws.route, own)
    slots = slot_velocities(experts, route, path.x_t, t, y, cardinalities, trainable=own)
    joint = model(path.x_t, t, y)
    return losses + ci_weight * _per_example(joint - compose(slots[0], slots[1:]))


def student_losses(student: nn.Module, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor, cardinalities: Sequence[int], masking: Masking,
                   u: torch.Tensor, ci_weight: float) -> torch.Tensor:
    """Eq. (15) + ``ci_weight`` x Eq. (16), per example [B]: the student's velocity at teacher
    path points x_t with labels masked by the uniforms u [B, 2] against the teacher's
    ``target``, and its joint velocity against its own composition (no frozen model)."""
    masked = mask_labels(y, cardinalities, masking, u)
    losses = _per_example(student(x_t, t, masked) - target)
    if ci_weight == 0:
        return losses
    route = torch.zeros(y.shape[0], len(cardinalities) + 1, dtype=torch.long, device=y.device)
    slots = slot_velocities([student], route, x_t, t, y, cardinalities, trainable=0)
    return losses + ci_weight * _per_example(student(x_t, t, y) - compose(slots[0], slots[1:]))


# -- sampling -------------------------------------------------------------------------------

class ComposedField(nn.Module):
    """v(x, t) for fixed labels y [N, k]: Eq. (5) over ``experts`` under ``route`` [N, k + 1]
    with guidance ``weights``; one expert and a zero route compose a monolithic model."""

    def __init__(self, experts: Sequence[nn.Module], y: torch.Tensor, route: torch.Tensor,
                 cardinalities: Sequence[int], weights: Sequence[float] | None = None):
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.y, self.route = y, route
        self.cardinalities = tuple(cardinalities)
        self.weights = weights

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(-1).expand(x.shape[0])
        slots = slot_velocities(list(self.experts), self.route, x, t, self.y, self.cardinalities)
        return compose(slots[0], slots[1:], self.weights)


@torch.no_grad()
def teacher_paths(experts: Sequence[nn.Module], counts: torch.Tensor,
                  cardinalities: Sequence[int], shape: tuple[int, ...], paths: int, steps: int,
                  generator: torch.Generator, device: torch.device):
    """Points on teacher paths for DCFM-B: y uniform over the product space; an observed y
    follows one uniformly chosen expert holding it (full label), an unobserved y the experts
    composed under a random route. Each path is Euler-integrated from x0 ~ N(0, I) with
    ``steps`` steps. Returns every grid point of every path, flattened to ``paths * steps``
    rows: (x_t, t = s / steps, y, teacher velocity at (x_t, t))."""
    y = torch.stack([torch.randint(c, (paths,), generator=generator, device=device)
                     for c in cardinalities], dim=1)
    held = (counts.to(device)[:, combination_index(y, cardinalities)] > 0).T.float()  # [P, n]
    known = held.sum(dim=1) > 0
    single = torch.zeros(paths, dtype=torch.long, device=device)
    if known.any():
        single[known] = torch.multinomial(held[known], 1, generator=generator).squeeze(1)
    route = random_route(y, attribute_holders(counts, cardinalities),
                         torch.rand(paths, len(cardinalities) + 2, generator=generator,
                                    device=device))
    x = torch.randn(paths, *shape, generator=generator, device=device)
    points, velocities = [], []
    for s in range(steps):
        t = torch.full((paths,), s / steps, device=device)
        v = torch.empty_like(x)
        for b in torch.unique(single[known]).tolist():
            rows = known & (single == b)
            v[rows] = experts[b](x[rows], t[rows], y[rows])
        novel = ~known
        if novel.any():
            slots = slot_velocities(experts, route[novel], x[novel], t[novel], y[novel],
                                    cardinalities)
            v[novel] = compose(slots[0], slots[1:])
        points.append(x)
        velocities.append(v)
        x = x + v / steps
    t = (torch.arange(steps, device=device).float() / steps).repeat_interleave(paths)
    return torch.cat(points), t, y.repeat(steps, 1), torch.cat(velocities)


# -- models as messages ---------------------------------------------------------------------

def model_payload(module: nn.Module, counts: np.ndarray | None = None) -> Payload:
    """A model message: every state_dict entry as ``param/<name>`` (float32) and, from a
    client, its label counts per combination as ``counts`` (int64)."""
    payload = {f"param/{name}": value.detach().float().cpu().numpy()
               for name, value in module.state_dict().items()}
    if counts is not None:
        payload["counts"] = np.asarray(counts, dtype=np.int64)
    return payload


def load_payload_model(payload: Payload, factory: ModelFactory,
                       device: torch.device) -> tuple[nn.Module, np.ndarray | None]:
    """Inverse of :func:`model_payload`: a fresh frozen model (eval mode) and the counts
    (None when the message has none)."""
    model = factory().to(device)
    state = {name[len("param/"):]: torch.as_tensor(value) for name, value in payload.items()
             if name.startswith("param/")}
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.eval(), payload.get("counts")


# -- local training -------------------------------------------------------------------------

class LocalExpert:
    """One client's expert: Adam steps on the mean (plain) or DP-SGD gradient of
    :func:`expert_losses` over its labelled shard (labels in ``client.state["labels"]``).

    ``dp``: resolved DP settings and ``sigma`` the noise multiplier, or None; ``kind`` names
    the message kind the ledger charges and keys the per-example draws. ``nominal_size``: the
    public nominal shard size (required under DP): q = :func:`poisson_rate` and the divisor
    E[b] = q * nominal_size, so neither depends on the client's true size.
    """

    def __init__(self, client: Client, model: nn.Module, lr: float, ema_decay: float,
                 batch_size: int, cardinalities: Sequence[int], masking: Masking,
                 dp=None, sigma: float = 0.0, ledger: PrivacyLedger | None = None,
                 kind: str = "model", nominal_size: float | None = None):
        self.client = client
        self.model = model
        self.trainer = GlobalModel(model, lr, ema_decay)
        self.batch_size = batch_size
        self.cardinalities = tuple(cardinalities)
        self.masking = masking
        self.dp, self.sigma, self.ledger, self.kind = dp, sigma, ledger, kind
        self.counts = label_counts(client.state["labels"], cardinalities)
        self.width = example_width(client.data.shape[1:], len(cardinalities))
        if dp is None:
            self.estimator = PlainGradient(model)
            return
        if nominal_size is None:
            raise ConfigError("a DP expert needs the public nominal shard size for q and the "
                              "divisor; the true size would be released")
        self.rate = poisson_rate(batch_size, nominal_size)
        # Sampling and noise must be unpredictable: OS entropy, never the published seed.
        self.secret = client.streams.torch("dp", client.data.device)
        self.estimator = DPGradient(model, dp.clip, sigma, self.rate * nominal_size,
                                    self.secret, mode="hooks")

    def rows(self) -> torch.Tensor:
        """Shard indices [b] of one step's examples: Poisson at rate q from the secret dp
        stream under DP, else ``batch_size`` uniformly without replacement."""
        if self.dp is None:
            return self.client.minibatch_rows(self.batch_size)
        return poisson_rows(self.client.size, self.rate, self.secret).to(self.client.data.device)

    def uniforms(self, round_: int, step: int, rows: torch.Tensor) -> torch.Tensor:
        """Example uniforms [b, width] float64 of the examples ``rows`` in local step ``step``
        of ``round_``: keyed by the client's secret key, (round_, step, kind) and each row's
        shard index, so row r's draws depend on r alone. ``step`` is the public local step
        index, never a count of examples drawn."""
        return self.client.example_uniforms((round_, step, self.kind, "expert_loss"), rows,
                                            self.width)

    def losses(self, round_: int, step: int, rows: torch.Tensor, ci_weight: float,
               peers: Sequence[nn.Module] | None = None, own: int = 0,
               holders: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """Per-example :func:`expert_losses` [b] of the examples ``rows``, with their keyed
        uniforms, through the estimator's forward module."""
        x1, y = self.client.data[rows], self.client.state["labels"][rows]
        return expert_losses(self.estimator.forward_module, x1, y, self.cardinalities,
                             self.masking, self.uniforms(round_, step, rows), ci_weight, peers,
                             own, holders)

    def step(self, round_: int, step: int, ci_weight: float,
             peers: Sequence[nn.Module] | None = None, own: int = 0,
             holders: Sequence[torch.Tensor] | None = None) -> float:
        """Local step ``step`` of ``round_``: one optimizer step; returns the batch's mean
        loss (not privatized)."""
        losses = self.losses(round_, step, self.rows(), ci_weight, peers, own, holders)
        self.trainer.apply(self.estimator(losses, len(losses)))
        if self.ledger is not None:
            self.ledger.record(LedgerEntry(self.client.id, self.kind, round_, self.rate,
                                           self.sigma, self.dp.clip))
        return float(losses.detach().mean()) if len(losses) else 0.0

    @property
    def published(self) -> nn.Module:
        """The parameters this client sends: the EMA when kept, else the live model."""
        return self.trainer.averaged


def train_experts(experts: Sequence[LocalExpert], steps: int, round_: int, ci_weight: float,
                  desc: str, progress: bool,
                  peer_args: Callable[[int], tuple] | None = None) -> list[float]:
    """``steps`` steps of every expert; ``peer_args(i)`` gives (peers, own, holders) for
    expert i in DCFM-A. Returns each expert's mean loss over the last 10% of steps."""
    losses = []
    for i, expert in enumerate(experts):
        peers, own, holders = peer_args(i) if peer_args else (None, 0, None)
        history = []
        bar = tqdm(range(steps), desc=f"{desc} {expert.client.id}", disable=not progress,
                   unit="step", dynamic_ncols=True, leave=False)
        for step in bar:
            history.append(expert.step(round_, step, ci_weight, peers, own, holders))
        losses.append(float(np.mean(history[-max(1, steps // 10):])) if history else 0.0)
    return losses


# -- exchanges through the channel ---------------------------------------------------------

def gather_models(channel: Channel, round_: int, experts: dict[str, LocalExpert],
                  factory: ModelFactory,
                  device: torch.device) -> dict[str, dict[str, tuple[nn.Module, np.ndarray]]]:
    """All-gather every expert as a ``model`` message; recipient -> author -> (model, counts)
    as each recipient kept them."""
    channel.all_gather(
        round_, "model", lambda c: model_payload(experts[c.id].published, experts[c.id].counts))
    return {client.id: {author: load_payload_model(p, factory, device)
                        for author, p in client.peers(round_, "model").items()}
            for client in channel.clients}


def upload_models(channel: Channel, round_: int, experts: dict[str, LocalExpert],
                  factory: ModelFactory,
                  device: torch.device) -> dict[str, tuple[nn.Module, np.ndarray]]:
    """Each client sends its expert to the server once (``model``); author -> (model, counts)
    for every one that arrived."""
    received = {}
    for cid, expert in experts.items():
        payload = channel.send(round_, "upload", "model", cid, SERVER,
                               model_payload(expert.published, expert.counts))
        if payload is not None:
            received[cid] = load_payload_model(payload, factory, device)
    if not received:
        raise DataError("no expert reached the server (every upload was dropped or rejected); "
                        "check the threat model's faults")
    return received


def _stack(counts: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.stack(counts), device=device)


class DCFMA:
    """DCFM-A after stage I: ``rounds`` rounds of all-gather then ``steps`` local steps of
    Eq. (14) per client; finally each client uploads its expert to the server for sampling.
    Returns the server's experts and their label counts [n, prod |Y_j|]."""

    def __init__(self, channel: Channel, experts: dict[str, LocalExpert], factory: ModelFactory,
                 device: torch.device, ci_weight: float, progress: bool = True):
        self.channel, self.experts, self.factory = channel, experts, factory
        self.device = device
        self.ci_weight, self.progress = ci_weight, progress

    def run(self, rounds: int, steps: int) -> tuple[list[nn.Module], torch.Tensor, list[float]]:
        losses: list[float] = []
        for round_ in range(1, rounds + 1):
            gathered = gather_models(self.channel, round_, self.experts, self.factory,
                                     self.device)
            order = list(self.experts)

            def peer_args(i: int, order=order, gathered=gathered):
                cid = order[i]
                peers = [self.experts[cid].model] + [m for m, _ in gathered[cid].values()]
                counts = [self.experts[cid].counts] + [c for _, c in gathered[cid].values()]
                holders = attribute_holders(_stack(counts, self.device),
                                            self.experts[cid].cardinalities)
                return peers, 0, holders

            losses = train_experts(list(self.experts.values()), steps, round_, self.ci_weight,
                                   f"DCFM-A round {round_}", self.progress, peer_args)
        final = upload_models(self.channel, rounds + 1, self.experts, self.factory, self.device)
        models = [m for m, _ in final.values()]
        return models, _stack([c for _, c in final.values()], self.device), losses


class DCFMB:
    """DCFM-B's server: distill one student from uploaded experts (Eq. 17) with Adam, then
    send it to every client as a ``model`` message."""

    def __init__(self, factory: ModelFactory, cardinalities: Sequence[int],
                 shape: tuple[int, ...], masking: Masking, lr: float, ema_decay: float,
                 device: torch.device, generator: torch.Generator):
        self.factory, self.cardinalities, self.shape = factory, tuple(cardinalities), shape
        self.masking, self.device, self.generator = masking, device, generator
        self.student = GlobalModel(factory().to(device), lr, ema_decay)

    def distill(self, teachers: Sequence[nn.Module], counts: torch.Tensor, steps: int,
                batch: int, teacher_steps: int, ci_weight: float, progress: bool,
                bank_paths: int = 1024, refresh: int = 50) -> float:
        """``steps`` student steps of ``batch`` points drawn from a bank of ``bank_paths``
        teacher paths (every grid point), redrawn every ``refresh`` steps; returns the mean
        loss over the last 10% of steps."""
        estimator = PlainGradient(self.student.module)
        history = []
        for step in tqdm(range(steps), desc="DCFM-B distillation", disable=not progress,
                         unit="step", dynamic_ncols=True, leave=False):
            if step % refresh == 0:
                bank = teacher_paths(teachers, counts, self.cardinalities, self.shape,
                                     bank_paths, teacher_steps, self.generator, self.device)
            pick = torch.randint(len(bank[0]), (batch,), generator=self.generator,
                                 device=self.device)
            x_t, t, y, target = (part[pick] for part in bank)
            mask = torch.rand(batch, 2, generator=self.generator, device=self.device)
            losses = student_losses(self.student.module, x_t, t, y, target, self.cardinalities,
                                    self.masking, mask, ci_weight)
            self.student.apply(estimator(losses, len(losses)))
            history.append(float(losses.detach().mean()))
        return float(np.mean(history[-max(1, steps // 10):])) if history else 0.0

    def send_student(self, channel: Channel, round_: int) -> int:
        """The student to every client (``model``, phase broadcast); returns deliveries."""
        payload = model_payload(self.student.averaged)
        delivered = 0
        for client in channel.clients:
            received = channel.send(round_, "broadcast", "model", SERVER, client.id, payload)
            delivered += received is not None
        return delivered
