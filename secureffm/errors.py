"""Errors a user can cause. Each message says what to change."""

__all__ = [
    "SecureFFMError",
    "ConfigError",
    "ProtocolError",
    "DataError",
    "SchemaError",
    "TableError",
    "SolverError",
    "MessageError",
    "BudgetError",
    "RunInterrupted",
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


class SchemaError(DataError):
    """A data schema (TOML: columns, types, public bounds, categories) is malformed."""


class TableError(DataError):
    """A client's data file does not fit the public schema, or cannot be read."""


class SolverError(SecureFFMError):
    """A numerical solver (for example POT's exact OT) did not converge."""


class MessageError(SecureFFMError):
    """A message is malformed, from an unknown party, or arrived twice."""


class BudgetError(SecureFFMError):
    """A run would spend more privacy budget than its target allows (a resumed run counts
    what its log already charged)."""


class RunInterrupted(SecureFFMError):
    """A run stopped part way (Ctrl-C, SIGTERM): its log is closed and privacy.json states
    what it spent; the message says where it stopped and how to resume."""


class PolicyError(SecureFFMError):
    """A run differs from what a node's own policy pins, or a node's policy is missing or
    malformed: the node refuses it, naming each field."""
