"""Protocols: ordered stages that protect every message a party sends."""

from .aggregation import check_payload, flatten, unflatten, weighted_mean
from .protocol import Protocol, ProtocolSpec, known_protocols, load_protocol

__all__ = ["Protocol", "ProtocolSpec", "load_protocol", "known_protocols", "weighted_mean",
           "check_payload", "flatten", "unflatten"]
