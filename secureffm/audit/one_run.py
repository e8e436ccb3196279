"""The one-run empirical DP audit (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023) of an audit run made with ``--canaries M``.

Each of the m canaries was included in a client's shard by a fair coin S_i (privacy/canaries).
After training the auditor scores every canary, guesses the k+ highest-scoring IN and the k-
lowest OUT (abstaining on the rest), and counts the correct guesses v of r = k+ + k-. Under an
(epsilon, delta)-DP mechanism, P[v or more correct] is at most :func:`p_value` (their Theorem
5.2 with Proposition 5.7's closed form; Appendix D); the largest epsilon whose p-value is still
below beta is an empirical lower bound: with probability at least 1 - beta the mechanism is not
(epsilon', delta)-DP for any epsilon' below it.

The score is white-box: canary i's gradient is clip * u_i, so the auditor projects the total
displacement of the released velocity onto u_i, <theta_0 - theta_T, u_i> (the sum over rounds
of the server's steps along u_i, which telescopes). theta_0 is public (seeded by the run seed and
broadcast in round 1) and theta_T is the checkpoint's live (not averaged) model: both are
functions of what DP releases, so the bound audits the whole pipeline from the clients' DP-SGD
to the server's model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binom

from ..errors import SecureFFMError
from ..privacy.canaries import CANARY_FILE, load_canaries
from ..runs.scaffold import CHECKPOINT, load_checkpoint
from .verify import insecure_deterministic

__all__ = ["p_value", "epsilon_lower_bound", "guess_counts", "canary_scores", "one_run_audit",
           "GUESS_FRACTIONS"]

# Guesses k+ = k- = ceil(fraction * m / 2) tried per audit; each is tested at beta / 5
# (Bonferroni), so taking the largest bound keeps the overall confidence 1 - beta.
GUESS_FRACTIONS = (0.05, 0.1, 0.2, 0.5, 1.0)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """An upper bound on P[at least v of r guesses correct] about m canaries, each included by a
    fair coin, under any (epsilon, delta)-DP mechanism and any guesser (Steinke et al. 2023,
    Thm 5.2 and Prop 5.7):

    .. math:: P[\\mathrm{Bin}(r, p) \\ge v] + 2 m \\delta \\max_{i = 1..v}
              \\frac{1}{i} P[v - i \\le \\mathrm{Bin}(r, p) < v],
              \\quad p = e^\\epsilon / (1 + e^\\epsilon).

    Returns 1 for v <= r p: there, with delta > 0, a brute-force search over every
    (epsilon, delta)-DP mechanism on 3 or 4 canaries found mechanisms above this closed form
    (tests/audit/test_one_run.py); no audit at beta < 1/2 certifies anything there anyway.
    """
    if not 0 <= v <= r <= m or epsilon < 0 or not 0 <= delta <= 1:
        raise SecureFFMError(f"p_value needs 0 <= v <= r <= m, epsilon >= 0 and delta in "
                             f"[0, 1]; got m={m}, r={r}, v={v}, epsilon={epsilon}, "
                             f"delta={delta}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    if v <= r * p:
        return 1.0
    tail = float(binom.sf(v - 1, r, p))
    if delta == 0:
        return min(tail, 1.0)
    below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, p))  # i = 1..v: P[v-i <= B < v]
    return min(tail + 2 * m * delta * float(np.max(below / np.arange(1, v + 1))), 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float = 0.05,
                        tolerance: float = 1e-4) -> float:
    """The largest epsilon (to ``tolerance``) with :func:`p_value` below ``beta``: with
    confidence 1 - beta, no (epsilon', delta)-DP mechanism with epsilon' under it produced v
    correct guesses of r. 0 when even epsilon = 0 explains them."""
    if not 0 < beta < 1:
        raise SecureFFMError(f"beta = {beta}: the audit's failure probability must be in (0, 1)")
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, r, v, high, delta) < beta:  # the p-value rises to 1 as epsilon grows
        low, high = high, 2 * high
    while high - low > tolerance:
        mid = (low + high) / 2
        low, high = (mid, high) if p_value(m, r, v, mid, delta) < beta else (low, mid)
    return low


def guess_counts(scores: np.ndarray, included: np.ndarray, k_in: int,
                 k_out: int) -> tuple[int, int]:
    """(guesses r, correct v): the ``k_in`` highest ``scores`` [m] guessed IN, the ``k_out``
    lowest guessed OUT (abstaining on the rest), against the coins ``included`` [m] bool."""
    if k_in + k_out > len(scores):
        raise SecureFFMError(f"k+ + k- = {k_in + k_out} guesses exceed the {len(scores)} "
                             "canaries")
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[len(scores) - k_in:]].sum()) if k_in else 0
    correct += int((~included[order[:k_out]]).sum())
    return k_in + k_out, correct


def canary_scores(directions: torch.Tensor, initial: torch.Tensor,
                  final: torch.Tensor) -> np.ndarray:
    """<theta_0 - theta_T, u_i> for each direction u_i of ``directions`` [m, P]: how far the
    server's model moved down canary i's gradient, float64 [m]."""
    step = (initial.double() - final.double()).reshape(-1)
    if step.numel() != directions.shape[1]:
        raise SecureFFMError(f"the canaries live in {directions.shape[1]} parameters but the "
                             f"checkpoint's velocity has {step.numel()}: not this run's canaries")
    return (directions.double() @ step).numpy()


def _final_velocity(run_dir: Path) -> torch.Tensor:
    """The checkpoint's live velocity parameters [P] (in parameter order)."""
    path = run_dir / CHECKPOINT
    if not path.exists():
        raise SecureFFMError(f"{path} does not exist: audit a finished run")
    state = load_checkpoint(path)["state"]["velocity"]
    return torch.cat([t.reshape(-1).float() for t in state["module"].values()])


def _accounted(run_dir: Path) -> tuple[float, float]:
    """(the largest accounted epsilon over clients, delta) from privacy.json (the accountant
    that enforces the target)."""
    path = run_dir / "privacy.json"
    if not path.exists():
        raise SecureFFMError(f"{path} does not exist: audit a finished run")
    privacy = json.loads(path.read_text())
    if "clients" not in privacy:
        raise SecureFFMError(f"{path} accounts no DP mechanism: the one-run audit needs a run "
                             "under a dp protocol")
    accountant = privacy["enforced_by"]
    spent = max(row[accountant]["total"] for row in privacy["clients"].values())
    return float(spent), float(privacy["delta"])


def one_run_audit(run_dir: Path, beta: float = 0.05) -> dict[str, float]:
    """Audit the run in ``run_dir`` (made with ``--canaries M``): the empirical epsilon lower
    bound at confidence 1 - ``beta`` beside the accounted epsilon. Guesses k+ = k- = k for each
    of :data:`GUESS_FRACTIONS`, each bound at beta / 5; reports the largest, with its counts.

    Keys: ``epsilon_lower_bound``, ``epsilon_accounted``, ``delta``, ``beta``, ``canaries`` (m),
    ``included`` (canaries the coins put in), ``guesses`` (r), ``correct`` (v), and
    ``accounted_is_guarantee``: 0 when config.toml says ``insecure_deterministic = true`` (the
    DP noise replays from the published seed, so the accounted epsilon is arithmetic, not a
    guarantee; ``secureffm audit`` prints so), else 1."""
    run_dir = Path(run_dir)
    canaries = load_canaries(run_dir / CANARY_FILE)
    accounted, delta = _accounted(run_dir)
    scores = canary_scores(canaries.directions, canaries.initial, _final_velocity(run_dir))
    included = canaries.included.numpy()
    m = canaries.count
    best = {"epsilon_lower_bound": -1.0}
    for fraction in GUESS_FRACTIONS:
        k = max(1, min(m // 2, math.ceil(fraction * m / 2)))
        r, v = guess_counts(scores, included, k, k)
        bound = epsilon_lower_bound(m, r, v, delta, beta / len(GUESS_FRACTIONS))
        if bound > best["epsilon_lower_bound"]:
            best = {"epsilon_lower_bound": bound, "guesses": float(r), "correct": float(v)}
    return {**best, "epsilon_accounted": accounted, "delta": delta, "beta": beta,
            "canaries": float(m), "included": float(included.sum()),
            "accounted_is_guarantee": 0.0 if insecure_deterministic(run_dir) else 1.0}

