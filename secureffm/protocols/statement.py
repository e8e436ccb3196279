"""What a run's privacy.json states: the unit and adjacency of any DP claim, the protection of
each message kind its clients send, the trust each protection needs, what no claim covers
(``exclusions``), and whether any claim holds at all (``insecure_deterministic``).

Every run writes one, so a reader can tell "no DP" from "DP file lost". The DP part holds only
where a ``dp`` stage protects a kind; the other stages' claims are not DP and say so. A run made
with ``--insecure-deterministic`` keeps the sentences but each says, first, that it does not
hold (:data:`INSECURE`); :func:`mark_randomness` is the one place that marks them.
"""

from __future__ import annotations

from ..federation.parties import secret_randomness
from .neighbourhood import describe
from .protocol import Protocol

__all__ = ["privacy_statement", "mark_randomness", "INSECURE", "SYBIL"]

# Leads every claim, trust and DP sentence of a run made with --insecure-deterministic; also
# the line the commands print and the audits show.
INSECURE = ("DOES NOT HOLD in this run: it was made with --insecure-deterministic, so every "
            "party's secret streams (DP noise and sampling, per-example draws, rounding, "
            "randomized t) derive from the seed that config.toml publishes")
# What distributed noise assumes of the clients that count toward the threshold.
SYBIL = ("no Sybils: the clients counted toward the threshold are distinct parties the server "
         "does not control. A server that registers clients of its own (or learns their noise) "
         "reaches the threshold with fewer honest shares, and the sum then carries less noise "
         "than accounted; the clients cannot detect this")


def _secagg_trust(stage) -> str:
    """The trust secure aggregation needs, as its spec's ``adversary`` variant provides."""
    colluders = ("fewer than the threshold of a client's share holders collude with the "
                 "server")
    sized_for = describe(stage.neighbours, stage.tolerance)[1]
    colluders += f"; {sized_for}" if sized_for else ""
    if stage.adversary == "malicious":
        return (f"{colluders}; against a malicious server (adversary = \"malicious\": keys "
                "signed by pinned identities, a consistency round) a substituted key, a split "
                "view or other parameters make the clients refuse, but it can drop clients "
                "down to the threshold and abort any round (docs/protocols.md)")
    return (f"{colluders}; the server follows the protocol (adversary = \"semi-honest\": no "
            "signed keys and no consistency round, so a server that substitutes keys or tells "
            "clients different survivor sets can unmask a client's input)")


def _stage_claim(stage, kind: str) -> tuple[str, str]:
    """(what the stage does for ``kind``, the trust it needs) in words."""
    if stage.name == "dp":
        s = stage.settings
        if s.noise == "distributed":
            return ("DP-SGD with distributed Skellam noise: each client adds a share inside "
                    "secure aggregation; the sum is DP, a single update is not (distributed_"
                    "noise below)",
                    f"at least the secagg threshold of clients survive each round, at most "
                    f"{s.colluders} of them reveal their noise to the server, and {SYBIL}")
        return ("DP-SGD with local Gaussian noise: each client's update is DP on its own",
                "none beyond the client's own code: it answers each (task, round) once, only in "
                "the rounds its own run config plans, and never past its own target, whatever "
                "the server asks")
    if stage.name == "secagg":
        return (f"secure aggregation (threshold {stage.threshold}, "
                f"{describe(stage.neighbours, stage.tolerance)[0]}, adversary = "
                f"\"{stage.adversary}\"): the server "
                "learns only the weighted sum of the survivors' updates; it adds no DP by itself",
                _secagg_trust(stage))
    if stage.name == "ckks":
        return ("CKKS homomorphic aggregation: the server adds ciphertexts and holds no secret "
                "key; a decryptor client returns the weighted sum of the uploads; it adds no DP "
                "by itself",
                "no client colludes with the server (every client holds the one shared secret "
                "key and could decrypt any upload the server saw); an honest-but-curious server "
                "(a deviating one can ask a decryptor to decrypt a single upload)")
    if stage.name == "sealed":
        return ("sealed end to end for its recipients and signed by its author: the relay can "
                "neither read nor forge it; every recipient reads it in full",
                "recipients are trusted with what they receive; sizes, timing and recipient "
                "sets stay visible")
    if stage.name == "randomized-t":
        return (f"randomized t in [{stage.t_low}, {stage.t_high}] and distances only at the "
                "end: the server does not know t. Not a formal guarantee (docs/fedwad.md "
                "measures what it can still reconstruct)",
                "t is drawn from the client's secret stream")
    return (f"stage {stage.name}", "see docs/protocols.md")


def _exclusions(protocol: Protocol, dp_kinds: list[str]) -> list[str]:
    """What no claim of ``protocol`` covers, whatever the method."""
    out = ["message sizes, timing and who talks to whom: no protocol hides them"]
    if dp_kinds:
        sampler = ("the Skellam shares (numpy's floating-point Poisson sampler)"
                   if protocol.dp.settings.noise == "distributed" else
                   "the Gaussian noise (torch's floating-point generator)")
        out += [f"floating-point noise sampling: {sampler} is neither a discrete nor a secure "
                "sampler; attacks on its low-order bits (Mironov 2012) are not mitigated and "
                "no bound covers its tails",
                "client-level DP: the unit is one example of a client's shard; a client's "
                "whole shard (whether it takes part at all) is not protected, its updates may "
                "move by the per-example bound times its number of examples"]
    if any(s.name == "secagg" for s in protocol.stages):
        out.append("a malicious client's input: secure aggregation cannot check the range of "
                   "a masked input (no range proofs), so one client can move each coordinate of "
                   "the sum by up to about n x clip (the range n clients' clipped inputs are "
                   "decoded from; under distributed noise any residue), not by one input's "
                   "clip; DP bounds what the sum reveals of honest clients' examples, not this")
    return out


def _distributed(protocol: Protocol, accounting: dict) -> dict:
    """What distributed noise rests on, per the run: the secagg threshold (shares of a group),
    the minimum honest survivors m, tau, each client's share variance and the sum's (quantization
    levels squared, per coordinate, per kind), and the Sybil assumption. ``accounting``: the
    ledger's report with ``tau`` (client -> multiplier)."""
    stage = next(s for s in protocol.stages if s.name == "secagg")
    clients = len(accounting["tau"])
    group = stage.group_size(clients)
    needed = stage.shares_needed(group)
    m = needed - protocol.dp.settings.colluders
    sums = {}
    for row in accounting["clients"].values():
        for kind, steps in row.get("skellam_schedule", {}).items():
            sums[kind] = max([sums.get(kind, 0.0), *(s["variance"] for s in steps)])
    return {"threshold": needed, "group": group, "clients": clients,
            "colluders": protocol.dp.settings.colluders, "honest_survivors_min": m,
            "tau": max(accounting["tau"].values()),
            "share_variance": {k: v / m for k, v in sums.items()},
            "sum_variance": sums,
            "units": "quantization levels squared, per coordinate",
            "rule": "each client adds Skellam noise of variance (tau x largest L2 sensitivity)^2 "
                    "/ m, so any sum the server can unmask carries at least (tau x L2)^2",
            "sybil": SYBIL}


def mark_randomness(statement: dict, deterministic: bool) -> dict:
    """``statement`` with ``secret_randomness`` and ``insecure_deterministic``; when
    ``deterministic``, every claim, trust and DP sentence led by :data:`INSECURE` (but those
    that claim nothing: "none: ...") and each client's ``target_held`` False with the reason
    (the accounting stays, as arithmetic)."""
    statement = {"insecure_deterministic": deterministic, **statement,
                 "secret_randomness": secret_randomness(deterministic)}
    if not deterministic:
        return statement

    def marked(sentence: str) -> str:  # "none: ..." claims nothing, and stays true
        return sentence if sentence.startswith("none:") else f"{INSECURE}. {sentence}"

    statement["dp"] = marked(statement["dp"])
    statement["trust"] = [marked(t) for t in statement["trust"]]
    statement["mechanisms"] = {kind: {**m, "claims": [marked(c) for c in m["claims"]]}
                               for kind, m in statement["mechanisms"].items()}
    if "clients" in statement:
        statement["clients"] = {c: {**row, "target_held": False, "target_held_why": INSECURE}
                                for c, row in statement["clients"].items()}
    return statement


def privacy_statement(protocol: Protocol, kinds: tuple[str, ...], *, deterministic: bool,
                      nominal_records: float | None = None, sample_rate: float | None = None,
                      accounting: dict | None = None,
                      exclusions: tuple[str, ...] = ()) -> dict:
    """The privacy.json of a run whose clients send ``kinds`` under ``protocol``.

    ``deterministic``: the run was made with ``--insecure-deterministic`` (then no claim
    holds, :func:`mark_randomness`); ``nominal_records``: the public nominal shard size that
    q, the weights and the DP divisor use, and ``sample_rate``: that q (under DP);
    ``accounting``: the ledger's report (epsilon per client and kind, and the multiplier per
    client as ``noise_multiplier``), merged at the top level, the multiplier named ``tau``
    under distributed noise; ``exclusions``: what the run sends that no claim covers, after
    the protocol's own.
    """
    mechanisms, trust = {}, []
    dp_kinds = []
    for kind in kinds:
        stages = [s for s in protocol.stages if kind in s.protects]
        claims = [_stage_claim(s, kind) for s in stages]
        if any(s.name == "dp" for s in stages):
            dp_kinds.append(kind)
        mechanisms[kind] = {
            "stages": [s.name for s in stages],
            "claims": [c for c, _ in claims] or
                      ["none: the server (and any relay) reads this message in the clear"],
        }
        trust += [t for _, t in claims if t not in trust]
    nominal = "" if nominal_records is None else f"{nominal_records:g}"
    rate = "" if sample_rate is None else f" (q = {sample_rate:.6g})"
    statement = {
        "protocol": protocol.name,
        "unit": "one example (row) of one client's shard" if dp_kinds else None,
        "adjacency": (f"add or remove one example; the sampling rate q{rate}, the update "
                      f"weights and the DP divisor use the public nominal shard size {nominal}, "
                      "never a client's true size" if dp_kinds else None),
        "dp": (f"DP on kinds {', '.join(dp_kinds)}" if dp_kinds else
               "none: no DP mechanism runs; the claims below are not differential privacy"),
        "mechanisms": mechanisms,
        "trust": trust,
        "exclusions": [*_exclusions(protocol, dp_kinds), *exclusions],
    }
    if dp_kinds:
        statement.update(nominal_shard_size=nominal_records, sample_rate=sample_rate)
    accounting = dict(accounting or {})
    if dp_kinds and protocol.dp.settings.noise == "distributed" and (
            "noise_multiplier" in accounting):
        accounting["tau"] = accounting.pop("noise_multiplier")
        statement["distributed_noise"] = _distributed(protocol, accounting)
    return mark_randomness({**statement, **accounting}, deterministic)
