"""A client's own process on Flower: rebuild the client from its own keys, its own data, its own
policy and its saved state, answer one request, save the state again.

:func:`serve` is what the ClientApp calls for every message, :func:`admit` what it calls for
the server's hello (:func:`secureffm.federation.flower.make_client_app`). What the server
decides is the run config (the same config.toml the server has, and the protocol spec it
runs, carried as its content); what the node decides is its node config, all mandatory:
``keys`` (its key file and the pinned registry, :mod:`secureffm.federation.keyfiles`),
``journal`` (its own journal file, :mod:`secureffm.federation.journal`) and ``policy`` (its
policy file, :mod:`secureffm.runs.flower_policy`). Before it builds anything the node checks
the run config against its policy (:func:`check_run_config`) and refuses a difference by name;
it then builds its client from its own copy of the spec the policy pins. Its shard is drawn
from the public data recipe by its own client index (``client-i`` holds shard i) or read from
``client-data`` (a ``.pt`` tensor [N, d] loaded with ``weights_only=True``; not for DCFM, whose
client draws its labelled shard i). The client's state is kept in the node's memory and,
sealed, on its own disk beside its journal (:mod:`secureffm.federation.node_state`), so a
restarted node rebuilds the same client; it then takes no part in the rounds it had seen before
it stopped (a signed ``rejected`` event), only in later ones. The run config carries an FFM-family
:class:`~secureffm.config.RunConfig` or a :class:`~secureffm.runs.fedwad.FedWADRun`
(``secureffm fedwad``), and the node builds that family's client program. The server sends
requests only: no data, no key, no state, no protection's parameter.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import DCFM_METHODS, RunConfig, config_from_dict
from ..data.pairs import get_pair, make_shards
from ..data.schema import Schema
from ..data.silo import CLIENT_DATA
from ..data.tables import load_table
from ..errors import ConfigError, PolicyError, SecureFFMError
from ..federation.codec import decode_request, encode_reply
from ..federation.exchange import Incoming, Reply, Request
from ..federation.flower import client_id
from ..federation.joint import kind_parts
from ..federation.journal import Journal
from ..federation.keyfiles import load_party_keys, load_registry
from ..federation.message import SERVER
from ..federation.node_state import NodeState, StateError, StateFile, run_of, state_key, state_path
from ..federation.parties import Client, SecretStreams
from ..federation.snapshot import client_state, pack, restore_client, unpack
from ..methods.fedwad_federated import FedWADClient
from ..methods.ffm import FFMClient, FFMSettings
from ..protocols.endpoint import ClientEndpoint
from ..protocols.protocol import load_protocol
from ..protocols.registry import ProtocolSpec, read_spec, spec_from_table
from ..runtime import resolve_device
from .fedwad import FedWADRun, client_data
from .flower_policy import Policy, differences, own_spec, policy_of, read_policy
from .scaffold import resolve_dp
from .silo import hold_silo, own_silo, silo_program

__all__ = ["serve", "admit", "hello", "answer", "Build", "CONFIG_KEY", "KEYS_KEY", "SPEC_KEY",
           "SCHEMA_KEY", "FAMILY_KEY", "NODE_KEYS", "RECEIVING", "run_config_of", "config_of",
           "spec_of", "check_run_config", "client_ids"]

# The server's keys folder (the server's own; a node never reads it) and the run's protocol
# spec, carried as its content (a node checks it, and runs its own copy).
CONFIG_KEY, KEYS_KEY, SPEC_KEY = "secureffm-config", "secureffm-keys", "secureffm-protocol"
SCHEMA_KEY = "secureffm-schema"  # a run on the clients' own tables: the public schema's TOML
FAMILY_KEY, FEDWAD = "secureffm-family", "fedwad"  # no family: an FFM-family RunConfig
NODE_KEYS = ("keys", "journal", "policy")  # what every node's config must give
# Actions by which a client only keeps what the server sends it: allowed for any kind.
RECEIVING = ("accept", "take")
# (client id, sha256 of the state it left) -> the endpoint that left it: a node handling two
# messages in a row in one process skips the rebuild; any other state rebuilds from the bytes.
# One entry per client, and at most _KEEP in all (least recently answered out first): a
# simulation's actor serves many clients, and a client's next message may go to another actor.
_LAST: OrderedDict[tuple[str, str], ClientEndpoint] = OrderedDict()
_KEEP = 256


def run_config_of(config: RunConfig | FedWADRun, keys: str | Path) -> dict[str, str]:
    """The Flower run config that carries ``config`` (and, for a FedWAD run, its family), the
    content of the protocol spec it names, and the server's keys folder."""
    out = {CONFIG_KEY: json.dumps(config.to_dict()), KEYS_KEY: str(Path(keys).resolve()),
           SPEC_KEY: read_spec(config.protocol).canonical().decode()}
    if isinstance(config, FedWADRun):
        out[FAMILY_KEY] = FEDWAD
    elif config.data == CLIENT_DATA:
        out[SCHEMA_KEY] = Schema.load(config.schema).to_toml()
    return out


def config_of(run_config: dict) -> RunConfig | FedWADRun:
    """The secureffm config a Flower run config carries (:func:`run_config_of`)."""
    family = run_config.get(FAMILY_KEY)
    if family not in (None, FEDWAD):
        raise ConfigError(f"the Flower run config names family {family!r}; this secureffm "
                          f"runs {FEDWAD!r} or, without the key, the methods of secureffm run")
    try:
        values = json.loads(run_config[CONFIG_KEY])
        if family == FEDWAD:
            return FedWADRun.from_dict(values)
        return config_from_dict(values, RunConfig())
    except (KeyError, ValueError) as err:
        raise ConfigError(f"the Flower run config lacks a secureffm config: {err}") from None


def spec_of(run_config: dict) -> ProtocolSpec:
    """The protocol spec the run config carries (its content, :func:`run_config_of`)."""
    try:
        return spec_from_table(json.loads(run_config[SPEC_KEY]), "of the run config")
    except (KeyError, ValueError):
        raise PolicyError(f"the run config carries no protocol spec ({SPEC_KEY}): submit it "
                          "with secureffm flower-app, which writes it") from None


def check_run_config(policy: Policy, run_config: dict) -> None:
    """Refuse a run config that asks other than ``policy``: a PolicyError naming every field
    that differs, with both values (the run's fields resolved from the config and the spec
    it carries, :func:`~secureffm.runs.flower_policy.policy_of`)."""
    try:
        config = config_of(run_config)
        schema = None
        if isinstance(config, RunConfig) and config.data == CLIENT_DATA:
            if SCHEMA_KEY not in run_config:
                raise PolicyError(f"the run config carries no schema ({SCHEMA_KEY}) for a run "
                                  "on the clients' own tables: submit it with secureffm "
                                  "flower-app, which writes it")
            schema = Schema.loads(run_config[SCHEMA_KEY], "the run config's schema")
        asked = policy_of(config, spec_of(run_config), schema)
    except PolicyError:
        raise
    except SecureFFMError as err:
        raise PolicyError(f"the run config does not resolve ({err}); the policy in "
                          f"{policy.source} pins protocol {policy.protocol!r}, method "
                          f"{policy.method!r}") from None
    found = differences(policy, asked)
    if found:
        raise PolicyError(f"the run config differs from the policy in {policy.source}: "
                          + "; ".join(found) + ". Submit the run this node pinned, or its "
                          "operator rewrites the policy (secureffm flower-policy)")


def _node(node_config: dict) -> tuple[str, Policy]:
    """The node's client id and policy; a node config without ``keys``, ``journal`` or
    ``policy`` is refused by name (a node never uses paths the server names)."""
    cid = client_id(node_config)
    missing = [key for key in NODE_KEYS if not node_config.get(key)]
    if missing:
        raise ConfigError(f"{cid}'s node config lacks {', '.join(missing)}: a node reads its "
                          "keys, writes its journal and pins its policy at paths of its own: "
                          "start it with --node-config \"keys='DIR' journal='FILE.jsonl' "
                          "policy='FILE.toml'\" (docs/flower.md)")
    return cid, read_policy(str(node_config["policy"]))


def admit(node_config: dict, run_config: dict) -> Policy:
    """The node's policy, once the run config is checked against it; a PolicyError that names
    the node otherwise (what the node answers the server's hello with, and what stops
    :func:`serve` before it builds anything)."""
    cid, policy = _node(node_config)
    try:
        own_spec(policy)
        check_run_config(policy, run_config)
    except PolicyError as err:
        raise PolicyError(f"{cid} refuses the run: {err}") from None
    return policy


def hello(node_config: dict, run_config: dict) -> Policy:
    """What a node answers the server's hello with: :func:`admit`, and on a run on the
    clients' own tables its own file checked against its own schema, so a file that does not
    fit is refused by name before the first round (a PolicyError naming the node and the file).
    """
    policy = admit(node_config, run_config)
    if policy.schema_sha256 and node_config.get("client-data") and node_config.get("schema"):
        cid = client_id(node_config)
        try:
            schema = Schema.load(str(node_config["schema"]))
            load_table(str(node_config["client-data"]), schema)
        except SecureFFMError as err:
            raise PolicyError(f"{cid} refuses the run: its own data does not fit: {err}") from None
    return policy


def _data_file(path: str, device: torch.device) -> torch.Tensor:
    """``client-data``: one tensor [N, d] in a ``.pt`` file, loaded without running pickles."""
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


def client_ids(clients: int) -> list[str]:
    """The run's client ids in federation order (``client-1`` holds shard 1)."""
    return [f"client-{i}" for i in range(1, clients + 1)]


def _index(cid: str, clients: int) -> int:
    """i - 1 for ``client-i``, one of the run's ``clients``."""
    index = int(cid.rsplit("-", 1)[-1]) - 1
    if not 0 <= index < clients:
        raise ConfigError(f"{cid} is not one of the run's {clients} clients")
    return index


def _shard(config: RunConfig, cid: str, node_config: dict, device: torch.device) -> torch.Tensor:
    """The client's own data: ``client-data`` from its node config, else shard i of the public
    recipe for ``client-i``."""
    if node_config.get("client-data"):
        return _data_file(str(node_config["client-data"]), device)
    index = _index(cid, config.clients)
    shards = make_shards(get_pair(config.data), config.clients, config.shard_size,
                         config.partition, config.seed, alpha=config.dirichlet_alpha,
                         min_size=config.batch_size)
    return shards[index].to(device)


def _client(keys: str, cid: str, deterministic_seed: int | None,
            data: Callable[[], torch.Tensor]) -> Client:
    """``cid`` with its own key pair (read first: a node without one stops there), its
    ``data()`` and its secret streams."""
    identity, sealing = load_party_keys(keys, cid)
    shard = data()
    streams = SecretStreams(cid, deterministic_seed)
    return Client(cid, shard, streams.torch("training", shard.device), identity=identity,
                  sealing=sealing, streams=streams, protocol_rng=streams.numpy("protocol"))


def _endpoint(policy: Policy, node_config: dict, run_config: dict, cid: str) -> ClientEndpoint:
    """The client rebuilt from its node: keys, registry, shard, its own copy of the protocol
    (the spec ``policy`` pins), program."""
    config = dataclasses.replace(config_of(run_config),
                                 protocol=policy.spec_file or policy.protocol)
    keys = str(node_config["keys"])
    if isinstance(config, FedWADRun):
        return _fedwad_endpoint(node_config, keys, cid, config)
    if config.method in DCFM_METHODS:
        return _dcfm_endpoint(node_config, keys, cid, config)
    if config.data == CLIENT_DATA:
        return _table_endpoint(policy, node_config, keys, cid, config)
    device = resolve_device(config.device)
    client = _client(keys, cid, config.deterministic_seed,
                     lambda: _shard(config, cid, node_config, device))
    protocol = load_protocol(config.protocol)
    settings = FFMSettings.of(config)
    dp = resolve_dp(config, protocol, settings.sent_kinds)
    program = FFMClient(settings, dp, get_pair(config.data), device)
    program.setup(client)
    return ClientEndpoint(client, load_registry(keys), protocol, program)


def _table_endpoint(policy: Policy, node_config: dict, keys: str, cid: str,
                    config: RunConfig) -> ClientEndpoint:
    """A client on its own table: ``client-data`` (its file) and ``schema`` (its copy of the
    public schema, whose digest its policy pins) from its node config, never the run's."""
    missing = [key for key in ("client-data", "schema") if not node_config.get(key)]
    if missing:
        raise ConfigError(f"{cid}'s node config lacks {', '.join(missing)}: a run on the "
                          "clients' own tables reads each node's own file and schema: start it "
                          "with --node-config \"client-data='FILE.csv' schema='schema.toml' "
                          "...\" (docs/flower.md)")
    schema = Schema.load(str(node_config["schema"]))
    if schema.digest() != policy.schema_sha256:
        raise PolicyError(f"{cid}'s schema {node_config['schema']} has sha256 "
                          f"{schema.digest()}, not the {policy.schema_sha256} its policy "
                          f"({policy.source}) pins: check the schema, then rewrite the policy")
    device = resolve_device(config.device)
    silo = own_silo(config, str(node_config["client-data"]), schema)
    client = _client(keys, cid, config.deterministic_seed, lambda: silo.x.to(device))
    hold_silo(client, silo)
    protocol = load_protocol(config.protocol)
    program = silo_program(config, schema, resolve_dp(
        config, protocol, FFMSettings.of(config).sent_kinds), device)
    program.method.setup(client)
    return ClientEndpoint(client, load_registry(keys), protocol, program)


def _dcfm_endpoint(node_config: dict, keys: str, cid: str, config: RunConfig) -> ClientEndpoint:
    """A DCFM client rebuilt from its node: its shard and labels are shard i of the public
    recipe for ``client-i``, its program :class:`~secureffm.methods.dcfm.DCFMClient`."""
    from ..methods.dcfm import DCFMClient
    from .dcfm import conditional_data, dcfm_settings  # the DCFM runner, only where needed

    if node_config.get("client-data"):
        raise ConfigError("client-data gives a DCFM client no labels (a .pt file holds one "
                          "tensor [N, d]); DCFM clients draw their labelled shard from the "
                          "public recipe: leave client-data out")
    device = resolve_device(config.device)
    data = conditional_data(config)
    x, labels = data.shards[_index(cid, config.clients)]
    client = _client(keys, cid, config.deterministic_seed, lambda: x.to(device))
    client.state["labels"] = labels.to(device)
    protocol = load_protocol(config.protocol)
    settings, dp = dcfm_settings(config, data.facts, protocol)
    program = DCFMClient(settings, dp, client_ids(config.clients), device)
    program.setup(client)
    return ClientEndpoint(client, load_registry(keys), protocol, program)


def _fedwad_endpoint(node_config: dict, keys: str, cid: str, run: FedWADRun) -> ClientEndpoint:
    """A FedWAD client: its samples (``client-data``, else client i's of the public recipe,
    :func:`~secureffm.runs.fedwad.client_data`) and the FedWAD program of its own run config
    and protocol (its t range, noise and when it gives distances)."""
    def data() -> torch.Tensor:
        path = node_config.get("client-data")
        if path:
            return _data_file(str(path), torch.device("cpu"))
        return torch.from_numpy(client_data(run)[_index(cid, run.clients)])

    client = _client(keys, cid, run.deterministic_seed, data)
    protocol = load_protocol(run.protocol)
    program = FedWADClient(run.fedwad, protocol.geodesic_privacy("measure"))
    return ClientEndpoint(client, load_registry(keys), protocol, program)


def _hold(node_config: dict, request: Request) -> None:
    """Fault injection for tests: a node whose config says ``fault-hold = "ROUND:ACTION"``
    writes the file ``fault-hold-file`` when that request arrives and never answers, as a
    client whose machine dies in that phase (the deployment test then kills its SuperNode)."""
    hold = node_config.get("fault-hold")
    if hold and hold == f"{request.round}:{request.action}":
        Path(str(node_config["fault-hold-file"])).write_text(hold)
        while True:
            time.sleep(1)


def _journal(node_config: dict, endpoint: ClientEndpoint, received: tuple[Incoming, ...],
             reply: Reply) -> None:
    """The client notes what it received and sent in its own journal: ``journal`` of its node
    config (:func:`serve` requires one; a benchmark's node built by :func:`answer` may keep
    none)."""
    path = node_config.get("journal")
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
    """Answer one request as this node's client; returns (its new state, the reply). The run
    config is checked against the node's policy first, for every message (:func:`admit`).
    ``state`` (a :class:`~secureffm.federation.node_state.NodeState` frame) is None in a node
    that has not answered yet in this process: it then reads its sealed state file, if any,
    and is held out of every round that file had seen. The state file is written when a
    request of a new round arrives, and again before the reply leaves."""
    policy = admit(node_config, run_config)
    cid, run = client_id(node_config), run_of(run_config)
    store = StateFile(state_path(str(node_config["journal"]), run),
                      state_key(str(node_config["keys"]), cid), cid, run)
    kept = store.returning() if state is None else NodeState.from_bytes(state)
    if (kept.client, kept.run) != (cid, run):
        raise StateError(f"{cid}'s state in memory is {kept.client}'s of run {kept.run}, not of "
                         f"this run {run}")
    round_ = decode_request(request)[0].round
    if round_ > kept.seen:  # before computing: a crash while answering holds this round out
        kept = dataclasses.replace(kept, seen=round_)
        store.save(kept)
    snapshot, reply = answer(node_config, run_config, kept.snapshot or None, request,
                             functools.partial(_endpoint, policy), policy, kept.held)
    kept = dataclasses.replace(kept, snapshot=snapshot)
    store.save(kept)
    return kept.to_bytes(), reply


def _outside(policy: Policy | None, request: Request, held: int = -1) -> str:
    """Why ``request`` is outside ``policy`` or of a round the client is ``held`` out of
    ("" when it is not, or only delivers)."""
    if request.action in RECEIVING:
        return ""
    if request.round <= held:
        return (f"it was restarted during round {held}: it takes no part in a round it may "
                f"have dropped from, only from round {held + 1} on")
    if policy is None:
        return ""
    if not set(kind_parts(request.kind)) <= set(policy.kinds):  # a joint kind: each part
        return f"answers only {', '.join(policy.kinds)}"
    if policy.last_round is not None and request.round > policy.last_round:
        return f"answers no round past {policy.last_round}"
    return ""


# How a node builds its client's endpoint: (node config, run config, client id) -> endpoint.
Build = Callable[[dict, dict, str], ClientEndpoint]


def answer(node_config: dict, run_config: dict, state: bytes | None, request: bytes,
           build: Build, policy: Policy | None = None, held: int = -1) -> tuple[bytes, bytes]:
    """:func:`serve` with the endpoint ``build`` makes (a benchmark's or a test's node reuses
    the rest: restoring, answering, saving). ``state``: a snapshot's bytes. With a ``policy``,
    a request outside it (a kind outside its ``kinds``, a round past its last), and any
    request of a round up to ``held``, is refused in a signed ``rejected`` event unless the
    client only receives it (:data:`RECEIVING`)."""
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
    outside = _outside(policy, request, held)
    if outside:
        why = outside if request.round <= held else f"its policy ({policy.source}) {outside}"
        reply = Reply(None, (endpoint.client.event(
            request.round, request.phase, "rejected", SERVER,
            f"{cid} refused {request.action} of kind {request.kind!r} in round "
            f"{request.round}: {why}"),))
    else:
        reply = endpoint(request, incoming, broadcasts)
    _journal(node_config, endpoint, (*broadcasts, *([incoming] if incoming else [])), reply)
    header, arrays = client_state(endpoint.client)
    saved = pack({"client": header, "endpoint": endpoint.saved()}, arrays)
    for stale in [key for key in _LAST if key[0] == cid]:
        del _LAST[stale]
    _LAST[(cid, hashlib.sha256(saved).hexdigest())] = endpoint
    while len(_LAST) > _KEEP:
        _LAST.popitem(last=False)
    return saved, encode_reply(reply)
