"""One FFM run (FFM-vanilla, LOT, GOT, or a centralized baseline), end to end: data, parties,
training through the channel, evaluation, run folder.

The run folder holds config.toml, metrics.json, messages.jsonl, checkpoint.pt,
trajectories.png and w2_nfe.png.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from ..config import RunConfig, write_config
from ..data.pairs import get_pair, make_shards
from ..errors import ConfigError
from ..federation.channel import Channel
from ..federation.faults import load_threat_model
from ..federation.log import MessageLog
from ..federation.parties import Registry, new_client, new_clients, secret_randomness
from ..methods import CENTRALIZED, CentralizedFlowMatching, FederatedFlowMatching
from ..methods.ffm import FFMClient, FFMSettings
from ..metrics.evaluate import evaluate_flow, potential_health
from ..metrics.sampling import trajectories
from ..plots import plot_trajectories, plot_w2_nfe
from ..protocols.protocol import Protocol, load_protocol
from ..protocols.statement import privacy_statement
from ..runtime import party_generator, resolve_device
from .scaffold import (
    RunResult,
    check_pin_path,
    load_checkpoint,
    open_channel,
    prepare_run_folder,
    record_pin,
    resolve_dp,
    run_folder,
)

__all__ = ["run_ffm", "load_velocity", "Connect"]

# The channel to clients that run elsewhere, given the protocol and the server's log.
Connect = Callable[[Protocol, MessageLog], Channel]

EVALUATOR = 1_000_000  # party index of the evaluator's generator (outside the federation)
FLOOR = EVALUATOR + 1  # the evaluator's second target sample (the i.i.d. floor of W2)


def _build(config: RunConfig, device: torch.device, log: MessageLog, connect: Connect | None):
    """The data pair, the shards the server may plot (None when the clients run elsewhere:
    then it holds none), and the trainer."""
    pair = get_pair(config.data)
    protocol = load_protocol(config.protocol)
    if config.method in CENTRALIZED:
        config.require_no_dp_options(protocol.name)
        if protocol.spec.stages:
            raise ConfigError(f"method = {config.method!r} is a centralized baseline and sends "
                              f"no messages, so protocol {protocol.name!r} protects nothing; "
                              "use protocol = 'plaintext'")
        if connect is not None:
            raise ConfigError(f"method = {config.method!r} is a centralized baseline: it has "
                              "no clients to run on another engine; use --engine inprocess")
    settings = FFMSettings.of(config)
    if connect is not None:
        dp = resolve_dp(config, protocol, settings.sent_kinds)
        return pair, None, FederatedFlowMatching(settings, dp, pair, connect(protocol, log),
                                                 device)
    shards = make_shards(pair, config.clients, config.shard_size, config.partition, config.seed,
                         alpha=config.dirichlet_alpha, min_size=config.batch_size)
    if config.method in CENTRALIZED:
        pooled = new_client("central", torch.cat(shards).to(device), config.deterministic_seed)
        return pair, shards, CentralizedFlowMatching(settings, pair, pooled, device)
    clients = new_clients([shard.to(device) for shard in shards], config.deterministic_seed)
    faults = load_threat_model(config.threat_model) if config.threat_model else None
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    channel = open_channel(protocol, clients, log, faults, config.deterministic_seed,
                           FFMClient(settings, dp, pair, device))
    return pair, shards, FederatedFlowMatching(settings, dp, pair, channel, device)


def _close_log(log: MessageLog, trainer) -> str | None:
    """End the log with a signed closing record, also when the run failed part way; returns
    the log's head (None when the run failed before it had parties)."""
    if isinstance(trainer, FederatedFlowMatching):
        return trainer.channel.close()
    if isinstance(trainer, CentralizedFlowMatching):
        log.register(Registry.of([trainer.party]))
        return log.close(trainer.party)
    return log.close()


def _privacy(config: RunConfig, trainer, rounds_run: int) -> dict:
    """The run's privacy.json (see :func:`~secureffm.protocols.statement.privacy_statement`)."""
    randomness = secret_randomness(config.insecure_deterministic)
    if isinstance(trainer, CentralizedFlowMatching):
        return {"protocol": "none", "unit": None, "adjacency": None,
                "dp": "none: a centralized baseline pools every shard in one party and sends "
                      "no message", "mechanisms": {}, "trust": ["the one party holds all data"],
                "exclusions": [], "secret_randomness": randomness}
    kinds = ("gradient", "dual_update") if trainer.potential is not None else ("gradient",)
    accounting = None
    if trainer.ledger is not None:
        accounting = trainer.ledger.report(trainer.dp.target_epsilon, trainer.dp.accountant)
        accounting.update(noise_multiplier=trainer.noise_multipliers, clip=trainer.dp.clip,
                          rounds_run=rounds_run)
    return privacy_statement(trainer.channel.protocol, kinds, secret_randomness=randomness,
                             nominal_records=config.shard_size, accounting=accounting)


def run_ffm(config: RunConfig, connect: Connect | None = None) -> RunResult:
    """Train and evaluate an FFM-family ``config``; write everything to the run folder.
    ``connect``: the channel to clients that run elsewhere (the Flower engine's, see
    :mod:`.flower_server`); by default every party is built in this process.

    metrics.json times the parts in wall seconds: ``setup_seconds`` (data, parties, the DP
    calibration), ``train_seconds``, ``eval_seconds`` (samples, exact W2, the potential's
    health, trajectories) and ``privacy_seconds`` (the accounting of privacy.json)."""
    begun = time.perf_counter()
    device = resolve_device(config.device)
    out = run_folder(config)
    check_pin_path(out, config.pin_to)
    prepare_run_folder(out, config.overwrite)
    write_config(config, out / "config.toml")
    torch.manual_seed(config.seed)  # network initialisation only; parties use their generators
    log = MessageLog(out / "messages.jsonl", keep_payloads=config.keep_payloads)
    trainer = None
    try:
        pair, shards, trainer = _build(config, device, log, connect)
        curves: dict[str, list[list[float]]] = {"loss": [], "dual": []}
        aborted = 0
        every = max(1, config.rounds // 200)
        budget = (trainer.rounds_within_budget() if isinstance(trainer, FederatedFlowMatching)
                  else config.rounds)
        if budget < config.rounds:
            print(f"secureffm: the privacy target allows {budget} of {config.rounds} rounds at "
                  "this noise multiplier; training stops there and keeps the model",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        bar = tqdm(range(1, budget + 1), desc=f"{config.method} rounds",
                   disable=not config.progress, unit="round", dynamic_ncols=True)
        for round_ in bar:
            report = trainer.train_round(round_)
            aborted += int(report.pop("aborted", 0))
            if round_ % every == 0 or round_ == budget:
                if "loss" in report:
                    curves["loss"].append([round_, report["loss"]])
                bar.set_postfix({**{k: f"{v:.3f}" for k, v in report.items()},
                                 "aborted": aborted})
            if "dual" in report:
                curves["dual"].append([round_, report["dual"]])
        train_seconds = time.perf_counter() - start
    finally:
        head = _close_log(log, trainer)
    pin = record_pin(out, head, config.pin_to)

    setup_seconds = start - begun
    evaluator = party_generator(config.seed, EVALUATOR, device)
    model = trainer.velocity.averaged
    started = time.perf_counter()
    report, generated = evaluate_flow(
        model, pair, config.nfe, config.eval_samples, evaluator, device, config.adaptive_solver,
        config.adaptive_tol, floor_generator=party_generator(config.seed, FLOOR, device),
        progress=config.progress)
    if trainer.potential is not None:
        report.potential = potential_health(trainer.potential.module, pair,
                                            generated["target"].to(device), config.candidates,
                                            evaluator)
    x0 = pair.source.sample(config.trajectories, evaluator, device)[0]
    paths = trajectories(model, x0).cpu()
    eval_seconds = time.perf_counter() - started

    started = time.perf_counter()
    (out / "privacy.json").write_text(json.dumps(_privacy(config, trainer, budget), indent=2))
    privacy_seconds = time.perf_counter() - started
    metrics = {
        "method": config.method,
        "protocol": load_protocol(config.protocol).name,
        "data": config.data,
        "clients": config.clients if config.method not in CENTRALIZED else 1,
        "rounds": budget,
        "setup_seconds": setup_seconds,
        "train_seconds": train_seconds,
        "seconds_per_round": train_seconds / max(budget, 1),
        "eval_seconds": eval_seconds,
        "privacy_seconds": privacy_seconds,
        "eval": report.to_dict(),
        "messages": log.summary(),
        "aborted_aggregations": aborted,
        "curves": curves,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    torch.save({"config": config.to_dict(), "state": trainer.state_dict()},
               out / "checkpoint.pt")
    label = (f"{config.method}, {metrics['protocol']} ({config.data}, "
             f"{metrics['clients']} client(s))")
    held = shards if shards is not None else [generated["target"].cpu()]
    plot_trajectories(out / "trajectories.png", held, paths, f"trajectories: {label}",
                      None if shards is not None else "target sample (the server holds no "
                      "client data)")
    plot_w2_nfe(out / "w2_nfe.png", {config.method: report.w2}, f"W2 against NFE: {label}")
    return RunResult(out, metrics, pin)


def load_velocity(run_dir: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The evaluated velocity field of a finished run (its EMA when one was kept)."""
    from ..models.mlp import VelocityMLP

    run_dir = Path(run_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoint.pt", device)
    config = checkpoint["config"]
    model = VelocityMLP(get_pair(config["data"]).dim, config["hidden"])
    saved = checkpoint["state"]["velocity"]
    if saved["ema"] is not None:
        prefix = "module."
        model.load_state_dict({k[len(prefix):]: v for k, v in saved["ema"].items()
                               if k.startswith(prefix)})
    else:
        model.load_state_dict(saved["module"])
    return model.to(device).eval()
