"""Membership inference on a tabular run (``--attack membership`` on a run made with
``--client-data``; docs/audit.md, "Membership inference").

Adversary: anyone holding the released model (checkpoint.safetensors or its export) or synthetic
rows sampled from it, and a candidate row, asking whether the row was in a client's training rows.
The attack is scored by the experimenter who holds the clients' files (config.toml names them): each
file is split as its client split it (:func:`~secureffm.data.silo.load_silo`: the run's
``holdout`` fraction and public ``seed``), members = its training rows, non-members = its
held-out rows, per client and pooled. Scores of a row's encoding x [dim], higher = "member":

- ``loss``, ``averaged`` and, when the run kept its payloads, ``calibrated`` against the round-1
  broadcast: :func:`~.membership.membership_scores`, as on images;
- ``dcr``: minus the distance to the closest record, |x - s|_2 to the nearest of ``samples``
  synthetic rows s of the released model as ``secureffm sample`` releases them (decoded
  through the schema), both encoded (numeric columns scaled to [-1, 1] by their public bounds,
  categories one-hot): an overfit model's samples copy its training rows.

Each score gives ROC AUC and TPR at 1% FPR (:func:`~.membership.auc_and_tpr`); beside them,
what the run's privacy.json claims and plain words (:mod:`.membership_report`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from ...config import RunConfig, load_config
from ...data.encoding import encode
from ...data.schema import Schema
from ...data.silo import Silo, load_silo
from ...errors import SecureFFMError
from ...models.params import load_flat_params
from ...progress import progress_bar
from ...runs.synthetic import load
from .membership_report import RESULT_FILE, dp_claim, interpret, tpr_bound
from .membership_scores import auc_and_tpr, membership_scores
from .view import ServerView

__all__ = ["tabular_membership", "distance_to_closest", "tpr_bound", "RESULT_FILE"]


def distance_to_closest(x: torch.Tensor, records: torch.Tensor, chunk: int = 4096
                        ) -> torch.Tensor:
    """Euclidean distance [N] from each row of ``x`` [N, d] to its nearest row of ``records``
    [M, d]."""
    return torch.cat([torch.cdist(part, records).min(dim=1).values for part in x.split(chunk)])


def tabular_membership(run_dir: Path, count: int = 1000, draws: int = 16, seed: int = 0,
                       samples: int = 2000) -> dict:
    """Score up to ``count`` training and ``count`` held-out rows of each client (drawn with the
    attacker's ``seed``) of the tabular run in ``run_dir``, ``draws`` draws of (x0, t) each,
    against ``samples`` synthetic rows. Returns flat results (``{score}_auc``,
    ``{score}_tpr_at_1pct_fpr``, ``members``, ``non_members`` pooled, the same prefixed by
    each client id, the DP bound, ``interpretation``: plain words) and writes them to
    ``run_dir/attack-membership.json``."""
    config = load_config(run_dir / "config.toml")
    model = load(run_dir)
    generator = torch.Generator().manual_seed(seed)
    synthetic = torch.from_numpy(encode(model.sample(samples, seed=seed), model.schema))
    reference = _round_one_model(run_dir, model.velocity)
    inside: dict[str, list[torch.Tensor]] = {}
    outside: dict[str, list[torch.Tensor]] = {}
    results: dict = {}
    clients = [f"client-{i + 1}" for i in range(len(config.client_data))]
    for client, path in zip(progress_bar(clients, desc="membership", unit="client", delay=2),
                            config.client_data, strict=True):
        silo = _client_silo(run_dir, config, client, path, model.schema)
        members = _pick(silo.x, count, generator)
        others = _pick(torch.from_numpy(encode(silo.holdout, model.schema)), count, generator)
        rows = torch.cat([members, others])
        scores = membership_scores(model.velocity, rows, generator, draws, reference)
        scores["dcr"] = -distance_to_closest(rows, synthetic)
        split = {name: (s[:len(members)], s[len(members):]) for name, s in scores.items()}
        results.update(_separation(split, prefix=f"{client}_"))
        for name, (a, b) in split.items():
            inside.setdefault(name, []).append(a)
            outside.setdefault(name, []).append(b)
    pooled = {name: (torch.cat(inside[name]), torch.cat(outside[name])) for name in inside}
    results = {**_separation(pooled), **results, "synthetic_rows": samples, "draws": draws}
    results.update(dp_claim(model.privacy, clients))
    results["interpretation"] = interpret(results, "row", "held-out")
    (run_dir / RESULT_FILE).write_text(json.dumps(results, indent=1))
    return results


def _separation(split: dict[str, tuple[torch.Tensor, torch.Tensor]], prefix: str = "") -> dict:
    """``{prefix}members``, ``{prefix}non_members`` and each score's AUC and TPR at 1% FPR."""
    members, others = next(iter(split.values()))
    found: dict = {f"{prefix}members": len(members), f"{prefix}non_members": len(others)}
    for name, (a, b) in split.items():
        found[f"{prefix}{name}_auc"], found[f"{prefix}{name}_tpr_at_1pct_fpr"] = auc_and_tpr(a, b)
    return found


def _client_silo(run_dir: Path, config: RunConfig, client: str, path: str,
                 schema: Schema) -> Silo:
    """``client``'s file split as its client split it, checked against the number of held-out
    rows the client reported in metrics.json."""
    if not Path(path).is_file():
        raise SecureFFMError(f"{client}'s file {path!r} (config.toml's client_data) is not "
                             "here: the membership attack on a tabular run is scored by whoever "
                             "holds the clients' files; run it where those paths resolve")
    silo = load_silo(path, schema, config.holdout, config.seed)
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        reported = json.loads(metrics.read_text())["eval"]["clients"].get(client, {})
        held = len(next(iter(silo.holdout.values())))
        if reported.get("holdout_rows", held) != held:
            raise SecureFFMError(f"{path} now holds out {held} rows where {client} reported "
                                 f"{reported['holdout_rows']} in the run: the file changed "
                                 "since; the attack needs the rows the client trained on")
    return silo


def _pick(x: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """At most ``count`` rows of ``x`` [N, d], drawn without replacement."""
    return x[torch.randperm(len(x), generator=generator)[:count]]


def _round_one_model(run_dir: Path, released: torch.nn.Module) -> torch.nn.Module | None:
    """The model the run started from (client-1's round-1 broadcast) when the run kept its
    payloads, else None (no ``calibrated`` score)."""
    try:
        view = ServerView.read(run_dir)
    except SecureFFMError:
        return None
    record = view.one(kind="global_model", recipient="client-1", round=1)
    reference = copy.deepcopy(released)
    load_flat_params(reference, view.payload(record)["theta"])
    return reference.eval()
