"""Evaluation of a trained flow: W2 against NFE, an adaptive solve, straightness, timings.

The evaluator draws its own source noise and a fresh held-out target sample (never a client's
shard); it stands outside the protocol, as an experimenter does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..data.pairs import DataPair
from ..ot import half_squared_cost, semidual_assignment, semidual_value
from .sampling import integrate, straightness
from .w2 import w2_many

__all__ = ["EvalReport", "evaluate_flow", "potential_health"]


@dataclass
class EvalReport:
    """W2 per Euler NFE, the adaptive solve, straightness, and inference seconds per NFE."""

    w2: dict[int, float]
    inference_seconds: dict[int, float]
    adaptive: dict
    straightness: float
    eval_samples: int
    potential: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["w2"] = {str(k): v for k, v in self.w2.items()}
        data["inference_seconds"] = {str(k): v for k, v in self.inference_seconds.items()}
        return data


def _timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


@torch.no_grad()
def potential_health(potential: nn.Module, pair: DataPair, target: torch.Tensor,
                     candidates: int, generator: torch.Generator) -> dict[str, float]:
    """Held-out semi-dual value (estimates W2^2 / 2) and the share of unused candidates.

    A potential that collapses the coupling sends every target to few candidates (share near 1).
    """
    device = target.device
    batch = target[: min(len(target), candidates)]
    x0 = pair.source.sample(len(batch), generator, device)[0]
    cand = pair.source.sample(candidates, generator, device)[0]
    chosen = semidual_assignment(half_squared_cost(cand, batch), potential(cand))
    with torch.enable_grad():
        value = float(semidual_value(potential, x0, cand, batch).detach())
    return {"dual_value": value,
            "unused_candidates": 1.0 - len(torch.unique(chosen)) / candidates}


def evaluate_flow(
    model: nn.Module,
    pair: DataPair,
    nfes: tuple[int, ...],
    samples: int,
    generator: torch.Generator,
    device: torch.device,
    adaptive_solver: str = "dopri5",
    adaptive_tol: float = 1e-5,
    straightness_samples: int = 2_000,
) -> tuple[EvalReport, dict[str, torch.Tensor]]:
    """Generate ``samples`` points at each NFE and compare with a fresh target sample.

    Returns the report and the generated samples by label (``euler-N``, ``adaptive``) on CPU.
    """
    model.eval()
    x0 = pair.source.sample(samples, generator, device)[0]
    target = pair.target.sample(samples, generator, device)[0]
    generated, seconds = {}, {}
    for nfe in nfes:
        (x1, _), seconds[nfe] = _timed(lambda n=nfe: integrate(model, x0, n))
        generated[f"euler-{nfe}"] = x1.cpu()
    (x1, used), adaptive_seconds = _timed(
        lambda: integrate(model, x0, method=adaptive_solver, tol=adaptive_tol))
    generated["adaptive"] = x1.cpu()
    labels = [f"euler-{n}" for n in nfes] + ["adaptive"]
    distances = w2_many([(generated[k], target.cpu()) for k in labels])
    report = EvalReport(
        w2=dict(zip(nfes, distances[:-1], strict=False)),
        inference_seconds=seconds,
        adaptive={"solver": adaptive_solver, "nfe": used, "w2": distances[-1],
                  "seconds": adaptive_seconds},
        straightness=straightness(model, x0[:straightness_samples]),
        eval_samples=samples,
    )
    generated["target"] = target.cpu()
    return report, generated
