"""Progress bars: tqdm, redrawn at most every 0.1 s on a terminal and every 30 s when standard
error is not one (a log file, a CI console, a pipe), so that a long run's log holds a line per
half minute instead of ten per second."""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["progress_bar", "REDRAW_S"]

REDRAW_S = {True: 0.1, False: 30.0}
"""Least seconds between redraws: on a terminal (True) and elsewhere (False)."""


def progress_bar(*args, **kwargs) -> tqdm:
    """``tqdm(*args, **kwargs)`` with ``mininterval`` from :data:`REDRAW_S` unless given."""
    kwargs.setdefault("mininterval", REDRAW_S[sys.stderr.isatty()])
    return tqdm(*args, **kwargs)
