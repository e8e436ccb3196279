"""What a run's privacy.json states: the unit and adjacency of any DP claim, the protection of
each message kind its clients send, the trust each protection needs, and what is not covered.

Every run writes one, so a reader can tell "no DP" from "DP file lost". The DP part holds only
where a ``dp`` stage protects a kind; the other stages' claims are not DP and say so.
"""

from __future__ import annotations

from .protocol import Protocol

__all__ = ["privacy_statement"]


def _stage_claim(stage, kind: str) -> tuple[str, str]:
    """(what the stage does for ``kind``, the trust it needs) in words."""
    if stage.name == "dp":
        s = stage.settings
        if s.noise == "distributed":
            return ("DP-SGD with distributed Skellam noise: each client adds a share inside "
                    "secure aggregation; the sum is DP, a single update is not",
                    f"at least the secagg threshold of clients survive each round and at most "
                    f"{s.colluders} of them reveal their noise to the server")
        return ("DP-SGD with local Gaussian noise: each client's update is DP on its own",
                "none beyond the client's own code (holds whatever the server does)")
    if stage.name == "secagg":
        return (f"secure aggregation (threshold {stage.threshold}, neighbours "
                f"{stage.neighbours or 'all'}): the server learns only the weighted sum of the "
                "survivors' updates; it adds no DP by itself",
                "fewer than the threshold of a client's share holders collude with the server; "
                "an honest-but-curious server (docs/protocols.md lists what a malicious one can "
                "do)")
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


def privacy_statement(protocol: Protocol, kinds: tuple[str, ...], *,
                      secret_randomness: str, nominal_records: int | None = None,
                      accounting: dict | None = None,
                      exclusions: tuple[str, ...] = ()) -> dict:
    """The privacy.json of a run whose clients send ``kinds`` under ``protocol``.

    ``nominal_records``: the public nominal shard size that q, the weights and the DP divisor
    use (under DP); ``accounting``: the ledger's report (epsilon per client and kind), merged
    at the top level; ``exclusions``: what the run sends that no claim covers.
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
    statement = {
        "protocol": protocol.name,
        "unit": "one example (row) of one client's shard" if dp_kinds else None,
        "adjacency": (f"add or remove one example; the sampling rate q, the update weights and "
                      f"the DP divisor use the public nominal shard size {nominal_records}, "
                      "never a client's true size" if dp_kinds else None),
        "dp": (f"DP on kinds {', '.join(dp_kinds)}" if dp_kinds else
               "none: no DP mechanism runs; the claims below are not differential privacy"),
        "mechanisms": mechanisms,
        "trust": trust,
        "exclusions": list(exclusions),
        "secret_randomness": secret_randomness,
    }
    return {**statement, **(accounting or {})}
