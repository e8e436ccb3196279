"""A run on the clients' own tables against the README's main job: training seconds per round,
and a client's evaluation (``evaluate_table``) at 10^5 rows.

    .venv/bin/python benchmarks/tabular.py                            # a few rounds each (minutes)
    .venv/bin/python benchmarks/tabular.py --out docs/benchmarks.md   # also write the tables
    .venv/bin/python benchmarks/tabular.py --smoke                    # seconds: a check only

Training: each job is ``secureffm run --protocol dp-secagg --method got`` through the command
line's entry point (``secureffm.cli.main``, in this process), ``--rounds`` rounds each, one after
another in this same invocation so that they share the machine's load; seconds per round are the
run's
``train_seconds / rounds`` (metrics.json: set-up, DP calibration and evaluation excluded). Jobs:

- the main job: 8 Gaussians -> moons, 2 clients, every training option at its default;
- breast-cancer: the three silos of ``experiments/tabular.py`` (30 features + the binary
  target, 151-152 training rows each), batch 32 per client, as the experiment runs them;
- wine at 10^5 rows per client: three clients' tables of 100,000 rows each drawn from the wine
  table (rows resampled with replacement, each numeric value jittered by 2% of its column's
  range and clipped into the public bounds), at the main job's batch and delta 1e-6 (the
  spec's 1e-5 is refused for 80,000 training rows: not well below 1/N).

Evaluation: one client of the wine tables above, 10^5 rows held as 80,000 training and 20,000
held-out rows (the CLI's 0.2), scores 100,000 synthetic rows (drawn the same way from another
seed) with ``evaluate_table`` and ML efficacy for ``cultivar``: wall seconds and the peak of the
memory allocated during the call (``tracemalloc``: numpy's and Python's allocations). Markdown
to stdout and, with ``--out``, between the ``<!-- tabular:begin -->`` and ``<!-- tabular:end
-->`` markers of that file. ``--smoke`` runs 2 rounds per job and 2,000 rows per client: it
checks that the script runs; its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secureffm.cli import main as secureffm_cli  # noqa: E402
from secureffm.data.files import write_table  # noqa: E402
from secureffm.data.schema import Schema  # noqa: E402
from secureffm.data.silo import holdout_split  # noqa: E402
from secureffm.metrics.tabular import evaluate_table  # noqa: E402
from secureffm.reporting import markdown_table, write_block  # noqa: E402

__all__ = ["main"]

JOB = ["run", "--protocol", "dp-secagg", "--method", "got"]
QUICK_EVAL = ["--eval-samples", "200", "--nfe", "2", "--trajectories", "10"]
ROWS, BATCH = 100_000, 1024  # rows per client; the main job's batch


def _experiment():
    """experiments/tabular.py as a module (its data sets and silos)."""
    spec = importlib.util.spec_from_file_location("tabular_experiment",
                                                  ROOT / "experiments" / "tabular.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def large_table(rows: int, seed: int) -> tuple[dict[str, np.ndarray], Schema]:
    """``rows`` rows drawn from the wine table (module docstring) and the wine schema."""
    table, schema = _experiment().table_and_schema("wine")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(table["cultivar"]), rows)
    drawn = {}
    for column in schema.columns:
        values = table[column.name][pick]
        if column.numeric:
            spread = 0.02 * (column.high - column.low)
            values = np.clip(values + rng.normal(0.0, spread, rows), column.low, column.high)
            values = np.round(values).astype(np.int64) if column.type == "integer" else values
        drawn[column.name] = values
    return drawn, schema


def run_job(args: list[str], folder: Path) -> dict:
    """``secureffm`` with ``args``, its run in ``folder``/run; returns metrics.json. What the
    command line prints goes to stderr (stdout carries the tables)."""
    command = [*args, "--out", str(folder / "run"), "--no-progress"]
    with contextlib.redirect_stdout(sys.stderr):
        code = secureffm_cli(command)
    if code != 0:
        raise SystemExit(f"secureffm {' '.join(command)} failed")
    return json.loads((folder / "run" / "metrics.json").read_text())


def _table_args(files: list[Path], schema: Path, target: str, shard: int, batch: int) -> list:
    return [*JOB, "--clients", str(len(files)),
            *[a for f in files for a in ("--client-data", str(f))], "--schema", str(schema),
            "--shard-size", str(shard), "--batch-size", str(batch), "--target-column", target,
            "--eval-samples", "200", "--nfe", "2"]


def training(rounds: int, rows: int, folder: Path) -> list[tuple[str, dict]]:
    """(job, metrics) of the three jobs (module docstring), ``rounds`` rounds each."""
    steps = ["--rounds", str(rounds)]
    jobs = []
    main_job = folder / "main"
    main_job.mkdir()
    print("the main job ...", file=sys.stderr, flush=True)
    jobs.append(("main job: 8gaussians-moons, 2 clients, batch 1024",
                 run_job([*JOB, *steps, *QUICK_EVAL], main_job)))
    cancer = folder / "breast-cancer"
    files = [path for path, _ in _experiment().write_silos("breast-cancer", cancer)]
    schema = cancer / "breast-cancer" / "schema.toml"
    print("breast-cancer ...", file=sys.stderr, flush=True)
    jobs.append(("breast-cancer: 3 silos (~151 training rows), batch 32",
                 run_job([*_table_args(files, schema, "benign", 151, 32), *steps], cancer)))
    wine = folder / "wine"
    wine.mkdir()
    files = []
    for k in range(3):
        table, wine_schema = large_table(rows, k)
        files.append(wine / f"client-{k + 1}.csv")
        write_table(table, files[-1])
    (wine / "schema.toml").write_text(wine_schema.to_toml())
    batch = min(BATCH, int(0.8 * rows))
    print(f"wine at {rows:,} rows per client ...", file=sys.stderr, flush=True)
    jobs.append((f"wine: 3 clients of {rows:,} rows, batch {batch}",
                 run_job([*_table_args(files, wine / "schema.toml", "cultivar",
                                       int(0.8 * rows), batch), *steps, "--delta", "1e-6"],
                         wine)))
    return jobs


def evaluation(rows: int) -> dict[str, float]:
    """One client's evaluate_table at ``rows`` rows (module docstring): seconds, peak MB."""
    table, schema = large_table(rows, 10)
    synthetic, _ = large_table(rows, 11)
    train_rows, held_rows = holdout_split(rows, 0.2, 0)
    train = {n: v[train_rows] for n, v in table.items()}
    held = {n: v[held_rows] for n, v in table.items()}
    tracemalloc.start()
    started = time.perf_counter()
    report = evaluate_table(held, synthetic, schema, train=train, target_column="cultivar")
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "peak_mb": peak / 1e6, "holdout": len(held_rows),
            "train": len(train_rows), "synthetic": rows, "w2_samples": report.w2_samples}


def report(jobs: list[tuple[str, dict]], ev: dict, command: str, load: tuple) -> str:
    base = jobs[0][1]["seconds_per_round"]
    rows = [[name, m["rounds"], f"{1e3 * m['seconds_per_round']:.1f}",
             f"{m['seconds_per_round'] / base:.2f}"] for name, m in jobs]
    return "\n".join([
        f"Written by `.venv/bin/python {command}` on {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}); "
        f"1-minute load average {load[0]:.1f} before and {load[1]:.1f} after (other work ran "
        "meanwhile: compare the rows with each other, measured in the same invocation).",
        "",
        "### `secureffm run --protocol dp-secagg --method got`: training per round",
        "",
        markdown_table(["job", "rounds", "ms per round", "x the main job"], rows),
        "",
        f"### A client's evaluation at {ev['train'] + ev['holdout']:,} rows (wine schema)",
        "",
        markdown_table(["held-out rows", "training rows", "synthetic rows", "W2 rows",
                        "seconds", "peak allocated MB"],
                       [[f"{ev['holdout']:,}", f"{ev['train']:,}", f"{ev['synthetic']:,}",
                         f"{ev['w2_samples']:,}", f"{ev['seconds']:.1f}",
                         f"{ev['peak_mb']:.0f}"]]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rounds", type=int, default=20, help="rounds per job (default 20)")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--smoke", action="store_true", help="2 rounds, 2,000 rows per "
                        "client: checks that the script runs (seconds); not measurements")
    args = parser.parse_args()
    rounds, rows = (2, 2_000) if args.smoke else (args.rounds, ROWS)
    command = "benchmarks/tabular.py" + (" --smoke" if args.smoke else "") + (
        f" --rounds {args.rounds}" if args.rounds != 20 and not args.smoke else "")
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        jobs = training(rounds, rows, Path(folder))
    print("evaluation ...", file=sys.stderr, flush=True)
    ev = evaluation(rows)
    text = report(jobs, ev, command, (before, os.getloadavg()[0]))
    print(text)
    if args.out:
        write_block(args.out, "tabular", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
