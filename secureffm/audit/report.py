"""The claims report written into the run folder: ``audit.md`` (a verdict table, then each
claim's evidence) and ``audit_epsilon.png`` (epsilon per client and kind against the target)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .claims import ClaimsReport  # noqa: E402

__all__ = ["write_report", "REPORT_FILE", "EPSILON_PLOT"]

REPORT_FILE = "audit.md"
EPSILON_PLOT = "audit_epsilon.png"


def write_report(report: ClaimsReport) -> list[Path]:
    """Write audit.md (and the epsilon plot when the log states any epsilon) into the run
    folder; returns the paths written."""
    folder = report.run_dir
    written = []
    if report.epsilon:
        plot_epsilon(folder / EPSILON_PLOT, report.epsilon, report.target)
        written.append(folder / EPSILON_PLOT)
    (folder / REPORT_FILE).write_text(_markdown(report, bool(report.epsilon)))
    return [folder / REPORT_FILE, *written]


def _markdown(report: ClaimsReport, plotted: bool) -> str:
    adversary = report.adversary
    lines = [f"# Audit of `{report.run_dir.name}` under `{adversary.name}`", "",
             f"Adversary: {adversary.describe()}.", ""]
    if adversary.description:
        lines += [f"({adversary.description})", ""]
    if not report.verification.ok:
        lines += ["**The log does not verify**: the verdicts below read records nobody vouches "
                  "for.", ""]
    lines += ["| claim | verdict | reason |", "| --- | --- | --- |"]
    lines += [f"| {v.title} | **{v.status}** | {_cell(v.reason)} |" for v in report.verdicts]
    for verdict in report.verdicts:
        lines += ["", f"## {verdict.title}: {verdict.status}", "", verdict.reason, ""]
        lines += [f"- {line}" for line in verdict.evidence]
    if plotted:
        lines += ["", f"![epsilon per client and kind]({EPSILON_PLOT})"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def plot_epsilon(path: Path, epsilon: dict[str, dict[str, float]], target: float | None) -> None:
    """Grouped bars: per client, epsilon of each kind and the total; the target as a line."""
    kinds = sorted({k for row in epsilon.values() for k in row if k != "total"}) + ["total"]
    clients = sorted(epsilon)
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(clients) * len(kinds) / 2 + 2), 4))
    for index, kind in enumerate(kinds):
        xs = [c + (index - (len(kinds) - 1) / 2) * width for c in range(len(clients))]
        ax.bar(xs, [epsilon[c].get(kind, 0.0) for c in clients], width, label=kind)
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", label=f"target {target:g}")
    ax.set_xticks(range(len(clients)), clients)
    ax.set_ylabel("epsilon (recomputed from the log)")
    ax.set_title("epsilon spent per client and kind\n'total': the kinds composed by the "
                 "accountant, not their sum", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
