"""The README's main job end to end: wall time and peak resident memory of
``secureffm run --protocol dp-secagg --method got`` (every other option at its default), run in
a fresh interpreter as a user runs it, and where its time goes.

    .venv/bin/python benchmarks/main_job.py                            # the main job (minutes)
    .venv/bin/python benchmarks/main_job.py --repeats 2                # run it twice
    .venv/bin/python benchmarks/main_job.py --profile                  # and once under cProfile
    .venv/bin/python benchmarks/main_job.py --out docs/benchmarks.md   # also write the table
    .venv/bin/python benchmarks/main_job.py --smoke                    # seconds: a check only

Each run is a child process (this checkout's ``secureffm.cli`` on PYTHONPATH) writing its run
folder into a temporary directory. Wall time is the child's, from start to exit; peak memory is
the child's peak resident set size from ``os.wait4`` (``ru_maxrss``). The parts come from the
run's metrics.json: set-up (data, parties, the DP calibration), training, evaluation (sampling,
straightness, exact W2, the potential's health and the trajectories) and the privacy accounting;
the rest is the interpreter's start and imports, the log's closing and the files and plots.
``--profile`` adds one more run under cProfile (``python -m cProfile -m secureffm``; its
per-call overhead inflates Python-heavy functions, so only its shares are quoted): the
library's functions by cumulative time and all functions by own time.
The child's progress bars go to this script's stderr, the tables (markdown) to stdout and, with
``--out``, between the ``<!-- main-job:begin -->`` and ``<!-- main-job:end -->`` markers of
that file. ``--smoke`` runs 2 rounds at batch 64 with a given noise multiplier and 100
evaluation points: the default test suite runs it to check that the script works; its numbers
are not measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secureffm.reporting import markdown_table, write_block  # noqa: E402

__all__ = ["main"]

JOB = ["run", "--protocol", "dp-secagg", "--method", "got"]
CLI = "import sys; from secureffm.cli import main; sys.exit(main(sys.argv[1:]))"
SMOKE = ["--rounds", "2", "--batch-size", "64", "--noise-multiplier", "4", "--eval-samples",
         "100", "--nfe", "1,2", "--trajectories", "10"]
TARGET_S, TARGET_GB = 180.0, 1.5


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_job(extra: list[str], folder: Path, profile: Path | None = None) -> dict:
    """Run the main job with ``extra`` options into ``folder``/run (under cProfile, writing
    ``profile``, when given); returns its wall seconds, peak RSS in bytes and metrics.json.
    The child's output goes to this process's stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = (["-m", "cProfile", "-o", str(profile), "-m", "secureffm"] if profile
             else ["-c", CLI])
    command = [sys.executable, *start, *JOB, "--out", str(folder / "run"), *extra]
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=folder, env=env, stdout=sys.stderr, stderr=sys.stderr)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"the main job exited with {child.returncode}: {' '.join(command)}")
    metrics = json.loads((folder / "run" / "metrics.json").read_text())
    return {"wall": wall, "peak_rss": usage.ru_maxrss * 1024, "metrics": metrics}


def _parts(job: dict) -> list[tuple[str, float]]:
    """(part, seconds) of one run, the remainder last."""
    m, ev = job["metrics"], job["metrics"]["eval"]["seconds"]
    eval_rest = m["eval_seconds"] - sum(ev.values())
    parts = [("set-up (data, parties, DP calibration)", m["setup_seconds"]),
             (f"training ({m['rounds']} rounds)", m["train_seconds"]),
             ("evaluation: sampling (Euler NFEs, dopri5)", ev["sampling"]),
             ("evaluation: straightness", ev["straightness"]),
             ("evaluation: exact W2", ev["w2"]),
             ("evaluation: potential health, trajectories", eval_rest),
             ("privacy accounting (privacy.json)", m["privacy_seconds"])]
    rest = job["wall"] - sum(s for _, s in parts)
    return parts + [("interpreter start, imports, log closing, files and plots", rest)]


def _where(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return f"`{name.strip('<>')}`"
    parts = filename.replace("\\", "/").split("/")
    return f"`{name}` ({'/'.join(parts[-2:])}:{line})"


def _profile_tables(path: Path, top: int) -> str:
    """The library's functions (not its module imports) by cumulative time, and every function
    by own time (shares of the profiled run's total)."""
    stats = pstats.Stats(str(path)).stats
    total = max(entry[3] for entry in stats.values())  # the outermost call's cumulative time
    ours = [(f, e) for f, e in stats.items()  # imports are a part of their own above
            if "/secureffm/" in f[0].replace("\\", "/") and f[2] != "<module>"]
    by_cumulative = sorted(ours, key=lambda fe: -fe[1][3])[:top]
    by_own = sorted(stats.items(), key=lambda fe: -fe[1][2])[:top]
    rows_c = [[_where(f), f"{e[1]:,}", f"{e[3]:.1f}", f"{100 * e[3] / total:.1f}%"]
              for f, e in by_cumulative]
    rows_o = [[_where(f), f"{e[1]:,}", f"{e[2]:.1f}", f"{100 * e[2] / total:.1f}%"]
              for f, e in by_own]
    return "\n".join([
        f"Library functions by cumulative time (top {top}; the profiled run took {total:.0f} s):",
        "", markdown_table(["function", "calls", "cumulative s", "share"], rows_c), "",
        f"All functions by own time (top {top}):", "",
        markdown_table(["function", "calls", "own s", "share"], rows_o)])


def _report(jobs: list[dict], command: str, load: tuple[float, float], profile: str) -> str:
    runs = [f"run {i + 1}" for i in range(len(jobs))]
    summary = [["wall time", *(f"{j['wall']:.1f} s" for j in jobs), f"<= {TARGET_S:.0f} s"],
               ["peak resident memory", *(f"{j['peak_rss'] / 1e9:.2f} GB" for j in jobs),
                f"<= {TARGET_GB} GB"]]
    summary += [[name, *(f"{dict(_parts(j))[name]:.1f} s" for j in jobs), ""]
                for name, _ in _parts(jobs[0])]
    summary.append(["training, ms per round",
                    *(f"{1e3 * j['metrics']['seconds_per_round']:.1f}" for j in jobs), ""])
    ev = jobs[0]["metrics"]["eval"]
    nfes = list(ev["w2"])
    w2_rows = [[runs[i], *(f"{j['metrics']['eval']['w2'][n]:.3f}" for n in nfes),
                f"{j['metrics']['eval']['adaptive']['w2']:.3f}",
                f"{j['metrics']['eval']['iid_floor']:.3f}"] for i, j in enumerate(jobs)]
    return "\n".join([
        f"Written by `.venv/bin/python {command}` on {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}); "
        f"1-minute load average {load[0]:.1f} before and {load[1]:.1f} after (other work ran "
        "meanwhile: wall times are noisy).",
        "",
        f"### `secureffm {' '.join(JOB)}`: wall time, peak memory, parts",
        "",
        markdown_table(["measure", *runs, "target"], summary),
        "",
        f"### W2 of the main job ({ev['eval_samples']:,} generated vs {ev['eval_samples']:,} "
        "held-out target points, exact) and the i.i.d. floor at that size",
        "",
        markdown_table(["run", *(f"NFE {n}" for n in nfes), f"{ev['adaptive']['solver']}",
                "i.i.d. floor"], w2_rows),
    ] + (["", "### Profile of one more run (cProfile)", "", profile] if profile else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=1, help="runs of the job, one after another")
    parser.add_argument("--profile", action="store_true",
                        help="one more run under cProfile: where the time goes, by function")
    parser.add_argument("--top", type=int, default=25, help="functions listed in the profile")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--smoke", action="store_true",
                        help="2 rounds, 100 evaluation points: checks that the script runs "
                             "(seconds); the numbers are not measurements")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    command = "benchmarks/main_job.py" + (" --smoke" if args.smoke else "") + (
        f" --repeats {args.repeats}" if args.repeats > 1 else "") + (
        " --profile" if args.profile else "")
    extra = SMOKE if args.smoke else []
    before = os.getloadavg()[0]
    jobs = []
    for i in range(args.repeats):
        _say(f"main job, run {i + 1} of {args.repeats} ...")
        with tempfile.TemporaryDirectory() as folder:
            jobs.append(run_job(extra, Path(folder)))
    profile = ""
    if args.profile:
        _say("main job under cProfile ...")
        with tempfile.TemporaryDirectory() as folder:
            run_job(extra, Path(folder), Path(folder) / "job.prof")
            profile = _profile_tables(Path(folder) / "job.prof", args.top)
    text = _report(jobs, command, (before, os.getloadavg()[0]), profile)
    print(text)
    if args.out:
        write_block(args.out, "main-job", text, title="# Benchmarks")
        _say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
