"""Protocols: ordered stages that protect every message a party sends."""

from .aggregation import check_payload, weighted_sum
from .protocol import Protocol, ProtocolSpec, known_protocols, load_protocol

__all__ = ["Protocol", "ProtocolSpec", "load_protocol", "known_protocols", "weighted_sum",
           "check_payload"]
