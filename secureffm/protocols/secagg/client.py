"""A client's side of secure aggregation that both variants share: finding its session for a
request, fresh keys (and, malicious variant, their signed batch), taking its neighbours' keys,
its own input with its own scale and noise share (checked against what the server asks), its
``clipped`` event, and the ``secagg.advertise`` and ``secagg.sign`` actions. The variants'
other actions are :mod:`.per_round`'s and :mod:`.keys_once`'s."""

from __future__ import annotations

import math
import secrets

import numpy as np

from ...errors import ConfigError, MessageError, ProtocolError
from ...federation.message import SERVER
from ...federation.parties import Registry
from ..aggregation import check_payload, template_of
from ..key_batch import KeyBatch
from ..masking import as_vector
from ..prg import word_dtype
from ..quantize import Quantizer
from ..step import Handler, Step
from .params import SecAggParams
from .session import ClientSession

__all__ = ["CLIENT_ACTIONS", "session_of", "epoch_session", "client_order", "taken_keys",
           "client_input", "own_parameters", "check_scale", "report_clipped"]


def session_of(step: Step) -> ClientSession:
    """The client's session of the request's aggregation (under setup = "once", the set-up's
    session if the client masked in the request's round); refuses a request for an
    aggregation it never advertised keys for."""
    round_, kind = step.request.round, step.request.kind
    session = step.endpoint.sessions.get((round_, kind))
    if not isinstance(session, ClientSession):
        session = epoch_session(step.endpoint.sessions, kind)
        if session is not None and session.current != round_:
            session = None
    if not isinstance(session, ClientSession):
        raise MessageError(f"{step.client.id} advertised no keys for {kind} in round {round_}")
    return session


def _keeps_epoch(session) -> bool:
    return isinstance(session, ClientSession) and session.stage.setup == "once"


def epoch_session(sessions: dict, kind: str) -> ClientSession | None:
    """The client's latest setup = "once" session of ``kind``, if any."""
    found = [s for (_, k), s in sessions.items() if k == kind and _keeps_epoch(s)]
    return max(found, key=lambda s: s.round, default=None)


def client_order(registry: Registry) -> dict[str, int]:
    """Client id -> position in the federation, as the client's pinned registry lists them."""
    return {cid: i for i, cid in enumerate(c for c in registry.sign if c != SERVER)}


def _client_advertise(step: Step) -> bytes:
    """Phase 1: fresh keys for this aggregation, under the client's own spec."""
    stage = step.endpoint.protocol.aggregator(step.request.kind)
    if not isinstance(stage, SecAggParams):
        raise ProtocolError(f"{step.client.id}'s protocol does not aggregate "
                            f"{step.request.kind!r} with secagg")
    sessions = step.endpoint.sessions
    for key in [k for k, s in sessions.items() if k[0] < step.request.round and (
            k[1] == step.request.kind or not _keeps_epoch(s))]:
        del sessions[key]  # an older aggregation's: a request for it is refused from now on
    return step.session(lambda: _new_session(step, stage)).advertisement()


def _new_session(step: Step, stage: SecAggParams) -> ClientSession:
    """Fresh keys for the request's aggregation; under the malicious variant they come with
    the proof that the client's identity signed them: the next round of its batch of
    ``stage.key_batch`` rounds of this kind (one round under setup = "once"), a new batch when
    the last one is spent."""
    round_, kind = step.request.round, step.request.kind
    registry = step.endpoint.registry
    if stage.adversary != "malicious":
        return ClientSession(step.client, registry, stage, round_, kind)
    batches = step.endpoint.lasting
    batch = batches.get((KeyBatch.tag, kind))
    taken = None if batch is None else batch.take(round_)
    if taken is None:
        size = stage.key_batch if stage.setup == "per-round" else 1
        batch = batches[(KeyBatch.tag, kind)] = KeyBatch.new(step.client, kind, round_, size,
                                                             stage.advertised)
        taken = batch.take(round_)
    channel, mask, seed, proof = taken
    return ClientSession(step.client, registry, stage, round_, kind, channel, mask, seed,
                          proof=proof)


def taken_keys(step: Step) -> ClientSession | None:
    """The client's session with its neighbours' keys taken from the server's ``keys``
    message (both set-ups), or None when it refused the message (a signed refusal)."""
    try:
        session = session_of(step)
        session.take_keys(step.data, client_order(step.endpoint.registry))
    except MessageError as err:
        step.reject(SERVER, f"{step.client.id} refused the keys message: {err}")
        return None
    return session


def client_input(step: Step, stage: SecAggParams
                 ) -> tuple[np.ndarray, float, np.ndarray | None] | None:
    """The client's update for a masked input: its 1-D float vector, the scale it multiplies
    it by and its share of distributed noise (integers in the mask word type, or None without
    distributed noise); None after a signed refusal: of the server's scale or share variance
    (:func:`own_parameters`), or of an update that does not fit the template (withheld)."""
    u = step.client.id
    template = template_of(step.args["template"])
    try:
        scale, variance = own_parameters(step, stage, sum(
            int(np.prod(shape)) for shape, _ in template.values()))
    except MessageError as err:
        step.reject(SERVER, f"{u} refused the mask request: {err}", phase="masked_input")
        return None
    payload = step.compute()
    try:
        check_payload(u, payload, {name: _shaped(shape, dtype)
                                   for name, (shape, dtype) in template.items()})
    except MessageError as err:
        step.reject(u, f"withheld its update: {err}", phase="masked_input")
        return None
    x = as_vector(payload, template)
    if not variance:
        return x, scale, None
    # two's complement integers: wrap to residues
    return x, scale, _skellam(variance, x.size).astype(word_dtype(stage.quantizer.bits))


def _distributed(step: Step) -> bool:
    """Whether the client's own protocol adds distributed noise to the request's kind."""
    own = step.endpoint.protocol.dp_for(step.request.kind)
    return own is not None and own.noise == "distributed"


def own_parameters(step: Step, stage: SecAggParams, size: int) -> tuple[float, float]:
    """(scale, share variance in levels) for the request's input of ``size`` coordinates,
    from the client's own spec: the server's ``scale`` and ``share_variance`` are only
    checked. The scale is its own weight, 1 (:func:`check_scale`). Without distributed noise
    the variance must be 0; under it, the one the client derives itself: its own noise plan
    (tau, sensitivity, colluders) and its own stage over the federation it pinned, at equal
    weights. Raises MessageError naming what differs."""
    kind, asked = step.request.kind, step.args["share_variance"]
    check_scale(step.args.get("scale"))
    if not _distributed(step):
        if asked:
            raise MessageError(f"share_variance = {asked!r}, but its own protocol adds no "
                               f"distributed noise to {kind}")
        return 1.0, 0.0
    clients = list(client_order(step.endpoint.registry))
    try:
        noise = step.endpoint.own_noise(kind, clients)
        variance = stage.share_variance(noise, dict.fromkeys(clients, 1.0), size, len(clients))
    except (ConfigError, ProtocolError) as err:  # its own settings admit no noise share here
        raise MessageError(f"it cannot size its own noise share: {err}") from None
    if (isinstance(asked, bool) or not isinstance(asked, (int, float))
            or not math.isclose(asked, variance, rel_tol=1e-9)):
        raise MessageError(f"share_variance = {asked!r} levels^2, not the {variance:.6g} it "
                           "derives from its own spec and noise plan")
    return 1.0, variance


def check_scale(asked: object) -> None:
    """A client's check of the server's ``scale`` for its input: under secure aggregation
    (every secagg variant, ckks) each client weighs its own input 1, so the server obtains the
    equally weighted sum; any other value is refused (MessageError), since a server that chose
    the scales could send 0 to all clients but one and read that one's input as the "sum"."""
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked != 1:
        raise MessageError(f"scale = {asked!r}: under secure aggregation it weighs its own "
                           "input 1 (a server choosing the weights could weigh out all other "
                           "clients and read its input alone), so it takes no scale but 1")


def report_clipped(step: Step, clipped: int, size: int, quantizer: Quantizer) -> None:
    """A signed ``clipped`` event when the quantizer clipped coordinates of the input, except
    under distributed noise: there the count is of the update before its noise share, a
    function of the client's data that no mechanism accounts for, so it is not released."""
    if clipped and not _distributed(step):
        step.event("masked_input", "clipped", step.client.id,
                   f"{clipped} of {size} coordinates of its scaled update lay outside "
                   f"[-{quantizer.clip:g}, {quantizer.clip:g}] and were clipped")


def _client_sign(step: Step) -> bytes | None:
    """Consistency round: sign the announced survivor set with what this client saw."""
    try:
        return session_of(step).sign_survivors(step.data)
    except MessageError as err:
        step.reject(SERVER, f"refused: {err}")
        return None


def _shaped(shape, dtype) -> np.ndarray:
    """A reference array of ``shape`` and ``dtype`` for :func:`check_payload`, which reads only
    those: one zero broadcast (no memory per entry)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def _skellam(variance: float, size: int) -> np.ndarray:
    """Integer Skellam noise Poisson(v/2) - Poisson(v/2) (variance v per coordinate) in two's
    complement (uint64: residues mod 2^64, so mod 2^bits once added), from a generator seeded
    by the OS CSPRNG: neither the server nor the run's published seed can predict it."""
    rng = np.random.default_rng(secrets.randbits(128))
    noise = rng.poisson(variance / 2, size) - rng.poisson(variance / 2, size)
    return noise.astype(np.int64).astype(np.uint64)


# The steps both variants' clients run (:attr:`.stage.SecAggStage.client_actions`).
CLIENT_ACTIONS: dict[str, Handler] = {"secagg.advertise": _client_advertise,
                                      "secagg.sign": _client_sign}
