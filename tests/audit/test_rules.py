"""Protocol rules over a verified log (secureffm/audit/rules.py), one rule at a time.

Truths used: the rules as the module docstring states them, fed hand-written records (the
fields a log record carries) and secagg key payloads written as named uint8 arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from secureffm.audit.rules import ProtocolRules
from secureffm.federation.message import serialize_payload

PARTIES = ("server", "client-1", "client-2")
C1_KEYS = {"c_pk": bytes([1]) * 32, "s_pk": bytes([2]) * 32}
C2_KEYS = {"c_pk": bytes([3]) * 32, "s_pk": bytes([4]) * 32}


def _keys_payload(keys: dict[str, bytes]) -> bytes:
    return serialize_payload({name: np.frombuffer(key, dtype=np.uint8)
                              for name, key in keys.items()})


class _Log:
    """Numbers records as a log does and feeds each to ``rules``."""

    def __init__(self, parties=PARTIES):
        self.rules = ProtocolRules({party: bytes(32) for party in parties})
        self.seq = 0

    def message(self, sender, recipient, phase, round_=1, kind="gradient", payload=None,
                **extra):
        return self._feed({"kind": kind, "sender": sender, "recipient": recipient,
                           "phase": phase, "round": round_, **extra}, payload)

    def event(self, event, sender="server", party="*", round_=1, **fields):
        return self._feed({"kind": "event", "sender": sender, "recipient": "log",
                           "phase": "aggregate", "round": round_, "event": event,
                           "party": party, **fields}, None)

    def _feed(self, record, payload):
        record["seq"] = self.seq
        self.seq += 1
        return self.rules.check(record, payload)


def test_every_named_party_must_be_registered():
    log = _Log()
    assert log.message("client-1", "server", "upload") is None
    assert log.message("server", "client-9", "broadcast") == (
        "record 1: recipient 'client-9' is not in parties.json")
    assert log.message("server", "client-2", "relay", origin="client-7") == (
        "record 2: origin 'client-7' is not in parties.json")
    assert log.event("dropped", party="client-8") == (
        "record 3: party 'client-8' is not in parties.json")


def test_only_the_server_may_reject_an_unregistered_sender_by_name():
    log = _Log()
    assert log.event("rejected", party="mallory") is None
    assert log.event("rejected", sender="client-1", party="mallory") == (
        "record 1: party 'mallory' is not in parties.json")


@pytest.mark.parametrize("event", ["dropped", "aborted", "aggregated"])
def test_server_events_signed_by_a_client_break_a_rule(event):
    fields = {"included": [], "of_kind": "gradient"} if event == "aggregated" else {}
    assert _Log().event(event, sender="client-1", **fields) == (
        f"record 0: a '{event}' event is the server's, but client-1 signed it")


def test_the_closing_record_is_the_servers_and_counts_the_records_before_it():
    log = _Log()
    log.message("client-1", "server", "upload")
    assert log.event("closed", records=1) is None
    assert _Log().event("closed", records=3) == (
        "record 0: the closing record states 3 records before it, but 0 precede it")
    assert _Log().event("closed", sender="client-1", records=0) == (
        "record 0: the closing record must be signed by server, but client-1 signed it")


def test_a_single_party_closes_its_own_log_and_several_without_a_server_cannot():
    assert _Log(("central",)).event("closed", sender="central", records=0) is None
    assert _Log(("client-1", "client-2")).event("closed", sender="client-1", records=0) == (
        "record 0: parties.json has no server but 2 parties; only a single-party run closes "
        "its own log")


def test_every_counted_client_sent_its_input_to_that_round_and_kind():
    log = _Log()
    log.message("client-1", "server", "upload", round_=1)
    log.message("client-2", "server", "upload", round_=2)  # another round
    log.message("client-2", "server", "upload", round_=1, kind="dual_update")  # another kind
    assert log.event("aggregated", included=["client-1"], of_kind="gradient") is None
    assert log.event("aggregated", included=["client-2"], of_kind="gradient") == (
        "record 4: client-2 is counted in the round-1 gradient aggregate but sent no input to "
        "it (upload or masked_input)")
    assert log.rules.status()["aggregates: every counted client sent its input"] == (
        "done: 1 aggregated event(s) checked")


def test_a_secure_aggregation_needs_the_clients_advertised_keys_first():
    log = _Log()
    assert log.message("client-1", "server", "masked_input") == (
        "record 0: client-1 takes part in the round-1 gradient secure aggregation "
        "(masked_input) without advertising keys in it")
    log.message("client-1", "server", "advertise_keys", payload=_keys_payload(C1_KEYS))
    assert log.message("client-1", "server", "masked_input") is None
    assert log.message("client-1", "server", "masked_input", round_=2) is not None  # new round
    assert log.event("aggregated", included=["client-1"], of_kind="gradient") is None


def _advertised(log: _Log) -> None:
    log.message("client-1", "server", "advertise_keys", payload=_keys_payload(C1_KEYS))
    log.message("client-2", "server", "advertise_keys", payload=_keys_payload(C2_KEYS))


def test_relayed_keys_must_be_the_advertised_ones():
    log = _Log()
    _advertised(log)
    honest = {f"{kind}:client-2": key for kind, key in C2_KEYS.items()}
    assert log.message("server", "client-1", "keys", payload=_keys_payload(honest)) is None
    swapped = dict(honest, **{"s_pk:client-2": bytes([9]) * 32})  # the server's own key
    assert log.message("server", "client-1", "keys", payload=_keys_payload(swapped)) == (
        "record 3: the server relayed to client-1 a s_pk for client-2 that client-2 did not "
        "advertise in this aggregation")
    assert log.message("server", "client-2", "keys", payload=b"garbage") == (
        "record 4: the keys the server sent client-2 are not a valid payload")
    assert log.rules.status()["secagg: relayed keys equal the advertised ones"] == (
        "done: 1 keys message(s) checked")


def test_without_payloads_the_relayed_keys_rule_is_reported_not_done():
    log = _Log()
    log.message("client-1", "server", "advertise_keys")
    assert log.message("server", "client-1", "keys") is None
    status = log.rules.status()["secagg: relayed keys equal the advertised ones"]
    assert status.startswith("NOT DONE for 1 keys message(s)") and "--keep-payloads" in status


def test_the_servers_public_broadcast_is_the_same_to_every_client():
    """Adversary: a server that sends one client another model (Pasquini et al. 2022) to
    isolate its update in the next sum; the log shows two sha256 for one round's broadcast."""
    log = _Log()

    def broadcast(recipient, sha, round_=1, kind="global_model", stages=()):
        return log.message("server", recipient, "broadcast", round_, kind, sha256=sha,
                           stages=list(stages))

    assert broadcast("client-1", "aa") is None and broadcast("client-2", "aa") is None
    assert broadcast("client-1", "bb", round_=2) is None  # a new round, a new model
    assert broadcast("client-1", "cc", kind="global_potential") is None
    assert broadcast("client-1", "s1", kind="model", stages=["sealed"]) is None  # per client
    assert broadcast("client-2", "s2", kind="model", stages=["sealed"]) is None
    assert broadcast("client-2", "dd", round_=2) == (
        "record 6: the server broadcast another global_model to client-2 in round 2 than to "
        "client-1 (a different model to one client can isolate its update in a sum)")


def _json_payload(value: str) -> bytes:
    return serialize_payload({"json": np.frombuffer(value.encode(), dtype=np.uint8)})


def test_one_graph_and_one_survivor_set_are_announced_to_every_client():
    """Adversary: a malicious server that announces clients different survivor sets (a split
    view) or different graphs; the log's payloads show it, with payloads kept."""
    log = _Log()
    log.message("client-1", "server", "advertise_keys", payload=_keys_payload(C1_KEYS))
    log.message("client-2", "server", "advertise_keys", payload=_keys_payload(C2_KEYS))
    graph = {"graph_seed": bytes(32), "u1": b'["client-1", "client-2"]'}
    assert log.message("server", "client-1", "keys",
                       payload=_keys_payload({**graph, "c_pk:client-2": C2_KEYS["c_pk"]})) is None
    other = {**graph, "graph_seed": bytes([1]) * 32, "c_pk:client-1": C1_KEYS["c_pk"]}
    assert "announced client-2 another graph than client-1" in log.message(
        "server", "client-2", "keys", payload=_keys_payload(other))
    both = _json_payload('{"survivors": ["client-1", "client-2"]}')
    assert log.message("server", "client-1", "consistency", payload=both) is None
    assert "another survivor set than client-1" in log.message(
        "server", "client-2", "consistency", payload=_json_payload('{"survivors": ["client-2"]}'))
    assert log.message("server", "client-1", "consistency", payload=None) is None  # not kept
    assert "NOT DONE for 1 announcement(s)" in log.rules.status()[
        "secagg: one graph and one survivor set announced to every client"]
