"""How each entry of a party's ``memory`` crosses a snapshot (:mod:`.snapshot`), by the key
the protocol stage that keeps it registers.

The federation does not know what a stage keeps (a sealed stage's counters, a CKKS key): each
stage hands a :class:`MemoryCodec` for every memory entry it writes, and a protocol, when it is
built, registers them here with :func:`register_memory` (never at import time). A snapshot
carries only registered entries and refuses any other by name, so a stage's state is never
silently lost between two messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProtocolError

__all__ = ["MemoryCodec", "register_memory", "memory_codec"]


@dataclass(frozen=True)
class MemoryCodec:
    """One memory entry, ``key`` in ``party.memory``. ``save``: its value -> (a JSON value,
    named arrays); ``load``: the inverse, (JSON value, those arrays) -> the value. Array names
    are the codec's own; the snapshot prefixes them with the key."""

    key: str
    save: Callable[[Any], tuple[Any, dict[str, np.ndarray]]]
    load: Callable[[Any, dict[str, np.ndarray]], Any]


_CODECS: dict[str, MemoryCodec] = {}


def register_memory(codec: MemoryCodec) -> None:
    """Make ``codec``'s entry cross snapshots; registering the same codec again is a no-op,
    another codec under a registered key a ProtocolError (two stages would share one entry)."""
    held = _CODECS.setdefault(codec.key, codec)
    if held is not codec:
        raise ProtocolError(f"memory entry {codec.key!r} is registered by two codecs; give each "
                            "stage's memory its own key")


def memory_codec(key: str) -> MemoryCodec | None:
    """The codec registered for memory entry ``key``, or None."""
    return _CODECS.get(key)
