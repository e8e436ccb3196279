"""Many rounds of a small model: secure aggregation with keys agreed per round against keys
agreed once (``setup = "once"``), over the same rounds, as plaintext / secure time ratios.

    .venv/bin/python benchmarks/secagg_rounds.py                            # 100 rounds (a minute)
    .venv/bin/python benchmarks/secagg_rounds.py --out docs/benchmarks.md   # also write the table
    .venv/bin/python benchmarks/secagg_rounds.py --smoke                    # seconds: a check only

Each of ``--rounds`` rounds is one ``channel.aggregate`` call per protocol (n = ``--clients``
clients, d = ``--size`` float32 parameters, precomputed vectors, so model compute is excluded;
see benchmarks/secagg.py), the protocols taking turns round by round, so that all see the same
background load: plaintext, then the shipped ``secagg`` spec under each adversary (semi-honest,
malicious) and each set-up (per round, once). A ratio is a protocol's total time over the run
(the set-up of ``once`` included, in its first round) over plaintext's. Then cProfile over
``--profile-rounds`` further rounds of the malicious ``once`` variant lists the functions with
the most time of their own. Progress goes to stderr, the tables to stdout and, with ``--out``,
between the ``<!-- secagg-rounds:begin -->`` and ``<!-- secagg-rounds:end -->`` markers (or
those of ``--block``).
``--smoke`` runs 3 rounds of 3 clients at d = 100: the test suite runs it to check that the
script works; its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import re
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
from secagg import _Federation, _short, _vectors

from secureffm.reporting import markdown_table, write_block

VARIANTS = [(adversary, setup) for adversary in ("semi-honest", "malicious")
            for setup in ("per-round", "once")]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _spec(folder: Path, adversary: str, setup: str) -> str:
    """The shipped ``secagg`` spec with ``adversary`` and ``setup`` set, as a file."""
    text = (resources.files("secureffm.specs") / "protocols" / "secagg.toml").read_text()
    text = re.sub(r'^name = .*$', f'name = "secagg-{adversary}-{setup}"', text, flags=re.M)
    text = re.sub(r'^adversary = .*$', f'adversary = "{adversary}"', text, flags=re.M)
    path = folder / f"secagg-{adversary}-{setup}.toml"
    path.write_text(f'{text}setup = "{setup}"\n')  # the stage table is the file's last
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--size", type=int, default=10**4, help="parameters per update")
    parser.add_argument("--profile-rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=12, help="functions listed in the profile")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--block", default="secagg-rounds",
                        help="name of the marked block in --out (one per size you keep)")
    parser.add_argument("--smoke", action="store_true", help="3 rounds, 3 clients, d = 100")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.clients, args.size, args.profile_rounds = 3, 3, 100, 2
    root = Path(tempfile.mkdtemp(prefix="secagg-rounds-"))
    vectors = _vectors(args.clients, args.size)
    names = {"plaintext": "plaintext"} | {
        f"{a}, {s}": _spec(root, a, s) for a, s in VARIANTS}
    feds = {name: _Federation(root / str(i), spec, vectors)
            for i, (name, spec) in enumerate(names.items())}
    wall = {name: [] for name in feds}
    cpu = {name: [] for name in feds}
    start = time.perf_counter()
    for r in range(1, args.rounds + 1):
        for name, fed in feds.items():
            w, c = fed.round()
            wall[name].append(w)
            cpu[name].append(c)
        if r % max(1, args.rounds // 10) == 0:
            _say(f"round {r}/{args.rounds} ({time.perf_counter() - start:.0f} s)")
    base, base_cpu = sum(wall["plaintext"]), sum(cpu["plaintext"])
    rows = []
    for name in feds:
        first, rest = wall[name][0], wall[name][1:] or wall[name]
        rows.append([name, f"{1e3 * first:,.1f}", f"{1e3 * statistics.median(rest):,.2f}",
                     f"{sum(wall[name]):,.3g}", f"{sum(wall[name]) / base:.2f}x",
                     f"{sum(cpu[name]) / base_cpu:.2f}x"])
    table = markdown_table(["protocol (adversary, set-up)", "round 1 ms",
                            "median later round ms", f"{args.rounds} rounds s",
                            "/ plaintext (wall)", "/ plaintext (CPU)"], rows)

    _say(f"profile of {args.profile_rounds} rounds of the malicious once variant ...")
    fed = feds["malicious, once"]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.profile_rounds):
        fed.round()
    profile.disable()
    stats = pstats.Stats(profile).stats
    total = sum(s[2] for s in stats.values())
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:args.top]
    profile_table = markdown_table(
        ["function", "calls per round", "own ms per round", "share"],
        [[_short(func), f"{calls / args.profile_rounds:,.0f}",
          f"{1e3 * tt / args.profile_rounds:,.2f}", f"{100 * tt / total:.0f}%"]
         for func, (_, calls, tt, _, _) in ranked])
    for fed in feds.values():
        fed.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = "\n\n".join([
        f"### Many rounds of a small model: n = {args.clients}, d = {args.size:,}, "
        f"{args.rounds} rounds",
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, numpy {np.__version__}; 1-minute load average "
        f"{load:.1f} at the end; the protocols take turns round by round; the in-process "
        "transport (every party in this process, one after another).",
        table,
        f"Where the malicious once variant's time goes ({args.profile_rounds} rounds under "
        f"cProfile, {1e3 * total / args.profile_rounds:,.1f} ms per round with profiling):",
        profile_table])
    print(text)
    if args.out:
        write_block(args.out, args.block, text, title="# Benchmarks")


if __name__ == "__main__":
    main()
