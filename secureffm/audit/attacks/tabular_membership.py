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

Each score gives ROC AUC and TPR at 1% FPR (:func:`~.membership.auc_and_tpr`). Beside them: what
the run's privacy.json claims. For an (eps, delta)-DP model (unit: one row), every test, these
included, has TPR <= e^eps FPR + delta at every FPR (Kairouz et al. 2015); the report gives that
bound at 1% FPR (pooled: the largest client epsilon).
"""

from __future__ import annotations

import copy
import json
import math
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
from .membership_scores import TARGET_FPR, auc_and_tpr, membership_scores
from .view import ServerView

__all__ = ["tabular_membership", "distance_to_closest", "tpr_bound", "RESULT_FILE"]

RESULT_FILE = "attack-membership.json"


def distance_to_closest(x: torch.Tensor, records: torch.Tensor, chunk: int = 4096
                        ) -> torch.Tensor:
    """Euclidean distance [N] from each row of ``x`` [N, d] to its nearest row of ``records``
    [M, d]."""
    return torch.cat([torch.cdist(part, records).min(dim=1).values for part in x.split(chunk)])


def tpr_bound(epsilon: float, delta: float, fpr: float = TARGET_FPR) -> float:
    """The largest TPR any membership test can reach at ``fpr`` against an (epsilon, delta)-DP
    mechanism: min(1, e^epsilon fpr + delta)."""
    return min(1.0, math.exp(epsilon) * fpr + delta)


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
    results.update(_dp_claim(model.privacy, clients))
    results["interpretation"] = interpret(results)
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


def _dp_claim(privacy: dict, clients: list[str]) -> dict:
    """What privacy.json claims, as numbers: each client's epsilon (the enforcing accountant's
    total), delta, and the TPR bound at 1% FPR (1 without DP: nothing bounds the attack);
    ``dp_bound_holds`` is false when the run's secrets came from the published seed."""
    spent = privacy.get("clients") or {}
    accountant = privacy.get("enforced_by", "rdp")
    delta = privacy.get("delta")
    found: dict = {"delta": delta}
    epsilons = []
    for client in clients:
        epsilon = spent.get(client, {}).get(accountant, {}).get("total")
        found[f"{client}_dp_epsilon"] = epsilon
        found[f"{client}_dp_tpr_bound_at_1pct_fpr"] = (
            1.0 if epsilon is None else tpr_bound(epsilon, delta))
        epsilons.append(epsilon)
    worst = None if None in epsilons else max(epsilons)
    found["dp_epsilon"] = worst
    found["dp_tpr_bound_at_1pct_fpr"] = 1.0 if worst is None else tpr_bound(worst, delta)
    found["dp_bound_holds"] = worst is not None and "INSECURE" not in str(
        privacy.get("secret_randomness", ""))
    return found


def interpret(results: dict) -> str:
    """Plain words on pooled ``results`` of :func:`tabular_membership`."""
    names = [k.removesuffix("_auc") for k in results if k.endswith("_auc") and "client-" not in k]
    best = max(names, key=lambda n: results[f"{n}_auc"])
    auc = results[f"{best}_auc"]
    tpr = max(results[f"{n}_tpr_at_1pct_fpr"] for n in names)
    others = results["non_members"]
    words = [
        f"Pooled over the clients, {results['members']} training rows against {others} "
        f"held-out rows. The strongest score, {best!r}, has AUC {auc:.2f}: the chance that it "
        "ranks a random training row above a random held-out row (0.50 is chance: the attack "
        "cannot tell members from held-out rows; 1.00 tells them apart every time)."]
    if others < 1 / TARGET_FPR:
        words.append(f"With {others} held-out rows, 1% FPR admits no false alarm at all, so "
                     "its TPR is that of the strictest threshold.")
    words.append(f"At 1% FPR (flagging at most 1 held-out row in 100 as a member) the best "
                 f"score finds {100 * tpr:.1f}% of the training rows; a blind guess finds 1%.")
    if results["dp_epsilon"] is None:
        words.append("The run applied no DP (privacy.json), so nothing bounds this attack: an "
                     "overfit model or its samples may reveal training rows.")
    else:
        bound = results["dp_tpr_bound_at_1pct_fpr"]
        words.append(f"privacy.json claims ({results['dp_epsilon']:.3g}, {results['delta']:.3g})"
                     f"-DP per row, which caps any attack's TPR at 1% FPR at {100 * bound:.1f}% "
                     f"(e^eps x 1% + delta); measured {100 * tpr:.1f}%. A measurement above the "
                     "cap beyond sampling error would refute the claim; one below it does not "
                     "prove it.")
        if not results["dp_bound_holds"]:
            words.append("But the run's secrets came from the published seed "
                         "(--insecure-deterministic): no DP claim of it holds, this cap included.")
    return " ".join(words)
