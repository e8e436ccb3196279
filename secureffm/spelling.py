"""Did you mean: the closest known name to a misspelt one (difflib's ratio, cutoff 0.6)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the known name closest to ``word``, or ``""`` when none is
    close (difflib.get_close_matches, cutoff 0.6)."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
