"""A stage added by this file alone (issue 40): registered, named in a spec, and described to
privacy.json, the audit, a client's snapshot and a client's endpoint (its actions) through the
stage itself, with no other edit.

The toy masks each client's input under a key every client holds (as CKKS does: the server
with one colluding client reads it) and keeps that key and a count of its rounds in the
client's memory. Truths used: the toy's own sentences, readers and codec, and the same
records and memory without the toy (read in the clear; refused by the snapshot).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest
import torch

from secureffm.audit.claims import FAIL, PASS
from secureffm.audit.rules import ProtocolRules
from secureffm.errors import ProtocolError
from secureffm.federation.exchange import Request
from secureffm.federation.memory import MemoryCodec
from secureffm.federation.message import serialize_payload
from secureffm.federation.parties import Registry, new_client, new_server
from secureffm.federation.snapshot import client_state, pack, restore_client, unpack
from secureffm.protocols.endpoint import ClientEndpoint
from secureffm.protocols.protocol import build_protocol, input_phases, load_protocol
from secureffm.protocols.registry import STAGES, register_stage, spec_from_table
from secureffm.protocols.stage import StageDefaults
from secureffm.protocols.statement import privacy_statement
from secureffm.protocols.step import Step
from tests.audit.test_claims import _folder, _message, _verdicts

CLAIM = "toy mask: each input is masked under the toy key every client holds"
TRUST = "no client shows the server the toy key"
EXCLUDED = "the toy mask is not a cipher"


def _load_key(saved: dict, arrays: dict[str, np.ndarray]) -> dict:
    return {"rounds": int(saved["rounds"]), "key": arrays["key"].tobytes()}


# The toy's client memory: its key (bytes, as an array) and the rounds it masked (JSON).
TOY_MEMORY = MemoryCodec(
    "toy-mask", lambda held: ({"rounds": held["rounds"]},
                              {"key": np.frombuffer(held["key"], dtype=np.uint8)}), _load_key)


def _toy_key(step: Step) -> bytes:
    """The toy's one client step: the client's count of masked rounds, as a payload."""
    return serialize_payload({"rounds": np.array([step.client.memory.get("toy-mask", {})
                                                  .get("rounds", 0)], dtype=np.int64)})


class ToyMask(StageDefaults):
    """An aggregate stage that describes itself (no log rules of its own: the default); it
    aggregates nothing in these tests."""

    name, role, phases = "toy-mask", "aggregate", ("toy_input",)
    can_protect = frozenset({"gradient"})
    input_phase = "toy_input"
    memory = (TOY_MEMORY,)
    client_actions = MappingProxyType({"toy-mask.key": _toy_key})

    def __init__(self, protects: tuple[str, ...], clients: int):
        self.protects, self.clients = protects, clients

    @classmethod
    def from_table(cls, table: dict, source: str) -> ToyMask:
        return cls(tuple(table["protects"]), int(table["clients"]))

    def validate_for(self, clients: int) -> None:
        """Any number: the audit judges it (:meth:`audit_parameters`)."""

    def claim(self, kind: str) -> tuple[str, str]:
        return CLAIM, TRUST

    def exclusions(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        return (EXCLUDED,)

    @staticmethod
    def readers(record: dict, relayed: bool) -> tuple[frozenset[str], str]:
        return frozenset({"key-holders"}), "toy-masked under the key every client holds"

    def audit_parameters(self, clients: int, colluders: int, malicious: bool,
                         logged: list[dict], payload) -> tuple[list, list[str]]:
        return ([(clients >= self.clients, f"toy mask needs {self.clients} clients")],
                [f"{len(logged)} logged message(s) name the toy"])


@pytest.fixture
def toy():
    """The toy registered for one test, and a spec that uses it (with DP, a shipped stage)."""
    register_stage(ToyMask)
    try:
        yield spec_from_table({"name": "toy", "stages": [
            {"stage": "dp", "protects": ["gradient"], "clip": 1.0, "delta": 1e-5,
             "noise_multiplier": 1.0},
            {"stage": "toy-mask", "protects": ["gradient"], "clients": 3}]}, "toy spec")
    finally:
        del STAGES["toy-mask"]


def test_privacy_json_states_the_toys_claim_trust_and_exclusion(toy):
    statement = privacy_statement(build_protocol(toy), ("gradient",), deterministic=False)
    gradient = statement["mechanisms"]["gradient"]
    assert gradient["stages"] == ["dp", "toy-mask"]
    assert gradient["claims"][1] == CLAIM and TRUST in statement["trust"]
    assert EXCLUDED in statement["exclusions"]
    assert statement["dp"] == "DP on kinds gradient"


def test_the_audit_reads_the_toys_readers_and_parameters(toy, tmp_path):
    """Adversaries: an honest-but-curious server, which does not hold the toy key, and the
    server with a colluding client, which does; a toy-masked upload is hidden from the first
    only, and the same upload without the toy is read by both."""
    spec = tmp_path / "toy.toml"
    spec.write_text('name = "toy"\n[[stages]]\nstage = "toy-mask"\nprotects = ["gradient"]\n'
                    "clients = 3\n")
    masked = [_message(0, "gradient", "client-1", "server", ["dp", "toy-mask"], "toy_input")]
    clear = [{**masked[0], "stages": ["dp"]}]
    for name, records, model, status in [
            ("a", masked, "honest-but-curious-server", PASS),
            ("b", masked, "colluding-clients", FAIL), ("c", clear, "honest-but-curious-server",
                                                       FAIL)]:
        hidden = _verdicts(_folder(tmp_path / name, records, str(spec)), model)["hidden"]
        assert hidden.status == status, (name, hidden.evidence)
    assert "toy-masked under the key every client holds; read by the server and its colluding" \
        in _verdicts(tmp_path / "b", "colluding-clients")["hidden"].evidence[1]
    for clients, status in [(2, FAIL), (3, PASS)]:
        folder = _folder(tmp_path / f"n{clients}", masked, str(spec), clients=clients)
        parameters = _verdicts(folder, "honest-but-curious-server")["parameters"]
        assert parameters.status == status
        assert "1 logged message(s) name the toy" in parameters.evidence
        assert f"{'met' if status == PASS else 'NOT MET'}: toy mask needs 3 clients" in \
            parameters.evidence


def test_a_reader_the_audit_does_not_know_is_refused_by_name(toy, tmp_path, monkeypatch):
    """A stage whose readers the audit would not match against any adversary (a misspelt
    ``sever``) would pass as hidden from everyone: the audit refuses it instead."""
    monkeypatch.setattr(ToyMask, "readers", staticmethod(
        lambda record, relayed: (frozenset({"sever"}), "misspelt")))
    masked = [_message(0, "gradient", "client-1", "server", ["toy-mask"], "toy_input")]
    with pytest.raises(ProtocolError, match=r"stage 'toy-mask' says \['sever'\] can read"):
        _verdicts(_folder(tmp_path / "run", masked), "honest-but-curious-server")


def test_the_toys_input_phase_counts_as_an_input_to_an_aggregate(toy):
    """Adversary: a server that counts a client in an aggregate it sent nothing to; the
    toy's input (phase toy_input) is an input, the rule still catches the one that is not."""
    assert "toy_input" in input_phases()
    rules = ProtocolRules({party: bytes(32) for party in ("server", "client-1", "client-2")})
    records = [{"kind": "gradient", "sender": "client-1", "recipient": "server",
                "phase": "toy_input"},
               {"kind": "event", "sender": "server", "recipient": "log", "event": "aggregated",
                "phase": "aggregate", "party": "*", "of_kind": "gradient",
                "included": ["client-1", "client-2"]}]
    found = [rules.check({**record, "seq": seq, "round": 1, "stages": []}, None)
             for seq, record in enumerate(records)]
    assert found == [None, "record 1: client-2 is counted in the round-1 gradient aggregate but "
                           "sent no input to it (upload or masked_input or toy_input)"]


def test_a_clients_snapshot_saves_and_restores_the_toys_memory(toy):
    """Adversary: a Flower node restarted between two messages. The toy's key and count must
    come back through its own codec, or the client would mask under a lost key."""
    build_protocol(toy)  # a node builds its protocol before it saves or restores its client
    client = new_client("client-1", torch.zeros(4, 2))
    client.memory["toy-mask"] = {"rounds": 3, "key": bytes(range(16))}
    header, arrays = unpack(pack(*client_state(client)))
    assert header["memory"]["toy-mask"] == {"rounds": 3}
    copy = new_client("client-1", torch.zeros(4, 2))
    restore_client(copy, header, arrays)
    assert copy.memory["toy-mask"] == {"rounds": 3, "key": bytes(range(16))}
    client.memory["toy-other"] = {}  # memory no stage registered a codec for
    with pytest.raises(ProtocolError, match="keeps 'toy-other' in its memory, which no stage "
                                            "registered a codec for"):
        client_state(client)


def test_a_client_runs_the_toys_step_only_under_a_protocol_with_the_toy(toy):
    """Adversary: a server asking a client whose protocol has no toy stage (plaintext) for the
    toy's step. A client under the toy spec answers it (its endpoint's table holds the toy's
    ``client_actions``, with no edit to the endpoint); the plaintext client refuses it by name
    in its signed ``rejected`` event, and so does the toy client for a kind the toy does not
    protect."""
    client = new_client("client-1", torch.zeros(4, 2))
    client.memory["toy-mask"] = {"rounds": 3, "key": bytes(16)}
    registry = Registry.of([new_server(), client, new_client("client-2", torch.zeros(4, 2))])
    ask = Request(1, "gradient", "toy_input", "toy_input", "toy-mask.key")
    answered = ClientEndpoint(client, registry, build_protocol(toy))(ask, None)
    assert answered.events == () and answered.envelope.sender == "client-1"
    for protocol, request in [(build_protocol(toy), replace(ask, kind="model")),
                              (load_protocol("plaintext"), ask)]:
        refused = ClientEndpoint(client, registry, protocol)(request, None)
        [event] = refused.events
        assert refused.envelope is None and event["event"] == "rejected"
        assert "refused action 'toy-mask.key'" in event["detail"]
