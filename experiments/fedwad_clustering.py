"""Client clustering by federated OTDD, then FedAvg per cluster (FedWAD paper, App. D.5).

    .venv/bin/python experiments/fedwad_clustering.py            # 2 splits x 5 seeds, ~20 min

scikit-learn's digits over 20 clients holding two classes each, with a planted cluster
structure (pairs drawn from (0,1), (2,3), (4,5), (6,7), (8,9)) and without (any two classes).
Per seed: the server computes the 20 x 20 OTDD matrix through FedWAD (no example leaves its
client), clusters the clients into 5 groups by spectral clustering (scikit-learn) with the
paper's three settings (a Gaussian affinity of the distances; 3- and 5-nearest-neighbour
graphs), and trains FedAvg per cluster and over all clients. Accuracy is each client's own test
split (same classes as its train split), averaged over clients. Writes the table between the
fedwad_clustering markers of docs/results.md and draws docs/figures/fedwad_clustering.png (the
seed-0 OTDD matrices, clients ordered by planted class pair).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402
from tqdm import tqdm  # noqa: E402

from secureffm.data.digits import STRUCTURES, class_pair_split  # noqa: E402
from secureffm.federation.log import MessageLog  # noqa: E402
from secureffm.methods.client_clustering import (  # noqa: E402
    FedAvgConfig,
    accuracy,
    cluster_clients,
    clustered_fedavg,
)
from secureffm.methods.fedwad import FedWADConfig  # noqa: E402
from secureffm.methods.otdd import OTDDClient, federated_otdd, labelled_clients  # noqa: E402
from secureffm.protocols.protocol import load_protocol  # noqa: E402
from secureffm.reporting import mean_std, write_block  # noqa: E402
from secureffm.runs.scaffold import open_channel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"global": None, "affinity": ("rbf", 0), "sparse G. (3)": ("knn", 3),
            "sparse G. (5)": ("knn", 5)}


def one_run(structure: str, seed: int, args, out: Path) -> dict:
    """OTDD matrix, clusterings and FedAvg accuracies of one split; cached in out/result.json."""
    cached = out / "result.json"
    if cached.exists():
        return json.loads(cached.read_text())
    shards = class_pair_split(structure, clients=args.clients, seed=seed)
    pairs = sorted({s.classes for s in shards})
    planted = np.array([pairs.index(s.classes) for s in shards])
    protocol = load_protocol(args.protocol)
    clients = labelled_clients([s.x_train for s in shards], [s.y_train for s in shards],
                               deterministic_seed=seed)
    fedwad = FedWADConfig(iterations=args.iterations, support_size=args.support, seed=seed)
    privacy = protocol.geodesic_privacy()
    channel = open_channel(protocol, clients, MessageLog(out / "otdd" / "messages.jsonl"),
                           program=OTDDClient(fedwad, privacy))
    try:
        otdd = federated_otdd(channel, privacy, fedwad)
    finally:
        channel.close()
    config = FedAvgConfig(rounds=args.rounds, local_epochs=args.local_epochs)
    dp = protocol.dp_settings(("update",), "FedAvg")  # FedAvg refuses any: plain local SGD

    def cluster_channel(members, folder: Path, program):
        return open_channel(protocol, members, MessageLog(folder / "messages.jsonl"),
                            program=program)

    result = {"classes": [list(s.classes) for s in shards], "distances": otdd.distances.tolist(),
              "accuracy": {}, "ari": {}, "clusters": {}}
    for name, setting in SETTINGS.items():
        if setting is None:
            assignment = np.zeros(len(clients), dtype=np.int64)
        else:
            affinity, neighbours = setting
            assignment = cluster_clients(otdd.distances, args.n_clusters, affinity,
                                         neighbours or 3, seed)
        # fresh client streams per setting, so every FedAvg sees the same batches (seeded:
        # a utility comparison under plaintext, not a private run)
        clients = labelled_clients([s.x_train for s in shards], [s.y_train for s in shards],
                                   deterministic_seed=seed)
        models = clustered_fedavg(clients, assignment, cluster_channel,
                                  out / name.replace(" ", ""), config, dp=dp, seed=seed)
        result["accuracy"][name] = float(np.mean([accuracy(models[c.id], s.x_test, s.y_test)
                                                  for c, s in zip(clients, shards, strict=True)]))
        result["ari"][name] = float(adjusted_rand_score(planted, assignment))
        result["clusters"][name] = assignment.tolist()
    cached.write_text(json.dumps(result))
    return result


def draw(results: dict, path: Path) -> None:
    """The seed-0 OTDD matrix per split, clients sorted by their class pair."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.6))
    for ax, (structure, result) in zip(np.atleast_1d(axes), results.items(), strict=True):
        order = sorted(range(len(result["classes"])), key=lambda i: result["classes"][i])
        d = np.asarray(result["distances"])[np.ix_(order, order)]
        np.fill_diagonal(d, np.nan)  # blank: zero by definition, it would flatten the scale
        image = ax.imshow(d, cmap="viridis")
        names = [f"{a},{b}" for a, b in (result["classes"][i] for i in order)]
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_yticks(range(len(names)), names, fontsize=6)
        ax.set_title(f"{structure} split: federated OTDD (FedWAD)\nclients labelled by their "
                     "class pair", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--n-clusters", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--support", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--protocol", default="plaintext")
    parser.add_argument("--root", default=str(ROOT / "runs" / "fedwad_clustering"))
    parser.add_argument("--docs", default=str(ROOT / "docs"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = [(structure, seed) for structure in STRUCTURES for seed in range(args.seeds)]
    results: dict[str, list[dict]] = {s: [] for s in STRUCTURES}
    for structure, seed in tqdm(runs, desc="splits x seeds", unit="run"):
        out = Path(args.root) / f"{structure}-s{seed}"
        results[structure].append(one_run(structure, seed, args, out))
    draw({s: r[0] for s, r in results.items()},
         Path(args.docs) / "figures" / "fedwad_clustering.png")

    rows = []
    for structure, runs_ in results.items():
        cells = []
        for name in SETTINGS:
            mean, std = mean_std([100 * r["accuracy"][name] for r in runs_])
            cells.append(f"{mean:.1f} ± {std:.1f}")
        ari = (" / ".join(f"{mean_std([r['ari'][n] for r in runs_])[0]:.2f}"
                          for n in list(SETTINGS)[1:])
               if structure == "clusters" else "no planted clusters")
        rows.append(f"| {structure} | " + " | ".join(cells) + f" | {ari} |")
    text = (f"FedAvg accuracy (%) on scikit-learn's digits over {args.clients} clients holding "
            f"two classes each, mean ± std over {args.seeds} seeds (split, clustering and "
            f"training seeded together). Each client's test split has its train split's "
            f"classes; accuracy is the mean over clients. Clustering: spectral clustering into "
            f"{args.n_clusters} groups of the {args.clients} x {args.clients} federated OTDD "
            f"matrix (FedWAD, support {args.support}, {args.iterations} iterations, for "
            f"class-to-class and for "
            f"client-to-client distances). FedAvg: a 64-64-10 ReLU MLP, {args.rounds} rounds of "
            f"{args.local_epochs} local epoch(s), SGD lr 0.05, batch 16, protocol "
            f"`{args.protocol}`. ARI: adjusted Rand index of the clusters against the clients' "
            f"class pairs (affinity / sparse G. (3) / sparse G. (5)), for the planted split. "
            "Written by "
            "`experiments/fedwad_clustering.py`; OTDD matrices: "
            "[figures/fedwad_clustering.png](figures/fedwad_clustering.png).\n\n"
            "| split | FedAvg | clustered: affinity | clustered: sparse G. (3) | "
            "clustered: sparse G. (5) | ARI |\n| --- | --- | --- | --- | --- | --- |\n"
            + "\n".join(rows))
    write_block(Path(args.docs) / "results.md", "fedwad_clustering", text)
    print(text)


if __name__ == "__main__":
    main()
