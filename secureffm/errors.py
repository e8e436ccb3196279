"""Errors a user can cause. Each message says what to change."""

__all__ = [
    "SecureFFMError",
    "ConfigError",
    "ProtocolError",
    "DataError",
    "SolverError",
    "MessageError",
    "PolicyError",
]


class SecureFFMError(Exception):
    """Base class: a problem with the user's input or run, never an internal bug."""


class ConfigError(SecureFFMError):
    """A run configuration key or value is unknown or impossible."""


class ProtocolError(SecureFFMError):
    """A protocol spec is malformed, or a stage cannot protect a message kind."""


class DataError(SecureFFMError):
    """A data set or partition cannot be built as asked."""


class SolverError(SecureFFMError):
    """A numerical solver (for example POT's exact OT) did not converge."""


class MessageError(SecureFFMError):
    """A message is malformed, from an unknown party, or arrived twice."""


class PolicyError(SecureFFMError):
    """A run differs from what a node's own policy pins, or a node's policy is missing or
    malformed: the node refuses it, naming each field."""
