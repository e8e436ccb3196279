"""A malicious server's deviations, played from a threat model so that runs and audits can
show each one caught (``threat_models/malicious-server.toml``).

Each deviation rewrites a message the server sends at one phase, to one ``recipient`` (or to
every client), before the server signs it with its own key: the transport sees the server's
genuine message, as it would from a server that deviates. The defences are the clients' own
(secureffm/protocols/secagg/): a client refuses, names the deviation in a ``rejected`` event
it signs, and the round goes on without it or aborts with the sum still masked.

- ``substitute_keys`` (phase ``keys``): every neighbour's c_pk in the message is replaced by a
  key of the server's own (the review's attack); the keys' signatures no longer verify.
- ``split_view`` (phase ``consistency``): the survivor set announced leaves out one survivor
  other than the recipient; survivors then signed different sets.
- ``invent_survivor`` (phase ``unmask_request``): the request lists ``client-99`` as a survivor.
- ``ask_twice`` (phase ``unmask_request``, ``recipient`` the victim): after the honest requests,
  every other survivor is asked again with the victim named dropped (both of the victim's
  secrets would unmask its input); see :func:`repeated_requests`.
- ``split_broadcast`` (phase ``broadcast``): the recipient gets the model zeroed (Pasquini et
  al. 2022: a model that makes the others' updates vanish isolates one client's).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..federation.crypto import new_key_pair
from ..federation.faults import FaultPlan
from ..federation.message import SERVER, Envelope, deserialize_payload, serialize_payload
from ..federation.parties import Party
from .wire import bytes_payload, json_payload, payload_bytes, payload_json

__all__ = ["play_deviations", "repeated_requests", "DEVIATIONS"]

_INVENTED = "client-99"


def _substitute_keys(data: bytes, recipient: str) -> bytes:
    fields = payload_bytes(data, SERVER)
    return bytes_payload({name: new_key_pair().public if name.startswith("c_pk:") else value
                               for name, value in fields.items()})


def _split_view(data: bytes, recipient: str) -> bytes:
    announced = payload_json(data, SERVER)
    left_out = next(u for u in announced["survivors"] if u != recipient)
    return json_payload({"survivors": [u for u in announced["survivors"] if u != left_out]})


def _invent_survivor(data: bytes, recipient: str) -> bytes:
    request = payload_json(data, SERVER)
    return json_payload(request | {"survivors": [*request["survivors"], _INVENTED]})


def _split_broadcast(data: bytes, recipient: str) -> bytes:
    return serialize_payload({name: np.zeros_like(array)
                              for name, array in deserialize_payload(data).items()})


# action -> the rewrite of one message (bytes, recipient) -> bytes
DEVIATIONS: dict[str, Callable[[bytes, str], bytes]] = {
    "substitute_keys": _substitute_keys,
    "split_view": _split_view,
    "invent_survivor": _invent_survivor,
    "split_broadcast": _split_broadcast,
}


def repeated_requests(faults: FaultPlan, round_: int, requests: list[tuple[str, bytes, str]]
                      ) -> list[tuple[str, bytes, str]]:
    """``ask_twice``: the second unmask requests a deviating server sends after the honest
    ``requests`` (client id, request bytes, origin) of ``round_``, each naming the victim
    dropped. The server sets each one's ``origin`` to the victim to evade the duplicate
    check (keyed on the envelope's fields, origin included); the recipient refuses an origin
    outside the relay phase, and behind that check stands the client's own rule (answer
    once per aggregation)."""
    extra = []
    for fault in faults.faults:
        if fault.action != "ask_twice" or not fault.hits(round_):
            continue
        for v, data, _ in requests:
            request = payload_json(data, SERVER)
            if v != fault.recipient and fault.recipient in request["survivors"]:
                extra.append((v, json_payload(request | {
                    "survivors": [u for u in request["survivors"] if u != fault.recipient],
                    "dropped": [*request["dropped"], fault.recipient]}), fault.recipient))
    return extra


def play_deviations(server: Party, faults: FaultPlan) -> None:
    """Make ``server`` deviate as ``faults`` say (nothing when they name no deviation)."""
    deviations = [f for f in faults.faults if f.action in DEVIATIONS]
    if not deviations:
        return
    honest = server.envelope

    def envelope(round_: int, phase: str, kind: str, recipient: str, data: bytes,
                 stages: tuple[str, ...] = (), origin: str = "",
                 digest: str | None = None) -> Envelope:
        sent = data
        for fault in deviations:
            if (fault.phase == phase and fault.hits(round_)
                    and fault.recipient in ("", recipient)):
                sent = DEVIATIONS[fault.action](sent, recipient)
        return honest(round_, phase, kind, recipient, sent, stages, origin,
                      digest if sent is data else None)

    server.envelope = envelope
