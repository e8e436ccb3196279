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
  teacher paths (Eq. 15) plus lambda times the student CI penalty (Eq. 16). Three readings of
  the teacher (``teacher``, docs/dcfm.md): ``observed`` (Eq. 15 as it reads: observed
  combinations only, one expert holding y per path), ``marginal`` (also every unobserved
  combination, along the experts' marginals composed with Eq. 5 under a route) and
  ``anchored`` (an unobserved combination along Eq. 5 anchored on an observed combination:
  full conditionals of experts holding them; the one that recovers the 2D missing mode).
- Sampling a combination composes per-attribute guidance (Eq. 5).

The server (:class:`DCFMServer`, :class:`DCFMB`) never touches a client: each client's own
program (:class:`DCFMClient`, built from public settings, its shard and its labels) trains its
expert when a named task asks it to publish, and keeps the expert between messages.

Every per-example random quantity of a client's loss (x0, t, the label mask of Eq. 8, the
route of Eq. 12-13) is read from uniforms keyed by the client's secret key, the (round, local
step, message kind) and the example's index in the shard (``SecretStreams.example_uniforms``):
example r's draws depend on r alone, never on which or how many other examples a step drew.

Under a protocol whose ``dp`` stage protects ``model``, experts train with DP-SGD (Poisson
sampling at q = batch / nominal shard size, per-example clipping, Gaussian noise; Opacus hooks,
since each example's loss evaluates the expert several times) and the server's ledger
(:class:`~secureffm.privacy.budget.ServerLedger`) charges every step it asked each client to
run. One example therefore moves a step's clipped sum by at most C
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

from ..data.toy2d import normals
from ..errors import ConfigError, DataError
from ..federation.channel import Channel, Task, TaskRefused, task_count
from ..federation.message import SERVER, Payload
from ..federation.parties import Client
from ..models.conditional import ConditionalUNet, ConditionalVelocityMLP, null_labels
from ..models.params import flat_params, load_flat_params
from ..privacy import budget
from ..privacy.budget import Plan, ServerLedger
from ..privacy.dpsgd import DPGradient, PlainGradient, poisson_rate, poisson_rows
from ..privacy.releases import ReleaseGuard, Rounds
from ..privacy.settings import DPSettings
from ..progress import progress_bar
from .flow_matching import sample_path
from .global_model import GlobalModel

__all__ = ["Masking", "mask_labels", "expert_network",
           "attribute_only", "compose", "slot_velocities",
           "combination_index", "all_combinations", "attribute_holders", "random_route",
           "ExampleDraws", "example_width", "split_uniforms", "expert_losses", "student_losses",
           "ComposedField", "TEACHERS", "anchors", "anchored_velocity",
           "teacher_paths", "DCFMSettings", "initial_model", "expert_noise_multiplier",
           "model_payload", "load_payload_model", "LocalExpert", "DCFMClient",
           "DCFMServer", "DCFMB", "label_counts"]

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


# Readings of DCFM-B's teacher paths (Eq. 15), :func:`teacher_paths`; RunConfig.dcfm_teacher.
TEACHERS = ("observed", "marginal", "anchored")


def anchors(counts: torch.Tensor, cardinalities: Sequence[int]) -> torch.Tensor:
    """Reference combinations of the anchored composition, bool [M, M] over the product space
    (M = prod |Y_j|, row-major): ``[y, c]`` is True where c is observed (some expert holds it),
    so is every c^(i) (c with attribute i set to y_i, for each i with c_i != y_i), and no other
    such c differs from y in fewer attributes. An observed y is its own sole anchor; an
    unobserved y whose row has no True has no anchor (then :func:`teacher_paths` falls back to
    Eq. 5 over marginals)."""
    combos = all_combinations(cardinalities).to(counts.device)
    observed = counts.sum(dim=0) > 0  # [M]
    size, k = combos.shape
    ys, cs = combos[:, None, :].expand(size, size, k), combos[None, :, :].expand(size, size, k)
    differ = ys != cs  # [y, c, k]
    valid = observed[None, :].expand(size, size).clone()
    for i in range(k):
        swapped = cs.clone()
        swapped[..., i] = ys[..., i]
        reached = observed[combination_index(swapped.reshape(-1, k), cardinalities)]
        valid &= ~differ[..., i] | reached.reshape(size, size)
    distance = torch.where(valid, differ.sum(dim=2), k + 1)
    return valid & (distance == distance.min(dim=1, keepdim=True).values)


def anchored_velocity(experts: Sequence[nn.Module], x: torch.Tensor, t: torch.Tensor,
                      y: torch.Tensor, anchor: torch.Tensor, owners: torch.Tensor,
                      cardinalities: Sequence[int]) -> torch.Tensor:
    """Eq. (5) anchored on an observed combination instead of the unconditional label:
    v(x, c) + sum_i (v(x, c^(i)) - v(x, c)) over the attributes i where c_i != y_i, with
    c = ``anchor`` [B, k] and c^(i) = c with attribute i set to y_i. ``owners`` [B, k + 1]: the
    expert answering v(x, c) (column 0) and each v(x, c^(i)) (column i + 1); each must hold
    its combination. Under Eq. (1) this is v(x, y): log p(x | c^(i)) - log p(x | c) =
    log p(y_i | x) - log p(c_i | x) + const, so the sum telescopes to log p(x | y), and
    Eq. (6) carries it to velocities as for Eq. (5). Every slot is a full conditional, which
    an expert holding the combination learned from its own data."""
    def answer(owner: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for b in torch.unique(owner).tolist():
            rows = owner == b
            out[rows] = experts[b](x[rows], t[rows], labels[rows])
        return out

    base = answer(owners[:, 0], anchor)
    out = base.clone()
    for i in range(len(cardinalities)):
        rows = anchor[:, i] != y[:, i]
        if rows.any():
            swapped = anchor[rows].clone()
            swapped[:, i] = y[rows, i]
            out[rows] += answer(owners[rows, i + 1], swapped) - base[rows]
    return out


@torch.no_grad()
def teacher_paths(experts: Sequence[nn.Module], counts: torch.Tensor,
                  cardinalities: Sequence[int], shape: tuple[int, ...], paths: int, steps: int,
                  generator: torch.Generator, device: torch.device, teacher: str = "anchored"):
    """Points on teacher paths for DCFM-B (Eq. 15), by the reading ``teacher`` (docs/dcfm.md):

    - ``observed``: Eq. (15) as it reads: y uniform over the combinations some expert holds,
      each path following one uniformly chosen expert holding y (full label);
    - ``marginal``: y uniform over the product space; an observed y as above, an unobserved y
      the experts composed with Eq. (5) under a random route (:func:`random_route`);
    - ``anchored``: y uniform over the product space; each path follows
      :func:`anchored_velocity` on an anchor drawn uniformly from :func:`anchors` (an observed
      y is its own anchor: one holder's full label, as above), every slot answered by an
      expert drawn uniformly among the holders of its combination; an unobserved y without an
      anchor falls back to ``marginal``.

    Each path is Euler-integrated from x0 ~ N(0, I) with ``steps`` steps. Returns every grid
    point of every path, flattened to ``paths * steps`` rows: (x_t, t = s / steps, y, teacher
    velocity at (x_t, t))."""
    if teacher not in TEACHERS:
        raise ConfigError(f"DCFM-B teacher {teacher!r}: use one of {', '.join(TEACHERS)}")
    counts = counts.to(device)
    k = len(cardinalities)
    if teacher == "observed":
        observed = all_combinations(cardinalities).to(device)[counts.sum(dim=0) > 0]
        pick = torch.randint(len(observed), (paths,), generator=generator, device=device)
        y = observed[pick]
    else:
        y = torch.stack([torch.randint(c, (paths,), generator=generator, device=device)
                         for c in cardinalities], dim=1)
    held = (counts[:, combination_index(y, cardinalities)] > 0).T.float()  # [P, n]
    known = held.sum(dim=1) > 0
    single = torch.zeros(paths, dtype=torch.long, device=device)
    if known.any():
        single[known] = torch.multinomial(held[known], 1, generator=generator).squeeze(1)
    route = random_route(y, attribute_holders(counts, cardinalities),
                         torch.rand(paths, k + 2, generator=generator, device=device))
    anchored = torch.zeros(paths, dtype=torch.bool, device=device)
    if teacher == "anchored":
        table = anchors(counts, cardinalities)[combination_index(y, cardinalities)]  # [P, M]
        anchored = ~known & table.any(dim=1)
        if anchored.any():
            combos = all_combinations(cardinalities).to(device)
            anchor = combos[torch.multinomial(table[anchored].float(), 1,
                                              generator=generator).squeeze(1)]
            slots = [anchor]
            for i in range(k):
                swapped = anchor.clone()
                swapped[:, i] = y[anchored, i]
                slots.append(swapped)
            owners = torch.stack(
                [torch.multinomial((counts[:, combination_index(labels, cardinalities)] > 0)
                                   .T.float(), 1, generator=generator).squeeze(1)
                 for labels in slots], dim=1)
    x = torch.randn(paths, *shape, generator=generator, device=device)
    novel = ~known & ~anchored
    points, velocities = [], []
    for s in range(steps):
        t = torch.full((paths,), s / steps, device=device)
        v = torch.empty_like(x)
        for b in torch.unique(single[known]).tolist():
            rows = known & (single == b)
            v[rows] = experts[b](x[rows], t[rows], y[rows])
        if anchored.any():
            v[anchored] = anchored_velocity(experts, x[anchored], t[anchored], y[anchored],
                                            anchor, owners, cardinalities)
        if novel.any():
            slots = slot_velocities(experts, route[novel], x[novel], t[novel], y[novel],
                                    cardinalities)
            v[novel] = compose(slots[0], slots[1:])
        points.append(x)
        velocities.append(v)
        x = x + v / steps
    t = (torch.arange(steps, device=device).float() / steps).repeat_interleave(paths)
    return torch.cat(points), t, y.repeat(steps, 1), torch.cat(velocities)


# -- public settings ------------------------------------------------------------------------

@dataclass(frozen=True)
class DCFMSettings:
    """What DCFM's clients and the server's ledger need, all public (the run config and the
    data recipe; the runner builds it).

    ``method``: dcfm-a | dcfm-b | ddm[-l] | fedflow[-l]. The data: example ``shape``, the
    attributes' ``cardinalities`` and ``nominal_size``, the public nominal shard size (q =
    ``batch_size`` / nominal_size under DP). The expert: ``network`` "mlp", a conditional MLP
    of width ``hidden``, or "unet", a conditional U-Net (``unet_width``, ``unet_mult``,
    ``unet_blocks``, ``unet_attention``, ``unet_layout``; images only), trained with Adam at
    ``lr`` (EMA ``ema_decay`` except for FedFlow), labels masked as ``masking``, CI weight
    ``ci_weight``. The schedule: ``local_steps`` of stage I, then ``dcfm_rounds`` rounds of
    ``dcfm_steps`` (DCFM-A), or ``fedflow_rounds`` of ``fedflow_local_steps`` (FedFlow).
    ``seed``: the run's published seed, which draws the public initial weights
    (:func:`initial_model`).
    """

    method: str
    shape: tuple[int, ...]
    cardinalities: tuple[int, ...]
    nominal_size: float
    hidden: int
    lr: float
    ema_decay: float
    batch_size: int
    masking: Masking
    ci_weight: float
    local_steps: int
    dcfm_rounds: int
    dcfm_steps: int
    fedflow_rounds: int
    fedflow_local_steps: int
    seed: int
    network: str = "mlp"
    unet_width: int = 32
    unet_mult: tuple[int, ...] = (1, 2, 2)
    unet_blocks: int = 1
    unet_attention: tuple[int, ...] = ()
    unet_layout: str = "compact"

    @property
    def fedflow(self) -> bool:
        return self.method.startswith("fedflow")

    @property
    def kind(self) -> str:
        """The kind clients derive from their data: FedFlow's ``update``, else ``model``."""
        return "update" if self.fedflow else "model"

    @property
    def local_ci(self) -> float:
        """The CI weight of stage I and of FedFlow's local steps (0 for the plain baselines)."""
        return 0.0 if self.method in ("ddm", "fedflow") else self.ci_weight

    @property
    def architecture(self) -> dict:
        """The expert network's arguments of :func:`expert_network` besides shape and
        cardinalities (what a checkpoint keeps to rebuild it)."""
        return {"network": self.network, "hidden": self.hidden, "unet_width": self.unet_width,
                "unet_mult": self.unet_mult, "unet_blocks": self.unet_blocks,
                "unet_attention": self.unet_attention, "unet_layout": self.unet_layout}

    def factory(self) -> nn.Module:
        """A fresh expert (its weights from the global torch generator)."""
        return expert_network(self.shape, self.cardinalities, **self.architecture)

    def planned_steps(self) -> int:
        """DP-SGD steps per client over the whole run (what sigma is calibrated for)."""
        if self.fedflow:
            return self.fedflow_rounds * self.fedflow_local_steps
        extra = self.dcfm_rounds * self.dcfm_steps if self.method == "dcfm-a" else 0
        return self.local_steps + extra

    def dp_plan(self, steps: int | None = None) -> Plan:
        """A client's DP-SGD steps (:meth:`planned_steps` by default) of :attr:`kind` at
        q = batch_size / the public nominal shard size."""
        steps = self.planned_steps() if steps is None else steps
        return Plan(poisson_rate(self.batch_size, self.nominal_size), ((self.kind, steps),))


def expert_network(shape: tuple[int, ...], cardinalities: tuple[int, ...], network: str,
                   hidden: int, unet_width: int, unet_mult, unet_blocks: int,
                   unet_attention, unet_layout: str = "compact") -> nn.Module:
    """A fresh conditional velocity v(x, t, y) (weights from the global torch generator):
    ``network`` "unet" (images [C, H, W]; checkpoints before ``unet_layout`` are compact) or
    "mlp" (width ``hidden``)."""
    if network == "unet":
        return ConditionalUNet(shape, cardinalities, unet_width, tuple(unet_mult), unet_blocks,
                               tuple(unet_attention), unet_layout)
    return ConditionalVelocityMLP(shape, cardinalities, hidden)


def initial_model(settings: DCFMSettings, index: int) -> nn.Module:
    """Model ``index`` of the run's public initialisation: the (index + 1)-th expert drawn
    after ``torch.manual_seed(settings.seed)``, under a forked generator (no one else's draws
    move). Public (the seed is in config.toml), so a client's own process makes the same one.
    Client i of n (federation order, 0-based) starts from model i; FedFlow's global model is
    model n; DCFM-B's student model 2n (as it has been drawn: after the n experts and the n
    uploads the server loaded)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        for _ in range(index):
            settings.factory()
        return settings.factory()


def expert_noise_multiplier(settings: DCFMSettings, dp: DPSettings) -> float:
    """sigma of the experts' DP-SGD over the planned steps
    (:func:`secureffm.privacy.budget.noise_multiplier`): calibrated to the target, or the
    given one, refused (:func:`~secureffm.privacy.budget.refuse_overspending`) when the planned
    steps at it would pass the target. Public (q is the nominal one), so the server's ledger
    and each client compute, and refuse, the same."""
    sigma = budget.noise_multiplier(dp, settings.dp_plan())
    budget.refuse_overspending(
        lambda steps: budget.gaussian_epsilon(dp, settings.dp_plan(steps), sigma), dp, sigma, 1,
        settings.planned_steps(), "steps",
        "plan at most {fit} steps (local_steps, plus dcfm_rounds x dcfm_steps for DCFM-A; "
        "fedflow_rounds x fedflow_local_steps for FedFlow)")
    return sigma


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
    (None when the message has none). Made under a forked generator: loading a model never
    moves anyone's draws."""
    with torch.random.fork_rng(devices=[]):
        model = factory().to(device)
    state = {name[len("param/"):]: torch.as_tensor(value) for name, value in payload.items()
             if name.startswith("param/")}
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.eval(), payload.get("counts")


def _stack(counts: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.stack(counts), device=device)


# -- local training -------------------------------------------------------------------------

class LocalExpert:
    """One client's expert: Adam steps on the mean (plain) or DP-SGD gradient of
    :func:`expert_losses` over its labelled shard (labels in ``client.state["labels"]``).

    ``dp``: resolved DP settings and ``sigma`` the noise multiplier, or None; ``kind`` names
    the message kind the steps are charged to (by the server's ledger) and keys the per-example
    draws. ``nominal_size``: the public nominal shard size (required under DP): q =
    :func:`poisson_rate` and the divisor E[b] = q * nominal_size, so neither depends on the
    client's true size.
    """

    def __init__(self, client: Client, model: nn.Module, lr: float, ema_decay: float,
                 batch_size: int, cardinalities: Sequence[int], masking: Masking,
                 dp=None, sigma: float = 0.0, kind: str = "model",
                 nominal_size: float | None = None):
        self.client = client
        self.model = model
        self.trainer = GlobalModel(model, lr, ema_decay)
        self.batch_size = batch_size
        self.cardinalities = tuple(cardinalities)
        self.masking = masking
        self.dp, self.sigma, self.kind = dp, sigma, kind
        self.counts = label_counts(client.state["labels"], cardinalities)
        self.width = example_width(client.data.shape[1:], len(cardinalities))
        self.secret = None
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
        return float(losses.detach().mean()) if len(losses) else 0.0

    def train(self, steps: int, round_: int, ci_weight: float, desc: str, progress: bool,
              peers: Sequence[nn.Module] | None = None,
              holders: Sequence[torch.Tensor] | None = None) -> float:
        """Local steps 0..``steps`` - 1 of ``round_`` (``peers``: DCFM-A's experts, this one's
        first, and their ``holders``); returns the mean loss over the last 10% of steps."""
        bar = progress_bar(range(steps), desc=f"{desc} {self.client.id}", disable=not progress,
                           unit="step", dynamic_ncols=True, leave=False)
        history = [self.step(round_, step, ci_weight, peers, 0, holders) for step in bar]
        return float(np.mean(history[-max(1, steps // 10):])) if history else 0.0

    @property
    def published(self) -> nn.Module:
        """The parameters this client sends: the EMA when kept, else the live model."""
        return self.trainer.averaged


class DCFMClient:
    """DCFM's client side, from public settings only, so a client's own process builds the
    same program. Tasks (:class:`~secureffm.federation.channel.Task`):

    - ``dcfm.publish``, args ``{"rounds": r}``: first the training not done yet up to stage I
      (r = 0) or DCFM-A round r (Eq. 14 against the peers this client gathered in that round,
      ``client.peers(round, "model")``), then the expert as a ``model`` payload with its label
      counts;
    - ``fedflow.update``, args ``{"round": r}``: ``fedflow_local_steps`` steps from the
      broadcast theta (``client.inbox["global_model"]``); returns ``{"update": theta_i -
      theta}``.

    The client's expert (model, Adam, EMA) is in ``client.kept``, its DP stream and what it
    trained (``trained``: -1 nothing, 0 stage I, r DCFM-A round r) and its losses
    (``stage_one_loss``, ``dcfm_a_loss``, ``last_loss``: not privatized, never sent) in
    ``client.state``. ``clients``: the federation's client ids in order (client i starts from
    :func:`initial_model` i - 1); labels in ``client.state["labels"]``.

    ``releases``: what a client answers (:class:`~secureffm.privacy.releases.ReleaseGuard`),
    each once, from these settings alone: ``dcfm.publish`` for rounds 0..dcfm_rounds (DCFM-A)
    or 0 (DCFM-B, DDM), ``fedflow.update`` for rounds 1..fedflow_rounds (FedFlow). So a
    client trains at most its planned steps, which :func:`expert_noise_multiplier` keeps
    within the target.
    """

    TASKS = ("dcfm.publish", "fedflow.update")

    def __init__(self, settings: DCFMSettings, dp: DPSettings | None, clients: Sequence[str],
                 device: torch.device, progress: bool = False):
        self.settings, self.dp, self.clients = settings, dp, tuple(clients)
        self.device, self.progress = device, progress
        self.sigma = expert_noise_multiplier(settings, dp) if dp is not None else 0.0
        if settings.fedflow:
            plan = {"fedflow.update": Rounds(1, settings.fedflow_rounds)}
        else:
            last = settings.dcfm_rounds if settings.method == "dcfm-a" else 0
            plan = {"dcfm.publish": Rounds(0, last)}
        self.releases = ReleaseGuard(plan)

    def __call__(self, client: Client, task: Task) -> Payload:
        if task.name not in self.TASKS:
            raise TaskRefused(f"DCFM clients run {', '.join(self.TASKS)}, not {task.name!r}")
        count = task_count(client.id, task, "round" if task.name == "fedflow.update"
                           else "rounds")
        refused = self.releases.admit(client.id, client.state, task.name, count)
        if refused:
            raise TaskRefused(refused)
        if "expert" not in client.state:
            self.setup(client)
        if task.name == "fedflow.update":
            return self._update(client, count)
        self._train_through(client, count)
        expert = client.state["expert"]
        return model_payload(expert.published, expert.counts)

    def setup(self, client: Client) -> None:
        """The client's expert from its public initial weights, kept in ``client.kept``."""
        s = self.settings
        if client.id not in self.clients:
            raise ConfigError(f"{client.id} is not one of the run's clients {self.clients}")
        model = initial_model(s, self.clients.index(client.id)).to(self.device)
        expert = LocalExpert(client, model, s.lr, 0.0 if s.fedflow else s.ema_decay,
                             s.batch_size, s.cardinalities, s.masking, self.dp, self.sigma,
                             s.kind, s.nominal_size)
        client.state["expert"] = expert
        client.state["trained"] = -1
        client.kept["expert"] = expert.trainer
        if expert.secret is not None:
            client.state["dp_rng"] = expert.secret

    def _train_through(self, client: Client, rounds: int) -> None:
        """Stage I, then DCFM-A rounds 1..``rounds``, each unless done already."""
        s, expert = self.settings, client.state["expert"]
        if client.state["trained"] < 0:
            client.state["stage_one_loss"] = expert.train(s.local_steps, 0, s.local_ci,
                                                          "stage I", self.progress)
            client.state["trained"] = 0
        for round_ in range(client.state["trained"] + 1, rounds + 1):
            peers, holders = self._peers(client, round_)
            client.state["dcfm_a_loss"] = expert.train(
                s.dcfm_steps, round_, s.ci_weight, f"DCFM-A round {round_}", self.progress,
                peers, holders)
            client.state["trained"] = round_

    def _peers(self, client: Client, round_: int) -> tuple[list[nn.Module], list[torch.Tensor]]:
        """The experts of DCFM-A round ``round_`` (this client's first, then the peers' copies
        it gathered, in federation order) and their attribute holders."""
        expert, held = client.state["expert"], client.peers(round_, "model")
        loaded = [load_payload_model(held[cid], self.settings.factory, self.device)
                  for cid in self.clients if cid in held]
        counts = [expert.counts] + [c for _, c in loaded]
        holders = attribute_holders(_stack(counts, self.device), self.settings.cardinalities)
        return [expert.model] + [m for m, _ in loaded], holders

    def _update(self, client: Client, round_: int) -> Payload:
        s, expert = self.settings, client.state["expert"]
        theta = client.inbox["global_model"]["theta"]
        load_flat_params(expert.model, theta)
        losses = [expert.step(round_, step, s.local_ci) for step in range(s.fedflow_local_steps)]
        client.state["last_loss"] = float(np.mean(losses))
        return {"update": flat_params(expert.model) - theta}


# -- the server -----------------------------------------------------------------------------

class DCFMServer:
    """DCFM's server for stage I, DCFM-A and the uploads of DCFM-B and DDM: it asks the
    channel's clients to run :class:`DCFMClient`'s ``dcfm.publish`` and charges ``ledger``
    (None without DP) for the training each request asks for; it never touches a client."""

    def __init__(self, channel: Channel, settings: DCFMSettings, device: torch.device,
                 ledger: ServerLedger | None = None):
        self.channel, self.settings, self.device, self.ledger = channel, settings, device, ledger
        self.asked = {c.id: -1 for c in channel.clients}  # the training asked of each so far

    def publish(self, clients: Sequence[str], rounds: int) -> Task:
        """The task asking ``clients`` to train through stage I (0) or DCFM-A round
        ``rounds``, then publish; each is charged the stages it was not asked for before."""
        s = self.settings
        for cid in clients:
            for stage in range(self.asked[cid] + 1, rounds + 1) if self.ledger else ():
                self.ledger.charge([cid], s.kind, stage,
                                   s.local_steps if stage == 0 else s.dcfm_steps)
            self.asked[cid] = max(self.asked[cid], rounds)
        return Task("dcfm.publish", {"rounds": rounds})

    def gather(self, round_: int) -> dict[str, list[str]]:
        """DCFM-A round ``round_``'s all-gather: each client publishes its expert after the
        previous round (stage I for round 1) to every other client."""
        ids = [c.id for c in self.channel.clients]
        return self.channel.all_gather(round_, "model", self.publish(ids, round_ - 1))

    def upload(self, round_: int, rounds: int) -> dict[str, tuple[nn.Module, np.ndarray]]:
        """Each client trains through ``rounds`` and sends its expert to the server once
        (``model``, phase upload, round ``round_``); author -> (model, counts) of every one
        that arrived."""
        received = {}
        for client in self.channel.clients:
            payload = self.channel.send(round_, "upload", "model", client.id, SERVER,
                                        self.publish([client.id], rounds))
            if payload is not None:
                received[client.id] = load_payload_model(payload, self.settings.factory,
                                                         self.device)
        if not received:
            raise DataError("no expert reached the server (every upload was dropped or "
                            "rejected); check the threat model's faults")
        return received

    def run_a(self) -> tuple[list[nn.Module], torch.Tensor]:
        """DCFM-A: ``dcfm_rounds`` all-gathers, each client training one round against the
        copies it gathered before the next, then the final upload. Returns the server's
        experts and their label counts [n, prod |Y_j|]."""
        rounds = self.settings.dcfm_rounds
        for round_ in range(1, rounds + 1):
            self.gather(round_)
        final = self.upload(rounds + 1, rounds)
        return [m for m, _ in final.values()], _stack([c for _, c in final.values()],
                                                      self.device)


class DCFMB:
    """DCFM-B's server: distill one student from uploaded experts (Eq. 17) with Adam, then
    send it to every client as a ``model`` message."""

    def __init__(self, settings: DCFMSettings, clients: int, device: torch.device,
                 generator: torch.Generator, teacher: str = "anchored"):
        """``clients``: n, which places the student in the public initialisation
        (:func:`initial_model` 2n); ``teacher``: the reading of Eq. (15)'s teacher paths
        (:func:`teacher_paths`)."""
        if teacher not in TEACHERS:
            raise ConfigError(f"DCFM-B teacher {teacher!r}: use one of {', '.join(TEACHERS)}")
        self.settings, self.device, self.generator = settings, device, generator
        self.teacher = teacher
        self.student = GlobalModel(initial_model(settings, 2 * clients).to(device), settings.lr,
                                   settings.ema_decay)

    def distill(self, teachers: Sequence[nn.Module], counts: torch.Tensor, steps: int,
                batch: int, teacher_steps: int, progress: bool, bank_paths: int = 1024,
                refresh: int = 50) -> float:
        """``steps`` student steps of ``batch`` points drawn from a bank of ``bank_paths``
        teacher paths (every grid point), redrawn every ``refresh`` steps; returns the mean
        loss over the last 10% of steps."""
        s = self.settings
        estimator = PlainGradient(self.student.module)
        history = []
        for step in progress_bar(range(steps), desc="DCFM-B distillation",
                                 disable=not progress, unit="step", dynamic_ncols=True,
                                 leave=False):
            if step % refresh == 0:
                bank = teacher_paths(teachers, counts, s.cardinalities, s.shape, bank_paths,
                                     teacher_steps, self.generator, self.device, self.teacher)
            pick = torch.randint(len(bank[0]), (batch,), generator=self.generator,
                                 device=self.device)
            x_t, t, y, target = (part[pick] for part in bank)
            mask = torch.rand(batch, 2, generator=self.generator, device=self.device)
            losses = student_losses(self.student.module, x_t, t, y, target, s.cardinalities,
                                    s.masking, mask, s.ci_weight)
            self.student.apply(estimator(losses, len(losses)))
            history.append(float(losses.detach().mean()))
        return float(np.mean(history[-max(1, steps // 10):])) if history else 0.0

    def send_student(self, channel: Channel, round_: int) -> int:
        """The student to every client (``model``, phase broadcast; each keeps it in
        ``client.inbox["model"]``); returns deliveries."""
        payload = model_payload(self.student.averaged)
        delivered = 0
        for client in channel.clients:
            received = channel.send(round_, "broadcast", "model", SERVER, client.id, payload)
            delivered += received is not None
        return delivered
