"""What every runner shares: the run folder (refusing to mix runs), its pin, checkpoints, and
the DP settings resolved once from the protocol and the run config.

A runner (:mod:`.ffm`, :mod:`.dcfm`, :mod:`.fedwad`) builds its parties and channel, trains,
and writes the folder through these functions; the CLI only parses arguments.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..config import RunConfig
from ..errors import ConfigError
from ..federation.channel import Program
from ..federation.faults import FaultPlan
from ..federation.log import MessageLog
from ..federation.parties import Client, Registry, new_server
from ..federation.pin import pin_of
from ..federation.snapshot import decode_tree, encode_tree
from ..federation.transport import InProcessTransport
from ..privacy.settings import DPSettings
from ..protocols.channel import ProtectedChannel
from ..protocols.protocol import Protocol
from .tensorboard import TENSORBOARD_DIR

__all__ = ["RunResult", "run_folder", "prepare_run_folder", "RUN_ARTIFACTS", "JOURNALS_DIR",
           "CHECKPOINT", "load_checkpoint", "save_checkpoint", "check_pin_path", "record_pin",
           "pin_message", "resolve_dp", "open_channel"]

CHECKPOINT = "checkpoint.safetensors"  # a run's server state (save_checkpoint)
CHECKPOINT_TREE = "secureffm-checkpoint"  # its metadata key: the JSON tree around the tensors


@dataclass(frozen=True)
class RunResult:
    """Where the run wrote its files, its metrics as written to metrics.json, and its pin (the
    log's head and the parties' key fingerprints, to keep apart from the folder)."""

    out: Path
    metrics: dict
    pin: dict | None = None


def run_folder(config: RunConfig) -> Path:
    """``config.out`` if set, else runs/<method>-<protocol>-<data>-s<seed>."""
    if config.out:
        return Path(config.out)
    protocol = Path(config.protocol).stem
    return Path("runs") / f"{config.method}-{protocol}-{config.data}-s{config.seed}"


# The clients' own journals, when they run on this machine's Flower simulation engine.
JOURNALS_DIR = "journals"
# Files a run writes into its folder; --overwrite removes exactly these (and JOURNALS_DIR)
# before a new run.
RUN_ARTIFACTS = ("config.toml", "metrics.json", "metrics.csv", "result.json", "privacy.json",
                 "messages.jsonl", "parties.json", "payloads.bin", "checkpoint.safetensors",
                 "trajectories.png", "w2_nfe.png", "samples.png", "audit.md", "audit_epsilon.png",
                 "canaries.safetensors")


def prepare_run_folder(out: Path, overwrite: bool) -> Path:
    """Create ``out`` for a new run. A folder that already holds files is refused (a new run
    would mix its files with an old run's, e.g. a privacy.json the new run does not write)
    unless ``overwrite``, which first deletes the :data:`RUN_ARTIFACTS` found there."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out = {str(out)!r} is a file; give a folder for the run")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if present and not overwrite:
        raise ConfigError(f"run folder {str(out)!r} is not empty (it holds {', '.join(present[:4])}"
                          f"{', ...' if len(present) > 4 else ''}); pass --overwrite to replace "
                          "the previous run's files, or choose another --out")
    for name in RUN_ARTIFACTS:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / JOURNALS_DIR, ignore_errors=True)
    shutil.rmtree(out / TENSORBOARD_DIR, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_checkpoint(path: Path, content: dict) -> None:
    """Write ``content`` (nested dicts, lists and tuples of tensors and plain values) to
    ``path`` as safetensors (replaced atomically): the tensors as the file's tensors, the rest
    as JSON in its metadata (:func:`~secureffm.federation.snapshot.encode_tree`); no pickle."""
    arrays: dict = {}
    tree = encode_tree(content, "checkpoint", arrays)
    partial = path.with_name(path.name + ".partial")
    save_file(arrays, partial, metadata={CHECKPOINT_TREE: json.dumps(tree)})
    partial.replace(path)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict:
    """What :func:`save_checkpoint` wrote at ``path``, its tensors on ``device``. A file that is
    not such a safetensors file (a pickle planted in a run folder, a torch checkpoint) is
    refused by name; nothing in it is run."""
    if not path.is_file():
        raise ConfigError(f"{path} is missing: is {path.parent} a finished run folder?")
    try:
        with safe_open(path, framework="np") as handle:
            tree = json.loads((handle.metadata() or {})[CHECKPOINT_TREE])
            arrays = {name: handle.get_tensor(name) for name in handle.keys()}
        content = decode_tree(tree, arrays)
    except (SafetensorError, KeyError, ValueError, TypeError, OSError) as err:
        raise ConfigError(f"{path} is not a checkpoint secureffm wrote (safetensors with its "
                          f"tree in the metadata), so it was not loaded (nothing in it ran): "
                          f"{err}") from None
    return _to(content, torch.device(device))


def _to(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def check_pin_path(out: Path, pin_to: str) -> None:
    """A pin written inside the run folder protects nothing: refuse it before the run starts."""
    if pin_to and Path(pin_to).resolve().is_relative_to(out.resolve()):
        raise ConfigError(f"pin_to = {pin_to!r} lies inside the run folder {str(out)!r}; whoever "
                          "can rewrite the folder could rewrite the pin. Keep it elsewhere")


def record_pin(out: Path, head: str | None, pin_to: str) -> dict | None:
    """The run's pin (log head, parties.json hash, key fingerprints; see
    :func:`secureffm.federation.pin.pin_of`), written to ``pin_to`` when given; None when the log
    has no closing record."""
    if head is None:
        return None
    pin = pin_of(out, head).as_dict()
    if pin_to:
        Path(pin_to).parent.mkdir(parents=True, exist_ok=True)
        Path(pin_to).write_text(json.dumps(pin, indent=1))
    return pin


def pin_message(out: Path, pin: dict | None, pin_to: str) -> str:
    """What a command prints about the run's pin, so the user can keep it apart."""
    if pin is None:
        return "log head: none (the log has no closing record)"
    where = f"; pin written to {pin_to}" if pin_to else ""
    return (f"log head: {pin['head']}{where}\n  keep it apart from the run folder; later: "
            f"secureffm audit --verify {out} --expect-head {pin['head']}")


def resolve_dp(config: RunConfig, protocol, kinds: tuple[str, ...]) -> DPSettings | None:
    """The DP settings of ``kinds`` (what the method sends from client data) under ``protocol``
    with the run's overrides, or None (and then no DP option may be set). A protocol that
    protects none of ``kinds``, or whose dp stage leaves one out, is refused
    (Protocol.check_protects_any, Protocol.dp_settings)."""
    protocol.check_protects_any(kinds, f"method {config.method!r}")
    settings = protocol.dp_settings(kinds, f"method {config.method!r}")
    if settings is None:
        config.require_no_dp_options(protocol.name)
        return None
    return config.dp_overrides(settings)


def open_channel(protocol: Protocol, clients: list[Client], log: MessageLog,
                 faults: FaultPlan | None = None, deterministic_seed: int | None = None,
                 program: Program | None = None) -> ProtectedChannel:
    """The run's channel: a server party with keys of its own, the in-process transport
    (holding only the public keys, pinned in the log's parties.json), and ``protocol`` over
    it, which calls each client's own endpoint. ``deterministic_seed``: derive the server's secret
    streams from it, as the clients' are under ``--insecure-deterministic``; ``program``: what
    runs the method's named client computations on each client."""
    server = new_server(deterministic_seed)
    transport = InProcessTransport(Registry.of([server, *clients]), [c.id for c in clients],
                                   log, protocol.phases, faults)
    return ProtectedChannel(protocol, transport, server, clients, faults, program)
