"""metrics.csv: one row per training round, for tools that read a run's progress (pandas,
spreadsheets). Columns: round, aborted (aggregations aborted in that round), then each
diagnostic a round reported (loss, dual), blank in rounds without it. Under DP the clients'
losses are not privatized, so a DP run reports none of them (docs/ffm.md).
"""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["RoundLog", "ROUNDS_FILE", "CURVES_NOTE"]

ROUNDS_FILE = "metrics.csv"
# Why a run's loss curves are empty (metrics.json's "curves_note"; methods/ffm.py, _diagnose).
CURVES_NOTE = ("no loss or dual curve: the server reads the clients' losses only from clients "
               "in this process and without DP (under DP the losses are not privatized, so "
               "they are not read)")


class RoundLog:
    """The rows of metrics.csv, gathered as the rounds run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def add(self, round_: int, aborted: int, report: dict[str, float]) -> None:
        """Record round ``round_``: its aborted aggregations and its diagnostics."""
        self.rows.append({"round": round_, "aborted": aborted, **report})

    def write(self, path: Path) -> None:
        """Write the rows as CSV with a header (columns in order of first appearance)."""
        columns = list(dict.fromkeys(key for row in self.rows for key in row)) or ["round",
                                                                                  "aborted"]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, columns, restval="")
            writer.writeheader()
            writer.writerows(self.rows)
