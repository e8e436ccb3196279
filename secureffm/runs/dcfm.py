"""One run of DCFM or a baseline (``dcfm-a``, ``dcfm-b``, ``fedflow[-l]``, ``ddm[-l]``) on
conditional data: parties, training through the channel, sampling, the run folder.

The run folder holds config.toml, metrics.json (per-combination in-mode fractions on modes2d,
communication per client from the log), messages.jsonl, samples.png, checkpoint.safetensors and,
under DP, privacy.json. :func:`load_dcfm` turns a run folder back into a sampler of any combination.

The clients run :class:`~secureffm.methods.dcfm.DCFMClient` (in this process, or each in its own
on Flower: ``connect``); the server holds only what they send and the data's public facts.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import RunConfig, write_config
from ..errors import ConfigError
from ..federation.channel import Channel
from ..federation.faults import load_threat_model
from ..federation.log import MessageLog
from ..federation.parties import Client, new_clients
from ..methods.dcfm import (
    DCFMB,
    ComposedField,
    DCFMClient,
    DCFMServer,
    DCFMSettings,
    Masking,
    all_combinations,
    attribute_holders,
    expert_network,
    expert_noise_multiplier,
    initial_model,
    random_route,
)
from ..methods.dcfm_baselines import FedFlow, RouterField
from ..methods.ffm import client_weights
from ..metrics.sampling import integrate
from ..privacy.accounting import check_delta
from ..privacy.budget import ServerLedger
from ..privacy.settings import DPSettings
from ..protocols.protocol import Protocol, load_protocol
from ..protocols.statement import privacy_statement
from ..runtime import party_generator, resolve_device
from .ffm import Connect
from .scaffold import (
    CHECKPOINT,
    RunResult,
    check_pin_path,
    load_checkpoint,
    open_channel,
    prepare_run_folder,
    record_pin,
    resolve_dp,
    run_folder,
    save_checkpoint,
)

__all__ = ["ConditionalData", "DataFacts", "conditional_data", "public_facts",
           "nominal_shard_size", "dcfm_settings", "run_dcfm", "DCFMSampler", "load_dcfm",
           "communication"]

EVALUATOR = 1_000_000  # party index of the evaluator's generator (outside the federation)


@dataclass(frozen=True)
class DataFacts:
    """What the server knows of a conditional data set without holding it: the attributes'
    ``cardinalities``, the example ``shape``, the combinations no client holds (``novel``
    [m, k]) and the public nominal shard size (:func:`nominal_shard_size`)."""

    cardinalities: tuple[int, ...]
    shape: tuple[int, ...]
    novel: torch.Tensor
    nominal_size: float


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

    @property
    def facts(self) -> DataFacts:
        return DataFacts(self.cardinalities, self.shape, self.novel, nominal_shard_size(self))


def _per_mode(config: RunConfig) -> int:
    """modes2d: points per observed mode (clients x shard_size over the three modes)."""
    from ..data.modes2d import OBSERVED

    return max(1, config.clients * config.shard_size // len(OBSERVED))


def conditional_data(config: RunConfig) -> ConditionalData:
    """``modes2d``: clients x shard_size points over the three observed modes; partition
    ``disjoint`` is the paper's non-IID split. ``colored-digits`` (the bundled 8 x 8 digits) and
    ``colored-mnist`` (MNIST's training images from ``data_dir``): total coverage ``coverage``,
    partition ``iid`` or ``dirichlet``."""
    if config.data == "modes2d":
        from ..data.modes2d import CARDINALITIES, MISSING, modes2d_shards

        shards = modes2d_shards(_per_mode(config), config.clients, config.partition,
                                config.seed, config.dirichlet_alpha)
        return ConditionalData(shards, CARDINALITIES, torch.tensor([MISSING]))
    from ..data.colored_digits import federated_colored_digits
    from ..data.images import mnist_intensity

    gray = mnist_intensity(config.data_dir) if config.data == "colored-mnist" else None
    split = federated_colored_digits(config.clients, config.coverage, config.partition,
                                     config.dirichlet_alpha, config.seed,
                                     min_size=config.batch_size, images=gray)
    return ConditionalData([(s.x, s.labels) for s in split.clients], split.cardinalities,
                           split.novel)


def public_facts(config: RunConfig) -> DataFacts:
    """The facts of ``config``'s data set from its public recipe alone, for a server that holds
    no data (on Flower): modes2d only, whose modes and dealing are public constants."""
    if config.data != "modes2d":
        raise ConfigError(f"data = {config.data!r}: a server that holds no data (--engine "
                          "flower) knows the novel combinations and the nominal shard size of "
                          "data = 'modes2d' only; use modes2d or --engine inprocess")
    from ..data.modes2d import CARDINALITIES, MISSING, OBSERVED

    return DataFacts(CARDINALITIES, (2,), torch.tensor([MISSING]),
                     len(OBSERVED) * _per_mode(config) / config.clients)


def nominal_shard_size(data: ConditionalData) -> float:
    """The public nominal shard size: the data set's size over the number of clients. Both are
    public (the data set is generated from the run config, and every partition deals all of
    it), while a client's own size is private: adding or removing an example changes it."""
    return sum(len(x) for x, _ in data.shards) / len(data.shards)


def dcfm_settings(config: RunConfig, facts: DataFacts,
                  protocol: Protocol) -> tuple[DCFMSettings, DPSettings | None]:
    """The run's public DCFM settings and its DP settings (None without DP), as the server and
    every client's own process derive them."""
    c = config
    settings = DCFMSettings(
        c.method, facts.shape, facts.cardinalities, facts.nominal_size, c.hidden, c.lr,
        c.ema_decay, c.batch_size, Masking(c.p_full, c.p_marginal, c.p_uncond), c.ci_weight,
        c.local_steps, c.dcfm_rounds, c.dcfm_steps, c.fedflow_rounds, c.fedflow_local_steps,
        c.seed, "unet" if c.dcfm_unet else "mlp", c.unet_width, c.unet_mult, c.unet_blocks,
        c.unet_attention, c.unet_layout)
    dp = resolve_dp(config, protocol, (settings.kind,))
    if dp is not None:
        check_delta(dp.delta, facts.nominal_size)
    return settings, dp


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


def _client_losses(channel: Channel, keys: tuple[str, ...]) -> dict:
    """Each client's training losses ``keys`` (a list per key, federation order) as it kept
    them in its state: only where this process holds the clients (the in-process engine; the
    losses are not privatized and never sent). On Flower they stay on the clients, and the
    report says so."""
    if not all(isinstance(c, Client) for c in channel.clients):
        return {"client_losses": f"absent: {', '.join(keys)} stay in each client's own state "
                                 "(the clients run elsewhere and never send them)"}
    return {key: [c.state.get(key) for c in channel.clients] for key in keys}


def _train(config: RunConfig, settings: DCFMSettings, channel: Channel,
           ledger: ServerLedger | None, device: torch.device) -> tuple[DCFMSampler, dict]:
    """The method's training; returns its sampler and training diagnostics."""
    c = config
    sampler_args = (settings.cardinalities, settings.shape, c.guidance)
    if settings.fedflow:
        model = initial_model(settings, len(channel.clients)).to(device)
        weights = client_weights(channel.clients, c.weighting, equal=ledger is not None
                                 or channel.equal_weights("update"))
        aborted = FedFlow(channel, model, weights, c.fedflow_local_steps,
                          ledger).run(c.fedflow_rounds, c.progress)
        none = torch.zeros(0, math.prod(settings.cardinalities), dtype=torch.long)
        return (DCFMSampler("monolithic", [model.eval()], none.to(device), *sampler_args),
                {"aborted_rounds": aborted})
    server = DCFMServer(channel, settings, device, ledger)
    if c.method == "dcfm-a":
        models, counts = server.run_a()
        return (DCFMSampler("composed", models, counts, *sampler_args),
                _client_losses(channel, ("stage_one_loss", "dcfm_a_loss")))
    received = server.upload(1, 0)
    models = [m for m, _ in received.values()]
    counts = torch.as_tensor(np.stack([n for _, n in received.values()]), device=device)
    report = _client_losses(channel, ("stage_one_loss",))
    if c.method == "dcfm-b":
        student = DCFMB(settings, len(channel.clients), device,
                        party_generator(c.seed, 0, device), c.dcfm_teacher)
        report["student_loss"] = student.distill(models, counts, c.distill_steps, c.batch_size,
                                                 c.teacher_steps, c.progress)
        student.send_student(channel, 2)
        return (DCFMSampler("monolithic", [student.student.averaged.eval()], counts,
                            *sampler_args), report)
    return DCFMSampler("router", models, counts, *sampler_args), report


def _evaluate(config: RunConfig, facts: DataFacts, sampler: DCFMSampler,
              device: torch.device) -> tuple[dict, dict]:
    """Samples of every combination at the largest NFE (``eval_samples`` each on modes2d; on
    images ``eval_samples`` over all combinations, at least one each) and, on modes2d, the
    fraction of each combination's samples within 3 std of its mode; on images the
    compositional accuracy and Frechet distance of novel and held combinations
    (:func:`_image_scores`)."""
    generator = party_generator(config.seed, EVALUATOR, device)
    combinations = all_combinations(facts.cardinalities)
    n = (config.eval_samples if config.data == "modes2d"
         else max(1, config.eval_samples // len(combinations)))
    samples = {tuple(y.tolist()): sampler.sample(y, n, generator, max(config.nfe)).cpu()
               for y in combinations}
    report: dict = {"nfe": max(config.nfe), "samples_per_combination": n}
    if config.data != "modes2d":
        if config.eval_classifier_epochs:
            report.update(_image_scores(config, facts, samples, device))
        return report, samples
    from ..data.modes2d import MISSING, OBSERVED, in_mode_fraction

    fractions = {f"{a},{b}": in_mode_fraction(x, (a, b)) for (a, b), x in samples.items()}
    report["in_mode_fraction"] = fractions
    report["missing_mode_fraction"] = fractions["{},{}".format(*MISSING)]
    report["observed_mode_fraction"] = float(np.mean(
        [fractions["{},{}".format(*y)] for y in OBSERVED]))
    return report, samples


def _evaluator_images(config: RunConfig, split: str):
    """The evaluator's colored images of ``split`` (outside the federation, every
    combination): the bundled digits in all ten colors, or MNIST from ``data_dir`` in one
    balanced color per image."""
    if config.data == "colored-mnist":
        from ..data.images import load_colored_mnist

        return load_colored_mnist(config.data_dir, split, config.seed)
    from ..data.colored_digits import load_colored_digits

    return load_colored_digits(split)


def _image_scores(config: RunConfig, facts: DataFacts, samples: dict,
                  device: torch.device) -> dict:
    """The DCFM paper's Table 1 scores of generated images ``samples`` {(digit, color): [n, C,
    H, W]}: an attribute classifier (one head per attribute) trained on the evaluator's
    training images gives the compositional accuracy (both attributes as requested) of novel
    and held combinations, and the Frechet distance to the evaluator's test images of those
    combinations, on Inception features with ``fid_weights`` where pytorch-fid runs, else on
    the classifier's (labelled not comparable with published FID). Samples are clipped to the
    pixel range [-1, 1] first, as saving them as images would."""
    from ..metrics.attribute_classifier import attribute_accuracy, compositional_accuracy
    from ..metrics.attribute_classifier import train_attribute_classifier as train
    from ..metrics.fid import fid, image_features

    training, test = _evaluator_images(config, "train"), _evaluator_images(config, "test")
    classifier = train(training.x, training.labels, facts.cardinalities,
                       config.eval_classifier_epochs, seed=config.seed,
                       progress=config.progress, device=device)
    features = image_features(training.x, training.labels, 0, config.fid_weights, device,
                              classifier=classifier)
    novel = {tuple(y) for y in facts.novel.tolist()}
    report: dict = {"features": features.describe(), "classifier_test_accuracy": dict(zip(
        ("digit", "color"), attribute_accuracy(classifier, test.x.to(device),
                                               test.labels.to(device)), strict=True))}
    for name, wanted in (("novel", True), ("held", False)):
        combos = [y for y in samples if (y in novel) == wanted]
        if not combos:
            continue
        x = torch.cat([samples[y] for y in combos]).nan_to_num(0.0).clamp(-1.0, 1.0)
        labels = torch.tensor(combos).repeat_interleave(len(samples[combos[0]]), dim=0)
        keep = (test.labels[:, None, :] == torch.tensor(combos)[None]).all(-1).any(-1)
        report[f"compositional_accuracy_{name}"] = compositional_accuracy(
            classifier, x.to(device), labels.to(device))
        report[f"frechet_{name}"] = fid(features, x, test.x[keep])
    return report


def _plot_samples(path: Path, facts: DataFacts,
                  shards: list[tuple[torch.Tensor, torch.Tensor]] | None, samples: dict,
                  title: str) -> None:
    """2D: the clients' data (``shards``; None when the clients run elsewhere: the server holds
    none) and the generated samples per combination; images: a grid with one row per
    combination (novel ones titled in red)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever display the machine has
    import matplotlib.pyplot as plt

    novel = {tuple(y.tolist()) for y in facts.novel}
    if len(facts.shape) == 1:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5), sharex=True, sharey=True)
        for i, (x, _) in enumerate(shards or []):
            left.scatter(x[:2000, 0], x[:2000, 1], s=2, alpha=0.5, label=f"client-{i + 1}")
        for combo, x in samples.items():
            right.scatter(x[:, 0], x[:, 1], s=2, alpha=0.5,
                          label=f"y={combo}" + (" (novel)" if combo in novel else ""))
        left.set_title("data held by each client" if shards is not None
                       else "the server holds no client data")
        right.set_title(title, fontsize=9)
        for ax in (left, right):
            ax.set_aspect("equal")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(markerscale=5, fontsize=7, loc="upper left")
    else:
        fig, ax = plt.subplots(figsize=(9, 8))
        ax.imshow(_mosaic(samples, facts.cardinalities, novel).numpy())
        k1, k2 = facts.cardinalities
        height, width = 1 / k1, 1 / k2
        ax.set_xticks([(j + 0.5) * ax.get_xlim()[1] * width for j in range(k2)], range(k2))
        ax.set_yticks([(i + 0.5) * ax.get_ylim()[0] * height for i in range(k1)], range(k1))
        ax.set_xlabel("attribute 2 (color)")
        ax.set_ylabel("attribute 1 (digit)")
        ax.set_title(f"{title}\nred frame: a novel combination (no client holds it)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mosaic(samples: dict, cardinalities: tuple[int, ...], novel: set,
            per_cell: int = 2) -> torch.Tensor:
    """One RGB image [k1 (H + 4), k2 (per_cell W + 4), 3] in [0, 1]: cell (i, j) holds the first
    ``per_cell`` samples of combination (i, j) side by side, framed red when it is novel and
    gray when held."""
    k1, k2 = cardinalities
    first = next(iter(samples.values()))
    per_cell = min(per_cell, len(first))
    _, h, w = first.shape[1:]
    cell_h, cell_w = h + 4, per_cell * w + 4
    out = torch.ones(k1 * cell_h, k2 * cell_w, 3)
    for (i, j), x in samples.items():
        frame = torch.tensor([0.9, 0.1, 0.1] if (i, j) in novel else [0.6, 0.6, 0.6])
        top, left = i * cell_h, j * cell_w
        out[top + 1:top + cell_h - 1, left + 1:left + cell_w - 1] = frame
        tiles = ((x[:per_cell, :3].nan_to_num(0.0).clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)
        out[top + 2:top + 2 + h, left + 2:left + 2 + per_cell * w] = torch.cat(list(tiles), 1)
    return out


def run_dcfm(config: RunConfig, connect: Connect | None = None) -> RunResult:
    """Train and evaluate a DCFM-family ``config``; write the run folder. ``connect``: the
    channel to clients that run elsewhere (the Flower engine's, see :mod:`.flower_server`; the
    server then knows only the data's public facts, :func:`public_facts`); by default every
    party is built in this process."""
    device = resolve_device(config.device)
    out = run_folder(config)
    check_pin_path(out, config.pin_to)
    prepare_run_folder(out, config.overwrite)
    write_config(config, out / "config.toml")
    data = conditional_data(config) if connect is None else None
    facts = public_facts(config) if data is None else data.facts
    protocol = load_protocol(config.protocol)
    settings, dp = dcfm_settings(config, facts, protocol)
    log = MessageLog(out / "messages.jsonl", keep_payloads=config.keep_payloads)
    if connect is None:
        clients = new_clients([x.to(device) for x, _ in data.shards], config.deterministic_seed)
        for client, (_, labels) in zip(clients, data.shards, strict=True):
            client.state["labels"] = labels.to(device)
        faults = load_threat_model(config.threat_model) if config.threat_model else None
        program = DCFMClient(settings, dp, [c.id for c in clients], device, config.progress)
        channel = open_channel(protocol, clients, log, faults, config.deterministic_seed,
                               program)
    else:
        channel = connect(protocol, log)
    ledger = None
    if dp is not None:
        sigma = expert_noise_multiplier(settings, dp)
        ledger = ServerLedger(dp, settings.dp_plan().rate,
                              {c.id: sigma for c in channel.clients})
    start = time.perf_counter()
    try:
        sampler, training = _train(config, settings, channel, ledger, device)
    finally:
        head = channel.close()
    pin = record_pin(out, head, config.pin_to)
    train_seconds = time.perf_counter() - start
    report, samples = _evaluate(config, facts, sampler, device)
    metrics = {
        "method": config.method, "protocol": protocol.name, "data": config.data,
        "partition": config.partition, "clients": config.clients,
        "train_seconds": train_seconds, "training": training, "eval": report,
        "novel_combinations": facts.novel.tolist(),
        "communication": communication(out / "messages.jsonl",
                                       [c.id for c in channel.clients]),
        "messages": log.summary(),
        "insecure_deterministic": config.insecure_deterministic,  # then no privacy claim holds
    }
    accounting = None if ledger is None else ledger.accounting()
    exclusions = () if settings.fedflow else (
        "label counts per combination travel in model messages without DP (docs/dcfm.md)",)
    privacy = privacy_statement(protocol, (settings.kind,), accounting=accounting,
                                exclusions=exclusions, nominal_records=facts.nominal_size,
                                sample_rate=None if ledger is None else ledger.rate,
                                deterministic=config.insecure_deterministic)
    (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    save_checkpoint(out / CHECKPOINT, {"config": config.to_dict(), "kind": sampler.kind,
                "architecture": settings.architecture,
                "models": [m.state_dict() for m in sampler.models],
                "counts": sampler.counts.cpu(), "cardinalities": facts.cardinalities,
                "shape": facts.shape})
    label = f"{config.method}, {protocol.name}, {config.partition} ({config.data})"
    _plot_samples(out / "samples.png", facts, None if data is None else data.shards, samples,
                  f"samples: {label}")
    return RunResult(out, metrics, pin)


def load_dcfm(run_dir: str | Path, device: str = "cpu") -> DCFMSampler:
    """The sampler of a finished DCFM-family run (its experts, student or global model)."""
    checkpoint = load_checkpoint(Path(run_dir) / CHECKPOINT, device)
    config = checkpoint["config"]
    architecture = checkpoint.get("architecture") or {  # runs before the U-Net experts
        "network": "mlp", "hidden": config["hidden"], "unet_width": 0, "unet_mult": (),
        "unet_blocks": 0, "unet_attention": ()}
    models = []
    for state in checkpoint["models"]:
        model = expert_network(checkpoint["shape"], checkpoint["cardinalities"], **architecture)
        model.load_state_dict(state)
        models.append(model.to(device).eval().requires_grad_(False))
    return DCFMSampler(checkpoint["kind"], models, checkpoint["counts"].to(device),
                       checkpoint["cardinalities"], checkpoint["shape"], config["guidance"])
