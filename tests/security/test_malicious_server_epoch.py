"""A malicious server against secure aggregation with keys agreed once (``setup = "once"``,
secagg_epoch.py), 5 clients, t = 3, the malicious-server variant.

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

import secureffm.protocols.secagg_epoch as epoch
from secureffm.audit.verify import verify_run
from secureffm.errors import ProtocolError
from secureffm.federation import deserialize_payload, serialize_payload
from secureffm.protocols.key_batch import commit
from secureffm.protocols.prg import expand_seed
from secureffm.protocols.secagg import epoch_session
from secureffm.protocols.secagg_epoch import round_label, round_seed
from secureffm.protocols.shamir import decode, share_from_bytes
from secureffm.protocols.wire import bytes_payload, payload_bytes
from tests.protocols.test_secagg import write_spec

from .malicious_server import KIND, LEAK_STEPS, federation

VICTIM = "client-1"
_SEALED_SHARE = 12 + 68 + 16


def epoch_federation(tmp_path):
    return federation(tmp_path, protocol=str(write_spec(tmp_path, setup="once", threshold=0.6,
                                                        protects=[KIND])))


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


def without_victim(data: bytes, recipient: str) -> bytes:
    """The unmask request to ``recipient`` naming the victim dropped, its seed share taken out
    of the routed shares (so that the request is well formed)."""
    fields = payload_bytes(data, "server")
    body = json.loads(fields["json"])
    authors = [w for w in body["survivors"] if w != recipient]
    blob = fields["shares"]
    kept = b"".join(blob[i * _SEALED_SHARE:(i + 1) * _SEALED_SHARE]
                    for i, w in enumerate(authors) if w != VICTIM)
    body = {**body, "survivors": [u for u in body["survivors"] if u != VICTIM],
            "dropped": sorted({*body["dropped"], VICTIM})}
    return bytes_payload({"json": json.dumps(body, sort_keys=True).encode(), "shares": kept})


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
    announces the others as the survivors and names the victim dropped in every unmask
    request, so each peer reveals its round seed with the victim. The self mask stays: no
    holder is asked for (or would open) the victim's seed share once it is named dropped."""
    fed = epoch_federation(tmp_path)
    others = [c for c in fed.ids if c != VICTIM]
    fed.server.tamper["unmask_request"] = without_victim
    fed.aggregate()
    fed.close_and_verify()
    replies = [json.loads(payload_bytes(d, s)["json"]) for s, d in fed.server.received("unmask")]
    assert sum(VICTIM in r["k"] for r in replies) == len(others)  # the peers revealed them
    assert steps_off(fed, reconstruct(fed)) > LEAK_STEPS


def test_a_split_view_of_the_victim_does_not_unmask_it(tmp_path, monkeypatch):
    """Adversary: client-4 and client-5 are told the victim dropped (so they reveal their
    round seeds with it) while the victim, client-2 and client-3 are asked for its seed
    shares; the server asks every survivor at once. It gets the seed and two of the four pair
    seeds: each peer reveals either its share of the seed or its pair seed, and reading the
    input needs every pair seed, so no consistency round is needed to stop this."""
    fed = epoch_federation(tmp_path)
    monkeypatch.setattr(epoch, "_unmask_holders", lambda stage, r, u3, *rest: list(u3))
    fed.server.tamper["unmask_request"] = lambda data, to: (
        without_victim(data, to) if to in ("client-4", "client-5") else data)
    fed.aggregate()
    fed.close_and_verify()
    replies = [json.loads(payload_bytes(d, s)["json"]) for s, d in fed.server.received("unmask")]
    assert sum(VICTIM in r["k"] for r in replies) == 2  # the split was played
    assert steps_off(fed, reconstruct(fed)) > LEAK_STEPS


def test_a_different_broadcast_to_one_client_is_refused_by_its_peers(tmp_path):
    """Adversary: model inconsistency (Pasquini et al., CCS 2022). The global model's gate
    is 0 for every client but the victim, to whom the server sends 1, so that the aggregate
    would be the victim's update alone. Each client signs the digest of the broadcasts it
    took with its masked input; the holders find the victim's signature is not of their view
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
    assert any("did not confirm the parameters, graph and broadcasts" in e["detail"]
               for e in fed.client_refusals())
