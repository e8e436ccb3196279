"""The Protocol built from a spec (secureffm/protocols/protocol.py), and the channel that
applies it (secureffm/protocols/channel.py) to a plaintext round.

Truths used: the spec files shipped in secureffm/specs/protocols/, the module docstring's rules
(one dp stage, one aggregate or seal stage per kind), and numpy's weighted average for
what a plaintext round must return. Spec loading and stage registration: test_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, MessageLog
from secureffm.federation.faults import Fault, FaultPlan
from secureffm.federation.parties import new_client
from secureffm.protocols import load_protocol
from secureffm.protocols.aggregation import plain_aggregate
from secureffm.protocols.link import Link
from secureffm.protocols.protocol import PLAIN_PHASES
from secureffm.protocols.registry import STAGES, register_stage
from secureffm.protocols.sealed import SealedStage
from secureffm.protocols.secagg import MALICIOUS_PHASES as SECAGG_PHASES
from secureffm.protocols.secagg import SecAggStage
from secureffm.runs.scaffold import open_channel

VECTOR = {"gradient": ((2,), np.dtype(np.float32))}


def test_a_spec_naming_an_unregistered_stage_lists_the_known_ones(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[[stages]]\nstage = "magic"\n')
    with pytest.raises(ProtocolError, match=r"stages\[0\] names unknown stage 'magic'; known "
                                            r"stages: .*secagg"):
        load_protocol(str(path))


def _spec(tmp_path, stages: str):
    path = tmp_path / "spec.toml"
    path.write_text('name = "mine"\n' + stages)
    return str(path)


DP_TABLE = '[[stages]]\nstage = "dp"\nprotects = ["gradient"]\nclip = 1.0\ndelta = 1e-5\n'
SEALED_MODEL = '[[stages]]\nstage = "sealed"\nprotects = ["model"]\n'
SECAGG = ('[[stages]]\nstage = "secagg"\nprotects = ["{kind}"]\nthreshold = 0.6\n'
          'neighbours = 0\nclip = 8.0\nlevels = 4194304\nbits = 32\n')


@pytest.mark.parametrize("stages, fragment", [
    (DP_TABLE + DP_TABLE, "more than one 'dp' stage"),
    (SEALED_MODEL + SEALED_MODEL, "kind 'model' is protected by two seal stages"),
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
        memory = ()  # keeps nothing in a client's memory

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


def test_phases_are_the_plain_ones_then_each_stages_in_order():
    assert load_protocol("plaintext").phases == PLAIN_PHASES
    assert load_protocol("dp-secagg").phases == PLAIN_PHASES + SECAGG_PHASES


def test_stage_lookup_by_name_and_kind():
    protocol = load_protocol("dp-secagg")
    assert protocol.stage_for("secagg", "gradient").name == "secagg"
    assert protocol.stage_for("secagg", "model") is None
    assert protocol.stage_for("sealed", "gradient") is None


def test_each_kind_has_its_aggregator_and_sealer_and_refuses_the_other_path():
    protocol = load_protocol("dp-secagg")
    assert isinstance(protocol.aggregator("gradient"), SecAggStage)
    assert protocol.sealer("gradient") is None and protocol.aggregator("model") is None
    with pytest.raises(ProtocolError, match="kind 'gradient' is protected by the 'secagg'"):
        protocol.check_individual("gradient")
    protocol.check_individual("model")  # not aggregated: may go one by one
    sealed = load_protocol("dp-sealed")
    assert isinstance(sealed.sealer("model"), SealedStage) and sealed.aggregator("model") is None
    plain = load_protocol("plaintext")
    assert plain.aggregator("gradient") is None and plain.sealer("model") is None


def test_geodesic_privacy_comes_from_the_randomized_t_stage_only():
    protocol = load_protocol("fedwad-private")
    stage = protocol.stage_for("randomized-t", "measure")
    privacy = protocol.geodesic_privacy()
    assert (privacy.t_low, privacy.t_high, privacy.noise_std) == (stage.t_low, stage.t_high,
                                                                  stage.noise_std)
    assert protocol.geodesic_privacy("scalar") is None
    assert load_protocol("plaintext").geodesic_privacy() is None


def _channel(tmp_path, protocol="plaintext", faults=None):
    clients = [new_client(f"client-{i}", torch.zeros(4, 2), deterministic_seed=0)
               for i in (1, 2, 3)]
    return open_channel(load_protocol(protocol), clients,
                        MessageLog(tmp_path / "messages.jsonl"), faults)


def test_a_plaintext_round_is_numpys_weighted_average_of_what_arrived(tmp_path):
    channel = _channel(tmp_path)
    updates = {"client-1": [1.0, 2.0], "client-2": [3.0, -1.0], "client-3": [0.5, 0.0]}
    weights = {"client-1": 0.2, "client-2": 0.3, "client-3": 0.5}
    result = channel.aggregate(
        1, "gradient", lambda c: {"gradient": np.array(updates[c.id], np.float32)}, weights,
        VECTOR)
    expected = np.average(list(updates.values()), axis=0, weights=list(weights.values()))
    np.testing.assert_allclose(result.payload["gradient"], expected, rtol=1e-6)
    assert result.included == ["client-1", "client-2", "client-3"] and result.dropped == {}


def test_a_round_with_no_client_left_aborts_cleanly_naming_why(tmp_path):
    faults = FaultPlan("all-drop", tuple(Fault("drop", f"client-{i}", "upload", (1,))
                                         for i in (1, 2)) + (
        Fault("lose", "client-3", "upload", (1,)),))
    channel = _channel(tmp_path, faults=faults)
    link = Link(channel.transport, channel.parties, channel.clients, 1, "gradient",
                endpoints=channel.endpoints)
    result = plain_aggregate(link, lambda c: {"gradient": np.zeros(2, np.float32)},
                             {f"client-{i}": 1 / 3 for i in (1, 2, 3)}, VECTOR)
    assert result.payload is None and result.included == []
    assert result.reason == "no client update was accepted"
    assert result.dropped == {"client-1": "offline at phase upload",
                              "client-2": "offline at phase upload",
                              "client-3": "its upload was rejected or never arrived"}


def test_distributed_noise_parameters_must_match_the_spec(tmp_path):
    channel = _channel(tmp_path)
    with pytest.raises(ProtocolError, match="distributed noise parameters must be given "
                                            "exactly when"):
        channel.aggregate(1, "gradient", lambda c: {}, {}, VECTOR, noise=object())


def test_an_aggregated_kind_cannot_be_sent_one_by_one(tmp_path):
    channel = _channel(tmp_path, "secagg")
    with pytest.raises(ProtocolError, match="kind 'gradient' is protected by the 'secagg' "
                                            "stage of protocol 'secagg'"):
        channel.send(1, "upload", "gradient", "client-1", SERVER,
                     {"gradient": np.zeros(2, np.float32)})
    with pytest.raises(ProtocolError, match="kind 'gradient' is protected by the 'secagg'"):
        channel.all_gather(1, "gradient", lambda c: {"gradient": np.zeros(2, np.float32)})
    channel.close()
    assert channel.transport.log.count_by_kind["gradient"] == 0  # refused before sending


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


def test_a_protocol_protecting_none_of_a_methods_kinds_is_refused():
    """Under `sealed` (models only), FFM's gradients would travel in the clear while the run
    carries a protection's name: refused, naming what the protocol protects and what is sent."""
    with pytest.raises(ProtocolError, match="protocol 'sealed' protects model, none of what "
                                            "method 'got' sends \\(gradient, dual_update\\)"):
        load_protocol("sealed").check_protects_any(("gradient", "dual_update"), "method 'got'")
    load_protocol("secagg").check_protects_any(("gradient", "dual_update"), "method 'got'")
    load_protocol("plaintext").check_protects_any(("model",), "DCFM")  # says it is clear
    load_protocol("dp-secagg").check_protects_any(("gradient",), "method 'vanilla'")
