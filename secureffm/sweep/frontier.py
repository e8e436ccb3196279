"""A sweep's results: one row per cell read from its run folder, the CSV, the privacy-utility
frontier (PNG) and a markdown summary.

A row: ``method``, ``protocol`` (as the grid asks), ``epsilon`` (the target asked, ``inf`` for
no DP), ``protocol_run`` (the protocol that ran: at ``inf`` the counterpart without a dp stage),
``seed``, ``rounds`` (run; a target can stop training early), the largest epsilon any client
spent (``spent_rdp``, ``spent_prv``; empty without DP or where PRV does not cover the
mechanism), ``sigma`` (tau under distributed noise), ``insecure_deterministic`` (true: the run
derived its secret streams from the published seed, so none of its privacy claims hold: the
table and the frontier mark it), the utility at each NFE (``w2_nfe<N>``, or ``fid_nfe<N>`` for
images) and each attack's metrics (``<attack>_<metric>``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..reporting import markdown_table, mean_std  # noqa: E402
from .grid import Cell  # noqa: E402

__all__ = ["cell_row", "write_csv", "plot_frontier", "summary_table", "utility_columns",
           "ATTACKS_FILE", "INSECURE_MARK"]

# Attack results of a cell: {attack: {metric: value}}, beside the run's own files.
ATTACKS_FILE = "attacks.json"
_UTILITY = {"w2": "W2", "fid": "FID"}


def cell_row(cell: Cell, folder: Path, attacks: tuple[str, ...] = ()) -> dict:
    """The CSV row of a finished cell, read from its run folder."""
    metrics = json.loads((folder / "metrics.json").read_text())
    privacy = json.loads((folder / "privacy.json").read_text())
    row = {"method": cell.method, "protocol": cell.protocol, "epsilon": cell.label,
           "protocol_run": metrics["protocol"], "seed": cell.seed, "rounds": metrics["rounds"],
           "spent_rdp": "", "spent_prv": "", "sigma": "",
           "insecure_deterministic": bool(metrics.get("insecure_deterministic"))}
    if "clients" in privacy:  # DP runs: the ledger's epsilons per client
        clients = privacy["clients"].values()
        row["spent_rdp"] = max(c["rdp"]["total"] for c in clients)
        prv = [c["prv"]["total"] for c in clients]  # None: PRV does not cover the mechanism
        row["spent_prv"] = max(prv) if None not in prv else ""
        row["sigma"] = max(privacy.get("noise_multiplier", privacy.get("tau", {})).values())
    kind = "fid" if "fid" in metrics["eval"] else "w2"
    for nfe, value in sorted(metrics["eval"][kind].items(), key=lambda item: int(item[0])):
        row[f"{kind}_nfe{nfe}"] = value
    if attacks:
        found = json.loads((folder / ATTACKS_FILE).read_text())
        for attack in attacks:
            row.update({f"{attack}_{k}": v for k, v in found[attack].items()})
    return row


def write_csv(rows: list[dict], path: Path) -> None:
    """``rows`` as CSV, with every column any row has, in order of first appearance."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def utility_columns(rows: list[dict]) -> list[str]:
    """The utility columns (``w2_nfe<N>`` or ``fid_nfe<N>``), by NFE."""
    found = {k for row in rows for k in row if k.split("_nfe")[0] in _UTILITY and "_nfe" in k}
    return sorted(found, key=lambda k: int(k.split("_nfe")[1]))


def _title(column: str) -> str:
    kind, nfe = column.split("_nfe")
    return f"{_UTILITY[kind]} at NFE {nfe}"


def _lines(rows: list[dict]) -> list[tuple[str, str]]:
    """(method, protocol) pairs in grid order."""
    return list(dict.fromkeys((r["method"], r["protocol"]) for r in rows))


def _insecure(rows: list[dict]) -> bool:
    """Whether any of ``rows`` ran with --insecure-deterministic (a CSV reads it as text)."""
    return any(str(r.get("insecure_deterministic")) == "True" for r in rows)


INSECURE_MARK = "INSECURE: no privacy claim holds"


def plot_frontier(rows: list[dict], path: Path) -> list[str]:
    """Utility against the epsilon spent (log scale; the largest any client spent, mean over
    seeds; the target where nothing was spent), one line per method and protocol, mean and
    std over seeds. No DP (epsilon inf) is drawn at the right edge, past a break in the axis.
    One panel each for the fewest and the most NFE. A line with an insecure-deterministic run
    is drawn with crosses and its label says no privacy claim holds. Returns the labels."""
    columns = utility_columns(rows)
    panels = list(dict.fromkeys([columns[0], columns[-1]]))
    finite = [_spent(r) for r in rows if r["epsilon"] != "inf"]
    edge = max(finite) * 4 if finite else 1.0  # where inf is drawn
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    lines = _lines(rows)
    for ax, column in zip(axes[0], panels, strict=True):
        for index, (method, protocol) in enumerate(lines):
            mine = [r for r in rows if (r["method"], r["protocol"]) == (method, protocol)]
            points = []  # (x, mean, std), finite epsilons by x, then inf
            for label in dict.fromkeys(r["epsilon"] for r in mine):
                picked = [r for r in mine if r["epsilon"] == label]
                x = edge if label == "inf" else mean_std([_spent(r) for r in picked])[0]
                points.append((x, *mean_std([float(r[column]) for r in picked])))
            points.sort()
            dodge = 1 + 0.04 * (index - (len(lines) - 1) / 2)  # error bars side by side
            xs, ys, errs = ([p[i] for p in points] for i in range(3))
            xs = [x * dodge for x in xs]
            bars = ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, linestyle="none")
            color = bars[0].get_color()
            cut = len(points) - (points[-1][0] == edge)  # the finite points
            mark = f" ({INSECURE_MARK})" if _insecure(mine) else ""
            ax.plot(xs[:cut], ys[:cut], linestyle=("-", "--", ":", "-.")[index % 4],
                    marker="x" if mark else "o", color=color,
                    label=f"{method}, {protocol}{mark}")
            ax.plot(xs[max(cut - 1, 0):], ys[max(cut - 1, 0):], linestyle=(0, (1, 3)),
                    color=color)  # across the break to no DP
        ax.set_xscale("log")
        ticks = sorted({round(x, 2) for x in finite})
        ax.set_xticks([*ticks, edge], [f"{t:g}" for t in ticks] + ["no DP\n(inf)"])
        ax.minorticks_off()
        if finite:
            _break(ax, math.sqrt(max(finite) * edge))
        ax.set_xlabel("epsilon spent per client (largest, delta of the protocol)")
        ax.set_ylabel(_title(column))
        ax.set_title(f"{_title(column)} against privacy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    labels = axes[0][0].get_legend_handles_labels()[1]
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return labels


def _spent(row: dict) -> float:
    return float(row["spent_rdp"]) if row["spent_rdp"] != "" else float(row["epsilon"])


def _break(ax, x: float) -> None:
    """Two slashes on the x axis at ``x``: the axis is not continuous up to 'no DP'."""
    for shift in (0.93, 1.07):
        ax.plot([x * shift], [0], transform=ax.get_xaxis_transform(), marker=(2, 0, -45),
                markersize=12, color="black", clip_on=False)


def summary_table(rows: list[dict]) -> str:
    """Markdown: one row per method, utility column and protocol; one column per epsilon asked,
    each 'mean ± std (spent S)' over seeds, S the largest epsilon any client spent; a protocol
    with an insecure-deterministic run is marked :data:`INSECURE_MARK`."""
    labels = list(dict.fromkeys(r["epsilon"] for r in rows))
    table = []
    for column in utility_columns(rows):
        for method, protocol in _lines(rows):
            cells = []
            for label in labels:
                picked = [r for r in rows if (r["method"], r["protocol"], r["epsilon"])
                          == (method, protocol, label)]
                mean, std = mean_std([float(r[column]) for r in picked])
                spent = [float(r["spent_rdp"]) for r in picked if r["spent_rdp"] != ""]
                note = f" (spent {max(spent):.2f})" if spent else ""
                cells.append(f"{mean:.3f} ± {std:.3f}{note}")
            mine = [r for r in rows if (r["method"], r["protocol"]) == (method, protocol)]
            mark = f" ({INSECURE_MARK})" if _insecure(mine) else ""
            table.append([f"{method}, {_title(column)}", f"{protocol}{mark}", *cells])
    return markdown_table(["method", "protocol", *(f"eps {lab}" for lab in labels)], table)
