"""The README's main job under DP (issue 22): which settings let FFM-GOT learn 8 Gaussians ->
moons at epsilon 8 per client within the job's 3-minute budget on a 2-core CPU.

    .venv/bin/python experiments/dp_main_job.py              # the grid, then docs/results.md
    .venv/bin/python experiments/dp_main_job.py --only "main job"  # rows by label prefix
    .venv/bin/python experiments/dp_main_job.py --smoke      # seconds: a check only

Every row trains GOT on two disjoint clients (shards of 10,000) at target epsilon 8 per client,
delta 1e-5 (the spec's), the whole schedule (every velocity gradient and every dual update)
calibrated together. Search rows run under `dp` (the same DP stage as `dp-secagg`, without the
masking, whose sum is exact) and a short evaluation (1,000 points, NFE 1, 2, 32); rows marked
"main job" run `dp-secagg` with the default evaluation (3,000 points, 7 NFEs and dopri5).
A row that changes the dp stage's clip or accountant runs a copy of the protocol's spec with
those values. Runs go to runs/dp_main_job/<label> (``--root``); finished ones
are reused (delete a folder to re-run it). Writes docs/figures/dp_main_job.png, the main job's
trajectories.png as docs/figures/dp_main_job_trajectories.png, and the table
between the dp_main_job markers of docs/results.md (``--docs``). ``--smoke`` runs two tiny rows
(3 rounds, 100 evaluation points) under runs/smoke/dp_main_job: its numbers are not results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import tomli_w  # noqa: E402
import torch  # noqa: E402

from secureffm.config import RunConfig, load_config  # noqa: E402
from secureffm.reporting import markdown_table, write_block  # noqa: E402
from secureffm.runs import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "secureffm" / "specs" / "protocols"
# The main job before issue 22 (the defaults then): every row states what it changes from it.
BEFORE = dict(batch_size=256, rounds=3000, lr=1e-3, potential_lr=1e-4, potential_every=5,
              ema_decay=0.999)
SEARCH = dict(protocol="dp", eval_samples=1000, nfe=(1, 2, 32), trajectories=200)
MAIN = dict(protocol="dp-secagg")  # the default evaluation
SHORT = {"batch_size": "B", "rounds": "rounds", "lr": "lr", "potential_lr": "phi lr",
         "potential_every": "phi every", "ema_decay": "EMA", "protocol": "protocol",
         "clip": "clip", "accountant": "accountant"}
STAGE = ("clip", "accountant")  # keys of the protocol's dp stage, not of the run config
# What each row changes from BEFORE (run config keys, and the dp stage's clip and accountant)
# and its kind (search or main job); the rows in the order they were tried.
GRID: list[tuple[dict, dict]] = [
    ({}, SEARCH),
    ({"protocol": "plaintext"}, SEARCH),
    ({"potential_lr": 1e-3}, SEARCH),
    ({"batch_size": 1024, "rounds": 1000, "potential_every": 1, "potential_lr": 1e-3,
      "ema_decay": 0.99}, SEARCH),
    ({"batch_size": 1024, "rounds": 1000, "potential_every": 1, "potential_lr": 1e-3,
      "ema_decay": 0.99, "protocol": "plaintext"}, SEARCH),
    ({"batch_size": 2048, "rounds": 500, "potential_every": 1, "potential_lr": 3e-3,
      "lr": 3e-3, "ema_decay": 0.98}, SEARCH),
    ({"batch_size": 2048, "rounds": 500, "potential_every": 1, "potential_lr": 3e-3,
      "lr": 5e-3, "ema_decay": 0.98}, SEARCH),
    ({"batch_size": 4096, "rounds": 300, "potential_every": 1, "potential_lr": 5e-3,
      "lr": 5e-3, "ema_decay": 0.97}, SEARCH),
    ({"batch_size": 2048, "rounds": 600, "potential_every": 2, "potential_lr": 5e-3,
      "lr": 5e-3, "ema_decay": 0.98}, SEARCH),
    ({"batch_size": 1024, "rounds": 1000, "potential_every": 1, "potential_lr": 3e-3,
      "lr": 5e-3, "ema_decay": 0.99}, SEARCH),
    ({"batch_size": 2048, "rounds": 500, "potential_every": 1, "potential_lr": 3e-3,
      "lr": 5e-3, "ema_decay": 0.98, "clip": 4.0}, SEARCH),
    # The chosen settings, now the defaults: `secureffm run --protocol dp-secagg --method got`.
    ({"batch_size": 1024, "rounds": 1000, "potential_every": 1, "potential_lr": 3e-3,
      "lr": 5e-3, "ema_decay": 0.99}, MAIN),
]


def label(changes: dict, kind: dict) -> str:
    """A row's name: what it changes from BEFORE (and "main job" for the default evaluation)."""
    text = ", ".join("no DP (plaintext)" if v == "plaintext" else f"{SHORT[k]} {v}"
                     if isinstance(v, str) else f"{SHORT[k]} {v:g}"
                     for k, v in changes.items()) or "before"
    return f"main job: {text}" if kind is MAIN else text


SMOKE = dict(rounds=3, batch_size=64, eval_samples=100, nfe=(1, 2, 32), trajectories=20)


def _spec(protocol: str, stage: dict, root: Path) -> tuple[str, str]:
    """The protocol to run (the shipped one, or a copy whose dp stage takes ``stage``'s values)
    and its accountant ("" without a dp stage)."""
    if protocol == "plaintext":
        return protocol, ""
    spec = tomllib.loads((SPECS / f"{protocol}.toml").read_text())
    dp = next(s for s in spec["stages"] if s["stage"] == "dp")
    if all(dp[k] == v for k, v in stage.items()):
        return protocol, dp["accountant"]
    dp.update(stage)
    path = root / "specs" / (protocol + "".join(f"-{k}-{v}" for k, v in stage.items()) + ".toml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(spec))
    return str(path), dp["accountant"]


def _folder(label: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in label).strip("_")


def _one(changes: dict, kind: dict, root: Path, smoke: bool) -> dict:
    name = label(changes, kind)
    out = root / _folder(name)
    values = {**BEFORE, **kind, **changes, **(SMOKE if smoke else {})}
    stage = {k: values.pop(k) for k in STAGE if k in values}
    values["protocol"], accountant = _spec(values["protocol"], stage, root)
    if not (out / "metrics.json").exists():
        print(f"start {name}", flush=True)
        run(load_config(None, {**values, "out": str(out), "overwrite": True,
                               "progress": False}))
    metrics = json.loads((out / "metrics.json").read_text())
    privacy = json.loads((out / "privacy.json").read_text())
    evaluation = metrics["eval"]
    row = {"label": name, "protocol": metrics["protocol"], "accountant": accountant or "-",
           "samples": values["eval_samples"] if "eval_samples" in values
           else RunConfig().eval_samples,
           "w2": {n: evaluation["w2"].get(n) for n in ("1", "2", "32")},
           "floor": evaluation["iid_floor"], "train_seconds": metrics["train_seconds"],
           "rounds": metrics["rounds"], "out": out, "main": kind is MAIN}
    if "clients" in privacy:
        client = max(privacy["clients"].values(), key=lambda c: c["rdp"]["total"])
        row["sigma"] = max(privacy["noise_multiplier"].values())
        row["clip"] = privacy["clip"]
        row["spent"] = {acc: client[acc] for acc in ("rdp", "prv") if client.get(acc)}
    return row


def _spent(row: dict) -> str:
    if "spent" not in row:
        return "no DP"
    parts = []
    for acc, spent in row["spent"].items():
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(spent["by_kind"].items()))
        parts.append(f"{acc.upper()} {spent['total']:.2f} ({kinds})")
    return "; ".join(parts)


def _plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r["w2"]["2"] for r in rows], color=["tab:orange" if "spent" not in r
                                                     else "tab:blue" for r in rows])
    ax.scatter([r["floor"] for r in rows], ys, color="k", marker="|", s=200,
               label="i.i.d. floor")
    ax.axvline(0.5, color="tab:red", linestyle="--", label="target 0.5")
    ax.set_yticks(ys, [r["label"] for r in rows], fontsize=7)
    ax.set_xlabel("W2 at NFE 2 (orange: no DP)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the long labels stay whole
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="run folders (default runs/dp_main_job)")
    parser.add_argument("--docs", help="folder of results.md and figures/ (default docs)")
    parser.add_argument("--only", help="run only the rows whose label starts with this")
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny rows under runs/smoke/dp_main_job (seconds); the "
                             "numbers are not results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    smoke = ROOT / "runs" / "smoke" / "dp_main_job"
    root = Path(args.root or (smoke if args.smoke else ROOT / "runs" / "dp_main_job"))
    docs = Path(args.docs or (smoke if args.smoke else ROOT / "docs"))
    grid = [GRID[0], GRID[-1]] if args.smoke else GRID
    if args.only:
        grid = [g for g in grid if label(*g).startswith(args.only)]
    rows = [_one(*entry, root, args.smoke) for entry in grid]
    if args.only:
        for row in rows:
            print(row)
        return
    table = markdown_table(
        ["setting (changes from the main job before issue 22)", "protocol", "accountant",
         "clip", "sigma", "epsilon spent per client (by kind)", "W2 NFE 1", "W2 NFE 2", "W2 NFE 32",
         "i.i.d. floor", "eval points", "training s"],
        [[r["label"], r["protocol"], r["accountant"], f"{r['clip']:g}" if "clip" in r else "-",
          f"{r['sigma']:.3f}" if "sigma" in r
          else "-", _spent(r), *(f"{r['w2'][n]:.3f}" for n in ("1", "2", "32")),
          f"{r['floor']:.3f}", r["samples"], f"{r['train_seconds']:.0f}"] for r in rows])
    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    _plot(rows, figures / "dp_main_job.png")
    for row in rows:  # the main job's own picture, for the README
        if row["main"]:
            shutil.copyfile(row["out"] / "trajectories.png",
                            figures / "dp_main_job_trajectories.png")
    text = ("FFM-GOT, 8gaussians-moons, two disjoint clients, shards of 10,000, target epsilon 8 "
            "per client at delta 1e-5 (gradient and dual_update composed). The main job "
            "before: " + ", ".join(f"{k} {v:g}" for k, v in BEFORE.items()) + ". 'training s' "
            "is wall time on a shared 2-core machine (compare within similar load only). "
            "Written by `experiments/dp_main_job.py`.\n\n" + table
            + "\n\n![W2 at NFE 2 by setting](figures/dp_main_job.png)\n"
            "![the main job's trajectories](figures/dp_main_job_trajectories.png)\n")
    write_block(docs / "results.md", "dp_main_job", text)
    print(text)


if __name__ == "__main__":
    main()
