"""Flower as the engine of secureffm's one batched call (issue 17): bytes out, bytes back.

The server sends each client one request (bytes) and gets back one reply (bytes); a client's
whole state between requests is bytes too. This module moves those bytes over Flower 1.42 and
knows nothing else: no method, no protocol, no message format. Its parts:

- :class:`FlowerCalls`, in the ServerApp: :meth:`~FlowerCalls.hello` maps our client ids to
  Flower node ids, :meth:`~FlowerCalls.call` pushes every request at once (message type
  ``query.secureffm``), pulls again soon while replies come in and otherwise after a sleep
  that grows by a quarter a pull, up to 1 s (Flower's ``send_and_receive`` sleeps a fixed 3 s
  between pulls in deployment; a pull costs the SuperLink work for every pending reply) and
  gives None for a client whose reply did not
  come in time or came as an error (a dead node's ``NODE_UNAVAILABLE`` from the SuperLink, a
  handler exception).
- :func:`make_client_app`: a ClientApp whose ``query.secureffm`` handler calls
  ``serve(node_config, run_config, state, request) -> (state, reply)`` and keeps ``state`` in
  ``context.state`` between messages, and whose ``query.hello`` handler answers the client id
  and, when ``admit(node_config, run_config)`` raises, why the node refuses the run (then
  :meth:`FlowerCalls.hello` raises a PolicyError naming each refusing node and its reason).
  In a deployment both run in the node's warm process (:mod:`.warm`), so that the ClientApp
  process Flower starts for every message imports neither torch nor the node's client.
- :func:`make_server_app`: a ServerApp whose main calls ``main(calls, run_config)``.
- Launchers: :func:`simulate` (Flower's simulation engine in this process) and
  :class:`LocalDeployment` (a SuperLink and one SuperNode per client as OS processes on this
  host, the app submitted with ``flwr run``).

``serve`` and ``main`` may be given as ``"module:function"`` strings, resolved when the app is
made, so that a Flower App config can name the ClientApp and ServerApp modules (see
:class:`LocalDeployment`, which generates them). Flower is imported inside functions only:
``import secureffm`` works without it (it is the optional extra ``secureffm[flower]``).

Bytes travel as one ``bytes`` value of a ConfigRecord up to :data:`ARRAY_ABOVE` bytes and as a
uint8 ``Array`` above (Flower cuts arrays into 5 MiB chunks, so no single object grows with the
payload); both carried 4 MB intact in the spike (spike/flower/FINDINGS.md, section 2).
Node ids: a node's client id is ``client-id`` from its node config, else
``client-{partition-id + 1}`` (the simulation engine sets ``partition-id``). The first hello's
reply is not signed: a node lying about its id cannot sign as the client it claims to be, since
every envelope of ours is signed with keys pinned in parties.json. Once ``FlowerCalls.registry``
is set, a node that connects later (a restarted SuperNode) is asked with a fresh challenge, and
a client moves to it only on its signed answer (:mod:`.rejoin`). The ClientApp hands ``serve``
and ``admit`` the Flower run id in the run config (:data:`RUN_KEY`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, MessageError, PolicyError, SecureFFMError
from .engine_dispatch import indexed_dispatch
from .supernode import DEFAULT_S, check_idle_poll

if TYPE_CHECKING:
    from flwr.app import Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    from .parties import Registry

__all__ = ["FlowerCalls", "Traffic", "make_client_app", "make_server_app", "simulate", "write_app",
           "LocalDeployment", "client_id", "resolve", "HELLO", "CALL", "ARRAY_ABOVE", "RUN_KEY"]

HELLO = "query.hello"
CALL = "query.secureffm"
ARRAY_ABOVE = 1 << 20  # bytes; larger payloads travel as a chunked uint8 Array
PULL_GROWTH, PULL_MAX_S = 1.25, 1.0  # FlowerCalls' sleep between pulls grows to at most 1 s
_STATE = "secureffm"  # key of the client's state in context.state
_KEY = "bytes"
RUN_KEY = "flwr-run-id"  # the Flower run id, in the run config a ClientApp hands on
_LOG = logging.getLogger(__name__)

Serve = Callable[[dict, dict, "bytes | None", bytes], tuple[bytes, bytes]]
Admit = Callable[[dict, dict], Any]  # (node config, run config); raises to refuse the run
ServerMain = Callable[["FlowerCalls", dict], Any]


def _flwr() -> None:
    """Raise a ConfigError saying how to install Flower when it is missing."""
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError("the Flower engine needs flwr: pip install 'secureffm[flower]'")


def resolve(target: str | Callable) -> Callable:
    """The function named by ``"module:function"`` (a callable is returned as it is)."""
    if callable(target):
        return target
    module, _, name = str(target).partition(":")
    if not module or not name:
        raise ConfigError(f"{target!r} is not 'module:function': name the function's module "
                          f"and the function, as in 'secureffm.runs.flower_node:serve'")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot load {target!r} ({error}): check the module is importable "
                          f"here and defines {name}") from error
    if not callable(found):
        raise ConfigError(f"{target!r} is not a function")
    return found


def client_id(node_config: dict) -> str:
    """Our id of the client a node runs: ``client-id`` if set, else ``client-{partition-id+1}``."""
    if "client-id" in node_config:
        return str(node_config["client-id"])
    if "partition-id" in node_config:
        return f"client-{int(node_config['partition-id']) + 1}"
    raise ConfigError("a SuperNode has neither client-id nor partition-id in its node config: "
                      "start it with --node-config 'client-id=\"client-1\"'")


# -- bytes in Flower records ------------------------------------------------------------------


def _pack(data: bytes) -> RecordDict:
    """``data`` as a RecordDict: a ConfigRecord value, or a uint8 Array above ARRAY_ABOVE."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    if len(data) > ARRAY_ABOVE:
        return RecordDict({_KEY: ArrayRecord({_KEY: Array("uint8", (len(data),), "raw", data)})})
    return RecordDict({_KEY: ConfigRecord({_KEY: data})})


def _unpack(content: RecordDict) -> bytes:
    """The bytes :func:`_pack` put in ``content``."""
    from flwr.app import ArrayRecord

    record = content[_KEY]
    value = record[_KEY]
    return bytes(value.data) if isinstance(record, ArrayRecord) else bytes(value)


def _size(content: RecordDict) -> int:
    """Bytes :func:`_pack` put in ``content`` (0 for a hello)."""
    if _KEY not in content:
        return 0
    value = content[_KEY][_KEY]
    return len(value) if isinstance(value, bytes) else len(value.data)


def wire_bytes(message: Message) -> int:
    """Bytes of Flower's serialized objects of ``message`` (the message, its records, array
    chunks): what its HTTP bodies carry in deployment. Measured on a copy: serializing caches
    object ids in the message, which raced with Flower's simulation thread sending it."""
    total, todo = 0, [copy.deepcopy(message)]
    while todo:
        obj = todo.pop()
        total += len(obj.deflate())
        todo += list((obj.children or {}).values())
    return total


# -- server side ------------------------------------------------------------------------------


@dataclass
class Traffic:
    """What calls moved: request and reply bytes sent and received, their Flower wire bytes
    (:func:`wire_bytes`; 0 unless counted), and seconds."""

    sent: int = 0
    received: int = 0
    wire_sent: int = 0
    wire_received: int = 0
    seconds: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.sent + other.sent, self.received + other.received,
                       self.wire_sent + other.wire_sent,
                       self.wire_received + other.wire_received, self.seconds + other.seconds)


class FlowerCalls:
    """The batched call over a Flower ``Grid`` (in a ServerApp's main).

    ``pull_interval``: seconds slept after a pull that brought replies; after one that brought
    none, each sleep is :data:`PULL_GROWTH` times the last, up to :data:`PULL_MAX_S` (one pull
    is one request to the SuperLink, which checks every pending message: an idle wait of T s
    for n replies costs O(n (log T + T)) instead of O(n T / pull_interval), and a first reply
    waits at most about a quarter of the time already waited, or 1 s, past its arrival).
    ``last``: the :class:`Traffic` of the latest call; ``total``: of every call and hello so
    far. ``errors``: client id -> why its latest reply was None.
    ``count_wire``: also count Flower's wire bytes, which serializes and hashes every message
    once more (about 6 to 15 ms per 4 MB message here), so it is off by default.
    ``registry``: the pinned public keys; once set, each call first lets a restarted client
    rejoin (:meth:`rejoin`). ``strangers``: node id -> why it runs none of the clients.
    """

    def __init__(self, grid: Grid, pull_interval: float = 0.01, count_wire: bool = False):
        self.grid = grid
        self.pull_interval = pull_interval
        self.count_wire = count_wire
        self.nodes: dict[str, int] = {}
        self.last = Traffic()
        self.total = Traffic()
        self.errors: dict[str, str] = {}
        self.registry: Registry | None = None
        self.strangers: dict[int, str] = {}
        self._group = 0

    def hello(self, timeout: float, clients: int = 0) -> dict[str, int]:
        """Ask every connected node which client it runs (one ``query.hello`` exchange) and
        keep the map client id -> node id; first wait until ``clients`` nodes are connected.
        A node that does not answer within ``timeout`` s is left out; a node that refuses the
        run (its ClientApp's ``admit``) makes this a PolicyError naming it and its reason."""
        deadline = time.monotonic() + timeout
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < clients and time.monotonic() < deadline:
            time.sleep(0.1)
            nodes = sorted(self.grid.get_node_ids())
        if len(nodes) < clients:
            raise ConfigError(f"{len(nodes)} of {clients} SuperNodes connected within "
                              f"{timeout} s: start the missing ones or raise the timeout")
        from flwr.app import RecordDict

        answers = self._exchange({node: RecordDict() for node in nodes}, HELLO,
                                 deadline - time.monotonic())
        found: dict[str, int] = {}
        refused: list[str] = []
        for node, reply in answers.items():
            if reply is None:
                continue
            name = str(reply.content["hello"]["client-id"])
            if name in found:
                raise MessageError(f"nodes {found[name]} and {node} both say they run {name}: "
                                   f"give each SuperNode its own client-id")
            found[name] = node
            if "refused" in reply.content["hello"]:
                refused.append(str(reply.content["hello"]["refused"]))
        self.nodes = found
        self.strangers = {}
        if refused:
            raise PolicyError(f"{len(refused)} of {len(found)} nodes refused the run: "
                              + " | ".join(sorted(refused)))
        return dict(found)

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        """Send each client its request at once and wait up to ``timeout`` s for the replies:
        client id -> reply bytes, or None when none came in time or it came as an error (why:
        ``errors``). A client that :meth:`hello` did not find is an error."""
        self.rejoin(timeout)
        unknown = sorted(set(requests) - set(self.nodes))
        if unknown:
            raise MessageError(f"no Flower node runs {unknown} (known: {sorted(self.nodes)}): "
                               f"call hello first, with every SuperNode started")
        by_node = {self.nodes[c]: _pack(data) for c, data in requests.items()}
        replies = self._exchange(by_node, CALL, timeout)
        names = {node: c for c, node in self.nodes.items()}
        return {names[node]: None if reply is None else _unpack(reply.content)
                for node, reply in replies.items()}

    def rejoin(self, timeout: float) -> dict[str, int]:
        """Ask each node that connected since (not in the map, no stranger yet) which client it
        runs, with a fresh challenge, and move each client whose answer it signed for this run,
        this node and that challenge to its new node (:func:`.rejoin.check`; a restarted
        SuperNode); any other node becomes a stranger, with why. Returns the moves; nothing
        without a ``registry``."""
        if self.registry is None:
            return {}
        new = sorted(set(self.grid.get_node_ids()) - set(self.nodes.values())
                     - set(self.strangers))
        if not new:
            return {}
        from flwr.app import ConfigRecord, RecordDict

        from .rejoin import check

        challenges = {node: secrets.token_bytes(32) for node in new}
        answers = self._exchange({node: RecordDict({"hello": ConfigRecord({"challenge": c})})
                                  for node, c in challenges.items()}, HELLO, timeout)
        moved = {}
        for node, reply in answers.items():
            try:
                if reply is None:
                    raise MessageError(f"node {node} gave no hello: {self.errors.get(str(node))}")
                client = check(self.registry, self.nodes, str(self.grid.run.run_id), node,
                               challenges[node], dict(reply.content["hello"]))
            except MessageError as why:
                self.strangers[node] = str(why)
                continue
            self.nodes[client] = moved[client] = node
        return moved

    def _exchange(self, contents: dict[int, RecordDict], kind: str,
                  timeout: float) -> dict[int, Message | None]:
        """Push one message per node, pull until all replied or ``timeout`` s passed: node ->
        reply, or None (no reply, or an error reply: reason kept in ``errors``)."""
        from flwr.app import Message

        start = time.perf_counter()
        self._group += 1
        # A request lives as long as its phase waits (Flower's default is 12 h): a node that
        # comes back later never runs it, so its state cannot move past the server's round.
        messages = {node: Message(content, dst_node_id=node, message_type=kind,
                                  group_id=str(self._group), ttl=max(timeout, 1.0))
                    for node, content in contents.items()}
        traffic = Traffic(sent=sum(_size(c) for c in contents.values()))
        if self.count_wire:
            traffic.wire_sent = sum(wire_bytes(m) for m in messages.values())
        pushed = set(self.grid.push_messages(list(messages.values())))
        pending = {m.metadata.message_id: node for node, m in messages.items()
                   if m.metadata.message_id in pushed}
        names = {node: c for c, node in self.nodes.items()}
        replies: dict[int, Message | None] = dict.fromkeys(messages)
        for node in set(messages) - set(pending.values()):
            self.errors[names.get(node, str(node))] = "Flower did not accept the push"
        deadline = time.monotonic() + max(timeout, 0.0)
        sleep = self.pull_interval
        while pending:
            waiting = len(pending)
            for reply in self.grid.pull_messages(list(pending)):
                node = pending.pop(reply.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                if self.count_wire:
                    traffic.wire_received += wire_bytes(reply)
                if reply.has_error():
                    self.errors[names.get(node, str(node))] = _why(reply)
                else:
                    replies[node] = reply
                    traffic.received += _size(reply.content)
                    self.errors.pop(names.get(node, str(node)), None)
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                break
            # While replies come in, pull again soon: a pulled reply's request leaves the
            # SuperLink's store, which the simulation engine scans for every node each 0.1 s.
            sleep = self.pull_interval if len(pending) < waiting else min(
                sleep * PULL_GROWTH, max(PULL_MAX_S, self.pull_interval))
            time.sleep(min(sleep, left))
        for node, why in self._silent(list(pending.values()), timeout).items():
            self.errors[names.get(node, str(node))] = why
            _LOG.warning("%s gave no %s reply: %s", names.get(node, f"Flower node {node}"),
                         kind, why)  # in deployment, shown by flwr log / flwr run --stream
        traffic.seconds = time.perf_counter() - start
        self.last, self.total = traffic, self.total + traffic
        return replies

    def _silent(self, nodes: list[int], timeout: float) -> dict[int, str]:
        """Why each of ``nodes`` gave no reply within ``timeout`` s, as far as Flower says:
        whether the SuperLink still lists its SuperNode as connected."""
        if not nodes:
            return {}
        online = set(self.grid.get_node_ids())
        return {node: f"no reply within {timeout} s: " + (
            "the SuperLink lists it connected, so its ClientApp did not answer in time (a "
            "slow start on a busy host, or a handler still running: see that SuperNode's "
            "log, or raise --phase-timeout)" if node in online else
            "the SuperLink no longer lists it connected (its SuperNode stopped or lost the "
            "link)") for node in nodes}


def _why(reply: Message) -> str:
    """An error reply in one line: Flower's error code by name and the last line of its
    reason (NODE_UNAVAILABLE: the SuperLink saw the SuperNode go; CLIENT_APP_RAISED_EXCEPTION:
    our handler raised, its message follows)."""
    from flwr.common.constant import ErrorCode

    names = {code: name for name, code in vars(ErrorCode).items() if isinstance(code, int)}
    code = reply.error.code
    lines = [line.strip(" '>") for line in str(reply.error.reason or "").splitlines()]
    return (f"Flower error {names.get(code, 'code')} ({code}): "
            f"{next((x for x in reversed(lines) if x), 'no reason given')}")


# -- apps -------------------------------------------------------------------------------------


def make_client_app(serve: str | Serve, run_config: dict | None = None,
                    nodes: dict[str, dict] | None = None,
                    admit: str | Admit | None = None, warm: bool = False) -> ClientApp:
    """A ClientApp that answers ``query.hello`` with its client id and ``query.secureffm`` with
    ``serve(node_config, run_config, state, request) -> (state, reply)``; ``state`` is None on
    a node's first request, then what ``serve`` returned last, kept in ``context.state``.
    ``run_config`` updates the run's config (``run_simulation`` has none of its own);
    ``nodes``: client id -> more keys of that node's config, as ``--node-config`` gives a
    SuperNode (the simulation engine gives a node only its partition-id). ``admit``: called
    with (node config, run config) on hello; the SecureFFMError it raises is the node's
    refusal, sent back as the hello's ``refused``. ``warm``: in a deployment, ``serve`` and
    ``admit`` (``"module:function"``, imported only there) run in the node's warm process
    (:mod:`.warm`), unless the node config says ``warm = false``; this process then imports
    nothing of the node's."""
    _flwr()
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    from .warm import Warm, supernode_pid

    if warm and not all(isinstance(t, str) for t in (serve, admit or "")):
        raise ConfigError("a warm ClientApp names serve and admit as 'module:function'")
    for target in () if warm else (serve, admit):  # a wrong name fails here, not later
        if target is not None:
            resolve(target)
    extra, own = dict(run_config or {}), dict(nodes or {})
    app = ClientApp()

    def node_config(context) -> dict:
        given = dict(context.node_config)
        return {**given, **own.get(client_id(given), {})}

    def run_config(context) -> dict:
        return {**dict(context.run_config), **extra, RUN_KEY: str(context.run_id)}

    def warm_process(config: dict) -> Warm | None:
        """The node's warm process, or None to serve in this process."""
        supernode = (supernode_pid() if warm and str(config.get("warm")).lower() != "false"
                     else None)
        return None if supernode is None else Warm(serve, admit, supernode, config)

    def answered(header: dict) -> dict:
        if "error" in header:
            raise RuntimeError(f"the node's warm process raised {header['error']}")
        return header

    @app.query("hello")
    def hello(message, context):
        config = node_config(context)
        answer = {"client-id": client_id(config)}
        asked = message.content.get("hello")
        run = run_config(context)
        try:
            process = None if admit is None else warm_process(config)
            if process is not None:
                header, _ = process.call("admit", config, run, None, b"")
                if "refused" in answered(header):
                    raise SecureFFMError(header["refused"])
            elif admit is not None:
                resolve(admit)(config, run)
            if asked is not None and "challenge" in asked:  # a rejoin: signed (rejoin.py)
                from .rejoin import prove

                if not config.get("keys"):
                    raise ConfigError(f"{answer['client-id']} has no keys to sign its rejoin")
                answer["proof"] = prove(str(config["keys"]), answer["client-id"],
                                        str(context.run_id), context.node_id,
                                        bytes(asked["challenge"]))
        except SecureFFMError as refusal:
            answer["refused"] = str(refusal)
        return Message(RecordDict({"hello": ConfigRecord(answer)}), reply_to=message)

    @app.query("secureffm")
    def call(message, context):
        state = bytes(context.state[_STATE][_KEY]) if _STATE in context.state else None
        config, run = node_config(context), run_config(context)
        process = warm_process(config)
        if process is None:
            new_state, reply = resolve(serve)(config, run, state, _unpack(message.content))
        else:
            header, parts = process.call("serve", config, run, state, _unpack(message.content))
            answered(header)
            new_state, reply = parts
        if not isinstance(new_state, bytes) or not isinstance(reply, bytes):
            raise TypeError(f"serve must return (state: bytes, reply: bytes), got "
                            f"({type(new_state).__name__}, {type(reply).__name__})")
        context.state[_STATE] = ConfigRecord({_KEY: new_state})
        return Message(_pack(reply), reply_to=message)

    return app


def make_server_app(main: str | ServerMain, run_config: dict | None = None,
                    out: str | None = None, pull_interval: float = 0.01) -> ServerApp:
    """A ServerApp whose main calls ``main(FlowerCalls(grid), run_config)``: the run's config
    updated by ``run_config``. ``out``: a path where what ``main`` returns is written as JSON,
    ``{"result": ...}`` or ``{"error": "..."}`` if it raised (in deployment the ServerApp runs
    in a child process of the SuperLink)."""
    _flwr()
    from flwr.serverapp import ServerApp

    main_fn = resolve(main)
    extra = dict(run_config or {})
    app = ServerApp()

    @app.main()
    def run(grid, context):
        calls = FlowerCalls(grid, pull_interval)
        config = {**dict(context.run_config), **extra}
        if out is None:
            main_fn(calls, config)
            return
        try:
            outcome = {"result": main_fn(calls, config)}
        except Exception as error:  # noqa: BLE001 (reported to the launcher, then raised)
            outcome = {"error": f"{type(error).__name__}: {error}"}
            raise
        finally:
            Path(f"{out}.part").write_text(json.dumps(outcome))
            os.replace(f"{out}.part", out)

    return app


# -- launchers --------------------------------------------------------------------------------


def simulate(server_main: str | ServerMain, serve: str | Serve, clients: int,
             run_config: dict | None = None, backend_config: dict | None = None,
             pull_interval: float = 0.01, nodes: dict[str, dict] | None = None,
             admit: str | Admit | None = None, indexed: bool = True) -> Any:
    """Run ``server_main`` against ``clients`` simulated nodes serving ``serve`` on Flower's
    simulation engine in this process, and return what ``server_main`` returned (an exception
    it raised is raised here). ``nodes`` and ``admit``: each node's own config and its check of
    the run (:func:`make_client_app`).

    Needs Ray (``flwr[simulation]``) and costs about 15 to 20 s to start on a 2-core machine
    before the first call. The nodes are not processes: a pool of Ray actors runs every node's
    handler, so a node's state is only what ``serve`` returns; what ``serve`` keeps in module
    globals is shared by the nodes one actor runs, and may only be a cache keyed by that state
    (as runs/flower_node.py's is, by its sha256).
    ``backend_config``: Flower's, default one CPU per client actor and no GPU. Telemetry is off
    unless FLWR_TELEMETRY_ENABLED is set. The engine hands requests out asking only the nodes
    that have one waiting (:mod:`~secureffm.federation.engine_dispatch`; ``indexed=False``:
    Flower's own loop, for a benchmark's comparison).
    """
    _flwr()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.simulation import run_simulation

    main_fn, returned = resolve(server_main), []
    server = make_server_app(lambda calls, config: returned.append(main_fn(calls, config)),
                             run_config, pull_interval=pull_interval)
    with indexed_dispatch() if indexed else contextlib.nullcontext(False):
        run_simulation(server, make_client_app(serve, run_config, nodes, admit), clients,
                       backend_config=backend_config or {
                           "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return returned[0] if returned else None


class LocalDeployment:
    """Flower's deployment runtime on this host: ``flower-superlink`` and one SuperNode per
    client as OS processes (HTTP on 127.0.0.1, free ports, a private
    FLWR_HOME, telemetry and update checks off, no runtime dependency installation),
    and ``flwr run`` submitting a generated Flower App whose ServerApp runs ``server_main`` and
    whose ClientApp serves ``serve`` (both ``"module:function"``, importable by the child
    processes: they get this process's ``sys.path`` as PYTHONPATH).

    ``clients``: the client ids, one SuperNode each (its ``client-id``); ``node_config``:
    client id -> more keys of that node's config (a data path, a key path); ``admit``: the
    ClientApp's check of the run on hello (``"module:function"``); ``tls``: HTTPS with a
    fresh CA and SuperNode authentication on, each node's key registered with ``flwr supernode
    register`` (:mod:`~secureffm.federation.flower_tls`), else plain HTTP; ``node_auth``
    (with ``tls`` only; default: ``tls``): False keeps TLS but lets any node that trusts the CA
    register itself (for the test that plays an unregistered node); ``idle_poll``: each
    SuperNode is ``secureffm flower-supernode --idle-poll idle_poll``
    (:mod:`~secureffm.federation.supernode`), or Flower's own ``flower-supernode`` (its idle
    wait 3 s) with None. Use as a context
    manager: every process it started, and their children (SuperExecs, ServerApp and ClientApp
    processes), is ended on exit. Linux only (children are found in /proc).

        with LocalDeployment("pkg.mod:main", "pkg.mod:serve", ["client-1", "client-2"]) as dep:
            result = dep.run({"rounds": 3})
    """

    def __init__(self, server_main: str, serve: str, clients: list[str],
                 node_config: dict[str, dict] | None = None, home: str | None = None,
                 start_timeout: float = 120.0, pull_interval: float = 0.02,
                 admit: str | None = None, tls: bool = False, node_auth: bool | None = None,
                 idle_poll: float | None = DEFAULT_S):
        _flwr()
        node_auth = tls if node_auth is None else node_auth
        if node_auth and not tls:
            raise ConfigError("SuperNode authentication needs TLS: pass tls=True with it")
        for target in (server_main, serve, *([admit] if admit else [])):
            if not isinstance(target, str):
                raise ConfigError(f"a deployment names its functions as 'module:function' "
                                  f"strings, got {target!r}")
        self.server_main, self.serve, self.clients = server_main, serve, list(clients)
        self.admit, self.tls, self.node_auth = admit, tls, node_auth
        self.idle_poll = None if idle_poll is None else check_idle_poll(idle_poll)
        self._ca: Path | None = None  # the deployment's CA, with tls, once started
        self.node_config = dict(node_config or {})
        self.start_timeout, self.pull_interval = start_timeout, pull_interval
        self._own_home = home is None  # a folder made here is removed by close()
        self.home = Path(home or tempfile.mkdtemp(prefix="secureffm-flower-"))
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self._runs = 0
        bin_dir = Path(sys.executable).parent
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1",
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._bin = bin_dir

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the SuperLink, wait until it answers, then start one SuperNode per client
        (with ``tls``, each registered first)."""
        from .flower_tls import make_certificates

        link, link_security, ca = f"127.0.0.1:{self.port}", ["--insecure"], None
        if self.tls:
            certs = make_certificates(self.home / "certs", ["localhost", "127.0.0.1"])
            ca = self._ca = certs["ca"]
            link_security = ["--ssl-ca-certfile", str(ca), "--ssl-certfile", str(certs["cert"]),
                             "--ssl-keyfile", str(certs["key"])]
            link_security += ["--enable-supernode-auth"] if self.node_auth else []
        self._start("superlink", ["flower-superlink", *link_security,
                                  "--disable-runtime-dependency-installation",
                                  "--host", "127.0.0.1", "--port", str(self.port)])
        _wait_http(f"{'https' if ca else 'http'}://{link}/health", self.start_timeout,
                   self.home / "superlink.log", ca)
        security = f'root-certificates = "{ca}"' if ca else "insecure = true"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{link}"\n'
            f"{security}\n")
        for client in self.clients:
            self._start_node(client)

    def _flwr(self, *args: str) -> str:
        """Run the ``flwr`` command with ``args`` against this deployment; its output."""
        done = subprocess.run([str(self._bin / "flwr"), *args], env=self.env,
                              capture_output=True, text=True, cwd=self.home,
                              timeout=self.start_timeout)
        if done.returncode:
            raise ConfigError(f"flwr {args[0]} failed ({done.returncode}): "
                              f"{(done.stdout + done.stderr)[-2000:]}")
        return done.stdout

    def _start_node(self, client: str) -> None:
        """Start the SuperNode of ``client`` with its node config as ``node_config`` is now
        (with ``node_auth``, its authentication key made and registered on its first start)."""
        from .flower_tls import AUTH_KEY_FILE, AUTH_PUBLIC_FILE, make_node_auth_key

        key = None
        if self.node_auth:
            auth = self.home / f"auth-{client}"
            key = auth / AUTH_KEY_FILE
            if not key.exists():
                auth.mkdir()
                make_node_auth_key(auth)
                self._flwr("supernode", "register", str(auth / AUTH_PUBLIC_FILE), "local")
        self.start_node(client, key)

    def start_node(self, client: str, auth_key: Path | None = None) -> subprocess.Popen:
        """Start a SuperNode running ``client`` (its ``client-id``, its log
        ``FLWR_HOME/<client>.log``) with its node config as ``node_config`` is now, trusting the
        deployment's CA (with ``tls``) and signing its requests with ``auth_key`` (a private key
        of :func:`~secureffm.federation.flower_tls.make_node_auth_key`) when given; its process.
        The registered nodes start here; so does a test's node that nobody registered."""
        config = {**self.node_config.get(client, {}), "client-id": client}
        path = self.home / f"node-{client}.toml"
        _write_toml(path, config)
        security = ["--insecure"]
        if self._ca is not None:
            security = ["--root-certificates", str(self._ca)]
            security += ["--auth-supernode-private-key", str(auth_key)] if auth_key else []
        launcher = (["flower-supernode"] if self.idle_poll is None else
                    ["secureffm", "flower-supernode", "--idle-poll", str(self.idle_poll)])
        self._start(client, [*launcher, *security, "--superlink",
                             f"127.0.0.1:{self.port}", "--host", "127.0.0.1",
                             "--port", str(_free_port()), "--node-config", str(path)])
        return self.processes[client]

    def _start(self, name: str, command: list[str]) -> None:
        log = (self.home / f"{name}.log").open("a")
        self.processes[name] = subprocess.Popen(
            [str(self._bin / command[0]), *command[1:]], env=self.env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def submit(self, run_config: dict | None = None) -> Path:
        """Submit one run with ``flwr run``; returns the file its result will be written to."""
        self._runs += 1
        app = self.home / f"app-{self._runs}"
        out = self.home / f"result-{self._runs}.json"
        write_app(app, self.server_main, self.serve, dict(run_config or {}), out,
                  self.pull_interval, self.admit)
        self._flwr("run", str(app), "local")
        return out

    def wait(self, out: Path, timeout: float) -> Any:
        """What the run's ``server_main`` returned (read from ``out``), within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not out.exists():
            if time.monotonic() > deadline:
                raise ConfigError(f"the run wrote no result within {timeout} s; its ServerApp "
                                  f"log ends: {_tail(self.home / 'superlink.log')}")
            time.sleep(0.1)
        outcome = json.loads(out.read_text())
        if "error" in outcome:
            raise ConfigError(f"the ServerApp's main raised {outcome['error']}")
        return outcome["result"]

    def run(self, run_config: dict | None = None, timeout: float = 600.0) -> Any:
        """Submit one run and return what ``server_main`` returned."""
        return self.wait(self.submit(run_config), timeout)

    def kill(self, client: str) -> None:
        """SIGKILL the SuperNode of ``client`` and the processes it started."""
        process = self.processes[client]
        for pid in [*_descendants(process.pid), process.pid]:
            _signal(pid, signal.SIGKILL)
        process.wait()

    def restart(self, client: str) -> None:
        """Start ``client``'s SuperNode again after :meth:`kill`, with its node config as
        ``node_config`` holds it now: Flower sees a new node, which the server moves the
        client to on its signed hello (:meth:`FlowerCalls.rejoin`); with ``node_auth``, the
        same node (its registered key), which the SuperLink activates only once it lists the
        node offline (before, the SuperNode exits with Flower's code 305)."""
        self._start_node(client)

    def close(self) -> None:
        """End every process started here and their children (SIGTERM, then SIGKILL after 10
        s), and remove FLWR_HOME if it was made here (pass ``home`` to keep the logs)."""
        pids = [pid for p in self.processes.values() for pid in (*_descendants(p.pid), p.pid)]
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            for process in self.processes.values():
                process.poll()
            time.sleep(0.1)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        for process in self.processes.values():
            process.wait()
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)


def write_app(folder: Path, server_main: str, serve: str, run_config: dict,
              out: Path | None = None, pull_interval: float = 0.02,
              admit: str | None = None, warm: bool = True) -> None:
    """A Flower App folder for ``flwr run``: pyproject.toml (``run_config`` as its defaults)
    and two modules, a ServerApp running ``server_main`` (writing what it returns to ``out``
    when given) and a ClientApp serving ``serve`` (answering hello with ``admit``'s
    refusal, when given), in each node's warm process unless ``warm`` is False
    (:func:`make_client_app`)."""
    folder.mkdir(parents=True)
    _write_toml(folder / "pyproject.toml", {
        "project": {"name": "secureffm-flower-app", "version": "1.0.0",
                    "description": "generated by secureffm.federation.flower.write_app",
                    "license": "Apache-2.0", "dependencies": ["flwr>=1.42,<1.43"]},
        "tool": {"flwr": {"app": {
            "publisher": "secureffm",
            "components": {"serverapp": "secureffm_server_app:app",
                           "clientapp": "secureffm_client_app:app"},
            "config": run_config or {"secureffm": True}}}}})
    head = '"""Generated by secureffm.federation.flower.LocalDeployment."""\n\n'
    (folder / "secureffm_server_app.py").write_text(
        f"{head}from secureffm.federation.flower import make_server_app\n\n"
        f"app = make_server_app({server_main!r}, out={None if out is None else str(out)!r}, "
        f"pull_interval={pull_interval!r})\n")
    (folder / "secureffm_client_app.py").write_text(
        f"{head}from secureffm.federation.flower import make_client_app\n\n"
        f"app = make_client_app({serve!r}, admit={admit!r}, warm={warm!r})\n")


def _write_toml(path: Path, data: dict) -> None:
    import tomli_w

    path.write_bytes(tomli_w.dumps(data).encode())


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_http(url: str, seconds: float, log: Path, ca: Path | None = None) -> None:
    """Wait until ``url`` answers (over TLS trusting ``ca`` when given)."""
    context = None if ca is None else ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1, context=context):
                return
        except OSError:
            time.sleep(0.2)
    raise ConfigError(f"{url} did not answer within {seconds} s; its log ends: {_tail(log)}")


def _tail(path: Path, chars: int = 1500) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children first found in /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass
