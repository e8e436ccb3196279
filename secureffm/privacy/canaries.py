"""Gradient canaries for the one-run DP audit (Steinke, Nasr and Jagielski, NeurIPS 2023).

A canary is a record whose clipped per-example gradient is ``clip * u`` for a fixed random unit
direction u in the velocity's parameter space [P]: the worst-case example DP-SGD's guarantee
covers (any gradient of norm at most C). Canary i goes into client ``clients[i]``'s shard when
its fair coin ``included[i]`` (from ``secrets``) is true. An included canary is Poisson-sampled
at the client's rate q each round like any other record, and then adds ``clip * u`` to the
clipped sum, before the division by E[b] and beside the DP noise.

A run with canaries is an AUDIT RUN, not a production run: its clients hold records the
experimenter planted, and the coins are written beside the run (``canaries.safetensors``) so
the auditor can score the guesses. Only the auditor should read that file: whoever reads the
coins knows which canaries were included.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..errors import SecureFFMError
from .dpsgd import poisson_rows

__all__ = ["Canaries", "draw_canaries", "save_canaries", "load_canaries", "canary_sum",
           "CANARY_FILE", "AUDIT_NOTICE"]

CANARY_FILE = "canaries.safetensors"
AUDIT_NOTICE = ("AUDIT RUN, not a production run: canaries were planted in the clients' shards "
                "and their coins are in canaries.safetensors (audit material: whoever reads it "
                "knows which canaries were included)")


@dataclass(frozen=True)
class Canaries:
    """m gradient canaries and what the auditor needs to score them.

    ``directions``: unit vectors [m, P] float32; ``included``: the fair coins [m] bool;
    ``clients``: the 0-based client index [m] int64 whose shard each canary goes into (a
    canary's gradient is C u, C the run's clip in privacy.json); ``initial``: the velocity's
    parameters before round 1 [P] float32 (public: seeded by the run seed and broadcast in
    round 1).
    """

    directions: torch.Tensor
    included: torch.Tensor
    clients: torch.Tensor
    initial: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.directions.shape[0])

    def of_client(self, index: int) -> torch.Tensor:
        """Directions [k, P] of the included canaries in client ``index``'s shard."""
        return self.directions[self.included & (self.clients == index)]


def draw_canaries(count: int, clients: int, initial: torch.Tensor) -> Canaries:
    """``count`` canaries over ``clients`` shards (canary i to client i mod ``clients``), with
    directions and coins from the OS CSPRNG (never the run seed): no party but the auditor may
    know which canaries were included. ``initial``: the velocity's parameters [P]."""
    if count < 2:
        raise SecureFFMError(f"canaries = {count}: the audit needs at least 2 canaries (a few "
                             "hundred give a useful bound)")
    parameters = int(initial.numel())
    generator = torch.Generator().manual_seed(secrets.randbits(64))
    directions = torch.randn(count, parameters, generator=generator)
    directions /= directions.norm(dim=1, keepdim=True)
    coins = torch.tensor([secrets.randbits(1) for _ in range(count)], dtype=torch.bool)
    return Canaries(directions, coins, torch.arange(count) % clients,
                    initial.detach().float().cpu().reshape(-1))


def save_canaries(canaries: Canaries, path: Path) -> None:
    """Write ``canaries`` to ``path`` (safetensors, no pickle), marked as audit material."""
    save_file({"directions": canaries.directions.contiguous(),
               "included": canaries.included.to(torch.uint8), "clients": canaries.clients,
               "initial": canaries.initial.contiguous()}, str(path),
              metadata={"purpose": AUDIT_NOTICE,
                        "reference": "Steinke, Nasr and Jagielski, Privacy Auditing with One "
                                     "(1) Training Run, NeurIPS 2023"})


def load_canaries(path: Path) -> Canaries:
    """The canaries :func:`save_canaries` wrote to ``path``."""
    path = Path(path)
    if not path.exists():
        raise SecureFFMError(f"{path} does not exist: the one-run audit needs a run made with "
                             "--canaries M (an audit run)")
    tensors = load_file(str(path))
    return Canaries(tensors["directions"], tensors["included"].bool(), tensors["clients"],
                    tensors["initial"])


def canary_sum(directions: torch.Tensor, rate: float, clip: float,
               generator: torch.Generator) -> np.ndarray:
    """This step's canary gradients: each of the [k, P] ``directions`` kept independently with
    probability ``rate`` (Poisson sampling, from the client's secret ``generator``), and
    ``clip`` times the sum of the kept ones, float32 [P]."""
    rows = poisson_rows(len(directions), rate, generator).to(directions.device)
    return (clip * directions[rows].sum(0)).cpu().numpy().astype(np.float32)
