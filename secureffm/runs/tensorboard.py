"""TensorBoard event files of an FFM-family run, in RUN/tensorboard/, written only when the
``tensorboard`` package is installed (``pip install secureffm[tensorboard]``); without it
nothing is written and nothing fails.

Scalars: ``round/<name>`` for every diagnostic a training round reports (loss, dual, aborted,
the columns of metrics.csv; step = the round) and ``final/<path>`` for every number of
metrics.json but its curves (step = the last round; ``path``: its keys joined by ``/``).
``tensorboard --logdir RUN/tensorboard`` shows them, live while a run trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["Board", "TENSORBOARD_DIR", "numbers"]

TENSORBOARD_DIR = "tensorboard"


class Board:
    """A run's TensorBoard writer, or nothing when tensorboard is not installed."""

    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises it when the tensorboard package is missing
            self._writer = None
        else:
            self._writer = SummaryWriter(str(out / TENSORBOARD_DIR))

    def round(self, round_: int, values: dict[str, float]) -> None:
        """Record round ``round_``'s diagnostics (name -> value)."""
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(f"round/{name}", value, round_)

    def final(self, metrics: dict, round_: int) -> None:
        """Record every number of ``metrics`` (metrics.json) but its curves at ``round_``."""
        if self._writer is not None:
            for path, value in numbers({k: v for k, v in metrics.items() if k != "curves"}):
                self._writer.add_scalar(f"final/{path}", value, round_)

    def close(self) -> None:
        """Flush the event file and close it (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def numbers(tree, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(key path joined by ``/``, value) for every int or float leaf of nested dicts and lists
    (list items keyed by their index); booleans, strings and None are left out."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, (dict, list, tuple)):
            yield from numbers(value, path + "/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path, float(value)
