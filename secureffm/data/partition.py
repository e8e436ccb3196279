"""Split a labelled pool over clients: disjoint label groups, IID, or Dirichlet(alpha)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError

__all__ = ["partition"]


def partition(
    labels: np.ndarray,
    clients: int,
    scheme: str,
    rng: np.random.Generator,
    *,
    disjoint_order: tuple[int, ...] = (),
    alpha: float = 0.5,
) -> list[np.ndarray]:
    """Indices of ``labels`` (shape [N]) held by each client.

    - ``iid``: a random permutation cut into equal parts.
    - ``disjoint``: ``disjoint_order`` cut into ``clients`` contiguous label groups; a client
      holds every point whose label is in its group.
    - ``dirichlet``: for each label, client proportions ~ Dirichlet(alpha * 1) (Hsu et al. 2019);
      small alpha gives skewed label mixes.
    """
    if clients < 1:
        raise DataError(f"clients = {clients}: need at least one client")
    if scheme == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), clients)]
    if scheme == "disjoint":
        order = disjoint_order or tuple(int(v) for v in np.unique(labels))
        if clients > len(order):
            raise DataError(
                f"a disjoint partition gives each client its own labels, but this data set has "
                f"{len(order)} label group(s) for {clients} clients; use fewer clients or "
                "partition = 'iid' or 'dirichlet'"
            )
        groups = np.array_split(np.asarray(order), clients)
        return [np.flatnonzero(np.isin(labels, group)) for group in groups]
    if scheme == "dirichlet":
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for label in np.unique(labels):
            index = rng.permutation(np.flatnonzero(labels == label))
            shares = rng.dirichlet(np.full(clients, alpha))
            # rounded, not truncated: truncation handed the last client every label's leftovers
            cuts = np.round(np.cumsum(shares)[:-1] * len(index)).astype(int)
            for client, piece in enumerate(np.split(index, cuts)):
                parts[client].append(piece)
        return [np.sort(np.concatenate(p)) for p in parts]
    raise DataError(f"partition = {scheme!r} is unknown; use 'disjoint', 'iid' or 'dirichlet'")
