"""Secure aggregation with keys agreed once (``setup = "once"``, secagg/keys_once.py): exact sums
or clean aborts over several rounds under random dropouts at every phase, the set-up reused,
and the client's refusals of a server that deviates.

Expectations are computed here from the faults, the neighbour graph and the threshold rule,
never read back from the stage.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import pytest
from hypothesis import event as hypothesis_event
from hypothesis import example, given, settings
from hypothesis import strategies as st

import secureffm.protocols.secagg.keys_once as epoch
from secureffm.audit.verify import verify_run
from secureffm.federation.faults import Fault
from secureffm.protocols.link import Ask
from secureffm.protocols.quantize import Quantizer
from secureffm.protocols.secagg import round_label, round_seed
from secureffm.protocols.secagg.server import choose_graph
from secureffm.protocols.secagg.session import ClientSession
from secureffm.protocols.wire import payload_bytes
from tests.protocols.test_secagg import (
    KIND,
    LEVELS,
    make_channel,
    make_clients,
    plain_mean,
    read_records,
    shares_needed,
    tolerance,
    uniform_updates,
    write_spec,
)

# The phases a client replies in, in round order (a drop there takes it offline for the rest
# of that round); consistency_sign only under the malicious-server variant.
CLIENT_PHASES = ("advertise_keys", "keys_taken", "masked_input", "consistency_sign", "unmask")
ROUNDS = 3


def run_rounds(channel, updates_by_round, weights):
    results = []
    for r, updates in enumerate(updates_by_round, start=1):
        d = next(iter(updates.values())).size
        results.append(channel.aggregate(r, KIND, lambda c, u=updates: {KIND: u[c.id]}, weights,
                                         {KIND: ((d,), np.dtype(np.float32))}))
    return results


# -- 1. exact or aborted, round after round --------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    n: int
    d: int
    neighbours: int
    adversary: str
    drops: tuple[tuple[int, int, str], ...]  # (round from 1, client index from 0, phase)
    seed: int = 0


@st.composite
def scenarios(draw) -> Scenario:
    n = draw(st.integers(3, 12))
    adversary = draw(st.sampled_from(["malicious", "semi-honest"]))
    phases = [p for p in CLIENT_PHASES if adversary == "malicious" or p != "consistency_sign"]
    drops = tuple(draw(st.lists(st.tuples(st.integers(1, ROUNDS), st.integers(0, n - 1),
                                          st.sampled_from(phases)), max_size=n)))
    return Scenario(n, draw(st.integers(1, 20)), draw(st.sampled_from([0, 0, 2, 4])),
                    adversary, drops, draw(st.integers(0, 2**32 - 1)))


def expected_rounds(sc: Scenario, graphs: list[dict[str, set[str]]]) -> list[str | list[str]]:
    """Per round, the included clients or the reason word of the abort (from the faults, the
    graph of each set-up in order and the threshold 0.6)."""
    ids = [f"client-{i}" for i in range(1, sc.n + 1)]
    rank = {phase: i for i, phase in enumerate(CLIENT_PHASES)}
    k = sc.neighbours + sc.neighbours % 2
    group = sc.n if k <= 0 or k >= sc.n - 1 else k + 1
    needed = shares_needed(0.6, group)
    graphs = list(graphs)
    members, graph, out = None, None, []
    for r in range(1, ROUNDS + 1):
        drop_at = {}
        for round_, index, phase in sc.drops:
            if round_ == r:
                drop_at[ids[index]] = min(drop_at.get(ids[index], 99), rank[phase])

        def alive(clients, phase, drop_at=drop_at):
            return [c for c in clients if drop_at.get(c, 99) > rank[phase]]

        if members is None:  # a set-up this round
            u1 = alive(ids, "advertise_keys")
            if len(u1) < 2:
                out.append("took their keys")
                continue
            graph = graphs.pop(0)
            members = alive(u1, "keys_taken")
            if len(members) < needed:
                members = None
                out.append("took their keys")
                continue

        def peers(v, graph=graph, members=members):
            return graph[v] & set(members)

        def t(v, graph=graph):
            return shares_needed(0.6, len(graph[v]) + 1)

        maskers = [v for v in members if len(peers(v)) + 1 >= t(v)]
        u3 = alive(maskers, "masked_input")
        if len(u3) < needed:
            members = None
            out.append("masked inputs arrived")
            continue
        gone = set(members) - set(u3)
        # A holder answers only when every survivor among its peers and itself signed the
        # survivor set (the malicious variant's consistency round) and they are t or more.
        signers = set(alive(u3, "consistency_sign"))
        responders = {v for v in alive(u3, "unmask") if (peers(v) | {v}) & set(u3) <= signers
                      and len((peers(v) | {v}) & set(u3)) >= t(v)}
        if any(len(responders & (peers(u) | {u})) < t(u) for u in u3):
            out.append("came back")
        elif any(v not in responders for v in u3 if peers(v) & gone):
            out.append("revealed no round seed")
        else:
            out.append(u3)
    return out


@settings(max_examples=40, deadline=None, database=None)
@given(sc=scenarios())
@example(sc=Scenario(6, 3, 0, "malicious", ((1, 2, "masked_input"),)))  # a k reveal in round 1
@example(sc=Scenario(6, 3, 0, "semi-honest", ((2, 0, "masked_input"), (2, 1, "unmask"))))
@example(sc=Scenario(5, 2, 0, "malicious", ((1, 0, "keys_taken"), (1, 1, "keys_taken"),
                                            (2, 2, "masked_input"))))  # set-up again
@example(sc=Scenario(9, 2, 4, "malicious", ((1, 3, "masked_input"), (3, 4, "unmask"))))
@example(sc=Scenario(6, 2, 0, "malicious", ((2, 1, "consistency_sign"),)))  # all refuse
@example(sc=Scenario(9, 2, 4, "malicious", ((1, 3, "consistency_sign"),)))  # its group refuses
def test_each_round_is_exact_or_aborts_as_the_threshold_rule_says(sc):
    ids = [f"client-{i}" for i in range(1, sc.n + 1)]
    weights = dict.fromkeys(ids, 1.0)  # secure aggregation takes no other
    updates = [uniform_updates(sc.n, sc.d, sc.seed + r) for r in range(ROUNDS)]
    graphs = []  # the server's graph of each set-up (clients re-derive theirs: not these)
    real_choose = choose_graph

    def spy(stage, r, u1):
        real_choose(stage, r, u1)
        graphs.append({u: set(v) for u, v in r.graph.items()})

    faults = [Fault("drop", ids[i], phase, rounds=(r,)) for r, i, phase in sc.drops]
    with TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(epoch, "choose_graph", spy)
        spec = write_spec(tmp, neighbours=sc.neighbours, adversary=sc.adversary, setup="once",
                          clip=8.0)
        channel, log = make_channel(tmp, make_clients(sc.n), spec, faults)
        results = run_rounds(channel, updates, weights)
        channel.close()
        report = verify_run(Path(tmp))
        assert report.ok, report.summary()
    want = expected_rounds(sc, graphs)
    for r, (result, expected) in enumerate(zip(results, want, strict=True), start=1):
        if isinstance(expected, list):
            hypothesis_event("exact")
            assert result.reason == "" and result.included == expected, (r, result.reason)
            mean = plain_mean(updates[r - 1], weights, expected)
            tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, expected, sc.n)
            assert np.abs(result.payload[KIND].astype(np.float64) - mean).max() <= tol
        else:
            hypothesis_event(f"aborted: {expected}")
            assert result.payload is None and expected in result.reason, (r, expected,
                                                                          result.reason)


@pytest.mark.parametrize("adversary", ["semi-honest", "malicious"])
def test_the_set_up_runs_once_and_later_rounds_send_two_exchanges(tmp_path, adversary):
    """Three rounds, nobody drops: keys are advertised and taken in round 1 only; every round
    after it is one masked input per client and one unmask exchange with t holders, and
    under the malicious variant one consistency exchange between them (a third)."""
    n = 6
    spec = write_spec(tmp_path, setup="once", adversary=adversary)
    channel, log = make_channel(tmp_path, make_clients(n), spec)
    ids = [f"client-{i}" for i in range(1, n + 1)]
    results = run_rounds(channel, [uniform_updates(n, 4, r) for r in range(3)],
                         {c: 1.0 for c in ids})
    channel.close()
    assert all(r.included == ids for r in results)
    phases = {}
    for record in read_records(tmp_path):
        if record["kind"] == KIND:
            phases.setdefault(record["round"], []).append(record["phase"])
    t = shares_needed(0.6, n)
    signed = ["consistency", "consistency_sign"] if adversary == "malicious" else []
    for r in (2, 3):
        assert sorted(set(phases[r])) == sorted(["masked_input", "unmask", "unmask_request",
                                                 *signed])
        assert all(phases[r].count(phase) == n for phase in ["masked_input", *signed])
        assert phases[r].count("unmask_request") == phases[r].count("unmask") == t
    assert phases[1].count("advertise_keys") == n and phases[1].count("keys_taken") == n


# -- 2. what the server may ask ----------------------------------------------------------------

def _epoch_federation(tmp_path, n=5, adversary="malicious"):
    spec = write_spec(tmp_path, setup="once", adversary=adversary)
    channel, log = make_channel(tmp_path, make_clients(n), spec, keep_payloads=True)
    return channel, log, [f"client-{i}" for i in range(1, n + 1)]


def _refusals(log, client: str) -> list[str]:
    return [e["detail"] for e in log.events if e["event"] == "rejected" and e["sender"] == client]


@pytest.mark.parametrize("args, fragment", [
    ({"peers": ["client-2"]}, "fewer than the threshold"),
    ({"peers": ["client-2", "client-3", "client-9"]}, "client-9, not a neighbour"),
    ({"peers": ["client-2", "client-2", "client-3"]}, "not a list of distinct"),
    ({"epoch": 7}, "set-up of round 7"),
])
def test_a_client_refuses_a_mask_request_the_set_up_does_not_allow(tmp_path, monkeypatch, args,
                                                                   fragment):
    """Adversary: a malicious server editing the arguments of client-1's mask request in
    round 2: too few peers (masking with one peer, client-1's input would be read by naming it
    dropped), a stranger, a repeated peer, another set-up."""
    channel, log, ids = _epoch_federation(tmp_path)
    real = epoch._masked_inputs

    def tamper(stage, r, *rest):
        exchange = r.link.exchange

        def edited(phase, reply_phase, action, asks):
            if r.link.round == 2 and phase == "mask_request":
                asks = dict(asks)
                ask = asks["client-1"]
                asks["client-1"] = Ask(ask.data, {**ask.args, **args})
            return exchange(phase, reply_phase, action, asks)

        r.link.exchange = edited
        return real(stage, r, *rest)

    monkeypatch.setattr(epoch, "_masked_inputs", tamper)
    results = run_rounds(channel, [uniform_updates(5, 4, r) for r in range(2)],
                         {c: 1.0 for c in ids})
    channel.close()
    assert results[0].included == ids
    assert "client-1" not in results[1].included
    assert any(fragment in d for d in _refusals(log, "client-1")), _refusals(log, "client-1")


def test_a_second_mask_request_in_one_round_is_refused(tmp_path):
    """Adversary: a malicious server asking client-1 to mask twice in round 1 (the difference
    of two masked inputs of one round, with both seeds, would give the difference of its
    inputs); the client refuses the second, and a request for an earlier round."""
    channel, log, ids = _epoch_federation(tmp_path)
    updates = uniform_updates(5, 4)
    run_rounds(channel, [updates], {c: 1.0 for c in ids})
    link = channel._link(1, KIND, ("secagg",))
    for round_ in (1, 0):
        link.round = round_
        again = link.exchange("mask_request", "masked_input", "secagg.epoch.mask", {
            "client-1": Ask(None, {
                "compute": lambda c: {KIND: updates[c.id]}, "template": {KIND: [[4], "float32"]},
                "scale": 1.0, "share_variance": 0.0, "epoch": 1,
                "peers": ["client-2", "client-3", "client-4", "client-5"]})})
        assert again["client-1"].data is None
    channel.close()
    refusals = _refusals(log, "client-1")
    assert sum("already masked in round 1" in d for d in refusals) == 2, refusals


def test_a_peer_reveals_only_the_round_seed_of_a_dropped_client(tmp_path):
    """Adversary: the server, after client-3 dropped before masking in round 1. Its peers
    reveal k_{3v}^1 and nothing else of the pair: the revealed seed is HMAC(k_3v, round 1),
    and it does not give round 2's seed (client-3 returns and masks with the same set-up)."""
    channel, log, ids = _epoch_federation(tmp_path, adversary="semi-honest")
    captured = {}
    real = ClientSession.admit

    def spy(self, data):
        captured.setdefault(self.id, self)
        return real(self, data)

    faults_round = [uniform_updates(5, 4, r) for r in range(2)]
    channel.transport.faults = type(channel.transport.faults)(
        "test", (Fault("drop", "client-3", "masked_input", rounds=(1,)),))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ClientSession, "admit", spy)
        results = run_rounds(channel, faults_round, {c: 1.0 for c in ids})
    channel.close()
    assert results[0].included == ["client-1", "client-2", "client-4", "client-5"]
    assert results[1].included == ids  # client-3 back, same set-up
    payloads = (tmp_path / "payloads.bin").read_bytes()
    revealed = {}
    for record in read_records(tmp_path):
        if record["kind"] == KIND and record["phase"] == "unmask" and record["round"] == 1:
            reply = json.loads(payload_bytes(
                payloads[record["offset"]:record["offset"] + record["bytes"]], "x")["json"])
            assert set(reply["k"]) <= {"client-3"}
            if "client-3" in reply["k"]:
                revealed[record["sender"]] = bytes.fromhex(reply["k"]["client-3"])
    assert revealed, "no peer revealed a round seed of the dropped client"
    for v, seed in revealed.items():
        pair = captured[v].peers["client-3"].pair_seed
        assert seed == round_seed(pair, round_label(1, KIND))
        assert seed != round_seed(pair, round_label(2, KIND)) and seed != pair
    assert verify_run(tmp_path).ok


def test_setup_must_be_per_round_or_once(tmp_path):
    from secureffm.errors import ProtocolError
    from secureffm.protocols import load_protocol
    with pytest.raises(ProtocolError, match=re.escape("setup = 'daily'")):
        load_protocol(str(write_spec(tmp_path, setup="daily")))


def test_clients_restored_from_their_saved_state_go_on_with_the_same_set_up(tmp_path):
    """What a Flower node does between messages: every client's endpoint is rebuilt from its
    JSON-saved state after round 1; round 2 reuses the set-up (no keys advertised) and is
    exact, and a restored client still refuses a second mask in round 2."""
    from tests.protocols.test_endpoint import restarted
    channel, log, ids = _epoch_federation(tmp_path, n=4)
    weights = {c: 1.0 for c in ids}
    updates = [uniform_updates(4, 5, r) for r in range(2)]
    first = run_rounds(channel, updates[:1], weights)[0]
    channel.endpoints = {cid: restarted(e) for cid, e in channel.endpoints.items()}
    second = channel.aggregate(2, KIND, lambda c: {KIND: updates[1][c.id]}, weights,
                               {KIND: ((5,), np.dtype(np.float32))})
    assert first.included == second.included == ids
    tol = tolerance(Quantizer(8.0, LEVELS, 32), weights, ids, 4)
    assert np.abs(second.payload[KIND] - plain_mean(updates[1], weights, ids)).max() <= tol
    assert not any(r["phase"] == "advertise_keys" and r["round"] == 2
                   for r in read_records(tmp_path))
    channel.endpoints = {cid: restarted(e) for cid, e in channel.endpoints.items()}
    link = channel._link(2, KIND, ("secagg",))
    again = link.exchange("mask_request", "masked_input", "secagg.epoch.mask", {
        "client-1": Ask(None, {
            "compute": lambda c: {KIND: updates[1][c.id]}, "template": {KIND: [[5], "float32"]},
            "scale": 1.0, "share_variance": 0.0, "epoch": 1,
            "peers": ["client-2", "client-3", "client-4"]})})
    assert again["client-1"].data is None
    assert any("already masked in round 2" in d for d in _refusals(log, "client-1"))


def test_an_unmask_request_relaying_garbage_survivor_signatures_is_refused(tmp_path,
                                                                            monkeypatch):
    """Adversary: a server that relays garbage in place of the survivors' signatures of the
    survivor set.
    Every holder refuses, naming a survivor whose signature does not verify, and the round
    aborts with nothing revealed. With that check removed (holders that check nothing) they
    answer, and the audit, which re-checks every answered request against what the log shows
    the client saw, names it."""
    real = epoch._request
    monkeypatch.setattr(epoch, "_request", lambda stage, r, v, u3, gone, signed: real(
        stage, r, v, u3, gone, {u: bytes(64) for u in signed}))
    for checked in (False, True):
        folder = tmp_path / str(checked)
        folder.mkdir()
        channel, log, ids = _epoch_federation(folder)
        with monkeypatch.context() as patch:
            if not checked:
                patch.setattr(ClientSession, "_signature_problem", lambda *args: "")
            result = run_rounds(channel, [uniform_updates(5, 4)], {c: 1.0 for c in ids})[0]
        channel.close()
        report = verify_run(folder)
        if checked:
            assert result.payload is None and result.included == []
            assert all(any("did not confirm the survivor set, parameters, graph" in why
                           for why in _refusals(log, c)) for c in ids)
            assert report.ok, report.summary()
        else:
            assert result.included == ids
            assert not report.ok and "without" in report.summary() and "valid signature" in (
                report.summary()), report.summary()
