"""Each party holds only its own keys (issue 15): after real runs under ``secagg`` and
``sealed``, no client's private key is reachable from the transport or from the server.

Adversary: whoever runs the transport or the server (the relay, the engine's operator, a
Flower server later). What they hold is the object graph reachable from the transport object
and from the server party; the test walks that graph after the runs and looks for any client's
long-term keys (its ``Identity`` and Ed25519 private key, its sealing ``KeyPair`` and X25519
private key), its secret-stream key, or the client object itself. The walk is shown to work
first: a client planted in a dict, a bound method or a closure reachable from the transport is
found.

Truths used: ``gc.get_referents`` and ``vars`` (Python's own view of what an object refers
to), object identity, and parties.json as written on disk.
"""

from __future__ import annotations

import gc
import json
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secureffm.federation import SERVER, Client, MessageLog, Party
from secureffm.federation.crypto import Identity, KeyPair
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.parties import SecretStreams, new_client
from secureffm.protocols import load_protocol
from secureffm.protocols.channel import ProtectedChannel
from secureffm.runs.scaffold import open_channel
from tests.gathering import gather

SECRET_TYPES = (Ed25519PrivateKey, X25519PrivateKey, Identity, KeyPair, SecretStreams, Party)
GRADIENT = {"gradient": ((3,), np.dtype(np.float32))}
# Leaves: nothing private behind them, and types, modules and functions' globals would lead
# to every object of the process (a module's globals are not what an object holds).
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, type,
          types.ModuleType, types.CodeType, types.BuiltinFunctionType)


def reachable(root: object) -> Iterator[object]:
    """Every object reachable from ``root``: through ``gc.get_referents`` and ``vars`` of
    objects, dicts, lists, tuples and sets; through a bound method's ``__self__`` and a
    function's closure cells and defaults (not its module globals); never into classes or
    modules."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, _ATOMS):
            continue
        if isinstance(obj, types.FunctionType):
            stack += [cell.cell_contents for cell in obj.__closure__ or ()
                      if _filled(cell)]
            stack += [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
            continue
        if isinstance(obj, types.MethodType):
            stack += [obj.__self__, obj.__func__]
            continue
        stack += [ref for ref in gc.get_referents(obj) if not isinstance(ref, type)]
        if hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.append(vars(obj))


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False


def client_secrets(clients: list[Client]) -> dict[int, str]:
    """id -> name of every object that is one client's own secret (or the client itself)."""
    out = {}
    for c in clients:
        for name, obj in (("the Client object", c), ("Identity", c.identity),
                          ("Ed25519PrivateKey", c.identity._private),
                          ("sealing KeyPair", c.sealing), ("X25519PrivateKey", c.sealing.private),
                          ("SecretStreams", c.streams), ("secret-stream key", c.streams.key),
                          ("memory", c.memory)):
            out[id(obj)] = f"{c.id}'s {name}"
    return out


def leaks(root: object, clients: list[Client]) -> list[str]:
    """Which of the clients' secrets are reachable from ``root``."""
    secrets = client_secrets(clients)
    return sorted({secrets[id(obj)] for obj in reachable(root) if id(obj) in secrets})


def secret_objects(root: object) -> list[object]:
    """Every key, identity, key pair, secret stream and party reachable from ``root``."""
    return [obj for obj in reachable(root) if isinstance(obj, SECRET_TYPES)]


def make_clients(n: int = 3) -> list[Client]:
    gen = torch.Generator().manual_seed(0)
    return [new_client(f"client-{i}", torch.randn(6, 2, generator=gen)) for i in range(1, n + 1)]


def run_secagg(folder: Path) -> ProtectedChannel:
    """Two rounds of broadcast and secure aggregation; client-3 drops after sharing its keys
    in round 2, so the server rebuilds its mask key from the others' shares."""
    clients = make_clients()
    faults = FaultPlan("t", (Fault("drop", "client-3", "masked_input", (2,)),))
    channel = open_channel(load_protocol("secagg"), clients,
                           MessageLog(folder / "messages.jsonl", keep_payloads=True), faults)
    for round_ in (1, 2):
        channel.broadcast(round_, "global_model", {"theta": np.ones(4, np.float32)})
        result = channel.aggregate(round_, "gradient",
                                   lambda c: {"gradient": np.full(3, c.size, np.float32)},
                                   {c.id: 1 / 3 for c in clients}, GRADIENT)
        assert result.payload is not None
    assert result.included == ["client-1", "client-2"]
    channel.close()
    return channel


def run_sealed(folder: Path) -> ProtectedChannel:
    """An all-gather of sealed models, and sealed sends each way between a client and the
    server (the server opens one with its own key)."""
    clients = make_clients()
    channel = open_channel(load_protocol("sealed"), clients,
                           MessageLog(folder / "messages.jsonl", keep_payloads=True))
    gathered = gather(channel, 1, "model",
                                  lambda c: {"weight": np.full(2, int(c.id[-1]), np.float32)})
    assert all(len(peers) == 2 for peers in gathered.values())
    model = {"weight": np.arange(4, dtype=np.float32)}
    assert channel.send(2, "upload", "model", "client-1", SERVER, model) is not None
    assert channel.send(2, "broadcast", "model", SERVER, "client-2", model) is not None
    channel.close()
    return channel


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ProtectedChannel]:
    base = tmp_path_factory.mktemp("runs")
    return {"secagg": run_secagg(base / "secagg"), "sealed": run_sealed(base / "sealed")}


# -- the walk works -------------------------------------------------------------------------


def _plant_in_dict(transport, client):
    vars(transport)["cache"] = {"by_id": [(client.id, client)]}


def _plant_bound_method(transport, client):
    vars(transport)["sign"] = client.sign


def _plant_closure(transport, client):
    key = client.sealing.private
    vars(transport)["hook"] = lambda data: key.exchange(data)


def _plant_raw_key(transport, client):
    transport.log.events.append({"note": (1, frozenset({client.identity._private}))})


@pytest.mark.parametrize("plant, found", [
    (_plant_in_dict, "client-2's Ed25519PrivateKey"),
    (_plant_bound_method, "client-2's X25519PrivateKey"),
    (_plant_closure, "client-2's X25519PrivateKey"),
    (_plant_raw_key, "client-2's Ed25519PrivateKey"),
])
def test_the_walk_finds_a_clients_key_planted_where_the_transport_reaches(tmp_path, plant,
                                                                          found):
    """A deliberately broken transport that keeps a client (or one of its keys) is caught, so
    an empty finding below means something."""
    clients = make_clients()
    channel = open_channel(load_protocol("plaintext"), clients,
                           MessageLog(tmp_path / "messages.jsonl"))
    assert leaks(channel.transport, clients) == []
    plant(channel.transport, clients[1])
    assert found in leaks(channel.transport, clients)
    assert all(not name.startswith(("client-1", "client-3"))
               for name in leaks(channel.transport, clients))
    assert secret_objects(channel.transport)
    # and the channel, which plays every party in this process, reaches every client's keys
    assert len(leaks(channel, clients)) == len(client_secrets(clients))


# -- after real runs -----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["secagg", "sealed"])
def test_no_private_key_is_reachable_from_the_transport(runs, protocol):
    channel = runs[protocol]
    assert leaks(channel.transport, channel.clients) == []
    assert secret_objects(channel.transport) == []  # not even the server's own keys


@pytest.mark.parametrize("protocol", ["secagg", "sealed"])
def test_the_server_reaches_only_its_own_keys(runs, protocol):
    channel = runs[protocol]
    server = channel.server
    assert leaks(server, channel.clients) == []
    own = {id(server), id(server.identity), id(server.identity._private), id(server.sealing),
           id(server.sealing.private), id(server.streams)}
    others = [type(obj).__name__ for obj in secret_objects(server) if id(obj) not in own]
    assert others == []


@pytest.mark.parametrize("protocol", ["secagg", "sealed"])
def test_parties_json_pins_every_partys_sign_and_seal_keys(runs, protocol):
    channel = runs[protocol]
    pinned = json.loads((channel.transport.log.path.parent / "parties.json").read_text())
    assert pinned == {p.id: {"sign": p.identity.public.hex(), "seal": p.sealing.public.hex()}
                      for p in channel.parties.values()}
    assert set(pinned) == {SERVER, "client-1", "client-2", "client-3"}
    registry = channel.transport.registry
    assert registry.sign == {p: bytes.fromhex(k["sign"]) for p, k in pinned.items()}
    assert registry.seal == {p: bytes.fromhex(k["seal"]) for p, k in pinned.items()}
