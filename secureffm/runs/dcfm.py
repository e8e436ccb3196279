"""One run of DCFM or a baseline (``dcfm-a``, ``dcfm-b``, ``fedflow[-l]``, ``ddm[-l]``) on
conditional data: parties, training through the channel, sampling, the run folder.

The run folder holds config.toml, metrics.json (per-combination in-mode fractions on modes2d,
communication per client from the log), messages.jsonl, samples.png, checkpoint.pt and, under
DP, privacy.json. :func:`load_dcfm` turns a run folder back into a sampler of any combination.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from ..config import RunConfig, write_config  # noqa: E402
from ..errors import ProtocolError  # noqa: E402
from ..federation.channel import Channel  # noqa: E402
from ..federation.faults import load_threat_model  # noqa: E402
from ..federation.log import MessageLog  # noqa: E402
from ..federation.parties import Client, new_clients, secret_randomness  # noqa: E402
from ..methods.dcfm import (  # noqa: E402
    DCFMA,
    DCFMB,
    ComposedField,
    LocalExpert,
    Masking,
    all_combinations,
    attribute_holders,
    random_route,
    train_experts,
    upload_models,
)
from ..methods.dcfm_baselines import FedFlow, RouterField  # noqa: E402
from ..methods.ffm import client_weights  # noqa: E402
from ..metrics.sampling import integrate  # noqa: E402
from ..models.conditional import ConditionalVelocityMLP  # noqa: E402
from ..privacy.accounting import calibrate_noise, check_delta, epsilon  # noqa: E402
from ..privacy.dpsgd import poisson_rate  # noqa: E402
from ..privacy.ledger import PrivacyLedger  # noqa: E402
from ..privacy.settings import DPSettings  # noqa: E402
from ..protocols.protocol import load_protocol  # noqa: E402
from ..protocols.statement import privacy_statement  # noqa: E402
from ..runtime import party_generator, resolve_device  # noqa: E402
from .scaffold import (  # noqa: E402
    RunResult,
    check_pin_path,
    load_checkpoint,
    open_channel,
    prepare_run_folder,
    record_pin,
    resolve_dp,
    run_folder,
)

__all__ = ["ConditionalData", "conditional_data", "nominal_shard_size", "local_experts",
           "run_dcfm", "DCFMSampler", "load_dcfm", "communication"]

EVALUATOR = 1_000_000  # party index of the evaluator's generator (outside the federation)


@dataclass(frozen=True)
class ConditionalData:
    """Client shards (x [n, *shape] float, labels [n, k] long), the attributes' cardinalities
    and the combinations no client holds, ``novel`` [m, k]."""

    shards: list[tuple[torch.Tensor, torch.Tensor]]
    cardinalities: tuple[int, ...]
    novel: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.shards[0][0].shape[1:])


def conditional_data(config: RunConfig) -> ConditionalData:
    """``modes2d``: clients x shard_size points over the three observed modes; partition
    ``disjoint`` is the paper's non-IID split. ``colored-digits``: the bundled digits at total
    coverage ``coverage``, partition ``iid`` or ``dirichlet``."""
    if config.data == "modes2d":
        from ..data.modes2d import CARDINALITIES, MISSING, OBSERVED, modes2d_shards

        per_mode = max(1, config.clients * config.shard_size // len(OBSERVED))
        shards = modes2d_shards(per_mode, config.clients, config.partition, config.seed,
                                config.dirichlet_alpha)
        return ConditionalData(shards, CARDINALITIES, torch.tensor([MISSING]))
    from ..data.colored_digits import federated_colored_digits

    split = federated_colored_digits(config.clients, config.coverage, config.partition,
                                     config.dirichlet_alpha, config.seed,
                                     min_size=config.batch_size)
    return ConditionalData([(s.x, s.labels) for s in split.clients], split.cardinalities,
                           split.novel)


def _factory(config: RunConfig, data: ConditionalData):
    return lambda: ConditionalVelocityMLP(data.shape, data.cardinalities, config.hidden)


def _planned_steps(config: RunConfig) -> int:
    if config.method.startswith("fedflow"):
        return config.fedflow_rounds * config.fedflow_local_steps
    extra = config.dcfm_rounds * config.dcfm_steps if config.method == "dcfm-a" else 0
    return config.local_steps + extra


def nominal_shard_size(data: ConditionalData) -> float:
    """The public nominal shard size: the data set's size over the number of clients. Both are
    public (the data set is generated from the run config, and every partition deals all of
    it), while a client's own size is private: adding or removing an example changes it."""
    return sum(len(x) for x, _ in data.shards) / len(data.shards)


def local_experts(config: RunConfig, data: ConditionalData, clients: list[Client],
                  dp: DPSettings | None, ledger: PrivacyLedger | None, kind: str,
                  device: torch.device) -> tuple[dict[str, LocalExpert], dict[str, float]]:
    """Each client's :class:`LocalExpert` (client id -> expert) and noise multiplier; under DP
    q = batch_size / :func:`nominal_shard_size` for every client, so sigma is one value."""
    nominal = nominal_shard_size(data)
    sigma = _noise(config, dp, poisson_rate(config.batch_size, nominal)) if dp else 0.0
    masking = Masking(config.p_full, config.p_marginal, config.p_uncond)
    ema = 0.0 if config.method.startswith("fedflow") else config.ema_decay
    experts = {c.id: LocalExpert(c, _factory(config, data)().to(device), config.lr, ema,
                                 config.batch_size, data.cardinalities, masking, dp, sigma,
                                 ledger, kind, nominal)
               for c in clients}
    return experts, {c.id: sigma for c in clients}


def _noise(config: RunConfig, dp, rate: float) -> float:
    """sigma calibrated to the target over the planned steps, or the given one (which must
    then fit the target)."""
    steps = _planned_steps(config)
    if dp.noise_multiplier is None:
        return calibrate_noise(dp.target_epsilon, dp.delta, [(rate, steps)], dp.accountant)
    if dp.target_epsilon is not None:
        spent = epsilon([(dp.noise_multiplier, rate, steps)], dp.delta, dp.accountant)
        if spent > dp.target_epsilon:
            raise ProtocolError(
                f"noise_multiplier = {dp.noise_multiplier} over {steps} planned steps spends "
                f"epsilon {spent:.2f} > target {dp.target_epsilon}; raise the noise multiplier "
                "or lower the step counts")
    return dp.noise_multiplier


class DCFMSampler:
    """Samples any combination from a trained run.

    ``kind``: ``composed`` (experts composed with Eq. 5, each attribute routed at random to an
    expert holding its value), ``monolithic`` (one model composed with itself) or ``router``
    (DDM's mixture). ``counts`` [n, prod |Y_j|]: the experts' label counts.
    """

    def __init__(self, kind: str, models: list[nn.Module], counts: torch.Tensor,
                 cardinalities: tuple[int, ...], shape: tuple[int, ...], guidance: float = 1.0):
        self.kind, self.models, self.counts = kind, models, counts
        self.cardinalities, self.shape = tuple(cardinalities), tuple(shape)
        self.weights = [guidance] * len(cardinalities)

    def field(self, y: torch.Tensor, generator: torch.Generator) -> nn.Module:
        """The velocity v(x, t) that generates labels y [N, k]."""
        if self.kind == "router":
            return RouterField(self.models, self.counts, y, self.cardinalities)
        if self.kind == "monolithic":
            route = torch.zeros(y.shape[0], len(self.cardinalities) + 1, dtype=torch.long,
                                device=y.device)
        else:
            u = torch.rand(y.shape[0], len(self.cardinalities) + 2, generator=generator,
                           device=y.device)
            route = random_route(y, attribute_holders(self.counts, self.cardinalities), u)
        return ComposedField(self.models, y, route, self.cardinalities, self.weights)

    @torch.no_grad()
    def sample(self, combination, n: int, generator: torch.Generator, nfe: int = 100,
               ) -> torch.Tensor:
        """n samples [n, *shape] of ``combination`` (k label values), Euler with ``nfe``."""
        device = generator.device
        y = torch.as_tensor(combination, device=device).reshape(1, -1).expand(n, -1)
        x0 = torch.randn(n, *self.shape, generator=generator, device=device)
        return integrate(self.field(y, generator), x0, nfe)[0]


def communication(log_path: Path, parties: list[str]) -> dict[str, dict[str, int]]:
    """Bytes and messages each party sent and received, from the message log."""
    out = {p: defaultdict(int) for p in parties}
    for line in Path(log_path).read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "event":
            continue
        for role, party in (("sent", record["sender"]), ("received", record["recipient"])):
            if party in out:
                out[party][f"{role}_bytes"] += record["bytes"]
                out[party][f"{role}_messages"] += 1
                out[party][f"{record['kind']}_bytes"] += record["bytes"]
    return {p: dict(v) for p, v in out.items()}


def _train(config: RunConfig, data: ConditionalData, channel: Channel,
           experts: dict[str, LocalExpert], device: torch.device) -> tuple[DCFMSampler, dict]:
    """The method's training; returns its sampler and training diagnostics."""
    c, factory = config, _factory(config, data)
    ci_local = 0.0 if config.method in ("ddm", "fedflow") else c.ci_weight
    sampler_args = (data.cardinalities, data.shape, c.guidance)
    if c.method.startswith("fedflow"):
        model = factory().to(device)
        private = next(iter(experts.values())).dp is not None
        fed = FedFlow(channel, model, experts,
                      client_weights(channel.clients, c.weighting, private=private))
        aborted = fed.run(c.fedflow_rounds, c.fedflow_local_steps, ci_local, c.progress)
        return (DCFMSampler("monolithic", [model.eval()], _counts(experts, device),
                            *sampler_args), {"aborted_rounds": aborted})
    stage_one = train_experts(list(experts.values()), c.local_steps, 0, ci_local, "stage I",
                              c.progress)
    report = {"stage_one_loss": stage_one}
    if c.method == "dcfm-a":
        models, counts, losses = DCFMA(channel, experts, factory, device, c.ci_weight,
                                       c.progress).run(c.dcfm_rounds, c.dcfm_steps)
        return DCFMSampler("composed", models, counts, *sampler_args), {**report,
                                                                        "dcfm_a_loss": losses}
    received = upload_models(channel, 1, experts, factory, device)
    models = [m for m, _ in received.values()]
    counts = torch.as_tensor(np.stack([n for _, n in received.values()]), device=device)
    if c.method == "dcfm-b":
        server = DCFMB(factory, data.cardinalities, data.shape,
                       Masking(c.p_full, c.p_marginal, c.p_uncond), c.lr, c.ema_decay, device,
                       party_generator(c.seed, 0, device))
        report["student_loss"] = server.distill(models, counts, c.distill_steps, c.batch_size,
                                                c.teacher_steps, c.ci_weight, c.progress)
        server.send_student(channel, 2)
        return (DCFMSampler("monolithic", [server.student.averaged.eval()], counts,
                            *sampler_args), report)
    return DCFMSampler("router", models, counts, *sampler_args), report


def _counts(experts: dict[str, LocalExpert], device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.stack([e.counts for e in experts.values()]), device=device)


def _evaluate(config: RunConfig, data: ConditionalData, sampler: DCFMSampler,
              device: torch.device) -> tuple[dict, dict]:
    """Samples of every combination (``eval_samples`` each on modes2d, 8 on images) and, on
    modes2d, the fraction of each combination's samples within 3 std of its mode."""
    generator = party_generator(config.seed, EVALUATOR, device)
    n = config.eval_samples if config.data == "modes2d" else 8
    samples = {tuple(y.tolist()): sampler.sample(y, n, generator, max(config.nfe)).cpu()
               for y in all_combinations(data.cardinalities)}
    report: dict = {"nfe": max(config.nfe), "samples_per_combination": n}
    if config.data == "modes2d":
        from ..data.modes2d import MISSING, OBSERVED, in_mode_fraction

        fractions = {f"{a},{b}": in_mode_fraction(x, (a, b)) for (a, b), x in samples.items()}
        report["in_mode_fraction"] = fractions
        report["missing_mode_fraction"] = fractions["{},{}".format(*MISSING)]
        report["observed_mode_fraction"] = float(np.mean(
            [fractions["{},{}".format(*y)] for y in OBSERVED]))
    return report, samples


def _plot_samples(path: Path, data: ConditionalData, samples: dict, title: str) -> None:
    """2D: the clients' data and the generated samples per combination; images: a grid with
    one row per combination (novel ones titled in red)."""
    novel = {tuple(y.tolist()) for y in data.novel}
    if len(data.shape) == 1:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5), sharex=True, sharey=True)
        for i, (x, _) in enumerate(data.shards):
            left.scatter(x[:2000, 0], x[:2000, 1], s=2, alpha=0.5, label=f"client-{i + 1}")
        for combo, x in samples.items():
            right.scatter(x[:, 0], x[:, 1], s=2, alpha=0.5,
                          label=f"y={combo}" + (" (novel)" if combo in novel else ""))
        left.set_title("data held by each client")
        right.set_title(title, fontsize=9)
        for ax in (left, right):
            ax.set_aspect("equal")
            ax.legend(markerscale=5, fontsize=7, loc="upper left")
    else:
        combos = list(samples)
        cols = min(4, len(next(iter(samples.values()))))
        side = math.ceil(math.sqrt(len(combos)))
        fig, axes = plt.subplots(side, side, figsize=(1.6 * side, 1.6 * side), squeeze=False)
        for ax in axes.flat:
            ax.axis("off")
        for ax, combo in zip(axes.flat, combos, strict=False):
            row = samples[combo][:cols]
            tiles = ((row[:, :3].clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)
            ax.imshow(torch.cat(list(tiles), dim=1).numpy())
            ax.set_title(str(combo), fontsize=6, color="red" if combo in novel else "black")
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_dcfm(config: RunConfig):
    """Train and evaluate a DCFM-family ``config``; write the run folder."""
    device = resolve_device(config.device)
    out = run_folder(config)
    check_pin_path(out, config.pin_to)
    prepare_run_folder(out, config.overwrite)
    write_config(config, out / "config.toml")
    torch.manual_seed(config.seed)  # network initialisation only; parties use their generators
    data = conditional_data(config)
    protocol = load_protocol(config.protocol)
    kind = "update" if config.method.startswith("fedflow") else "model"
    dp = resolve_dp(config, protocol, (kind,))
    if dp is not None:
        check_delta(dp.delta, nominal_shard_size(data))
    log = MessageLog(out / "messages.jsonl", keep_payloads=config.keep_payloads)
    clients = new_clients([x.to(device) for x, _ in data.shards], config.deterministic_seed)
    for client, (_, labels) in zip(clients, data.shards, strict=True):
        client.state["labels"] = labels.to(device)
    faults = load_threat_model(config.threat_model) if config.threat_model else None
    channel = open_channel(protocol, clients, log, faults, config.deterministic_seed)
    ledger = PrivacyLedger(dp.delta) if dp else None
    experts, sigmas = local_experts(config, data, clients, dp, ledger, kind, device)
    start = time.perf_counter()
    try:
        sampler, training = _train(config, data, channel, experts, device)
    finally:
        head = channel.close()
    pin = record_pin(out, head, config.pin_to)
    train_seconds = time.perf_counter() - start
    report, samples = _evaluate(config, data, sampler, device)
    metrics = {
        "method": config.method, "protocol": protocol.name, "data": config.data,
        "partition": config.partition, "clients": config.clients,
        "train_seconds": train_seconds, "training": training, "eval": report,
        "novel_combinations": data.novel.tolist(),
        "communication": communication(out / "messages.jsonl", [c.id for c in clients]),
        "messages": log.summary(),
    }
    accounting = None
    if ledger is not None:
        accounting = ledger.report(dp.target_epsilon, dp.accountant)
        accounting.update(noise_multiplier=sigmas, clip=dp.clip)
    exclusions = () if kind == "update" else (
        "label counts per combination travel in model messages without DP (docs/dcfm.md)",)
    privacy = privacy_statement(protocol, (kind,), accounting=accounting, exclusions=exclusions,
                                nominal_records=None if dp is None else
                                round(nominal_shard_size(data)),
                                secret_randomness=secret_randomness(config.insecure_deterministic))
    (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    torch.save({"config": config.to_dict(), "kind": sampler.kind,
                "models": [m.state_dict() for m in sampler.models],
                "counts": sampler.counts.cpu(), "cardinalities": data.cardinalities,
                "shape": data.shape}, out / "checkpoint.pt")
    label = f"{config.method}, {protocol.name}, {config.partition} ({config.data})"
    _plot_samples(out / "samples.png", data, samples, f"samples: {label}")
    return RunResult(out, metrics, pin)


def load_dcfm(run_dir: str | Path, device: str = "cpu") -> DCFMSampler:
    """The sampler of a finished DCFM-family run (its experts, student or global model)."""
    checkpoint = load_checkpoint(Path(run_dir) / "checkpoint.pt", device)
    config = checkpoint["config"]
    models = []
    for state in checkpoint["models"]:
        model = ConditionalVelocityMLP(checkpoint["shape"], checkpoint["cardinalities"],
                                       config["hidden"])
        model.load_state_dict(state)
        models.append(model.to(device).eval().requires_grad_(False))
    return DCFMSampler(checkpoint["kind"], models, checkpoint["counts"].to(device),
                       checkpoint["cardinalities"], checkpoint["shape"], config["guidance"])
