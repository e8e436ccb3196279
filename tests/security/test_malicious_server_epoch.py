"""A malicious server against secure aggregation with keys agreed once (``setup = "once"``,
secagg/keys_once.py), 5 clients, t = 3, the malicious-server variant.

The adversary is the server party (``tests/security/malicious_server.py``): it rewrites what
it sends (signed with its own key), reads every reply, and rebuilds what it can from its view
alone: the victim's masked input y, seed shares (checked against the victim's commitment)
and the round seeds of the pairs the victim masked with. Each test first rebuilds the victim's
input from an honest round's view where the protocol hands the server those secrets (a
control that the reconstruction works), then plays the attack and asserts that the server's
best reconstruction is not within a few quantization steps of the input.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import secureffm.protocols.secagg.keys_once as epoch
from secureffm.audit.verify import verify_run
from secureffm.errors import ProtocolError
from secureffm.federation import deserialize_payload, serialize_payload
from secureffm.protocols.key_batch import commit
from secureffm.protocols.prg import expand_seed
from secureffm.protocols.secagg import epoch_session, round_label, round_seed
from secureffm.protocols.shamir import decode, share_from_bytes
from secureffm.protocols.wire import bytes_payload, json_payload, payload_bytes, payload_json
from tests.protocols.test_secagg import write_spec

from .malicious_server import KIND, LEAK_STEPS, federation

VICTIM = "client-1"
_SEALED_SHARE = 12 + 68 + 16


def epoch_federation(tmp_path, keep_payloads: bool = False, adversary: str = "malicious"):
    return federation(tmp_path, protocol=str(write_spec(tmp_path, setup="once", threshold=0.6,
                                                        protects=[KIND], adversary=adversary)),
                      keep_payloads=keep_payloads)


def reconstruct(fed, handed: dict[str, bytes] | None = None) -> np.ndarray | None:
    """The server's best reconstruction of the victim's input: its masked input minus the self
    mask (if t shares of the seed came back that match its commitment) and minus every pair
    mask whose round seed a peer revealed (or ``handed``: peer -> seed, the control); None
    when a secret is missing."""
    got = deserialize_payload(dict(fed.server.received("masked_input"))[VICTIM])
    y, committed = got["y"], got["b_commit"].tobytes()
    peers = json.loads(got["peers"].tobytes())
    replies = [(s, json.loads(payload_bytes(d, s)["json"]))
               for s, d in fed.server.received("unmask")]
    shares = [share_from_bytes(bytes.fromhex(r["b"][VICTIM])) for _, r in replies
              if VICTIM in r["b"]]
    seeds = {s: bytes.fromhex(r["k"][VICTIM]) for s, r in replies if VICTIM in r["k"]}
    seeds |= handed or {}
    try:
        seed = decode(shares, 3, lambda v: v < 2**256 and commit(v.to_bytes(32, "big"))
                      == committed).secret.to_bytes(32, "big")
    except ProtocolError:  # fewer than t shares, or none that match the commitment
        return None
    if set(seeds) != set(peers):
        return None
    q, order = fed.stage.quantizer, {c: i for i, c in enumerate(fed.ids)}
    y = q.sub_mod(y.astype(np.uint64), expand_seed(seed, y.size, q.bits))
    for v in peers:  # the victim added PRG(k) if it precedes v
        mask = expand_seed(seeds[v], y.size, q.bits)
        y = q.sub_mod(y, mask) if order[VICTIM] < order[v] else q.add_mod(y, mask)
    try:
        return q.dequantize_sum(y, 1) / fed.stage.scales(fed.weights)[VICTIM]
    except ProtocolError:  # not a quantized vector: a mask did not come off
        return None


def steps_off(fed, recovered) -> float:
    if recovered is None:
        return float("inf")
    scale = fed.stage.scales(fed.weights)[VICTIM]
    return float(np.abs(recovered - fed.updates[VICTIM]).max() * scale / fed.stage.quantizer.step)


def told_by_victim(fed) -> dict[str, bytes]:
    """Peer -> the round seed of its pair with the victim that the victim itself revealed."""
    return {v: bytes.fromhex(seed) for s, d in fed.server.received("unmask") if s == VICTIM
            for v, seed in json.loads(payload_bytes(d, s)["json"])["k"].items()}


def naming_dropped(data: bytes, recipient: str, left_out: set[str]) -> bytes:
    """The unmask request to ``recipient`` naming ``left_out`` dropped, their seed shares taken
    out of the routed shares (so that the request is well formed)."""
    fields = payload_bytes(data, "server")
    body = json.loads(fields["json"])
    authors = [w for w in body["survivors"] if w != recipient]
    blob = fields["shares"]
    kept = b"".join(blob[i * _SEALED_SHARE:(i + 1) * _SEALED_SHARE]
                    for i, w in enumerate(authors) if w not in left_out)
    body = {**body, "survivors": [u for u in body["survivors"] if u not in left_out],
            "dropped": sorted({*body["dropped"], *left_out})}
    return bytes_payload({"json": json.dumps(body, sort_keys=True).encode(), "shares": kept})


def without_victim(data: bytes, recipient: str) -> bytes:
    """The unmask request to ``recipient`` naming the victim dropped."""
    return naming_dropped(data, recipient, {VICTIM})


def test_the_reconstruction_works_where_the_protocol_hands_over_the_secrets(tmp_path):
    """Control: with the seed shares of an honest round and the victim's pair seeds handed
    over (as its peers reveal them for a client named dropped), the reconstruction gives the
    input; without the pair seeds it gives nothing."""
    fed = epoch_federation(tmp_path)
    assert fed.aggregate().included == fed.ids
    peers = [c for c in fed.ids if c != VICTIM]
    label = round_label(1, KIND)
    handed = {v: round_seed(epoch_session(fed.channel.endpoints[v].sessions, KIND)
                            .peers[VICTIM].pair_seed, label) for v in peers}
    assert steps_off(fed, reconstruct(fed, handed)) <= LEAK_STEPS
    assert reconstruct(fed) is None


def test_naming_a_client_dropped_after_its_masked_input_arrived_does_not_unmask_it(tmp_path):
    """Adversary: the late-arrival attack. The victim's masked input reached the server, which
    announces the others as the survivors (the victim refuses to sign a set without itself)
    and names the victim dropped in every unmask request, so each peer reveals its round seed
    with the victim. The self mask stays: no holder is asked for (or would open) the victim's
    seed share once it is named dropped."""
    fed = epoch_federation(tmp_path)
    others = [c for c in fed.ids if c != VICTIM]
    fed.server.tamper["consistency"] = lambda data, to: json_payload({"survivors": others})
    fed.server.tamper["unmask_request"] = without_victim
    fed.aggregate()
    fed.close_and_verify()
    replies = [json.loads(payload_bytes(d, s)["json"]) for s, d in fed.server.received("unmask")]
    assert sum(VICTIM in r["k"] for r in replies) == len(others)  # the peers revealed them
    assert steps_off(fed, reconstruct(fed)) > LEAK_STEPS


def test_a_split_view_of_the_victim_does_not_unmask_it(tmp_path, monkeypatch):
    """Adversary: client-4 and client-5 are told the victim dropped (so that they reveal their
    round seeds with it) while the victim, client-2 and client-3 are asked for its seed
    shares; the server asks every survivor at once. client-4 and client-5 signed the survivor
    set that names the victim and refuse a request that names it dropped: no round seed of
    the victim's pairs is revealed."""
    fed = epoch_federation(tmp_path)
    monkeypatch.setattr(epoch, "_unmask_holders", lambda stage, r, u3, gone, asked: [
        v for v in u3 if v not in asked])
    fed.server.tamper["unmask_request"] = lambda data, to: (
        without_victim(data, to) if to in ("client-4", "client-5") else data)
    fed.aggregate()
    fed.close_and_verify()
    replies = [json.loads(payload_bytes(d, s)["json"]) for s, d in fed.server.received("unmask")]
    assert not any(VICTIM in r["k"] for r in replies)
    refused = {e["sender"] for e in fed.client_refusals()
               if "are not those of the set it signed" in e["detail"]}
    assert refused == {"client-4", "client-5"}, fed.client_refusals()
    assert steps_off(fed, reconstruct(fed)) > LEAK_STEPS


def test_a_different_broadcast_to_one_client_is_refused_by_its_peers(tmp_path):
    """Adversary: model inconsistency (Pasquini et al., CCS 2022). The global model's gate
    is 0 for every client but the victim, to whom the server sends 1, so that the aggregate
    would be the victim's update alone. Each client signs the digest of the broadcasts it
    took with the survivor set; the holders find the victim's signature is not of their view
    and refuse, and the round aborts with the sum masked."""
    fed = epoch_federation(tmp_path)
    gate = {"gate": np.zeros(1, dtype=np.float32)}
    honest = serialize_payload(gate)
    fed.server.tamper["broadcast"] = lambda data, to: serialize_payload(
        {"gate": np.ones(1, dtype=np.float32)}) if to == VICTIM and data == honest else data
    result = fed.channel.aggregate(
        1, KIND, lambda c: {KIND: c.inbox["global_model"]["gate"][0] * fed.updates[c.id]},
        fed.weights, {KIND: ((50,), np.dtype(np.float32))}, broadcast={"global_model": gate})
    fed.channel.close()
    assert result.payload is None, "the round isolated the victim's update"
    report = verify_run(tmp_path)  # the audit names the broadcast as well
    assert not report.ok and "another global_model" in report.summary()
    assert fed.client_refusals(), "no client refused"
    assert any("did not confirm the survivor set, parameters, graph and broadcasts" in e["detail"]
               for e in fed.client_refusals())


# Issue 37: whom the server tells what. The victim is told t - 1 of its peers dropped; those
# peers get the honest request; the others are told the victim dropped.
TOLD_PEERS_DROPPED = {VICTIM: {"client-2", "client-3"}, "client-4": {VICTIM},
                      "client-5": {VICTIM}}


def play_issue_37(fed, monkeypatch) -> None:
    """The server of issue 37 (see below): it asks every survivor at once, each with the
    request of :data:`TOLD_PEERS_DROPPED`."""
    monkeypatch.setattr(epoch, "_unmask_holders", lambda stage, r, u3, gone, asked: [
        v for v in u3 if v not in asked])
    fed.server.tamper["unmask_request"] = lambda data, to: naming_dropped(
        data, to, TOLD_PEERS_DROPPED.get(to, set()))


@pytest.mark.parametrize("announced", ["one survivor set", "a set to fit each request"])
def test_telling_the_victim_its_peers_dropped_does_not_unmask_it(tmp_path, monkeypatch,
                                                                 announced):
    """Adversary: a malicious server alone, no client colluding (issue 37). It asks every
    survivor at once and tells the victim that t - 1 = 2 of its peers (client-2, client-3)
    dropped, so that the victim reveals its round seeds with them and its own share of its
    seed; client-2 and client-3 get the honest request and reveal their shares of the victim's
    seed; client-4 and client-5 are told the victim dropped and reveal their round seeds with
    it. Unchecked, that is t shares of the seed and all four pair seeds: the input, with no
    client refusing. Each survivor now signs the survivor set announced to it and answers only
    a request naming those survivors, each of whose signatures of that set it checks. The
    server announces one set to all, or to each client the set that fits its request: either
    way the victim, client-4 and client-5 refuse by name (and, split, the others too), the
    round aborts with the sum masked, and the audit names the split."""
    fed = epoch_federation(tmp_path, keep_payloads=True)
    play_issue_37(fed, monkeypatch)
    if announced == "a set to fit each request":
        fed.server.tamper["consistency"] = lambda data, to: json_payload({"survivors": [
            u for u in payload_json(data, "server")["survivors"]
            if u not in TOLD_PEERS_DROPPED.get(to, set())]})
    result = fed.aggregate()
    fed.channel.close()
    assert steps_off(fed, reconstruct(fed, told_by_victim(fed))) > LEAK_STEPS, (
        "the server read the victim's input")
    assert result.payload is None
    why = ("are not those of the set it signed" if announced == "one survivor set" else
           "did not confirm the survivor set")
    refused = {e["sender"] for e in fed.client_refusals()
               if e["phase"] == "unmask" and why in e["detail"]}
    assert {VICTIM, "client-4", "client-5"} <= refused, fed.client_refusals()
    report = verify_run(tmp_path)
    if announced == "one survivor set":
        assert report.ok, report.summary()
    else:
        assert refused == set(fed.ids)
        assert not report.ok and "another survivor set" in report.summary(), report.summary()


def test_under_the_semi_honest_variant_that_server_reads_the_input(tmp_path, monkeypatch):
    """Adversary: issue 37's server against ``adversary = "semi-honest"``, which has no
    consistency round and trusts the server to tell every client the same survivors: it
    reads the victim's input, no client refuses and the audit passes (what the variant's
    name says; docs/protocols.md)."""
    fed = epoch_federation(tmp_path, adversary="semi-honest")
    play_issue_37(fed, monkeypatch)
    fed.aggregate()
    fed.close_and_verify()
    assert steps_off(fed, reconstruct(fed, told_by_victim(fed))) <= LEAK_STEPS
    assert not fed.client_refusals()
