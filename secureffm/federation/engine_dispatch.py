"""The simulation engine's dispatch loop, asking only for the nodes that have a request waiting.

Flower 1.42's simulation engine (``flwr.server.superlink.fleet.vce.vce_api``) hands requests to
its workers from ``add_messages_to_queue``: every 0.1 s it asks the in-memory SuperLink for one
undelivered request of each of the n nodes, and each ask walks the whole message store. With m
requests in the store that is O(n m) every 0.1 s for as long as a round lasts, which made the
server's CPU grow as n^2 (docs/benchmarks.md, "Scale"). :func:`dispatch_waiting` is the same
loop with one difference: each tick first reads, in one pass over the store under its lock, the
nodes whose requests are still undelivered, and asks Flower's own ``get_message_ins`` (which
marks them delivered and drops expired ones) only for those, one request each as before. Once a
tick has handed an exchange's requests out, a tick costs O(m).

:func:`indexed_dispatch` puts it in place during a simulation where the engine is as read
(flwr in :data:`~.supernode.FLWR_RANGE`, its loop as this module knows it); elsewhere Flower's
own loop runs (the same deliveries, only slower).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import threading
from collections.abc import Iterator
from queue import Queue

from .supernode import FLWR_RANGE

__all__ = ["VCE_MODULE", "waiting_nodes", "dispatch_waiting", "engine_as_read",
           "indexed_dispatch"]

VCE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"
ASK = "state.get_message_ins(node_id=node_id, limit=1)"  # Flower's ask, as its source spells it


def waiting_nodes(state) -> set[int]:
    """The node ids with an undelivered request in ``state`` (Flower's ``InMemoryLinkState``),
    read in one pass under its lock."""
    with state.lock:
        return {message.metadata.dst_node_id for message in state.message_ins_store.values()
                if message.metadata.delivered_at == ""}


def dispatch_waiting(state, queue: Queue, nodes_mapping: dict[int, int],
                     f_stop: threading.Event) -> None:
    """Flower's ``add_messages_to_queue`` (same arguments), asking only the waiting nodes (every
    node, as Flower does, of a state that is not in memory)."""
    in_memory = hasattr(state, "lock") and hasattr(state, "message_ins_store")
    while not f_stop.is_set():
        waiting = waiting_nodes(state) if in_memory else nodes_mapping
        for node_id in nodes_mapping:
            if node_id in waiting:
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
        f_stop.wait(0.1)


def engine_as_read():
    """Flower's engine module when it is the one :func:`dispatch_waiting` was written for
    (flwr in :data:`~.supernode.FLWR_RANGE`, its loop asking each node as :data:`ASK`, its
    in-memory state holding ``lock`` and ``message_ins_store``), else None."""
    from packaging.specifiers import SpecifierSet

    try:
        if importlib.metadata.version("flwr") not in SpecifierSet(FLWR_RANGE):
            return None
        module = importlib.import_module(VCE_MODULE)
        from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
        state_source = inspect.getsource(InMemoryLinkState.__init__)
        loop_source = inspect.getsource(module.add_messages_to_queue)
    except (ImportError, AttributeError, OSError, TypeError,
            importlib.metadata.PackageNotFoundError):
        return None
    if (ASK not in loop_source or "self.lock" not in state_source
            or "self.message_ins_store" not in state_source):
        return None
    return module


@contextlib.contextmanager
def indexed_dispatch() -> Iterator[bool]:
    """Within the block, the engine dispatches with :func:`dispatch_waiting` where
    :func:`engine_as_read` finds it as read; yields whether it does."""
    module = engine_as_read()
    if module is None:
        yield False
        return
    before, module.add_messages_to_queue = module.add_messages_to_queue, dispatch_waiting
    try:
        yield True
    finally:
        module.add_messages_to_queue = before
