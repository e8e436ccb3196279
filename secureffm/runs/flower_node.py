"""A client's own process on Flower: rebuild the client from its own keys, its own data and its
saved state, answer one request, save the state again.

:func:`serve` is what the ClientApp calls for every message
(:func:`secureffm.federation.flower.make_client_app`). Everything a client holds comes from
its node: the run's public config (the same config.toml the server has), its key file and the
pinned registry in the folder ``keys`` of its node config (else the run config's
``secureffm-keys``; see :mod:`secureffm.federation.keyfiles`), and its shard, drawn
from the public data recipe by its own client index (``client-i`` holds shard i) or read from
``client-data`` (a ``.pt`` tensor [N, d] loaded with ``weights_only=True``; FFM only: a DCFM
client draws its labelled shard i). The server sends requests only: no data, no key, no
state.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import DCFM_METHODS, RunConfig, config_from_dict
from ..data.pairs import get_pair, make_shards
from ..errors import ConfigError
from ..federation.codec import decode_request, encode_reply
from ..federation.exchange import Incoming, Reply, Request
from ..federation.journal import Journal
from ..federation.keyfiles import load_party_keys, load_registry
from ..federation.parties import Client, SecretStreams
from ..federation.snapshot import client_state, pack, restore_client, unpack
from ..methods.ffm import FFMClient, FFMSettings
from ..protocols.endpoint import ClientEndpoint
from ..protocols.protocol import load_protocol
from ..runtime import resolve_device
from .scaffold import resolve_dp

__all__ = ["serve", "answer", "Build", "CONFIG_KEY", "KEYS_KEY", "JOURNALS_KEY", "run_config_of",
           "config_of", "client_ids"]

CONFIG_KEY, KEYS_KEY, JOURNALS_KEY = "secureffm-config", "secureffm-keys", "secureffm-journals"
# (client id, sha256 of the state it left) -> the endpoint that left it: a node handling two
# messages in a row in one process skips the rebuild; any other state rebuilds from the bytes.
_LAST: dict[tuple[str, str], ClientEndpoint] = {}


def run_config_of(config: RunConfig, keys: str | Path,
                  journals: str | Path | None = None) -> dict[str, str]:
    """The Flower run config that carries ``config``, the keys folder and (when given) the
    folder of the clients' journals to every node."""
    out = {CONFIG_KEY: json.dumps(config.to_dict()), KEYS_KEY: str(Path(keys).resolve())}
    if journals is not None:
        out[JOURNALS_KEY] = str(Path(journals).resolve())
    return out


def config_of(run_config: dict) -> RunConfig:
    """The secureffm config a Flower run config carries (:func:`run_config_of`)."""
    try:
        return config_from_dict(json.loads(run_config[CONFIG_KEY]), RunConfig())
    except (KeyError, ValueError) as err:
        raise ConfigError(f"the Flower run config lacks a secureffm config: {err}") from None


def client_ids(config: RunConfig) -> list[str]:
    """The run's client ids in federation order (``client-1`` holds shard 1)."""
    return [f"client-{i}" for i in range(1, config.clients + 1)]


def _index(config: RunConfig, cid: str) -> int:
    """The 0-based shard index of ``client-i``."""
    if cid not in client_ids(config):
        raise ConfigError(f"{cid} is not one of the run's {config.clients} clients")
    return client_ids(config).index(cid)


def _shard(config: RunConfig, cid: str, node_config: dict, device: torch.device) -> torch.Tensor:
    """The client's own data: ``client-data`` from its node config, else shard i of the public
    recipe for ``client-i``."""
    path = node_config.get("client-data")
    if path:
        try:
            data = torch.load(Path(str(path)), weights_only=True)
        except FileNotFoundError:
            raise ConfigError(f"client-data {path} does not exist") from None
        except pickle.UnpicklingError as err:
            first = (str(err).strip().splitlines() or ["unsupported object"])[0]
            raise ConfigError(f"client-data {path} holds something other than tensors, so it "
                              f"was not loaded (nothing in it ran): {first}") from None
        if not isinstance(data, torch.Tensor) or data.ndim != 2:
            raise ConfigError(f"client-data {path} must hold one tensor [N, d]")
        return data.to(device)
    shards = make_shards(get_pair(config.data), config.clients, config.shard_size,
                         config.partition, config.seed, alpha=config.dirichlet_alpha,
                         min_size=config.batch_size)
    return shards[_index(config, cid)].to(device)


def _client(node_config: dict, run_config: dict, cid: str,
            shard: Callable[[], torch.Tensor]) -> Client:
    """The client with its own keys from its node's key file, holding the data ``shard()``
    gives (asked for once the keys loaded: a node without a key file is refused first)."""
    config = config_of(run_config)
    identity, sealing = load_party_keys(_keys(node_config, run_config), cid)
    data = shard()
    streams = SecretStreams(cid, config.deterministic_seed)
    return Client(cid, data, streams.torch("training", data.device), identity=identity,
                  sealing=sealing, streams=streams, protocol_rng=streams.numpy("protocol"))


def _keys(node_config: dict, run_config: dict) -> str:
    return node_config.get("keys") or run_config[KEYS_KEY]


def _endpoint(node_config: dict, run_config: dict, cid: str) -> ClientEndpoint:
    """The client rebuilt from its node: keys, registry, shard, protocol, program."""
    config = config_of(run_config)
    if config.method in DCFM_METHODS:
        return _dcfm_endpoint(node_config, run_config, cid)
    device = resolve_device(config.device)
    client = _client(node_config, run_config, cid,
                     lambda: _shard(config, cid, node_config, device))
    protocol = load_protocol(config.protocol)
    settings = FFMSettings.of(config)
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    program = FFMClient(settings, dp, get_pair(config.data), device)
    program.setup(client)
    return ClientEndpoint(client, load_registry(_keys(node_config, run_config)), protocol,
                          program)


def _dcfm_endpoint(node_config: dict, run_config: dict, cid: str) -> ClientEndpoint:
    """A DCFM client rebuilt from its node: its shard and labels are shard i of the public
    recipe for ``client-i``, its program :class:`~secureffm.methods.dcfm.DCFMClient`."""
    from ..methods.dcfm import DCFMClient
    from .dcfm import conditional_data, dcfm_settings  # the DCFM runner, only where needed

    config = config_of(run_config)
    if node_config.get("client-data"):
        raise ConfigError("client-data gives a DCFM client no labels (a .pt file holds one "
                          "tensor [N, d]); DCFM clients draw their labelled shard from the "
                          "public recipe: leave client-data out")
    device = resolve_device(config.device)
    data = conditional_data(config)
    client = _client(node_config, run_config, cid,
                     lambda: data.shards[_index(config, cid)][0].to(device))
    client.state["labels"] = data.shards[_index(config, cid)][1].to(device)
    protocol = load_protocol(config.protocol)
    settings, dp = dcfm_settings(config, data.facts, protocol)
    program = DCFMClient(settings, dp, client_ids(config), device)
    program.setup(client)
    return ClientEndpoint(client, load_registry(_keys(node_config, run_config)), protocol,
                          program)


def _hold(node_config: dict, request: Request) -> None:
    """Fault injection for tests: a node whose config says ``fault-hold = "ROUND:ACTION"``
    writes the file ``fault-hold-file`` when that request arrives and never answers, as a
    client whose machine dies in that phase (the deployment test then kills its SuperNode)."""
    hold = node_config.get("fault-hold")
    if hold and hold == f"{request.round}:{request.action}":
        Path(str(node_config["fault-hold-file"])).write_text(hold)
        while True:
            time.sleep(1)


def _journal(node_config: dict, run_config: dict, endpoint: ClientEndpoint,
             received: tuple[Incoming, ...], reply: Reply) -> None:
    """The client notes what it received and sent in its own journal: ``journal`` of its node
    config, else ``<secureffm-journals>/<client id>.jsonl`` when the run config names a folder
    (the simulation engine, where nodes have no config of their own), else nowhere."""
    path = node_config.get("journal")
    if not path and run_config.get(JOURNALS_KEY):
        path = Path(run_config[JOURNALS_KEY]) / f"{endpoint.client.id}.jsonl"
    if not path:
        return
    journal = Journal(path, endpoint.client)
    for arrived in received:
        journal.message("received", arrived.envelope, arrived.seq)
    if reply.envelope is not None:
        journal.message("sent", reply.envelope)
    for event in reply.events:
        journal.note("event", event)


def serve(node_config: dict, run_config: dict, state: bytes | None,
          request: bytes) -> tuple[bytes, bytes]:
    """Answer one request as this node's client; returns (its new state, the reply)."""
    return answer(node_config, run_config, state, request, _endpoint)


# How a node builds its client's endpoint: (node config, run config, client id) -> endpoint.
Build = Callable[[dict, dict, str], ClientEndpoint]


def answer(node_config: dict, run_config: dict, state: bytes | None, request: bytes,
           build: Build) -> tuple[bytes, bytes]:
    """:func:`serve` with the endpoint ``build`` makes (a benchmark's or a test's node reuses
    the rest: restoring, answering, saving)."""
    from ..federation.flower import client_id

    cid = client_id(node_config)
    endpoint = _LAST.pop((cid, hashlib.sha256(state or b"").hexdigest()), None)
    if endpoint is None:
        endpoint = build(node_config, run_config, cid)
        if state:
            header, arrays = unpack(state)
            restore_client(endpoint.client, header["client"], arrays)
            endpoint.restore(header["endpoint"])
    request, incoming, broadcasts = decode_request(request)
    _hold(node_config, request)
    reply = endpoint(request, incoming, broadcasts)
    _journal(node_config, run_config, endpoint, (*broadcasts, *([incoming] if incoming else [])),
             reply)
    header, arrays = client_state(endpoint.client)
    saved = pack({"client": header, "endpoint": endpoint.saved()}, arrays)
    _LAST[(cid, hashlib.sha256(saved).hexdigest())] = endpoint
    return saved, encode_reply(reply)
