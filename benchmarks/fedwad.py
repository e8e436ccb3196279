"""FedWAD against exact W (POT): time and relative error as the sample size grows, the shape of
Fig. 2 of Rakotomamonjy et al. (2024), measured in one run.

    .venv/bin/python benchmarks/fedwad.py --quick                  # N up to 1000 (a minute)
    .venv/bin/python benchmarks/fedwad.py                          # N up to 10,000
    .venv/bin/python benchmarks/fedwad.py --out docs/benchmarks.md # also write the tables
    .venv/bin/python benchmarks/fedwad.py --sizes 30 --figure /tmp/f.png  # seconds: a check
    .venv/bin/python benchmarks/fedwad.py --speed --out docs/benchmarks.md  # the S x K grid
    .venv/bin/python benchmarks/fedwad.py --speed --quick                   # N = 1000 (2D)
    .venv/bin/python benchmarks/fedwad.py --paper --out docs/benchmarks.md  # Fig. 2's protocol
    .venv/bin/python benchmarks/fedwad.py --paper --smoke                   # seconds: a check

Data: mu = N samples of N(0, I_d), nu = N (ratio 1:1) or N/3 (1:3) samples of N(m, I_d) with
|m| = 2 along the diagonal, so the population W_2 is 2 (the closed form). Methods: exact W_2
with POT's network simplex; FedWAD with exact interpolation (Eq. 5, pruned; only up to
``--exact-max`` samples, its support and time grow; it starts from as many atoms as the smaller
set holds); FedWAD with the barycentric approximation (Eq. 10) at S = 2, 10, 100. FedWAD runs
Algorithm 1 with all parties in one process
(``secureffm.methods.fedwad.fedwad``, default K = 20 and t ~ U(0.05, 0.95)), sequentially,
evaluating every iterate's bound. Each cell runs on the same samples as exact W; a time ratio
is FedWAD's time over exact W's in that cell; errors are |estimate / reference - 1| against the
closed form (as the paper) and against exact W. The figure goes to docs/figures/fedwad_fig2.png
(``--figure``). ``--sizes`` replaces the N values (the default test suite runs N = 30 to check
that the script works).

``--speed`` runs the S x K grid instead (issue 22): N = 5,000 in 2D (two Gaussians, N(0, I) vs
N(m, I) with |m| = 2, and a Gaussian vs a three-component mixture) and N = 1,000 in 50-D (two
Gaussians), S in {100, 200, 500, 1000}, K in {1..5}, t ~ U(0.05, 0.95) (the default) and
U(0.3, 0.7), one K = 5 run per cell whose first K iterations are the K-iteration run (the bound of
xi^(K) comes from iteration K + 1's interpolation, the same solve a final distance makes). Time
is the critical path with the two clients in parallel, measured per party in one process
(``FedWADResult.seconds``: CPU seconds of the slower client per iteration, then the server's,
then the slower client's distance to xi^(K)); exact W is ``ot.emd2`` on the same samples, CPU
seconds, in the same run. Errors are of the best evaluated bound (the reported distance) and, in
brackets, of the last iterate's.

``--paper`` runs Fig. 2's protocol instead (issue 42), on the paper's data: mu = N draws of
N(0, 0.1 I_d), nu = N or N/3 draws of N(m, 0.1 I_d) with m = (4, ..., 4) / sqrt(d) (in 2D
(4, 4) / sqrt(2)), so the closed form is |m| = 4; d = 2 and 50, ratios 1:1 and 1:3, S in
{2, 10, 100}, K = 20 (t ~ U(0.05, 0.95)), the median of 3 draws. Every method is timed in CPU
seconds (one thread): exact W (``ot.emd2`` through ``secureffm.ot.emd_cost``), FedWAD-e (Eq. 5,
xi^(0) as large as the smaller set; only up to ``--exact-max``) and FedWAD-a, each FedWAD both
sequentially (all parties' work) and on its critical path (``FedWADResult.seconds``). Errors are
of the reported (best) bound against the closed form.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from secureffm.methods.fedwad import FedWADConfig, fedwad, ground_cost  # noqa: E402
from secureffm.ot import emd_cost  # noqa: E402
from secureffm.reporting import write_block  # noqa: E402

SIZES = (100, 300, 1000, 3000, 10_000)
QUICK_SIZES = (100, 300, 1000)
DIMS = (2, 50)
RATIOS = (1, 3)
SUPPORTS = (2, 10, 100)
SHIFT = 2.0
SPEED_SUPPORTS = (100, 200, 500, 1000)
SPEED_K = 5
SPEED_T = ((0.05, 0.95), (0.3, 0.7))
SPEED_SETS = (("two Gaussians", 2, 5000), ("Gaussian vs mixture", 2, 5000),
              ("two Gaussians", 50, 1000))
QUICK_SPEED_SETS = (("two Gaussians", 2, 1000), ("Gaussian vs mixture", 2, 1000),
                    ("two Gaussians", 50, 300))
FIGURE = Path("docs/figures/fedwad_fig2.png")
PAPER_SIZES = (100, 300, 1000, 3000)
PAPER_EXACT_MAX = 1000
PAPER_DISTANCE = 4.0  # |m|, the closed form W_2 (and W_1) between the paper's two Gaussians
PAPER_VARIANCE = 0.1


def _data(n: int, ratio: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, n, ratio, dim])
    shift = np.full(dim, SHIFT / np.sqrt(dim))
    return rng.standard_normal((n, dim)), rng.standard_normal((n // ratio, dim)) + shift


def _methods(n: int, ratio: int, exact_max: int) -> list[tuple[str, FedWADConfig | None]]:
    methods: list[tuple[str, FedWADConfig | None]] = [("W (POT)", None)]
    if n <= exact_max:  # xi^(0) as large as the smaller set: a 10-atom start stalls in 50-D
        methods.append(("FedWAD-e", FedWADConfig(exact=True, support_size=n // ratio)))
    methods += [(f"FedWAD-a S={s}", FedWADConfig(support_size=s)) for s in SUPPORTS]
    return methods


def _measure(x, y, config: FedWADConfig | None, seed: int) -> tuple[float, float]:
    start = time.perf_counter()
    if config is None:
        value = emd_cost(ground_cost(x, y, 2)) ** 0.5
    else:
        value = fedwad(x, y, config, np.random.default_rng(seed)).distance
    return value, time.perf_counter() - start


def _speed_data(name: str, dim: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """N draws of N(0, I_d), and N of N(m, I_d) (|m| = 2) or of a three-component mixture."""
    rng = np.random.default_rng([seed, n, dim, len(name)])
    x = rng.standard_normal((n, dim))
    if name == "two Gaussians":
        return x, rng.standard_normal((n, dim)) + SHIFT / np.sqrt(dim)
    centers = np.zeros((3, dim))
    centers[:, 0], centers[:, 1] = (-2.0, 0.0, 3.0), (1.5, -1.0, 0.5)
    return x, 0.5 * rng.standard_normal((n, dim)) + centers[rng.integers(0, 3, n)]


def speed(sets, seed: int = 0) -> list[dict]:
    """One row per (data set, t range, S): exact W's CPU seconds and, for K = 1..SPEED_K, the
    critical-path seconds and the errors of the best and of the last bound against exact W."""
    rows = []
    for name, dim, n in tqdm(sets, desc="FedWAD S x K grid", unit="set", file=sys.stderr):
        x, y = _speed_data(name, dim, n, seed)
        start = time.process_time()
        exact = emd_cost(ground_cost(x, y, 2)) ** 0.5
        w_seconds = time.process_time() - start
        for t_range in SPEED_T:
            for s in SPEED_SUPPORTS:
                if s > n:
                    continue
                found = fedwad(x, y, FedWADConfig(iterations=SPEED_K, support_size=s,
                                                  t_range=t_range, seed=seed))
                bounds = np.array(found.iterates)
                rows.append({"set": name, "dim": dim, "n": n, "t": t_range, "S": s,
                             "exact": exact, "w_seconds": w_seconds,
                             "best": np.minimum.accumulate(bounds) / exact - 1,
                             "last": bounds / exact - 1,
                             "ratio": np.array(found.seconds) / w_seconds})
    return rows


def speed_tables(rows: list[dict]) -> str:
    out = []
    for name, dim, n in dict.fromkeys((r["set"], r["dim"], r["n"]) for r in rows):
        part = [r for r in rows if (r["set"], r["dim"], r["n"]) == (name, dim, n)]
        out.append(f"**{name}, d = {dim}, N = {n:,} vs {n:,}** (exact W_2 {part[0]['exact']:.4f}"
                   f" in {part[0]['w_seconds']:.2f} s CPU; each cell: critical-path time over "
                   "exact W's, error of the best bound vs exact W, last iterate's in brackets)\n")
        out.append("| t range | S | " + " | ".join(f"K = {k}" for k in range(1, SPEED_K + 1))
                   + " |")
        out.append("| --- " * (SPEED_K + 2) + "|")
        for r in part:
            cells = [f"{r['ratio'][k]:.2f}x, {r['best'][k]:.2%} ({r['last'][k]:.2%})"
                     for k in range(1, SPEED_K + 1)]
            out.append(f"| {r['t'][0]:g}-{r['t'][1]:g} | {r['S']} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def paper_data(n: int, ratio: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's pair: N draws of N(0, 0.1 I_d) and N / ratio of N(m, 0.1 I_d), |m| = 4."""
    rng = np.random.default_rng([seed, n, ratio, dim, 42])
    scale = np.sqrt(PAPER_VARIANCE)
    shift = np.full(dim, PAPER_DISTANCE / np.sqrt(dim))
    return (scale * rng.standard_normal((n, dim)),
            scale * rng.standard_normal((n // ratio, dim)) + shift)


def _grid(sizes, repeats: int, exact_max: int, data, measure, desc: str) -> dict:
    """results[(dim, ratio, n, method)] = the medians over ``repeats`` draws of
    ``measure(x, y, config, rep, exact)``'s row (``exact``: exact W's value on that draw, the
    first method); ``data(n, ratio, dim, rep)`` draws the pair."""
    cells = [(d, r, n) for d in DIMS for r in RATIOS for n in sizes]
    results = {}
    bar = tqdm(total=sum(len(_methods(n, r, exact_max)) for _, r, n in cells) * repeats,
               desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)
    for dim, ratio, n in cells:
        runs: dict[str, list[tuple[float, float, float]]] = {}
        for rep in range(repeats):
            x, y = data(n, ratio, dim, rep)
            exact = None
            for name, config in _methods(n, ratio, exact_max):
                bar.set_postfix_str(f"d={dim} 1:{ratio} N={n} {name}")
                row, value = measure(x, y, config, rep, exact)
                exact = value if config is None else exact
                runs.setdefault(name, []).append(row)
                bar.update()
        for name, values in runs.items():
            results[(dim, ratio, n, name)] = tuple(statistics.median(c)
                                                   for c in zip(*values, strict=True))
    bar.close()
    return results


def paper(sizes, repeats: int, exact_max: int) -> dict:
    """results[(dim, ratio, n, method)] = (median sequential CPU s, median critical-path CPU s,
    median error vs the closed form); exact W's two times are equal."""
    def measure(x, y, config, rep, exact):
        start = time.process_time()
        if config is None:
            value = emd_cost(ground_cost(x, y, 2)) ** 0.5
            path = time.process_time() - start
        else:
            found = fedwad(x, y, config, np.random.default_rng(rep))
            value, path = found.distance, found.seconds[-1]
        return (time.process_time() - start, path, abs(value / PAPER_DISTANCE - 1)), value

    emd_cost(ground_cost(*paper_data(10, 1, 2, 0), 2))  # the first solve loads POT's solver
    return _grid(sizes, repeats, exact_max, paper_data, measure, "FedWAD, Fig. 2's protocol")


def paper_tables(results: dict, sizes, exact_max: int) -> str:
    def cell(found: tuple, w_time: float) -> str:
        w_time = max(w_time, 1e-6)  # CPU clock ticks: a tiny solve may read 0
        return f"{found[0] / w_time:.2f}x / {found[1] / w_time:.2f}x, {found[2]:.2%}"

    return _grid_tables(results, sizes, exact_max,
                        "exact W: CPU seconds and error vs the closed form 4; FedWAD: sequential "
                        "time over exact W's / critical path's over exact W's, error vs the "
                        "closed form", ["W (POT) s", "W error"],
                        lambda w: [f"{w[0]:.3f}", f"{w[2]:.2%}"], cell)


def _grid_tables(results: dict, sizes, exact_max: int, caption: str, w_columns: list[str],
                 w_cells, cell) -> str:
    """One table per (d, ratio) of ``results``: a row per N, exact W's columns ``w_columns``
    filled by ``w_cells(exact W's result)``, then each FedWAD variant's
    ``cell(its result, exact W's seconds)``."""
    names = [name for name, _ in _methods(min(sizes), 1, exact_max)]
    out = []
    for dim in DIMS:
        for ratio in RATIOS:
            out.append(f"**d = {dim}, ratio 1:{ratio}** ({caption})\n")
            out.append("| N | " + " | ".join(w_columns + names[1:]) + " |")
            out.append("| --- " * (len(names) + 2) + "|")
            for n in sizes:
                exact = results[(dim, ratio, n, "W (POT)")]
                row = [f"{n:,}", *w_cells(exact)]
                for name in names[1:]:
                    found = results.get((dim, ratio, n, name))
                    row.append("not run" if found is None else cell(found, exact[0]))
                out.append("| " + " | ".join(row) + " |")
            out.append("")
    return "\n".join(out)


def run(sizes, repeats: int, exact_max: int) -> dict:
    """results[(dim, ratio, n, method)] = (median seconds, median error vs closed form, median
    error vs exact W)."""
    def measure(x, y, config, rep, exact):
        value, seconds = _measure(x, y, config, rep)
        exact = value if config is None else exact
        return (seconds, abs(value / SHIFT - 1), abs(value / exact - 1)), value

    return _grid(sizes, repeats, exact_max, _data, measure, "FedWAD benchmark")


def tables(results: dict, sizes, exact_max: int) -> str:
    return _grid_tables(results, sizes, exact_max,
                        "time over exact W's time; error vs exact W, and vs the closed form 2 "
                        "in brackets", ["W (POT) s", "W error vs closed form"],
                        lambda w: [f"{w[0]:.3f}", f"{w[1]:.1%}"],
                        lambda found, w_time: (f"{found[0] / w_time:.2f}x, {found[2]:.2%} "
                                               f"({found[1]:.1%})"))


def figure(results: dict, sizes, exact_max: int, path: Path) -> None:
    names = [name for name, _ in _methods(min(sizes), 1, exact_max)]
    fig, axes = plt.subplots(len(DIMS), 2 * len(RATIOS), figsize=(16, 7))
    for i, dim in enumerate(DIMS):
        for j, ratio in enumerate(RATIOS):
            timing, error = axes[i, 2 * j], axes[i, 2 * j + 1]
            for name in names:
                ns = [n for n in sizes if (dim, ratio, n, name) in results]
                cells = [results[(dim, ratio, n, name)] for n in ns]
                style = {"marker": "o", "linestyle": "--" if name == "W (POT)" else "-"}
                timing.plot(ns, [c[0] for c in cells], label=name, **style)
                error.plot(ns, [max(c[1], 1e-5) for c in cells], label=name, **style)
            timing.set(title=f"time, d = {dim}, 1:{ratio}", ylabel="seconds")
            error.set(title=f"relative error vs closed form, d = {dim}, 1:{ratio}")
            for ax in (timing, error):
                ax.set(xscale="log", yscale="log", xlabel="N (samples of mu)")
                ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Exact W (POT) vs FedWAD: two Gaussians N(0, I), N(m, I), |m| = 2, K = 20")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help=f"N in {QUICK_SIZES} only")
    parser.add_argument("--repeats", type=int,
                        help="data draws per cell (median; default 1, with --paper 3)")
    parser.add_argument("--exact-max", type=int, default=1000,
                        help="largest N for exact-interpolation FedWAD")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--sizes", type=int, nargs="+",
                        help=f"N values (default {SIZES}; {QUICK_SIZES} with --quick)")
    parser.add_argument("--speed", action="store_true",
                        help="the S x K grid with critical-path times instead (--sizes: N of "
                             "every set)")
    parser.add_argument("--dims", type=int, nargs="+",
                        help="with --speed: only the sets of these dimensions")
    parser.add_argument("--paper", action="store_true",
                        help=f"Fig. 2's protocol on the paper's data (N in {PAPER_SIZES}, 3 "
                             f"draws, FedWAD-e up to N = {PAPER_EXACT_MAX})")
    parser.add_argument("--smoke", action="store_true",
                        help="with --paper: N = 30, one draw (checks that the script works)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.paper:
        sizes = (30,) if args.smoke else tuple(args.sizes or PAPER_SIZES)
        repeats = 1 if args.smoke else args.repeats or 3
        exact_max = max(sizes) if args.smoke else PAPER_EXACT_MAX
        text = paper_tables(paper(sizes, repeats, exact_max), sizes, exact_max)
        print(text)
        if args.out:
            flags = " --smoke" if args.smoke else (
                f" --sizes {' '.join(map(str, sizes))}" if args.sizes else "")
            flags += f" --repeats {args.repeats}" if args.repeats else ""
            note = (f"Measured by `benchmarks/fedwad.py --paper{flags}` ({repeats} draw(s) per "
                    "cell, median), one process, one thread, CPU seconds.\n\n")
            # the default grid, and other sizes in a block of their own
            block = "fedwad_paper" + (f"_n{'_'.join(map(str, sizes))}" if args.sizes else "")
            write_block(args.out, block, note + text, title="# Benchmarks")
        return
    if args.speed:
        sets = QUICK_SPEED_SETS if args.quick else SPEED_SETS
        if args.sizes:
            sets = tuple((name, dim, args.sizes[0]) for name, dim, _ in sets)
        if args.dims:
            sets = tuple(item for item in sets if item[1] in args.dims)
        text = speed_tables(speed(sets))
        print(text)
        if args.out:
            flags = " --quick" if args.quick else ""
            flags += f" --sizes {args.sizes[0]}" if args.sizes else ""
            flags += f" --dims {' '.join(map(str, args.dims))}" if args.dims else ""
            note = (f"Measured by `benchmarks/fedwad.py --speed{flags}`, one process, one "
                    "thread, CPU seconds.\n\n")
            # the default grid, and each other size in a block of its own
            block = "fedwad_speed" + (f"_n{args.sizes[0]}" if args.sizes else "")
            write_block(args.out, block, note + text, title="# Benchmarks")
        return
    sizes = tuple(args.sizes) if args.sizes else QUICK_SIZES if args.quick else SIZES
    results = run(sizes, args.repeats or 1, args.exact_max)
    text = tables(results, sizes, args.exact_max)
    print(text)
    figure(results, sizes, args.exact_max, args.figure)
    if args.out:
        flags = (" --quick" if args.quick else "") + (
            f" --sizes {' '.join(map(str, sizes))}" if args.sizes else "")
        note = (f"Measured by `benchmarks/fedwad.py{flags}` "
                f"({args.repeats or 1} draw(s) per cell, median), one process, one thread.\n\n")
        write_block(args.out, "fedwad", note + text, title="# Benchmarks")


if __name__ == "__main__":
    main()
