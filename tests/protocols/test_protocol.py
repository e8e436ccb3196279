"""Protocol specs and the Protocol that applies them (secureffm/protocols/protocol.py).

Truths used: the spec files shipped in secureffm/specs/protocols/, the module docstring's rules
(one dp stage, one aggregate or transport stage per kind), and numpy's weighted average for
what a plaintext round must return.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, InProcessEngine, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.parties import new_client
from secureffm.protocols import known_protocols, load_protocol
from secureffm.protocols.protocol import (
    PLAIN_PHASES,
    STAGES,
    check_protects,
    check_table,
    plain_aggregate,
    register_stage,
)
from secureffm.protocols.secagg import PHASES as SECAGG_PHASES

VECTOR = {"gradient": ((2,), np.dtype(np.float32))}


def test_plaintext_ships_and_loads_by_name_and_path(tmp_path):
    assert "plaintext" in known_protocols()
    assert load_protocol("plaintext").spec.stages == ()
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nstages = []\n')
    assert load_protocol(str(path)).name == "mine"


@pytest.mark.parametrize("text, fragment", [
    ('name = "x"\nstages = []\ncolour = 1\n', "unknown key 'colour'"),
    ('stages = []\n', "missing required key 'name'"),
    ('name = "x"\n[[stages]]\nstage = "magic"\n', "unknown stage 'magic'"),
    ('name = "x"\nstages = [1]\n', "list of tables"),
    ('name = \n', "not valid TOML"),
])
def test_malformed_specs_are_rejected_with_the_reason(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProtocolError, match=fragment):
        load_protocol(str(path))


def test_unknown_protocol_name_lists_the_shipped_ones():
    with pytest.raises(ProtocolError, match="shipped protocols: .*plaintext"):
        load_protocol("telepathy")


def _spec(tmp_path, stages: str):
    path = tmp_path / "spec.toml"
    path.write_text('name = "mine"\n' + stages)
    return str(path)


def test_every_shipped_spec_loads_under_its_own_name():
    folder = resources.files("secureffm.specs") / "protocols"
    files = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))
    assert known_protocols() == files and len(files) >= 9
    for name in files:
        assert load_protocol(name).name == name


def test_a_missing_spec_file_is_named(tmp_path):
    with pytest.raises(ProtocolError, match="protocol spec file .*nothing.toml' does not exist"):
        load_protocol(str(tmp_path / "nothing.toml"))


DP_TABLE = '[[stages]]\nstage = "dp"\nprotects = ["gradient"]\nclip = 1.0\ndelta = 1e-5\n'
SEALED_MODEL = '[[stages]]\nstage = "sealed"\nprotects = ["model"]\n'
SECAGG = ('[[stages]]\nstage = "secagg"\nprotects = ["{kind}"]\nthreshold = 0.6\n'
          'neighbours = 0\nclip = 8.0\nlevels = 4194304\nbits = 32\n')


@pytest.mark.parametrize("stages, fragment", [
    (DP_TABLE + DP_TABLE, "more than one 'dp' stage"),
    (SEALED_MODEL + SEALED_MODEL, "kind 'model' is protected by two transport stages"),
    (SECAGG.format(kind="gradient") + SECAGG.format(kind="gradient"),
     "kind 'gradient' is protected by two aggregate stages"),
    (SECAGG.format(kind="model"), "stage 'secagg' cannot protect kind 'model'"),
])
def test_conflicting_or_impossible_stages_are_refused_naming_the_kind(tmp_path, stages,
                                                                     fragment):
    with pytest.raises(ProtocolError, match=fragment):
        load_protocol(_spec(tmp_path, stages))


def test_a_kind_both_aggregated_and_sealed_is_refused(tmp_path):
    """Registered here for the test only: an aggregate stage that protects models too."""
    class _ModelSum:
        name, role, phases = "model-sum", "aggregate", ()
        can_protect = frozenset({"model"})

        def __init__(self, protects):
            self.protects = protects

        @classmethod
        def from_table(cls, table, source):
            return cls(tuple(table["protects"]))

    register_stage(_ModelSum)
    try:
        stages = '[[stages]]\nstage = "model-sum"\nprotects = ["model"]\n' + SEALED_MODEL
        with pytest.raises(ProtocolError, match="kind 'model' is both aggregated and sent one "
                                                "by one"):
            load_protocol(_spec(tmp_path, stages))
    finally:
        del STAGES["model-sum"]


def test_a_stage_class_without_a_role_cannot_register():
    class _NoRole:
        name = "nameless"

    with pytest.raises(TypeError, match="needs a role"):
        register_stage(_NoRole)


def test_table_and_kind_checks_name_what_is_wrong():
    with pytest.raises(ProtocolError, match="here: unknown key 'x'; allowed keys are a, b"):
        check_table({"stage": "s", "x": 1}, {"stage", "a", "b"}, (), "here")
    with pytest.raises(ProtocolError, match="here: missing required key 'a'"):
        check_table({"b": 1}, {"a", "b"}, ("a",), "here")

    class _Stage:
        name, can_protect = "s", frozenset({"gradient"})

    with pytest.raises(ProtocolError, match="stage 's' cannot protect kind 'measure': why; it "
                                            "protects gradient"):
        check_protects(("gradient", "measure"), _Stage, "here", "why")


def test_phases_are_the_plain_ones_then_each_stages_in_order():
    assert load_protocol("plaintext").phases == PLAIN_PHASES
    assert load_protocol("dp-secagg").phases == PLAIN_PHASES + SECAGG_PHASES


def test_stage_lookup_by_name_and_kind():
    protocol = load_protocol("dp-secagg")
    assert protocol.stage_for("secagg", "gradient").name == "secagg"
    assert protocol.stage_for("secagg", "model") is None
    assert protocol.stage_for("sealed", "gradient") is None


def _engine(tmp_path, protocol="plaintext", faults=None):
    clients = [new_client(f"client-{i}", torch.zeros(4, 2), deterministic_seed=0)
               for i in (1, 2, 3)]
    return InProcessEngine(clients, load_protocol(protocol),
                           MessageLog(tmp_path / "messages.jsonl"), faults)


def test_a_plaintext_round_is_numpys_weighted_average_of_what_arrived(tmp_path):
    engine = _engine(tmp_path)
    updates = {"client-1": [1.0, 2.0], "client-2": [3.0, -1.0], "client-3": [0.5, 0.0]}
    weights = {"client-1": 0.2, "client-2": 0.3, "client-3": 0.5}
    result = engine.protocol.aggregate(
        engine, 1, "gradient",
        lambda c: {"gradient": np.array(updates[c.id], np.float32)}, weights, VECTOR)
    expected = np.average(list(updates.values()), axis=0, weights=list(weights.values()))
    np.testing.assert_allclose(result.payload["gradient"], expected, rtol=1e-6)
    assert result.included == ["client-1", "client-2", "client-3"] and result.dropped == {}


def test_a_round_with_no_client_left_aborts_cleanly_naming_why(tmp_path):
    faults = FaultPlan("all-drop", tuple(Fault("drop", f"client-{i}", "upload", (1,))
                                         for i in (1, 2)) + (
        Fault("lose", "client-3", "upload", (1,)),))
    engine = _engine(tmp_path, faults=faults)
    result = plain_aggregate(engine, 1, "gradient",
                             lambda c: {"gradient": np.zeros(2, np.float32)},
                             {f"client-{i}": 1 / 3 for i in (1, 2, 3)}, VECTOR)
    assert result.payload is None and result.included == []
    assert result.reason == "no client update was accepted"
    assert result.dropped == {"client-1": "offline at phase upload",
                              "client-2": "offline at phase upload",
                              "client-3": "its upload was rejected or never arrived"}


def test_distributed_noise_parameters_must_match_the_spec(tmp_path):
    engine = _engine(tmp_path)
    with pytest.raises(ProtocolError, match="distributed noise parameters must be given "
                                            "exactly when"):
        engine.protocol.aggregate(engine, 1, "gradient", lambda c: {}, {}, VECTOR,
                                  noise=object())


def test_an_aggregated_kind_cannot_be_sent_one_by_one(tmp_path):
    engine = _engine(tmp_path, "secagg")
    with pytest.raises(ProtocolError, match="kind 'gradient' is protected by the 'secagg' "
                                            "stage of protocol 'secagg'"):
        engine.protocol.send(engine, 1, "upload", "gradient", "client-1", SERVER,
                             {"gradient": np.zeros(2, np.float32)})


def test_a_dp_stage_that_leaves_out_a_senders_kind_is_refused_by_name():
    """A method under a protocol whose dp stage covers other kinds (FFM's gradients under
    `dp-sealed`, which protects DCFM's models) would train without DP while the protocol's name
    promises it: refused, naming the kind. Before, FFM ran such a protocol silently."""
    from secureffm.errors import ProtocolError

    protocol = load_protocol("dp-sealed")
    with pytest.raises(ProtocolError, match="does not protect 'gradient', which method 'got'"):
        protocol.dp_settings(("gradient", "dual_update"), "method 'got'")
    assert protocol.dp_settings(("model",), "method 'dcfm-a'") is protocol.dp.settings
    assert load_protocol("secagg").dp_settings(("gradient",), "method 'got'") is None
