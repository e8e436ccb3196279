"""Privacy-utility sweep: epsilon in {1, 2, 4, 8, 16, inf} x methods {vanilla, got} x protocols
{dp, dp-secagg} on 8 Gaussians -> moons with two disjoint clients, over seeds: the grid of
experiments/sweep_privacy_utility.toml run by `secureffm sweep`, and its docs/results.md block.

    .venv/bin/python experiments/sweep_privacy_utility.py            # 72 runs (about an hour)
    .venv/bin/python experiments/sweep_privacy_utility.py --rounds 200 --seeds 0 --eps 8,inf
    .venv/bin/python experiments/sweep_privacy_utility.py --smoke    # seconds: a check only

The options override the sweep file. epsilon = inf runs the same method without DP:
`plaintext` in place of `dp`, `secagg` in place of `dp-secagg`. Runs go to
runs/sweep/<method>-<protocol>-e<eps>-s<seed> (``--root``) and finished ones with the same
settings are reused. Writes runs/sweep/sweep.csv and frontier.png, docs/figures/
sweep_privacy_utility.png and the table between the sweep markers of docs/results.md
(``--docs``). ``--smoke`` runs the grid at epsilon 8 and inf, seed 0, tiny (secureffm.sweep.SMOKE:
2 rounds of batch 64, 100 evaluation samples, 20 plotted trajectories; one worker) and writes
under runs/smoke/sweep unless --root and --docs say otherwise: the default test suite runs it to
check that the script works; its numbers are not results.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from secureffm.reporting import write_block
from secureffm.sweep import load_sweep, run_sweep, smoke_spec, summary_table

ROOT = Path(__file__).resolve().parents[1]
SWEEP = Path(__file__).with_suffix(".toml")


def _overrides(args: argparse.Namespace) -> dict:
    """The sweep file's keys the options replace."""
    grid = {key: [cast(v) for v in value.split(",")] for key, value, cast in (
        ("epsilons", args.eps, float), ("methods", args.methods, str),
        ("protocols", args.protocols, str), ("seeds", args.seeds, int)) if value is not None}
    run = {key: value for key, value in (("rounds", args.rounds),
                                         ("potential_lr", args.potential_lr),
                                         ("eval_samples", args.eval_samples))
           if value is not None}
    top = {key: value for key, value in (("workers", args.workers), ("root", args.root))
           if value is not None}
    return {"grid": grid, "run": run, **top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", help="target epsilons, e.g. 8,inf (default: the sweep file's)")
    parser.add_argument("--methods", help="e.g. vanilla,got")
    parser.add_argument("--protocols", help="e.g. dp,dp-secagg")
    parser.add_argument("--seeds", help="e.g. 0,1,2")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--potential-lr", type=float)
    parser.add_argument("--eval-samples", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--root", help="run folders and sweep.csv (default runs/sweep)")
    parser.add_argument("--docs", help="folder of results.md and figures/ (default docs)")
    parser.add_argument("--block", default="sweep",
                        help="name of the results.md block (and figure) to write")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, output under runs/smoke/sweep: checks that the script "
                             "works (seconds); the numbers are not results")
    args = parser.parse_args()
    smoke = ROOT / "runs" / "smoke" / "sweep"
    if args.smoke:
        args.eps = "8,inf"
    spec = load_sweep(SWEEP, _overrides(args))
    if args.smoke:
        spec = smoke_spec(spec, Path(args.root or smoke))
    docs = Path(args.docs or (smoke if args.smoke else ROOT / "docs"))
    result = run_sweep(spec)

    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    figure = "sweep_privacy_utility.png" if args.block == "sweep" else f"{args.block}.png"
    shutil.copyfile(result.figure, figures / figure)
    run = spec.run
    text = (f"W2 at NFE 2 and 32 (rows) against the target epsilon per client at delta = 1e-5 "
            f"(columns; inf = the same protocol without its dp stage), 8gaussians-moons, two "
            f"disjoint clients, {run.rounds} rounds, GOT potential lr {run.potential_lr:g}, "
            f"{run.eval_samples} evaluation samples, mean ± std over seeds "
            f"{','.join(map(str, spec.seeds))}; 'spent' is the largest RDP epsilon any client "
            "spent. Written by `experiments/sweep_privacy_utility.py` (`secureffm sweep "
            "experiments/sweep_privacy_utility.toml`).\n\n" + summary_table(result.rows)
            + f"\n\n![privacy-utility](figures/{figure})\n")
    write_block(docs / "results.md", args.block, text)
    print(text)


if __name__ == "__main__":
    main()
