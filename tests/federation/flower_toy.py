"""A toy ``serve`` for tests/federation/test_flower.py: what a secureffm node does, in small.

Each node keeps, as its state bytes, an Ed25519 private key drawn once from OS entropy (32
bytes) and a counter of the requests it served (8 bytes, little endian). It replies
``counter | public key | signature | request``, the signature over ``client id | counter |
request``. A request starting with ``raise`` makes the handler raise; ``sleep:S|...`` makes it
sleep S seconds first (for the timeout tests).
"""

from __future__ import annotations

import os
import struct
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from secureffm.federation.flower import client_id

HEAD = 8 + 32 + 64  # counter, public key, signature


def statement(client: str, counter: int, request: bytes) -> bytes:
    return client.encode() + b"|" + struct.pack("<Q", counter) + request


def serve(node_config: dict, run_config: dict, state: bytes | None,
          request: bytes) -> tuple[bytes, bytes]:
    if request.startswith(b"raise"):
        raise RuntimeError("this node was asked to fail")
    if request.startswith(b"sleep:"):
        time.sleep(float(request[6:request.index(b"|")]))
    secret = state[:32] if state else os.urandom(32)
    counter = (struct.unpack("<Q", state[32:40])[0] if state else 0) + 1
    key = Ed25519PrivateKey.from_private_bytes(secret)
    signature = key.sign(statement(client_id(node_config), counter, request))
    reply = (struct.pack("<Q", counter) + key.public_key().public_bytes_raw() + signature
             + request)
    return secret + struct.pack("<Q", counter), reply


def opened(client: str, reply: bytes) -> tuple[int, bytes, bytes]:
    """(counter, public key, request echoed) of a reply, after checking its signature."""
    counter = struct.unpack("<Q", reply[:8])[0]
    public, signature, request = reply[8:40], reply[40:HEAD], reply[HEAD:]
    Ed25519PublicKey.from_public_bytes(public).verify(signature,
                                                      statement(client, counter, request))
    return counter, public, request


def checked(calls, requests: dict[str, bytes], timeout: float) -> dict[str, list | None]:
    """One call; client id -> [counter, public key hex, request echoed intact] or None."""
    replies = calls.call(requests, timeout)
    out = {}
    for client, reply in replies.items():
        if reply is None:
            out[client] = None
            continue
        counter, public, echoed = opened(client, reply)
        out[client] = [counter, public.hex(), echoed == requests[client]]
    return out


def deployed(calls, run_config: dict) -> dict:
    """Server main of the deployment test: hello, an empty and a 4 MB call, then (when
    ``run_config["pause"]`` names a folder) write ``ready`` there, wait for ``go`` and call once
    more. Returns the calls' results, seconds and the errors of the last one."""
    timeout = float(run_config["timeout"])
    found = calls.hello(120.0, clients=int(run_config["clients"]))
    results, seconds = [], []
    for size in (0, 4_000_000, 0, 4_000_000):
        results.append(checked(calls, {c: os.urandom(size) for c in found}, timeout))
        seconds.append(calls.last.seconds)
    if run_config.get("pause"):
        folder = os.fspath(run_config["pause"])
        open(os.path.join(folder, "ready"), "w").close()
        while not os.path.exists(os.path.join(folder, "go")):
            time.sleep(0.05)
        results.append(checked(calls, {c: b"after" for c in found}, timeout))
        seconds.append(calls.last.seconds)
    return {"nodes": sorted(found), "results": results, "seconds": seconds,
            "errors": calls.errors}


def met(calls, run_config: dict) -> dict:
    """Server main of the node-authentication test: hello (once ``run_config["clients"]``
    nodes are connected), then one call to every client found. Returns the clients found and
    those whose signed reply echoed the request."""
    found = calls.hello(120.0, clients=int(run_config["clients"]))
    replies = checked(calls, {c: b"hello" for c in found}, float(run_config["timeout"]))
    return {"nodes": sorted(found), "answered": sorted(c for c, r in replies.items()
                                                       if r and r[2])}
