"""The sweep's summary and frontier from rows as sweep.csv holds them."""

from __future__ import annotations

import csv
import math
import statistics

from secureffm.runs import run
from secureffm.sweep import plot_frontier, summary_table
from secureffm.sweep.frontier import INSECURE_MARK, cell_row, write_csv
from secureffm.sweep.grid import Cell


def _row(method, protocol, epsilon, seed, w2, spent=""):
    return {"method": method, "protocol": protocol, "epsilon": epsilon, "seed": seed,
            "spent_rdp": spent, "w2_nfe2": w2, "w2_nfe32": w2 / 2}


ROWS = [_row("got", "dp", "8", 0, 1.0, 7.9), _row("got", "dp", "8", 1, 1.2, 7.95),
        _row("got", "dp", "inf", 0, 0.8), _row("got", "dp", "inf", 1, 0.9)]


def test_summary_is_mean_and_std_over_seeds_with_the_largest_spent():
    lines = summary_table(ROWS).splitlines()
    assert lines[0] == "| method | protocol | eps 8 | eps inf |"
    std = statistics.stdev([1.0, 1.2])
    assert lines[2] == f"| got, W2 at NFE 2 | dp | 1.100 ± {std:.3f} (spent 7.95) | " \
                       f"0.850 ± {statistics.stdev([0.8, 0.9]):.3f} |"
    assert lines[3].startswith("| got, W2 at NFE 32 | dp | 0.550 ± ")


def test_frontier_is_drawn_with_and_without_finite_epsilons(tmp_path):
    plot_frontier(ROWS, tmp_path / "both.png")
    plot_frontier(ROWS[2:], tmp_path / "inf.png")
    assert all((tmp_path / n).stat().st_size > 10_000 for n in ("both.png", "inf.png"))


def test_insecure_deterministic_cells_are_a_column_and_marked_in_the_table_and_frontier(
        tmp_path, small_config):
    """Reader: whoever quotes a sweep's table or frontier as a privacy-utility result. A cell
    run with --insecure-deterministic has no privacy; before this, sweep.csv, the table and the
    frontier said nothing of it."""
    cell = Cell("vanilla", "dp", math.inf, 0)
    folder = tmp_path / cell.name
    run(small_config(protocol="plaintext", rounds=1, eval_samples=100, trajectories=10,
                     nfe=(2,), out=str(folder)))  # small_config is insecure_deterministic
    row = cell_row(cell, folder)
    assert row["insecure_deterministic"] is True
    write_csv([row], tmp_path / "sweep.csv")
    with (tmp_path / "sweep.csv").open() as handle:
        (read,) = csv.DictReader(handle)
    assert read["insecure_deterministic"] == "True"
    rows = [{**r, "insecure_deterministic": "True"} for r in ROWS]  # as read back from CSV
    lines = summary_table(rows).splitlines()
    assert all(f"| dp ({INSECURE_MARK}) |" in line for line in lines[2:])
    assert plot_frontier(rows, tmp_path / "marked.png") == [f"got, dp ({INSECURE_MARK})"]
    assert plot_frontier(ROWS, tmp_path / "plain.png") == ["got, dp"]
    assert INSECURE_MARK not in summary_table(ROWS)
