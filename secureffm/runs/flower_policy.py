"""A Flower node's own policy: what its client agrees to run, kept in a TOML file on the node's
own disk (its node config's ``policy``), never taken from the server.

On Flower the server side submits the run config every node receives. A node compares what
that run config asks with its :class:`Policy` and refuses any difference by name
(:func:`secureffm.runs.flower_node.check_run_config`); it then builds its client from its own
copy of the protocol spec, whose digest the policy pins. A policy file:

.. code-block:: toml

    protocol = "dp-secagg"            # the spec's name
    protocol_sha256 = "3f1c..."       # sha256 of the spec's canonical bytes
    # spec_file = "my-spec.toml"      # a spec that is not shipped: its path on this node
    method = "got"
    rounds = 200
    kinds = ["dual_update", "gradient"]  # what the client sends from its data
    target_epsilon = 8.0              # DP, as resolved (the spec's, or the run's override)
    delta = 1e-05
    clip = 1.0                        # the per-example clip (--max-grad-norm overrides it)
    # noise_multiplier = 1.0          # absent: calibrated to target_epsilon
    accountant = "rdp"                # calibrates sigma and enforces the target
    threshold = 0.6                   # each secure-aggregation stage's, in the spec's order
    # schema_sha256 = "9d2e..."       # a run on the clients' own tables: the public schema

A field absent from the file is one the run must not set either (no DP, no threshold, no
round count). ``secureffm flower-policy FILE`` writes the file from the options of a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from ..config import DCFM_METHODS, RunConfig, read_toml
from ..data.schema import Schema
from ..data.silo import CLIENT_DATA
from ..errors import PolicyError, SecureFFMError
from ..methods.ffm import FFMSettings
from ..protocols.protocol import build_protocol
from ..protocols.registry import ProtocolSpec, read_spec
from .fedwad import FedWADRun
from .scaffold import resolve_dp
from .silo import EVALUATION

__all__ = ["Policy", "policy_of", "read_policy", "write_policy", "own_spec", "differences",
           "PINNED"]

# The fields a run config must match (every field of Policy but where the spec file is).
PINNED = ("protocol", "protocol_sha256", "method", "rounds", "kinds", "target_epsilon", "delta",
          "clip", "noise_multiplier", "accountant", "threshold", "schema_sha256")
# The config field that counts a method's rounds (FFM's ``rounds`` otherwise; DCFM-B and DDM
# have none: their clients train ``local_steps`` and publish).
_ROUNDS = {"dcfm-a": "dcfm_rounds", "fedflow": "fedflow_rounds", "fedflow-l": "fedflow_rounds",
           "dcfm-b": None, "ddm": None, "ddm-l": None}
# Rounds a method's requests run past its round count: FedWAD's final distance comes in round
# iterations + 1; DCFM-A's experts are first published in round 1, before its all-gathers.
_EXTRA_ROUNDS = {"fedwad": 1, "dcfm-a": 1}


@dataclass(frozen=True)
class Policy:
    """What a node's client runs. ``protocol``: the spec's name; ``protocol_sha256``: its
    :attr:`~secureffm.protocols.registry.ProtocolSpec.sha256`; ``spec_file``: where the node
    reads a spec that is not shipped ("" for a shipped one); ``rounds``: the method's round
    count (None where it has none); ``kinds``: the message kinds the client sends from its
    data, sorted; the DP fields as the run resolves them (None without DP; a None
    ``noise_multiplier`` is calibrated to ``target_epsilon``); ``threshold``: each
    secure-aggregation stage's, in spec order (a fraction of the group, or a count);
    ``schema_sha256``: a run on the clients' own tables: the public schema's digest (its
    clients also send their ``evaluation`` once, in the round after the last).
    ``source``: the file it was read from ("" when derived from a run)."""

    protocol: str
    protocol_sha256: str
    method: str
    rounds: int | None
    kinds: tuple[str, ...]
    target_epsilon: float | None = None
    delta: float | None = None
    clip: float | None = None
    noise_multiplier: float | None = None
    accountant: str | None = None
    threshold: tuple[float, ...] = ()
    schema_sha256: str = ""
    spec_file: str = ""
    source: str = ""

    @property
    def last_round(self) -> int | None:
        """The last round a request of the pinned run carries (None: no round count)."""
        if self.rounds is None:
            return None
        return self.rounds + _EXTRA_ROUNDS.get(self.method, 0) + bool(self.schema_sha256)


def _kinds(config: RunConfig | FedWADRun) -> tuple[str, ...]:
    """The kinds a run's clients send from their data (what DP and aggregation must cover)."""
    if isinstance(config, FedWADRun):
        return ("measure", "scalar")
    if config.method in DCFM_METHODS:  # DCFMSettings.kind
        return ("update",) if config.method.startswith("fedflow") else ("model",)
    if config.data == CLIENT_DATA:  # and each client's scores of the released model
        return (*FFMSettings.of(config).sent_kinds, EVALUATION)
    return FFMSettings.of(config).sent_kinds


def _rounds(config: RunConfig | FedWADRun) -> int | None:
    if isinstance(config, FedWADRun):
        return config.fedwad.iterations
    field = _ROUNDS.get(config.method, "rounds")
    return None if field is None else getattr(config, field)


def policy_of(config: RunConfig | FedWADRun, spec: ProtocolSpec | None = None,
              schema: Schema | None = None) -> Policy:
    """What a run of ``config`` under ``spec`` (default: the spec ``config.protocol`` names)
    and, on the clients' own tables, ``schema`` (default: ``config.schema``'s) asks of a
    client: the policy a node that agrees to it pins."""
    spec = spec or read_spec(config.protocol)
    kinds = _kinds(config)
    dp = None
    digest = ""
    if isinstance(config, RunConfig):
        dp = resolve_dp(config, build_protocol(spec), tuple(k for k in kinds if k != EVALUATION))
        if config.data == CLIENT_DATA:
            digest = (schema or Schema.load(config.schema)).digest()
    else:
        build_protocol(spec)  # its stages' parameters checked
    shipped = not (config.protocol.endswith(".toml") or "/" in config.protocol)
    return Policy(
        protocol=spec.name, protocol_sha256=spec.sha256, method=getattr(config, "method", "fedwad"),
        rounds=_rounds(config), kinds=tuple(sorted(kinds)),
        target_epsilon=dp.target_epsilon if dp else None, delta=dp.delta if dp else None,
        clip=dp.clip if dp else None, noise_multiplier=dp.noise_multiplier if dp else None,
        accountant=dp.accountant if dp else None,
        threshold=tuple(t["threshold"] for t in spec.stages if "threshold" in t),
        schema_sha256=digest, spec_file="" if shipped else str(Path(config.protocol).resolve()))


def write_policy(policy: Policy, path: str | Path) -> None:
    """``policy`` as a TOML file (a None field left out; one threshold written as a number)."""
    values = {k: v for k, v in dataclasses.asdict(policy).items()
              if k != "source" and v not in (None, "", ())}
    values["kinds"] = list(policy.kinds)
    if policy.threshold:
        values["threshold"] = (policy.threshold[0] if len(policy.threshold) == 1
                               else list(policy.threshold))
    head = ("# A Flower node's policy (secureffm flower-policy; docs/flower.md): the node refuses "
            "a run\n# whose config differs from any field below.\n")
    Path(path).write_text(head + tomli_w.dumps(values))


def read_policy(path: str | Path) -> Policy:
    """The policy in ``path``; an unknown, missing or mistyped field is a PolicyError naming it.
    A relative ``spec_file`` is relative to the policy file's folder."""
    try:
        values = read_toml(path, "policy")
    except SecureFFMError as err:
        raise PolicyError(str(err)) from None
    where = f"policy file {str(path)!r}"
    known = {f.name for f in dataclasses.fields(Policy)} - {"source"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise PolicyError(f"{where}: unknown field {unknown[0]!r}; fields: {', '.join(PINNED)}, "
                          "spec_file")
    missing = [k for k in ("protocol", "protocol_sha256", "method", "kinds") if k not in values]
    if missing:
        raise PolicyError(f"{where}: missing field {missing[0]!r}; write the file with "
                          "secureffm flower-policy")

    def typed(key: str, kinds: tuple[type, ...]):
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise PolicyError(f"{where}: {key} = {value!r}; expected "
                              f"{' or '.join(k.__name__ for k in kinds)}")
        return float(value) if float in kinds and value is not None else value

    threshold = values.get("threshold", [])
    thresholds = threshold if isinstance(threshold, list) else [threshold]
    kinds = values["kinds"]
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise PolicyError(f"{where}: kinds = {kinds!r}; expected a list of message kinds")
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in thresholds):
        raise PolicyError(f"{where}: threshold = {threshold!r}; expected a number or a list")
    spec_file = typed("spec_file", (str,)) or ""
    if spec_file and not Path(spec_file).is_absolute():
        spec_file = str(Path(path).resolve().parent / spec_file)
    return Policy(
        protocol=typed("protocol", (str,)), protocol_sha256=typed("protocol_sha256", (str,)),
        method=typed("method", (str,)), rounds=typed("rounds", (int,)),
        kinds=tuple(sorted(kinds)), target_epsilon=typed("target_epsilon", (int, float)),
        delta=typed("delta", (int, float)), clip=typed("clip", (int, float)),
        noise_multiplier=typed("noise_multiplier", (int, float)),
        accountant=typed("accountant", (str,)), threshold=tuple(thresholds),
        schema_sha256=typed("schema_sha256", (str,)) or "", spec_file=spec_file,
        source=str(path))


def own_spec(policy: Policy) -> ProtocolSpec:
    """The node's own copy of the protocol spec (``spec_file``, else the shipped spec named
    ``protocol``), refused unless its name and digest are the policy's."""
    try:
        spec = read_spec(policy.spec_file or policy.protocol)
    except SecureFFMError as err:
        raise PolicyError(f"policy {policy.source!r}: its protocol spec does not load: "
                          f"{err}") from None
    if (spec.name, spec.sha256) != (policy.protocol, policy.protocol_sha256):
        raise PolicyError(f"policy {policy.source!r} pins protocol {policy.protocol!r} with "
                          f"sha256 {policy.protocol_sha256}, but this node's spec "
                          f"{spec.source} is {spec.name!r} with sha256 {spec.sha256}: the spec "
                          "changed on this node's disk; check it, then rewrite the policy")
    return spec


def differences(policy: Policy, asked: Policy) -> list[str]:
    """Every pinned field where ``asked`` (what a run asks) differs from ``policy``, as
    ``field: policy X, run config Y``."""
    return [f"{key}: policy {getattr(policy, key)!r}, run config {getattr(asked, key)!r}"
            for key in PINNED if getattr(policy, key) != getattr(asked, key)]
