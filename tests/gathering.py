"""All-gather as the tests read it: what each recipient kept."""

from __future__ import annotations


def gather(channel, round_: int, kind: str, compute) -> dict[str, dict]:
    """``channel.all_gather``, then recipient -> author -> payload as each recipient kept it
    (:meth:`~secureffm.federation.parties.Client.peers`); asserts that the server's account of
    the accepted copies is what the recipients kept."""
    accepted = channel.all_gather(round_, kind, compute)
    kept = {client.id: client.peers(round_, kind) for client in channel.clients}
    assert {r: sorted(a) for r, a in accepted.items()} == {r: sorted(k) for r, k in kept.items()}
    return kept
