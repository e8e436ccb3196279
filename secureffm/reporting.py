"""Writing measured tables into docs: each script owns one marked block of a markdown file."""

from __future__ import annotations

import statistics
from pathlib import Path

__all__ = ["write_block", "markdown_table", "mean_std"]


def write_block(doc: Path, name: str, text: str, title: str = "# Results") -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in ``doc``
    (appending the markers, or creating ``doc`` with ``title``, when absent); the prose around
    the block is kept."""
    doc = Path(doc)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    current = doc.read_text() if doc.exists() else f"{title}\n\n{begin}\n{end}\n"
    if begin not in current:
        current += f"\n{begin}\n{end}\n"
    head, rest = current.split(begin, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table: ``headers``, then one line per row (cells by ``str``, a ``|`` inside a
    cell escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"
              for row in rows]
    return "\n".join(lines)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
