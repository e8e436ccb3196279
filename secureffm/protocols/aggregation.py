"""Server-side aggregation as pure functions of what arrived."""

from __future__ import annotations

import numpy as np

from ..errors import MessageError
from ..federation.message import Payload

__all__ = ["weighted_sum", "check_payload"]


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


def weighted_sum(contributions: list[tuple[str, Payload, float]]) -> Payload:
    """Sum_i w_i * payload_i field by field, in float64, returned as float32.

    ``contributions`` holds (sender, payload, weight); every payload must have the same fields.
    """
    if not contributions:
        raise MessageError("no contributions to aggregate")
    reference = contributions[0][1]
    totals = {name: np.zeros(array.shape, dtype=np.float64) for name, array in reference.items()}
    for sender, payload, weight in contributions:
        check_payload(sender, payload, reference)
        for name, array in payload.items():
            totals[name] += weight * array.astype(np.float64)
    return {name: total.astype(np.float32) for name, total in totals.items()}
