"""Attacks on the server's view, per protocol: gradient inversion and membership inference.

Trains FFM-vanilla on scikit-learn's 8x8 digits (two clients of ``shard`` images each, a width-8
U-Net, payloads kept, secret streams derived from the seed so the experimenter can replay the
truth) under plaintext, secagg, dp and dp-secagg, at batch 1 (``short_rounds`` rounds) and at
batch 4 (``rounds`` rounds, long enough to memorise), each through ``secureffm.runs.run``. On
each run it runs ``secureffm.audit.attacks.run_attack``: ``inversion`` (client-1's message and
the sum of both clients' gradients, informed and uninformed attackers) and, on the batch-4 runs,
``membership`` on the released model. Writes the table into docs/results.md (block
``attacks``) and each run's originals-beside-reconstructions picture to
docs/figures/attacks_inversion_<protocol>_b<batch>.png (figures/ beside ``--doc``).

    .venv/bin/python experiments/attacks.py [--runs runs/attacks] [--protocols ...] [--reuse]
    .venv/bin/python experiments/attacks.py --smoke        # a check only: numbers not results
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from secureffm.audit.attacks import run_attack
from secureffm.config import RunConfig
from secureffm.reporting import markdown_table, write_block
from secureffm.runs import run

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ("plaintext", "secagg", "dp", "dp-secagg")
SETTINGS = {"shard": 32, "rounds": 400, "short_rounds": 20, "steps": 200, "count": 400,
            "draws": 16}
SMOKE = {"rounds": 3, "short_rounds": 3, "steps": 5, "count": 20, "draws": 2}


def _config(protocol: str, batch: int, rounds: int, shard: int, out: Path) -> RunConfig:
    return RunConfig(method="vanilla", protocol=protocol, data="digits", clients=2,
                     batch_size=batch, shard_size=shard, rounds=rounds, lr=3e-3,
                     ema_decay=0.99, unet_width=8, unet_mult=(1, 2), eval_samples=200,
                     nfe=(8,), keep_payloads=True, insecure_deterministic=True,
                     progress=False, device="cpu", overwrite=True, out=str(out))


def _attacked(folder: Path, batch: int, settings: dict, reuse: bool) -> dict:
    """The attacks' results on one run folder (results.json there when ``reuse``)."""
    saved = folder / "attacks" / "results.json"
    if reuse and saved.is_file():
        return json.loads(saved.read_text())
    found = {"inversion": run_attack(folder, "inversion", steps=settings["steps"], clients=1)}
    if batch > 1:
        found["membership"] = run_attack(folder, "membership", count=settings["count"],
                                         draws=settings["draws"])
    saved.write_text(json.dumps(found, indent=1))
    return found


def _grid(runs: Path, reuse: bool, settings: dict, protocols: list[str]) -> dict:
    results = {}
    for protocol in protocols:
        for batch, rounds in ((1, settings["short_rounds"]), (4, settings["rounds"])):
            folder = runs / f"{protocol}-b{batch}"
            if not (reuse and (folder / "checkpoint.safetensors").is_file()):
                run(_config(protocol, batch, rounds, settings["shard"], folder))
            results[protocol, batch] = _attacked(folder, batch, settings, reuse)
            print(protocol, batch, json.dumps(results[protocol, batch]), flush=True)
    return results


def _pair(found: dict, name: str) -> str:
    return f"{found[f'{name}_psnr']:.1f} / {found[f'{name}_ssim']:.2f}"


def _table(results: dict, settings: dict) -> str:
    headers = ["protocol", "batch (client-1's in that round)", "round", "message, informed",
               "message, uninformed", "sum, informed", "sum, uninformed", "mean image (prior)",
               "MIA AUC loss / averaged / calibrated", "MIA TPR at 1% FPR (averaged)"]
    rows = []
    for (protocol, batch), found in results.items():
        inv = found["inversion"]
        mia = found.get("membership")
        rows.append([
            protocol, f"{batch} ({inv['batch']:g})", f"{inv['round']:g}",
            _pair(inv, "message_informed"), _pair(inv, "message_uninformed"),
            _pair(inv, "sum_informed"), _pair(inv, "sum_uninformed"), _pair(inv, "prior"),
            " / ".join(f"{mia[f'{s}_auc']:.3f}" for s in ("loss", "averaged", "calibrated"))
            if mia else "-",
            f"{mia['averaged_tpr_at_1pct_fpr']:.3f}" if mia else "-"])
    members = next(int(f["membership"]["members"]) for f in results.values()
                   if "membership" in f)
    note = (f"FFM-vanilla on 8x8 digits, 2 clients x {settings['shard']} images, width-8 "
            f"U-Net; batch 1 runs {settings['short_rounds']} rounds, batch 4 runs "
            f"{settings['rounds']} (lr 3e-3, EMA 0.99); dp: target epsilon 8 at delta 1e-5 per "
            f"client. Inversion: PSNR (dB) / SSIM of client-1's examples in the first round in "
            f"which both clients used one, {settings['steps']} Adam steps (informed: up to "
            f"3 starts, uninformed: one); "
            f"membership: {members} members (at most {settings['count']}) against as many "
            f"held-out digits, {settings['draws']} draws. Written by experiments/attacks.py.")
    return note + "\n\n" + markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="run folders (default runs/attacks)")
    parser.add_argument("--doc", type=Path, help="results file; figures go to figures/ beside "
                                                 "it (default docs/results.md)")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS),
                        help=f"protocols to run (default {' '.join(PROTOCOLS)})")
    parser.add_argument("--reuse", action="store_true",
                        help="read finished runs and attack results instead of making them")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs and searches under runs/smoke/attacks: checks that the "
                             "script works; the numbers are not results")
    args = parser.parse_args()
    smoke = ROOT / "runs" / "smoke" / "attacks"
    args.runs = args.runs or (smoke if args.smoke else ROOT / "runs" / "attacks")
    args.doc = args.doc or (smoke / "results.md" if args.smoke else ROOT / "docs" / "results.md")
    settings = {**SETTINGS, **SMOKE} if args.smoke else SETTINGS
    torch.set_num_threads(1)
    results = _grid(args.runs, args.reuse, settings, args.protocols)
    figures = args.doc.parent / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    links = []
    for protocol, batch in results:
        name = f"attacks_inversion_{protocol}_b{batch}.png"
        shutil.copyfile(args.runs / f"{protocol}-b{batch}" / "attacks" / "inversion.png",
                        figures / name)
        links.append(f"![inversion, {protocol}, batch {batch}](figures/{name})")
    table = _table(results, settings) + "\n\n" + "\n".join(links)
    write_block(args.doc, "attacks", table)
    print(table)


if __name__ == "__main__":
    main()
