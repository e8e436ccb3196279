"""SecAggStage: exact mean under dropouts, what the server sees, refusals, faults.

Every expectation is computed here from the fault set and the threshold rule
``max(2, ceil(frac * |S(u)|))`` (an integer threshold is used as is), never read back from
the stage; the reference mean is the plaintext mean in float64, at equal weights (the only
ones secure aggregation takes: tests/security/test_server_weights.py).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import pytest
import torch
from hypothesis import event as hypothesis_event
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import secureffm.protocols.key_batch as key_batch
import secureffm.protocols.secagg as secagg
from secureffm.errors import MessageError, ProtocolError
from secureffm.federation import Client, MessageLog, deserialize_payload
from secureffm.federation.crypto import (
    agree,
    new_key_pair,
    open_sealed,
    private_bytes,
    private_from_bytes,
)
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.parties import Registry
from secureffm.protocols import load_protocol
from secureffm.protocols.key_batch import PROOF_FIELDS
from secureffm.protocols.neighbourhood import Tolerance
from secureffm.protocols.prg import add_masks, expand_seed, word_dtype
from secureffm.protocols.quantize import Quantizer
from secureffm.protocols.secagg import SecAggStage, harary_neighbours, per_round
from secureffm.protocols.secagg import server as secagg_server
from secureffm.protocols.secagg import session as secagg_session
from secureffm.protocols.secagg.common import CHANNEL_LABEL, MASK_LABEL
from secureffm.protocols.secagg.session import ClientSession, Peer
from secureffm.protocols.shamir import reconstruct_bytes, share_from_bytes, share_to_bytes
from secureffm.protocols.wire import bytes_payload, json_payload, payload_bytes
from secureffm.runs.scaffold import open_channel
from tests.protocols.test_prg import reference_masked

CLIENT_PHASES = ("advertise_keys", "share_keys", "masked_input", "consistency_sign", "unmask")
LEVELS = 2**22
KIND = "gradient"


# -- helpers ---------------------------------------------------------------------------------

def _toml(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def write_spec(directory: Path, **stage) -> Path:
    """A one-stage secagg spec; ``stage`` overrides the defaults (None removes a key)."""
    table = {"stage": "secagg", "protects": [KIND], "threshold": 0.6, "neighbours": 0,
             "clip": 8.0, "levels": LEVELS, "bits": 32}
    table.update(stage)
    lines = ['name = "test-secagg"', "", "[[stages]]"]
    lines += [f"{key} = {_toml(value)}" for key, value in table.items() if value is not None]
    path = Path(directory) / "spec.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def make_clients(n: int) -> list[Client]:
    return [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator().manual_seed(i))
            for i in range(1, n + 1)]


def make_channel(directory: Path, clients, spec: Path, faults=(), keep_payloads=False):
    log = MessageLog(Path(directory) / "messages.jsonl", keep_payloads=keep_payloads)
    plan = FaultPlan(name="test", faults=tuple(faults))
    return open_channel(load_protocol(str(spec)), clients, log, plan), log


def run_round(channel, updates: dict[str, np.ndarray], weights: dict[str, float]):
    d = next(iter(updates.values())).size
    return channel.aggregate(1, KIND, lambda c: {KIND: updates[c.id]}, weights,
                            {KIND: ((d,), np.dtype(np.float32))})


def read_records(directory: Path) -> list[dict]:
    text = (Path(directory) / "messages.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def logged_payloads(directory: Path, phase: str | None = None) -> list[tuple[dict, bytes]]:
    """(record, payload bytes as sent) of every delivery, optionally of one phase."""
    blob = (Path(directory) / "payloads.bin").read_bytes()
    return [(r, blob[r["offset"]:r["offset"] + r["bytes"]]) for r in read_records(directory)
            if r["kind"] != "event" and (phase is None or r["phase"] == phase)]


def plain_mean(updates, weights, ids) -> np.ndarray:
    total = sum(weights[c] for c in ids)
    return sum(weights[c] * updates[c].astype(np.float64) for c in ids) / total


def shares_needed(threshold, group: int) -> int:
    """The spec's rule, in exact arithmetic: max(2, ceil(frac * group)) or the integer."""
    if isinstance(threshold, int):
        return threshold
    return max(2, math.ceil(Fraction(str(threshold)) * group))


def uniform_updates(n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"client-{i}": rng.uniform(-3, 3, d).astype(np.float32) for i in range(1, n + 1)}


def tolerance(quantizer: Quantizer, weights, included, n) -> float:
    """The stage quantizes z_u = s_u x_u with s_u = w_u n / W (W: all weights). Stochastic
    rounding moves each coordinate by less than one level, so the dequantized sum is within
    error_bound(m) of sum_{u in I} z_u; dividing by sum_{u in I} s_u = n W_I / W gives
    |payload - mean| <= error_bound(m) * W / (n W_I), plus 2**-22 for rounding the output to
    float32 (|mean| <= 3 < 4, where one ulp is 2**-22: twice the rounding error)."""
    w_all = sum(weights.values())
    w_inc = sum(weights[c] for c in included)
    return quantizer.error_bound(len(included)) * w_all / (n * w_inc) + 2.0**-22


# -- 1. exactness under random dropouts ------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    n: int
    d: int
    threshold: float | int
    neighbours: int
    drops: tuple[tuple[int, str], ...]  # (client index from 0, phase); repeats allowed
    seed: int = 0


@st.composite
def scenarios(draw) -> Scenario:
    n = draw(st.integers(3, 12) | st.integers(3, 100))
    neighbours = draw(st.sampled_from([0, 0, 2, 4, 6]))
    thresholds = [0.6, 0.75, 1.0, 2, 3]
    group = n if neighbours == 0 or neighbours >= n - 1 else neighbours + 1
    threshold = draw(st.sampled_from([t for t in thresholds
                                      if group < 2 * shares_needed(t, group) <= 2 * group]))
    drops = tuple(draw(st.lists(st.tuples(st.integers(0, n - 1),
                                          st.sampled_from(CLIENT_PHASES)), max_size=n)))
    return Scenario(n, draw(st.integers(1, 50)), threshold, neighbours, drops,
                    draw(st.integers(0, 2**32 - 1)))


def _spread_drops(n: int, counts: dict[str, int]) -> tuple[tuple[int, str], ...]:
    """Deterministic drops for the large explicit examples: ``counts[phase]`` clients each."""
    order = random.Random(n).sample(range(n), sum(counts.values()))
    out, start = [], 0
    for phase, count in counts.items():
        out += [(i, phase) for i in order[start:start + count]]
        start += count
    return tuple(out)


@dataclass
class Expected:
    advertised: list[str]  # U1: the clients the server draws the graph over
    included: list[str] | None = None  # U3 when the round succeeds
    responders: set[str] | None = None  # who answers the unmask request
    aborted_at: str | None = None  # the phase whose threshold was missed
    threshold: int | None = None  # the number the abort reason must name


def expected_outcome(sc: Scenario, graph: dict[str, set[str]] | None) -> Expected:
    """The outcome from the faults and the threshold rule alone; ``graph`` is the neighbour
    graph the server drew (consulted only once the round got past the keys)."""
    ids = [f"client-{i}" for i in range(1, sc.n + 1)]
    rank = {phase: i for i, phase in enumerate(CLIENT_PHASES)}
    drop_at = {}
    for index, phase in sc.drops:  # a client goes offline at its earliest drop
        cid = ids[index]
        drop_at[cid] = min(drop_at.get(cid, 99), rank[phase])
    k = sc.neighbours + sc.neighbours % 2
    group = sc.n if k <= 0 or k >= sc.n - 1 else k + 1
    needed = shares_needed(sc.threshold, group)

    def alive_after(members, phase):
        return [c for c in members if drop_at.get(c, 99) > rank[phase]]

    u1 = alive_after(ids, "advertise_keys")
    out = Expected(u1)
    u2 = alive_after(u1, "share_keys")
    if len(u1) >= needed and len(u2) >= needed:
        assert graph is not None
        # A client masks only when shares of at least t - 1 neighbours were routed to it.
        u2_maskers = [u for u in u2 if len(graph[u] & set(u2)) + 1
                      >= shares_needed(sc.threshold, len(graph[u]) + 1)]
    else:
        u2_maskers = u2
    u3 = alive_after(u2_maskers, "masked_input")
    for phase, survivors in (("advertise_keys", u1), ("share_keys", u2), ("masked_input", u3)):
        if len(survivors) < needed:
            out.aborted_at, out.threshold = phase, needed
            return out
    # A survivor answers only when every survivor of its share group signed the survivor set
    # (the malicious-server variant's consistency round); one that left before signing makes
    # its whole group refuse.
    signers = set(alive_after(u3, "consistency_sign"))
    responders = {v for v in alive_after(u3, "unmask")
                  if (graph[v] | {v}) & set(u3) <= signers
                  and len((graph[v] | {v}) & set(u3))
                  >= shares_needed(sc.threshold, len(graph[v]) + 1)}
    # b_u of a survivor is held by u and its neighbours; s_sk of a dropped u by its neighbours.
    holders = [(u, graph[u] | {u}) for u in u3] + [(u, graph[u]) for u in u2 if u not in u3]
    for u, group_u in holders:
        t_u = shares_needed(sc.threshold, len(graph[u]) + 1)
        if len(responders & group_u) < t_u:
            out.aborted_at, out.threshold = "unmask", t_u
            return out
    out.included, out.responders = u3, responders
    return out


@settings(max_examples=25, deadline=None, database=None)
@given(sc=scenarios())
@example(sc=Scenario(60, 17, 0.6, 0,
                     _spread_drops(60, {"advertise_keys": 5, "share_keys": 5,
                                        "masked_input": 8, "unmask": 10}), 1))
@example(sc=Scenario(100, 5, 0.6, 6,
                     _spread_drops(100, {"advertise_keys": 4, "share_keys": 4,
                                         "masked_input": 6, "unmask": 2}), 2))
@example(sc=Scenario(50, 3, 0.6, 0,
                     _spread_drops(50, {"share_keys": 10, "masked_input": 11}), 3))
@example(sc=Scenario(50, 3, 0.6, 0,
                     _spread_drops(50, {"masked_input": 15, "unmask": 6}), 4))
# Boundaries of the rounding: ceil(0.6 * 4) = 3 survivors, ceil(0.6 * 7) = 5 responders.
@example(sc=Scenario(4, 3, 0.6, 0, ((0, "masked_input"), (1, "masked_input"))))
@example(sc=Scenario(7, 2, 0.6, 0, tuple((i, "unmask") for i in range(3))))
@example(sc=Scenario(7, 2, 0.6, 0, tuple((i, "unmask") for i in range(2))))
# A survivor leaving between its masked input and its signature: its group refuses, so the full
# graph aborts; under SecAgg+ only its neighbourhood refuses.
@example(sc=Scenario(6, 2, 0.6, 0, ((2, "consistency_sign"),)))
@example(sc=Scenario(30, 2, 0.6, 4, ((5, "consistency_sign"),), 5))
# t = |S(u)| under SecAgg+: a neighbour lost before sharing leaves its peers too few to mask with.
@example(sc=Scenario(6, 1, 1.0, 4, ((0, "share_keys"),)))
def test_secagg_is_exact_or_aborts_exactly_as_the_threshold_rule_says(sc):
    ids = [f"client-{i}" for i in range(1, sc.n + 1)]
    weights = dict.fromkeys(ids, 1.0)  # secure aggregation takes no other
    updates = uniform_updates(sc.n, sc.d, sc.seed)
    rng = np.random.default_rng(sc.seed)
    for cid in ids:  # the edges of the range, where a clipping or rounding bug would show
        updates[cid][rng.random(sc.d) < 0.1] = np.float32(rng.choice([-3.0, 3.0]))
    clip = 4.0  # no update is clipped: the mean stays exact
    graphs = []

    def spy(members, k, rng_):
        graph = real_harary(members, k, rng_)
        graphs.append((list(members), {u: set(v) for u, v in graph.items()}))
        return graph

    real_harary = secagg.harary_neighbours
    faults = [Fault("drop", ids[i], phase) for i, phase in sc.drops]
    with TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(secagg_server, "harary_neighbours", spy)
        spec = write_spec(tmp, threshold=sc.threshold, neighbours=sc.neighbours, clip=clip)
        channel, log = make_channel(tmp, make_clients(sc.n), spec, faults)
        result = run_round(channel, updates, weights)
        log.close()
    graph = graphs[0][1] if graphs else None
    want = expected_outcome(sc, graph)
    if graphs:  # the server drew its graph over exactly the clients that advertised keys
        assert graphs[0][0] == want.advertised
        u1 = set(want.advertised)
        if sc.neighbours == 0 or sc.neighbours >= len(u1) - 1:
            assert graph == {u: u1 - {u} for u in u1}
    hypothesis_event(f"aborted at {want.aborted_at}" if want.aborted_at else "exact")
    hypothesis_event("n >= 50" if sc.n >= 50 else "n < 50")
    events = [e["event"] for e in log.events]
    if want.aborted_at is None:
        assert result.reason == "" and "aborted" not in events
        assert result.included == want.included
        # Dropped means left out of the sum: a client that went offline only at unmask is in.
        assert set(result.dropped) == set(ids) - set(want.included)
        mean = plain_mean(updates, weights, want.included)
        got = result.payload[KIND]
        assert got.dtype == np.float32 and got.shape == (sc.d,)
        tol = tolerance(Quantizer(clip, LEVELS, 32), weights, want.included, sc.n)
        assert np.abs(got.astype(np.float64) - mean).max() <= tol
    else:
        assert result.payload is None and result.included == [], result.reason
        assert "aborted" in events
        numbers = re.findall(r"threshold is (\d+)|(\d+) needed", result.reason)
        assert numbers, result.reason
        assert int(next(x for x in numbers[0] if x)) == want.threshold, (want, result.reason)
        wording = {"advertise_keys": "clients advertised keys, threshold is",
                   "share_keys": "clients shared keys, threshold is",
                   "masked_input": "masked inputs arrived, threshold is",
                   "unmask": "came back"}
        assert wording[want.aborted_at] in result.reason


# -- 2. the server's view of a masked input is uniform ----------------------------------------

def _top_byte_p_value(words: np.ndarray) -> float:
    counts = np.bincount((words.astype(np.uint64) >> np.uint64(24)).astype(np.int64),
                         minlength=256)
    return float(chisquare(counts).pvalue)


def test_masked_inputs_look_uniform_to_the_server(tmp_path):
    n, d = 3, 20_000
    clients = make_clients(n)
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path), keep_payloads=True)
    zeros = {c.id: np.zeros(d, dtype=np.float32) for c in clients}
    result = run_round(channel, zeros, {c.id: 1.0 for c in clients})
    log.close()
    np.testing.assert_allclose(result.payload[KIND], 0.0, atol=1e-5)
    masked = {}
    for record, data in logged_payloads(tmp_path, "masked_input"):
        assert record["stages"] == ["secagg"] and record["recipient"] == "server"
        payload = deserialize_payload(data, record["sender"])
        assert list(payload) == ["y"] and payload["y"].dtype == np.uint32
        masked[record["sender"]] = payload["y"]
    assert sorted(masked) == [c.id for c in clients]
    for words in masked.values():  # 256 bins, about 78 per bin; a false alarm is 1e-4 each
        assert words.shape == (d,) and len(np.unique(words)) > d // 2
        assert _top_byte_p_value(words) > 1e-4
    first, second = masked["client-1"], masked["client-2"]
    assert not np.array_equal(first, second) and np.mean(first == second) < 0.01
    # The control: what client-1 would send unmasked (a quantized zero) is nowhere near uniform.
    quantizer = Quantizer(8.0, LEVELS, 32)
    plain = quantizer.quantize(np.zeros(d), np.random.default_rng(0)).astype(np.uint32)
    assert _top_byte_p_value(plain) < 1e-100


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(2, 5), bits=st.sampled_from([5, 24, 32, 40, 64]),
       d=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_each_client_masks_as_the_reference_says_in_any_peer_order(data, n, bits, d, seed):
    """``_ClientSession.mask_seeds`` (the seeds added and subtracted) with add_masks against
    the reference of test_prg, bit for bit, with the federation's order shuffled (who adds and
    who subtracts each pair mask) and the peers taken in any order; the pair masks cancel."""
    rng = random.Random(seed)
    clients = make_clients(n)
    ids = [c.id for c in clients]
    order = {u: i for i, u in enumerate(data.draw(st.permutations(ids)))}
    pair = {frozenset(p): rng.randbytes(32) for p in
            [(u, v) for i, u in enumerate(ids) for v in ids[i + 1:]]}
    quantizer = Quantizer(1.0, 2, bits)
    stage = SecAggStage((KIND,), 0.6, 0, quantizer, "semi-honest")
    total, summed, self_masks = np.zeros(d, dtype=object), np.zeros(d, dtype=object), []
    for client in clients:
        u = client.id
        session = ClientSession(client, Registry.of(clients), stage, 1, KIND)
        peers = data.draw(st.permutations([v for v in ids if v != u]))
        session.peers = {v: Peer(b"", pair[frozenset((u, v))], order[u] < order[v])
                         for v in peers}
        session.masks_with = tuple(peers)
        q = [rng.randrange(2**bits) for _ in range(d)]
        y = np.array(q, dtype=word_dtype(bits))
        add_masks(y, *session.mask_seeds())
        quantizer.reduce(y)
        plus = [session.self_seed] + [pair[frozenset((u, v))] for v in peers
                                      if order[u] < order[v]]
        minus = [pair[frozenset((u, v))] for v in peers if order[v] < order[u]]
        assert [int(w) for w in y] == reference_masked(q, plus, minus, bits)
        total += np.array(q, dtype=object)
        summed += y.astype(object)
        self_masks.append(session.self_seed)
    # sum_u y_u - sum_u PRG(b_u) = sum_u q_u: every pair mask was added once, subtracted once.
    assert [int(v) % 2**bits for v in summed] == reference_masked(list(total), self_masks, [],
                                                                   bits)


# -- 3. the server cannot read shares ---------------------------------------------------------

def test_the_relaying_server_cannot_read_the_shares(tmp_path, monkeypatch):
    """Record every key pair and Shamir share the clients make (spies, behaviour unchanged),
    then look for them in the bytes the server relayed."""
    pairs, splits = [], []
    real_pair, real_split = key_batch.new_key_pair, secagg_session.split_bytes

    def pair_spy():
        pair = real_pair()
        pairs.append(pair)
        return pair

    def split_spy(secret, t, count):
        shares = real_split(secret, t, count)
        splits.append((secret, shares))
        return shares

    monkeypatch.setattr(key_batch, "new_key_pair", pair_spy)
    monkeypatch.setattr(secagg_session, "split_bytes", split_spy)
    n = 4
    clients = make_clients(n)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, threshold=0.6),
                              [Fault("drop", "client-4", "masked_input")], keep_payloads=True)
    updates = uniform_updates(n, 8)
    weights = {cid: 1.0 for cid in ids}
    result = run_round(channel, updates, weights)
    log.close()
    assert result.included == ids[:3]
    # each client draws a batch of KEY_BATCH rounds' (channel, mask) pairs; round 1 is its first
    drawn = 2 * secagg.KEY_BATCH
    channel = {cid: pairs[drawn * i] for i, cid in enumerate(ids)}
    mask = {cid: pairs[drawn * i + 1] for i, cid in enumerate(ids)}
    owner = {private_bytes(mask[cid].private): cid for cid in ids}
    key_shares = {owner[s]: shares for s, shares in splits if s in owner}
    seed_shares = {cid: shares for cid, (_, shares) in
                   zip(ids, [x for x in splits if x[0] not in owner], strict=True)}
    assert len(key_shares) == len(seed_shares) == n

    def encoded(shares):
        return [share_to_bytes(s) for s in shares]

    relayed = [data for phase in ("share_keys", "shares")
               for _, data in logged_payloads(tmp_path, phase)]
    everything = b"".join(data for _, data in logged_payloads(tmp_path))
    for cid in ids:
        for blob in encoded(key_shares[cid]) + encoded(seed_shares[cid]):
            assert all(blob not in data for data in relayed)
        assert private_bytes(mask[cid].private) not in everything
    for cid in ids[:3]:  # a survivor's mask key is never revealed, not even one share
        assert all(blob not in everything for blob in encoded(key_shares[cid]))
    assert all(blob not in everything for blob in encoded(seed_shares["client-4"]))
    # Control: what unmask does reveal (survivors' seed shares) is found by the same search,
    assert any(blob in everything for blob in encoded(seed_shares["client-1"]))
    # and the ciphertext opens only with the pair's channel key, to exactly the two shares.
    u = "client-1"
    (data,) = [b for r, b in logged_payloads(tmp_path, "share_keys") if r["sender"] == u]
    sealed = deserialize_payload(data)["client-2"].tobytes()
    context = f"1|{KIND}|{u}|client-2".encode()
    key = agree(channel[u].private, channel["client-2"].public, CHANNEL_LABEL)
    position = ids.index("client-2")  # S(u) is every client, in client order
    assert open_sealed(key, sealed, context) == (share_to_bytes(key_shares[u][position])
                                                 + share_to_bytes(seed_shares[u][position]))
    # The server knows both public keys but no private one: its best guesses fail.
    guess = agree(new_key_pair().private, channel["client-2"].public, CHANNEL_LABEL)
    for wrong in (guess, bytes(32), key[::-1]):
        with pytest.raises(ProtocolError, match="failed authentication"):
            open_sealed(wrong, sealed, context)
    with pytest.raises(ProtocolError):  # the right key, but bound to another recipient
        open_sealed(key, sealed, f"1|{KIND}|{u}|client-3".encode())


# -- 4. a request naming a peer both alive and dropped is refused ------------------------------

def test_clients_refuse_an_unmask_request_naming_a_peer_alive_and_dropped(tmp_path,
                                                                         monkeypatch):
    real = per_round._json_payload

    def malicious(value):  # the server also asks for client-2's mask-key shares
        if "dropped" in value:  # an unmask request (not the consistency announcement)
            value = dict(value)
            value["dropped"] = list(value["dropped"]) + ["client-2"]
        return real(value)

    monkeypatch.setattr(per_round, "_json_payload", malicious)
    clients = make_clients(4)
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path), keep_payloads=True)
    result = run_round(channel, uniform_updates(4, 6), {c.id: 1.0 for c in clients})
    log.close()
    refusals = [e for e in log.events if e["event"] == "rejected"]
    assert [e["sender"] for e in refusals] == [c.id for c in clients]  # each one, once
    for event in refusals:
        assert event["phase"] == "unmask" and event["party"] == "server"
        expected = ("itself as dropped" if event["sender"] == "client-2"
                    else "client-2 both alive and dropped")
        assert event["detail"].startswith("refused") and expected in event["detail"]
    assert result.payload is None and result.included == []
    assert "shares" in result.reason and "masked" in result.reason
    assert any(e["event"] == "aborted" for e in log.events)
    assert logged_payloads(tmp_path, "unmask") == []  # nothing revealed


def test_answer_reveals_one_secret_per_peer_once_and_refuses_bad_requests(tmp_path,
                                                                        monkeypatch):
    """Call a client's answer directly on a real client session captured mid-protocol (the
    semi-honest variant: the request rules hold in both; test_malicious_server.py plays the
    consistency round's)."""
    captured = []
    real = ClientSession.answer

    def spy(self, data):
        captured.append(self)
        return real(self, data)

    monkeypatch.setattr(ClientSession, "answer", spy)
    clients = make_clients(4)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, adversary="semi-honest"),
                                [Fault("drop", "client-4", "masked_input")])
    result = run_round(channel, uniform_updates(4, 6), {cid: 1.0 for cid in ids})
    assert result.included == ids[:3]
    session = captured[0]
    assert session.id == "client-1" and session.stage.shares_needed(4) == 3  # ceil(0.6 * 4)

    def ask(request) -> bytes:
        session.answered = False  # each request below is judged on its own
        return session.answer(json_payload(request))

    honest = deserialize_payload(ask({"survivors": ids[:3], "dropped": ["client-4"]}))
    assert sorted(honest) == ["b:client-1", "b:client-2", "b:client-3", "s:client-4"]
    assert all(v.dtype == np.uint8 and len(v) == 68 for v in honest.values())
    with pytest.raises(MessageError, match="already answered"):  # asking twice
        session.answer(json_payload({"survivors": ids[1:3], "dropped": ["client-4"]}))
    for request, fragment in [
        ({"survivors": ids[:3], "dropped": ["client-4", "client-3"]}, "client-3 both alive"),
        ({"survivors": ids, "dropped": ["client-4"]}, "client-4 both alive"),
        ({"survivors": ids[1:3] + ["client-4"], "dropped": ["client-1"]}, "itself as dropped"),
        ({"survivors": ids[:3] + ["client-9"], "dropped": []}, "client-9, whom this client"),
        ({"survivors": ["client-1"], "dropped": ids[1:]}, "only 1 survivors"),
        ({"survivors": ids[:3]}, "not a table of dropped, survivors"),
        ({"survivors": "client-1", "dropped": []}, "not a table"),
        ([ids, []], "not a table"),
    ]:
        with pytest.raises(MessageError, match=fragment):
            ask(request)
    for junk, fragment in [(b"junk", "not a valid payload"),
                           (bytes_payload({"json": b"{"}), "no valid JSON"),
                           (bytes_payload({"json": b"\xff"}), "no valid JSON"),
                           (bytes_payload({}), "no valid JSON")]:
        with pytest.raises(MessageError, match=fragment):
            session.answer(junk)


def test_thresholds_at_or_below_half_are_refused_since_a_split_view_would_unmask(tmp_path):
    # At t <= |S(u)| / 2 two disjoint sets of t holders exist: a server telling one set that
    # client-1 survived and the other that it dropped would collect both of its secrets.
    with pytest.raises(ProtocolError, match="different survivor lists"):
        load_protocol(str(write_spec(tmp_path, threshold=0.5)))
    stage = load_protocol(str(write_spec(tmp_path, threshold=2))).stages[0]
    with pytest.raises(ProtocolError, match="must exceed half the share group"):
        stage.validate_for(4)


@pytest.mark.parametrize("threshold", [0.6, 0.75])
def test_a_server_splitting_its_unmask_requests_cannot_unmask_one_client(tmp_path, monkeypatch,
                                                                        threshold):
    """Even without the consistency round (semi-honest variant), a threshold above half the
    share group keeps a split view from collecting both secrets of one client."""
    real = per_round._json_payload
    requests = []

    def split_view(value):  # requests go out in client order: 1 and 2 honest, 3 and 4 lied to
        requests.append(value)
        if len(requests) > 2:
            value = {"survivors": [c for c in value["survivors"] if c != "client-1"],
                     "dropped": ["client-1"]}
        return real(value)

    monkeypatch.setattr(per_round, "_json_payload", split_view)
    n, d = 4, 16
    clients = make_clients(n)
    ids = [c.id for c in clients]
    channel, log = make_channel(tmp_path, clients,
                                write_spec(tmp_path, threshold=threshold, adversary="semi-honest"),
                                keep_payloads=True)
    updates = uniform_updates(n, d, seed=3)
    run_round(channel, updates, {cid: 1.0 for cid in ids})
    log.close()
    assert not any("refused" in e["detail"] for e in log.events)  # nothing looked wrong
    # The attack, from the server's view only: its log of what it received.
    public = {r["sender"]: deserialize_payload(data)
              for r, data in logged_payloads(tmp_path, "advertise_keys")}
    masked = {r["sender"]: deserialize_payload(data)["y"].astype(np.uint64)
              for r, data in logged_payloads(tmp_path, "masked_input")}
    revealed = {"b": [], "s": []}
    for _, data in logged_payloads(tmp_path, "unmask"):
        for name, blob in deserialize_payload(data).items():
            which, peer = name.split(":", 1)
            if peer == "client-1":
                revealed[which].append(share_from_bytes(blob.tobytes()))
    t = shares_needed(threshold, n)
    try:
        seed = reconstruct_bytes(revealed["b"], t, 32)
        mask_key = private_from_bytes(reconstruct_bytes(revealed["s"], t, 32))
    except ProtocolError:
        return  # fewer than t shares of one of the two secrets: client-1 stays masked
    quantizer = Quantizer(8.0, LEVELS, 32)
    y = quantizer.sub_mod(masked["client-1"], expand_seed(seed, d, 32))
    for v in ids[1:]:  # client-1 comes first, so it added +PRG(s_1v) for every peer
        pair = agree(mask_key, public[v]["s_pk"].tobytes(), MASK_LABEL)
        y = quantizer.sub_mod(y, expand_seed(pair, d, 32))
    recovered = y.astype(np.float64) * quantizer.step - quantizer.clip  # scale is 1 here
    assert np.abs(recovered - updates["client-1"]).max() > 1e-3, "client-1's update leaked"


# -- 5. below threshold nothing is revealed ---------------------------------------------------

def test_below_threshold_the_round_aborts_before_any_unmasking(tmp_path):
    clients = make_clients(3)
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, threshold=3),
                              [Fault("drop", "client-2", "masked_input")], keep_payloads=True)
    result = run_round(channel, uniform_updates(3, 4), {c.id: 1.0 for c in clients})
    log.close()
    assert result.payload is None and result.included == []
    assert result.reason == "only 2 masked inputs arrived, threshold is 3"
    aborted = [e for e in log.events if e["event"] == "aborted"]
    assert len(aborted) == 1 and aborted[0]["detail"] == result.reason
    phases = {r["phase"] for r in read_records(tmp_path) if r["kind"] != "event"}
    assert phases == {"advertise_keys", "keys", "share_keys", "shares", "masked_input"}


# -- 6. SecAgg+ neighbour graph ----------------------------------------------------------------

def test_harary_graph_is_symmetric_regular_and_complete_for_large_k():
    stage = SecAggStage((KIND,), 0.6, 0, Quantizer(8.0, LEVELS, 32))
    for n in range(3, 26):
        ids = [f"c{i}" for i in range(n)]
        for k in range(0, n + 2):
            graph = harary_neighbours(ids, k, random.Random(n * 100 + k))
            assert set(graph) == set(ids)
            assert all(u not in graph[u] and graph[u] <= set(ids) for u in ids)
            assert all(u in graph[v] for u in ids for v in graph[u])
            even = k + k % 2
            degree = n - 1 if k <= 0 or even >= n - 1 else even
            assert {len(graph[u]) for u in ids} == {degree}, (n, k)
            stage.neighbours = k  # the share group the stage plans for is |N(u)| + 1
            assert stage.group_size(n) == degree + 1, (n, k)
    ids = [f"c{i}" for i in range(12)]
    drawn = {frozenset(frozenset((u, v)) for u, vs in
                       harary_neighbours(ids, 4, random.Random(s)).items() for v in vs)
             for s in range(5)}
    assert len(drawn) > 1  # the graph is random, not a fixed ring


def test_secagg_plus_with_four_neighbours_is_exact_and_sends_four_keys(tmp_path):
    n = 12
    clients = make_clients(n)
    ids = [c.id for c in clients]
    spec = write_spec(tmp_path, threshold=0.6, neighbours=4)
    channel, log = make_channel(tmp_path, clients, spec, keep_payloads=True)
    updates = uniform_updates(n, 10, seed=5)
    weights = dict.fromkeys(ids, 1.0)
    result = run_round(channel, updates, weights)
    log.close()
    assert result.included == ids
    tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, ids, n)
    assert np.abs(result.payload[KIND] - plain_mean(updates, weights, ids)).max() <= tol
    advertised = {r["sender"]: deserialize_payload(data)
                  for r, data in logged_payloads(tmp_path, "advertise_keys")}
    graph = {}
    for record, data in logged_payloads(tmp_path, "keys"):
        keys = deserialize_payload(data)
        assert {"graph_seed", "u1"} <= set(keys)  # the announced graph (malicious variant)
        keys = {name: key for name, key in keys.items() if ":" in name}
        neighbours = {name.split(":", 1)[1] for name in keys}
        fields = {"c_pk", "s_pk", "b_commit", *PROOF_FIELDS}
        assert len(keys) == 4 * len(fields) and len(neighbours) == 4
        assert record["recipient"] not in neighbours
        assert {name.split(":", 1)[0] for name in keys} == fields
        for name, key in keys.items():  # the server forwards each peer's own keys
            which, v = name.split(":", 1)
            assert np.array_equal(key, advertised[v][which])
        graph[record["recipient"]] = neighbours
    assert set(graph) == set(ids)
    assert all(u in graph[v] for u in ids for v in graph[u])
    for record, data in logged_payloads(tmp_path, "share_keys"):  # 4 ciphertexts, to them
        assert set(deserialize_payload(data)) == graph[record["sender"]]


def test_a_client_refuses_parameters_other_than_its_own_spec(tmp_path):
    """Adversary: a malicious server that announces client-2 a lower threshold in its
    ``keys`` message (so that fewer shares would reveal its secrets). client-2 refuses the
    message naming both parameter sets, drops out, and the round completes without it."""
    clients = make_clients(4)
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, threshold=0.6))
    honest = channel.server.envelope
    (stage,) = load_protocol(str(tmp_path / "spec.toml")).stages
    lowered = SecAggStage(stage.protects, 0.51, stage.neighbours, stage.quantizer).parameters()

    def envelope(round_, phase, kind, recipient, data, stages=(), origin="",
                 digest=None):  # digest dropped: the honest envelope hashes what is sent
        if phase == "keys" and recipient == "client-2":
            data = bytes_payload(payload_bytes(data, "server") | {"params": lowered})
        return honest(round_, phase, kind, recipient, data, stages, origin)

    channel.server.envelope = envelope
    result = run_round(channel, uniform_updates(4, 10), {c.id: 1.0 for c in clients})
    log.close()
    refusals = [r for r in read_records(tmp_path) if r.get("event") == "rejected"
                and r["sender"] == "client-2"]
    assert len(refusals) == 1 and "announces parameters" in refusals[0]["detail"]
    assert "0.51" in refusals[0]["detail"] and "0.6" in refusals[0]["detail"]
    assert result.included == ["client-1", "client-3", "client-4"]


# -- 7. spec validation ----------------------------------------------------------------------

@pytest.mark.parametrize("changes, fragment", [
    ({"colour": "red"}, r"stage 'secagg'\): unknown key 'colour'"),
    ({"threshold": None}, "missing required key 'threshold'"),
    ({"protects": None}, "missing required key 'protects'"),
    ({"threshold": 1}, r"threshold = 1; give an integer >= 2"),
    ({"threshold": 1.5}, r"threshold = 1\.5;.*fraction in \(0\.5, 1\]"),
    ({"threshold": 0.0}, r"threshold = 0\.0"),
    ({"threshold": True}, r"threshold = True"),
    ({"threshold": "half"}, r"threshold = 'half'"),
    ({"protects": [KIND, "model"]}, r"cannot protect kind 'model'"),
    ({"neighbours": -2}, r"neighbours = -2"),
    ({"neighbours": 2.5}, r"neighbours = 2\.5"),
    ({"bits": 16}, r"levels=4194304 does not fit in bits=16.*use bits >= 22"),
    ({"clip": -1.0}, r"clip must be a finite number > 0"),
    ({"levels": 1}, r"levels must be an integer"),
])
def test_bad_secagg_parameters_are_rejected_at_load(tmp_path, changes, fragment):
    with pytest.raises(ProtocolError, match=fragment) as info:
        load_protocol(str(write_spec(tmp_path, **changes)))
    assert "spec.toml stages[0]" in str(info.value)


@pytest.mark.parametrize("n, changes, fragment", [
    (4, {"threshold": 5}, r"threshold = 5 needs 5 shares but each client shares among 4 "
                          r"parties.*lower threshold to at most 4 or raise neighbours"),
    (12, {"threshold": 6, "neighbours": 4}, r"among 5 parties.*lower threshold to at most 5"),
    (8, {"bits": 24}, r"bits=24 with levels=4194304 can wrap for 8 clients.*use bits >= 25"),
    (1, {}, r"at least 2 clients"),
])
def test_channel_construction_validates_the_protocol_for_the_client_count(tmp_path, n, changes,
                                                                         fragment):
    spec = write_spec(tmp_path, **changes)
    protocol = load_protocol(str(spec))  # loads: only impossible for this many clients
    with pytest.raises(ProtocolError, match=fragment):
        protocol.validate_for(n)
    with pytest.raises(ProtocolError, match=fragment):
        make_channel(tmp_path, make_clients(n), spec)


def test_shipped_secagg_specs_load_with_their_documented_parameters():
    for name, neighbours, tolerance in (("secagg", 0, None),
                                        ("secagg-plus", None, Tolerance(0.05, 0.2))):
        (stage,) = load_protocol(name).stages
        assert (stage.threshold, stage.neighbours, stage.tolerance) == (0.6, neighbours,
                                                                        tolerance)
        assert stage.quantizer == Quantizer(8.0, 2**22, 32)
        assert set(stage.protects) == {"gradient", "dual_update", "update"}
        stage.validate_for(1024)
        with pytest.raises(ProtocolError, match="can wrap for 1025 clients"):
            stage.validate_for(1025)


# -- 8. clipping is counted ----------------------------------------------------------------------

def test_each_client_logs_how_many_coordinates_the_quantizer_clipped(tmp_path):
    n, d = 3, 40
    clients = make_clients(n)
    updates = uniform_updates(n, d, seed=2)  # within [-3, 3]
    updates["client-2"][:7] = 20.0
    updates["client-2"][7:9] = -15.0
    updates["client-3"][:5] = 9.0
    weights = {c.id: 1.0 for c in clients}
    channel, log = make_channel(tmp_path, clients, write_spec(tmp_path, clip=8.0))
    result = run_round(channel, updates, weights)
    assert result.included == [c.id for c in clients]
    want = {cid: int(np.sum(np.abs(updates[cid].astype(np.float64)) > 8.0)) for cid in weights}
    assert want == {"client-1": 0, "client-2": 9, "client-3": 5}
    clipped = {e["party"]: e for e in log.events if e["event"] == "clipped"}
    assert set(clipped) == {"client-2", "client-3"}  # none logged for a client with none
    for cid, event in clipped.items():  # signed by the client itself, which alone knows it
        assert event["sender"] == cid and event["phase"] == "masked_input"
        assert event["detail"].startswith(f"{want[cid]} of {d} coordinates")


# -- 9. faults other than drop ---------------------------------------------------------------

@pytest.mark.parametrize("fault, n, threshold, included, party, fragment", [
    (Fault("corrupt", "client-2", "masked_input"), 4, 0.6, [1, 3, 4], "client-2",
     "altered in transit"),
    (Fault("corrupt", "client-2", "masked_input"), 3, 3, None, "client-2",
     "altered in transit"),
    (Fault("corrupt", "client-3", "share_keys"), 4, 0.6, [1, 2, 4], "client-3",
     "altered in transit"),
    (Fault("corrupt", "client-1", "unmask"), 4, 0.6, [1, 2, 3, 4], "client-1",
     "altered in transit"),
    (Fault("replay", "client-2", "masked_input"), 4, 0.6, [1, 2, 3, 4], "client-2",
     "duplicate or replayed"),
    (Fault("replay", "client-3", "unmask"), 4, 0.6, [1, 2, 3, 4], "client-3",
     "duplicate or replayed"),
    (Fault("delay", "client-4", "masked_input"), 4, 0.6, [1, 2, 3], "client-4",
     "after the phase closed"),
    (Fault("unknown_sender", "mallory", "masked_input"), 4, 0.6, [1, 2, 3, 4], "mallory",
     "not registered"),
])
def test_faults_are_rejected_by_name_and_the_result_stays_exact(tmp_path, fault, n, threshold,
                                                                included, party, fragment):
    clients = make_clients(n)
    ids = [c.id for c in clients]
    spec = write_spec(tmp_path, threshold=threshold)
    channel, log = make_channel(tmp_path, clients, spec, [fault])
    updates = uniform_updates(n, 7, seed=11)
    weights = dict.fromkeys(ids, 1.0)
    result = run_round(channel, updates, weights)
    rejected = [e for e in log.events if e["event"] == "rejected"]
    assert len(rejected) == 1, rejected
    assert rejected[0]["party"] == party and fragment in rejected[0]["detail"]
    assert rejected[0]["phase"] == fault.phase and rejected[0]["sender"] == "server"
    if included is None:
        assert result.payload is None and "threshold is 3" in result.reason
        assert any(e["event"] == "aborted" for e in log.events)
        return
    want = [f"client-{i}" for i in included]
    assert result.included == want and result.reason == ""
    tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, want, n)
    assert np.abs(result.payload[KIND] - plain_mean(updates, weights, want)).max() <= tol
