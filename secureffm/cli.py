"""The ``secureffm`` command. Thin: parse, build a config, call the library."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING

from .audit.verify import add_arguments as add_audit_arguments
from .audit.verify import audit_command
from .config import config_fields, load_config
from .errors import SecureFFMError
from .fedwad_run import add_arguments as add_fedwad_arguments
from .fedwad_run import fedwad_command
from .runtime import pin_message

__all__ = ["main", "build_parser"]

_HELP = {
    "method": "vanilla | lot | got (federated FFM), icfm | otcfm (centralized baselines), "
              "dcfm-a | dcfm-b | fedflow | fedflow-l | ddm | ddm-l (DCFM, docs/dcfm.md)",
    "protocol": "protocol name (shipped spec) or path to a .toml spec",
    "threat_model": "fault injection: a threat_models/ name or a .toml path (default none)",
    "keep_payloads": "also keep every delivered payload in payloads.bin for audits",
    "target_epsilon": "DP budget per client at --delta; sigma is calibrated to it (0: spec's)",
    "delta": "DP delta (0: the protocol spec's)",
    "noise_multiplier": "DP noise multiplier sigma instead of calibrating (0: spec's)",
    "data": "source-target pair, e.g. 8gaussians-moons, uniform-8gaussians",
    "partition": "disjoint | iid | dirichlet",
    "rounds": "communication rounds (one global step each)",
    "batch_size": "mini-batch size per client and step",
    "device": "auto | cpu | cuda",
    "out": "run folder (default runs/<method>-<protocol>-<data>-s<seed>)",
    "pin_to": "also write the run's pin (log head, key fingerprints) to this file, kept apart "
              "from the run folder; secureffm audit --verify RUN --parties FILE checks it",
    "overwrite": "replace the files of an earlier run in the run folder (else it must be empty)",
    "insecure_deterministic": "INSECURE, debugging only: derive every party's secret random "
                              "streams (DP noise and sampling, rounding, t) from --seed, which "
                              "config.toml publishes; recorded in config.toml and privacy.json",
    "nfe": "comma-separated Euler step counts for evaluation",
    "shard_size": "points each client draws once (pool = clients x shard_size)",
    "weighting": "lambda_i proportional to shard size or uniform",
    "eval_samples": "generated and held-out target points for exact W2",
    "threads": "torch CPU threads (small models run fastest on one, above all on a busy CPU)",
    "local_steps": "DCFM stage-I (and DDM) training steps per client",
    "dcfm_rounds": "DCFM-A rounds R: all-gather of the experts, then --dcfm-steps local steps",
    "dcfm_steps": "DCFM-A local steps per round (peer CI penalty, Eq. 14)",
    "distill_steps": "DCFM-B student steps on the server (Eq. 17)",
    "teacher_steps": "Euler steps of DCFM-B's teacher paths",
    "fedflow_rounds": "FedFlow FedAvg rounds",
    "fedflow_local_steps": "FedFlow local steps per client and round",
    "ci_weight": "lambda: weight of the conditional-independence penalty (DCFM, +L baselines)",
    "p_full": "label masking (Eq. 8): probability of the full label",
    "p_marginal": "label masking: probability of keeping one attribute",
    "p_uncond": "label masking: probability of the unconditional label",
    "guidance": "per-attribute guidance weight w_i of Eq. 5 when sampling",
    "coverage": "fraction of attribute combinations observed (colored-digits)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="secureffm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate one method under one protocol")
    run.add_argument("--config", help="TOML file of run settings; options below override it")
    for f in config_fields():
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        if isinstance(default, bool):
            run.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                             default=None, help=_HELP.get(f.name, f"default {default}"))
        else:
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            run.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                             help=f"{_HELP.get(f.name, '')} (default {shown})".strip())
    audit = sub.add_parser("audit", help="verify a run's signed, hash-chained message log "
                           "(against a pin kept apart), or print its pin")
    add_audit_arguments(audit)
    fedwad = sub.add_parser("fedwad", help="FedWAD: W_p between clients' data sets; the server "
                            "sees only interpolating measures (docs/fedwad.md)")
    add_fedwad_arguments(fedwad)
    return parser


def _run(args: argparse.Namespace) -> None:
    from .run import run

    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("command", "config") and v is not None}
    config = load_config(args.config, overrides)
    result = run(config)
    print(f"run folder: {result.out}")
    print(pin_message(result.out, result.pin, config.pin_to))
    evaluation = result.metrics["eval"]
    if "w2" in evaluation:
        print("W2 by NFE: " + ", ".join(f"{k}: {v:.3f}" for k, v in evaluation["w2"].items()))
    if "missing_mode_fraction" in evaluation:  # DCFM on modes2d
        print(f"missing-mode fraction: {evaluation['missing_mode_fraction']:.3f}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            _run(args)
        elif args.command == "audit":
            return audit_command(args)
        elif args.command == "fedwad":
            fedwad_command(args)
    except SecureFFMError as err:
        print(f"secureffm: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
