"""``secureffm flower-supernode``: Flower's own SuperNode, run in this process, whose idle wait
is capped.

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps 3 s (fixed in
its code) after every pull that found no message, and polls for its ClientApp's reply every
0.5 s, so a deployed exchange waits on average about 1.5 s, and up to 3.5 s, for nothing. The
launcher runs the entry point of Flower's ``flower-supernode`` console script unchanged, with
one difference: that one module's ``time`` is a proxy whose ``sleep`` waits at most
``idle_poll`` seconds (every other name is the ``time`` module's; the global ``time.sleep`` is
untouched). An idle node then pulls every ``idle_poll`` s: ``1 / idle_poll`` requests per
second per node on the SuperLink, hence the floor :data:`FLOOR_S`. The SuperExec the SuperNode
starts looks for a task every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds (Flower's own
setting, 1 s by default): the launcher sets it to ``idle_poll`` unless the environment already
does (:func:`superexec_poll`).

This reaches into Flower's internals, so it runs only where they are as read: a flwr version
in :data:`FLWR_RANGE` (pyproject's ``flower`` extra; a test keeps them equal) whose module
still holds the 3 s idle wait; elsewhere it refuses, naming Flower's ``flower-supernode`` to
run instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType

from ..errors import ConfigError

__all__ = ["FLOOR_S", "DEFAULT_S", "FLWR_RANGE", "SUPEREXEC_POLL", "CappedTime", "capped",
           "check_idle_poll", "loop_module", "superexec_poll", "launch"]

FLWR_RANGE = ">=1.42,<1.43"  # the flwr versions whose internals we read (SuperNode loop, engine)
LOOP_MODULE = "flwr.supernode.start_client_internal"
IDLE_WAIT = "time.sleep(3)"  # the idle pull's wait, as that module's source spells it
FLOOR_S = 0.05  # an idle node's pulls: at most 20 a second on the SuperLink
DEFAULT_S = 0.1
SUPEREXEC_POLL = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"  # Flower's, read by flower-superexec


class CappedTime:
    """The ``time`` module as one module sees it: ``sleep(s)`` waits ``min(s, cap)`` seconds
    (through ``sleep``, the real ``time.sleep`` by default); every other name is ``time``'s."""

    def __init__(self, cap: float, sleep: Callable[[float], None] = time.sleep):
        self.cap, self._sleep = cap, sleep

    def sleep(self, seconds: float) -> None:
        self._sleep(min(seconds, self.cap))

    def __getattr__(self, name: str):
        return getattr(time, name)


def check_idle_poll(seconds: float) -> float:
    """``seconds`` if it is a usable idle poll; refuses one under :data:`FLOOR_S`."""
    if not FLOOR_S <= seconds <= 3:
        raise ConfigError(
            f"--idle-poll {seconds} s: give {FLOOR_S} to 3 s. Every idle SuperNode pulls from "
            f"the SuperLink once per idle poll ({1 / FLOOR_S:.0f} requests/s per node at "
            f"{FLOOR_S} s), so a shorter one would hammer the SuperLink for no faster exchange; "
            f"Flower's own wait is 3 s")
    return seconds


def loop_module() -> ModuleType:
    """Flower's SuperNode loop module, refused unless it is the one this launcher was written
    for: flwr in :data:`FLWR_RANGE`, its ``time`` the ``time`` module, its idle wait
    :data:`IDLE_WAIT`."""
    from packaging.specifiers import SpecifierSet

    run_flower = "run Flower's own flower-supernode with the same arguments instead"
    try:
        version = importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("secureffm flower-supernode needs flwr: pip install "
                          "'secureffm[flower]'") from None
    if version not in SpecifierSet(FLWR_RANGE):
        raise ConfigError(f"secureffm flower-supernode was written for flwr {FLWR_RANGE}, not "
                          f"the installed {version}: {run_flower}")
    module = importlib.import_module(LOOP_MODULE)
    if getattr(module, "time", None) is not time or IDLE_WAIT not in inspect.getsource(module):
        raise ConfigError(f"flwr {version}'s {LOOP_MODULE} no longer waits with "
                          f"{IDLE_WAIT} when idle, so the launcher cannot cap it: {run_flower}")
    return module


@contextlib.contextmanager
def capped(module: ModuleType, idle_poll: float) -> Iterator[CappedTime]:
    """Within the block, ``module``'s ``time`` is a :class:`CappedTime` at ``idle_poll`` s."""
    proxy = CappedTime(idle_poll)
    before, module.time = module.time, proxy
    try:
        yield proxy
    finally:
        module.time = before


def superexec_poll(environ: dict[str, str], idle_poll: float) -> str:
    """The SuperExec's task poll in ``environ`` (which its SuperNode's children inherit): the
    operator's :data:`SUPEREXEC_POLL` if set, else ``idle_poll`` seconds, set there."""
    return environ.setdefault(SUPEREXEC_POLL, f"{idle_poll:g}")


def launch(flower_args: list[str], idle_poll: float = DEFAULT_S) -> None:
    """Run the entry point of Flower's ``flower-supernode`` with ``flower_args`` (its own
    command line, passed through), in this process, the loop's waits capped at ``idle_poll``
    seconds and its SuperExec's task poll :func:`superexec_poll`; returns or exits as Flower's
    SuperNode does."""
    check_idle_poll(idle_poll)
    module = loop_module()
    [script] = importlib.metadata.entry_points(group="console_scripts",
                                                name="flower-supernode")
    entry = script.load()
    superexec_poll(os.environ, idle_poll)
    sys.argv = ["flower-supernode", *flower_args]  # Flower's parser reads sys.argv
    with capped(module, idle_poll):
        entry()
