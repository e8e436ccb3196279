"""Stopping a run part way: SIGTERM raised like Ctrl-C, and what privacy.json says about a stop.

A runner that stops (Ctrl-C, SIGTERM, an exception) still closes its log and writes
privacy.json with the epsilon of every charge made so far, marked with :func:`interruption`;
the log's signed ``charged`` records stay the evidence (docs/privacy.md, "Interruption and
resume").
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Terminated", "terminate_raises", "signals_held", "cause_of", "interruption"]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised by :func:`terminate_raises`' handler, wherever the run was, so
    it unwinds as Ctrl-C does (past ``except Exception``)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (Python's default kills the
    process without unwinding, leaving the log unclosed and no privacy.json). The main thread
    only, where signal handlers live; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are ignored (main thread only), so a second Ctrl-C
    cannot cut short the wrap-up of a stop: the charge, privacy.json, the log's closing
    record."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT,
                                                                    signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cause_of(error: BaseException) -> str:
    """What stopped the run, in a word: SIGTERM, SIGINT (Ctrl-C), or the exception's type."""
    if isinstance(error, Terminated):
        return "SIGTERM"
    if isinstance(error, KeyboardInterrupt):
        return "SIGINT"
    return type(error).__name__


def interruption(at_round: int | None, completed: int, checkpoint: int | None,
                 cause: str) -> dict:
    """privacy.json's ``interrupted`` field: the round in progress when the run stopped (None
    between rounds), the rounds completed, the round checkpoint.safetensors holds (None: none
    written), and the cause. The epsilon beside it counts every charge made, the stopped round's
    too."""
    return {"at_round": at_round, "rounds_completed": completed, "checkpoint": checkpoint,
            "cause": cause}
