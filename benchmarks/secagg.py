"""Secure aggregation overhead: round time, bytes on the wire, masking throughput and where
the time goes, for the in-process transport.

    .venv/bin/python benchmarks/secagg.py                            # every case (minutes)
    .venv/bin/python benchmarks/secagg.py --quick                    # skips d = 10^6 for n = 50
    .venv/bin/python benchmarks/secagg.py --out docs/benchmarks.md   # also write the tables
    .venv/bin/python benchmarks/secagg.py --smoke                    # seconds: a check only

A round is one ``channel.aggregate(round, "gradient", compute, weights, template)`` call (the
channel from ``open_channel``, over the in-process transport) in which
``compute`` returns a precomputed random float32 vector per client, so model compute is
excluded; the plaintext round is the same call under ``load_protocol("plaintext")``. Plaintext
and secure rounds alternate within one run, so both see the same background load; a ratio is
the secure median over the plaintext median. Progress goes to stderr, the tables (markdown) to
stdout and, with ``--out``, between the ``<!-- secagg:begin -->`` and ``<!-- secagg:end -->``
markers of that file (created with a ``# Benchmarks`` heading if absent; the rest is kept).
``--smoke`` runs every table at n in {2, 10} and d = 10^3 (the throughput, breakdown and profile
sections too) with one round per case: the default test suite runs it to check that the script
works; its numbers are not measurements.
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
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from secureffm.federation import SERVER, Client, MessageLog
from secureffm.federation.crypto import agree, new_key_pair
from secureffm.federation.message import serialize_payload
from secureffm.protocols import flatten, load_protocol
from secureffm.protocols.key_batch import KeyBatch
from secureffm.protocols.link import Link
from secureffm.protocols.masking import as_vector, mask_input, masked_payload
from secureffm.protocols.prg import add_masks, keystream_throughput, word_dtype
from secureffm.protocols.secagg import KEY_BATCH
from secureffm.protocols.secagg import MALICIOUS_PHASES as PHASES
from secureffm.reporting import markdown_table, write_block
from secureffm.runs.scaffold import open_channel

CLIENTS = (2, 10, 50)
SIZES = (10**4, 10**6)
MASKINGS = (("full", "secagg"), ("SecAgg+", "secagg-plus"))
KIND = "gradient"
# Masking work of a case: n * (degree + 1) * d mask words. Up to _LIGHT, secagg gets an
# untimed warm-up and --repeats rounds; up to _HEAVY, a warm-up and half as many rounds (the
# first round draws each client's batch of keys for KEY_BATCH rounds); above, one cold round.
# Plaintext always gets a warm-up and --repeats rounds (it is cheap).
_LIGHT, _HEAVY = 10**8, 10**9
# Which direction each phase travels (the server never sends and receives in one phase).
_DIRECTION = {"upload": "up", **{p: ("down" if p in ("keys", "shares", "consistency",
                                                      "unmask_request") else "up")
                                   for p in PHASES}}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _sci(d: int) -> str:
    return f"10^{len(str(d)) - 1}" if d and str(d).strip("0") == "1" else f"{d:,}"


# -- the federation under test --------------------------------------------------------------


def _clients(n: int) -> list[Client]:
    return [Client(f"client-{i:02d}", torch.zeros(1, 2), torch.Generator().manual_seed(i),
                   protocol_rng=np.random.default_rng(i)) for i in range(1, n + 1)]


def _vectors(n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"client-{i:02d}": (0.01 * rng.standard_normal(d, dtype=np.float32))
            for i in range(1, n + 1)}


class _Federation:
    """One channel with its own log under ``root`` and a round counter."""

    def __init__(self, root: Path, protocol: str, vectors: dict[str, np.ndarray]):
        self.protocol = load_protocol(protocol)
        self.log_path = root / Path(protocol).stem / "messages.jsonl"
        self.log = MessageLog(self.log_path)
        self.channel = open_channel(self.protocol, _clients(len(vectors)), self.log)
        self.vectors = vectors
        self.d = len(next(iter(vectors.values())))
        self.weights = {cid: 1.0 for cid in vectors}
        self.rounds = 0

    def round(self) -> tuple[float, float]:
        """Run one aggregation; its wall and CPU seconds (``time.process_time``: this process's
        user + system time, which other work on a busy machine inflates far less than wall
        time). Raises if a client was left out."""
        template = {KIND: ((self.d,), np.dtype(np.float32))}
        self.rounds += 1
        start, cpu = time.perf_counter(), time.process_time()
        result = self.channel.aggregate(self.rounds, KIND, lambda c: {KIND: self.vectors[c.id]},
                                        self.weights, template)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if result.payload is None or len(result.included) != len(self.vectors):
            raise RuntimeError(f"{self.protocol.name} round failed: {result.reason or result}")
        return elapsed, cpu

    def degree(self) -> int:
        """Neighbours per client (n - 1 for plaintext and the full graph)."""
        n = len(self.vectors)
        stages = self.protocol.stages
        return stages[0].group_size(n) - 1 if stages else n - 1

    def phase_bytes(self, round_: int) -> dict[str, int]:
        """Payload bytes per phase in ``round_``, from the log records (events excluded)."""
        out: dict[str, int] = defaultdict(int)
        every_round = 0
        with self.log_path.open() as lines:
            for line in lines:
                record = json.loads(line)
                if record["kind"] == KIND:
                    every_round += record["bytes"]
                if record["kind"] == KIND and record["round"] == round_:
                    phase = record["phase"]
                    if (record["sender"] == SERVER) != (_DIRECTION[phase] == "down"):
                        raise RuntimeError(f"phase {phase} was sent by {record['sender']}; "
                                           "update _DIRECTION")
                    out[phase] += record["bytes"]
        total = self.log.summary()["kinds"][KIND]["bytes"]
        if total != every_round:
            raise RuntimeError(f"{self.protocol.name}: log total {total} is not the records' "
                               f"{every_round}")
        return dict(out)

    def close(self) -> None:
        self.channel.close()


@dataclass
class CaseResult:
    n: int
    d: int
    masking: str
    degree: int
    plain_s: list[float] = field(default_factory=list)  # wall seconds
    secure_s: list[float] = field(default_factory=list)
    plain_cpu: list[float] = field(default_factory=list)  # CPU seconds
    secure_cpu: list[float] = field(default_factory=list)
    plain_bytes: dict[str, int] = field(default_factory=dict)
    secure_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return statistics.median(self.secure_s) / statistics.median(self.plain_s)

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.secure_cpu) / statistics.median(self.plain_cpu)


def _run_case(root: Path, n: int, d: int, masking: str, protocol: str,
              vectors: dict[str, np.ndarray], repeats: int) -> CaseResult:
    plain = _Federation(root / f"{n}-{d}-{protocol}", "plaintext", vectors)
    secure = _Federation(root / f"{n}-{d}-{protocol}", protocol, vectors)
    degree = secure.degree()
    work = n * (degree + 1) * d
    secure_repeats = 1 if work > _HEAVY else max(1, repeats // 2) if work > _LIGHT else repeats
    plain.round()  # warm-up: plaintext rounds are cheap, so always
    if work <= _HEAVY:
        secure.round()
    result = CaseResult(n, d, masking, degree)
    for i in range(max(repeats, secure_repeats)):  # alternate: both see the same load
        wall, cpu = plain.round()
        result.plain_s.append(wall)
        result.plain_cpu.append(cpu)
        if i < secure_repeats:
            wall, cpu = secure.round()
            result.secure_s.append(wall)
            result.secure_cpu.append(cpu)
    result.plain_bytes = plain.phase_bytes(plain.rounds)
    result.secure_bytes = secure.phase_bytes(secure.rounds)
    plain.close()
    secure.close()
    return result


# -- tables ---------------------------------------------------------------------------------


def _graph_note(r: CaseResult) -> str:
    peers = f"{r.degree} neighbour{'s' if r.degree != 1 else ''}"
    if r.masking == "full":
        return f"full graph ({peers})"
    if r.degree == r.n - 1:
        return f"SecAgg+, = full graph at n = {r.n} ({peers})"
    return f"SecAgg+, Bell et al.'s k ({peers})"


def _roundmarkdown_table(results: list[CaseResult]) -> str:
    def ms(times: list[float]) -> str:
        spread = f" ({1e3 * min(times):,.1f}-{1e3 * max(times):,.1f})" if len(times) > 1 else ""
        return f"{1e3 * statistics.median(times):,.1f}{spread}"

    rows = [[r.n, _sci(r.d), _graph_note(r), ms(r.plain_s), ms(r.secure_s), f"**{r.ratio:.2f}x**",
             f"**{r.cpu_ratio:.2f}x**", f"{len(r.plain_s)} / {len(r.secure_s)}"]
            for r in results]
    return markdown_table(["n", "d", "masking", "plaintext ms (min-max)", "secagg ms (min-max)",
                   "ratio of medians (wall)", "ratio of medians (CPU time)",
                   "rounds plaintext / secagg"], rows)


def _bytesmarkdown_table(results: list[CaseResult]) -> str:
    rows = []
    for r in results:
        up = sum(b for p, b in r.secure_bytes.items() if _DIRECTION[p] == "up") / r.n
        down = sum(b for p, b in r.secure_bytes.items() if _DIRECTION[p] == "down") / r.n
        masked = r.secure_bytes["masked_input"] / r.n
        keys = up + down - masked
        plain_up = r.plain_bytes["upload"] / r.n
        rows.append([r.n, _sci(r.d), _graph_note(r), f"{plain_up:,.0f}", f"{up:,.0f}",
                     f"{down:,.0f}", f"{masked / r.d:.4f}", f"{keys:,.0f}",
                     f"{(up + down) / plain_up:.3f}x"])
    return markdown_table(["n", "d", "masking", "plaintext up", "secagg up", "secagg down",
                   "masked input B/param", "keys + shares + unmask (up+down)",
                   "secagg (up+down) / plaintext up"], rows)


def _phasemarkdown_table(results: list[CaseResult]) -> str:
    rows = []
    for r in results:
        rows.append([r.n, _sci(r.d), _graph_note(r)]
                    + [f"{r.secure_bytes.get(p, 0) / r.n:,.0f}" for p in PHASES])
    return markdown_table(["n", "d", "masking"] + [f"{p} ({_DIRECTION[p]})" for p in PHASES], rows)


# -- the malicious-server variant against the semi-honest one ------------------------------


def _key_batch_seconds(fed: _Federation) -> float:
    """Seconds one client takes to draw and sign its keys for KEY_BATCH rounds (median of 3)."""
    client, stage = _clients(1)[0], fed.protocol.stages[0]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        KeyBatch.new(client, KIND, 1, KEY_BATCH, stage.advertised)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _adversaries(root: Path, quick: bool, repeats: int, clients: tuple[int, ...] = CLIENTS,
                 sizes: tuple[int, ...] = SIZES) -> str:
    """Round time and bytes of ``secagg`` (malicious-server variant: keys signed in batches,
    announced graph, consistency round) and of the same spec with ``adversary =
    "semi-honest"``, each over a plaintext round, rounds alternating after one warm-up round
    each; n in ``clients[1:]`` ({10, 50}), d in ``sizes`` ({10^4, 10^6}); n = 50, d = 10^6
    skipped with --quick. The malicious warm-up round draws each client's keys for KEY_BATCH
    rounds, so the timed rounds take theirs from the batch: the cost of drawing and signing n
    batches (timed here, :func:`_key_batch_seconds`), spread over KEY_BATCH rounds, is added
    to the malicious round."""
    spec = root / "secagg-semi-honest.toml"
    shipped = (Path(__file__).resolve().parents[1] / "protocols" / "secagg.toml").read_text()
    spec.write_text(shipped.replace('adversary = "malicious"', 'adversary = "semi-honest"'))
    rows = []
    for n in clients[1:]:
        for d in sizes:
            if quick and n == 50 and d == 10**6:
                continue
            _say(f"adversary variants n={n} d={_sci(d)} ...")
            vectors = _vectors(n, d)
            feds = {"plain": _Federation(root / f"adv-{n}-{d}", "plaintext", vectors),
                    "semi": _Federation(root / f"adv-{n}-{d}", str(spec), vectors),
                    "mal": _Federation(root / f"adv-{n}-{d}", "secagg", vectors)}
            count = 1 if n * n * d > 10**8 else repeats
            times: dict[str, list[float]] = {name: [] for name in feds}
            cpu: dict[str, list[float]] = {name: [] for name in feds}
            for fed in feds.values():  # warm-up
                fed.round()
            for _ in range(count):
                for name, fed in feds.items():
                    wall, seconds = fed.round()
                    times[name].append(wall)
                    cpu[name].append(seconds)
            sent = {name: sum(fed.phase_bytes(fed.rounds).values()) / n
                    for name, fed in feds.items()}
            for fed in feds.values():
                fed.close()
            median = {k: statistics.median(v) for k, v in times.items()}
            mcpu = {k: statistics.median(v) for k, v in cpu.items()}
            batch = n * _key_batch_seconds(feds["mal"]) / KEY_BATCH
            median["mal"] += batch
            mcpu["mal"] += batch

            def ratio(a: str, b: str, median=median, mcpu=mcpu) -> str:
                return f"**{median[a] / median[b]:.2f}x** ({mcpu[a] / mcpu[b]:.2f}x)"

            rows.append([n, _sci(d), f"{1e3 * median['plain']:,.1f}",
                         f"{1e3 * median['semi']:,.1f}", ratio("semi", "plain"),
                         f"{1e3 * median['mal']:,.1f}", f"{1e3 * batch:.2f}",
                         ratio("mal", "plain"),
                         ratio("mal", "semi"), f"{sent['semi']:,.0f}",
                         f"{sent['mal']:,.0f}", f"{sent['mal'] / sent['semi']:.4f}x", count])
    return markdown_table(["n", "d", "plaintext ms", "semi-honest ms",
                   "semi-honest / plaintext, wall (CPU time)",
                   "malicious ms (key batch spread in)", "of which key batch ms",
                   "malicious / plaintext, wall (CPU time)",
                   "malicious / semi-honest, wall (CPU time)", "semi-honest B/client",
                   "malicious B/client", "bytes ratio", "rounds each"], rows)


# -- masking throughput ---------------------------------------------------------------------


def _throughput(d: int, repeats: int) -> str:
    """Raw AES-128-CTR keystream against adding one mask and one client's whole masking step,
    in CPU time (``time.process_time``: on a busy machine wall time also counts the time other
    processes hold the core). Every repeat times each item once, back to back; each item's
    time is its best over the repeats, and a fraction of raw is a ratio of bests.

    The masking step is timed two ways on the same input: *unfused*, the functions one after
    another as the client called them before the fused pass (``flatten``, ``quantize_into``,
    ``add_masks``, ``reduce``, ``serialize_payload``: one pass over the whole vector each,
    with today's kernels), and *fused*, what ``SecAggStage``'s client runs now
    (``as_vector`` and ``masked_payload``: quantize and mask chunk by chunk into the payload's
    bytes); both draw k pair seeds with ``agree`` and yield the same payload bytes.

    The *ceiling* rows add the step's parts that are not masking (its ``agree`` calls and its
    quantization, each timed alone) to the raw keystream of its k + 1 masks: the fraction of
    raw that a step with free adds, copies and headers would reach. The ChaCha20 row times the
    masks' cipher until 2026-11-27, the reference of issue 18's 0.7 target when it was set."""
    quantizer = load_protocol("secagg").stages[0].quantizer
    wire = word_dtype(quantizer.bits)
    x = {KIND: 0.01 * np.random.default_rng(0).standard_normal(d, dtype=np.float32)}
    template = {KIND: ((d,), np.dtype(np.float32))}
    seed = bytes(range(32))
    y = np.zeros(d, dtype=wire)
    mine, peer = new_key_pair(), new_key_pair()

    def seeds(k: int) -> tuple[list[bytes], list[bytes]]:
        pairs = [agree(mine.private, peer.public, b"mask-seed") for _ in range(k)]
        return [seed] + pairs[: (k + 1) // 2], pairs[(k + 1) // 2:]

    def unfused_step(k: int) -> bytes:  # the client's masked_input before the fused pass
        flat = flatten(x, template, np.float32)
        y = np.empty(d, dtype=wire)
        quantizer.quantize_into(flat, y, np.random.default_rng(1), 1.0)
        add_masks(y, *seeds(k))
        return serialize_payload({"y": quantizer.reduce(y)})

    def fused_step(k: int) -> bytes:  # what SecAggStage's client runs now
        return masked_payload(as_vector(x, template), quantizer, np.random.default_rng(1), 1.0,
                              *seeds(k))[0]

    if unfused_step(1) != fused_step(1):
        raise RuntimeError("the fused and unfused masking steps give different payloads")

    def timed(fn: Callable[[], object]) -> float:
        start = time.process_time()
        fn()
        return time.process_time() - start

    steps = (8, 9, 49)
    mb = d * wire.itemsize / 1e6  # keystream MB per mask vector
    raw, one, quant, fused_quant, pair = [], [], [], [], []
    step: dict[tuple[str, int], list[float]] = {(how, k): [] for k in steps
                                                for how in ("unfused", "fused")}
    rng = np.random.default_rng(0)
    zeros, chacha = bytearray(d * wire.itemsize), []  # the masks' cipher until 2026-11-27
    sink = bytearray(len(zeros))
    for _ in range(repeats):
        raw.append(d * wire.itemsize / keystream_throughput(d * wire.itemsize, 1,
                                                            time.process_time))
        stream = Cipher(algorithms.ChaCha20(seed, seed[:16]), None).encryptor()
        chacha.append(timed(lambda s=stream: s.update_into(zeros, sink)))
        one.append(timed(lambda: add_masks(y, [seed])))
        quant.append(timed(lambda: quantizer.quantize_into(x[KIND], y, rng, 1.0)))
        fused_quant.append(timed(lambda: mask_input(x[KIND], quantizer, rng, 1.0, out=y)))
        pair.append(timed(lambda: agree(mine.private, peer.public, b"mask-seed")))
        for k in steps:
            step["unfused", k].append(timed(lambda k=k: unfused_step(k)))
            step["fused", k].append(timed(lambda k=k: fused_step(k)))
    best = min
    api = keystream_throughput(clock=time.process_time) / 1e6
    rows = [[f"raw AES-128-CTR keystream, {mb:g} MB (one mask of {_sci(d)} {wire} words) into a "
             f"preallocated buffer (`keystream_throughput({wire.itemsize} * d, 1, "
             "time.process_time)`)",
             f"{1e3 * best(raw):.2f}", f"{mb / best(raw):,.0f}", "1.00"],
            ["raw AES-128-CTR, `keystream_throughput()` defaults (64 MiB, best of 3, CPU time), "
             "once", "", f"{api:,.0f}", ""],
            [f"raw ChaCha20 keystream, {mb:g} MB (the masks' cipher when issue 18 set its "
             "0.7 target)", f"{1e3 * best(chacha):.2f}", f"{mb / best(chacha):,.0f}",
             f"{best(raw) / best(chacha):.2f}"],
            [f"`add_masks(y, [seed])`: one mask added in place, {_sci(d)} words",
             f"{1e3 * best(one):.2f}", f"{mb / best(one):,.0f}", f"{best(raw) / best(one):.2f}"],
            [f"`quantize_into(x, y, rng, 1.0)`, {_sci(d)} float32 (its own rounding stream "
             "included)", f"{1e3 * best(quant):.2f}", "", ""],
            ["`mask_input(x, quantizer, rng, 1.0, out=y)` with no masks: the same quantization "
             "in the fused loop", f"{1e3 * best(fused_quant):.2f}", "", ""],
            ["`agree` (X25519 + HKDF) for one pair seed", f"{1e3 * best(pair):.3f}", "", ""]]
    for k in steps:
        for how, what in (("unfused", "`flatten`, `quantize_into`, `add_masks` of k + 1 masks, "
                                      "`reduce`, `serialize_payload`"),
                          ("fused", "`as_vector`, `masked_payload` of k + 1 masks")):
            t = best(step[how, k])
            rows.append([f"one client's masking step, k = {k} pairwise masks, {how} "
                         f"(k x `agree`, {what})", f"{1e3 * t:,.1f}",
                         f"{(k + 1) * mb / t:,.0f}", f"{(k + 1) * best(raw) / t:.2f}"])
        # What no faster add, copy or header can beat: the step's parts that are not masking.
        for what, t in (("k x `agree` + `quantize_into`", k * best(pair) + best(quant)),
                        ("`quantize_into` alone (keys agreed once)", best(quant))):
            t += (k + 1) * best(raw)
            rows.append([f"ceiling, k = {k}: k + 1 raw keystreams + {what}, adds and copies "
                         "free", f"{1e3 * t:,.1f}", f"{(k + 1) * mb / t:,.0f}",
                         f"{(k + 1) * best(raw) / t:.2f}"])
    return markdown_table(["what", f"CPU ms (best of {repeats})", "MB/s of mask keystream",
                   "fraction of raw (ratio of bests)"], rows)


# -- where the time goes --------------------------------------------------------------------

# (bucket, test on (file, function name)); the first that matches takes the function's own time.
_BUCKETS: list[tuple[str, Callable[[str, str], bool]]] = [
    ("AES-128-CTR keystream (`update_into`: masks, unmasking, rounding stream)",
     lambda f, fn: "update_into" in fn),
    ("`MaskStreams.add_into` own time (in-place add or subtract of each keystream chunk)",
     lambda f, fn: f.endswith("prg.py")),
    ("dtype casts (`astype`: dequantize, unflatten, flatten)", lambda f, fn: "astype" in fn),
    ("quantization (`Rounding.chunk`: scale, clip check, fixed-point map, stochastic "
     "rounding; dequantize)", lambda f, fn: f.endswith("quantize.py") or "_clip" in fn),
    ("fused mask loop and wire bytes (`mask_input`, `masked_payload`'s one copy, "
     "`unmask_sum`'s additions of the inputs)", lambda f, fn: f.endswith("masking.py")),
    ("sha256 (each payload by its sender and on receipt, log chain)",
     lambda f, fn: "sha256" in fn or "hexdigest" in fn),
    ("Ed25519 sign (each sender signs its envelope or event)",
     lambda f, fn: ("ed25519" in fn and "sign" in fn) or (f.endswith("crypto.py")
                                                           and fn == "sign")),
    ("Ed25519 verify (on receipt)", lambda f, fn: ("ed25519" in fn and "verify" in fn)
     or "crypto_sign_open" in fn or (f.endswith("crypto.py") and fn == "verify_signature")),
    ("safetensors (de)serialization", lambda f, fn: "safetensors" in f + fn),
    ("AES-GCM seal / open of the relayed shares",
     lambda f, fn: "aead" in f + fn or (f.endswith("crypto.py") and fn in ("seal", "open_sealed"))),
    ("Shamir split / reconstruct (Python integers)", lambda f, fn: f.endswith("shamir.py")),
    ("X25519 + HKDF (`agree` per pair, fresh key pairs)",
     lambda f, fn: any(s in f + fn for s in ("x25519", "hkdf", "HKDF", "crypto.py", "derive"))),
    ("log records (JSON, file writes)",
     lambda f, fn: f.endswith("log.py") or "json" in f or "write" in fn),
    ("`flatten` / `check_payload` / `unflatten`", lambda f, fn: f.endswith("aggregation.py")),
    ("`SecAggStage.aggregate` own time (phases, loops, summing masked inputs)",
     lambda f, fn: "protocols/secagg/" in f),
]


def _bucket(func: tuple, stats: dict, depth: int = 0) -> list[tuple[str, float]]:
    """Bucket of ``func``'s own time; a generic function (numpy helper, builtin) takes its
    caller's bucket, split by the time spent under each caller."""
    file, _, name = func
    for label, test in _BUCKETS:
        if test(file, name):
            return [(label, stats[func][2])]
    callers = stats[func][4]
    if depth > 6 or not callers:
        return [("other", stats[func][2])]
    out = []
    for caller, (_, _, tt, _) in callers.items():
        for label, _ in _bucket(caller, stats, depth + 1):
            out.append((label, tt))
            break
    return out


def _short(func: tuple) -> str:
    file, line, name = func
    if file == "~":  # a builtin: "<method 'update_into' of 'pkg.CipherContext' objects>"
        method = re.fullmatch(r"<method '(\w+)' of '(?:[\w.]*\.)?(\w+)' objects>", name)
        if method:
            return f"`{method[2]}.{method[1]}`"
        return f"`{name.removeprefix('<built-in method ').removesuffix('>')}`"
    parts = Path(file).parts
    where = "/".join(parts[parts.index("secureffm"):]) if "secureffm" in parts else parts[-1]
    return f"`{name}` ({where}:{line})"


def _profile(fed: _Federation, top: int) -> tuple[dict[str, float], str]:
    """cProfile one round in CPU time (``time.process_time``, robust to other work on the
    machine): own seconds grouped into costs, and a table of the top functions."""
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    fed.round()
    profile.disable()
    stats = pstats.Stats(profile).stats
    total_tt = sum(s[2] for s in stats.values())
    buckets: dict[str, float] = defaultdict(float)
    for func in stats:
        for label, tt in _bucket(func, stats):
            buckets[label] += tt
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    func_rows = []
    for func, (_, calls, tt, ct, callers) in ranked:
        main = max(callers.items(), key=lambda kv: kv[1][2])[0] if callers else None
        func_rows.append([_short(func), calls, f"{1e3 * tt:,.1f}", f"{1e3 * ct:,.1f}",
                          f"{100 * tt / total_tt:.0f}%", _short(main) if main else ""])
    func_table = markdown_table(["function", "calls", "own ms", "cumulative ms", "own share",
                         "main caller"], func_rows)
    return dict(buckets), func_table


def _bucketmarkdown_table(columns: dict[str, dict[str, float]]) -> str:
    """Costs as rows, one ms and share column pair per profiled round, sorted by the first."""
    first = next(iter(columns.values()))
    labels = sorted(set().union(*columns.values()), key=lambda b: -first.get(b, 0.0))
    headers = ["cost"]
    for name in columns:
        headers += [f"{name}: ms", "share"]
    rows = []
    for label in labels:
        row = [label]
        for buckets in columns.values():
            tt, total = buckets.get(label, 0.0), sum(buckets.values())
            row += [f"{1e3 * tt:,.1f}", f"{100 * tt / total:.0f}%"]
        rows.append(row)
    return markdown_table(headers, rows)


def _breakdown(root: Path, n: int, d: int, protocol: str, top: int) -> tuple[str, str, str]:
    """Phase timing and a cProfile of one round of ``protocol`` for n clients, d parameters."""
    vectors = _vectors(n, d, seed=1)
    fed = _Federation(root / f"breakdown-{n}-{d}", protocol, vectors)
    fed.round()  # warm-up
    # 1. phases: wrap Link.exchange (the server signs its requests, each client runs its
    # handler and signs its reply, the transport delivers, checks and logs); the server's work
    # between two exchanges is charged to the later one.
    spans: list[tuple[str, float, float]] = []
    exchange = Link.exchange

    def timed_exchange(link, phase, reply_phase, *args, **kwargs):
        start = time.perf_counter()
        try:
            return exchange(link, phase, reply_phase, *args, **kwargs)
        finally:
            spans.append((f"{phase} -> {reply_phase}", start, time.perf_counter()))

    Link.exchange = timed_exchange
    try:
        start = time.perf_counter()
        fed.round()
        end = time.perf_counter()
    finally:
        Link.exchange = exchange
    work: dict[str, float] = defaultdict(float)
    inside: dict[str, float] = defaultdict(float)
    last = start
    for name, t0, t1 in spans:
        work[name] += t0 - last
        inside[name] += t1 - t0
        last = t1
    tail = end - last
    total = end - start
    rows = [[name, f"{1e3 * work[name]:,.1f}", f"{1e3 * inside[name]:,.1f}",
             f"{100 * (work[name] + inside[name]) / total:.0f}%"] for name in inside]
    rows.append(["server: add masked inputs, rebuild seeds, remove masks, dequantize",
                 f"{1e3 * tail:,.1f}", "", f"{100 * tail / total:.0f}%"])
    rows.append(["**round**", "", "", f"{1e3 * total:,.1f} ms"])
    phases = markdown_table(["exchange (request phase -> reply phase)",
                             "server's work before it, ms",
                             "inside it (clients' handlers, signing, delivery, checks, log), ms",
                             "share"], rows)

    # 2. cProfile of a third round.
    buckets, func_table = _profile(fed, top)
    fed.close()
    return phases, _bucketmarkdown_table({f"n={n}, d={_sci(d)}": buckets}), func_table


# -- output ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds per light case (heavy cases run fewer; median reported)")
    parser.add_argument("--quick", action="store_true", help="skip d = 10^6 for n = 50")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--top", type=int, default=12, help="functions listed in the profile")
    parser.add_argument("--smoke", action="store_true",
                        help="n in {2, 10}, d = 10^3, one round per case: checks that the "
                             "script runs (seconds); the numbers are not measurements")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.smoke:
        args.repeats = 1
    clients, sizes = ((2, 10), (10**3,)) if args.smoke else (CLIENTS, SIZES)
    big_n, big_d = 10, max(sizes)  # the throughput and the breakdown of one round
    small_d = min(sizes) if args.smoke else 10**4  # the small-model profiles, at n >= 10
    small_ns = [n for n in clients if n >= 10]
    command = "benchmarks/secagg.py" + (" --smoke" if args.smoke else "") + (
        " --quick" if args.quick else "") + (
        f" --repeats {args.repeats}" if args.repeats != 5 and not args.smoke else "")
    load_before = os.getloadavg()
    started = time.perf_counter()

    cases = [(n, d, masking, protocol) for n in clients for d in sizes
             for masking, protocol in MASKINGS if not (args.quick and n == 50 and d == 10**6)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        vectors: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        for i, (n, d, masking, protocol) in enumerate(cases, start=1):
            _say(f"[{i}/{len(cases)}] n={n} d={_sci(d)} {masking} ...")
            if (n, d) not in vectors:
                vectors = {(n, d): _vectors(n, d)}  # one size in memory at a time
            r = _run_case(root / str(i), n, d, masking, protocol, vectors[(n, d)],
                          args.repeats)
            results.append(r)
            _say(f"    plaintext {1e3 * statistics.median(r.plain_s):,.1f} ms, secagg "
                 f"{1e3 * statistics.median(r.secure_s):,.1f} ms ({r.ratio:.2f}x wall, "
                 f"{r.cpu_ratio:.2f}x CPU, {len(r.secure_s)} secagg rounds)")
        del vectors
        _say("masking throughput ...")
        adversaries = _adversaries(root, args.quick, max(3, args.repeats), clients, sizes)
        throughput = _throughput(big_d, max(5, 2 * args.repeats))
        _say(f"breakdown of one round, n={big_n}, d={_sci(big_d)}, full graph ...")
        phases, buckets, functions = _breakdown(root, big_n, big_d, "secagg", args.top)
        small: dict[str, dict[str, float]] = {}
        for n in small_ns:
            _say(f"profile of one round, n={n}, d={_sci(small_d)}, full graph ...")
            fed = _Federation(root / f"small-{n}", "secagg", _vectors(n, small_d, seed=2))
            fed.round()  # warm-up
            small[f"n={n}"], small_functions = _profile(fed, args.top)
            fed.close()
    load_after = os.getloadavg()

    text = "\n".join([
        f"Written by `.venv/bin/python {command}` in {time.perf_counter() - started:.0f} s on "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}); 1-minute load average "
        f"{load_before[0]:.1f} before and {load_after[0]:.1f} after (other work ran "
        "meanwhile, so absolute times are noisy; ratios pair rounds run back to back).",
        "",
        "### Round time, secure aggregation over plaintext",
        "",
        "One `channel.aggregate` call; `compute` returns a precomputed random float32 vector, "
        "so model compute is excluded. Plaintext and secagg rounds alternate; each side is "
        "the median of its rounds after one untimed warm-up (none for secagg in the heaviest "
        "case, n = 50 on the full graph at d = 10^6, which runs one cold round; heavy cases "
        "run fewer rounds)"
        + ("; n = 50, d = 10^6 skipped (`--quick`)." if args.quick else "."),
        "",
        _roundmarkdown_table(results),
        "",
        "### Bytes on the wire per client per round",
        "",
        "Payload bytes from the message log (`bytes` of each record; the log's `summary()` "
        "total agrees), divided by n. Up = client to server, down = server to client.",
        "",
        _bytesmarkdown_table(results),
        "",
        "By phase (bytes per client; the direction is in the header):",
        "",
        _phasemarkdown_table(results),
        "",
        "### The malicious-server variant over the semi-honest one",
        "",
        "The shipped `secagg` (`adversary = \"malicious\"`: keys signed by each client's "
        f"identity in batches of {KEY_BATCH} rounds and checked against the pinned keys, the "
        "graph announced as a seed, a consistency round of signed and MACed survivor sets) "
        "against the same spec with `adversary = \"semi-honest\"`, rounds alternating after "
        "one warm-up round each; medians. The warm-up drew each client's keys for "
        f"{KEY_BATCH} rounds; the cost of that, n clients drawing and signing {KEY_BATCH} rounds "
        f"of keys (timed in the same run), spread over {KEY_BATCH} rounds, is added to the "
        "malicious round; full graph.",
        "",
        adversaries,
        "",
        "### Masking throughput against the raw stream cipher",
        "",
        throughput,
        "",
        f"### Where the time goes: n = {big_n}, d = {_sci(big_d)}, full graph",
        "",
        "Exchanges (`Link.exchange` wrapped; the clients run in this process, one after "
        "another, so an exchange's time is every client's handler plus the transport; the "
        "server's work on the previous replies is charged to the next exchange):",
        "",
        phases,
        "",
        "cProfile of another round (CPU time), own time grouped by cost (a numpy helper or builtin "
        "without a group of its own takes its caller's group):",
        "",
        buckets,
        "",
        f"Top {args.top} functions by own time:",
        "",
        functions,
        "",
        f"### A small model: d = {_sci(small_d)}, full graph, n = "
        + " and ".join(map(str, small_ns)),
        "",
        "Per-message and per-pair costs (keys, shares, signatures, serialization) dominate "
        "here; the pair costs grow as n^2 on the full graph:",
        "",
        _bucketmarkdown_table(small),
        "",
        f"Top {args.top} functions by own time, n = {small_ns[-1]}:",
        "",
        small_functions,
    ])
    print(text)
    if args.out:
        write_block(args.out, "secagg", text, title="# Benchmarks")
        _say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
