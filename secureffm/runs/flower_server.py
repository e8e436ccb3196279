"""The server's process on Flower: the same runner, its channel reaching the clients' own
processes through Flower.

:func:`main` is what the ServerApp runs (:func:`secureffm.federation.flower.make_server_app`):
it reads the run's config and the keys folder from the Flower run config, loads only the
server's own key file and the pinned registry, learns which Flower node is which client
(``hello``), and runs the runner of the method's family (:func:`secureffm.runs.ffm.run_ffm`,
:func:`secureffm.runs.dcfm.run_dcfm`; for a FedWAD run :func:`secureffm.runs.fedwad.run_fedwad`)
over a :class:`~secureffm.federation.remote.RemoteTransport`. It holds no client data and no client
key. :func:`run_on_flower` provisions fresh keys and runs the whole federation on Flower's
simulation engine from this process (what ``secureffm run --engine flower`` does), each
simulated node pinning the run as the user gave it (its own policy file, checked through the
same :func:`~secureffm.runs.flower_node.admit` as a deployed node).
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

from ..config import RunConfig
from ..data.silo import CLIENT_DATA
from ..errors import ConfigError
from ..families import family_of
from ..federation.keyfiles import load_party_keys, load_registry, provision
from ..federation.log import MessageLog
from ..federation.message import SERVER
from ..federation.parties import ClientInfo, Party, SecretStreams
from ..federation.remote import RemoteTransport
from ..protocols.channel import ProtectedChannel
from ..protocols.protocol import Protocol
from .fedwad import FedWADRun, FedWADRunResult, fedwad_folder, run_fedwad
from .flower_node import KEYS_KEY, client_ids, config_of, run_config_of
from .flower_policy import policy_of, write_policy
from .scaffold import JOURNALS_DIR, RunResult, pin_message, run_folder

__all__ = ["main", "flower_channel", "remote_channel", "run_on_flower", "client_ids"]


def remote_channel(calls, config: RunConfig | FedWADRun, keys: str | Path, protocol: Protocol,
                   log: MessageLog, size: int) -> ProtectedChannel:
    """The server's channel to the clients behind ``calls`` (a FlowerCalls): the server's own
    keys from ``keys``, the registry it pins (given to ``calls``, which lets a restarted
    client rejoin on a hello it signs), every expected client answering ``hello``;
    ``size``: the nominal shard size the server knows each client by."""
    expected = client_ids(config.clients)
    found = calls.hello(config.phase_timeout, len(expected))
    if sorted(found) != sorted(expected):
        raise ConfigError(_not_found(found, expected, calls.errors))
    registry = load_registry(keys)
    calls.registry = registry  # from now on a client may rejoin from a new node, signed
    identity, sealing = load_party_keys(keys, SERVER)
    server = Party(SERVER, identity=identity, sealing=sealing,
                   streams=SecretStreams(SERVER, config.deterministic_seed))
    transport = RemoteTransport(registry, tuple(expected), log, calls, config.phase_timeout)
    infos = [ClientInfo(cid, size) for cid in expected]
    return ProtectedChannel(protocol, transport, server, infos, remote=True)


def _not_found(found: dict, expected: list[str], errors: dict[str, str]) -> str:
    """Why the hello did not find exactly the run's clients: the nodes that did not answer
    and why, as Flower says (``errors``: FlowerCalls'), and the client ids that answered."""
    missing = [cid for cid in expected if cid not in found]
    text = f"this run needs {expected}; no node answered the hello as {missing}"
    if errors:
        text += (f"; {len(errors)} connected node(s) did not answer: " + "; ".join(
            f"Flower node {key}: {why}" if key.isdigit() else f"{key}: {why}"
            for key, why in sorted(errors.items())))
    other = sorted(set(found) - set(expected))
    if other or not errors:
        text += (f"; the nodes that answered run {sorted(found)}: start each SuperNode with "
                 f"--node-config client-id=... naming one of {expected}")
    return text


def flower_channel(calls, config: RunConfig, keys: str | Path, protocol: Protocol,
                   log: MessageLog) -> ProtectedChannel:
    """:func:`remote_channel` for an FFM-family run, whose clients the server weights by the
    run's nominal shard size."""
    if (config.partition == "dirichlet" and config.weighting == "size"
            and protocol.dp is None and not any(s.role == "aggregate" for s in protocol.stages)):
        raise ConfigError("on Flower the server weights clients by the run's nominal shard "
                          "size (it never sees a shard), which a dirichlet partition does not "
                          "give: use weighting = 'uniform' or another partition")
    return remote_channel(calls, config, keys, protocol, log, config.shard_size)


def main(calls, run_config: dict, announce: bool = True) -> dict:
    """The ServerApp's main: one run of the config in ``run_config``; returns where it wrote
    its folder, its metrics and its pin, and prints the pin for the operator (``flwr log``
    shows it) unless ``announce`` is False (the simulation engine: the command prints it)."""
    config = config_of(run_config)
    if isinstance(config, FedWADRun):
        return _fedwad_main(calls, run_config, config, announce)
    if config.threat_model:
        raise ConfigError("threat models inject faults into the in-process engine; on Flower "
                          "the faults are real (kill a node, or let it miss --phase-timeout)")

    def connect(protocol: Protocol, log: MessageLog) -> ProtectedChannel:
        return flower_channel(calls, config, run_config[KEYS_KEY], protocol, log)

    result = family_of(config.method).run(config, connect)
    if announce:
        print(pin_message(result.out, result.pin, config.pin_to), flush=True)
    return {"out": str(result.out), "metrics": result.metrics, "pin": result.pin}


def _fedwad_main(calls, run_config: dict, run: FedWADRun, announce: bool) -> dict:
    """:func:`main` for a FedWAD run: its folder, result.json's contents and its pin."""
    result = run_fedwad(run, connect=lambda protocol, log: remote_channel(
        calls, run, run_config[KEYS_KEY], protocol, log, run.samples))
    if announce:
        print(pin_message(result.out, result.pin, run.pin_to), flush=True)
    return {"out": str(result.out), "result": result.result, "pin": result.pin}


def run_on_flower(config: RunConfig | FedWADRun,
                  keys: str | Path | None = None) -> RunResult | FedWADRunResult:
    """Run ``config`` on Flower's simulation engine from this process: each client a Flower
    node with its own key file, policy and saved state (Ray starts first, about 15-20 s here).
    ``keys``: a provisioned folder (:func:`~secureffm.federation.keyfiles.provision`); by
    default fresh keys in a temporary folder, removed afterwards. Every node pins ``config`` as
    given here (a policy file in a temporary folder, :func:`~.flower_policy.policy_of`) and
    checks the run config the ServerApp submits against it. Each client keeps its own journal
    (:mod:`~secureffm.federation.journal`) in the run folder's ``journals/`` (one machine; in a
    deployment each node keeps its own, ``--node-config journal=PATH``)."""
    from ..federation.flower import simulate  # Flower is an optional extra

    with tempfile.TemporaryDirectory(prefix="secureffm-keys-") as fresh:
        folder = Path(keys) if keys else Path(fresh)
        if not keys:
            provision(folder, client_ids(config.clients))
        out = fedwad_folder(config) if isinstance(config, FedWADRun) else run_folder(config)
        policy = Path(fresh) / "policy.toml"
        write_policy(policy_of(config), policy)
        nodes = {cid: {"keys": str(folder.resolve()), "policy": str(policy),
                       "journal": str(out.resolve() / JOURNALS_DIR / f"{cid}.jsonl")}
                 for cid in client_ids(config.clients)}
        if isinstance(config, RunConfig) and config.data == CLIENT_DATA:
            if not config.client_data:
                raise ConfigError("the simulation gives each node its own file: pass "
                                  "--client-data once per client (a deployment's nodes name "
                                  "theirs in their node config)")
            for node, path in zip(nodes.values(), config.client_data, strict=True):
                node.update({"client-data": str(Path(path).resolve()),
                             "schema": str(Path(config.schema).resolve())})
        done = simulate(partial(main, announce=False), "secureffm.runs.flower_node:serve",
                        config.clients, run_config_of(config, folder), nodes=nodes,
                        admit="secureffm.runs.flower_node:hello")
    if done is None:
        raise ConfigError("the Flower run ended without a result; its log above says why")
    if isinstance(config, FedWADRun):
        return FedWADRunResult(Path(done["out"]), done["result"], done["pin"])
    return RunResult(Path(done["out"]), done["metrics"], done["pin"])
