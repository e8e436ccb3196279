"""Homomorphic aggregation (`he`, the ckks stage) against plaintext and secure aggregation:
round time, bytes on the wire, the CKKS packing against NVIDIA FLARE's, and where a round's
time goes, for the in-process transport.

    .venv/bin/python benchmarks/he.py                            # every case (minutes)
    .venv/bin/python benchmarks/he.py --out docs/benchmarks.md   # also write the tables
    .venv/bin/python benchmarks/he.py --smoke                    # seconds: a check only

A round is one ``channel.aggregate(round, "gradient", compute, weights, template)`` call (the
channel from ``open_channel``) in which ``compute`` returns a precomputed random float32
vector per client, so model compute is excluded, under the shipped ``plaintext``, ``secagg``
and ``he`` specs. Each federation runs one untimed warm-up round first (for ``he`` that is the
round with the key set-up, timed and reported on its own); then the three alternate round by
round, so all see the same background load, and a ratio is a median over a median. Progress
goes to stderr, the tables (markdown) to stdout and, with ``--out``, between the
``<!-- he:begin -->`` and ``<!-- he:end -->`` markers of that file. ``--smoke`` runs every
table at n in {2, 10} and d = 10^3 with one round per case: the default test suite runs it to
check that the script works; its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tenseal as ts
import torch

from secureffm.federation import SERVER, Client, MessageLog
from secureffm.protocols import load_protocol
from secureffm.protocols.ckks import decrypt, encrypt, new_context, write_ciphertexts
from secureffm.protocols.ckks_params import MAX_BITS_128, CKKSParams
from secureffm.reporting import markdown_table, write_block
from secureffm.runs.scaffold import open_channel

CLIENTS = (2, 10)
SIZES = (10**4, 10**6)
PROTOCOLS = ("plaintext", "secagg", "he")
KIND = "gradient"
# Rounds of a case beyond the warm-up: --repeats while n * d is at most this, else 2.
_LIGHT = 10**6
# NVIDIA FLARE's TenSEAL filter (FACTS.md): public-key encryption, three primes, scale 2^40.
FLARE = CKKSParams(8192, (60, 40, 40), 40)
FLARE_BYTES = 57.6  # bytes per parameter FLARE's filter sends, as measured (FACTS.md)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _sci(d: int) -> str:
    return f"10^{len(str(d)) - 1}" if str(d).strip("0") == "1" else f"{d:,}"


def _clients(n: int) -> list[Client]:
    return [Client(f"client-{i:02d}", torch.zeros(1, 2), torch.Generator().manual_seed(i),
                   protocol_rng=np.random.default_rng(i)) for i in range(1, n + 1)]


def _vectors(n: int, d: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"client-{i:02d}": 0.01 * rng.standard_normal(d, dtype=np.float32)
            for i in range(1, n + 1)}


class _Federation:
    """One channel under ``protocol`` with its own log under ``root``; a round counter."""

    def __init__(self, root: Path, protocol: str, vectors: dict[str, np.ndarray]):
        self.name = protocol
        self.log_path = root / protocol / "messages.jsonl"
        self.channel = open_channel(load_protocol(protocol), _clients(len(vectors)),
                                    MessageLog(self.log_path))
        self.vectors = vectors
        self.d = len(next(iter(vectors.values())))
        self.rounds = 0

    def round(self) -> float:
        """One aggregation; its wall seconds. Raises if a client was left out."""
        self.rounds += 1
        start = time.perf_counter()
        result = self.channel.aggregate(self.rounds, KIND, lambda c: {KIND: self.vectors[c.id]},
                                        dict.fromkeys(self.vectors, 1.0),
                                        {KIND: ((self.d,), np.dtype(np.float32))})
        elapsed = time.perf_counter() - start
        if result.payload is None or len(result.included) != len(self.vectors):
            raise RuntimeError(f"{self.name} round failed: {result.reason or result.dropped}")
        return elapsed

    def phase_bytes(self, round_: int) -> dict[str, dict[str, int]]:
        """Payload bytes in ``round_`` by phase and direction ("up": to the server)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        with self.log_path.open() as lines:
            for line in lines:
                record = json.loads(line)
                if record["kind"] == KIND and record["round"] == round_:
                    way = "down" if record["sender"] == SERVER else "up"
                    out[record["phase"]][way] += record["bytes"]
        return out

    def close(self) -> None:
        self.channel.close()


@dataclass
class Case:
    n: int
    d: int
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    first_he: float = 0.0  # the warm-up round of he: with the key set-up
    bytes: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    setup: dict[str, dict[str, int]] = field(default_factory=dict)

    def median(self, protocol: str) -> float:
        return statistics.median(self.seconds[protocol])


def _run_case(root: Path, n: int, d: int, repeats: int) -> Case:
    vectors = _vectors(n, d)
    feds = {p: _Federation(root, p, vectors) for p in PROTOCOLS}
    case = Case(n, d)
    for p, fed in feds.items():  # warm-up; he's first round sets up the keys
        elapsed = fed.round()
        if p == "he":
            case.first_he = elapsed
    for _ in range(repeats if n * d <= _LIGHT else 2):
        for p, fed in feds.items():
            case.seconds[p].append(fed.round())
    case.bytes = {p: fed.phase_bytes(fed.rounds) for p, fed in feds.items()}
    case.setup = feds["he"].phase_bytes(1)
    for fed in feds.values():
        fed.close()
    return case


# -- tables ---------------------------------------------------------------------------------------


def _roundmarkdown_table(cases: list[Case]) -> str:
    def ms(times: list[float]) -> str:
        spread = f" ({1e3 * min(times):,.0f}-{1e3 * max(times):,.0f})" if len(times) > 1 else ""
        return f"{1e3 * statistics.median(times):,.1f}{spread}"

    rows = [[c.n, _sci(c.d), ms(c.seconds["plaintext"]), ms(c.seconds["secagg"]),
             ms(c.seconds["he"]), f"**{c.median('he') / c.median('plaintext'):.1f}x**",
             f"**{c.median('he') / c.median('secagg'):.2f}x**", f"{1e3 * c.first_he:,.1f}",
             len(c.seconds["he"])] for c in cases]
    return markdown_table(["n", "d", "plaintext ms (min-max)", "secagg ms (min-max)",
                   "he ms (min-max)", "he / plaintext", "he / secagg",
                   "he first round, with key set-up, ms", "rounds each"], rows)


def _per_param(phases: dict[str, dict[str, int]], n: int, d: int, only: str = "") -> str:
    total = sum(b for phase, ways in phases.items() if not only or phase == only
                for b in ways.values())
    return f"{total / n / d:.2f}"


def _bytesmarkdown_table(cases: list[Case]) -> str:
    rows = []
    for c in cases:
        he = c.bytes["he"]
        setup = sum(c.setup.get("he_keys", {}).values()) / c.n
        rows.append([c.n, _sci(c.d), _per_param(c.bytes["plaintext"], c.n, c.d),
                     _per_param(c.bytes["secagg"], c.n, c.d),
                     _per_param(he, c.n, c.d, "upload"),
                     _per_param(he, c.n, c.d),
                     f"{setup / 1e3:,.0f}"])
    return markdown_table(["n", "d", "plaintext (up+down)", "secagg (up+down)", "he upload",
                   "he (up+down: upload, sum to the decryptor, its plaintext sum)",
                   "he key set-up, once per run (KB per client)"], rows)


def _packing(d: int) -> str:
    """FLARE's CKKS set-up (public key, [60, 40, 40], scale 2^40) against the shipped one
    (symmetric, [60, 40, 40], scale 2^60): bytes per parameter and seconds per 10^6
    parameters, every slot used."""
    rows = []
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-1, 1, d), rng.uniform(-1, 1, d)
    shipped = load_protocol("he").stages[0].params
    for label, params, symmetric in (("NVIDIA FLARE's filter: public key", FLARE, False),
                                     ("`he` (this stage): symmetric", shipped, True)):
        context = new_context(params) if symmetric else _public_key_context(params)
        start = time.perf_counter()
        cx = encrypt(context, x, params)
        encrypt_s = time.perf_counter() - start
        cy = encrypt(context, y, params)
        start = time.perf_counter()
        total = [a + b for a, b in zip(cx, cy, strict=True)]
        add_s = time.perf_counter() - start
        start = time.perf_counter()
        plain = decrypt(context, total, d)
        decrypt_s = time.perf_counter() - start
        size = len(write_ciphertexts(cx))
        bits, limit = sum(params.coeff_mod_bit_sizes), MAX_BITS_128[params.poly_modulus_degree]
        per = 1e6 / d
        rows.append([label, params.poly_modulus_degree, list(params.coeff_mod_bit_sizes),
                     f"{bits} <= {limit}", f"2^{params.scale_bits}", f"{size / d:.1f}",
                     f"{per * encrypt_s:.2f}", f"{per * add_s:.3f}", f"{per * decrypt_s:.2f}",
                     f"{np.abs(plain - (x + y)).max():.1e}"])
    return markdown_table(["set-up", "N", "primes (bits)", "modulus bits (128-bit limit)", "scale",
                   "bytes / parameter", "encrypt s / 10^6", "add s / 10^6",
                   "decrypt s / 10^6", "max error of x + y"], rows)


def _public_key_context(params: CKKSParams) -> ts.Context:
    context = ts.context(ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree,
                         coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes), n_threads=1)
    context.global_scale = params.scale
    return context


# cost -> test on (file, function name); the first match takes a function's own time.
_COSTS = [
    ("encrypt (TenSEAL `CKKSVector`: encode + symmetric encryption)",
     lambda f, fn: f.endswith("ckksvector.py") and fn == "__init__"
     or "plaintensor" in f or "plain_tensor" in fn or fn == "<method 'tolist' of "
     "'numpy.ndarray' objects>"),
    ("ciphertext (de)serialization (TenSEAL)",
     lambda f, fn: "serialize" in fn and "tenseal" in fn or f.endswith("abstract_tensor.py")
     or fn == "<built-in method _tenseal_cpp.data>"),
    ("decrypt (TenSEAL)", lambda f, fn: "decrypt" in fn),
    ("add ciphertexts (TenSEAL)", lambda f, fn: f.endswith("ckksvector.py") and "add" in fn),
    ("sha256 (payload hashes: signing, receipt, log)", lambda f, fn: "sha256" in fn),
    ("safetensors (payload framing)", lambda f, fn: "safetensors" in f + fn),
    ("Ed25519 sign and verify", lambda f, fn: "ed25519" in fn),
]


def _profile(n: int, d: int, root: Path) -> str:
    """Own time of one he round (after its warm-up), grouped by cost."""
    fed = _Federation(root / "profile", "he", _vectors(n, d))
    fed.round()
    profile = cProfile.Profile()
    profile.enable()
    fed.round()
    profile.disable()
    fed.close()
    stats = pstats.Stats(profile).stats
    costs: dict[str, float] = defaultdict(float)
    for (file, _, name), (_, _, own, _, _) in stats.items():
        label = next((label for label, test in _COSTS if test(file, name)), "other")
        costs[label] += own
    total = sum(costs.values())
    rows = [[label, f"{1e3 * s:,.1f}", f"{100 * s / total:.0f}%"]
            for label, s in sorted(costs.items(), key=lambda kv: -kv[1])]
    rows.append(["**round (profiled)**", f"{1e3 * total:,.1f}", ""])
    return markdown_table(["cost", "own ms", "share"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed rounds per light case (n * d <= 10^6; heavier: 2)")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--smoke", action="store_true",
                        help="n in {2, 10}, d = 10^3, one round per case: checks that the "
                             "script runs (seconds); the numbers are not measurements")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.smoke:
        args.repeats = 1
    sizes = (10**3,) if args.smoke else SIZES
    command = "benchmarks/he.py" + (" --smoke" if args.smoke else "") + (
        f" --repeats {args.repeats}" if args.repeats != 5 and not args.smoke else "")
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    started = time.perf_counter()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (n, d) in enumerate([(n, d) for n in CLIENTS for d in sizes], start=1):
            _say(f"[{i}/{len(CLIENTS) * len(sizes)}] n={n} d={_sci(d)} ...")
            cases.append(_run_case(root / str(i), n, d, args.repeats))
            c = cases[-1]
            _say(f"    plaintext {1e3 * c.median('plaintext'):,.1f} ms, secagg "
                 f"{1e3 * c.median('secagg'):,.1f} ms, he {1e3 * c.median('he'):,.1f} ms")
        _say("packing ...")
        packing = _packing(max(sizes))
        _say(f"profile of one he round, n={CLIENTS[-1]}, d={_sci(max(sizes))} ...")
        profile = _profile(CLIENTS[-1], max(sizes), root)
    load_after = os.getloadavg()
    text = "\n".join([
        f"Written by `.venv/bin/python {command}` in {time.perf_counter() - started:.0f} s on "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, TenSEAL {ts.__version__}); 1-minute load average "
        f"{load_before[0]:.1f} before and {load_after[0]:.1f} after (other work ran "
        "meanwhile, so absolute times are noisy; ratios pair rounds run back to back).",
        "",
        "### Round time, he over plaintext and over secagg",
        "",
        "One `channel.aggregate` call of the shipped specs; rounds of the three alternate "
        "after one untimed warm-up each; medians (min-max). The he warm-up is its first round, "
        "which sets up the keys: shown on its own.",
        "",
        _roundmarkdown_table(cases),
        "",
        "### Bytes per parameter per client per round",
        "",
        "Payload bytes of one round (after the warm-up) from the message log, all phases and "
        "both directions, divided by n and d; the key set-up is once per run (in KB).",
        "",
        _bytesmarkdown_table(cases),
        "",
        f"### CKKS packing against NVIDIA FLARE's, d = {_sci(max(sizes))}",
        "",
        f"Both fill every slot (N/2 = 4,096 values per ciphertext); FLARE's filter sends "
        f"{FLARE_BYTES} bytes per parameter (FACTS.md). Bytes: `write_ciphertexts` of the "
        "encrypted x. Times are seconds per 10^6 parameters on one thread.",
        "",
        packing,
        "",
        f"### Where the time of an he round goes: n = {CLIENTS[-1]}, d = {_sci(max(sizes))}",
        "",
        "cProfile of one round after its warm-up; own time grouped by cost.",
        "",
        profile,
    ])
    print(text)
    if args.out:
        write_block(args.out, "he", text, title="# Benchmarks")


if __name__ == "__main__":
    main()
