"""Seconds per round of a deployment (issue 39): FFM-GOT under ``dp-secagg`` with a SuperLink
and three SuperNodes as processes on this host (``LocalDeployment``), against the same run on
Flower's simulation engine and in-process, Flower's own cost per exchange, and where a deployed
exchange's time goes.

    .venv/bin/python benchmarks/deployment.py                        # 3 rounds, 10 echoes
    .venv/bin/python benchmarks/deployment.py --rounds 1 --echoes 2  # smaller
    .venv/bin/python benchmarks/deployment.py --cold --out docs/benchmarks.md

Needs ``secureffm[flower]`` (flwr with Ray). Rows, in one run:

- ``echo``: Flower's own cost per exchange, the floor: a deployment whose ClientApp returns its
  request (:func:`echo_serve`) and whose ServerApp times ``--echoes`` calls of 1 kB to every
  node, with Flower's own ``flower-supernode`` (idle wait 3 s) and the SuperExecs' task poll
  at Flower's default (1 s) and at POLL_S (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``), then with
  ``secureffm flower-supernode --idle-poll IDLE_POLL_S`` at POLL_S, as the GOT deployments run;
- ``GOT, deployed``: the run's ``seconds_per_round`` (training only: no start, no hello, no
  evaluation) on launched SuperNodes, with each node's client in its warm process
  (``secureffm.federation.warm``) and,
  with ``--cold``, rebuilt in every message's ClientApp process (node config ``warm = false``);
  the ServerApp's exchanges (``FlowerCalls.call``s) are counted;
- ``GOT, simulation engine``: the same config (``run_on_flower``); ``GOT, in-process``;

and the parts of one exchange measured outside Flower: a fresh interpreter importing Flower's
ClientApp runtime (and the module each message's ``flwr-clientapp`` process imports
first), and importing our node's module; one exchange of the run served by nodes in
this process, each rebuilt from its saved bytes for every message or kept between messages.

Progress goes to stderr, the tables to stdout and, with ``--out``, between the ``deployment``
markers of that file. Module-level imports are the standard library's only: the echo ClientApp
imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = Path(__file__).stem
CLIENTS = ["client-1", "client-2", "client-3"]
ECHO_BYTES = 1000
TIMEOUT_S = 300.0  # per exchange; a busy 2-core host starts a ClientApp in seconds
POLL_ENV, POLL_S = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", 0.05
IDLE_POLL_S = 0.1  # secureffm flower-supernode --idle-poll (its default)
ECHOES = [(None, None), (None, POLL_S), (IDLE_POLL_S, POLL_S)]  # (idle poll, SuperExec poll)


def echo_serve(node_config: dict, run_config: dict, state: bytes | None,
               request: bytes) -> tuple[bytes, bytes]:
    """The echo ClientApp's handler: no state, the request back."""
    return b"", request


def echo_main(calls, run_config: dict) -> list[float]:
    """The echo ServerApp: seconds of each of ``echoes`` calls of ECHO_BYTES to every node."""
    calls.hello(TIMEOUT_S, len(CLIENTS))
    seconds = []
    for _ in range(int(run_config["echoes"])):
        started = time.perf_counter()
        replies = calls.call(dict.fromkeys(CLIENTS, bytes(ECHO_BYTES)), TIMEOUT_S)
        seconds.append(time.perf_counter() - started)
        if any(reply is None for reply in replies.values()):
            raise RuntimeError(f"an echo went unanswered: {calls.errors}")
    return seconds


def counted_main(calls, run_config: dict) -> dict:
    """The run's ServerApp (``flower_server.main``), also returning the seconds of each
    exchange it made (``exchanges``)."""
    from secureffm.runs.flower_server import main

    seconds, call = [], calls.call

    def timed(requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        started = time.perf_counter()
        try:
            return call(requests, timeout)
        finally:
            seconds.append(time.perf_counter() - started)

    calls.call = timed
    return {**main(calls, run_config), "exchanges": seconds}


def config(out: Path, rounds: int):
    """The run every engine runs: GOT under dp-secagg, 3 clients, tiny models (the deployment
    test's sizes), a fixed noise multiplier (no calibration search)."""
    from secureffm.config import RunConfig

    return RunConfig(method="got", protocol="dp-secagg", clients=len(CLIENTS), partition="iid",
                     shard_size=64, batch_size=16, rounds=rounds, hidden=16,
                     potential_hidden=16, candidates=16, eval_samples=200, nfe=(1,),
                     trajectories=20, noise_multiplier=1.0, progress=False, device="cpu",
                     phase_timeout=TIMEOUT_S, out=str(out))


def node_configs(folder: Path, run) -> dict[str, dict]:
    """Each node's own config: the keys folder, its journal, a policy pinning ``run``."""
    from secureffm.runs.flower_policy import policy_of, write_policy

    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "policy.toml"
    write_policy(policy_of(run), policy)
    return {cid: {"client-id": cid, "keys": str(folder.parent / "keys"), "policy": str(policy),
                  "journal": str(folder / "journals" / f"{cid}.jsonl")} for cid in CLIENTS}


def deployed(folder: Path, name: str, server_main: str, serve: str, run_config: dict,
             timeout: float, idle_poll: float | None, poll: float | None = None,
             nodes: dict | None = None, admit: str | None = None):
    """What ``server_main`` returned from one run on a fresh deployment; ``idle_poll``: the
    SuperNodes' ``secureffm flower-supernode --idle-poll`` in s (None: Flower's own
    ``flower-supernode``); ``poll``: the SuperExecs' task poll interval in s (Flower's
    ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``; its default is 1 s)."""
    from secureffm.federation.flower import LocalDeployment

    before = os.environ.get(POLL_ENV)
    if poll is not None:
        os.environ[POLL_ENV] = str(poll)
    try:
        with LocalDeployment(server_main, serve, CLIENTS, node_config=nodes,
                             home=str(folder / name), start_timeout=TIMEOUT_S,
                             admit=admit, idle_poll=idle_poll) as deployment:
            return deployment.run(run_config, timeout=timeout)
    finally:
        os.environ.pop(POLL_ENV, None)
        if before is not None:
            os.environ[POLL_ENV] = before


def echo(folder: Path, echoes: int, idle_poll: float | None, poll: float | None) -> list[float]:
    return deployed(folder, f"echo-{idle_poll}-{poll}", f"{MODULE}:echo_main",
                    f"{MODULE}:echo_serve", {"echoes": echoes}, TIMEOUT_S * (echoes + 1),
                    idle_poll, poll)


def echo_name(idle_poll: float | None, poll: float | None) -> str:
    """An echo row's name: which SuperNode, which SuperExec poll."""
    node = ("Flower's flower-supernode" if idle_poll is None else
            f"secureffm flower-supernode --idle-poll {idle_poll}")
    return f"echo, {node}, SuperExec poll {f'{poll} s' if poll else '1 s (default)'}"


def got_deployed(folder: Path, rounds: int, warm: bool) -> dict:
    """The GOT run on launched SuperNodes (``--idle-poll IDLE_POLL_S``) whose SuperExecs poll
    every POLL_S; ``warm``: each node's
    client in its warm process (else rebuilt in every ClientApp process: ``warm = false``)."""
    from secureffm.runs.flower_node import run_config_of

    name = "warm" if warm else "cold"
    run = config(folder / f"deployed-{name}", rounds)
    nodes = {cid: {**node, "warm": warm}
             for cid, node in node_configs(folder / f"{name}-nodes", run).items()}
    return deployed(folder, f"got-{name}", f"{MODULE}:counted_main",
                    "secureffm.runs.flower_node:serve", run_config_of(run, folder / "keys"),
                    TIMEOUT_S * 20 * (rounds + 1), IDLE_POLL_S, POLL_S, nodes,
                    "secureffm.runs.flower_node:hello")


def import_seconds(module: str, repeats: int = 3) -> float:
    """Median wall seconds of a fresh interpreter importing ``module``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


class Loopback:
    """The server's calls served in this process by ``flower_node.serve``, each node's state
    kept between calls as a ClientApp's context keeps it; ``rebuild``: every message served by
    a client rebuilt from its node and its bytes. ``seconds``: of each call."""

    def __init__(self, run_config: dict, nodes: dict[str, dict], rebuild: bool):
        self.run_config, self.nodes, self.rebuild = run_config, nodes, rebuild
        self.state: dict[str, bytes] = {}
        self.seconds: list[float] = []

    def hello(self, timeout: float, clients: int = 0) -> dict[str, int]:
        return {cid: i for i, cid in enumerate(CLIENTS)}

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        from secureffm.runs import flower_node

        started, out = time.perf_counter(), {}
        for cid, frame in requests.items():
            if self.rebuild:
                flower_node._LAST.clear()
            self.state[cid], out[cid] = flower_node.serve(
                self.nodes[cid], self.run_config, self.state.get(cid), frame)
        self.seconds.append(time.perf_counter() - started)
        return out


def on_loopback(folder: Path, rounds: int, rebuild: bool) -> list[float]:
    """Seconds of each exchange of the run served by :class:`Loopback` nodes."""
    from secureffm.runs import flower_node
    from secureffm.runs.flower_server import main

    name = "rebuilt" if rebuild else "kept"
    run = config(folder / name, rounds)
    nodes = Loopback(flower_node.run_config_of(run, folder / "keys"),
                     node_configs(folder / f"{name}-nodes", run), rebuild)
    flower_node._LAST.clear()
    with contextlib.redirect_stdout(io.StringIO()):  # the ServerApp prints the run's pin
        main(nodes, nodes.run_config)
    flower_node._LAST.clear()
    return nodes.seconds


def simulated(folder: Path, rounds: int) -> dict:
    from secureffm.runs.flower_server import run_on_flower

    with contextlib.redirect_stdout(io.StringIO()):  # the ServerApp prints the run's pin
        return run_on_flower(config(folder / "simulated", rounds), folder / "keys").metrics


def in_process(folder: Path, rounds: int) -> dict:
    from secureffm.runs.ffm import run_ffm

    return run_ffm(config(folder / "inprocess", rounds)).metrics


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure(folder: Path, rounds: int, echoes: int, cold: bool) -> str:
    """Every row, in one run; the markdown text."""
    from secureffm.federation.keyfiles import provision
    from secureffm.reporting import markdown_table

    started, load = time.perf_counter(), os.getloadavg()[0]
    provision(folder / "keys", CLIENTS)
    floors = {}
    for idle_poll, poll in ECHOES:
        _say(echo_name(idle_poll, poll))
        floors[idle_poll, poll] = echo(folder, echoes, idle_poll, poll)
        _say(f"  {[round(s, 2) for s in floors[idle_poll, poll]]}")
    runs = {}
    for warm in (True, False) if cold else (True,):
        _say(f"GOT deployed, {'warm' if warm else 'cold'}")
        runs[warm] = got_deployed(folder, rounds, warm)
        _say(f"  {runs[warm]['metrics']['seconds_per_round']:.2f} s a round, exchanges "
             f"{[round(s, 2) for s in runs[warm]['exchanges']]}")
    _say("simulation engine")
    simulation = simulated(folder, rounds)["seconds_per_round"]
    _say("in-process")
    inprocess = in_process(folder, rounds)["seconds_per_round"]
    _say("the parts of an exchange")
    imports = {m: import_seconds(m) for m in ("flwr.supernode.cli", "flwr.clientapp",
                                              "secureffm.runs.flower_node")}
    rebuilt = on_loopback(folder, rounds, rebuild=True)
    kept = on_loopback(folder, rounds, rebuild=False)
    count = len(runs[True]["exchanges"])
    per_round = count / rounds
    floor = statistics.median(floors[IDLE_POLL_S, POLL_S])
    engines = [*[(f"GOT, deployed, {'warm process' if warm else 'rebuilt per message'}",
                  run["metrics"]["seconds_per_round"]) for warm, run in runs.items()],
               ("GOT, simulation engine", simulation), ("GOT, in-process", inprocess)]
    rows = [*[[echo_name(*key), "", f"{statistics.median(seconds):.2f}", "", ""]
              for key, seconds in floors.items()],
            *[[name, f"{seconds:.2f}", f"{seconds / per_round:.2f}",
               f"{seconds / simulation:.1f}x", f"{seconds / per_round / floor:.2f}x"]
              for name, seconds in engines]]
    parts = [["fresh interpreter importing `flwr.supernode.cli` (each message's `flwr-clientapp` "
              "process imports it first)", f"{imports['flwr.supernode.cli']:.2f}"],
             ["fresh interpreter importing `flwr.clientapp`", f"{imports['flwr.clientapp']:.2f}"],
             ["fresh interpreter importing `secureffm.runs.flower_node`",
              f"{imports['secureffm.runs.flower_node']:.2f}"],
             ["3 nodes each rebuilt from bytes for the message, in this process",
              f"{statistics.median(rebuilt):.3f}"],
             ["3 nodes kept between messages, in this process", f"{statistics.median(kept):.3f}"]]
    each = "; ".join(f"{echo_name(*key).removeprefix('echo, ')}: "
                     f"{', '.join(f'{s:.2f}' for s in seconds)} s"
                     for key, seconds in floors.items())
    return "\n".join([
        f"### A deployed round against the simulation engine, GOT under dp-secagg, "
        f"{len(CLIENTS)} clients",
        "",
        f"`python benchmarks/deployment.py --rounds {rounds} --echoes {echoes}"
        f"{' --cold' if cold else ''}` on {platform.machine()}, {os.cpu_count()} CPUs, load "
        f"average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end; "
        f"{time.perf_counter() - started:.0f} s in all. GOT: {count} exchanges in {rounds} "
        f"round(s) ({per_round:.1f} a round); an engine's seconds per exchange are its seconds "
        f"per round (training only) over that count; GOT deployments on `secureffm "
        f"flower-supernode --idle-poll {IDLE_POLL_S}` with SuperExec poll {POLL_S} s; the last "
        f"column over the echo on the same. Echo: median of {echoes} calls of {ECHO_BYTES} "
        f"bytes to each node ({each}).",
        "",
        markdown_table(["engine", "s / round", "s / exchange", "over simulation",
                        "exchange over echo"], rows),
        "",
        "Parts of one exchange (median seconds; a node rebuilt per message pays the imports in "
        "each message's process, then serves; the 3 nodes run in parallel there, in series "
        "here):",
        "",
        markdown_table(["part", "s"], parts)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="GOT rounds on every engine")
    parser.add_argument("--echoes", type=int, default=10, help="timed echo exchanges")
    parser.add_argument("--cold", action="store_true",
                        help="also the GOT deployment without warm processes (slow)")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="secureffm-deployment-") as scratch:
        text = measure(Path(scratch), args.rounds, args.echoes, args.cold)
    print(text)
    if args.out:
        from secureffm.reporting import write_block

        write_block(args.out, "deployment", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
