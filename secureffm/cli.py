"""The ``secureffm`` command. Thin: parse, build a config, call the library.

Only the light modules (the config, its names, the errors) load with this one: a command
imports what it runs (torch, numpy, the audit) when it runs, so ``--help`` starts fast."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from . import __version__
from .config import (
    ADAPTIVE_SOLVERS,
    DCFM_DATA,
    DCFM_METHODS,
    DCFM_NETWORKS,
    DCFM_TEACHERS,
    ENGINES,
    METHODS,
    PARTITIONS,
    PATH_LISTS,
    PRECISIONS,
    WEIGHTINGS,
    config_fields,
    load_config,
)
from .errors import RunInterrupted, SecureFFMError
from .names import ACCOUNTANTS, IMAGE_DATA, IMAGE_LABELS, PAIRS, SILO_DATA, UNET_LAYOUTS
from .spelling import did_you_mean

__all__ = ["main", "build_parser"]

_HELP = {
    "client_data": "a client's own table (.csv with a header, .npy, .parquet) or image folder "
                   "(PNG/JPEG): repeat once per client, in client order; implies --data table "
                   "(files) or image-folder (folders) (docs/data.md)",
    "schema": "the public schema (TOML) of a run on the clients' own tables: columns, types, "
              "public bounds (draft one with secureffm schema infer)",
    "holdout": "public fraction of its rows each client holds out to evaluate the model on its "
               "own side",
    "target_column": "a schema column whose machine-learning efficacy (train on synthetic, test "
                     "on real held-out rows) each client scores",
    "method": "federated FFM (vanilla, lot, got), a centralized baseline (icfm, otcfm), or "
              "DCFM and its baselines (docs/dcfm.md)",
    "clients": "number of clients",
    "protocol": "a shipped protocol or the path of a .toml spec (docs/protocols.md)",
    "threat_model": "fault injection: a threat_models/ name or a .toml path (default: none)",
    "keep_payloads": "also keep every delivered payload in payloads.bin for audits",
    "target_epsilon": "DP budget per client at --delta; sigma is calibrated to it (0: spec's)",
    "allow_weak_privacy": "accept a target epsilon above 20, which excludes nothing an "
                          "attacker could measure (docs/privacy.md)",
    "delta": "DP delta (0: the protocol spec's)",
    "noise_multiplier": "DP noise multiplier sigma instead of calibrating (0: spec's)",
    "max_grad_norm": "DP per-example L2 clip C, Opacus' max_grad_norm (0: the dp stage's clip)",
    "accountant": "the accountant that calibrates sigma and enforces the target (default: the "
                  "dp stage's; privacy.json reports both)",
    "canaries": "AUDIT RUN: plant this many gradient canaries (fair coins) in the clients' "
                "shards for the one-run DP audit; the coins go to canaries.safetensors",
    "data": "a source-target pair (2D), an image set (docs/images.md), a DCFM data set "
            "(docs/dcfm.md) or table (the clients' own files, --client-data)",
    "partition": "how the pool is split into the clients' shards",
    "rounds": "communication rounds (one global step each)",
    "batch_size": "mini-batch size per client and step",
    "device": "where tensors live",
    "out": "run folder (default runs/<method>-<protocol>-<data>-s<seed>)",
    "pin_to": "also write the run's pin (log head, key fingerprints) to this file, kept apart "
              "from the run folder; secureffm audit --verify RUN --parties FILE checks it",
    "overwrite": "replace the files of an earlier run in the run folder (else it must be empty)",
    "insecure_deterministic": "INSECURE, debugging only: derive every party's secret random "
                              "streams (DP noise and sampling, rounding, t) from --seed, which "
                              "config.toml publishes; recorded in config.toml and privacy.json",
    "nfe": "comma-separated Euler step counts for evaluation",
    "shard_size": "points each client draws once (pool = clients x shard_size)",
    "weighting": "lambda_i proportional to shard size or uniform (uniform under DP or secure "
                 "aggregation, whatever this says: docs/protocols.md)",
    "eval_samples": "generated and held-out target points for exact W2",
    "engine": "inprocess (every party in this process) or flower (each client a Flower node "
              "with its own keys and data, on Flower's simulation engine; docs/flower.md)",
    "phase_timeout": "seconds a phase waits for remote clients' replies (engine flower)",
    "threads": "torch CPU threads (small models run fastest on one, above all on a busy CPU)",
    "local_steps": "DCFM stage-I (and DDM) training steps per client",
    "dcfm_rounds": "DCFM-A rounds R: all-gather of the experts, then --dcfm-steps local steps",
    "dcfm_steps": "DCFM-A local steps per round (peer CI penalty, Eq. 14)",
    "distill_steps": "DCFM-B student steps on the server (Eq. 17)",
    "teacher_steps": "Euler steps of DCFM-B's teacher paths",
    "dcfm_teacher": "DCFM-B teacher paths: observed (Eq. 15 as it reads), marginal (unobserved "
                    "y along Eq. 5 over the experts' marginals) or anchored (unobserved y along "
                    "Eq. 5 anchored on an observed combination; docs/dcfm.md)",
    "fedflow_rounds": "FedFlow FedAvg rounds",
    "fedflow_local_steps": "FedFlow local steps per client and round",
    "ci_weight": "lambda: weight of the conditional-independence penalty (DCFM, +L baselines)",
    "p_full": "label masking (Eq. 8): probability of the full label",
    "p_marginal": "label masking: probability of keeping one attribute",
    "p_uncond": "label masking: probability of the unconditional label",
    "guidance": "per-attribute guidance weight w_i of Eq. 5 when sampling",
    "coverage": "fraction of attribute combinations observed (colored-digits)",
    "data_dir": "folder of local image files for --data cifar10 | mnist | colored-mnist "
                "(never downloaded; docs/images.md)",
    "image_size": "side of the synthetic --data shapes images, and the public side of an "
                  "image-folder run's images",
    "image_channels": "channels of an image-folder run's images (1 or 3): public",
    "image_labels": "an image-folder run's labels: each file name's prefix before _, or the "
                    "labels.csv (file,label) in each client's folder",
    "unet_width": "U-Net base width (paper's CIFAR-10: 128)",
    "unet_mult": "U-Net width multipliers, one per resolution (paper: 1,2,2,2)",
    "unet_blocks": "U-Net residual blocks per resolution (paper: 2)",
    "unet_attention": "resolutions with self-attention, in pixels (paper: 16)",
    "lr_warmup": "FFM: rounds over which the velocity's lr rises linearly (paper's CIFAR-10: "
                 "5000; 0: none)",
    "unet_layout": "compact (one skip per level) or guided (the paper's torchcfm U-Net: 35.75M "
                   "parameters at width 128, mult 1,2,2,2, 2 blocks, attention 16)",
    "precision": "auto: bf16 autocast for images on CUDA, else fp32",
    "sample_every": "rounds between sample grids samples/round-N.png (0: only samples.png)",
    "checkpoint_every": "rounds between checkpoint.safetensors writes (0: only at the end)",
    "resume": "an FFM run folder (or its checkpoint.safetensors) to continue, also one that was "
              "interrupted; counts every round its log charged; give a new --out",
    "fid_weights": "pytorch-fid Inception weights (.pth) at a local path; else a labelled "
                   "classifier-feature fallback",
    "dirichlet_alpha": "concentration of --partition dirichlet (smaller: more skewed shards)",
    "seed": "seed of the public choices (data, partition, initialisation); the parties' secret "
            "streams come from OS entropy unless --insecure-deterministic",
    "progress": "print a progress line while training",
    "lr": "learning rate of the velocity field (Adam)",
    "hidden": "hidden width of the 2D velocity MLP",
    "ema_decay": "decay of the velocity's exponential moving average (0: none)",
    "potential_hidden": "hidden width of the dual potential f_phi",
    "potential_lr": "learning rate of the dual potential",
    "potential_every": "rounds between updates of the dual potential",
    "candidates": "candidate targets per source point of the c-transform",
    "ctransform_steps": "gradient steps refining the c-transform (0: candidates only)",
    "ctransform_lr": "step size of those refinement steps",
    "adaptive_solver": "torchdiffeq solver of the adaptive-step evaluation",
    "adaptive_tol": "its relative and absolute tolerance",
    "trajectories": "source points whose paths trajectories.png draws",
    "dcfm_network": "DCFM's networks: auto (the U-Net on colored-mnist, else the MLP)",
    "eval_classifier_epochs": "epochs of the attribute classifier that scores DCFM's images "
                              "(0: samples.png only)",
}

# The option groups of ``run`` (and of every command that takes a run's options), in order;
# each config field is in exactly one (tests/test_cli.py).
GROUPS = {
    "what and where": ("method", "protocol", "data", "clients", "partition", "dirichlet_alpha",
                       "shard_size", "engine", "phase_timeout", "device", "threads", "seed"),
    "privacy": ("target_epsilon", "allow_weak_privacy", "delta", "noise_multiplier",
                "max_grad_norm", "accountant",
                "threat_model", "keep_payloads", "canaries", "insecure_deterministic"),
    "training": ("rounds", "batch_size", "lr", "lr_warmup", "hidden", "weighting", "ema_decay",
                 "progress"),
    "GOT (the dual potential and its c-transform)": (
        "potential_hidden", "potential_lr", "potential_every", "candidates", "ctransform_steps",
        "ctransform_lr"),
    "DCFM and its baselines (docs/dcfm.md)": (
        "local_steps", "dcfm_rounds", "dcfm_steps", "distill_steps", "teacher_steps",
        "dcfm_teacher", "dcfm_network", "fedflow_rounds", "fedflow_local_steps", "ci_weight",
        "p_full", "p_marginal", "p_uncond", "guidance", "coverage", "eval_classifier_epochs"),
    "images and U-Net (docs/images.md)": (
        "data_dir", "image_size", "unet_width", "unet_mult", "unet_blocks", "unet_attention",
        "unet_layout", "precision", "sample_every", "checkpoint_every", "resume",
        "fid_weights"),
    "tabular: the clients' own tables (docs/data.md)": (
        "client_data", "schema", "holdout", "target_column", "image_channels", "image_labels"),
    "evaluation": ("eval_samples", "nfe", "adaptive_solver", "adaptive_tol", "trajectories"),
    "output": ("out", "overwrite", "pin_to"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for an unknown option (its subcommands' parsers too)."""

    def parse_known_args(self, args=None, namespace=None):
        found, extras = super().parse_known_args(args, namespace)
        known = [flag for action in self._actions for flag in action.option_strings]
        for extra in extras:
            hint = did_you_mean(extra.split("=")[0], known) if extra.startswith("--") else ""
            if hint:
                self.error(f"unrecognized argument: {extra}{hint}")
        return found, extras


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; with ``only``, the options of that subcommand alone (``""``: of
    none), so that ``secureffm --help`` never loads what another subcommand's options need."""
    parser = _Parser(prog="secureffm", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate one method under one protocol",
                         usage="%(prog)s [--config FILE] [options]",
                         description="Train and evaluate one method under one protocol; every "
                         "option below is also a key of a --config file.")
    _fill(only, "run", _add_config_options, run)
    audit = sub.add_parser("audit", help="verify a run's signed, hash-chained message log "
                           "(against a pin kept apart), or print its pin")
    _fill(only, "audit", add_audit_arguments, audit)
    fedwad = sub.add_parser("fedwad", help="FedWAD: W_p between clients' data sets; the server "
                            "sees only interpolating measures (docs/fedwad.md)")
    _fill(only, "fedwad", add_fedwad_arguments, fedwad)
    sweep = sub.add_parser("sweep", help="a grid of methods x protocols x epsilons x seeds from "
                           "a sweep file: resumable, sweep.csv and the privacy-utility frontier "
                           "(docs/sweep.md)")
    _fill(only, "sweep", add_sweep_arguments, sweep)
    keys = sub.add_parser("flower-keys", help="provision each party's keys for a Flower "
                          "deployment, one folder per party (docs/flower.md)")
    keys.add_argument("folder", help="an empty folder: FOLDER/server/ (server.key, "
                      "parties.json), FOLDER/client-i/ (client-i.key, parties.json, the "
                      "SuperNode's supernode-auth.key and .pub)")
    keys.add_argument("--clients", type=int, required=True, help="number of clients")
    certs = sub.add_parser("flower-certs", help="a fresh CA and the SuperLink's TLS certificate "
                           "(ca.pem, superlink.pem, superlink.key) for a Flower deployment")
    certs.add_argument("folder", help="an empty folder for the certificates")
    certs.add_argument("--host", action="append", metavar="NAME_OR_IP",
                       help="a host name or IP address the SuperLink is reached at "
                            "(repeatable; default localhost and 127.0.0.1)")
    certs.add_argument("--days", type=int, default=365, help="validity in days")
    gather = sub.add_parser("flower-gather", help="copy the nodes' journals into a deployed "
                            "run's folder for secureffm audit --verify (docs/flower.md)")
    gather.add_argument("run", help="the run folder (messages.jsonl, parties.json)")
    gather.add_argument("journals", nargs="+", metavar="JOURNAL",
                        help="each node's journal file (its --node-config journal=PATH); its "
                             "owner is found by its signature")
    app = sub.add_parser("flower-app", help="write a Flower App folder that runs a run config "
                         "on a Flower deployment: flwr run FOLDER (docs/flower.md)")
    app.add_argument("folder", help="the app folder to write")
    app.add_argument("--keys", required=True, help="the server's keys folder (secureffm "
                     "flower-keys); each SuperNode names its own: --node-config keys=PATH")
    _fill(only, "flower-app", _add_config_options, app)
    sample = sub.add_parser("sample", help="synthetic rows (or 2D points) from a finished run "
                            "or an export, with a privacy notice beside them (docs/data.md)")
    sample.add_argument("run", help="a finished FFM run folder, or a folder secureffm export "
                        "wrote")
    sample.add_argument("--n", type=int, required=True, help="how many samples")
    sample.add_argument("--out", required=True, help="file to write: .csv, .npy or .parquet, "
                        "or for an image run a new folder of PNG files (and <out>.privacy.json "
                        "beside it)")
    sample.add_argument("--nfe", type=int, help="Euler steps (default: the run's largest "
                        "evaluated NFE, at most 100)")
    sample.add_argument("--seed", type=int, help="seed of the source noise, to repeat a draw "
                        "(default: OS entropy)")
    export = sub.add_parser("export", help="the run's velocity field as safetensors weights "
                            "with its config, schema and privacy.json (no pickle)")
    export.add_argument("run", help="a finished FFM run folder")
    export.add_argument("--out", required=True, help="a new folder")
    schema = sub.add_parser("schema", help="a tabular run's public schema (docs/data.md)")
    infer = schema.add_subparsers(dest="schema_command", required=True).add_parser(
        "infer", help="draft a schema from one data file (.csv, .npy, .parquet) for its owner "
        "to review: its bounds and categories come from the data and disclose it if published")
    infer.add_argument("file", help="a data file the owner holds")
    infer.add_argument("--out", help="write the draft here (else print it)")
    infer.add_argument("--max-categories", type=int, default=10, help="whole-number columns "
                       "with at most this many distinct values become categorical (default 10)")
    policy = sub.add_parser("flower-policy", help="write a Flower node's policy file from the "
                            "options of the run it agrees to: the node refuses a run config "
                            "that differs (docs/flower.md)")
    policy.add_argument("folder", metavar="FILE", help="the policy file to write (TOML)")
    _fill(only, "flower-policy", _add_config_options, policy)
    node = sub.add_parser(
        "flower-supernode", usage="%(prog)s [--idle-poll SECONDS] FLOWER_SUPERNODE_ARGUMENTS",
        help="Flower's own SuperNode with its idle wait capped (docs/flower.md, section 2)",
        description="Run Flower's flower-supernode with every other argument, as its own, in "
        "this process; the pull that found no message waits at most --idle-poll seconds "
        "instead of Flower's fixed 3 s, and so does the poll for the ClientApp's reply (0.5 "
        "s). Arguments: flower-supernode --help.")
    _fill(only, "flower-supernode", _add_supernode_arguments, node)
    return parser


def _fill(only: str | None, name: str, add, parser: argparse.ArgumentParser) -> None:
    """``add(parser)``: the options of subcommand ``name``, unless ``only`` names another."""
    if only is None or only == name:
        add(parser)


def _add_supernode_arguments(parser: argparse.ArgumentParser) -> None:
    """The option of ``secureffm flower-supernode``; the rest are Flower's."""
    from .federation.supernode import DEFAULT_S, FLOOR_S

    parser.add_argument("--idle-poll", type=float, default=DEFAULT_S, metavar="SECONDS",
                        help=f"an idle node's wait between pulls: it asks the SuperLink "
                        f"1/SECONDS times a second (at least {FLOOR_S}; default {DEFAULT_S})")


def _supernode_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed ``secureffm flower-supernode`` command line: its own options first
    (``--idle-poll``; ``--help`` alone), then ``flower_args``, every word after them, Flower's
    own, passed on as they are (argparse would take some of Flower's words for its own)."""
    end = argv.index("flower-supernode") + 1
    while end < len(argv) and argv[end].split("=")[0] == "--idle-poll":
        end += 1 if "=" in argv[end] else 2
    if argv[end:] in (["-h"], ["--help"]):
        end = len(argv)
    args = parser.parse_args(argv[:end])
    args.flower_args = argv[end:]
    return args


def _command_of(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option), or ``""``."""
    return next((word for word in argv if not word.startswith("-")), "")


def _choices() -> dict[str, tuple[str, ...]]:
    """The names each choice option takes (protocols: the shipped specs)."""
    from .specs import shipped

    return {"method": METHODS + DCFM_METHODS, "protocol": tuple(shipped("protocols")),
            "data": tuple(dict.fromkeys(PAIRS + IMAGE_DATA + SILO_DATA + DCFM_DATA)),
            "partition": PARTITIONS, "engine": ENGINES, "weighting": WEIGHTINGS,
            "device": ("auto", "cpu", "cuda"), "adaptive_solver": ADAPTIVE_SOLVERS,
            "precision": PRECISIONS, "unet_layout": UNET_LAYOUTS, "image_labels": IMAGE_LABELS,
            "dcfm_teacher": DCFM_TEACHERS, "dcfm_network": DCFM_NETWORKS,
            "accountant": ACCOUNTANTS}


def _option_help(name: str, default, choices: tuple[str, ...] | None) -> str:
    """An option's help: what it does, the names it takes, its default (when it has one)."""
    text = _HELP.get(name, "")
    if choices:
        text += f"; one of: {', '.join(choices)}"
    if isinstance(default, bool):
        text += f" (default: {'on' if default else 'off'})"
    elif default not in ("", ()) and "(default" not in text and "(0:" not in text:
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        text += f" (default: {shown})"
    return text.lstrip("; ")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and one option per run setting, in the :data:`GROUPS`."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML file of run settings; options below override it")
    fields = {f.name: f for f in config_fields()}
    choices = _choices()
    for title, names in GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            flag = "--" + name.replace("_", "-")
            default = fields[name].default
            text = _option_help(name, default, choices.get(name))
            if isinstance(default, bool):
                group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                   default=None, help=text)
            elif name in PATH_LISTS:
                group.add_argument(flag, dest=name, action="append", default=None,
                                   metavar="PATH", help=text)
            else:
                group.add_argument(flag, dest=name, default=None, help=text,
                                   metavar="NAME" if name in choices else name.upper())


def _config_of(args: argparse.Namespace):
    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("command", "config", "folder", "keys") and v is not None}
    return load_config(args.config, overrides)


def _flower_keys(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .federation.flower_tls import make_node_auth_key
    from .federation.keyfiles import provision_parties

    clients = [f"client-{i}" for i in range(1, args.clients + 1)]
    provision_parties(args.folder, clients)
    for client in clients:
        make_node_auth_key(Path(args.folder) / client)
    print(f"keys in {args.folder}/<party>/: hand each party only its own folder (server/ to "
          "the ServerApp's operator, client-i/ to client i's node); register each node's "
          "supernode-auth.pub with the SuperLink (flwr supernode register)")


def _flower_certs(args: argparse.Namespace) -> None:
    from .federation.flower_tls import make_certificates

    paths = make_certificates(args.folder, args.host or ["localhost", "127.0.0.1"], args.days)
    print(f"TLS: the SuperLink uses {paths['cert']} and {paths['key']} (keep the key on its "
          f"host); every SuperNode and flwr trust {paths['ca']}")


def _flower_gather(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .audit.verify import JOURNALS_DIR
    from .federation.journal import gather
    from .federation.keyfiles import load_registry

    copies = gather(args.journals, Path(args.run) / JOURNALS_DIR, load_registry(args.run))
    for owner, path in sorted(copies.items()):
        print(f"{owner}: {path}")


def _flower_app(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .federation.flower import write_app
    from .runs.flower_node import run_config_of
    from .runs.scaffold import run_folder

    config = _config_of(args)  # the ServerApp runs elsewhere: its run folder, absolute
    config = replace(config, out=str(run_folder(config).resolve()))
    write_app(Path(args.folder), "secureffm.runs.flower_server:main",
              "secureffm.runs.flower_node:serve", run_config_of(config, args.keys),
              admit="secureffm.runs.flower_node:hello")
    print(f"Flower App in {args.folder}: flwr run {args.folder} <superlink>")


def _schema_infer(args: argparse.Namespace) -> None:
    import textwrap

    from .data.schema import INFER_WARNING, infer_schema

    text = infer_schema(args.file, args.max_categories).to_toml()
    if args.out:
        if Path(args.out).exists():
            raise SecureFFMError(f"{args.out} already exists; pick another --out or remove it")
        comment = "".join(f"# {line}\n" for line in textwrap.wrap(INFER_WARNING, 98))
        Path(args.out).write_text(f"{comment}\n{text}")
        print(f"draft schema written to {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    print(f"WARNING: {INFER_WARNING}", file=sys.stderr)


def _sample(args: argparse.Namespace) -> None:
    from .runs.synthetic import load, write_samples

    notice = write_samples(load(args.run), args.n, args.out, args.nfe, args.seed)
    print(f"{args.n} samples in {args.out}; what holds of them: {notice}")


def _export(args: argparse.Namespace) -> None:
    from .runs.synthetic import export

    print(f"exported to {export(args.run, args.out)} (secureffm.load reads it)")
def _write_policy(run, path: str) -> None:
    """A node's policy file pinning ``run`` (RunConfig or FedWADRun)."""
    from .runs.flower_policy import policy_of, write_policy

    write_policy(policy_of(run), path)
    print(f"policy in {path}: keep it on the node's own disk and start the node with "
          f"--node-config \"policy='{Path(path).resolve()}' keys='DIR' journal='FILE'\"")


def _run(args: argparse.Namespace) -> None:
    from .runs import run
    from .runs.interrupt import terminate_raises
    from .runs.scaffold import pin_message
    from .runs.summary import summary_lines

    config = _config_of(args)
    with terminate_raises():
        result = run(config)
    evaluation = result.metrics["eval"]
    if "w2" in evaluation:
        print("W2 by NFE: " + ", ".join(f"{k}: {v:.3f}" for k, v in evaluation["w2"].items()))
    if "missing_mode_fraction" in evaluation:  # DCFM on modes2d
        print(f"missing-mode fraction: {evaluation['missing_mode_fraction']:.3f}")
    if "compositional_accuracy_novel" in evaluation:  # DCFM on colored digits or MNIST
        print("compositional accuracy: novel {:.3f}, held {:.3f}; Frechet distance ({}): novel "
              "{:.3g}, held {:.3g}".format(
                  evaluation["compositional_accuracy_novel"],
                  evaluation["compositional_accuracy_held"], evaluation["features"]["kind"],
                  evaluation["frechet_novel"], evaluation["frechet_held"]))
    for line in summary_lines(result.metrics["summary"]):
        print(line)
    print(f"run folder: {result.out}")
    print(pin_message(result.out, result.pin, config.pin_to))
    _insecure_line(result.metrics)


def _insecure_line(numbers: dict) -> None:
    """The last line of a run made with --insecure-deterministic: no privacy claim holds."""
    from .protocols.statement import INSECURE

    if numbers.get("insecure_deterministic"):
        print(f"INSECURE: no privacy claim of this run holds (privacy.json marks each one). "
              f"{INSECURE}")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``secureffm sweep``."""
    parser.add_argument("file", help="sweep file (TOML: [grid], [run], root, workers, attacks)")
    parser.add_argument("--workers", type=int, help="runs at a time (default: the file's)")
    parser.add_argument("--root", help="folder of the runs, sweep.csv and frontier.png "
                        "(default: the file's)")
    parser.add_argument("--smoke", action="store_true", help="tiny runs of the first seed, one "
                        "worker, under runs/smoke/<file name> unless --root: checks that the "
                        "sweep goes through; the numbers are not results")


def _sweep(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .sweep import load_sweep, run_sweep, smoke_spec, summary_table

    overrides = {k: v for k, v in (("workers", args.workers), ("root", args.root))
                 if v is not None}
    spec = load_sweep(args.file, overrides)
    if args.smoke:
        spec = smoke_spec(spec, Path(args.root or Path("runs", "smoke", Path(args.file).stem)))
    result = run_sweep(spec)
    print(summary_table(result.rows))
    print(f"sweep.csv: {result.csv}\nfrontier: {result.figure}")


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``secureffm audit``."""
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                        help="with --threat-model or --attack: the run folder to audit")
    parser.add_argument("--threat-model", metavar="NAME",
                        help="a threat_models/ name or .toml path: a verdict per claim (PASS, "
                             "FAIL, NOT COVERED), audit.md and audit_epsilon.png written into "
                             "RUN_DIR, exit 1 when a claim fails (docs/audit.md)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--verify", metavar="RUN_DIR",
                        help="run folder holding messages.jsonl and parties.json")
    action.add_argument("--pin", metavar="RUN_DIR",
                        help="print the run's pin (head, parties.json hash, key fingerprints) "
                             "as JSON, to keep apart from the folder")
    parser.add_argument("--expect-head", metavar="HASH",
                        help="with --verify or --threat-model: the head (sha256 of the "
                             "closing line) kept apart")
    parser.add_argument("--parties", metavar="PINNED_JSON",
                        help="with --verify or --threat-model: a pin file from --pin, or a "
                             "copy of parties.json kept apart from the run folder")
    parser.add_argument("--every-signature", action="store_true",
                        help="with --verify: verify every record's own signature instead of "
                             "authenticating records through their signers' signed links "
                             "(about 4x slower; also checks the sig fields links make "
                             "unnecessary, docs/log-format.md)")
    action.add_argument("--attack", action="append", metavar="NAME",
                        help="run an attack on RUN_DIR (repeatable): inversion (what the "
                             "server logged: a --keep-payloads run), membership (image runs, "
                             "and tabular runs on the clients' files), fedwad-reconstruction, "
                             "one-run (docs/audit.md)")
    parser.add_argument("--attack-option", action="append", default=[], metavar="KEY=VALUE",
                        help="with --attack: an option of the attack (e.g. steps=200)")


def _pin_from_args(args: argparse.Namespace):
    """The :class:`~.federation.pin.RunPin` that --parties and --expect-head give."""
    from .federation.pin import RunPin, is_hex, load_pin

    pin = load_pin(args.parties) if args.parties else RunPin()
    head = args.expect_head
    if head is None:
        return pin
    if not is_hex(head, 64):
        raise SecureFFMError(f"--expect-head {head!r} is not a sha256: give the 64 lowercase "
                             "hex digits printed at the end of the run or by --pin")
    if pin.head is not None and pin.head != head:
        raise SecureFFMError(f"--expect-head differs from the head in {args.parties}; give the "
                             "one you trust")
    return replace(pin, head=head)


def _attack_options(pairs: list[str]) -> dict:
    """KEY=VALUE pairs as keyword options; a VALUE that reads as JSON (a number, true) is one."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SecureFFMError(f"--attack-option {pair!r}: write KEY=VALUE, e.g. steps=200")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _attacks(args: argparse.Namespace) -> int:
    """Run each --attack on RUN_DIR and print {name: results} as JSON, then each attack's
    ``interpretation`` (plain words) as a paragraph of its own."""
    import textwrap

    from .audit.attacks import run_attack

    if not args.run_dir:
        raise SecureFFMError("--attack needs the run folder: secureffm audit --attack NAME "
                             "RUN_DIR")
    options = _attack_options(args.attack_option)
    found = {name: run_attack(args.run_dir, name, **options) for name in args.attack}
    words = {name: result.pop("interpretation") for name, result in found.items()
             if "interpretation" in result}
    print(json.dumps(found, indent=1))
    for name, text in words.items():
        print(f"\n{textwrap.fill(f'{name}: {text}', width=100)}")
    if any(result.get("accounted_is_guarantee") == 0 for result in found.values()):
        from .protocols.statement import INSECURE

        print(f"INSECURE: epsilon_accounted is not a guarantee. {INSECURE}")
    return 0


def _run_folder(path: str | None) -> str | None:
    """A run folder given as itself or as its log, ``RUN_DIR/messages.jsonl``."""
    if path is not None and Path(path).name == "messages.jsonl" and Path(path).is_file():
        return str(Path(path).parent)
    return path


def audit_command(args: argparse.Namespace) -> int:
    """Print the verdict(s), the pin or the attacks' results; 0 intact (every claim PASS or NOT
    COVERED; or attacked), 1 tampered (a claim FAILs), 2 when the folder, pin or threat model
    cannot be read or the options do not fit. RUN_DIR may also be given as its messages.jsonl."""
    from .audit.verify import pin_run, verify_run

    for name in ("run_dir", "verify", "pin"):
        setattr(args, name, _run_folder(getattr(args, name)))
    try:
        if args.every_signature and not args.verify:
            raise SecureFFMError("--every-signature goes with --verify RUN_DIR")
        if args.attack:
            if args.threat_model:
                raise SecureFFMError("--attack and --threat-model are separate audits; run one "
                                     "at a time")
            return _attacks(args)
        if args.threat_model:
            return _claims(args)
        if args.run_dir is not None or not (args.verify or args.pin):
            raise SecureFFMError("give --verify RUN_DIR, --pin RUN_DIR, RUN_DIR --threat-model "
                                 "NAME, or --attack NAME RUN_DIR")
        if args.pin:
            if args.expect_head or args.parties:
                raise SecureFFMError("--expect-head and --parties go with --verify, not --pin")
            print(json.dumps(pin_run(args.pin).as_dict(), indent=1, sort_keys=True))
            return 0
        report = verify_run(args.verify, _pin_from_args(args), links=not args.every_signature)
    except SecureFFMError as err:
        print(f"secureffm: error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


def _claims(args: argparse.Namespace) -> int:
    """``secureffm audit RUN_DIR --threat-model NAME``: print and write the claims report."""
    from .audit.claims import audit_claims
    from .audit.report import write_report
    from .audit.threat import load_adversary

    if args.run_dir is None or args.verify or args.pin:
        raise SecureFFMError("--threat-model takes the run folder as RUN_DIR: secureffm audit "
                             "RUN_DIR --threat-model NAME")
    report = audit_claims(args.run_dir, load_adversary(args.threat_model), _pin_from_args(args))
    print(report.summary())
    for path in write_report(report):
        print(f"wrote {path}")
    return 1 if report.failed else 0


def add_fedwad_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``secureffm fedwad``."""
    from .methods.fedwad import FedWADConfig
    from .runs.fedwad import FedWADRun

    add = parser.add_argument
    default = FedWADConfig()
    add("--data", default="gaussians", help="gaussians | digits (ignored with --client-file)")
    add("--client-file", dest="client_files", action="append", default=[], metavar="NPY",
        help="a client's samples, a .npy array [N, d]; give it once per client")
    add("--clients", type=int, default=2, help="clients (more than 2: the pairwise matrix)")
    add("--samples", type=int, default=1000, help="samples per client")
    add("--dim", type=int, default=2, help="dimension of gaussians")
    add("--p", type=int, default=default.p, help="W_p: 1 or 2")
    add("--iterations", type=int, default=default.iterations, help="K of Algorithm 1")
    add("--support", type=int, default=default.support_size,
        help="S atoms of the interpolating measures")
    add("--exact", action="store_true", help="exact interpolation (Eq. 5) instead of Eq. 10")
    add("--t-range", type=float, nargs=2, default=default.t_range, metavar=("LOW", "HIGH"),
        help="range of each random t without a randomized-t stage")
    add("--noise-std", type=float, default=default.noise_std,
        help="noise on returned support points without a randomized-t stage")
    add("--no-bracket", dest="bracket", action="store_false",
        help="no lower bound: clients do not release their rows' means and per-coordinate "
             "standard deviations")
    add("--protocol", default="plaintext", help="plaintext | fedwad-private | a .toml spec")
    add("--seed", type=int, default=0)
    add("--out", default="", help="run folder (default runs/fedwad-<protocol>-<data>-s<seed>)")
    add("--check-exact", action="store_true", help="also compute exact W_p with POT")
    add("--keep-payloads", action="store_true", help="keep delivered payloads in payloads.bin")
    add("--overwrite", action="store_true",
        help="replace the files of an earlier run in the run folder (else it must be empty)")
    add("--pin-to", default="", metavar="FILE",
        help="also write the run's pin (log head, key fingerprints) to FILE, kept apart from "
             "the run folder")
    add("--insecure-deterministic", action="store_true",
        help="INSECURE, debugging only: derive the clients' secret t and noise from --seed, "
             "which config.toml publishes (recorded in config.toml and result.json)")
    add("--engine", default="inprocess", help=_HELP["engine"])
    add("--phase-timeout", type=float, default=FedWADRun.phase_timeout,
        help=_HELP["phase_timeout"])
    add("--flower-app", default="", metavar="FOLDER",
        help="instead of running: write a Flower App folder that runs this FedWAD run on a "
             "Flower deployment (flwr run FOLDER; needs --keys; docs/flower.md)")
    add("--keys", default="", metavar="DIR",
        help="with --flower-app: the keys folder (secureffm flower-keys)")
    add("--flower-policy", default="", metavar="FILE",
        help="instead of running: write a Flower node's policy file pinning this FedWAD run "
             "(docs/flower.md)")


def _fedwad_app(run, folder: str, keys: str) -> None:
    """A Flower App folder for ``run`` (the ServerApp runs elsewhere: its folder, absolute)."""
    from pathlib import Path

    from .federation.flower import write_app
    from .runs.fedwad import fedwad_folder
    from .runs.flower_node import run_config_of

    if not keys:
        raise SecureFFMError("--flower-app needs --keys: the folder secureffm flower-keys wrote")
    run = replace(run, out=str(fedwad_folder(run).resolve()))
    write_app(Path(folder), "secureffm.runs.flower_server:main",
              "secureffm.runs.flower_node:serve", run_config_of(run, keys),
              admit="secureffm.runs.flower_node:hello")
    print(f"Flower App in {folder}: flwr run {folder} <superlink>")


def fedwad_command(args: argparse.Namespace) -> None:
    """Build the run from parsed options, run it, print the folder and the distance(s)."""
    import numpy as np

    from .methods.fedwad import FedWADConfig
    from .runs.fedwad import FedWADRun, run_fedwad
    from .runs.scaffold import pin_message

    config = FedWADConfig(p=args.p, iterations=args.iterations, support_size=args.support,
                          exact=args.exact, t_range=tuple(args.t_range),
                          noise_std=args.noise_std, seed=args.seed, bracket=args.bracket)
    run = FedWADRun(config, args.data, args.clients, args.samples, args.dim,
                    tuple(args.client_files), args.protocol, args.seed, args.out,
                    args.check_exact, args.keep_payloads, overwrite=args.overwrite,
                    insecure_deterministic=args.insecure_deterministic, pin_to=args.pin_to,
                    engine=args.engine, phase_timeout=args.phase_timeout)
    if args.flower_app:
        _fedwad_app(run, args.flower_app, args.keys)
        return
    if args.flower_policy:
        _write_policy(run, args.flower_policy)
        return
    if run.engine == "flower":
        from .runs.flower_server import run_on_flower  # Flower is an optional extra

        done = run_on_flower(run)
    else:
        done = run_fedwad(run)
    print(f"run folder: {done.out}")
    print(pin_message(done.out, done.pin, args.pin_to))
    if "distance" in done.result:
        line = f"FedWAD W_{args.p} <= {done.result['distance']:.6g} (an upper bound)"
        if done.result.get("lower_bound") is not None:
            line += (f", >= {done.result['lower_bound']:.6g} (a lower bound from the clients' "
                     "means and spreads)")
        if "exact" in done.result:
            line += (f"; exact {done.result['exact']:.6g}, relative error "
                     f"{done.result['max_relative_error']:.2%}")
        print(line)
        print(_vouch(done.result["accuracy"]))
    else:
        print(f"FedWAD W_{args.p} between clients {', '.join(done.result['clients'])}:")
        print(np.array2string(np.array(done.result["matrix"]), precision=4))
        gap = "whose gap the server does not know"
        if "lower_matrix" in done.result:
            print("and lower bounds from the clients' means and spreads:")
            print(np.array2string(np.array(done.result["lower_matrix"]), precision=4))
            gap = "above its lower bound"
        print(f"Each entry is an upper bound on W_p {gap}; to tighten: --support above "
              f"{args.support} and --iterations (docs/fedwad.md).")
    _insecure_line(done.result)


def _vouch(accuracy: dict) -> str:
    """The lines saying what a FedWAD result can vouch for and how to tighten it."""
    falling = accuracy["still_falling"]
    trend = ("" if falling is None else
             f" The best bound fell {falling:.2%} over the later half of the iterations.")
    gap = ("Its gap to W_p is not known to the server" if accuracy.get("bracket") is None else
           f"It is at most {accuracy['bracket']:.2%} above W_p (the bracket)")
    return (f"{gap}: {accuracy['support']} atoms set an error floor (docs/fedwad.md).{trend} "
            f"To tighten: {accuracy['tighten']}.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _command_of(argv)
    parser = build_parser(command)
    args = (_supernode_args(parser, argv) if command == "flower-supernode" else
            parser.parse_args(argv))
    if args.command in ("run", "fedwad", "sweep", "sample", "audit"):  # the ones that compute
        from .quiet import quiet_known_noise

        quiet_known_noise()
    try:
        if args.command == "run":
            _run(args)
        elif args.command == "audit":
            return audit_command(args)
        elif args.command == "fedwad":
            fedwad_command(args)
        elif args.command == "sweep":
            _sweep(args)
        elif args.command == "flower-keys":
            _flower_keys(args)
        elif args.command == "flower-certs":
            _flower_certs(args)
        elif args.command == "flower-gather":
            _flower_gather(args)
        elif args.command == "flower-app":
            _flower_app(args)
        elif args.command == "schema":
            _schema_infer(args)
        elif args.command == "sample":
            _sample(args)
        elif args.command == "export":
            _export(args)
        elif args.command == "flower-policy":
            _write_policy(_config_of(args), args.folder)
        elif args.command == "flower-supernode":
            from .federation.supernode import launch

            launch(args.flower_args, args.idle_poll)
    except RunInterrupted as err:
        print(f"secureffm: {err}", file=sys.stderr)
        return 130
    except SecureFFMError as err:
        print(f"secureffm: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
