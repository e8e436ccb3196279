"""One FedWAD run, end to end: client data, parties, Algorithm 1 through the channel, run folder.

The run folder holds config.toml, result.json, privacy.json, messages.jsonl and parties.json.
Two clients give one distance; more give the matrix of distances between every pair. The
clients run in this process, or (``connect``, the Flower engine's channel; see
:mod:`.flower_server`) each in its own, where it builds its data from this public recipe by
its client index (:func:`client_data`) and runs its own
:class:`~secureffm.methods.fedwad_federated.FedWADClient` from its copy of the run config and
protocol.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tomli_w
import torch

from ..config import ENGINES
from ..data.digits import load_digit_arrays
from ..errors import ConfigError, DataError
from ..federation.channel import Channel
from ..federation.log import MessageLog
from ..federation.parties import new_clients, secret_randomness
from ..methods.fedwad import FedWADConfig, accuracy, check_samples, ground_cost
from ..methods.fedwad_federated import FedWADClient, federated_distance, pairwise_brackets
from ..ot import emd_cost
from ..protocols.protocol import Protocol, load_protocol
from ..protocols.statement import privacy_statement
from .scaffold import check_pin_path, open_channel, record_pin, starting_run_folder

__all__ = ["FedWADRun", "FedWADRunResult", "run_fedwad", "client_data", "fedwad_folder", "DATA",
           "Connect"]

DATA = ("gaussians", "digits")
SHIFT = 2.0  # client i of ``gaussians`` holds N(i * SHIFT * e_1, I_d)
DIGIT_PIXELS = 64  # scikit-learn's digits: 8 x 8 images

# The channel to clients that run elsewhere, given the protocol and the server's log.
Connect = Callable[[Protocol, MessageLog], Channel]


@dataclass(frozen=True)
class FedWADRun:
    """Settings of ``secureffm fedwad``.

    ``data``: ``gaussians`` (client i holds ``samples`` draws of N(2 i e_1, I) in ``dim``
    dimensions, so W_2 between clients i and j is 2 |i - j| in the population) or ``digits``
    (client i holds scikit-learn's digits of class i, 64 pixels in [0, 1], at most ``samples``)
    unless ``client_files`` (.npy arrays [N, d], one per client) are given. ``fedwad``:
    Algorithm 1's settings. ``check_exact``: also compute exact W_p with POT on pooled data
    (outside the federation, for comparison only). ``engine``: ``inprocess`` (every party in
    this process) or ``flower`` (each client a Flower node; ``phase_timeout`` seconds a phase
    waits for their replies; docs/flower.md).
    """

    fedwad: FedWADConfig = dataclasses.field(default_factory=FedWADConfig)
    data: str = "gaussians"
    clients: int = 2
    samples: int = 1000
    dim: int = 2
    client_files: tuple[str, ...] = ()
    protocol: str = "plaintext"
    seed: int = 0
    out: str = ""
    check_exact: bool = False
    keep_payloads: bool = False
    progress: bool = True
    overwrite: bool = False
    insecure_deterministic: bool = False
    pin_to: str = ""
    engine: str = "inprocess"
    phase_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"engine = {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if not self.phase_timeout > 0:
            raise ConfigError(f"phase_timeout = {self.phase_timeout!r}; give a positive number "
                              "of seconds")
        if not self.client_files:
            if self.data not in DATA:
                raise ConfigError(f"data = {self.data!r}; use one of {', '.join(DATA)} or give "
                                  "--client-file once per client")
            if self.clients < 2 or (self.data == "digits" and self.clients > 10):
                raise ConfigError(f"clients = {self.clients}; FedWAD needs at least 2 (digits: "
                                  "at most 10, one class each)")
            if self.samples < 1 or self.dim < 1:
                raise ConfigError(f"samples = {self.samples}, dim = {self.dim}; both must be "
                                  ">= 1")
        elif len(self.client_files) < 2:
            raise ConfigError("give --client-file at least twice (one .npy per client)")

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["fedwad"]["t_range"] = list(self.fedwad.t_range)
        values["client_files"] = list(self.client_files)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> FedWADRun:
        """The inverse of :meth:`to_dict`; an unknown key is a ConfigError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown FedWAD run key {unknown[0]!r}; known keys: "
                              f"{', '.join(sorted(known))}")
        algorithm = dict(values.get("fedwad", {}))
        try:
            if "t_range" in algorithm:
                algorithm["t_range"] = tuple(algorithm["t_range"])
            return cls(**{**values, "fedwad": FedWADConfig(**algorithm),
                          "client_files": tuple(values.get("client_files", ()))})
        except TypeError as err:
            raise ConfigError(f"a FedWAD run config does not load: {err}") from None

    @property
    def deterministic_seed(self) -> int | None:
        """The seed of the parties' secret streams: None (OS entropy) unless
        ``insecure_deterministic``."""
        return self.seed if self.insecure_deterministic else None

    @property
    def sample_dim(self) -> int:
        """The samples' dimension d by the public recipe (what a server that holds no data
        uses)."""
        return DIGIT_PIXELS if self.data == "digits" else self.dim


@dataclass(frozen=True)
class FedWADRunResult:
    """Where the run wrote its files, result.json's contents, and the run's pin (log head and
    key fingerprints, to keep apart from the folder)."""

    out: Path
    result: dict
    pin: dict | None = None


def client_data(run: FedWADRun) -> list[np.ndarray]:
    """Each client's samples, float64 [N_i, d], as ``run`` says (validated)."""
    if run.client_files:
        arrays = []
        for path in run.client_files:
            if not Path(path).is_file():
                raise DataError(f"client file {path!r} does not exist")
            try:
                arrays.append(np.load(path, allow_pickle=False))
            except ValueError as err:
                raise DataError(f"client file {path!r} is not a .npy array: {err}") from None
        return [check_samples(a, f"client file {p!r}") for a, p in zip(arrays, run.client_files,
                                                                         strict=True)]
    rng = np.random.default_rng(run.seed)
    if run.data == "gaussians":
        shift = np.zeros(run.dim)
        shift[0] = SHIFT
        return [rng.standard_normal((run.samples, run.dim)) + i * shift
                for i in range(run.clients)]
    x, y = load_digit_arrays()
    return [x[y == i][: run.samples].astype(np.float64) for i in range(run.clients)]


def fedwad_folder(run: FedWADRun) -> Path:
    """``run.out`` if set, else runs/fedwad-<protocol>-<data>-s<seed>."""
    if run.out:
        return Path(run.out)
    data = "files" if run.client_files else run.data
    return Path("runs") / f"fedwad-{Path(run.protocol).stem}-{data}-s{run.seed}"


def _exact(data: list[np.ndarray], p: int) -> np.ndarray:
    n = len(data)
    matrix = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            matrix[i, j] = matrix[j, i] = emd_cost(ground_cost(data[i], data[j], p)) ** (1 / p)
    return matrix


def run_fedwad(run: FedWADRun, connect: Connect | None = None) -> FedWADRunResult:
    """Run FedWAD as ``run`` says and write the run folder. ``connect``: the channel to
    clients that run elsewhere (the Flower engine's); then this process holds no client data,
    takes d from the public recipe (:attr:`FedWADRun.sample_dim`) and result.json names no
    sample counts."""
    if connect is not None and run.check_exact:
        raise ConfigError("check_exact pools every client's data in this process; with clients "
                          "that run elsewhere the server holds none: drop --check-exact")
    data = client_data(run) if connect is None else None
    protocol = load_protocol(run.protocol)
    protocol.check_protects_any(("measure", "scalar"), "FedWAD")
    out = fedwad_folder(run)
    check_pin_path(out, run.pin_to)
    with starting_run_folder(out, run.overwrite) as folder:
        (out / "config.toml").write_text(tomli_w.dumps(run.to_dict()))
        log = MessageLog(out / "messages.jsonl", keep_payloads=run.keep_payloads)
        channel = None
        geodesic = protocol.geodesic_privacy("measure")
        try:
            if connect is None:
                clients = new_clients([torch.from_numpy(x) for x in data], run.deterministic_seed)
                channel = open_channel(protocol, clients, log,
                                       deterministic_seed=run.deterministic_seed,
                                       program=FedWADClient(run.fedwad, geodesic))
                shape: dict = {"samples": [len(x) for x in data], "dim": int(data[0].shape[1])}
            else:
                channel = connect(protocol, log)
                shape = {"dim": run.sample_dim}
            ids = [c.id for c in channel.clients]
            folder.begin()  # every start-time refusal lies above
            dim = None if connect is None else run.sample_dim
            start = time.perf_counter()
            result: dict = {"protocol": protocol.name, "clients": ids, **shape, "p": run.fedwad.p,
                            "secret_randomness": secret_randomness(run.insecure_deterministic),
                            "insecure_deterministic": run.insecure_deterministic}
            if len(ids) == 2:
                found = federated_distance(channel, geodesic, ids[0], ids[1], run.fedwad, dim=dim)
                result.update(distance=found.distance, lower_bound=found.lower_bound,
                              iterates=list(found.iterates),
                              evaluated=list(found.evaluated), best=found.best,
                              support=found.measure.size, accuracy=accuracy(found, run.fedwad))
            else:
                matrix, lower = pairwise_brackets(channel, geodesic, run.fedwad,
                                                  progress=run.progress, dim=dim)
                result["matrix"] = matrix.tolist()
                if lower is not None:
                    result["lower_matrix"] = lower.tolist()
            result["seconds"] = time.perf_counter() - start
        finally:
            head = channel.close() if channel is not None else log.close()
    pin = record_pin(out, head, run.pin_to)
    result["messages"] = log.summary()
    if run.check_exact:
        exact = _exact(data, run.fedwad.p)
        result["exact"] = exact[0, 1] if len(data) == 2 else exact.tolist()
        estimate = np.array(result.get("matrix", [[0.0, result.get("distance", 0.0)]]))
        reference = exact if len(data) > 2 else exact[:1, :2]
        mask = reference > 0
        result["max_relative_error"] = float(np.max(np.abs(estimate[mask] / reference[mask] - 1)))
    (out / "result.json").write_text(json.dumps(result, indent=2))
    exclusions = ("every interpolating measure the server receives is a deterministic function "
                  "of a client's data, its t and the server's measure; no DP covers it",)
    if run.fedwad.bracket:
        exclusions += ("with bracket, each client releases its rows' mean (d floats) and "
                       "per-coordinate standard deviations (d floats) once per distance, for "
                       "the lower bound; unaccounted, no DP covers them (docs/fedwad.md)",)
    privacy = privacy_statement(protocol, ("measure", "scalar"), exclusions=exclusions,
                                deterministic=run.insecure_deterministic)
    (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    return FedWADRunResult(out, result, pin)
