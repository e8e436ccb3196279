"""One FFM run (FFM-vanilla, LOT, GOT, or a centralized baseline), end to end: data, parties,
training through the channel, evaluation, run folder.

The run folder holds config.toml, metrics.json, metrics.csv (one row per round,
:mod:`.round_log`), messages.jsonl, checkpoint.safetensors, trajectories.png and w2_nfe.png
(and tensorboard/ when tensorboard is installed, :mod:`.tensorboard`). On
images (docs/images.md) the same method, channel and protocols train a U-Net; the folder holds
samples.png and samples/round-N.png (sample grids) instead of the 2D plots,
checkpoint.safetensors is also written every ``checkpoint_every`` rounds, and metrics.json
reports FID (or its labelled fallback).

A run stopped part way (Ctrl-C, SIGTERM under :func:`.interrupt.terminate_raises`, an exception)
charges the aggregation it cut short, closes its log, and writes privacy.json (marked
``interrupted``) and the checkpoint of the state the server holds (see
:meth:`~secureffm.methods.ffm.FederatedFlowMatching.checkpoint_round`); ``resume`` continues a
run from its checkpoint, counting every release its log shows (:mod:`.resume`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..config import RunConfig, config_from_dict, write_config
from ..data.images import ImagePair, image_pair, image_shape
from ..data.pairs import get_pair, make_shards
from ..data.partition import partition
from ..data.schema import Schema
from ..data.silo import CLIENT_DATA, folder_pair, table_pair
from ..errors import ConfigError, DataError, RunInterrupted
from ..federation.channel import Channel
from ..federation.faults import load_threat_model
from ..federation.log import MessageLog
from ..federation.parties import Registry, new_client, new_clients
from ..methods import CENTRALIZED, CentralizedFlowMatching, FederatedFlowMatching
from ..methods.ffm import (
    FFMClient,
    FFMSettings,
    autocast_dtype,
    image_velocity,
)
from ..metrics.evaluate import evaluate_flow, potential_health
from ..metrics.fid import fid, image_features
from ..metrics.sampling import integrate, trajectories
from ..names import IMAGE_FOLDER, SILO_DATA
from ..plots import plot_trajectories, plot_w2_nfe
from ..privacy.canaries import AUDIT_NOTICE, CANARY_FILE, draw_canaries, save_canaries
from ..progress import progress_bar
from ..protocols.protocol import Protocol, load_protocol
from ..protocols.statement import mark_randomness, privacy_statement
from ..runtime import party_generator, resolve_device
from .interrupt import cause_of, interruption, signals_held
from .resume import ResumePoint, refuse_over_budget, resume_point
from .round_log import CURVES_NOTE, ROUNDS_FILE, RoundLog
from .scaffold import (
    CHECKPOINT,
    SAMPLES_DIR,
    RunResult,
    check_pin_path,
    load_checkpoint,
    open_channel,
    record_pin,
    resolve_dp,
    run_folder,
    save_checkpoint,
    starting_run_folder,
)
from .silo import (
    UNACCOUNTED_EVALUATION,
    UNACCOUNTED_IMAGE_EVALUATION,
    evaluate_on_silos,
    folder_shape,
    hold_silo,
    own_silo,
    silo_program,
    table_nfe,
)
from .tensorboard import Board

__all__ = ["run_ffm", "build_run", "image_shards", "load_velocity", "Connect"]

# The channel to clients that run elsewhere, given the protocol and the server's log.
Connect = Callable[[Protocol, MessageLog], Channel]

EVALUATOR = 1_000_000  # party index of the evaluator's generator (outside the federation)
FLOOR = EVALUATOR + 1  # the evaluator's second target sample (the i.i.d. floor of W2)


GRID = 64  # images per sample grid (8 x 8)


def image_shards(pair: ImagePair, config: RunConfig) -> list[torch.Tensor]:
    """The training images split over the clients by class (disjoint, iid, dirichlet), seeded
    by the public seed: one CPU tensor [N_i, C, H, W] per client."""
    labels = pair.train.labels.numpy()
    index = partition(labels, config.clients, config.partition, np.random.default_rng(config.seed),
                      disjoint_order=tuple(range(pair.classes)), alpha=config.dirichlet_alpha)
    shards = [pair.train.x[torch.as_tensor(i, dtype=torch.long)] for i in index]
    for client, shard in enumerate(shards, start=1):
        if len(shard) < config.batch_size:
            raise DataError(f"client-{client} holds {len(shard)} images under partition "
                            f"{config.partition!r}, fewer than the batch size "
                            f"{config.batch_size}; lower batch_size or clients, or raise "
                            "dirichlet_alpha")
    return shards


def build_run(config: RunConfig, device: torch.device, log: MessageLog, connect: Connect | None,
              out: Path):
    """The data pair, the shards the server may plot (None when the clients run elsewhere:
    then it holds none), and the trainer; with ``config.canaries``, the clients' planted
    canaries, saved to ``out``/canaries.safetensors."""
    if config.data in SILO_DATA:
        return _build_silo_run(config, device, log, connect)
    pair = (image_pair(config.data, config.data_dir, config.seed, config.image_size,
                       config.clients * config.shard_size, config.eval_samples)
            if config.images else get_pair(config.data))
    protocol = load_protocol(config.protocol)
    if config.canaries:
        _check_canaries(config, protocol, connect)
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
    shards = (image_shards(pair, config) if config.images else
              make_shards(pair, config.clients, config.shard_size, config.partition, config.seed,
                          alpha=config.dirichlet_alpha, min_size=config.batch_size))
    if config.method in CENTRALIZED:
        pooled = new_client("central", torch.cat(shards).to(device), config.deterministic_seed)
        return pair, shards, CentralizedFlowMatching(settings, pair, pooled, device)
    clients = new_clients([shard.to(device) for shard in shards], config.deterministic_seed)
    faults = load_threat_model(config.threat_model) if config.threat_model else None
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    program = FFMClient(settings, dp, pair, device)
    channel = open_channel(protocol, clients, log, faults, config.deterministic_seed, program)
    trainer = FederatedFlowMatching(settings, dp, pair, channel, device)
    if config.canaries:
        canaries = draw_canaries(config.canaries, len(clients),
                                 torch.from_numpy(trainer.velocity.flat()))
        program.plant({c.id: canaries.of_client(i).to(device) for i, c in enumerate(clients)})
        save_canaries(canaries, out / CANARY_FILE)
    return pair, shards, trainer


def _build_silo_run(config: RunConfig, device: torch.device, log: MessageLog,
                    connect: Connect | None):
    """A run on the clients' own tables or image folders: the public pair from the schema (or
    the images' public shape, :func:`~.silo.folder_shape`); in-process, each client reads its
    own file or folder (:func:`~.silo.own_silo`); the server holds no shard (None)."""
    if config.canaries:
        raise ConfigError(f"canaries audit 2D runs; drop --canaries on a {config.data!r} run")
    # target_column checked by runs.preflight
    schema = Schema.load(config.schema) if config.data == CLIENT_DATA else None
    pair = table_pair(schema) if schema is not None else folder_pair(folder_shape(config))
    protocol = load_protocol(config.protocol)
    settings = FFMSettings.of(config)
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    if connect is not None:  # each node reads its own file (runs/flower_node.py)
        return pair, None, FederatedFlowMatching(settings, dp, pair, connect(protocol, log),
                                                 device)
    clients = new_clients([torch.zeros(0, *pair.shape, device=device)
                           if schema is None else torch.zeros(0, schema.dim, device=device)]
                          * config.clients, config.deterministic_seed)
    for client, path in zip(clients, config.client_data, strict=True):
        hold_silo(client, own_silo(config, path, schema))
    faults = load_threat_model(config.threat_model) if config.threat_model else None
    program = silo_program(config, schema, dp, device)
    channel = open_channel(protocol, clients, log, faults, config.deterministic_seed, program)
    return pair, None, FederatedFlowMatching(settings, dp, pair, channel, device)


def _check_canaries(config: RunConfig, protocol: Protocol, connect: Connect | None) -> None:
    """Refuse canaries where the one-run audit does not apply."""
    if config.method not in ("vanilla", "got") or config.images:
        raise ConfigError(f"canaries = {config.canaries} applies to FFM 'vanilla' or 'got' on "
                          f"2D data (the DP-SGD clients), not method {config.method!r} on "
                          f"{config.data!r}; drop --canaries")
    if protocol.dp is None:
        raise ConfigError(f"canaries = {config.canaries}: protocol {protocol.name!r} has no dp "
                          "stage, so there is no guarantee to audit; use dp or dp-secagg")
    if connect is not None:
        raise ConfigError("canaries are planted by the in-process engine only; use --engine "
                          "inprocess for an audit run")


def _close_log(log: MessageLog, trainer) -> str | None:
    """End the log with a signed closing record, also when the run failed part way; returns
    the log's head (None when the run failed before it had parties)."""
    if isinstance(trainer, FederatedFlowMatching):
        return trainer.channel.close()
    if isinstance(trainer, CentralizedFlowMatching):
        log.register(Registry.of([trainer.party]))
        return log.close(trainer.party)
    return log.close()


def _privacy(config: RunConfig, trainer, rounds_run: int,
             resumed: ResumePoint | None = None) -> dict:
    """The run's privacy.json (see :func:`~secureffm.protocols.statement.privacy_statement`);
    a resumed run also names the run it continued (``resumed_from``)."""
    if isinstance(trainer, CentralizedFlowMatching):
        return mark_randomness({
            "protocol": "none", "unit": None, "adjacency": None,
            "dp": "none: a centralized baseline pools every shard in one party and sends no "
                  "message", "mechanisms": {}, "trust": ["none: the one party holds all data"],
            "exclusions": []}, config.insecure_deterministic)
    kinds = ("gradient", "dual_update") if trainer.potential is not None else ("gradient",)
    accounting = (None if trainer.charges is None else
                  trainer.charges.accounting(rounds_run=rounds_run))
    unaccounted = {CLIENT_DATA: (UNACCOUNTED_EVALUATION,),
                   IMAGE_FOLDER: (UNACCOUNTED_IMAGE_EVALUATION,)}.get(config.data, ())
    statement = privacy_statement(trainer.channel.protocol, kinds,
                                  deterministic=config.insecure_deterministic,
                                  nominal_records=config.shard_size, sample_rate=trainer.rate,
                                  accounting=accounting, exclusions=unaccounted)
    if config.canaries:
        statement["audit_run"] = {"canaries": config.canaries, "notice": AUDIT_NOTICE}
    if resumed is not None:
        statement["resumed_from"] = {"run": str(resumed.source), "round": resumed.round,
                                     "charged_records": len(resumed.charged)}
    return statement


def run_ffm(config: RunConfig, connect: Connect | None = None) -> RunResult:
    """Train and evaluate an FFM-family ``config``; write everything to the run folder.
    ``connect``: the channel to clients that run elsewhere (the Flower engine's, see
    :mod:`.flower_server`); by default every party is built in this process.

    metrics.json times the parts in wall seconds: ``setup_seconds`` (data, parties, the DP
    calibration), ``train_seconds``, ``eval_seconds`` (samples, exact W2, the potential's
    health, trajectories; on images the samples and FID) and ``privacy_seconds`` (the
    accounting of privacy.json)."""
    begun = time.perf_counter()
    device = resolve_device(config.device)
    out = run_folder(config)
    check_pin_path(out, config.pin_to)
    resumed = resume_point(config, device) if config.resume else None  # before any reset
    if resumed is not None:
        config = resumed.config(config)
    with starting_run_folder(out, config.overwrite) as folder:
        write_config(config, out / "config.toml")
        torch.manual_seed(config.seed)  # network initialisation only; parties use their generators
        log = MessageLog(out / "messages.jsonl", keep_payloads=config.keep_payloads)
        trainer, progress, board = None, _Progress(config), Board(out)
        try:
            pair, shards, trainer = build_run(config, device, log, connect, out)
            first = 1
            if resumed is not None:
                trainer.load_state_dict(resumed.checkpoint["state"], resumed.charged)
                first = resumed.round + 1
                progress.completed = resumed.round
            periodic = (_Periodic(config, out, pair, trainer, device, progress) if config.images
                        else None)
            curves: dict[str, list[list[float]]] = {"loss": [], "dual": []}
            rounds = RoundLog()
            aborted = 0
            every = max(1, config.rounds // 200)
            last = config.rounds
            if isinstance(trainer, FederatedFlowMatching) and resumed is not None:
                refuse_over_budget(trainer, resumed, trainer.rounds_within_budget(first), last)
            elif isinstance(trainer, FederatedFlowMatching):
                trainer.refuse_overspending()
            folder.begin()  # every start-time refusal lies above
            start = time.perf_counter()
            bar = progress_bar(range(first, last + 1), desc=f"{config.method} rounds",
                               disable=not config.progress, unit="round", dynamic_ncols=True)
            for round_ in bar:
                progress.in_round = round_
                report = trainer.train_round(round_)
                seen = report.diagnostics
                rounds.add(round_, report.aborted, seen)
                board.round(round_, {k: v for k, v in rounds.rows[-1].items() if k != "round"})
                aborted += report.aborted
                if round_ % every == 0 or round_ == last:
                    if "loss" in seen:
                        curves["loss"].append([round_, seen["loss"]])
                    postfix = {**{k: f"{v:.3f}" for k, v in seen.items()}, "aborted": aborted}
                    if periodic is not None:
                        postfix["img/s"] = f"{periodic.images_per_second(round_ - first + 1):.0f}"
                    bar.set_postfix(postfix, refresh=False)  # drawn at the next redraw
                if "dual" in seen:
                    curves["dual"].append([round_, seen["dual"]])
                if periodic is not None:
                    periodic(round_)
                progress.in_round, progress.completed = None, round_
            train_seconds = time.perf_counter() - start
            table = None
            if config.data in SILO_DATA:  # where the data lives, before the log closes
                started = time.perf_counter()
                table = {"clients": evaluate_on_silos(trainer.channel, trainer.velocity.averaged,
                                                      last + 1)}
                if config.data == CLIENT_DATA:
                    table.update(schema={"path": config.schema,
                                         "digest": Schema.load(config.schema).digest()},
                                 synthetic_rows=config.eval_samples)
                else:
                    table.update(image_shape=list(folder_shape(config)),
                                 synthetic_images=config.eval_samples)
                table.update(nfe=table_nfe(config), seconds=time.perf_counter() - started)
        except BaseException as error:
            with signals_held():  # a second Ctrl-C must not cut the wrap-up short
                try:
                    stop = (progress.stop(out, trainer, error, resumed) if folder.begun else
                            _stopped_start(error))
                finally:
                    _close_log(log, trainer)
                    board.close()
            if stop is error:
                raise
            raise stop from None
    head = _close_log(log, trainer)
    pin = record_pin(out, head, config.pin_to)
    started = time.perf_counter()
    (out / "privacy.json").write_text(json.dumps(_privacy(config, trainer, last, resumed),
                                                 indent=2))
    privacy_seconds = time.perf_counter() - started
    if progress.saved != last:
        progress.checkpoint(out, last, trainer.state_dict())
    rounds.write(out / ROUNDS_FILE)
    try:
        result = _evaluate(config, out, pair, shards, trainer, device, log, periodic, pin, {
            "setup_seconds": start - begun, "train_seconds": train_seconds, "last": last,
            "first": first, "privacy_seconds": privacy_seconds, "aborted": aborted,
            "curves": curves, "resumed": resumed, "table": table})
        board.final(result.metrics, last)
        return result
    except KeyboardInterrupt as error:
        raise RunInterrupted(f"interrupted ({cause_of(error)}) during the evaluation: training "
                             f"finished, privacy.json and checkpoint.safetensors are written, "
                             f"metrics.json is not") from None
    finally:
        board.close()


def _evaluate(config: RunConfig, out: Path, pair, shards, trainer, device: torch.device,
              log: MessageLog, periodic: _Periodic | None, pin: dict | None,
              facts: dict) -> RunResult:
    """Evaluate the trained model and write metrics.json and the plots (``facts``: the
    training's timings, rounds and curves)."""
    last, first, resumed = facts["last"], facts["first"], facts["resumed"]
    train_seconds = facts["train_seconds"]
    evaluator = party_generator(config.seed, EVALUATOR, device)
    model = trainer.velocity.averaged
    started = time.perf_counter()
    if config.images and config.data != IMAGE_FOLDER:
        evaluation = periodic.evaluate(evaluator)
    elif config.data in SILO_DATA:  # the clients evaluated before the log closed
        evaluation = facts["table"]
        started -= evaluation.pop("seconds")
    else:
        report, generated = evaluate_flow(
            model, pair, config.nfe, config.eval_samples, evaluator, device,
            config.adaptive_solver, config.adaptive_tol,
            floor_generator=party_generator(config.seed, FLOOR, device),
            progress=config.progress)
        if trainer.potential is not None:
            report.potential = potential_health(trainer.potential.module, pair,
                                                generated["target"].to(device),
                                                config.candidates, evaluator)
        x0 = pair.source.sample(config.trajectories, evaluator, device)[0]
        paths = trajectories(model, x0).cpu()
        evaluation = report.to_dict()
    eval_seconds = time.perf_counter() - started

    metrics = {
        "method": config.method,
        "protocol": load_protocol(config.protocol).name,
        "data": config.data,
        "clients": config.clients if config.method not in CENTRALIZED else 1,
        "rounds": last,
        "setup_seconds": facts["setup_seconds"],
        "train_seconds": train_seconds,
        "seconds_per_round": train_seconds / max(last - first + 1, 1),
        "eval_seconds": eval_seconds,
        "privacy_seconds": facts["privacy_seconds"],
        "eval": evaluation,
        "messages": log.summary(),
        "aborted_aggregations": facts["aborted"],
        "curves": facts["curves"],
        "insecure_deterministic": config.insecure_deterministic,  # then no privacy claim holds
    }
    if not any(facts["curves"].values()):
        metrics["curves_note"] = CURVES_NOTE
    if config.canaries:
        metrics["audit_run"] = {"canaries": config.canaries, "notice": AUDIT_NOTICE}
    if config.images:
        metrics.update(periodic.summary(last - first + 1, train_seconds))
    if resumed is not None:
        metrics["resumed_from"] = {"run": str(resumed.source), "round": resumed.round}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    label = (f"{config.method}, {metrics['protocol']} ({config.data}, "
             f"{metrics['clients']} client(s))")
    if config.images:
        periodic.grid(out / "samples.png", f"samples: {label}, round {last}")
        return RunResult(out, metrics, pin)
    if config.data == CLIENT_DATA:  # the server holds no row to draw
        return RunResult(out, metrics, pin)
    held = shards if shards is not None else [generated["target"].cpu()]
    plot_trajectories(out / "trajectories.png", held, paths, f"trajectories: {label}",
                      None if shards is not None else "target sample (the server holds no "
                      "client data)", target=generated["target"].cpu())
    plot_w2_nfe(out / "w2_nfe.png", {config.method: report.w2}, f"W2 against NFE: {label}",
                floor=(report.iid_floor, config.eval_samples))
    return RunResult(out, metrics, pin)


def _stopped_start(error: BaseException) -> BaseException:
    """What to raise when ``error`` stopped the run before its first round: the folder is then
    undone whole (:func:`~.scaffold.starting_run_folder`), so there is no privacy.json to write;
    a one-line :class:`RunInterrupted` for Ctrl-C and SIGTERM."""
    if not isinstance(error, KeyboardInterrupt):
        return error
    return RunInterrupted(f"interrupted ({cause_of(error)}) before the first round: nothing was "
                          "released and the run folder was left as it was; run the command again")

class _Progress:
    """Where training stands, for a stop part way: the round in progress (None between
    rounds), the rounds completed, and the round of the checkpoint.safetensors on disk."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.in_round: int | None = None
        self.completed = 0
        self.saved: int | None = None

    def checkpoint(self, out: Path, round_: int, state: dict) -> None:
        """checkpoint.safetensors (replaced atomically): the config, the server ``state`` after
        ``round_`` and the round."""
        saved = {"config": self.config.to_dict(), "state": state, "round": round_}
        if self.config.data == CLIENT_DATA:  # the public schema travels with the model
            saved["schema"] = Schema.load(self.config.schema).to_toml()
        save_checkpoint(out / CHECKPOINT, saved)
        self.saved = round_

    def stop(self, out: Path, trainer, error: BaseException,
             resumed: ResumePoint | None) -> BaseException:
        """After ``error`` stopped training: charge the aggregation it cut short, write
        privacy.json (with ``interrupted``) and the last completed round's checkpoint; returns
        what to raise (a one-line :class:`RunInterrupted` for Ctrl-C and SIGTERM)."""
        if trainer is None:
            return error
        if isinstance(trainer, FederatedFlowMatching):
            trainer.charge_pending()
        if isinstance(trainer, FederatedFlowMatching):
            round_ = trainer.checkpoint_round(self.completed)
        else:
            round_ = None if self.in_round else self.completed
        if round_ and round_ != self.saved:
            self.checkpoint(out, round_, trainer.state_dict())
        cause = cause_of(error)
        statement = _privacy(self.config, trainer, self.completed, resumed)
        statement["interrupted"] = interruption(self.in_round, self.completed, self.saved, cause)
        (out / "privacy.json").write_text(json.dumps(statement, indent=2))
        if not isinstance(error, KeyboardInterrupt):
            return error
        where = (f"in round {self.in_round} of {self.config.rounds}" if self.in_round else
                 f"after round {self.completed} of {self.config.rounds}")
        resume = (f"checkpoint.safetensors holds round {self.saved}; continue with --resume "
                  f"{out} --out NEW_FOLDER" if self.saved else
                  "no checkpoint was written (--resume needs one)")
        return RunInterrupted(f"interrupted ({cause}) {where}: the log is closed and "
                              f"privacy.json states the epsilon of every round released; "
                              f"{resume}")


class _Periodic:
    """What an image run does between and after rounds: sample grids from the EMA model on fixed
    noise every ``sample_every`` rounds (samples/round-N.png), checkpoints every
    ``checkpoint_every`` rounds (checkpoint.safetensors, replaced atomically), the images-per-second
    rate, and the final evaluation (FID at each NFE, or its labelled fallback)."""

    def __init__(self, config: RunConfig, out: Path, pair: ImagePair, trainer,
                 device: torch.device, progress: _Progress):
        self.config, self.out, self.pair, self.trainer, self.device = (config, out, pair,
                                                                       trainer, device)
        self.progress = progress
        self.dtype = autocast_dtype(FFMSettings.of(config), pair, device)
        generator = party_generator(config.seed, EVALUATOR + 2, device)
        self.noise = pair.source.sample(GRID, generator, device)[0]
        self.started = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def images_per_second(self, rounds: int) -> float:
        """Training images the clients processed per wall second so far (all clients)."""
        seconds = max(time.perf_counter() - self.started, 1e-9)
        return rounds * self.config.batch_size * self.config.clients / seconds

    def __call__(self, round_: int) -> None:
        c = self.config
        if c.sample_every and round_ % c.sample_every == 0 and round_ < c.rounds:
            self.grid(self.out / SAMPLES_DIR / f"round-{round_:07d}.png",
                      f"{c.method}, round {round_}")
        if c.checkpoint_every and round_ % c.checkpoint_every == 0:
            self.progress.checkpoint(self.out, round_, self.trainer.state_dict())

    def _sample(self, x0: torch.Tensor, nfe: int) -> torch.Tensor:
        """Euler samples [N, C, H, W] of the EMA model from x0, in chunks, clamped to [-1, 1]."""
        model = self.trainer.velocity.averaged
        context = (torch.autocast(self.device.type, dtype=self.dtype) if self.dtype
                   else contextlib.nullcontext())
        parts = []
        with context:
            for chunk in x0.split(500):
                parts.append(integrate(model, chunk, nfe)[0].float().clamp(-1, 1).cpu())
        return torch.cat(parts)

    def grid(self, path: Path, title: str) -> None:
        """An 8 x 8 PNG grid of samples at the largest evaluated NFE (at most 100)."""
        nfe = min(max(self.config.nfe), 100)
        write_grid(path, self._sample(self.noise, nfe), f"{title}, NFE {nfe}")

    def evaluate(self, generator: torch.Generator) -> dict:
        """FID (or the labelled classifier fallback) at each Euler NFE on ``eval_samples``
        generated images against as many test images; the floor is the same distance between
        training and test images (what a perfect generator would score)."""
        c, pair = self.config, self.pair
        features = image_features(pair.train.x, pair.train.labels, pair.classes, c.fid_weights,
                                  self.device, c.seed, progress=c.progress)
        reference = pair.test.x[:c.eval_samples]
        x0 = pair.source.sample(len(reference), generator, self.device)[0]
        by_nfe, seconds = {}, {}
        for nfe in c.nfe:
            started = time.perf_counter()
            generated = self._sample(x0, nfe)
            seconds[str(nfe)] = time.perf_counter() - started
            by_nfe[str(nfe)] = fid(features, generated, reference)
        floor = fid(features, pair.train.x[:len(reference)], reference)
        return {"fid": by_nfe, "fid_floor": floor, "features": features.describe(),
                "eval_samples": len(reference), "solver": "euler",
                "inference_seconds": seconds}

    def summary(self, rounds: int, train_seconds: float) -> dict:
        """Image-run facts for metrics.json: device, precision, parameters, throughput and
        (CUDA) peak GPU memory."""
        def count(module: torch.nn.Module) -> int:
            return sum(p.numel() for p in module.parameters())

        facts = {"device": (torch.cuda.get_device_name(self.device)
                            if self.device.type == "cuda" else "cpu"),
                 "precision": "bf16-autocast" if self.dtype else "fp32",
                 "parameters": {"velocity": count(self.trainer.velocity.module)},
                 "images_per_second": rounds * self.config.batch_size * self.config.clients
                 / max(train_seconds, 1e-9)}
        if self.trainer.potential is not None:
            facts["parameters"]["potential"] = count(self.trainer.potential.module)
        if self.device.type == "cuda":
            facts["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return facts


def write_grid(path: Path, images: torch.Tensor, title: str = "") -> None:
    """Images [N, C, H, W] in [-1, 1] as a PNG grid of ceil(sqrt(N)) columns (1 px gaps),
    enlarged by whole pixels to about 512 px wide when smaller (8 x 8 digits: 73 px, too
    small to see); ``title`` goes into the PNG's metadata."""
    import matplotlib.pyplot as plt

    n, channels, h, w = images.shape
    cols = int(np.ceil(np.sqrt(n)))
    rows = -(-n // cols)
    canvas = np.ones((rows * (h + 1) + 1, cols * (w + 1) + 1, 3), dtype=np.float32)
    pixels = ((images.float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).numpy()
    if channels == 1:
        pixels = np.repeat(pixels, 3, axis=3)
    for i in range(n):
        r, k = divmod(i, cols)
        canvas[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + k * (w + 1):1 + k * (w + 1) + w] = \
            pixels[i]
    scale = max(1, 512 // canvas.shape[1])
    canvas = canvas.repeat(scale, axis=0).repeat(scale, axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, canvas, metadata={"Title": title} if title else None)


def load_velocity(run_dir: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The evaluated velocity field of a finished run (its EMA when one was kept)."""
    from ..models.mlp import VelocityMLP

    run_dir = Path(run_dir)
    checkpoint = load_checkpoint(run_dir / CHECKPOINT, device)
    config = checkpoint["config"]
    saved = config_from_dict(config)
    if saved.data == IMAGE_FOLDER:
        model = image_velocity(FFMSettings.of(saved), folder_shape(saved))
    elif saved.images:
        model = image_velocity(FFMSettings.of(saved), image_shape(saved.data, saved.image_size))
    elif "schema" in checkpoint:  # a run on the clients' own tables
        model = VelocityMLP(Schema.loads(checkpoint["schema"]).dim, config["hidden"])
    else:
        model = VelocityMLP(get_pair(config["data"]).dim, config["hidden"])
    saved = checkpoint["state"]["velocity"]
    if saved["ema"] is not None:
        prefix = "module."
        model.load_state_dict({k[len(prefix):]: v for k, v in saved["ema"].items()
                               if k.startswith(prefix)})
    else:
        model.load_state_dict(saved["module"])
    return model.to(device).eval()
