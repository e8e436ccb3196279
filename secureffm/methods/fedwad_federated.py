"""FedWAD across parties: Algorithm 1 through the channel, one message per measure.

Iteration k (round ``round_ + k - 1``): the server sends xi^(k-1) to both clients
(``measure``, phase ``broadcast``); each client interpolates between its own data (t = 0) and
xi^(k-1) (t = 1) at a t it draws and keeps, and returns that measure (``measure``, phase
``upload``); the server interpolates between the two at its own t to get xi^(k). A last round
sends xi^(K) and each client returns W_p(its data, xi^(K)) (``scalar``). Under a protocol
without the ``randomized-t`` stage, clients also return W_p(data, xi^(k-1)) every iteration and
the server keeps the smallest bound; under it (``privacy``, resolved by the runner from the
protocol), t's range and the noise on support points come from the stage and only the last
distances are sent. Samples never leave a client: the server
sees measures and scalars, and the sample dimension d (public, as the task is).

Either side may also be a measure the server holds itself (a coreset): the server then
interpolates and measures that side on its own, with no message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError, DataError, MessageError, ProtocolError
from ..federation.channel import Channel
from ..federation.message import SERVER, Payload
from ..federation.parties import Client
from ..privacy.settings import GeodesicPrivacy
from .fedwad import (
    FedWADConfig,
    FedWADResult,
    Measure,
    add_noise,
    check_samples,
    initial_measure,
    interpolate,
    interpolate_with_distance,
    wasserstein,
)

__all__ = ["federated_distance", "pairwise_distances", "client_samples", "measure_payload",
           "payload_measure", "rounds_per_distance", "ClientRows", "Side"]


@dataclass(frozen=True)
class ClientRows:
    """Rows [N, d] (float64) a client holds and never sends: its data, a subset (one class),
    or its data with appended features."""

    client: Client
    rows: np.ndarray


# One side of a federated distance: a client id (its whole shard), rows a client holds, or a
# measure the server holds.
Side = str | ClientRows | Measure


def rounds_per_distance(config: FedWADConfig) -> int:
    """Rounds one federated distance takes: K iterations and the final distances."""
    return config.iterations + 1


def client_samples(client: Client) -> np.ndarray:
    """The client's data as float64 numpy [N, d] (the torch-to-POT boundary), validated."""
    return check_samples(client.data.detach().cpu().numpy(), f"client {client.id}'s data")


def measure_payload(measure: Measure) -> Payload:
    """A measure as a message payload: ``support`` [S, d] and ``weights`` [S], float64."""
    return {"support": measure.support, "weights": measure.weights}


def payload_measure(payload: Payload, sender: str, dim: int) -> Measure:
    """The measure in a received payload; a malformed one is a MessageError naming ``sender``."""
    if set(payload) != {"support", "weights"}:
        raise MessageError(f"measure from {sender} must hold exactly 'support' and 'weights'; "
                           f"it holds {sorted(payload)}")
    support = payload["support"]
    if support.ndim != 2 or support.shape[1] != dim:
        raise MessageError(f"measure from {sender} has support of shape {support.shape}; "
                           f"expected [S, {dim}]")
    try:
        return Measure(support, payload["weights"])
    except DataError as err:
        raise MessageError(f"measure from {sender} is not a valid measure: {err}") from None


def _client(channel: Channel, client_id: str) -> Client:
    for client in channel.clients:
        if client.id == client_id:
            return client
    known = ", ".join(c.id for c in channel.clients)
    raise ConfigError(f"no client {client_id!r} in this federation; clients are {known}")


def _protections(privacy: GeodesicPrivacy | None,
                 config: FedWADConfig) -> tuple[tuple[float, float], float, bool]:
    """(t range, noise std, distances only at the end) under ``privacy``."""
    if privacy is None:
        return config.t_range, config.noise_std, False
    return (privacy.t_low, privacy.t_high), privacy.noise_std, True


def _deliver(channel: Channel, round_: int, phase: str, kind: str, sender: str, recipient: str,
             payload: Payload) -> Payload:
    received = channel.send(round_, phase, kind, sender, recipient, payload)
    if received is None:
        party = recipient if sender == SERVER else sender
        raise ProtocolError(f"FedWAD round {round_}: the {kind} message from {sender} to "
                            f"{recipient} did not arrive (phase {phase}; the log names why); "
                            f"FedWAD needs every iteration of both clients, so {party} must "
                            "stay online")
    return received


def _scalar(payload: Payload, sender: str) -> float:
    value = payload.get("distance")
    if value is None or value.shape != (1,) or not np.isfinite(value).all() or value[0] < 0:
        raise MessageError(f"distance from {sender} must be one finite non-negative number")
    return float(value[0])


def _resolve(channel: Channel, side: Side) -> ClientRows | Measure:
    if isinstance(side, str):
        client = _client(channel, side)
        return ClientRows(client, client_samples(client))
    if isinstance(side, ClientRows):
        return ClientRows(side.client, check_samples(side.rows, f"{side.client.id}'s rows"))
    return side


def _name(side: ClientRows | Measure) -> str:
    return side.client.id if isinstance(side, ClientRows) else SERVER


def _dim(side: ClientRows | Measure) -> int:
    return side.rows.shape[1] if isinstance(side, ClientRows) else side.dim


def federated_distance(channel: Channel, privacy: GeodesicPrivacy | None, a: Side, b: Side,
                       config: FedWADConfig, round_: int = 1,
                       init: Measure | None = None) -> FedWADResult:
    """W_p between two sides by Algorithm 1 through ``channel``: each side a client id (its
    data), :class:`ClientRows` (rows a client holds) or a :class:`Measure` the server holds.
    ``privacy``: the randomized-t protections of measure messages, or None.

    Uses rounds ``round_`` .. ``round_ + K``. The server's generator (xi^(0), its t, and
    the t of a side it holds) is seeded by (config.seed, round_); each client draws its t and
    noise from its own ``protocol_rng``. ``init``: xi^(0) instead of a Gaussian draw. Returns
    the bounds the server learned (every iterate, or only xi^(K) under ``randomized-t``) and
    the best of them. A message that does not arrive raises ProtocolError (the log says why).
    """
    sides = [_resolve(channel, a), _resolve(channel, b)]
    names = [_name(s) for s in sides]
    if (isinstance(a, str) and a == b) or names == [SERVER, SERVER]:
        raise ConfigError(f"FedWAD compares data of two parties, at least one a client; got "
                          f"{names[0]!r} and {names[1]!r}")
    dim = _dim(sides[0])
    if _dim(sides[1]) != dim:
        raise DataError(f"{names[0]} holds {dim}-dimensional samples and {names[1]} "
                        f"{_dim(sides[1])}-dimensional ones; FedWAD compares one space")
    t_range, noise_std, private = _protections(privacy, config)
    server_rng = np.random.default_rng([config.seed, round_])
    xi = initial_measure(config, dim, server_rng) if init is None else init
    if xi.dim != dim:
        raise DataError(f"the initial measure has dimension {xi.dim}, the data {dim}")
    p, exact, tol = config.p, config.exact, config.prune_tol
    low, high = t_range
    measures, bounds, evaluated = [xi], [], []
    for k in range(1, config.iterations + 1):
        r = round_ + k - 1
        returned, distances = [], []
        for side in sides:
            if isinstance(side, Measure):  # the server's own side: no message
                moved, distance = interpolate_with_distance(
                    side, xi, float(server_rng.uniform(low, high)), p, exact, tol)
                returned.append(moved)
                distances.append(distance)
                continue
            client = side.client
            got = _deliver(channel, r, "broadcast", "measure", SERVER, client.id,
                           measure_payload(xi))
            local = payload_measure(got, SERVER, dim)
            t = float(client.protocol_rng.uniform(low, high))
            moved, distance = interpolate_with_distance(Measure.uniform(side.rows), local, t, p,
                                                        exact, tol)
            moved = add_noise(moved, noise_std, client.protocol_rng)
            got = _deliver(channel, r, "upload", "measure", client.id, SERVER,
                           measure_payload(moved))
            returned.append(payload_measure(got, client.id, dim))
            if not private:
                got = _deliver(channel, r, "upload", "scalar", client.id, SERVER,
                               {"distance": np.array([distance])})
                distances.append(_scalar(got, client.id))
        if not private:
            bounds.append(sum(distances))
            evaluated.append(k - 1)
        xi = interpolate(returned[0], returned[1], float(server_rng.uniform(low, high)), p,
                         exact, tol)
        measures.append(xi)
    final = round_ + config.iterations
    total = 0.0
    for side in sides:
        if isinstance(side, Measure):
            total += wasserstein(side, xi, p)
            continue
        client = side.client
        got = _deliver(channel, final, "broadcast", "measure", SERVER, client.id,
                       measure_payload(xi))
        local = payload_measure(got, SERVER, dim)
        distance = wasserstein(Measure.uniform(side.rows), local, p)
        got = _deliver(channel, final, "upload", "scalar", client.id, SERVER,
                       {"distance": np.array([distance])})
        total += _scalar(got, client.id)
    bounds.append(total)
    evaluated.append(config.iterations)
    best = int(np.argmin(bounds))
    return FedWADResult(float(bounds[best]), tuple(bounds), tuple(evaluated), evaluated[best],
                        measures[evaluated[best]])


def pairwise_distances(channel: Channel, privacy: GeodesicPrivacy | None,
                       config: FedWADConfig, round_: int = 1,
                       progress: bool = False) -> np.ndarray:
    """FedWAD between every pair of the channel's clients, orchestrated by the server.

    Pairs run one after another in consecutive blocks of :func:`rounds_per_distance` rounds
    from ``round_``. Returns [n, n] in the order of ``channel.clients``: symmetric, zero
    diagonal.
    """
    ids = [c.id for c in channel.clients]
    if len(ids) < 2:
        raise ConfigError(f"pairwise FedWAD needs at least 2 clients; this federation has "
                          f"{len(ids)}")
    pairs = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids))]
    matrix = np.zeros((len(ids), len(ids)))
    for n, (i, j) in enumerate(tqdm(pairs, desc="FedWAD pairs", unit="pair",
                                    disable=not progress, dynamic_ncols=True)):
        result = federated_distance(channel, privacy, ids[i], ids[j], config,
                                    round_ + n * rounds_per_distance(config))
        matrix[i, j] = matrix[j, i] = result.distance
    return matrix
