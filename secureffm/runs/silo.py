"""A run on the clients' own tables: each client reads its own file, and evaluates the trained
model on its own held-out rows (docs/data.md).

The server holds no row and no statistic of any table. After training it publishes the released
model (kind ``released_model``, the EMA velocity it evaluates, as a broadcast) and asks each
client, one message each, to run :data:`EVALUATE`: the client samples synthetic rows from that
model, decodes them through the public schema and scores them against its held-out rows
(:func:`~secureffm.metrics.tabular.evaluate_table`). Only the numbers of that report leave the
client, as kind ``evaluation``: a release that no DP mechanism covers, which privacy.json names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from ..config import RunConfig
from ..data.schema import Schema
from ..data.silo import Silo, load_silo, table_pair
from ..federation.channel import Channel, Task, TaskRefused, task_count
from ..federation.message import SERVER
from ..federation.parties import Client
from ..methods.ffm import FFMClient, FFMSettings, velocity_network
from ..metrics.sampling import integrate
from ..metrics.tabular import evaluate_table
from ..models.params import flat_params, load_flat_params
from ..privacy.settings import DPSettings

__all__ = ["EVALUATE", "RELEASED", "EVALUATION", "SiloProgram", "own_silo", "hold_silo",
           "silo_program", "table_nfe", "evaluate_on_silos", "UNACCOUNTED_EVALUATION"]

EVALUATE = "silo.evaluate"
RELEASED = "released_model"  # kind of the model the clients evaluate
EVALUATION = "evaluation"  # kind of each client's numbers
_SILO = "silo"  # where a client keeps its own table (client.state)
_EVALUATED = "evaluated rounds"

UNACCOUNTED_EVALUATION = (
    "evaluation: each client's scores of the released model on its own held-out rows (W2 and "
    "its floor, per-column KS and TV, correlation difference, ML efficacy) go to the server in "
    "the clear; no DP mechanism covers them and no epsilon is charged for them")


def own_silo(config: RunConfig, path: str, schema: Schema) -> Silo:
    """A client's own file at ``path``, read and checked by the client, split by the run's
    public ``holdout`` and seed (:func:`~secureffm.data.silo.load_silo`)."""
    return load_silo(path, schema, config.holdout, config.seed, config.batch_size)


def hold_silo(client: Client, silo: Silo) -> None:
    """``client`` keeps its own ``silo``: its training rows are its shard, its held-out rows
    stay for :data:`EVALUATE`."""
    client.data = silo.x.to(client.data.device)
    client.state[_SILO] = silo


def table_nfe(config: RunConfig) -> int:
    """The Euler steps of a tabular run's synthetic rows: the largest evaluated NFE, at most
    100."""
    return min(max(config.nfe), 100)


def silo_program(config: RunConfig, schema: Schema, dp: DPSettings | None,
                 device: torch.device) -> SiloProgram:
    """A client's program on its own table: FFM's client (:class:`FFMClient`) on the schema's
    public pair, and the evaluation on its held-out rows; from public settings only, so every
    engine builds the same one."""
    settings = FFMSettings.of(config)
    pair = table_pair(schema)
    # Its weights come from the released model; drawing initial ones must not shift the global
    # generator, which draws the server's initial model next (the engines would differ).
    with torch.random.fork_rng(devices=[]):
        network = velocity_network(settings, pair)
    return SiloProgram(FFMClient(settings, dp, pair, device), schema, network,
                       config.eval_samples, table_nfe(config), config.target_column or None,
                       device)


@dataclass
class SiloProgram:
    """A client's program on its own table: the method's tasks (``method``), and
    :data:`EVALUATE` (args ``{"round": r}``) once in the run: ``samples`` synthetic rows from the
    broadcast ``released_model`` (``network``: the velocity architecture), ``nfe`` Euler steps,
    scored on the client's held-out rows; ``target_column`` for ML efficacy."""

    method: object
    schema: Schema
    network: torch.nn.Module
    samples: int
    nfe: int
    target_column: str | None
    device: torch.device

    def __call__(self, client: Client, task: Task) -> dict[str, np.ndarray]:
        if task.name != EVALUATE:
            return self.method(client, task)
        round_ = task_count(client.id, task, "round")
        done = client.state.setdefault(_EVALUATED, [])
        if done:
            raise TaskRefused(f"{client.id} refused {EVALUATE} for round {round_}: it evaluated "
                              f"the model of round {done[0]} already, and it evaluates once a "
                              "run (each evaluation releases scores of its held-out rows)")
        released = client.inbox.get(RELEASED)
        if released is None or "theta" not in released:
            raise TaskRefused(f"{client.id} refused {EVALUATE}: no released model reached it")
        done.append(round_)
        silo: Silo = client.state[_SILO]
        load_flat_params(self.network, released["theta"])
        x0 = torch.randn(self.samples, self.schema.dim, generator=client.generator,
                         device=client.generator.device).to(self.device)
        synthetic = integrate(self.network.to(self.device), x0, self.nfe)[0].cpu().numpy()
        report = evaluate_table(silo.holdout, synthetic, self.schema, train=silo.train,
                                target_column=self.target_column or None)
        return {"report": np.frombuffer(json.dumps(report.to_dict()).encode(), dtype=np.uint8)}


def evaluate_on_silos(channel: Channel, model: torch.nn.Module, round_: int) -> dict:
    """The server publishes ``model`` and asks each client for its evaluation: client id -> its
    report (a dict), or ``{"missing": why}`` when none arrived."""
    channel.broadcast(round_, RELEASED, {"theta": flat_params(model)})
    reports = {}
    for client in channel.clients:
        payload = channel.send(round_, "evaluate", EVALUATION, client.id, SERVER,
                               Task(EVALUATE, {"round": round_}))
        reports[client.id] = _report(payload)
    return reports


def _report(payload: dict | None) -> dict:
    if payload is None:
        return {"missing": "no evaluation arrived (the log says why)"}
    try:
        report = json.loads(np.asarray(payload["report"], dtype=np.uint8).tobytes())
    except (KeyError, ValueError, UnicodeDecodeError) as err:
        return {"missing": f"unreadable evaluation: {err}"}
    return report if isinstance(report, dict) else {"missing": "the evaluation is not a table"}
