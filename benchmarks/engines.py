"""Round time and bytes per round of the engines (issue 17): our protocols on the in-process
engine and on Flower's simulation engine, against Flower's own rounds (plain FedAvg and its
SecAgg+ workflow) on the same simulation engine.

    .venv/bin/python benchmarks/engines.py                            # n = 10, d in {1e5, 1e6}
    .venv/bin/python benchmarks/engines.py --out docs/benchmarks.md   # also write the table
    .venv/bin/python benchmarks/engines.py --smoke                    # n = 3, d = 10^3: a check

Needs ``secureffm[flower]`` (flwr with Ray). A round is what Flower's FedAvg does: the model
(d float32) to every client, every client's update (d float32 ones) aggregated. Rows:

- ``secureffm ..., in-process``: ``plaintext``, and secure aggregation semi-honest and against
  a malicious server, with every client masking with every other (Flower's ``num_shares`` =
  all) and in SecAgg+ groups of 3 (2 neighbours: ``num_shares`` = 3), every party in this
  process; bytes: the payload bytes the log records;
- ``secureffm ..., on Flower``: the same, each client a simulated Flower node with its own keys
  and saved state (``bench_serve``), one ``run_simulation`` per protocol; bytes: the request and
  reply frames ``FlowerCalls`` moved;

and, in one more ``run_simulation`` (bytes: Flower's serialized messages):

- ``plain FedAvg``: Flower's default fit workflow (FedAvg, every client each round);
- ``SecAgg+ ...``: Flower's ``SecAggPlusWorkflow`` with its client ``secaggplus_mod``, with
  ``num_shares`` = n (all) and = 3 (reconstruction threshold ceil(2 n / 3) and 2).

Each client's update is d float32 ones; a round is one call of the fit workflow, as timed by
the ServerApp. Round 1 of every row is a warm-up (it also pays Ray's actor start) and the only
one whose bytes are counted: Flower's serialized bytes of every message the ServerApp pushed
and pulled (``flower.wire_bytes``), so counting costs no timed round anything. The table gives
the median of the next ``--rounds`` rounds. Every row pulls every ``PULL_S`` seconds
(``InMemoryGrid.pull_interval``; Flower's default is 0.1 s), the interval ``FlowerCalls`` uses
by default, so our rows (added with the protocol) see the same floor. Flower's simulation engine
itself picks up new messages every 0.1 s (``vce_api.add_messages_to_queue``), so every
exchange costs up to 0.1 s more whatever the pull interval: SecAgg+ has four exchanges a round,
a plain FedAvg round one.

A second table times the engine's generic call alone: one ``FlowerCalls.call`` to 3 and to n
echoing nodes (``echo``), empty and 4 MB both ways, in a second simulation.

Progress goes to stderr, the tables to stdout and, with ``--out``, between the
``<!-- engines:begin -->`` and ``<!-- engines:end -->`` markers of that file. ``--smoke``: n = 3,
d = 10^3, one timed round, calls of 0 and 10^3 bytes; it checks the script, its numbers mean
nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from secureffm.reporting import markdown_table, write_block

CLIENTS = 10
SIZES = (10**5, 10**6)
PULL_S = 0.01  # seconds between pulls, every row


@dataclass
class Row:
    """One engine and protocol at (n, d): round seconds (timed rounds) and the bytes the
    server sent and received in one round."""

    n: int
    d: int
    variant: str
    seconds: list[float] = field(default_factory=list)
    sent: int = 0
    received: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def flower_variants(n: int) -> list[tuple[str, tuple[int, int] | None]]:
    """(label, (num_shares, reconstruction threshold) or None for plain FedAvg)."""
    every = (n, math.ceil(2 * n / 3))
    return [("Flower plain FedAvg", None),
            (f"Flower SecAgg+, num_shares = all ({every[0]}), threshold {every[1]}", every),
            ("Flower SecAgg+, num_shares = 3, threshold 2", (3, 2))]


class _Counted:
    """Counts Flower's wire bytes of what ``grid`` pushes and pulls while ``on``."""

    def __init__(self, grid):
        from secureffm.federation.flower import wire_bytes

        self.on, self.sent, self.received = False, 0, 0
        push, pull = grid.push_messages, grid.pull_messages

        def pushed(messages):
            messages = list(messages)
            ids = push(messages)
            if self.on:
                self.sent += sum(wire_bytes(m) for m in messages)
            return ids

        def pulled(ids):
            replies = list(pull(ids))
            if self.on:
                self.received += sum(wire_bytes(x) for x in replies)
            return replies

        grid.push_messages, grid.pull_messages = pushed, pulled

    def take(self) -> tuple[int, int]:
        counts, self.sent, self.received = (self.sent, self.received), 0, 0
        return counts


def _client_app():
    """Each client returns d float32 ones; SecAgg+ messages go through Flower's mod, the plain
    rounds' messages (no SecAgg+ configs) straight to the client."""
    import numpy as np
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    class Ones(NumPyClient):
        def fit(self, parameters, config):
            return [np.ones_like(parameters[0])], 1, {}

    def secagg_when_asked(message, context, call_next):
        if RECORD_KEY_CONFIGS in message.content.config_records:
            return secaggplus_mod(message, context, call_next)
        return call_next(message, context)

    return ClientApp(client_fn=lambda context: Ones().to_client(), mods=[secagg_when_asked])


def _server_app(rows: list[Row], rounds: int):
    """A ServerApp that runs every row in turn: 1 + ``rounds`` fit rounds each."""
    import numpy as np
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.default_workflows import default_fit_workflow

    app = ServerApp()

    @app.main()
    def main(grid, context: Context) -> None:
        grid.pull_interval = PULL_S
        counted = _Counted(grid)
        for row in rows:
            shares = dict(flower_variants(row.n))[row.variant]
            inner = (default_fit_workflow if shares is None else
                     SecAggPlusWorkflow(num_shares=shares[0],
                                        reconstruction_threshold=shares[1]))
            strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=row.n,
                              min_available_clients=row.n, initial_parameters=(
                                  ndarrays_to_parameters([np.zeros(row.d, np.float32)])))
            legacy = LegacyContext(context=context, strategy=strategy,
                                   config=ServerConfig(num_rounds=1 + rounds))
            warm = [True]

            def timed(grid, ctx, inner=inner, row=row, warm=warm):
                counted.on = warm[0]
                start = time.perf_counter()
                inner(grid, ctx)
                seconds = time.perf_counter() - start
                if warm[0]:
                    row.sent, row.received = counted.take()
                    counted.on = warm[0] = False
                else:
                    row.seconds.append(seconds)
                print(f"  {row.variant}, d = {row.d}: {seconds:.3f} s", file=sys.stderr)

            DefaultWorkflow(fit_workflow=timed)(grid, legacy)

    return app


def measure_flower(n: int, sizes: tuple[int, ...], rounds: int) -> list[Row]:
    """Flower's plain and SecAgg+ rounds at ``n`` clients for each d, one simulation."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.simulation import run_simulation

    rows = [Row(n, d, label) for d in sizes for label, _ in flower_variants(n)]
    run_simulation(_server_app(rows, rounds), _client_app(), n, backend_config={
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return rows


def echo(node_config: dict, run_config: dict, state: bytes | None,
         request: bytes) -> tuple[bytes, bytes]:
    """A node that answers each request with itself (the generic call's cost alone)."""
    return b"", request


def measure_calls(n: int, groups: tuple[int, ...], sizes: tuple[int, ...],
                  repeats: int) -> list[list]:
    """Seconds of one ``FlowerCalls.call`` (request and reply of each size, to the first k
    clients for k in ``groups``), median of ``repeats`` after one untimed call, in one
    simulation of ``n`` nodes: rows [k, size, median s, calls s]."""
    from secureffm.federation.flower import simulate

    def main(calls, run_config):
        clients = sorted(calls.hello(120.0, clients=n), key=lambda c: int(c.split("-")[1]))
        rows = []
        for k in groups:
            for size in sizes:
                requests = {c: os.urandom(size) for c in clients[:k]}
                seconds = []
                for _ in range(1 + repeats):
                    replies = calls.call(requests, 120.0)
                    assert replies == requests, calls.errors
                    seconds.append(calls.last.seconds)
                print(f"  call: {k} clients, {size} bytes: {seconds}", file=sys.stderr)
                rows.append([k, size, statistics.median(seconds[1:]), seconds[1:]])
        return rows

    return simulate(main, echo, n, pull_interval=PULL_S)


# -- our protocol, in-process and on Flower -------------------------------------------------------

def _spec(name: str, neighbours: int, adversary: str) -> str:
    return (f'name = "{name}"\ndescription = "benchmark"\n[[stages]]\nstage = "secagg"\n'
            f'protects = ["gradient"]\nthreshold = 0.6\nneighbours = {neighbours}\n'
            f'adversary = "{adversary}"\n')


def our_variants(folder: Path) -> list[tuple[str, str]]:
    """(label, protocol spec) of our rows, their specs written to ``folder``: everyone masks
    with everyone (Flower's num_shares = all), and SecAgg+ groups of 3 (2 neighbours: Flower's
    num_shares = 3), each semi-honest and against a malicious server."""
    rows = [("secureffm plaintext", "plaintext")]
    for neighbours, what in ((0, "secagg, all"), (2, "secagg+, groups of 3")):
        for adversary, who in (("semi-honest", "semi-honest"), ("malicious", "malicious server")):
            path = folder / f"secagg-{neighbours}-{adversary}.toml"
            path.write_text(_spec(path.stem, neighbours, adversary))
            rows.append((f"secureffm {what}, {who}", str(path)))
    return rows


def _ones(client, task):
    """Every client's update: d float32 ones (the rows of Flower's clients send the same). It
    forgets the model it was sent once it has computed, as FFM's clients do."""
    import numpy as np

    client.inbox.pop("global_model", None)
    return {"x": np.ones(int(task.args["d"]), np.float32)}


def _round(channel, round_: int, d: int) -> None:
    """One round as Flower's FedAvg runs it: the model (d float32) to every client, every
    client's update (d float32) aggregated; the model travels with the aggregation's first
    exchange, as FFM sends it."""
    import numpy as np

    from secureffm.federation.channel import Task

    ids = [c.id for c in channel.clients]
    result = channel.aggregate(round_, "gradient", Task("bench.ones", {"d": d}),
                               dict.fromkeys(ids, 1 / len(ids)),
                               {"x": ((d,), np.dtype(np.float32))},
                               broadcast={"global_model": {"theta": np.zeros(d, np.float32)}})
    assert result.payload is not None and len(result.included) == len(ids), result.reason


def _timed(row: Row, channel, rounds: int, traffic, first: int = 1) -> None:
    """1 + ``rounds`` rounds of ``channel``, numbered from ``first`` (a client refuses a
    round's messages twice: a later row on the same clients goes on numbering); bytes of the
    first (warm-up) one by ``traffic()`` (a (sent, received) reading before and after)."""
    for round_ in range(1 + rounds):
        before = traffic()
        start = time.perf_counter()
        _round(channel, first + round_, row.d)
        seconds = time.perf_counter() - start
        if round_ == 0:
            after = traffic()
            row.sent, row.received = after[0] - before[0], after[1] - before[1]
        else:
            row.seconds.append(seconds)
        print(f"  {row.variant}, d = {row.d}: {seconds:.3f} s", file=sys.stderr)


def measure_inprocess(n: int, sizes: tuple[int, ...], rounds: int, folder: Path) -> list[Row]:
    """Our rows on the in-process engine; bytes: the payload bytes the log records."""
    import json

    import torch

    from secureffm.federation.log import MessageLog
    from secureffm.federation.parties import new_clients
    from secureffm.protocols import load_protocol
    from secureffm.runs.scaffold import open_channel

    rows = []
    for d in sizes:
        for label, spec in our_variants(folder):
            row = Row(n, d, f"{label}, in-process")
            log = MessageLog(folder / f"{len(rows)}" / "messages.jsonl")
            channel = open_channel(load_protocol(spec), new_clients([torch.zeros(1, 1)] * n),
                                   log, program=_ones)

            def traffic(log=log) -> tuple[int, int]:
                log._file.flush()
                records = [json.loads(line) for line in log.path.read_text().splitlines()]
                return (sum(r["bytes"] for r in records if r["sender"] == "server"),
                        sum(r["bytes"] for r in records if r["recipient"] == "server"))

            _timed(row, channel, rounds, traffic)
            channel.close()
            rows.append(row)
    return rows


def _node(node_config: dict, run_config: dict, cid: str):
    """A benchmark client on its Flower node: its provisioned keys, no data, :func:`_ones`."""
    import torch

    from secureffm.federation.keyfiles import load_party_keys, load_registry
    from secureffm.federation.parties import Client, SecretStreams
    from secureffm.protocols import load_protocol
    from secureffm.protocols.endpoint import ClientEndpoint

    identity, sealing = load_party_keys(run_config["keys"], cid)
    streams = SecretStreams(cid)
    client = Client(cid, torch.zeros(1, 1), streams.torch("training"), identity=identity,
                    sealing=sealing, streams=streams, protocol_rng=streams.numpy("protocol"))
    return ClientEndpoint(client, load_registry(run_config["keys"]),
                          load_protocol(run_config["protocol"]), _ones)


def bench_serve(node_config: dict, run_config: dict, state: bytes | None,
                request: bytes) -> tuple[bytes, bytes]:
    from secureffm.runs.flower_node import answer

    return answer(node_config, run_config, state, request, _node)


def measure_ours_on_flower(n: int, sizes: tuple[int, ...], rounds: int,
                           folder: Path) -> list[Row]:
    """Our rows on Flower's simulation engine (one simulation per protocol: a node builds its
    protocol once); bytes: the request and reply frames ``FlowerCalls`` moved."""
    from secureffm.federation.flower import simulate
    from secureffm.federation.keyfiles import load_party_keys, load_registry, provision
    from secureffm.federation.log import MessageLog
    from secureffm.federation.message import SERVER
    from secureffm.federation.parties import ClientInfo, Party
    from secureffm.federation.remote import RemoteTransport
    from secureffm.protocols import load_protocol
    from secureffm.protocols.channel import ProtectedChannel

    keys = folder / "keys"
    ids = [f"client-{i}" for i in range(1, n + 1)]
    provision(keys, ids)
    rows: list[Row] = []
    for label, spec in our_variants(folder):
        def main(calls, run_config, label=label, spec=spec):
            calls.hello(300.0, clients=n)
            identity, sealing = load_party_keys(keys, SERVER)
            for d in sizes:
                row = Row(n, d, f"{label}, on Flower")
                log = MessageLog(folder / f"flower-{len(rows)}" / "messages.jsonl")
                transport = RemoteTransport(load_registry(keys), tuple(ids), log, calls, 600.0)
                channel = ProtectedChannel(load_protocol(spec), transport,
                                           Party(SERVER, identity=identity, sealing=sealing),
                                           [ClientInfo(c, 1) for c in ids], remote=True)
                _timed(row, channel, rounds, lambda: (calls.total.sent, calls.total.received),
                       first=1 + sizes.index(d) * (1 + rounds))
                channel.close()
                rows.append(row)

        simulate(main, bench_serve, n, {"keys": str(keys), "protocol": spec},
                 pull_interval=PULL_S)
    return rows


def calls_table(rows: list[list]) -> str:
    return markdown_table(
        ["clients called", "request = reply bytes", "call s (median)", "calls s"],
        [[k, f"{size:,}", f"{median:.3f}", ", ".join(f"{s:.3f}" for s in seconds)]
         for k, size, median, seconds in rows])


def _power(d: int) -> str:
    exponent = round(math.log10(d))
    return f"10^{exponent}" if 10**exponent == d else str(d)


def table(rows: list[Row]) -> str:
    """One markdown table: median round seconds, ratio to Flower's plain round at the same
    (n, d), and megabytes the server sent and received per round."""
    plain = {(r.n, r.d): r.median for r in rows if r.variant == "Flower plain FedAvg"}
    return markdown_table(
        ["n", "d", "engine and protocol", "round s (median)", "x Flower plain",
         "server sent MB / round", "server received MB / round", "timed rounds s"],
        [[r.n, _power(r.d), r.variant, f"{r.median:.3f}", f"{r.median / plain[(r.n, r.d)]:.1f}x",
          f"{r.sent / 1e6:.2f}", f"{r.received / 1e6:.2f}",
          ", ".join(f"{s:.2f}" for s in r.seconds)] for r in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per row")
    parser.add_argument("--out", type=Path, help="markdown file to write the table into")
    parser.add_argument("--smoke", action="store_true", help="n = 3, d = 10^3, 1 timed round")
    args = parser.parse_args(argv)
    n, sizes, rounds = (3, (10**3,), 1) if args.smoke else (CLIENTS, SIZES, args.rounds)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        rows = (measure_inprocess(n, sizes, rounds, Path(scratch))
                + measure_ours_on_flower(n, sizes, rounds, Path(scratch))
                + measure_flower(n, sizes, rounds))
    calls = measure_calls(n, (n,) if args.smoke else (3, n),
                          (0, 10**3) if args.smoke else (0, 4_000_000), rounds)
    text = "\n".join([
        f"### Round time and bytes per round by engine, n = {n}",
        "",
        f"`python benchmarks/engines.py{' --smoke' if args.smoke else ''}` on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end; one `run_simulation` per protocol of ours and "
        f"one for Flower's rows, pull interval {PULL_S} s for every row, median of {rounds} "
        f"timed round(s) after a warm-up round; "
        f"{time.perf_counter() - started:.0f} s in all.",
        "",
        table(rows),
        "",
        f"### One `FlowerCalls.call` on the simulation engine, {n} nodes",
        "",
        "Every node echoes its request (`engines.echo`); pull interval "
        f"{PULL_S} s; median of {rounds} call(s) after an untimed one.",
        "",
        calls_table(calls)])
    print(text)
    if args.out:
        write_block(args.out, "engines", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
