"""Known third-party noise, silenced by message and category (never blanket) at the command's
entry point, so that what reaches a user's terminal on an ordinary run is ours.

Each entry says why its warning tells the user nothing they can act on: the numbers it is
about are reported in privacy.json or checked by our code. Any other warning still shows.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["KNOWN_WARNINGS", "FLOWER_DEPRECATION", "quiet_known_noise"]

# (message regex, category name, emitting module regex, why it is noise)
KNOWN_WARNINGS = (
    (r"Optimal order is the (largest|smallest) alpha", "UserWarning", r"opacus\.",
     "the RDP epsilon at the best order of Opacus' grid is still an upper bound; privacy.json "
     "reports it and the PRV accountant's beside it"),
    (r"(overflow|invalid value) encountered", "RuntimeWarning", r"opacus\.accountants\.",
     "Opacus' PRV accountant overflows at large epsilon; privacy.json reports its inf"),
    (r"Matrix is (singular|ill-conditioned)", "LinAlgWarning", r"secureffm\.metrics\.",
     "scipy's sqrtm of a low-rank covariance in W2 and FID: metrics/frechet.py adds a ridge or "
     "raises SolverError on an imaginary root"),
    (r"Tip: In future versions of Ray", "FutureWarning", r"ray\.",
     "Ray's note on a future default for GPU visibility; runs here set their own devices"),
)
# Flower logs this (not warnings.warn) on every simulation; secureffm's own engine calls it.
FLOWER_DEPRECATION = "The `run_simulation` function is deprecated"


class _DropFlowerDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return FLOWER_DEPRECATION not in record.getMessage()


def _category(name: str) -> type[Warning]:
    if name == "LinAlgWarning":
        from scipy.linalg import LinAlgWarning  # only the commands that train call this

        return LinAlgWarning
    return {"UserWarning": UserWarning, "RuntimeWarning": RuntimeWarning,
            "FutureWarning": FutureWarning}[name]


def quiet_known_noise() -> None:
    """Install the filters of :data:`KNOWN_WARNINGS` and drop Flower's run_simulation
    deprecation from its logger (idempotent)."""
    for message, category, module, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=_category(category),
                                module=module)
    flower = logging.getLogger("flwr")
    if not any(isinstance(f, _DropFlowerDeprecation) for f in flower.filters):
        flower.addFilter(_DropFlowerDeprecation())
