"""Running a sweep: every cell not finished earlier, ``workers`` at a time, then the CSV and the
frontier.

A cell is finished when its run folder holds metrics.json (written last) and the config.toml
recorded there equals the cell's settings, apart from those that change only how a run goes
(``out``, ``overwrite``, ``progress``, ``threads``): a changed setting re-runs the cell instead
of reusing a stale one, and a run cut short (no metrics.json) runs again from the start.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig, load_config
from ..errors import SecureFFMError
from .frontier import ATTACKS_FILE, cell_row, plot_frontier, write_csv
from .grid import Cell, SweepSpec

__all__ = ["run_sweep", "SweepResult", "is_finished"]

# Settings that change how a run goes, not what it computes: not compared.
_HOW = {"out": "", "overwrite": False, "progress": False, "threads": 1}


@dataclass(frozen=True)
class SweepResult:
    """The rows of sweep.csv (one per cell, grid order), the cells run and those reused, and
    where the CSV and the frontier are."""

    rows: list[dict]
    ran: list[str]
    skipped: list[str]
    csv: Path
    figure: Path


@dataclass(frozen=True)
class _Job:
    cell: Cell
    config: RunConfig
    train: bool
    attacks: tuple[str, ...]


def is_finished(config: RunConfig) -> bool:
    """Whether ``config.out`` holds a finished run of ``config`` (see the module docstring)."""
    folder = Path(config.out)
    if not (folder / "metrics.json").is_file():
        return False
    try:
        recorded = load_config(folder / "config.toml")
    except SecureFFMError:  # missing, or written by a version with other settings
        return False
    return dataclasses.replace(recorded, **_HOW) == dataclasses.replace(config, **_HOW)


def run_sweep(spec: SweepSpec, log: Callable[[str], None] = print) -> SweepResult:
    """Run the cells of ``spec`` not finished earlier (and the attacks asked of each), printing
    a line per cell started and finished; write ``root``/sweep.csv and ``root``/frontier.png.
    A cell whose run fails does not stop the others; the sweep then raises, naming it."""
    if spec.attacks:
        _attack_function(spec.attacks)  # before any cell runs
    jobs, skipped = [], []
    for cell in spec.cells():
        config = spec.config(cell)
        train = not is_finished(config)
        done = set() if train else _attacks_done(Path(config.out))
        missing = tuple(a for a in spec.attacks if a not in done)
        if train or missing:
            jobs.append(_Job(cell, config, train, missing))
        else:
            skipped.append(cell.name)
    log(f"sweep {spec.root}: {len(jobs) + len(skipped)} cells, {len(skipped)} finished earlier "
        f"(reused), {len(jobs)} to run, {spec.workers} at a time")
    if spec.attacks:
        log(f"attacks {', '.join(spec.attacks)}: every cell keeps its payloads "
            "(keep_payloads = true), which the attacks read")
    begun = time.monotonic()
    started = iter(range(1, len(jobs) + 1))

    def start(job: _Job) -> None:
        what = "run" if job.train else "attacks only"
        log(f"[start {next(started)}/{len(jobs)}] {job.cell.name} ({what}) "
            f"at {time.monotonic() - begun:.0f} s")

    failed = {}
    for count, (job, error) in enumerate(_outcomes(jobs, spec.workers, start), 1):
        status = "done" if error is None else "FAILED"
        log(f"[{status} {count}/{len(jobs)}] {job.cell.name} at {time.monotonic() - begun:.0f} s"
            + (f": {error}" if error else ""))
        if error:
            failed[job.cell.name] = error
    rows = [cell_row(c, spec.root / c.name, spec.attacks) for c in spec.cells()
            if c.name not in failed]
    spec.root.mkdir(parents=True, exist_ok=True)
    result = SweepResult(rows, [j.cell.name for j in jobs if j.cell.name not in failed],
                         skipped, spec.root / "sweep.csv", spec.root / "frontier.png")
    if rows:
        write_csv(rows, result.csv)
        plot_frontier(rows, result.figure)
    if failed:
        name, error = next(iter(failed.items()))
        raise SecureFFMError(f"{len(failed)} of {len(jobs)} cells failed (the others are in "
                             f"{result.csv}); first, {name}: {error}")
    return result


def _outcomes(jobs: list[_Job], workers: int,
              start: Callable[[_Job], None]) -> Iterator[tuple[_Job, str | None]]:
    """Each job with its error (None when it finished), as they finish. One worker: in this
    process; more: that many processes, a job handed out only when one is free (so 'start'
    means started)."""
    if workers == 1:
        for job in jobs:
            start(job)
            yield job, _run_job(job)
        return
    queue = iter(jobs)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running = {}

        def refill() -> None:
            while len(running) < workers and (job := next(queue, None)) is not None:
                start(job)
                running[pool.submit(_run_job, job)] = job

        refill()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                yield running.pop(future), future.result()
            refill()


def _run_job(job: _Job) -> str | None:
    """Train the cell if asked, then run its missing attacks; the error a user can act on, or
    None."""
    from ..runs import run

    folder = Path(job.config.out)
    try:
        if job.train:
            (folder / ATTACKS_FILE).unlink(missing_ok=True)  # about the run being replaced
            run(job.config)
        if job.attacks:
            run_attack = _attack_function(job.attacks)
            found = _attacks_done(folder)
            for name in job.attacks:
                found[name] = {k: float(v) for k, v in run_attack(folder, name).items()}
            (folder / ATTACKS_FILE).write_text(json.dumps(found, indent=1))
    except SecureFFMError as err:
        return str(err)
    return None


def _attacks_done(folder: Path) -> dict:
    path = folder / ATTACKS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _attack_function(names: tuple[str, ...]):
    """``secureffm.audit.attacks.run_attack(run_dir, name) -> {metric: value}``, after
    checking every name in ``names`` is a known attack."""
    from ..audit.attacks import ATTACKS, run_attack

    unknown = [name for name in names if name not in ATTACKS]
    if unknown:
        raise SecureFFMError(f"attacks = {list(names)!r}: {unknown[0]!r} is not an attack of "
                             f"secureffm.audit.attacks; use one of {', '.join(ATTACKS)}")
    return run_attack
