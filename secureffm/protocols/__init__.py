"""Protocols: ordered stages that protect every message a party sends, and the channel that
applies them over a transport."""

from .aggregation import check_payload, flatten, unflatten, weighted_mean
from .channel import ProtectedChannel
from .protocol import Protocol, load_protocol
from .registry import ProtocolSpec, known_protocols

__all__ = ["Protocol", "ProtocolSpec", "ProtectedChannel", "load_protocol", "known_protocols",
           "weighted_mean", "check_payload", "flatten", "unflatten"]
