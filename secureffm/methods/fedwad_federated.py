"""FedWAD across parties: Algorithm 1 through the channel, one message per measure.

Iteration k (round ``round_ + k - 1``): the server sends xi^(k-1) to both clients
(``measure``, phase ``broadcast``), which keep it in their inbox; each asked client runs
``fedwad.interpolate``: it interpolates between its own rows (t = 0) and xi^(k-1) (t = 1) at a t
it draws and keeps, and returns that measure (``measure``, phase ``upload``); the server
interpolates between the two at its own t to get xi^(k). A last round sends xi^(K) and each
client returns W_p(its rows, xi^(K)) (``fedwad.final``, ``scalar``), with its rows' mean and
spread in the same message when its own ``config.bracket`` says so: they give a lower bound
(:mod:`.fedwad_bounds`). Under a protocol without the
``randomized-t`` stage, clients also return W_p(rows, xi^(k-1)) every iteration
(``fedwad.distance``) and the server keeps the smallest bound; under it (``privacy``, resolved by
the runner from the protocol), t's range and the noise on support points come from the stage
and only the last distances are sent. Samples never leave a client: the server sees measures
and scalars, and the sample dimension d (public, as the task is).

The client's side is :class:`FedWADClient`, a program of named tasks built from the client's
own run config and protocol: its t range, its noise and when it gives a distance never come
from the server's request (a task asking otherwise is refused in the client's signed event).
A client side names its rows (:class:`Rows`): its whole shard, one class, its rows with its
classes' label vectors appended (OTDD), or a subsample its own program draws (coresets); the
client selects them itself, so no server code reads its data. Either side may also be a measure
the server holds itself (a coreset): the server then interpolates and measures that side on its
own, with no message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError, DataError, MessageError, ProtocolError
from ..federation.channel import Channel, Compute, Task, TaskRefused, task_count
from ..federation.message import SERVER, Payload
from ..federation.parties import Client
from ..privacy.releases import ReleaseGuard, Rounds
from ..privacy.settings import GeodesicPrivacy
from ..progress import progress_bar
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
from .fedwad_bounds import Moments, lower_bound, moments

__all__ = ["federated_distance", "pairwise_distances", "pairwise_brackets", "client_samples",
           "measure_payload", "payload_measure", "rounds_per_distance", "Rows", "Side",
           "FedWADClient", "LABELS", "EMBEDDING", "client_labels", "augment", "sample_dim"]

LABELS = "labels"
EMBEDDING = "label_embedding"  # the kind of the server's message of label vectors (OTDD)


@dataclass(frozen=True)
class Rows:
    """Rows a client selects from its own data by name, in this order: its shard, with
    (``augment``) its classes' label vectors appended ([x, e_y], from the server's
    ``label_embedding`` message), of (``label``) one class of its labels
    (``client.state["labels"]``), subsampled (``sample`` > 0) to that many rows its own
    generator draws once per distance (only the count its own program allows)."""

    client: str
    label: int | None = None
    augment: bool = False
    sample: int = 0

    def args(self) -> dict:
        """The task's args: the fields that differ from the whole shard."""
        out = {"label": self.label, "augment": self.augment or None,
               "sample": self.sample or None}
        return {k: v for k, v in out.items() if v is not None}


# One side of a federated distance: a client id (its whole shard), rows a client names, or a
# measure the server holds.
Side = str | Rows | Measure


def rounds_per_distance(config: FedWADConfig) -> int:
    """Rounds one federated distance takes: K iterations and the final distances."""
    return config.iterations + 1


def client_samples(client: Client) -> np.ndarray:
    """The client's data as float64 numpy [N, d] (the torch-to-POT boundary), validated."""
    return check_samples(client.data.detach().cpu().numpy(), f"client {client.id}'s data")


def client_labels(client: Client) -> np.ndarray:
    """The client's labels [N] as int64; a missing or mismatched label array is a DataError."""
    labels = client.state.get(LABELS)
    if labels is None:
        raise DataError(f"{client.id} holds no labels; put one integer label per row of its "
                        f"data in client.state[{LABELS!r}] (see otdd.labelled_clients)")
    labels = np.asarray(labels)
    if labels.shape != (client.size,) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{client.id} has labels of shape {labels.shape} and dtype "
                        f"{labels.dtype}; need integers of shape ({client.size},)")
    return labels.astype(np.int64)


def augment(x: np.ndarray, y: np.ndarray, classes: np.ndarray,
            embedding: np.ndarray) -> np.ndarray:
    """Rows [x_i, e_{y_i}], shape [N, d + r], with ``embedding`` [C, r] the vectors of
    ``classes`` [C]."""
    index = np.searchsorted(classes, y)
    if (index >= len(classes)).any() or not np.array_equal(classes[index], y):
        raise DataError("a label has no embedding vector; every class of the client must have "
                        "been embedded")
    return np.concatenate([x, embedding[index]], axis=1)


def sample_dim(client: Client, dim: int | None) -> int:
    """The samples' dimension d: ``dim`` (public, what a server of clients that run elsewhere
    knows), else, in-process only, the shape of ``client``'s data."""
    if dim is not None:
        return int(dim)
    if not isinstance(client, Client):
        raise ConfigError(f"{client.id} runs elsewhere: give the samples' dimension (dim)")
    return int(client.data.shape[1])


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


def _protections(privacy: GeodesicPrivacy | None,
                 config: FedWADConfig) -> tuple[tuple[float, float], float, bool]:
    """(t range, noise std, distances only at the end) under ``privacy``."""
    if privacy is None:
        return config.t_range, config.noise_std, False
    return (privacy.t_low, privacy.t_high), privacy.noise_std, True


# What a client keeps in ``client.state`` between tasks (plain values, so a snapshot carries them).
_KEPT = "fedwad.kept"  # W_p(rows, xi) of its last interpolation, until the server takes it
_MOVES = "fedwad.moves"  # interpolations since its last final distance
_SUBSAMPLE = "fedwad.subsample"  # indices of the rows it drew for the current distance


class FedWADClient:
    """FedWAD's client side: the tasks ``fedwad.interpolate`` of round ``{"round": r}`` (a
    moved measure [S, d]), ``fedwad.distance`` (W_p(rows, xi) of that interpolation,
    ``{"distance": [1]}``) and ``fedwad.final`` (W_p(rows, xi) for the measure in its inbox,
    and, only if its own ``config.bracket`` releases them, the rows' ``"mean"`` [d] and
    ``"spread"`` [d], each coordinate's standard deviation), each with the optional args of
    :class:`Rows` (``label``, ``augment``, ``sample``), on the measure the server left in
    ``client.inbox["measure"]``.

    ``config`` and ``privacy`` are the client's own (its run config, its copy of the
    protocol's randomized-t stage): t ~ U(its range) and the noise come from its own
    ``protocol_rng``; under randomized-t it refuses a per-iteration distance and gives at most
    one final distance per ``config.iterations`` interpolations, so a server cannot hold
    W_p(rows, xi) for a measure whose interpolation it holds (which gives t). A task with any
    other argument (a t, a range, a noise) is refused: the server sets none of them.
    ``samples``: the subsample size its own use allows (a coreset's ``samples_per_client``;
    0: none); a task naming another ``sample`` is refused (a few rows, moved towards xi, give
    those rows away). ``min_class_rows``: the fewest rows of one class (``label``) it computes
    on, for the same reason (default 10). Its interpolations are its releases
    (:class:`~secureffm.privacy.releases.ReleaseGuard`): one per round (a second, at a fresh t
    toward the same measure, would show the server where its rows lie on the line), and under
    randomized-t at most ``config.iterations`` between two final distances.
    """

    TASKS = ("fedwad.interpolate", "fedwad.distance", "fedwad.final")
    ARGS = ("label", "augment", "sample")

    def __init__(self, config: FedWADConfig, privacy: GeodesicPrivacy | None, samples: int = 0,
                 min_class_rows: int = 10):
        self.config = config
        self.samples = samples
        self.min_class_rows = min_class_rows
        self.t_range, self.noise_std, self.private = _protections(privacy, config)
        self.releases = ReleaseGuard({"fedwad.interpolate": Rounds(1, None)})

    def __call__(self, client: Client, task: Task) -> Payload:
        if task.name not in self.TASKS:
            raise TaskRefused(f"{client.id} runs {', '.join(self.TASKS)}, not {task.name!r}")
        moving = task.name == "fedwad.interpolate"
        allowed = (*self.ARGS, "round") if moving else self.ARGS
        extra = sorted(set(task.args) - set(allowed))
        if extra:
            raise TaskRefused(f"{client.id} refused {task.name} with {extra}: it takes only "
                              f"{', '.join(allowed)}; its t range, its noise and when it "
                              "sends a distance come from its own protocol and run config, "
                              "not the server")
        if task.name == "fedwad.distance":
            return self.distance(client)
        if moving and not client.state.get(_MOVES, 0):
            client.state.pop(_SUBSAMPLE, None)  # a new distance: a fresh subsample
        rows = self.rows(client, task.args)
        if moving:
            self._admit(client, task_count(client.id, task, "round"))
            return self.interpolate(client, rows)
        return self.final(client, rows)

    def _admit(self, client: Client, round_: int) -> None:
        """Refuse an interpolation of ``round_`` that is not the client's to release."""
        moves = client.state.get(_MOVES, 0)
        if self.private and moves >= self.config.iterations:
            raise TaskRefused(f"{client.id} refused fedwad.interpolate for round {round_}: under "
                              f"randomized-t it moves toward the server's measures "
                              f"{self.config.iterations} times per distance (its run's "
                              f"iterations) and made {moves} interpolation(s) since its last "
                              "final distance")
        refused = self.releases.admit(client.id, client.state, "fedwad.interpolate", round_)
        if refused:
            raise TaskRefused(refused)

    def rows(self, client: Client, args: dict) -> np.ndarray:
        """The client's rows [N, d (+ r)] float64 that ``args`` name (:class:`Rows`)."""
        data = client_samples(client)
        if args.get("augment", False) is not False:
            data = self._augmented(client, data, args["augment"])
        label = args.get("label")
        if label is not None:
            if isinstance(label, bool) or not isinstance(label, int):
                raise TaskRefused(f"{client.id} refused label {label!r}: name a class by its "
                                  "integer")
            data = data[client_labels(client) == label]
            if not len(data):
                raise TaskRefused(f"{client.id} holds no rows of class {label}")
            if len(data) < self.min_class_rows:
                raise TaskRefused(f"{client.id} holds {len(data)} rows of class {label}, fewer "
                                  f"than its min_class_rows = {self.min_class_rows}: a measure "
                                  "moved from so few rows gives them away")
        sample = args.get("sample", 0)
        if sample and (isinstance(sample, bool) or sample != self.samples
                       or not isinstance(sample, int)):
            raise TaskRefused(f"{client.id} refused a subsample of {sample!r} rows: its own "
                              f"config allows {self.samples or 'none'}")
        if 0 < sample < len(data):
            if _SUBSAMPLE not in client.state:
                order = torch.randperm(len(data), generator=client.generator,
                                       device=client.data.device)
                client.state[_SUBSAMPLE] = order[:sample].tolist()
            data = data[client.state[_SUBSAMPLE]]
        return data

    @staticmethod
    def _augmented(client: Client, data: np.ndarray, flag) -> np.ndarray:
        """[x, e_y] with the vectors of its classes from the server's ``label_embedding``."""
        if flag is not True:
            raise TaskRefused(f"{client.id} refused augment = {flag!r}: it is true or absent")
        sent = client.inbox.get(EMBEDDING)
        if sent is None or set(sent) != {"classes", "embedding"}:
            raise TaskRefused(f"{client.id} holds no label embedding (classes, embedding) from "
                              "the server to augment its rows with")
        classes, vectors = sent["classes"], sent["embedding"]
        if (classes.ndim != 1 or not np.issubdtype(classes.dtype, np.integer)
                or vectors.shape[:1] != classes.shape or vectors.ndim != 2
                or not np.isfinite(vectors).all()):
            raise TaskRefused(f"{client.id} refused the label embedding: need integer classes "
                              f"[C] and finite vectors [C, r]; got {classes.shape} "
                              f"{classes.dtype} and {vectors.shape}")
        try:
            return augment(data, client_labels(client), classes.astype(np.int64),
                           vectors.astype(np.float64))
        except DataError as err:
            raise TaskRefused(f"{client.id} refused the label embedding: {err}") from None

    def _received(self, client: Client, rows: np.ndarray) -> Measure:
        """xi: the measure the server left in the inbox, in the rows' dimension."""
        if "measure" not in client.inbox:
            raise TaskRefused(f"{client.id} holds no measure from the server to work on")
        try:
            return payload_measure(client.inbox["measure"], SERVER, rows.shape[1])
        except MessageError as err:
            raise TaskRefused(f"{client.id} refused the server's measure: {err}") from None

    def interpolate(self, client: Client, rows: np.ndarray) -> Payload:
        """The measure at the client's own t between ``rows`` (t = 0) and xi (t = 1), with its
        own noise; keeps W_p(rows, xi) for :meth:`distance`."""
        xi = self._received(client, rows)
        c = self.config
        t = float(client.protocol_rng.uniform(*self.t_range))
        moved, distance = interpolate_with_distance(Measure.uniform(rows), xi, t, c.p, c.exact,
                                                    c.prune_tol)
        client.state[_KEPT] = distance
        client.state[_MOVES] = client.state.get(_MOVES, 0) + 1
        return measure_payload(add_noise(moved, self.noise_std, client.protocol_rng))

    def distance(self, client: Client) -> Payload:
        """W_p(rows, xi) of the last interpolation, once; refused under randomized-t."""
        if self.private:
            raise TaskRefused(f"{client.id} refused a distance per iteration: under "
                              "randomized-t it sends W_p only at the last iteration (with the "
                              "measure it moved, a distance gives away its t)")
        if _KEPT not in client.state:
            raise TaskRefused(f"{client.id} has no interpolation whose distance it did not send")
        return {"distance": np.array([client.state.pop(_KEPT)])}

    def final(self, client: Client, rows: np.ndarray) -> Payload:
        """W_p(rows, xi) for the measure in the inbox; under randomized-t only after
        ``config.iterations`` interpolations since the last one."""
        moves = client.state.get(_MOVES, 0)
        if self.private and moves < self.config.iterations:
            raise TaskRefused(f"{client.id} refused a final distance after {moves} "
                              f"interpolation(s): under randomized-t it sends one per "
                              f"{self.config.iterations} (its run's iterations)")
        xi = self._received(client, rows)
        client.state[_MOVES] = 0
        client.state.pop(_KEPT, None)
        client.state.pop(_SUBSAMPLE, None)
        sent = {"distance": np.array([wasserstein(Measure.uniform(rows), xi, self.config.p)])}
        if self.config.bracket:
            found = moments(rows)
            sent.update(mean=found.mean, spread=found.spread)
        return sent


def _deliver(channel: Channel, round_: int, phase: str, kind: str, sender: str, recipient: str,
             payload: Payload | Compute) -> Payload:
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


def _moments(payload: Payload, sender: str, dim: int) -> Moments:
    if set(payload) != {"distance", "mean", "spread"}:
        raise MessageError(f"the final distance from {sender} came without its rows' mean and "
                           f"spread (it holds {sorted(payload)}): its own run config does not "
                           "release them; run without bracket (--no-bracket)")
    mean, spread = payload["mean"], payload["spread"]
    if mean.shape != (dim,) or spread.shape != (dim,):
        raise MessageError(f"moments from {sender} have shapes {mean.shape} and {spread.shape}; "
                           f"expected ({dim},) for both")
    try:
        return Moments(mean, spread)
    except DataError as err:
        raise MessageError(f"moments from {sender} are not valid: {err}") from None


@dataclass(frozen=True)
class _Asked:
    """A client side as the server drives it: the client, the dimension of its rows, and the
    tasks it asks of it (``interpolate`` without its round, added per iteration)."""

    client: str
    dim: int
    interpolate: Task
    distance: Task
    final: Task


def _client(channel: Channel, client_id: str):
    for client in channel.clients:
        if client.id == client_id:
            return client
    known = ", ".join(c.id for c in channel.clients)
    raise ConfigError(f"no client {client_id!r} in this federation; clients are {known}")


def _resolve(channel: Channel, side: Side, dim: int | None) -> _Asked | Measure:
    if isinstance(side, Measure):
        return side
    named = Rows(side) if isinstance(side, str) else side
    client = _client(channel, named.client)
    args = named.args()
    return _Asked(client.id, sample_dim(client, dim), Task("fedwad.interpolate", args),
                  Task("fedwad.distance"), Task("fedwad.final", args))


def _name(side: _Asked | Measure) -> str:
    return side.client if isinstance(side, _Asked) else SERVER


def federated_distance(channel: Channel, privacy: GeodesicPrivacy | None, a: Side, b: Side,
                       config: FedWADConfig, round_: int = 1, init: Measure | None = None,
                       dim: int | None = None) -> FedWADResult:
    """W_p between two sides by Algorithm 1 through ``channel``: each side a client id (its
    data), :class:`Rows` (rows a client selects itself) or a :class:`Measure` the server holds.
    ``privacy``: the randomized-t protections of measure messages, or None. ``dim``: the rows'
    dimension d (public; with augmented rows, d + r), needed when the clients run elsewhere.

    Uses rounds ``round_`` .. ``round_ + K``. The server's generator (xi^(0), its t, and
    the t of a side it holds) is seeded by (config.seed, round_); each client draws its t and
    noise from its own ``protocol_rng`` (:class:`FedWADClient`). ``init``: xi^(0) instead of a
    Gaussian draw. Returns the bounds the server learned (every iterate, or only xi^(K) under
    ``randomized-t``) and the best of them; with ``config.bracket``, also a lower bound from each
    side's moments and final distance. A message that does not arrive, or that a client
    refuses, raises ProtocolError (the log says why).
    """
    (low, high), _, private = _protections(privacy, config)
    sides = [_resolve(channel, side, dim) for side in (a, b)]
    names = [_name(s) for s in sides]
    if (isinstance(a, str) and a == b) or names == [SERVER, SERVER]:
        raise ConfigError(f"FedWAD compares data of two parties, at least one a client; got "
                          f"{names[0]!r} and {names[1]!r}")
    dim = sides[0].dim
    if sides[1].dim != dim:
        raise DataError(f"{names[0]} holds {dim}-dimensional samples and {names[1]} "
                        f"{sides[1].dim}-dimensional ones; FedWAD compares one space")
    server_rng = np.random.default_rng([config.seed, round_])
    xi = initial_measure(config, dim, server_rng) if init is None else init
    if xi.dim != dim:
        raise DataError(f"the initial measure has dimension {xi.dim}, the data {dim}")
    p, exact, tol = config.p, config.exact, config.prune_tol
    measures, bounds, evaluated, pairs = [xi], [], [], []
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
            _deliver(channel, r, "broadcast", "measure", SERVER, side.client,
                     measure_payload(xi))
            got = _deliver(channel, r, "upload", "measure", side.client, SERVER,
                           Task(side.interpolate.name, {**side.interpolate.args, "round": r}))
            returned.append(payload_measure(got, side.client, dim))
            if not private:
                got = _deliver(channel, r, "upload", "scalar", side.client, SERVER,
                               side.distance)
                distances.append(_scalar(got, side.client))
        if not private:
            bounds.append(sum(distances))
            pairs.append(tuple(distances))
            evaluated.append(k - 1)
        xi = interpolate(returned[0], returned[1], float(server_rng.uniform(low, high)), p,
                         exact, tol)
        measures.append(xi)
    final = round_ + config.iterations
    to_xi, moment = [], []
    for side in sides:
        if isinstance(side, Measure):
            to_xi.append(wasserstein(side, xi, p))
            moment.append(moments(side.support, side.weights))
            continue
        _deliver(channel, final, "broadcast", "measure", SERVER, side.client,
                 measure_payload(xi))
        got = _deliver(channel, final, "upload", "scalar", side.client, SERVER, side.final)
        to_xi.append(_scalar(got, side.client))
        if config.bracket:
            moment.append(_moments(got, side.client, dim))
    bounds.append(sum(to_xi))
    evaluated.append(config.iterations)
    best = int(np.argmin(bounds))
    lower = lower_bound(*moment, p, [*pairs, tuple(to_xi)]) if config.bracket else None
    return FedWADResult(float(bounds[best]), tuple(bounds), tuple(evaluated), evaluated[best],
                        measures[evaluated[best]], lower_bound=lower)


def pairwise_distances(channel: Channel, privacy: GeodesicPrivacy | None,
                       config: FedWADConfig, round_: int = 1, progress: bool = False,
                       dim: int | None = None) -> np.ndarray:
    """FedWAD between every pair of the channel's clients, orchestrated by the server: the
    upper bounds of :func:`pairwise_brackets`, [n, n]."""
    return pairwise_brackets(channel, privacy, config, round_, progress, dim)[0]


def pairwise_brackets(channel: Channel, privacy: GeodesicPrivacy | None,
                      config: FedWADConfig, round_: int = 1, progress: bool = False,
                      dim: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """FedWAD between every pair of the channel's clients: (upper bounds, lower bounds), each
    [n, n] in the order of ``channel.clients``, symmetric with a zero diagonal; the lower ones
    only with ``config.bracket`` (else None).

    Pairs run one after another in consecutive blocks of :func:`rounds_per_distance` rounds
    from ``round_``; ``dim`` as in :func:`federated_distance`.
    """
    ids = [c.id for c in channel.clients]
    if len(ids) < 2:
        raise ConfigError(f"pairwise FedWAD needs at least 2 clients; this federation has "
                          f"{len(ids)}")
    pairs = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids))]
    upper, lower = np.zeros((len(ids), len(ids))), np.zeros((len(ids), len(ids)))
    for n, (i, j) in enumerate(progress_bar(pairs, desc="FedWAD pairs", unit="pair",
                                            disable=not progress, dynamic_ncols=True)):
        result = federated_distance(channel, privacy, ids[i], ids[j], config,
                                    round_ + n * rounds_per_distance(config), dim=dim)
        upper[i, j] = upper[j, i] = result.distance
        if config.bracket:
            lower[i, j] = lower[j, i] = result.lower_bound
    return upper, lower if config.bracket else None
