"""FFM on images: round time of GOT over vanilla and of DP-SGD over plain training on the U-Net,
at batch 128 per client, on whatever device runs it.

    .venv/bin/python benchmarks/images.py                      # the paper's CIFAR-10 U-Net
    .venv/bin/python benchmarks/images.py --layout compact     # its arguments, compact layout
    .venv/bin/python benchmarks/images.py --width 32 --mult 1,2,2 --blocks 1 --attention none
    .venv/bin/python benchmarks/images.py --data-dir ~/data     # real CIFAR-10 (binary version)
    .venv/bin/python benchmarks/images.py --out docs/benchmarks.md
    .venv/bin/python benchmarks/images.py --quick               # seconds: a smoke test only

Each configuration builds the real run (``secureffm.runs.ffm``: 3 clients with a Dirichlet
split, the FFM method, the plaintext or dp protocol's channel and its signed log) and times
``train_round``: a round is every client's step (one mini-batch of 128, its gradient uploaded
through the channel) and the server's update; GOT adds its dual-potential round every 5 rounds
(5 c-transform gradient steps of size 0.5 and 128 candidates, as in the FFM paper's App. C.2;
under DP the c-transform takes 0 steps, which is all DP-SGD can clip). The clients' compute
(the method's client program) is timed apart from the rest (channel: serialization, signing,
hashing, the log; the server's Adam step). Data: CIFAR-10 with ``--data-dir``, else the
synthetic CIFAR-shaped ``shapes`` set (3 x 32 x 32); the timings do not depend on pixels.
Configurations run one after another in one process; the ratio of two is their median round
times' ratio. On CUDA the velocity's forward runs under bf16 autocast (``precision auto``) and
the peak GPU memory of each configuration is reported. Tables go to stdout (markdown) and, with
``--out``, between the ``<!-- images:begin -->`` and ``<!-- images:end -->`` markers.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from secureffm.config import RunConfig
from secureffm.errors import SecureFFMError
from secureffm.federation.log import MessageLog
from secureffm.reporting import markdown_table, write_block
from secureffm.runs.ffm import build_run
from secureffm.runtime import resolve_device

__all__ = ["main"]

CASES = (("vanilla", "plaintext"), ("got", "plaintext"), ("vanilla", "dp"), ("got", "dp"))


@dataclass
class _Timed:
    """The clients' program, timed: wall seconds inside it (CUDA synchronized)."""

    inner: object
    device: torch.device
    seconds: float = 0.0

    def __call__(self, client, task):
        start = time.perf_counter()
        out = self.inner(client, task)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - start
        return out


@dataclass
class Measured:
    method: str
    protocol: str
    rounds: list[float] = field(default_factory=list)  # seconds per round
    client_share: float = 0.0  # fraction of the round time inside the clients' program
    peak_gb: float = 0.0
    params: int = 0
    error: str = ""  # why the configuration could not be measured

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)


def _config(args, method: str, protocol: str, root: Path) -> RunConfig:
    dp = protocol != "plaintext"
    return RunConfig(
        method=method, protocol=protocol, data="cifar10" if args.data_dir else "shapes",
        data_dir=args.data_dir or "", image_size=args.size, clients=3, partition="dirichlet",
        dirichlet_alpha=1.0, shard_size=args.shard, batch_size=args.batch, rounds=1_000_000,
        unet_width=args.width, unet_mult=args.mult, unet_blocks=args.blocks,
        unet_attention=args.attention, unet_layout=args.layout, lr=2e-4, ema_decay=0.9999,
        candidates=args.batch,
        potential_every=5, ctransform_steps=0 if dp else 5, ctransform_lr=0.5,
        potential_lr=1e-4, noise_multiplier=1.0 if dp else 0.0, eval_samples=args.batch,
        device=args.device, progress=False, insecure_deterministic=True,
        out=str(root / f"{method}-{protocol}"))


def measure(args, method: str, protocol: str, root: Path) -> Measured:
    """Warm-up rounds, then ``args.rounds`` timed rounds of one configuration."""
    config = _config(args, method, protocol, root)
    device = resolve_device(config.device)
    log = MessageLog(Path(config.out) / "messages.jsonl")
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    _, _, trainer = build_run(config, device, log, None, Path(config.out))
    endpoints = list(trainer.channel.endpoints.values())
    timed = _Timed(endpoints[0].program, device)  # the clients' program, timed
    for endpoint in endpoints:
        endpoint.program = timed
    result = Measured(method, protocol, params=sum(p.numel() for p in
                                                   trainer.velocity.module.parameters()))
    for round_ in range(1, args.warmup + 1):
        trainer.train_round(round_)
    timed.seconds = 0.0
    for round_ in range(args.warmup + 1, args.warmup + args.rounds + 1):
        start = time.perf_counter()
        trainer.train_round(round_)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result.rounds.append(time.perf_counter() - start)
        print(f"  {method}/{protocol} round {round_}: {result.rounds[-1]:.3f} s",
              file=sys.stderr, flush=True)
    result.client_share = timed.seconds / sum(result.rounds)
    if device.type == "cuda":
        result.peak_gb = torch.cuda.max_memory_allocated(device) / 2**30
    log.close()
    return result


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU, {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s)"


def report(args, results: dict[tuple[str, str], Measured]) -> str:
    device = resolve_device(args.device)
    shape = (f"{args.layout} U-Net width {args.width}, mult {','.join(map(str, args.mult))}, "
             f"{args.blocks} block(s), attention at {args.attention or 'none'}")
    data = "CIFAR-10" if args.data_dir else f"synthetic shapes {args.size}x{args.size}"
    precision = "bf16 autocast" if device.type == "cuda" else "float32"
    lines = [f"### FFM on images, round time: {data}, {shape}",
             "",
             f"Device: {_device_name(device)}; torch {torch.__version__}; {precision}; 3 "
             f"clients, batch {args.batch} per client; median of {args.rounds} rounds after "
             f"{args.warmup} warm-up rounds (`benchmarks/images.py"
             f"{' --quick' if args.quick else ''}`).",
             ""]
    rows = []
    for (method, protocol), m in results.items():
        if m.error:
            rows.append([method, protocol, f"failed: {m.error}", "-", "-", "-", "-", "-"])
            continue
        rows.append([method, protocol, f"{m.params:,}", f"{m.median * 1e3:.1f}",
                     f"{min(m.rounds) * 1e3:.1f}", f"{m.client_share:.0%}",
                     f"{3 * args.batch / m.median:.0f}",
                     f"{m.peak_gb:.2f}" if device.type == "cuda" else "-"])
    lines.append(markdown_table(["method", "protocol", "parameters", "round ms (median)",
                                 "round ms (min)", "in clients' compute", "images/s",
                                 "peak GPU GB"], rows))
    def ratio(a: tuple[str, str], b: tuple[str, str]) -> float:
        if results[a].error or results[b].error:
            return float("nan")
        return results[a].median / results[b].median

    lines += ["", markdown_table(["ratio", "measured", "the FFM paper (A100, Table 3)"], [
        ["GOT / vanilla, plain", f"{ratio(('got', 'plaintext'), ('vanilla', 'plaintext')):.2f}x",
         "1.37x"],
        ["GOT / vanilla, dp", f"{ratio(('got', 'dp'), ('vanilla', 'dp')):.2f}x", "-"],
        ["dp / plain, vanilla", f"{ratio(('vanilla', 'dp'), ('vanilla', 'plaintext')):.2f}x",
         "-"],
        ["dp / plain, GOT", f"{ratio(('got', 'dp'), ('got', 'plaintext')):.2f}x", "-"]])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true",
                        help="seconds: 8x8 images, a width-8 U-Net, batch 16, 5 rounds")
    parser.add_argument("--data-dir", default="", help="CIFAR-10 binary version (else shapes)")
    parser.add_argument("--width", type=int, default=128, help="U-Net base width")
    parser.add_argument("--mult", default="1,2,2,2", help="U-Net width multipliers")
    parser.add_argument("--blocks", type=int, default=2, help="residual blocks per resolution")
    parser.add_argument("--attention", default="16", help="attention resolutions, or none")
    parser.add_argument("--layout", default="guided", choices=("guided", "compact"),
                        help="U-Net layout (guided: the paper's, 35.75M at the defaults)")
    parser.add_argument("--batch", type=int, default=128, help="batch per client")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (multiple of 5)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    parser.add_argument("--out", type=Path, help="markdown file to write the table into")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.mult, args.blocks, args.attention = 8, "1,2", 1, "none"
        args.batch, args.rounds, args.warmup = 16, 5, 1
    args.size = 8 if args.quick else 32
    args.shard = max(4 * args.batch, 2_000 if not args.quick else 64)
    args.mult = tuple(int(v) for v in args.mult.split(","))
    args.attention = () if args.attention == "none" else tuple(
        int(v) for v in args.attention.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for method, protocol in CASES:
            try:
                results[(method, protocol)] = measure(args, method, protocol, Path(root))
            except (RuntimeError, SecureFFMError) as err:  # e.g. out of memory: report, go on
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
                print(f"{method}/{protocol} failed: {type(err).__name__}: {first}",
                      file=sys.stderr, flush=True)
                results[(method, protocol)] = Measured(method, protocol,
                                                       error=f"{type(err).__name__}: {first}")
    text = report(args, results)
    print(text)
    if args.out:
        write_block(args.out, "images", text, title="# Benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
