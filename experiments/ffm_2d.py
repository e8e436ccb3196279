"""Reproduce the FFM paper's Fig. 7(a): W2 against NFE on 8 Gaussians -> moons, two disjoint
clients, for FFM-vanilla, FFM-LOT, FFM-GOT and the centralized I-CFM and OT-CFM, over seeds.

    .venv/bin/python experiments/ffm_2d.py                 # 20k rounds, 3 seeds (about an hour)
    .venv/bin/python experiments/ffm_2d.py --rounds 2000   # a quick look
    .venv/bin/python experiments/ffm_2d.py --smoke         # seconds: a check only

Runs go to runs/ffm_2d/<method>-s<seed> (``--root``); a finished run (metrics.json present) is
reused, so an interrupted sweep resumes. Writes the table between the ffm_2d markers of
docs/results.md and the figures docs/figures/ffm_2d_*.png (``--docs``). ``--smoke`` runs every
method once, tiny (2 rounds of batch 64, 100 evaluation samples, 20 plotted trajectories, seed
0, one worker; it overrides --rounds, --seeds, --eval-samples and --workers) and writes under
runs/smoke/ffm_2d unless --root and --docs say otherwise: the default test suite runs it to
check that the script works; its numbers are not results.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from secureffm.config import load_config  # noqa: E402
from secureffm.data import get_pair  # noqa: E402
from secureffm.metrics.sampling import trajectories  # noqa: E402
from secureffm.metrics.w2 import w2  # noqa: E402
from secureffm.plots import plot_w2_nfe  # noqa: E402
from secureffm.reporting import mean_std, write_block  # noqa: E402
from secureffm.runs import load_velocity, run  # noqa: E402

# Variant name -> (method, config overrides). got-phi1e-3 shows how much of GOT's result is the
# paper's slow potential learning rate (1e-4) at this number of rounds.
VARIANTS = {
    "vanilla": ("vanilla", {}),
    "lot": ("lot", {}),
    "got": ("got", {}),
    "got-phi1e-3": ("got", {"potential_lr": 1e-3}),
    "icfm": ("icfm", {}),
    "otcfm": ("otcfm", {}),
}
LABELS = {"vanilla": "FFM-vanilla", "lot": "FFM-LOT", "got": "FFM-GOT",
          "got-phi1e-3": "FFM-GOT, phi lr 1e-3", "icfm": "I-CFM (centralized)",
          "otcfm": "OT-CFM (centralized)"}
ROOT = Path(__file__).resolve().parents[1]
# The run defaults are the DP main job's (issue 22); this experiment keeps the settings its
# table was made with: the FFM paper's App. C.1 (batch 256, Adam 1e-3, EMA 0.999, phi lr 1e-4
# every 5 rounds).
PAPER = dict(batch_size=256, lr=1e-3, ema_decay=0.999, potential_lr=1e-4, potential_every=5)
# --smoke: the smallest runs that still go through every step of the script.
SMOKE = dict(rounds=2, eval_samples=100, batch_size=64, trajectories=20)


def _one(job: tuple[str, int, dict]) -> dict:
    variant, seed, settings = job
    method, extra = VARIANTS[variant]
    torch.set_num_threads(1)
    out = Path(settings["root"]) / f"{variant}-s{seed}"
    if (out / "metrics.json").exists():
        return json.loads((out / "metrics.json").read_text())
    overrides = {k: v for k, v in settings.items() if k != "root"}
    config = load_config(None, {**PAPER, **overrides, **extra, "method": method, "seed": seed,
                                "out": str(out), "progress": False})
    print(f"start {variant} seed {seed}", flush=True)
    metrics = run(config).metrics
    print(f"done  {variant} seed {seed}: W2@NFE1 {metrics['eval']['w2']['1']:.3f}", flush=True)
    return metrics


def _table(results: dict[str, list[dict]], nfes: list[str]) -> str:
    head = ("| method | " + " | ".join(f"NFE {n}" for n in nfes)
            + " | dopri5 W2 (NFE) | straightness | ms/round |")
    lines = [head, "|" + " --- |" * (len(nfes) + 4)]
    for method, runs in results.items():
        cells = []
        for n in nfes:
            mean, std = mean_std([r["eval"]["w2"][n] for r in runs])
            cells.append(f"{mean:.3f} ± {std:.3f}")
        ad_w2 = mean_std([r["eval"]["adaptive"]["w2"] for r in runs])
        ad_nfe = statistics.fmean(r["eval"]["adaptive"]["nfe"] for r in runs)
        straight = mean_std([r["eval"]["straightness"] for r in runs])
        ms = statistics.fmean(1000 * r["seconds_per_round"] for r in runs)
        lines.append(f"| {LABELS[method]} | " + " | ".join(cells)
                     + f" | {ad_w2[0]:.3f} ± {ad_w2[1]:.3f} ({ad_nfe:.0f}) "
                     f"| {straight[0]:.4f} ± {straight[1]:.4f} | {ms:.1f} |")
    return "\n".join(lines)


def _trajectory_grid(root: Path, methods: list[str], seed: int, data: str, path: Path) -> None:
    pair = get_pair(data)
    gen = torch.Generator().manual_seed(1234)
    x0 = pair.source.sample(400, gen, torch.device("cpu"))[0]
    target = pair.target.sample(3000, gen, torch.device("cpu"))[0]
    cols = math.ceil(len(methods) / 2)
    fig, axes = plt.subplots(2, cols, figsize=(4 * cols, 8.4), sharex=True, sharey=True)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    for ax, method in zip(axes.flat, methods, strict=False):
        paths = trajectories(load_velocity(root / f"{method}-s{seed}"), x0).numpy()
        ax.scatter(target[:, 0], target[:, 1], s=1, color="lightgray", alpha=0.5)
        ax.plot(paths[:, :, 0], paths[:, :, 1], color="olive", alpha=0.25, linewidth=0.5)
        ax.scatter(paths[0, :, 0], paths[0, :, 1], s=2, color="black")
        ax.scatter(paths[-1, :, 0], paths[-1, :, 1], s=3, color="tab:blue", zorder=3)
        ax.set_title(LABELS[method])
        ax.set_aspect("equal")
    fig.suptitle(f"{data}: learned trajectories, 100 Euler steps (seed {seed}; black x0, "
                 "blue x1, gray target)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default=",".join(VARIANTS))
    parser.add_argument("--data", default="8gaussians-moons")
    parser.add_argument("--eval-samples", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", help="run folders (default runs/ffm_2d)")
    parser.add_argument("--docs", help="folder of results.md and figures/ (default docs)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, output under runs/smoke/ffm_2d: checks that the script "
                             "works (seconds); the numbers are not results")
    args = parser.parse_args()
    smoke = ROOT / "runs" / "smoke" / "ffm_2d"
    args.root = args.root or str(smoke if args.smoke else ROOT / "runs" / "ffm_2d")
    args.docs = args.docs or str(smoke if args.smoke else ROOT / "docs")
    if args.smoke:
        args.rounds, args.eval_samples = SMOKE["rounds"], SMOKE["eval_samples"]
        args.seeds, args.workers = "0", 1
    methods = args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = {**(SMOKE if args.smoke else {}), "rounds": args.rounds, "data": args.data,
                "eval_samples": args.eval_samples, "partition": "disjoint", "clients": 2,
                "root": args.root}
    jobs = [(m, s, settings) for s in seeds for m in methods]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        finished = list(pool.map(_one, jobs))
    results: dict[str, list[dict]] = {m: [] for m in methods}
    for (method, _, _), metrics in zip(jobs, finished, strict=True):
        results[method].append(metrics)
    nfes = list(finished[0]["eval"]["w2"])

    docs = Path(args.docs)
    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    name = f"ffm_2d_{args.data}"
    curves, errors = {}, {}
    for method, runs in results.items():
        stats = {int(n): mean_std([r["eval"]["w2"][n] for r in runs]) for n in nfes}
        curves[LABELS[method]] = {n: s[0] for n, s in stats.items()}
        errors[LABELS[method]] = {n: s[1] for n, s in stats.items()}
    plot_w2_nfe(figures / f"{name}_w2_nfe.png", curves,
                f"{args.data}, 2 disjoint clients, mean ± std over {len(seeds)} seeds", errors)
    _trajectory_grid(Path(args.root), methods, seeds[0], args.data,
                     figures / f"{name}_trajectories.png")
    gen = torch.Generator().manual_seed(99)
    target = get_pair(args.data).target
    floor = w2(*(target.sample(args.eval_samples, gen, torch.device("cpu"))[0] for _ in "ab"))
    text = (
        f"W2 to a held-out target sample ({args.eval_samples} generated vs {args.eval_samples} "
        f"target points, exact OT) against Euler NFE, `{args.data}`, two clients with disjoint "
        f"data, {args.rounds} rounds, mean ± std over seeds {seeds}. Written by "
        f"`experiments/ffm_2d.py {'--smoke' if args.smoke else f'--rounds {args.rounds}'} "
        f"--data {args.data}`.\n\n"
        + _table(results, nfes)
        + f"\n\nThe i.i.d. floor (W2 between two independent target samples of this size): "
        f"{floor:.3f}.\n"
        + f"\n\n![W2 against NFE](figures/{name}_w2_nfe.png)\n"
        f"![trajectories](figures/{name}_trajectories.png)\n"
    )
    write_block(docs / "results.md", name, text)
    print(text)


if __name__ == "__main__":
    main()
