"""Federated Wasserstein coresets of the digits, FedWAD against exact W (FedWAD paper, Fig. 4).

    .venv/bin/python experiments/fedwad_coreset.py                # both splits, ~5 min on 1 core

The digits' train part (scikit-learn's bundled 8x8 digits, pixels in [0, 1]) is dealt over 20
clients in two ways: at random (every client holds about all ten classes; the paper's K = 8
panel) and two classes per client (its K = 2 panel). A coreset of 10 points is learned on the
server from the same uniform [0, 1] initialisation with exact W_2 (the non-federated reference:
the server reads the sampled clients' rows) and with FedWAD (server-client FedWAD, the clients'
rows never leave them). Draws docs/figures/fedwad_coreset_digits.png and writes the exact W_2 of
each coreset to the pooled train data between the fedwad_coreset markers of docs/results.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from secureffm.data.digits import class_pair_split  # noqa: E402
from secureffm.federation.log import MessageLog  # noqa: E402
from secureffm.methods.fedwad import FedWADConfig, Measure, wasserstein  # noqa: E402
from secureffm.methods.fedwad_coreset import (  # noqa: E402
    CoresetConfig,
    coreset_client,
    learn_coreset,
)
from secureffm.methods.otdd import labelled_clients  # noqa: E402
from secureffm.protocols.protocol import load_protocol  # noqa: E402
from secureffm.reporting import write_block  # noqa: E402
from secureffm.runs.scaffold import open_channel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPLITS = {"random dealing (all classes per client)": "iid",
          "two classes per client": "random"}


def _split(kind: str, clients: int, seed: int) -> tuple[list, list]:
    """(features, labels) per client: the class-pair split, or its rows re-dealt at random."""
    shards = class_pair_split("random", clients=clients, seed=seed)
    xs, ys = [s.x_train for s in shards], [s.y_train for s in shards]
    if kind == "iid":
        x, y = np.concatenate(xs), np.concatenate(ys)
        parts = np.array_split(np.random.default_rng(seed).permutation(len(x)), clients)
        xs, ys = [x[p] for p in parts], [y[p] for p in parts]
    return xs, ys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--clients-per-epoch", type=int, default=10)
    parser.add_argument("--support", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--docs", default=str(ROOT / "docs"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = CoresetConfig(size=10, epochs=args.epochs, clients_per_epoch=args.clients_per_epoch,
                           lr=args.lr, seed=args.seed,
                           fedwad=FedWADConfig(iterations=args.iterations,
                                               support_size=args.support, seed=args.seed))
    initial = np.random.default_rng(args.seed).uniform(0.0, 1.0, size=(config.size, 64))
    protocol = load_protocol("plaintext")
    panels, rows = [], []
    for title, kind in SPLITS.items():
        xs, ys = _split(kind, args.clients, args.seed)
        pooled = Measure.uniform(np.concatenate(xs))
        learned = {}
        for name, exact in (("exact W", True), ("FedWAD", False)):
            clients = labelled_clients(xs, ys)
            with tempfile.TemporaryDirectory() as folder:
                privacy = protocol.geodesic_privacy()
                channel = open_channel(protocol, clients, MessageLog(Path(folder) / "m.jsonl"),
                                       program=coreset_client(config, privacy))
                start = time.perf_counter()
                result = learn_coreset(channel, privacy, initial, config, exact=exact)
                seconds = time.perf_counter() - start
                channel.close()
            distance = wasserstein(Measure.uniform(result.points), pooled, 2)
            learned[name] = result.points
            rows.append(f"| {title} | {name} | {distance:.3f} | {seconds:.0f} |")
            print(f"{title}, {name}: exact W2(coreset, pooled train) = {distance:.3f} "
                  f"({seconds:.0f} s)", flush=True)
        panels.append((title, learned))
    start_w2 = wasserstein(Measure.uniform(initial), pooled, 2)

    fig = plt.figure(figsize=(config.size * 0.9, 2.0 * len(panels)))
    for sub, (title, learned) in zip(fig.subfigures(len(panels), 1), panels, strict=True):
        sub.suptitle(f"digits over {args.clients} clients, {title}: 10-point coresets after "
                     f"{args.epochs} epochs", fontsize=9)
        axes = sub.subplots(len(learned), config.size, gridspec_kw={"wspace": 0.05,
                                                                     "hspace": 0.05})
        for row, (name, points) in zip(axes, learned.items(), strict=True):
            for k, ax in enumerate(row):
                ax.imshow(points[k].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
            row[0].set_ylabel(name, fontsize=8)
    out = Path(args.docs) / "figures" / "fedwad_coreset_digits.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}")

    text = (f"Coresets of K = 10 points learned on the server over {args.clients} clients "
            f"holding scikit-learn's digits (train part, {pooled.size} images), "
            f"{args.epochs} epochs of {args.clients_per_epoch} clients each, Adam (lr "
            f"{config.lr}), from one uniform [0, 1] initialisation (exact W2 to the pooled "
            f"train data {start_w2:.3f}). FedWAD: "
            f"support {args.support}, {args.iterations} iterations per distance. Written by "
            "`experiments/fedwad_coreset.py`; picture: "
            "[figures/fedwad_coreset_digits.png](figures/fedwad_coreset_digits.png).\n\n"
            "| split | distance used for training | exact W2(coreset, pooled train) | seconds |\n"
            "| --- | --- | --- | --- |\n" + "\n".join(rows))
    write_block(Path(args.docs) / "results.md", "fedwad_coreset", text)


if __name__ == "__main__":
    main()
