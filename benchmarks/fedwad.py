"""FedWAD against exact W (POT): time and relative error as the sample size grows, the shape of
Fig. 2 of Rakotomamonjy et al. (2024), measured in one run.

    .venv/bin/python benchmarks/fedwad.py --quick                  # N up to 1000 (a minute)
    .venv/bin/python benchmarks/fedwad.py                          # N up to 10,000
    .venv/bin/python benchmarks/fedwad.py --out docs/benchmarks.md # also write the tables
    .venv/bin/python benchmarks/fedwad.py --sizes 30 --figure /tmp/f.png  # seconds: a check

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
FIGURE = Path("docs/figures/fedwad_fig2.png")


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


def run(sizes, repeats: int, exact_max: int) -> dict:
    """results[(dim, ratio, n, method)] = (median seconds, median error vs closed form, median
    error vs exact W)."""
    cells = [(d, r, n) for d in DIMS for r in RATIOS for n in sizes]
    results = {}
    bar = tqdm(total=sum(len(_methods(n, r, exact_max)) for _, r, n in cells) * repeats,
               desc="FedWAD benchmark", unit="run", file=sys.stderr, dynamic_ncols=True)
    for dim, ratio, n in cells:
        runs: dict[str, list[tuple[float, float, float]]] = {}
        for rep in range(repeats):
            x, y = _data(n, ratio, dim, rep)
            exact = None
            for name, config in _methods(n, ratio, exact_max):
                bar.set_postfix_str(f"d={dim} 1:{ratio} N={n} {name}")
                value, seconds = _measure(x, y, config, rep)
                exact = value if config is None else exact
                runs.setdefault(name, []).append(
                    (seconds, abs(value / SHIFT - 1), abs(value / exact - 1)))
                bar.update()
        for name, values in runs.items():
            columns = zip(*values, strict=True)
            results[(dim, ratio, n, name)] = tuple(statistics.median(c) for c in columns)
    bar.close()
    return results


def tables(results: dict, sizes, exact_max: int) -> str:
    names = [name for name, _ in _methods(min(sizes), 1, exact_max)]
    out = []
    for dim in DIMS:
        for ratio in RATIOS:
            out.append(f"**d = {dim}, ratio 1:{ratio}** (time over exact W's time; error vs exact "
                       "W, and vs the closed form 2 in brackets)\n")
            out.append("| N | W (POT) s | W error vs closed form | "
                       + " | ".join(names[1:]) + " |")
            out.append("| --- " * (len(names) + 2) + "|")
            for n in sizes:
                w_time, w_cf, _ = results[(dim, ratio, n, "W (POT)")]
                row = [f"{n:,}", f"{w_time:.3f}", f"{w_cf:.1%}"]
                for name in names[1:]:
                    cell = results.get((dim, ratio, n, name))
                    row.append("not run" if cell is None else
                               f"{cell[0] / w_time:.2f}x, {cell[2]:.2%} ({cell[1]:.1%})")
                out.append("| " + " | ".join(row) + " |")
            out.append("")
    return "\n".join(out)


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
    parser.add_argument("--repeats", type=int, default=1, help="data draws per cell (median)")
    parser.add_argument("--exact-max", type=int, default=1000,
                        help="largest N for exact-interpolation FedWAD")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--sizes", type=int, nargs="+",
                        help=f"N values (default {SIZES}; {QUICK_SIZES} with --quick)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = tuple(args.sizes) if args.sizes else QUICK_SIZES if args.quick else SIZES
    results = run(sizes, args.repeats, args.exact_max)
    text = tables(results, sizes, args.exact_max)
    print(text)
    figure(results, sizes, args.exact_max, args.figure)
    if args.out:
        flags = (" --quick" if args.quick else "") + (
            f" --sizes {' '.join(map(str, sizes))}" if args.sizes else "")
        note = (f"Measured by `benchmarks/fedwad.py{flags}` "
                f"({args.repeats} draw(s) per cell, median), one process, one thread.\n\n")
        write_block(args.out, "fedwad", note + text, title="# Benchmarks")


if __name__ == "__main__":
    main()
