"""Scale (issue 39): secure aggregation's CPU per round as the number of clients n grows, in
this process and on Flower's simulation engine.

    .venv/bin/python benchmarks/scale.py                            # every part (an hour or more)
    .venv/bin/python benchmarks/scale.py --flower 10,30,100 --big 0  # a shorter run
    .venv/bin/python benchmarks/scale.py --out docs/benchmarks.md   # also write the tables
    .venv/bin/python benchmarks/scale.py --smoke                    # seconds: a check only

Every round aggregates one d = ``--size`` float32 update per client (ones, ``engines._ones``),
with the model broadcast as FFM sends it (``engines._round``); CPU seconds are
``time.process_time`` of this process (user + system of all its threads), which a busy machine
inflates far less than wall time. Two tables, each measured in one run:

- In-process, n = ``--inprocess``: full ``secagg`` (every client masks with every other) against
  ``secagg-plus`` (neighbours from Bell et al.'s bound, protocols/neighbourhood.py), both against
  a malicious server: CPU per round after a warm-up round (which draws each client's batch of
  keys), its share per client, and full over SecAgg+; and the rebuild of n secrets from one
  holder set, one by one (before issue 39) against ``shamir.decode``. ``--big`` adds one
  SecAgg+ round at that n (per-client cost).
- On Flower's simulation engine (``secagg-plus``, n = ``--flower``, one ``run_simulation`` per
  n): the server process's CPU per round (the ServerApp, the in-memory SuperLink and the
  engine's dispatch threads: everything but the clients' Ray actors), after a warm-up round that
  pays the actors' start; its ratio to the smallest n's, beside n log n's and n^2's ratios.
  ``--flower-big``: one more round at that n on the engine.

Progress goes to stderr, the tables to stdout and, with ``--out``, between the
``<!-- scale:begin -->`` and ``<!-- scale:end -->`` markers of that file. ``--smoke``: n = 3 and
5 in-process, 3 on Flower, d = 100: it checks the script; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import engines  # a sibling, as `python benchmarks/scale.py` finds it

from secureffm.reporting import markdown_table, write_block

FULL, PLUS = "secagg", "secagg-plus"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _degree(n: int, protocol: str = PLUS) -> int:
    from secureffm.protocols import load_protocol

    return load_protocol(protocol).stages[0].group_size(n) - 1


def _cpu_round(channel, round_: int, d: int) -> float:
    start = time.process_time()
    engines._round(channel, round_, d)
    return time.process_time() - start


def inprocess(n: int, d: int, protocols: tuple[str, ...], folder: Path) -> dict[str, float]:
    """CPU seconds of one round per protocol at n clients, after an untimed warm-up round."""
    import torch

    from secureffm.federation.log import MessageLog
    from secureffm.federation.parties import new_clients
    from secureffm.protocols import load_protocol
    from secureffm.runs.scaffold import open_channel

    cpu = {}
    for name in protocols:
        log = MessageLog(folder / f"{name}-{n}" / "messages.jsonl")
        channel = open_channel(load_protocol(name), new_clients([torch.zeros(1, 1)] * n), log,
                               program=engines._ones)
        warm = _cpu_round(channel, 1, d)
        cpu[name] = _cpu_round(channel, 2, d)
        channel.close()
        _say(f"in-process {name}, n = {n}: warm-up {warm:.2f} s, round {cpu[name]:.2f} s CPU")
    return cpu


def shamir(n: int, threshold: float = 0.6) -> tuple[float, float]:
    """CPU seconds to rebuild n secrets (t = ceil(threshold n) of n shares each, every share
    checked) from the same n holders, as full secagg's server rebuilds every survivor's seed:
    one by one by interpolation (the path before issue 39, ``shamir._fit``) and by
    :func:`~secureffm.protocols.shamir.decode` (a check and Lagrange weights once per holder
    set)."""
    import secrets

    from secureffm.protocols import shamir as sh

    t = math.ceil(threshold * n)
    sets = [sh.split(secrets.randbelow(2**256), t, n) for _ in range(n)]
    start = time.process_time()
    slow = [sh._fit([(s.x, s.y) for s in shares], t)[0] for shares in sets]
    middle = time.process_time()
    fast = [sh.decode(shares, t).secret for shares in sets]
    end = time.process_time()
    assert slow == fast
    return middle - start, end - middle


def on_flower(n: int, d: int, folder: Path, protocol: str,
              indexed: bool = True) -> tuple[float, float]:
    """(server process CPU s, wall s) of one round of ``protocol`` (a name or a spec file) at
    n simulated nodes, after a warm-up round; ``indexed``: the engine asks only the nodes with
    a request waiting (``federation/engine_dispatch.py``), else Flower's own loop."""
    from secureffm.federation.flower import simulate
    from secureffm.federation.keyfiles import load_party_keys, load_registry, provision
    from secureffm.federation.log import MessageLog
    from secureffm.federation.message import SERVER
    from secureffm.federation.parties import ClientInfo, Party
    from secureffm.federation.remote import RemoteTransport
    from secureffm.protocols import load_protocol
    from secureffm.protocols.channel import ProtectedChannel

    keys = folder / f"keys-{n}"
    ids = [f"client-{i}" for i in range(1, n + 1)]
    if not keys.exists():
        provision(keys, ids)
    # Ray's actors import engines.bench_serve (pickled by reference): give them its folder.
    here = str(Path(engines.__file__).resolve().parent)
    if here not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here,
                                                                 os.environ.get("PYTHONPATH")]))

    def main(calls, run_config):
        calls.hello(600.0, clients=n)
        identity, sealing = load_party_keys(keys, SERVER)
        transport = RemoteTransport(load_registry(keys), tuple(ids),
                                    MessageLog(folder / f"flower-{n}-{indexed}" /
                                               "messages.jsonl"),
                                    calls, 3600.0)
        channel = ProtectedChannel(load_protocol(protocol), transport,
                                   Party(SERVER, identity=identity, sealing=sealing),
                                   [ClientInfo(c, 1) for c in ids], remote=True)
        warm = _cpu_round(channel, 1, d)
        wall = time.perf_counter()
        cpu = _cpu_round(channel, 2, d)
        channel.close()
        return warm, cpu, time.perf_counter() - wall

    warm, cpu, wall = simulate(main, engines.bench_serve, n, {"keys": str(keys),
                                                              "protocol": protocol},
                               pull_interval=engines.PULL_S, indexed=indexed)
    loop = "indexed" if indexed else "Flower's loop"
    _say(f"on Flower ({loop}), n = {n}: warm-up {warm:.2f} s, round {cpu:.2f} s server CPU, "
         f"{wall:.1f} s wall")
    return cpu, wall


def inprocess_table(n: int, cpu: dict[str, float], big: tuple[int, float] | None) -> str:
    rows = [[n, f"{name} ({_degree(n) if name == PLUS else n - 1} neighbours)",
             f"{cpu[name]:.2f}", f"{1000 * cpu[name] / n:.1f}"] for name in (FULL, PLUS)]
    if big:
        rows.append([big[0], f"{PLUS} ({_degree(big[0])} neighbours)", f"{big[1]:.2f}",
                     f"{1000 * big[1] / big[0]:.1f}"])
    ratio = f"full secagg / secagg-plus at n = {n}: {cpu[FULL] / cpu[PLUS]:.2f}x"
    return "\n".join([markdown_table(["n", "protocol", "CPU s / round",
                                      "CPU ms / round / client"], rows), "", ratio])


def flower_table(rows: list[tuple[int, float, float]], protocol: str,
                 loop: list[tuple[int, float, float]] | None = None) -> str:
    """One row per n: the server's CPU and wall per round, its growth beside n log n's and
    n^2's; with ``loop`` (the same n under Flower's own dispatch loop), those and the ratio."""
    n0, cpu0 = rows[0][0], rows[0][1]
    head = ["n", "neighbours", "server CPU s / round", "x smallest n", "n log n ratio",
            "n^2 ratio", "round wall s"]
    body = [[n, _degree(n, protocol), f"{cpu:.2f}", f"{cpu / cpu0:.1f}x",
             f"{n * math.log(n) / (n0 * math.log(n0)):.1f}x", f"{(n / n0) ** 2:.1f}x",
             f"{wall:.1f}"] for n, cpu, wall in rows]
    if loop:
        head += ["Flower's loop: CPU s", "its x smallest n", "its wall s", "its CPU over ours"]
        for row, (_, cpu, wall), (_, ours, _) in zip(body, loop, rows, strict=True):
            row += [f"{cpu:.2f}", f"{cpu / loop[0][1]:.1f}x", f"{wall:.1f}",
                    f"{cpu / ours:.1f}x"]
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--size", type=int, default=1000, help="parameters per update (d)")
    parser.add_argument("--inprocess", type=int, default=300,
                        help="n of the in-process table (0: none)")
    parser.add_argument("--flower", default="10,30,100,300", help="n on the simulation engine")
    parser.add_argument("--protocol", default=PLUS,
                        help="protocol (name or spec file) on the simulation engine")
    parser.add_argument("--big", type=int, default=1000,
                        help="n of one more SecAgg+ round in-process (0: none)")
    parser.add_argument("--flower-big", type=int, default=1000,
                        help="n of one more SecAgg+ round on the simulation engine (0: none)")
    parser.add_argument("--flower-loop", action="store_true",
                        help="also run each --flower n under Flower's own dispatch loop")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--smoke", action="store_true", help="n <= 5, d = 100: a check only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.inprocess, args.flower, args.big, args.flower_big = 100, 3, "3", 5, 5
    sizes = [int(n) for n in args.flower.split(",") if n]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rebuild = shamir(args.inprocess) if args.inprocess else None
        cpu = inprocess(args.inprocess, args.size, (FULL, PLUS), folder) if args.inprocess \
            else None
        big = (args.big, inprocess(args.big, args.size, (PLUS,), folder)[PLUS]) if args.big \
            else None
        flower = [(n, *on_flower(n, args.size, folder, args.protocol)) for n in sizes]
        loop = [(n, *on_flower(n, args.size, folder, args.protocol, indexed=False))
                for n in sizes] if args.flower_loop else None
        flower_big = on_flower(args.flower_big, args.size, folder, args.protocol) \
            if args.flower_big else None
    load = os.getloadavg()
    text = "\n".join([
        "### Secure aggregation as n grows",
        "",
        f"`python benchmarks/scale.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
        "on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} / "
        f"{load[2]:.1f} (1 / 15 min) at the end, d = {args.size}, adversary = \"malicious\"; "
        f"{time.perf_counter() - started:.0f} s in all.",
        *(["", "In-process, one round after a warm-up (every party in this process):", "",
           inprocess_table(args.inprocess, cpu, big), "",
           f"Rebuilding {args.inprocess} secrets from the same {args.inprocess} holders "
           f"(threshold {math.ceil(0.6 * args.inprocess)}, every share checked), as full "
           f"secagg's server does each round: {rebuild[0]:.2f} s CPU one by one by "
           f"interpolation (before issue 39), {rebuild[1]:.3f} s with the check and weights "
           f"once per holder set ({rebuild[0] / max(rebuild[1], 1e-9):.0f}x)."] if cpu else []),
        *(["", f"One `{PLUS}` round at n = {big[0]} in-process ({_degree(big[0])} neighbours): "
               f"{big[1]:.2f} s CPU, {1000 * big[1] / big[0]:.1f} ms a client."]
          if big and not cpu else []),
        "",
        *([f"On Flower's simulation engine, `{args.protocol}`, the server process's CPU for one "
           "round after a warm-up round (the engine asking only the nodes with a request "
           "waiting; with --flower-loop also under Flower's own loop, each n its own "
           "simulation):", "", flower_table(flower, args.protocol, loop)]
          if flower else []),
        *(["", f"One `{args.protocol}` round at n = {args.flower_big} on the simulation "
               f"engine: {flower_big[0]:.2f} s server CPU, {flower_big[1]:.1f} s wall."]
          if flower_big else [])])
    print(text)
    if args.out:
        write_block(args.out, "scale", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
