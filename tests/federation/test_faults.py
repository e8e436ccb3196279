"""Fault plans read from threat models (secureffm/federation/faults.py).

Truths used: the shipped threat models as written in secureffm/specs/threat_models/, and the
documented meaning of each field (every round when ``rounds`` is omitted, every recipient when
``recipient`` is, a drop lasting from its phase to the end of the round).
"""

from __future__ import annotations

from importlib import resources

import pytest

from secureffm.errors import ConfigError
from secureffm.federation.faults import (
    ACTIONS,
    SERVER_DEVIATIONS,
    Fault,
    FaultPlan,
    load_threat_model,
)
from secureffm.protocols import load_protocol

PHASES = ("broadcast", "upload", "shares", "masked_input", "unmask")
CLIENTS = ["client-1", "client-2", "client-3"]


def _plan(tmp_path, body: str):
    path = tmp_path / "model.toml"
    path.write_text('name = "m"\n' + body)
    return load_threat_model(str(path))


@pytest.mark.parametrize("table, fragment", [
    ('action = "drop"\nparty = "client-1"\nphase = "upload"\nsize = 3', "unknown key 'size'"),
    ('action = "drop"\nparty = "client-1"', "missing required key 'phase'"),
    ('action = "vanish"\nparty = "client-1"\nphase = "upload"', "action = 'vanish'"),
    ('action = "drop"\nparty = 1\nphase = "upload"', "party = 1; give a string"),
    ('action = "lose"\nparty = "server"\nphase = "upload"\nrecipient = ["client-1"]',
     "recipient = ['client-1']; give a string"),
    ('action = "drop"\nparty = "client-1"\nphase = "upload"\nrounds = ["two"]',
     "rounds = ['two']; give a list of round numbers"),
    ('action = "drop"\nparty = "client-1"\nphase = "upload"\nrounds = 2',
     "rounds = 2; give a list"),
])
def test_a_malformed_fault_table_is_refused_at_load(tmp_path, table, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[")):
        _plan(tmp_path, "[[faults]]\n" + table + "\n")


@pytest.mark.parametrize("body, fragment", [
    ('colour = "red"\n', "unknown key 'colour'"),
    ('faults = 3\n', "faults must be a list of \\[\\[faults\\]\\] tables"),
    ('faults = [1]\n', r"faults\[0\] is not a table"),
    ('[[faults]]\naction = "drop"\nparty = "client-1"\nphase = "upload"\nrounds = [-1]\n',
     r"rounds = \[-1\]"),
    ('[[faults]]\naction = "drop"\nparty = "client-1"\nphase = "upload"\nrounds = [true]\n',
     r"rounds = \[True\]"),
    ('name = \n', "not valid TOML"),
])
def test_a_malformed_threat_model_is_refused_naming_the_key(tmp_path, body, fragment):
    with pytest.raises(ConfigError, match=fragment):
        _plan(tmp_path, body)


def test_a_threat_model_is_found_by_name_or_path_and_unknown_names_list_the_shipped():
    with pytest.raises(ConfigError, match="unknown threat model 'gremlins'; shipped: "
                                          "colluding-clients, drop-after-sharing, "
                                          "eavesdropper, faulty-uploads"):
        load_threat_model("gremlins")
    with pytest.raises(ConfigError, match="'missing.toml' does not exist"):
        load_threat_model("missing.toml")


def test_every_shipped_threat_model_loads_as_written():
    """Each shipped file's faults come back field for field, omitted fields at their
    defaults."""
    folder = resources.files("secureffm.specs") / "threat_models"
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))
    assert names == ["colluding-clients", "drop-after-sharing", "eavesdropper",
                     "faulty-uploads", "folder-writer", "honest-but-curious-server",
                     "lose-shares-delivery", "malicious-server"]
    for audit_only in ("colluding-clients", "eavesdropper", "folder-writer",
                       "honest-but-curious-server"):  # an [adversary] table, no faults
        assert load_threat_model(audit_only).faults == ()
    deviations = load_threat_model("malicious-server")
    assert [(f.action, f.party, f.phase, f.recipient, f.rounds) for f in deviations.faults] == [
        ("substitute_keys", "server", "keys", "client-2", (1,)),
        ("split_view", "server", "consistency", "client-3", (2,)),
        ("invent_survivor", "server", "unmask_request", "client-1", (3,)),
        ("split_broadcast", "server", "broadcast", "client-2", (4,)),
        ("ask_twice", "server", "unmask_request", "client-3", (5,))]
    deviations.check_phases(load_protocol("secagg").phases, CLIENTS)
    assert load_threat_model("drop-after-sharing").faults == (
        Fault("drop", "client-2", "masked_input", (2, 3, 4)),)
    plan = load_threat_model("faulty-uploads")
    assert plan.name == "faulty-uploads" and plan.description.startswith("corrupted")
    assert plan.faults == (Fault("corrupt", "client-1", "upload", (2,)),
                           Fault("replay", "client-2", "upload", (3,)),
                           Fault("unknown_sender", "client-99", "upload", (4,)))
    plan.check_phases(load_protocol("plaintext").phases, CLIENTS)


def test_the_shipped_lost_delivery_model_targets_the_servers_shares_to_client_2():
    plan = load_threat_model("lose-shares-delivery")
    assert plan.faults == (Fault("lose", "server", "shares", (2, 3), "client-2"),)
    plan.check_phases(load_protocol("secagg").phases, ["client-1", "client-2"])
    with pytest.raises(ConfigError, match="phase 'shares' is not a phase"):
        plan.check_phases(load_protocol("plaintext").phases, ["client-1", "client-2"])


def test_a_fault_hits_its_rounds_or_every_round():
    assert all(Fault("lose", "client-1", "upload").hits(r) for r in (0, 1, 99))
    listed = Fault("lose", "client-1", "upload", (2, 5))
    assert [r for r in range(8) if listed.hits(r)] == [2, 5]


def test_find_matches_action_party_phase_round_and_recipient():
    to_two = Fault("corrupt", "server", "shares", (3,), "client-2")
    to_all = Fault("replay", "server", "shares")
    plan = FaultPlan("m", (to_two, to_all))
    assert plan.find("corrupt", "server", 3, "shares", "client-2") is to_two
    assert plan.find("replay", "server", 7, "shares", "client-1") is to_all
    for miss in [("corrupt", "server", 3, "shares", "client-1"),   # another recipient
                 ("corrupt", "server", 4, "shares", "client-2"),   # another round
                 ("corrupt", "server", 3, "upload", "client-2"),   # another phase
                 ("corrupt", "client-1", 3, "shares", "client-2"),  # another party
                 ("delay", "server", 3, "shares", "client-2")]:    # another action
        assert plan.find(*miss) is None, miss


def test_a_drop_lasts_from_its_phase_to_the_end_of_its_round():
    plan = FaultPlan("m", (Fault("drop", "client-2", "shares", (4,)),))
    offline = [p for p in PHASES if plan.dropped("client-2", 4, p, PHASES)]
    assert offline == ["shares", "masked_input", "unmask"]
    assert not any(plan.dropped("client-2", 5, p, PHASES) for p in PHASES)
    assert not any(plan.dropped("client-1", 4, p, PHASES) for p in PHASES)
    assert not plan.dropped("client-2", 4, "relay", PHASES)  # not a phase of this protocol


@pytest.mark.parametrize("fault, fragment", [
    (Fault("drop", "client-1", "relay"), "phase 'relay' is not a phase of this protocol; "
                                         "its phases are broadcast, upload"),
    (Fault("lose", "client-7", "upload"), "party 'client-7' does not exist; parties are "
                                          "server, client-1, client-2"),
    (Fault("drop", "server", "upload"), "the server cannot go offline"),
    (Fault("unknown_sender", "client-2", "upload"), "'client-2' is registered"),
    (Fault("unknown_sender", "mallory", "upload", (), "client-1"), "recipient 'client-1'"),
    (Fault("corrupt", "client-1", "upload", (), "client-1"), "recipient 'client-1'"),
])
def test_check_phases_names_the_fault_and_what_to_change(fault, fragment):
    plan = FaultPlan("m", (fault,))
    with pytest.raises(ConfigError, match=f"threat model 'm': {fault.action} fault on "
                                          f"'{fault.party}'.*{fragment}"):
        plan.check_phases(PHASES, CLIENTS)


def test_every_action_on_a_clients_upload_is_accepted():
    """(The malicious server's deviations have their own phase and party:
    tests/protocols/test_adversary.py.)"""
    for action in (a for a in ACTIONS if a not in SERVER_DEVIATIONS):
        party = "mallory" if action == "unknown_sender" else "client-1"
        FaultPlan("m", (Fault(action, party, "upload"),)).check_phases(PHASES, CLIENTS)
