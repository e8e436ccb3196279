"""Privacy-utility sweep: epsilon in {1, 2, 4, 8, 16, inf} x methods {vanilla, got} x protocols
{dp, dp-secagg} on 8 Gaussians -> moons with two disjoint clients, over seeds.

    .venv/bin/python experiments/sweep_privacy_utility.py            # 72 runs (about an hour)
    .venv/bin/python experiments/sweep_privacy_utility.py --rounds 200 --seeds 0 --eps 8,inf
    .venv/bin/python experiments/sweep_privacy_utility.py --smoke    # seconds: a check only

epsilon = inf runs the same method without DP: `plaintext` in place of `dp`, `secagg` in place
of `dp-secagg`. Runs go to runs/sweep/<method>-<protocol>-e<eps>-s<seed> (``--root``) and
finished ones are reused. Writes runs/sweep/sweep.csv, docs/figures/sweep_privacy_utility.png
and the table between the sweep markers of docs/results.md (``--docs``). ``--smoke`` runs the
grid at epsilon 8 and inf, seed 0, tiny (2 rounds of batch 64, 100 evaluation samples, 20
plotted trajectories, one worker; it overrides --eps, --seeds, --rounds, --eval-samples and
--workers) and writes under runs/smoke/sweep unless --root and --docs say otherwise: the default
test suite runs it to check that the script works; its numbers are not results.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from secureffm.config import load_config  # noqa: E402
from secureffm.reporting import mean_std, write_block  # noqa: E402
from secureffm.runs import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The run defaults are the DP main job's (issue 22); this experiment keeps the settings its
# table was made with: the FFM paper's App. C.1 (batch 256, Adam 1e-3, EMA 0.999, phi lr 1e-4
# every 5 rounds).
PAPER = dict(batch_size=256, lr=1e-3, ema_decay=0.999, potential_lr=1e-4, potential_every=5)
# --smoke: the smallest runs that still go through every step of the script.
SMOKE = dict(rounds=2, eval_samples=100, batch_size=64, trajectories=20)
WITHOUT_DP = {"dp": "plaintext", "dp-secagg": "secagg", "dp-secagg-distributed": "secagg"}


def _one(job: tuple[str, str, float, int, dict]) -> dict:
    method, protocol, eps, seed, settings = job
    torch.set_num_threads(1)
    label = "inf" if math.isinf(eps) else f"{eps:g}"
    out = Path(settings["root"]) / f"{method}-{protocol}-e{label}-s{seed}"
    if not (out / "metrics.json").exists():
        values = {k: v for k, v in settings.items() if k != "root"}
        values.update(method=method, seed=seed, out=str(out), progress=False, overwrite=True,
                      protocol=WITHOUT_DP[protocol] if math.isinf(eps) else protocol)
        if not math.isinf(eps):
            values["target_epsilon"] = eps
        print(f"start {out.name}", flush=True)
        run(load_config(None, values))
    metrics = json.loads((out / "metrics.json").read_text())
    row = {"method": method, "protocol": protocol, "epsilon": label, "seed": seed,
           "w2_nfe2": metrics["eval"]["w2"]["2"], "w2_nfe32": metrics["eval"]["w2"]["32"]}
    privacy = json.loads((out / "privacy.json").read_text())
    if "clients" in privacy:  # every run writes privacy.json; DP runs add the ledger's epsilons
        clients = privacy["clients"].values()
        row["spent_rdp"] = max(c["rdp"]["total"] for c in clients)
        prv = [c["prv"]["total"] for c in clients]  # None: PRV does not cover the mechanism
        row["spent_prv"] = max(prv) if None not in prv else ""
        row["sigma"] = max(privacy["noise_multiplier"].values())
    return row


def _plot(rows: list[dict], eps_values: list[float], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    ticks = list(range(len(eps_values)))
    labels = ["inf" if math.isinf(e) else f"{e:g}" for e in eps_values]
    for ax, nfe in zip(axes, ("2", "32"), strict=True):
        for method in sorted({r["method"] for r in rows}):
            protocols = sorted({r["protocol"] for r in rows})
            for protocol in protocols:
                stats = [mean_std([r[f"w2_nfe{nfe}"] for r in rows if r["method"] == method
                                   and r["protocol"] == protocol and r["epsilon"] == lab])
                         for lab in labels]
                ax.errorbar(ticks, [s[0] for s in stats], yerr=[s[1] for s in stats],
                            marker="o", capsize=3, label=f"{method}, {protocol}",
                            linestyle=("-", "--", ":")[protocols.index(protocol) % 3])
        ax.set_xticks(ticks, labels)
        ax.set_xlabel("target epsilon per client (delta = 1e-5)")
        ax.set_title(f"W2 at NFE {nfe}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("W2 to held-out target")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", default="1,2,4,8,16,inf")
    parser.add_argument("--methods", default="vanilla,got")
    parser.add_argument("--protocols", default="dp,dp-secagg")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--potential-lr", type=float, default=1e-3)
    parser.add_argument("--eval-samples", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", help="run folders and sweep.csv (default runs/sweep)")
    parser.add_argument("--docs", help="folder of results.md and figures/ (default docs)")
    parser.add_argument("--block", default="sweep",
                        help="name of the results.md block (and figure) to write")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, output under runs/smoke/sweep: checks that the script "
                             "works (seconds); the numbers are not results")
    args = parser.parse_args()
    smoke = ROOT / "runs" / "smoke" / "sweep"
    args.root = args.root or str(smoke if args.smoke else ROOT / "runs" / "sweep")
    args.docs = args.docs or str(smoke if args.smoke else ROOT / "docs")
    if args.smoke:
        args.rounds, args.eval_samples = SMOKE["rounds"], SMOKE["eval_samples"]
        args.eps, args.seeds, args.workers = "8,inf", "0", 1
    eps_values = [float(e) for e in args.eps.split(",")]
    settings = {**PAPER, **(SMOKE if args.smoke else {}), "rounds": args.rounds,
                "potential_lr": args.potential_lr, "eval_samples": args.eval_samples,
                "nfe": (2, 32), "root": args.root}
    jobs = [(m, p, e, int(s), settings) for s in args.seeds.split(",")
            for e in eps_values for m in args.methods.split(",") for p in args.protocols.split(",")]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(_one, jobs))
    root = Path(args.root)
    with (root / "sweep.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["method", "protocol", "epsilon", "seed",
                                                    "w2_nfe2", "w2_nfe32", "spent_rdp",
                                                    "spent_prv", "sigma"])
        writer.writeheader()
        writer.writerows(rows)
    figures = Path(args.docs) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    figure = "sweep_privacy_utility.png" if args.block == "sweep" else f"{args.block}.png"
    _plot(rows, eps_values, figures / figure)

    labels = ["inf" if math.isinf(e) else f"{e:g}" for e in eps_values]
    lines = ["| method | protocol | " + " | ".join(f"eps {lab}" for lab in labels) + " |",
             "|" + " --- |" * (len(labels) + 2)]
    for nfe in ("2", "32"):
        for method in args.methods.split(","):
            for protocol in args.protocols.split(","):
                cells = []
                for lab in labels:
                    picked = [r for r in rows if (r["method"], r["protocol"], r["epsilon"])
                              == (method, protocol, lab)]
                    mean, std = mean_std([r[f"w2_nfe{nfe}"] for r in picked])
                    spent = [r["spent_rdp"] for r in picked if "spent_rdp" in r]
                    note = f" (spent {max(spent):.2f})" if spent else ""
                    cells.append(f"{mean:.3f} ± {std:.3f}{note}")
                lines.append(f"| {method}, W2 at NFE {nfe} | {protocol} | " + " | ".join(cells)
                             + " |")
    text = (f"W2 at NFE 2 and 32 (rows) against the target epsilon per client at delta = 1e-5 "
            f"(columns; inf = the same protocol without its dp stage), 8gaussians-moons, two "
            f"disjoint clients, {args.rounds} rounds, GOT potential lr {args.potential_lr:g}, "
            f"{args.eval_samples} evaluation samples, mean ± std over seeds {args.seeds}; "
            "'spent' is the largest RDP epsilon any client spent. Written by "
            "`experiments/sweep_privacy_utility.py`.\n\n" + "\n".join(lines)
            + f"\n\n![privacy-utility](figures/{figure})\n")
    write_block(Path(args.docs) / "results.md", args.block, text)
    print(text)


if __name__ == "__main__":
    main()
