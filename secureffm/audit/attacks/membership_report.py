"""What a membership attack's numbers mean (``--attack membership``, on images and on tables):
the DP claim of the run's privacy.json they are held against, and plain words on both.

For an (eps, delta)-DP model (unit: one record), every membership test has TPR <= e^eps FPR +
delta at every FPR (Kairouz et al. 2015); :func:`dp_claim` gives that bound at 1% FPR.
"""

from __future__ import annotations

import math

from .membership_scores import TARGET_FPR

__all__ = ["RESULT_FILE", "tpr_bound", "dp_claim", "interpret"]

RESULT_FILE = "attack-membership.json"  # in the run folder


def tpr_bound(epsilon: float, delta: float, fpr: float = TARGET_FPR) -> float:
    """The largest TPR any membership test can reach at ``fpr`` against an (epsilon, delta)-DP
    mechanism: min(1, e^epsilon fpr + delta)."""
    return min(1.0, math.exp(epsilon) * fpr + delta)


def dp_claim(privacy: dict, clients: list[str]) -> dict:
    """What ``privacy`` (privacy.json; {} when absent) claims, as numbers: each client's epsilon
    (the enforcing accountant's total), delta, and the TPR bound at 1% FPR (1 without DP:
    nothing bounds the attack); ``dp_bound_holds`` is false when the run's secrets came from
    the published seed."""
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


def interpret(results: dict, unit: str, outside: str) -> str:
    """Plain words on pooled ``results`` (``{score}_auc``, ``{score}_tpr_at_1pct_fpr``,
    ``members``, ``non_members`` and :func:`dp_claim`'s keys). ``unit``: what a record is
    ("row", "image"); ``outside``: what the non-members are ("held-out", "test")."""
    names = [k.removesuffix("_auc") for k in results if k.endswith("_auc") and "client-" not in k]
    best = max(names, key=lambda n: results[f"{n}_auc"])
    auc = results[f"{best}_auc"]
    tpr = max(results[f"{n}_tpr_at_1pct_fpr"] for n in names)
    others = results["non_members"]
    words = [
        f"Pooled over the clients, {results['members']} training {unit}s against {others} "
        f"{outside} {unit}s. The strongest score, {best!r}, has AUC {auc:.2f}: the chance that "
        f"it ranks a random training {unit} above a random {outside} {unit} (0.50 is chance: "
        f"the attack cannot tell members from {outside} {unit}s; 1.00 tells them apart every "
        "time)."]
    if others < 1 / TARGET_FPR:
        words.append(f"With {others} {outside} {unit}s, 1% FPR admits no false alarm at all, "
                     "so its TPR is that of the strictest threshold.")
    words.append(f"At 1% FPR (flagging at most 1 {outside} {unit} in 100 as a member) the best "
                 f"score finds {100 * tpr:.1f}% of the training {unit}s; a blind guess finds "
                 "1%.")
    if results["dp_epsilon"] is None:
        words.append(f"The run applied no DP (privacy.json), so nothing bounds this attack: an "
                     f"overfit model or its samples may reveal training {unit}s.")
    else:
        bound = results["dp_tpr_bound_at_1pct_fpr"]
        words.append(f"privacy.json claims ({results['dp_epsilon']:.3g}, {results['delta']:.3g})"
                     f"-DP per {unit}, which caps any attack's TPR at 1% FPR at "
                     f"{100 * bound:.1f}% (e^eps x 1% + delta); measured {100 * tpr:.1f}%. A "
                     "measurement above the cap beyond sampling error would refute the claim; "
                     "one below it does not prove it.")
        if not results["dp_bound_holds"]:
            words.append("But the run's secrets came from the published seed "
                         "(--insecure-deterministic): no DP claim of it holds, this cap included.")
    return " ".join(words)
