"""Server-side aggregation: pure functions of what arrived, and aggregation in the clear."""

from __future__ import annotations

import numpy as np

from ..errors import MessageError
from ..federation.channel import Aggregate, Compute, Template
from ..federation.message import Payload, deserialize_payload
from .link import Ask, Link

__all__ = ["weighted_mean", "check_payload", "flatten", "unflatten", "plain_aggregate",
           "template_json", "template_of"]


def check_payload(sender: str, payload: Payload, reference: Payload | None) -> None:
    """Reject a payload whose names, shapes or dtypes differ from ``reference``, or with NaN/Inf."""
    if reference is not None and set(payload) != set(reference):
        raise MessageError(f"{sender} sent fields {sorted(payload)}, expected {sorted(reference)}")
    for name, array in payload.items():
        if reference is not None:
            ref = reference[name]
            if array.shape != ref.shape or array.dtype != ref.dtype:
                raise MessageError(
                    f"{sender} sent {name} with shape {array.shape} {array.dtype}, "
                    f"expected {ref.shape} {ref.dtype}"
                )
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise MessageError(f"{sender} sent {name} containing NaN or Inf")


def weighted_mean(contributions: list[tuple[Payload, float]]) -> Payload:
    """sum_i w_i x_i / sum_i w_i field by field, computed in float64, returned as float32."""
    if not contributions:
        raise MessageError("no contributions to aggregate")
    total = sum(weight for _, weight in contributions)
    names = contributions[0][0]
    return {name: sum(weight / total * payload[name].astype(np.float64)
                      for payload, weight in contributions).astype(np.float32)
            for name in names}


def flatten(payload: Payload, template: dict, dtype: np.dtype = np.float64) -> np.ndarray:
    """Concatenate the template's fields (sorted by name) into one vector of ``dtype``."""
    return np.concatenate([payload[name].astype(dtype, copy=False).reshape(-1)
                           for name in sorted(template)])


def unflatten(vector: np.ndarray, template: dict) -> Payload:
    """Inverse of :func:`flatten`; fields come back with the template's shapes and dtypes."""
    out, offset = {}, 0
    for name in sorted(template):
        shape, dtype = template[name]
        size = int(np.prod(shape))
        out[name] = vector[offset:offset + size].reshape(shape).astype(dtype)
        offset += size
    return out


def template_json(template: Template) -> dict[str, list]:
    """``template`` as JSON-able arguments: field -> [shape, dtype string]."""
    return {name: [list(shape), np.dtype(dtype).str] for name, (shape, dtype) in template.items()}


def template_of(table: dict[str, list]) -> Template:
    """The inverse of :func:`template_json`; a malformed table is a MessageError."""
    try:
        return {name: (tuple(int(n) for n in shape), np.dtype(dtype))
                for name, (shape, dtype) in table.items()}
    except (TypeError, ValueError) as err:
        raise MessageError(f"the request's template is malformed: {err}") from None


def plain_aggregate(link: Link, compute: Compute, weights: dict[str, float],
                    template: Template) -> Aggregate:
    """Every client uploads its payload in the clear; the server checks each one against
    ``template``, leaves out (and names) the bad ones, and averages the rest with weights."""
    reference = {name: np.zeros(shape, dtype) for name, (shape, dtype) in template.items()}
    accepted, dropped = [], {}
    replies = link.exchange("upload", "upload", "upload",
                            {c.id: Ask(args={"compute": compute}) for c in link.clients})
    for client in link.clients:
        if client.id not in replies:
            dropped[client.id] = "offline at phase upload"
            continue
        data = replies[client.id].data
        if data is None:
            dropped[client.id] = "its upload was rejected or never arrived"
            continue
        try:
            payload = deserialize_payload(data, client.id)
            check_payload(client.id, payload, reference)
        except MessageError as err:
            link.reject("upload", client.id, str(err))
            dropped[client.id] = str(err)
            continue
        accepted.append((client.id, payload))
    asked = [c.id for c in link.clients]
    if not accepted:
        return Aggregate(None, [], dropped, "no client update was accepted", asked)
    mean = weighted_mean([(payload, weights[cid]) for cid, payload in accepted])
    return Aggregate(mean, [cid for cid, _ in accepted], dropped, asked=asked)
