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
from .dp import SYBIL
from .protocol import Protocol

__all__ = ["privacy_statement", "mark_randomness", "INSECURE", "SYBIL"]

# Leads every claim, trust and DP sentence of a run made with --insecure-deterministic; also
# the line the commands print and the audits show.
INSECURE = ("DOES NOT HOLD in this run: it was made with --insecure-deterministic, so every "
            "party's secret streams (DP noise and sampling, per-example draws, rounding, "
            "randomized t) derive from the seed that config.toml publishes")


def _exclusions(protocol: Protocol, kinds: tuple[str, ...]) -> list[str]:
    """What no claim of ``protocol`` covers, whatever the method, when clients send ``kinds``:
    sizes and timing, then each stage's own exclusions (:meth:`.Stage.exclusions`), once."""
    out = ["message sizes, timing and who talks to whom: no protocol hides them"]
    for stage in protocol.stages:
        out += [line for line in stage.exclusions(kinds) if line not in out]
    return out


def _distributed(protocol: Protocol, accounting: dict) -> dict:
    """What distributed noise rests on, per the run: the secagg threshold (shares of a group),
    the minimum honest survivors m, tau, each client's share variance and the sum's (quantization
    levels squared, per coordinate, per kind), and the Sybil assumption. ``accounting``: the
    ledger's report with ``tau`` (client -> multiplier)."""
    stage = protocol.aggregator(protocol.dp.protects[0])  # the secagg stage carrying it
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
        claims = [s.claim(kind) for s in stages]
        if protocol.dp_for(kind) is not None:
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
        "exclusions": [*_exclusions(protocol, kinds), *exclusions],
    }
    if dp_kinds:
        statement.update(nominal_shard_size=nominal_records, sample_rate=sample_rate)
    accounting = dict(accounting or {})
    if dp_kinds and protocol.dp.settings.noise == "distributed" and (
            "noise_multiplier" in accounting):
        accounting["tau"] = accounting.pop("noise_multiplier")
        statement["distributed_noise"] = _distributed(protocol, accounting)
    return mark_randomness({**statement, **accounting}, deterministic)
