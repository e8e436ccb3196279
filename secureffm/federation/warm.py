"""A deployed node's warm process: the node's client served by one long-lived process of its
own, not rebuilt in every ClientApp process.

Flower's deployment runtime starts a fresh ``flwr-clientapp`` process for every message (1.41
and 1.42 offer nothing else outside Kubernetes): ours would import torch and secureffm and
rebuild the client from its saved bytes each time, seconds per message. With a warm process,
the ClientApp process (which imports only Flower and :mod:`.flower`) hands the message to a
process the node's first message started, which imported the node's ``serve`` once and keeps
the endpoint it last built (``flower_node``'s in-process cache: a state it left is not rebuilt).
The state stays what it was: bytes that Flower keeps in the node's context and sends with
every message, so a warm process that died, or a message it did not see, only costs a rebuild.

The warm process is the node's: it runs as the node's user, listens on a Unix socket in a
folder only that user can open (``secureffm-warm-UID`` in the temporary folder) and ends when
its SuperNode ends, or after :data:`IDLE_S` without a message. It exists only below a
SuperNode process, Flower's ``flower-supernode`` or ``secureffm flower-supernode`` (found in
/proc, so Linux only); elsewhere, or with
``warm = false`` in the node config, the ClientApp serves in its own process, as before.

Frames on the socket: 4 bytes (big-endian length) of a JSON header, then the byte strings the
header counts. Request header: ``op`` (``serve`` or ``admit``), ``node_config``,
``run_config``, ``sizes`` of (state or empty, request); reply header: ``sizes`` of (state,
reply), or ``refused`` (admit's SecureFFMError, the node's refusal) or ``error`` (anything else,
raised in the ClientApp process, which Flower turns into an error reply).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["Warm", "supernode_pid", "is_supernode", "IDLE_S"]

IDLE_S = 1800.0  # a warm process ends after this long without a message
START_S = 600.0  # how long a ClientApp waits for a warm process it started to answer
_LEN = struct.Struct(">I")


def is_supernode(command: list[str]) -> bool:
    """Whether a process's argv is a SuperNode's: Flower's ``flower-supernode`` (the program,
    or the script an interpreter runs) or ``secureffm flower-supernode``
    (:mod:`.supernode`; the console script or ``python -m secureffm``)."""
    names = [Path(part).name for part in command[:4]]
    return "flower-supernode" in names[:2] or (
        ["secureffm", "flower-supernode"] in (names[1:3], names[2:4]))


def supernode_pid() -> int | None:
    """The pid of the SuperNode process above this one (:func:`is_supernode`), or None."""
    pid = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if is_supernode([part.decode(errors="replace") for part in command]):
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def _send(sock: socket.socket, header: dict, *parts: bytes) -> None:
    head = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(head)) + head + b"".join(parts))


def _read(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the warm process closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket) -> tuple[dict, list[bytes]]:
    header = json.loads(_read(sock, _LEN.unpack(_read(sock, _LEN.size))[0]))
    return header, [_read(sock, size) for size in header.get("sizes", [])]


class Warm:
    """The ClientApp's side: ``serve`` and ``admit`` (``"module:function"``) answered by the
    node's warm process, started on first use below the SuperNode ``supernode``."""

    def __init__(self, serve: str, admit: str | None, supernode: int, node_config: dict):
        self.serve, self.admit, self.supernode = serve, admit, supernode
        name = hashlib.sha256(json.dumps([serve, admit, supernode, node_config],
                                         sort_keys=True, default=str).encode()).hexdigest()
        folder = Path(tempfile.gettempdir()) / f"secureffm-warm-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
            raise PermissionError(f"{folder} must belong to this user alone (mode 0700)")
        self.path = folder / f"{name[:24]}.sock"

    def call(self, op: str, node_config: dict, run_config: dict, state: bytes | None,
             request: bytes) -> tuple[dict, list[bytes]]:
        """The warm process's answer to one message: (reply header, byte strings)."""
        with self._connect() as sock:
            try:
                _send(sock, {"op": op, "node_config": node_config, "run_config": run_config,
                             "sizes": [len(state or b""), len(request)]}, state or b"",
                      request)
                return _receive(sock)
            except OSError as error:  # it ended: the next message starts another
                raise RuntimeError(f"the node's warm process did not answer ({error}); "
                                   f"{self._log()}") from None

    def _log(self) -> str:
        log = self.path.with_suffix(".log")
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        return f"its log {log} ends: {tail}"

    def _connect(self) -> socket.socket:
        """A connection to the warm process, started first when none listens."""
        process = None
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
                return sock
            except OSError:
                sock.close()
            log = self.path.with_suffix(".log")
            if process is None:
                self.path.unlink(missing_ok=True)  # left by a process that ended
                started = time.monotonic()
                process = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(self.path), self.serve,
                     self.admit or "", str(self.supernode)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=log.open("ab"), start_new_session=True)
            elif process.poll() is not None and not self.path.exists():
                raise RuntimeError(f"the node's warm process ended before it listened (exit "
                                   f"code {process.returncode}); {self._log()}")
            elif time.monotonic() - started > START_S:
                raise TimeoutError(f"the warm process at {self.path} did not start within "
                                   f"{START_S:.0f} s; see {log}")
            time.sleep(0.02)


def _end(path: Path) -> None:
    """Remove the socket at ``path``, and its log when empty."""
    path.unlink(missing_ok=True)
    log = path.with_suffix(".log")
    if log.exists() and not log.stat().st_size:
        log.unlink(missing_ok=True)


def _watch(supernode: int, path: Path) -> None:
    """End this process when the SuperNode ``supernode`` has ended."""
    while True:
        try:
            os.kill(supernode, 0)
        except OSError:
            _end(path)
            os._exit(0)
        time.sleep(0.5)


def _answer(sock: socket.socket, serve, admit) -> None:
    from ..errors import SecureFFMError

    header, (state, request) = _receive(sock)
    try:
        if header["op"] == "admit":
            try:
                admit(header["node_config"], header["run_config"])
                _send(sock, {})
            except SecureFFMError as refusal:
                _send(sock, {"refused": str(refusal)})
            return
        new_state, reply = serve(header["node_config"], header["run_config"], state or None,
                                 request)
        _send(sock, {"sizes": [len(new_state), len(reply)]}, new_state, reply)
    except Exception as error:  # noqa: BLE001 (raised again in the ClientApp process)
        _send(sock, {"error": f"{type(error).__name__}: {error}"})


def _function(target: str):
    """The function ``"module:function"`` names (the ClientApp checked the form)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(path: str, serve: str, admit: str, supernode: str) -> None:
    """The warm process: listen at ``path`` first (a ClientApp may connect while the imports
    run), then import ``serve`` and ``admit`` once and answer one message at a time."""
    threading.Thread(target=_watch, args=(int(supernode), Path(path)), daemon=True).start()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen()
    try:
        serve_fn = _function(serve)
        admit_fn = _function(admit) if admit else None
    except BaseException as error:
        # Into the log before the socket closes: the ClientApp then reads it to say why.
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        _end(Path(path))
        raise
    server.settimeout(IDLE_S)
    while True:
        try:
            sock, _ = server.accept()
        except TimeoutError:
            _end(Path(path))
            return
        with sock:
            sock.settimeout(None)
            try:
                _answer(sock, serve_fn, admit_fn)
            except (OSError, ValueError):  # the ClientApp process went away, or sent no
                continue  # frame: Flower gives the server an error reply, the state is kept


if __name__ == "__main__":
    main(*sys.argv[1:5])
