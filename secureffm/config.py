"""The resolved configuration of one run, read from TOML and overridden by the CLI.

Every key is a field of :class:`RunConfig`; an unknown key or an impossible value raises
:class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

from .errors import ConfigError
from .families import DCFM, FFM, known_methods
from .names import (
    ACCOUNTANTS,
    CLIENT_DATA,
    IMAGE_DATA,
    IMAGE_FOLDER,
    IMAGE_LABELS,
    PAIRS,
    SILO_DATA,
    UNET_LAYOUTS,
)
from .spelling import did_you_mean

__all__ = ["RunConfig", "load_config", "read_toml", "config_from_dict", "write_config",
           "config_fields", "PATH_LISTS"]

METHODS = FFM.methods
DCFM_METHODS = DCFM.methods  # on conditional data sets only
DCFM_DATA = ("modes2d", "colored-digits", "colored-mnist")
# Readings of DCFM-B's teacher paths (secureffm.methods.dcfm.TEACHERS, which a test holds equal).
DCFM_TEACHERS = ("observed", "marginal", "anchored")
# DCFM's expert network: "auto" is the U-Net on Colored MNIST, the MLP elsewhere.
DCFM_NETWORKS = ("auto", "mlp", "unet")
PARTITIONS = ("disjoint", "iid", "dirichlet")
ENGINES = ("inprocess", "flower")
WEIGHTINGS = ("size", "uniform")
ADAPTIVE_SOLVERS = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")
IMAGE_METHODS = ("vanilla", "lot", "got")  # FFM on images (docs/images.md)
PRECISIONS = ("auto", "fp32", "bf16")
# Above this target epsilon a run needs allow_weak_privacy (docs/privacy.md, "Refused up
# front"): e^20 = 4.9e8 bounds the likelihood ratio of any output, which excludes nothing an
# attacker could measure; a value this large is a typo or a run without meaningful privacy.
WEAK_EPSILON = 20.0
# The run's overrides of the protocol's dp stage (0 or "" keeps the spec's value), and the
# DPSettings field each overrides where the names differ (Opacus calls the clip max_grad_norm).
DP_OPTIONS = ("target_epsilon", "delta", "noise_multiplier", "max_grad_norm", "accountant")
_SETTING = {"max_grad_norm": "clip"}
PATH_LISTS = frozenset({"client_data"})  # keys that hold a list of paths, not integers
TABLE_METHODS = ("vanilla", "lot", "got")  # FFM on the clients' own tables


@dataclass(frozen=True)
class RunConfig:
    """All settings of a run. Units: rounds are communication rounds (one global step each)."""

    method: str = "got"
    protocol: str = "plaintext"
    threat_model: str = ""
    keep_payloads: bool = False
    # DP overrides of the protocol's dp stage (0 keeps the spec's value).
    target_epsilon: float = 0.0
    delta: float = 0.0
    noise_multiplier: float = 0.0
    max_grad_norm: float = 0.0  # Opacus' name for the dp stage's per-example clip C
    accountant: str = ""  # "rdp" or "prv": calibrates the noise and enforces the target
    allow_weak_privacy: bool = False  # accept a target epsilon above WEAK_EPSILON
    # One-run DP audit (FFM vanilla/got under a dp protocol): plant this many gradient canaries,
    # each in a client's shard by a fair coin; the run is then an audit run (docs/audit.md).
    canaries: int = 0
    data: str = "8gaussians-moons"
    clients: int = 2
    partition: str = "disjoint"
    dirichlet_alpha: float = 0.5
    shard_size: int = 10_000
    # rounds, batch_size, lr, ema_decay, potential_lr and potential_every are the README's main
    # job's (GOT under dp-secagg at epsilon 8), chosen by experiments/dp_main_job.py
    # (docs/results.md): under DP a large batch with few rounds carries less noise on the mean
    # for the same epsilon. The paper's settings (batch 256, phi lr 1e-4 every 5 rounds, EMA
    # 0.999, 40k rounds) are in experiments/ffm_2d.toml; DCFM and images pass their own.
    rounds: int = 1_000
    batch_size: int = 1_024
    lr: float = 5e-3
    lr_warmup: int = 0  # FFM velocity: rounds of linear lr warm-up (the paper's CIFAR-10: 5000)
    hidden: int = 64
    weighting: str = "size"
    ema_decay: float = 0.99
    # FFM-GOT: dual potential f_phi and its c-transform.
    potential_hidden: int = 128
    potential_lr: float = 3e-3
    potential_every: int = 1
    candidates: int = 256
    ctransform_steps: int = 0
    ctransform_lr: float = 0.1
    # Evaluation. Exact W2 on eval_samples points (docs/benchmarks.md, "The main job"): 3,000
    # keeps the README's job within minutes; its i.i.d. floor (in metrics.json) is about 0.2.
    eval_samples: int = 3_000
    nfe: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 100)
    adaptive_solver: str = "dopri5"
    adaptive_tol: float = 1e-5
    trajectories: int = 1_000
    seed: int = 0
    device: str = "auto"
    out: str = ""  # empty: runs/<method>-<protocol>-<data>-s<seed>
    overwrite: bool = False  # replace the files of an earlier run in ``out``
    pin_to: str = ""  # also write the log's pin (head, key fingerprints) to this file
    # Derive the parties' secret streams from ``seed`` (replayable by anyone: debugging only).
    insecure_deterministic: bool = False
    progress: bool = True
    # Where the parties run: "inprocess" (every party an object of this process) or "flower"
    # (each client a Flower node with its own keys, data and state; docs/flower.md).
    engine: str = "inprocess"
    phase_timeout: float = 120.0  # seconds a phase waits for remote clients' replies
    threads: int = 1  # torch CPU threads; small models run fastest (and share a busy CPU) on one
    # DCFM and its baselines (methods dcfm-a, dcfm-b, fedflow[-l], ddm[-l]; docs/dcfm.md).
    local_steps: int = 2_000  # stage-I steps per client (DDM's whole training)
    dcfm_rounds: int = 3  # DCFM-A rounds R: all-gather, then dcfm_steps local steps
    dcfm_steps: int = 400
    distill_steps: int = 2_000  # DCFM-B student steps on the server
    teacher_steps: int = 16  # Euler steps of DCFM-B's teacher paths
    # DCFM-B teacher paths (docs/dcfm.md): "observed" (Eq. 15 as it reads), "marginal" (also
    # unobserved y, Eq. 5 over marginals), "anchored" (also unobserved y, Eq. 5 anchored on an
    # observed combination)
    dcfm_teacher: str = "anchored"
    # DCFM's experts, students and global models: "mlp" (width ``hidden``), "unet" (the U-Net
    # settings below, images only) or "auto" (the U-Net on colored-mnist, else the MLP)
    dcfm_network: str = "auto"
    fedflow_rounds: int = 200
    fedflow_local_steps: int = 10
    ci_weight: float = 1.0  # lambda of Eq. (10), (14), (17); the +L baselines use it too
    p_full: float = 0.7  # label masking, Eq. (8): full, one attribute, unconditional
    p_marginal: float = 0.2
    p_uncond: float = 0.1
    guidance: float = 1.0  # w_i of Eq. (5), every attribute, when sampling
    coverage: float = 0.5  # fraction of combinations observed (colored-digits)
    # Epochs of the evaluator's attribute classifier that scores DCFM's images (compositional
    # accuracy, Frechet distance); 0 skips those scores (samples.png only)
    eval_classifier_epochs: int = 4
    # FFM on images (data cifar10, mnist, colored-mnist from local files; shapes, synthetic;
    # digits, scikit-learn's 8 x 8).
    data_dir: str = ""  # where cifar10 / mnist files are; nothing is ever downloaded
    image_size: int = 32  # side of the synthetic shapes images, and of an image-folder run's
    # The channels of an image-folder run's images (1 grayscale, 3 RGB): with image_size, the
    # public shape every client's images must have (the server builds the U-Net from it).
    image_channels: int = 3
    image_labels: str = "none"  # an image-folder run's labels (IMAGE_LABELS), for its FID
    unet_width: int = 32  # U-Net base width (the paper's CIFAR-10 run: 128)
    unet_mult: tuple[int, ...] = (1, 2, 2)  # width multiplier per resolution (paper: 1,2,2,2)
    unet_blocks: int = 1  # residual blocks per resolution (paper: 2)
    unet_attention: tuple[int, ...] = ()  # resolutions with self-attention (paper: 16)
    unet_layout: str = "compact"  # compact | guided (the paper's: torchcfm's, 35.75M at 128)
    precision: str = "auto"  # auto: bf16 autocast for images on CUDA, else float32
    sample_every: int = 0  # rounds between sample grids (samples/); 0: only at the end
    # rounds between checkpoints (checkpoint.safetensors); 0: only at the end
    checkpoint_every: int = 0
    # an FFM run folder (or its checkpoint.safetensors) to continue (docs/privacy.md)
    resume: str = ""
    fid_weights: str = ""  # pytorch-fid's Inception weights (.pth) at a local path
    # A run on the clients' own tables (data = "table", docs/data.md): one file per client, in
    # client order (CSV, .npy, .parquet), each read by its client alone; the public schema
    # (TOML) every party holds, which sets the model's dimension; the public fraction of its
    # rows each client holds out for its own evaluation; the column whose ML efficacy the
    # clients score (empty: none).
    client_data: tuple[str, ...] = ()
    schema: str = ""
    holdout: float = 0.2
    target_column: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    def dp_overrides(self, settings):
        """The protocol's DP settings with this run's non-zero overrides applied.

        A run needs a target epsilon, a noise multiplier, or both (then the target is enforced
        by stopping early).
        """
        changes = {_SETTING.get(key, key): getattr(self, key) for key in DP_OPTIONS
                   if getattr(self, key)}
        resolved = dataclasses.replace(settings, **changes)
        if resolved.noise == "distributed" and resolved.accountant != "rdp":
            raise ConfigError(f"accountant = {resolved.accountant!r}, but the protocol's "
                              "distributed (Skellam) noise is accounted only by its RDP bound; "
                              "pass --accountant rdp or drop --accountant")
        self._check_epsilon(resolved.target_epsilon, "the protocol's dp stage sets ")
        if resolved.target_epsilon is None and resolved.noise_multiplier is None:
            raise ConfigError("the protocol's dp stage has neither target_epsilon nor "
                              "noise_multiplier; pass --target-epsilon or --noise-multiplier")
        return resolved

    def _check_epsilon(self, epsilon: float | None, source: str) -> None:
        """Refuse a target epsilon above :data:`WEAK_EPSILON` unless ``allow_weak_privacy``."""
        if epsilon and epsilon > WEAK_EPSILON and not self.allow_weak_privacy:
            raise ConfigError(f"{source}target_epsilon = {epsilon:g}, above {WEAK_EPSILON:g}: "
                              "such a guarantee excludes nothing an attacker could measure "
                              "(docs/privacy.md). Lower it, or pass --allow-weak-privacy to "
                              "run anyway")

    def require_no_dp_options(self, protocol: str) -> None:
        """DP options without a dp stage would promise a guarantee nobody provides."""
        given = [k for k in DP_OPTIONS if getattr(self, k)]
        if given:
            raise ConfigError(f"{given[0]} is set but protocol {protocol!r} has no dp stage, so "
                              "no DP would be applied; use protocol 'dp' or 'dp-secagg', or drop "
                              f"{given[0]}")

    @property
    def deterministic_seed(self) -> int | None:
        """The seed of the parties' secret streams: None (OS entropy) unless
        ``insecure_deterministic``."""
        return self.seed if self.insecure_deterministic else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @property
    def dcfm_unet(self) -> bool:
        """Whether DCFM's models are U-Nets (``dcfm_network``; auto: on colored-mnist)."""
        return self.dcfm_network == "unet" or (self.dcfm_network == "auto"
                                               and self.data == "colored-mnist")

    @property
    def images(self) -> bool:
        """True when the run trains on image data (:data:`~secureffm.names.IMAGE_DATA`, or the
        clients' own image folders)."""
        return self.data in IMAGE_DATA or self.data == IMAGE_FOLDER


def _validate(c: RunConfig) -> None:
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"{key} = {getattr(c, key)!r}: {what}")

    need(c.method in known_methods(), "method", f"choose one of {', '.join(known_methods())}"
         + did_you_mean(c.method, known_methods()))
    need(c.partition in PARTITIONS, "partition", f"choose one of {', '.join(PARTITIONS)}")
    data = DCFM_DATA if c.method in DCFM_METHODS else PAIRS + IMAGE_DATA + SILO_DATA
    need(c.data in data, "data", f"method {c.method!r} needs one of {', '.join(data)}"
         + did_you_mean(c.data, data))
    need(c.adaptive_solver in ADAPTIVE_SOLVERS, "adaptive_solver",
         f"choose one of {', '.join(ADAPTIVE_SOLVERS)} (torchdiffeq's adaptive solvers)")
    need(c.weighting in WEIGHTINGS, "weighting", f"choose one of {', '.join(WEIGHTINGS)}")
    need(c.engine in ENGINES, "engine", f"choose one of {', '.join(ENGINES)}")
    need(c.phase_timeout > 0, "phase_timeout", "must be a positive number of seconds")
    for key in ("clients", "shard_size", "rounds", "batch_size", "hidden", "potential_hidden",
                "potential_every", "candidates", "eval_samples", "trajectories"):
        need(getattr(c, key) >= 1, key, "must be a positive integer")
    need(c.ctransform_steps >= 0, "ctransform_steps", "must be >= 0")
    for key in ("lr", "potential_lr", "ctransform_lr", "dirichlet_alpha", "adaptive_tol"):
        need(getattr(c, key) > 0, key, "must be > 0")
    for key in ("target_epsilon", "noise_multiplier", "max_grad_norm"):
        need(math.isfinite(getattr(c, key)) and getattr(c, key) >= 0, key,
             "must be a finite number >= 0 (0 keeps the protocol's value)")
    need(c.accountant in ("",) + ACCOUNTANTS, "accountant",
         f"choose one of {', '.join(ACCOUNTANTS)} (empty keeps the protocol's)"
         + did_you_mean(c.accountant, ACCOUNTANTS))
    c._check_epsilon(c.target_epsilon, "")
    need(c.canaries >= 0, "canaries", "must be >= 0 (0: no canaries, a production run)")
    need(0 <= c.delta < 1, "delta", "must be in [0, 1) (0 keeps the protocol's value)")
    need(0.0 <= c.ema_decay < 1.0, "ema_decay", "must be in [0, 1); 0 disables the average")
    need(c.lr_warmup >= 0, "lr_warmup", "must be >= 0 rounds (0: no warm-up)")
    need(not c.lr_warmup or c.method not in DCFM_METHODS, "lr_warmup",
         "warms up FFM's velocity; DCFM and its baselines do not take it (leave it 0)")
    need(len(c.nfe) > 0 and all(int(n) >= 1 for n in c.nfe), "nfe", "list positive step counts")
    need(c.batch_size <= c.shard_size, "batch_size", "cannot exceed shard_size")
    need(c.threads >= 1, "threads", "must be a positive number of CPU threads")
    _validate_dcfm(c, need)
    _validate_images(c, need)
    _validate_table(c, need)


def _validate_table(c: RunConfig, need) -> None:
    need(0 < c.holdout < 1, "holdout", "must lie strictly between 0 and 1 (e.g. 0.2)")
    need(c.image_labels in IMAGE_LABELS, "image_labels", f"choose one of {', '.join(IMAGE_LABELS)}")
    need(c.image_labels == "none" or c.data == IMAGE_FOLDER, "image_labels",
         f"applies to data = {IMAGE_FOLDER!r} only, not {c.data!r}")
    need(c.image_channels in (1, 3), "image_channels", "must be 1 (grayscale) or 3 (RGB)")
    if c.data == IMAGE_FOLDER:
        for key in ("schema", "target_column"):
            need(not getattr(c, key), key, f"applies to data = {CLIENT_DATA!r}, not to the "
                 "clients' image folders")
        need(len(c.client_data) == c.clients, "client_data", f"give one image folder per "
             f"client: {len(c.client_data)} folder(s) for clients = {c.clients} (repeat "
             "--client-data, or set --clients)")
        return
    if c.data != CLIENT_DATA:
        for key in ("client_data", "schema", "target_column"):
            need(not getattr(c, key), key, f"applies to data = {CLIENT_DATA!r} or "
                 f"{IMAGE_FOLDER!r} (the clients' own data) only, not {c.data!r}")
        return
    need(c.method in TABLE_METHODS, "method", f"a run on the clients' own tables trains FFM: "
         f"use one of {', '.join(TABLE_METHODS)}")
    need(bool(c.schema), "schema", "a run on the clients' own tables needs the public schema "
         "every party holds: pass --schema schema.toml (draft one with secureffm schema infer)")
    # A Flower deployment's server names no file: each node names its own (docs/flower.md).
    need(len(c.client_data) == c.clients or (c.engine == "flower" and not c.client_data),
         "client_data", f"give one file per client: {len(c.client_data)} file(s) for clients = "
         f"{c.clients} (repeat --client-data, or set --clients)")


def _validate_images(c: RunConfig, need) -> None:
    need(c.precision in PRECISIONS, "precision", f"choose one of {', '.join(PRECISIONS)}")
    for key in ("sample_every", "checkpoint_every"):
        need(getattr(c, key) >= 0, key, "must be >= 0 rounds (0: only at the end)")
    need(c.unet_width >= 8 and c.unet_width % 8 == 0, "unet_width",
         "must be a positive multiple of 8 (the U-Net's GroupNorm has 8 groups)")
    need(c.unet_blocks >= 1, "unet_blocks", "must be a positive integer")
    need(c.unet_layout in UNET_LAYOUTS, "unet_layout",
         f"choose one of {', '.join(UNET_LAYOUTS)}")
    need(len(c.unet_mult) >= 1 and all(m >= 1 for m in c.unet_mult), "unet_mult",
         "list positive width multipliers, one per resolution, e.g. 1,2,2,2")
    need(not c.resume or (c.method in IMAGE_METHODS and c.engine == "inprocess"), "resume",
         "continues a federated FFM run (vanilla, lot, got) on the in-process engine")
    if not c.images:
        for key in ("data_dir", "fid_weights"):
            need(not getattr(c, key), key, f"applies to image data ({', '.join(IMAGE_DATA)}) "
                 f"only, not {c.data!r}")
        return
    if c.method in DCFM_METHODS:  # colored-mnist, the one image set of DCFM_DATA
        for key in ("resume", "sample_every", "checkpoint_every"):
            need(not getattr(c, key), key, "applies to FFM image runs, not DCFM's")
    else:
        need(c.method in IMAGE_METHODS, "method", f"data {c.data!r} is images: use one of "
             f"{', '.join(IMAGE_METHODS)} (the centralized baselines train the 2D MLP only)")
    need(c.engine == "inprocess", "engine", f"image runs ({c.data!r} too) use the in-process "
         "engine; the Flower engine runs 2D and tabular FFM")
    factor = 2 ** (len(c.unet_mult) - 1)
    side = {"cifar10": 32, "mnist": 28, "colored-mnist": 28, "digits": 8}.get(c.data, c.image_size)
    need(side % factor == 0, "unet_mult", f"{len(c.unet_mult)} resolutions halve the "
         f"{side} x {side} images {len(c.unet_mult) - 1} times: {side} is not divisible by "
         f"{factor}; use fewer levels")
    need(c.image_size >= 4, "image_size", "must be at least 4 pixels")


def _validate_dcfm(c: RunConfig, need) -> None:
    for key in ("local_steps", "dcfm_rounds", "dcfm_steps", "distill_steps", "teacher_steps",
                "fedflow_rounds", "fedflow_local_steps"):
        need(getattr(c, key) >= 1, key, "must be a positive integer")
    need(c.dcfm_teacher in DCFM_TEACHERS, "dcfm_teacher",
         f"must be one of {', '.join(DCFM_TEACHERS)} (docs/dcfm.md)")
    need(c.dcfm_network in DCFM_NETWORKS, "dcfm_network",
         f"must be one of {', '.join(DCFM_NETWORKS)}")
    need(c.dcfm_network != "unet" or c.data != "modes2d", "dcfm_network",
         "the U-Net takes images; modes2d is 2D points: use mlp or auto")
    factor = 2 ** (len(c.unet_mult) - 1)
    need(not c.dcfm_unet or c.data != "colored-digits" or 8 % factor == 0, "unet_mult",
         f"{len(c.unet_mult)} resolutions halve colored-digits' 8 x 8 images "
         f"{len(c.unet_mult) - 1} times; use at most 4 levels")
    need(c.ci_weight >= 0, "ci_weight", "must be >= 0 (0 disables the CI penalty)")
    for key in ("p_full", "p_marginal", "p_uncond"):
        need(0 <= getattr(c, key) <= 1, key, "must be a probability in [0, 1]")
    need(abs(c.p_full + c.p_marginal + c.p_uncond - 1) < 1e-9, "p_uncond",
         "p_full + p_marginal + p_uncond must sum to 1")
    need(0 < c.coverage <= 1, "coverage", "must be in (0, 1]")
    need(c.eval_classifier_epochs >= 0, "eval_classifier_epochs",
         "must be >= 0 (0 skips the image scores)")


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Convert a TOML or CLI value to the field's type, or name the key that is wrong."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{name} = {value!r}: expected true or false")
    if name in PATH_LISTS:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{name} = {value!r}: expected a list of file paths")
        return tuple(items)
    if isinstance(default, tuple):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{name} = {value!r}: expected a list such as [1, 2, 4]")
        try:
            return tuple(int(v) for v in items)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} = {value!r}: expected a list of integers") from None
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and kind is not str:
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{name} = {value!r}: expected {kind.__name__}") from None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r}: expected {kind.__name__}")
    return value


def config_from_dict(values: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Build a config from ``values`` on top of ``base`` (defaults when None)."""
    base = base or RunConfig()
    known = {f.name: f for f in fields(RunConfig)}
    changes = {}
    for name, value in values.items():
        if name not in known:
            hint = (did_you_mean(name, known)
                    or "; secureffm run --help lists every key (as --key)")
            raise ConfigError(f"unknown config key {name!r}{hint}")
        changes[name] = _coerce(name, value, getattr(base, name))
    return dataclasses.replace(base, **changes)


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML file at ``path`` as a table; a missing or malformed file is a ConfigError that
    calls it a ``what`` file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{what} file {str(path)!r} is not valid TOML: {err}") from None


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read ``path`` (TOML, flat keys) if given, then apply ``overrides`` (the CLI's options)."""
    config = RunConfig()
    if path is not None:
        values = read_toml(path, "config")
        nested = [k for k, v in values.items() if isinstance(v, dict)]
        if nested:
            raise ConfigError(f"config file {str(path)!r}: tables are not used, move the keys "
                              f"of [{nested[0]}] to the top level")
        config = config_from_dict(values, config)
    overrides = dict(overrides or {})
    if overrides.get("client_data") and "data" not in overrides:
        # --client-data alone names the clients' own tables, or (folders) their image folders
        folders = Path(overrides["client_data"][0]).is_dir()
        overrides["data"] = IMAGE_FOLDER if folders else CLIENT_DATA
    return config_from_dict(overrides, config)


def write_config(config: RunConfig, path: Path) -> None:
    """Write the resolved config so that ``--config path`` reproduces the run."""
    path.write_text(tomli_w.dumps(config.to_dict()))


def config_fields() -> list[dataclasses.Field]:
    """The config's fields, in declaration order (the CLI builds one option per field)."""
    return list(fields(RunConfig))

