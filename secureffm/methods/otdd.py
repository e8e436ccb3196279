"""Optimal transport dataset distance (OTDD, Alvarez-Melis and Fusi 2020), central and federated.

OTDD is the 2-Wasserstein distance between two labelled data sets under the ground cost

.. math::
    d((x, y), (x', y'))^2 = |x - x'|^2 + W_2^2(\\alpha_y, \\alpha_{y'})

where alpha_y is the empirical distribution of the features of class y. Centrally
(:func:`otdd_exact`) every W_2 is POT's exact solver.

Federated (:func:`federated_otdd`, FedWAD Sec. 4 and App. D.3), no example leaves its client:

1. each client computes the W_2 distances between its own classes and sends them (``scalar``);
2. the distance between a class of one client and a class of another is computed by FedWAD
   between the two class-conditional samples (``measure`` and ``scalar`` messages);
3. the server embeds all the clients' classes by classical multidimensional scaling of that
   label-distance matrix (as Alvarez-Melis and Fusi 2021 do for their flows), so that
   |e_y - e_y'| ~ W_2(alpha_y, alpha_y'), and sends each client the vectors of its own classes;
4. each client augments its examples to z = [x, e_y]; the OTDD between two clients is FedWAD
   between their augmented samples, whose Euclidean cost is the ground cost above.

A client's labels live in ``client.state["labels"]`` (int64, one per row of ``client.data``).
Each client runs :class:`OTDDClient` (its own program, on any engine): it computes its class
distances, selects its class rows and augments its own rows; the server reads no client's data.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch
from sklearn.manifold import ClassicalMDS

from ..errors import DataError, ProtocolError
from ..federation.channel import Channel, Task, TaskRefused
from ..federation.message import SERVER, Payload
from ..federation.parties import Client, new_clients
from ..ot import emd_cost, squared_distances
from ..privacy.settings import GeodesicPrivacy
from ..progress import progress_bar
from .fedwad import FedWADConfig
from .fedwad_federated import (
    EMBEDDING,
    LABELS,
    FedWADClient,
    Rows,
    augment,
    client_labels,
    client_samples,
    federated_distance,
    rounds_per_distance,
    sample_dim,
)

__all__ = ["LABELS", "labelled_clients", "client_labels", "class_distances", "otdd_exact",
           "label_embedding", "augment", "OTDDResult", "federated_otdd", "OTDDClient"]


def labelled_clients(features: list[np.ndarray], labels: list[np.ndarray], *,
                     deterministic_seed: int | None = None) -> list[Client]:
    """Clients ``client-1``, ... holding features [N_i, d] (float32 tensors) and their labels.

    Their secret streams come from OS entropy; ``deterministic_seed`` derives them from a seed
    instead (tests and debugging only: see :class:`~secureffm.federation.parties.SecretStreams`).
    """
    if len(features) != len(labels):
        raise DataError(f"{len(features)} feature arrays but {len(labels)} label arrays; give "
                        "one of each per client")
    clients = new_clients([torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in features],
                          deterministic_seed)
    for client, y in zip(clients, labels, strict=True):
        client.state[LABELS] = np.asarray(y)
        client_labels(client)
    return clients


def _exact_w2(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(max(emd_cost(squared_distances(x, y)), 0.0)))


def class_distances(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classes present in ``y`` [N] (sorted) and the exact W_2 between their feature
    distributions (rows of ``x`` [N, d]), shape [C, C]."""
    classes = np.unique(y)
    dist = np.zeros((len(classes), len(classes)))
    for i in range(len(classes)):
        for j in range(i + 1, len(classes)):
            dist[i, j] = dist[j, i] = _exact_w2(x[y == classes[i]], x[y == classes[j]])
    return classes, dist


def otdd_exact(x_a: np.ndarray, y_a: np.ndarray, x_b: np.ndarray, y_b: np.ndarray) -> float:
    """OTDD between (x_a [N, d], y_a [N]) and (x_b [M, d], y_b [M]) with POT's exact solver
    for the label distances and for the outer problem (module docstring)."""
    ca, cb = np.unique(y_a), np.unique(y_b)
    label = np.array([[_exact_w2(x_a[y_a == a], x_b[y_b == b]) for b in cb] for a in ca])
    ia, ib = np.searchsorted(ca, y_a), np.searchsorted(cb, y_b)
    cost = squared_distances(x_a, x_b) + label[ia][:, ib] ** 2
    return float(np.sqrt(max(emd_cost(cost), 0.0)))


def label_embedding(distances: np.ndarray) -> np.ndarray:
    """Vectors e [L, r] with |e_i - e_j| ~ distances[i, j] ([L, L]) by classical MDS
    (scikit-learn), keeping the components with positive eigenvalues (exact when the distances
    are Euclidean)."""
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or not np.isfinite(d).all():
        raise DataError(f"label distances must be a finite square matrix, got shape {d.shape}")
    if len(d) == 1:
        return np.zeros((1, 1))
    mds = ClassicalMDS(n_components=len(d) - 1, metric="precomputed")
    with np.errstate(invalid="ignore"):
        mds.fit(d)
    keep = mds.eigenvalues_ > 1e-10 * max(float(mds.eigenvalues_[0]), 1e-300)
    if not keep.any():
        return np.zeros((len(d), 1))
    return mds.embedding_[:, keep]


@dataclass(frozen=True)
class OTDDResult:
    """What the server holds after :func:`federated_otdd`.

    ``distances`` [n, n]: OTDD between clients (channel order), by FedWAD. ``labels``: (client
    id, class) per row of ``label_distances`` [L, L] (exact within a client, FedWAD across) and
    of ``embedding`` [L, r] (classical MDS of it).
    """

    distances: np.ndarray
    labels: tuple[tuple[str, int], ...]
    label_distances: np.ndarray
    embedding: np.ndarray


class OTDDClient:
    """OTDD's client side: the task ``otdd.class_distances`` (its classes [C] and the exact W_2
    between them [C, C], step 1) and FedWAD's tasks (:class:`FedWADClient`) on its class rows
    (``label_config``, step 2) or its augmented rows (``augment``: ``config``, step 4), from
    its own copies of the configs and the protocol's randomized-t protections (``privacy``)."""

    TASKS = ("otdd.class_distances", *FedWADClient.TASKS)

    def __init__(self, config: FedWADConfig, privacy: GeodesicPrivacy | None,
                 label_config: FedWADConfig | None = None):
        self.outer = FedWADClient(config, privacy)
        self.classes = FedWADClient(label_config or config, privacy)

    def __call__(self, client: Client, task: Task) -> Payload:
        if task.name != "otdd.class_distances":
            return (self.outer if task.args.get("augment") else self.classes)(client, task)
        if task.args:
            raise TaskRefused(f"{client.id} refused {task.name} with {sorted(task.args)}: "
                              "it takes no arguments")
        classes, distances = class_distances(client_samples(client), client_labels(client))
        return {"classes": classes, "distances": distances}


def _lost(what: str, client: str) -> ProtocolError:
    return ProtocolError(f"federated OTDD needs every client's {what}, but a message of "
                         f"{client} was lost (see the log's events); rerun without that client")


def _fedwad(channel: Channel, privacy: GeodesicPrivacy | None, sides: list[Rows],
            config: FedWADConfig, round_: int, what: str, dim: int) -> float:
    try:
        return federated_distance(channel, privacy, sides[0], sides[1], config, round_,
                                  dim=dim).distance
    except ProtocolError as err:
        raise _lost(what, f"{sides[0].client} or {sides[1].client}") from err


def federated_otdd(channel: Channel, privacy: GeodesicPrivacy | None, config: FedWADConfig,
                   label_config: FedWADConfig | None = None, show_progress: bool = True,
                   dim: int | None = None) -> OTDDResult:
    """OTDD between every pair of ``channel``'s clients, each running :class:`OTDDClient`, no
    example leaving its client (module docstring, steps 1-4). ``privacy``: the randomized-t
    protections of measure messages, or None. ``config``: FedWAD for the client-to-client
    distances on augmented rows; ``label_config``: FedWAD for the class-to-class distances
    (default ``config``). ``dim``: the features' dimension d by the public data recipe, needed
    when the clients run elsewhere (on Flower). Rounds count up from 1, one per FedWAD
    iteration.
    """
    label_config = label_config or config
    clients = channel.clients
    if len(clients) < 2:
        raise DataError("federated OTDD compares clients: the federation needs at least two")
    dim = sample_dim(channel.clients[0], dim)
    # 1. each client's own class-to-class distances (scalar)
    labels_of, blocks = [], []
    for client in clients:
        got = channel.send(1, "upload", "scalar", client.id, SERVER,
                           Task("otdd.class_distances"))
        if got is None:
            raise _lost("class distances", client.id)
        labels_of.extend((client.id, int(c)) for c in got["classes"])
        blocks.append(got["distances"])
    index = {label: i for i, label in enumerate(labels_of)}
    label_distances = np.zeros((len(labels_of), len(labels_of)))
    start = 0
    for block in blocks:
        label_distances[start:start + len(block), start:start + len(block)] = block
        start += len(block)
    # 2. class-to-class distances across clients, by FedWAD between class subsets
    cross = [(a, b) for a, b in combinations(labels_of, 2) if a[0] != b[0]]
    round_ = 2
    for a, b in progress_bar(cross, desc="OTDD class distances (FedWAD)",
                             disable=not show_progress, leave=False):
        sides = [Rows(cid, label=cls) for cid, cls in (a, b)]
        distance = _fedwad(channel, privacy, sides, label_config, round_,
                           "class-to-class distances", dim)
        round_ += rounds_per_distance(label_config)
        label_distances[index[a], index[b]] = label_distances[index[b], index[a]] = distance
    # 3. the server embeds the classes and sends each client its own classes' vectors
    embedding = label_embedding(label_distances)
    for client in clients:
        mine = [i for i, (cid, _) in enumerate(labels_of) if cid == client.id]
        got = channel.send(round_, "broadcast", EMBEDDING, SERVER, client.id,
                           {"classes": np.array([labels_of[i][1] for i in mine]),
                            "embedding": embedding[mine]})
        if got is None:
            raise _lost("label embedding", client.id)
    round_ += 1
    # 4. client-to-client OTDD, by FedWAD between the rows each client augments itself
    n = len(clients)
    distances = np.zeros((n, n))
    pairs = list(combinations(range(n), 2))
    for i, j in progress_bar(pairs, desc="OTDD client distances (FedWAD)",
                             disable=not show_progress, leave=False):
        sides = [Rows(c.id, augment=True) for c in (clients[i], clients[j])]
        distances[i, j] = distances[j, i] = _fedwad(channel, privacy, sides, config, round_,
                                                    "OTDD messages", dim + embedding.shape[1])
        round_ += rounds_per_distance(config)
    return OTDDResult(distances, tuple(labels_of), label_distances, embedding)
