"""Audit speed: ``secureffm audit --verify`` in records per second against raw Ed25519
verifications per second (libsodium, which the audit uses, and cryptography) on the same log, in
the same process, on one core.

    .venv/bin/python benchmarks/audit.py                             # two 300-round runs (a minute)
    .venv/bin/python benchmarks/audit.py --log runs/got-dp-secagg-8gaussians-moons-s0
    .venv/bin/python benchmarks/audit.py --out docs/benchmarks.md    # also write the tables
    .venv/bin/python benchmarks/audit.py --smoke                     # seconds: a check only

Without ``--log`` the script first writes real logs: a GOT run under ``dp-secagg`` (the README's
main job with ``--rounds`` rounds and a 200-sample, NFE-1 evaluation), once without and once with
``--keep-payloads``; ``--log RUN_DIR`` audits a finished run folder instead (e.g. the README's
main job). An audit is one ``verify_run(RUN_DIR)`` call: read messages.jsonl and parties.json (and
payloads.bin), check every record and the protocol rules. It authenticates a record through its
signer's next record where that one holds its hash (``last``), verifying one signature at the
end of each such chain; ``verify_run(RUN_DIR, links=False)``, the audit before links, verifies
every record's signature, and is timed beside it. The raw rates are the floors of any
audit that checks each signature with libsodium (``crypto_sign_open(sig + message, key)``,
PyNaCl's binding, which :func:`~secureffm.federation.crypto.verify_signature` calls) or with
cryptography (``key.verify(sig, message)``, OpenSSL), over the log's own signatures, with every
key object built and every signed message (the record's canonical JSON) computed beforehand.
All are timed in CPU seconds of this process (``time.process_time``: user and system time, so
reading the files counts and waiting for a busy CPU does not), in a process pinned to one CPU
(``os.sched_setaffinity``) where the platform allows. Raw loops and audits alternate
``--repeats`` times; each rate is a median, the ratios are the audits' over the libsodium raw
rate. Then one audit runs under cProfile (its default wall-clock timer: a CPU timer
costs a system call per event, which inflated small functions more than load does): its table
lists the functions with the most time of their own, per record.

Progress goes to stderr, the tables (markdown) to stdout and, with ``--out``, between the
``<!-- audit:begin -->`` and ``<!-- audit:end -->`` markers of that file. ``--smoke`` writes two
3-round logs and times each once: the default test suite runs it to check that the script works;
its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cryptography
import nacl
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_sign_open

from secureffm.audit import verify_run
from secureffm.config import RunConfig
from secureffm.federation.log import canonical
from secureffm.federation.pin import load_parties
from secureffm.reporting import markdown_table, write_block
from secureffm.runs import run

__all__ = ["main"]

LOG_FILE = "messages.jsonl"
PROFILE_ROWS = 12


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def one_core() -> str:
    """Pin this process to one CPU where the platform allows; say which."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity here)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def wall_rate(run_dir: Path) -> float:
    """Records per wall-clock second of one ``verify_run`` (the threads' work overlaps)."""
    start = time.perf_counter()
    report = verify_run(run_dir)
    return report.records / (time.perf_counter() - start)


def cpus_table(run_dirs: dict[str, Path], cpus: set[int], repeats: int) -> str:
    """Audits of each named run folder pinned to one CPU and on all of ``cpus`` (the affinity
    the process started with), alternating, in records per wall second; "" where the platform
    cannot pin or only one CPU is there."""
    if not hasattr(os, "sched_setaffinity") or len(cpus) < 2:
        return ""
    rows = []
    for name, run_dir in run_dirs.items():
        one, every = [], []
        for _ in range(repeats):
            os.sched_setaffinity(0, {min(cpus)})
            one.append(wall_rate(run_dir))
            os.sched_setaffinity(0, cpus)
            every.append(wall_rate(run_dir))
        os.sched_setaffinity(0, {min(cpus)})
        rows.append([f"{name}, on {len(cpus)} CPUs", f"{statistics.median(one):,.0f}",
                     f"{statistics.median(every):,.0f}",
                     f"{statistics.median(every) / statistics.median(one):.2f}x"])
    return markdown_table(["log", "one CPU, records per wall second",
                           f"{len(cpus)} CPUs, records per wall second", "speed-up"], rows)


def write_log(folder: Path, rounds: int, keep_payloads: bool) -> Path:
    """A real run's folder: GOT under dp-secagg for ``rounds`` rounds, a tiny evaluation."""
    config = RunConfig(method="got", protocol="dp-secagg", rounds=rounds, eval_samples=200,
                       nfe=(1,), trajectories=10, out=str(folder), progress=False,
                       keep_payloads=keep_payloads, device="cpu")
    run(config)
    return folder


@dataclass
class Signed:
    """What the raw verification loops need from a log: per record the sender's raw 32-byte key
    and its cryptography key object, the signature and the signed message."""

    quads: list[tuple[bytes, Ed25519PublicKey, bytes, bytes]]

    @classmethod
    def of(cls, run_dir: Path) -> Signed:
        parties, _ = load_parties(run_dir / "parties.json")
        keys = {p: (k.sign, Ed25519PublicKey.from_public_bytes(k.sign))
                for p, k in parties.items()}
        with (run_dir / LOG_FILE).open("rb") as log:
            records = [json.loads(line) for line in log]
        return cls([(*keys[r["sender"]], bytes.fromhex(r["sig"]), canonical(r))
                    for r in records])

    def rate_libsodium(self) -> float:
        """Raw libsodium Ed25519 verifications per CPU second over the log's signatures."""
        start = time.process_time()
        for raw, _, sig, message in self.quads:
            crypto_sign_open(sig + message, raw)
        return len(self.quads) / (time.process_time() - start)

    def rate_cryptography(self) -> float:
        """Raw cryptography (OpenSSL) Ed25519 verifications per CPU second, same signatures."""
        start = time.process_time()
        for _, key, sig, message in self.quads:
            key.verify(sig, message)
        return len(self.quads) / (time.process_time() - start)


def audit_rate(run_dir: Path, links: bool = True) -> float:
    """Records per CPU second of one ``verify_run``; exits when the log does not verify."""
    start = time.process_time()
    report = verify_run(run_dir, links=links)
    seconds = time.process_time() - start
    if not report.ok:
        raise SystemExit(f"{run_dir}: the log does not verify: {report.first_bad}")
    return report.records / seconds


@dataclass
class Case:
    name: str
    run_dir: Path
    records: int = 0
    verified: int = 0  # records whose own signature the audit with links verified
    payloads: int = 0
    audit: tuple[float, ...] = ()
    audit_each: tuple[float, ...] = ()  # every signature verified (links=False)
    raw: tuple[float, ...] = ()  # libsodium
    raw_cryptography: tuple[float, ...] = ()

    def row(self) -> list[str]:
        audit, each = statistics.median(self.audit), statistics.median(self.audit_each)
        raw = statistics.median(self.raw)
        return [self.name, f"{self.records:,}", f"{self.verified:,}", f"{self.payloads:,}",
                f"{audit:,.0f}", f"{each:,.0f}", f"{raw:,.0f}",
                f"{statistics.median(self.raw_cryptography):,.0f}", f"{audit / raw:.2f}",
                f"{each / raw:.2f}", f"{audit / each:.2f}x", str(len(self.audit))]


def measure(case: Case, repeats: int) -> Case:
    """Alternate raw loops and both audits ``repeats`` times (an untimed audit first)."""
    signed = Signed.of(case.run_dir)
    report = verify_run(case.run_dir)
    case.records, case.payloads = report.records, report.payloads
    case.verified = report.records - report.linked
    audits, each, raws, raws_cryptography = [], [], [], []
    for i in range(repeats):
        raws.append(signed.rate_libsodium())
        raws_cryptography.append(signed.rate_cryptography())
        audits.append(audit_rate(case.run_dir))
        each.append(audit_rate(case.run_dir, links=False))
        _say(f"  {case.name} {i + 1}/{repeats}: audit {audits[-1]:,.0f} rec/s (every "
             f"signature: {each[-1]:,.0f}), raw {raws[-1]:,.0f} verif/s libsodium, "
             f"{raws_cryptography[-1]:,.0f} cryptography")
    case.audit, case.audit_each = tuple(audits), tuple(each)
    case.raw, case.raw_cryptography = tuple(raws), tuple(raws_cryptography)
    return case


def profile(run_dir: Path) -> str:
    """The functions with the most time of their own in one audit of ``run_dir``."""
    profiler = cProfile.Profile()
    profiler.enable()
    report = verify_run(run_dir)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:PROFILE_ROWS]
    table = [[_function(func), f"{calls:,}", f"{own * 1e6 / report.records:.1f}",
              f"{own / total:.0%}"] for func, (_, calls, own, _, _) in rows]
    return (f"One audit of {report.records:,} records under cProfile: {total:.2f} s in all, wall "
            "clock (profiling adds its own cost to each call, and a busy CPU to every function "
            "alike: compare shares).\n\n"
            + markdown_table(["function", "calls", "us per record (own)", "share"], table))


def _function(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":  # a built-in: "<method 'verify' of 'a.b.Key' objects>" -> Key.verify
        method = re.fullmatch(r"<method '(\w+)' of '(?:[\w.]*\.)?(\w+)' objects>", name)
        name = f"{method[2]}.{method[1]}" if method else name.strip("<>")
        return f"`{name.removeprefix('built-in method ')}`"
    parts = Path(path).parts
    where = "/".join(parts[parts.index("secureffm"):]) if "secureffm" in parts else parts[-1]
    return f"`{where}:{line}({name})`"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--log", type=Path, help="audit this run folder instead of writing logs")
    parser.add_argument("--rounds", type=int, default=300, help="rounds of each written run")
    parser.add_argument("--repeats", type=int, default=5, help="audits (and raw loops) per log")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--smoke", action="store_true",
                        help="3-round logs, one audit each: a check that the script works")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.repeats = 3, 1
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    pinned = one_core()
    with tempfile.TemporaryDirectory() as tmp:
        if args.log is not None:
            cases = [Case(str(args.log), args.log)]
        else:
            cases = []
            for keep in (False, True):
                name = (f"GOT, dp-secagg, {args.rounds} rounds, payloads "
                        f"{'kept' if keep else 'not kept'}")
                _say(f"writing the log of {name} ...")
                cases.append(Case(name, write_log(Path(tmp) / f"run-{keep}", args.rounds, keep)))
        for case in cases:
            _say(f"auditing {case.name} ...")
            measure(case, args.repeats)
        text = "\n".join([
            "### `audit --verify` against raw Ed25519 verification, one core",
            "",
            f"Python {platform.python_version()}, PyNaCl {nacl.__version__} (libsodium), "
            f"cryptography {cryptography.__version__}, {pinned}; CPU time; medians of "
            f"{args.repeats} alternating audits and raw loops; ratios against libsodium, which "
            "the audit uses. \"every signature\": the same audit with `links=False`, as "
            "before signed links.",
            "",
            markdown_table(["log", "records", "signatures verified (links)", "payloads checked",
                            "audit records/s", "every signature: records/s",
                            "raw verif/s, libsodium", "raw verif/s, cryptography",
                            "audit / raw", "every signature / raw", "links speed-up",
                            "repeats"],
                           [case.row() for case in cases]),
            "",
            *(["### The same audits on every CPU", "",
               "`verify_signatures` splits each batch's signature checks over threads when the "
               "process may use several CPUs (the payload and rule checks stay on one); "
               f"wall-clock medians of {args.repeats} alternating audits (a busy machine lowers "
               "the all-CPU column most).", "", table, ""]
              if (table := cpus_table({c.name: c.run_dir for c in cases}, cpus, args.repeats))
              else []),
            f"### Where an audit's time goes: {cases[-1].name}",
            "",
            profile(cases[-1].run_dir),
        ])
    print(text)
    if args.out:
        write_block(args.out, "audit", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
