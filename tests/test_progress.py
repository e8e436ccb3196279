"""Progress bars redraw often on a terminal and seldom in a log (secureffm/progress.py)."""

from __future__ import annotations

import io
import sys

from secureffm.progress import REDRAW_S, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_redraw_per_half_minute_and_a_terminal_ten_per_second(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_bar(range(3)) as bar:
        assert bar.mininterval == REDRAW_S[False] == 30.0
    with progress_bar(range(3), mininterval=1.0) as bar:  # a caller's choice stands
        assert bar.mininterval == 1.0
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress_bar(range(3)) as bar:
        assert bar.mininterval == REDRAW_S[True] == 0.1
