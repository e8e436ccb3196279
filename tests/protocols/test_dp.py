"""The ``dp`` stage's spec (secureffm/protocols/dp.py): what it accepts and what it refuses.

Truths used: the shipped spec files as written, and the module docstring's rules (distributed
noise needs secure aggregation and the RDP accountant; colluders only with distributed noise).
"""

from __future__ import annotations

import pytest

from secureffm.errors import ProtocolError
from secureffm.privacy.settings import DPSettings
from secureffm.protocols import load_protocol
from secureffm.protocols.dp import DPStage

BASE = {"stage": "dp", "protects": ["gradient"], "clip": 1.0, "delta": 1e-5,
        "target_epsilon": 8.0}


def _stage(**changes) -> DPStage:
    table = {**BASE, **changes}
    return DPStage.from_table({k: v for k, v in table.items() if v is not None}, "spec.toml")


def test_a_table_becomes_settings_with_the_documented_defaults():
    stage = _stage(clip=2, noise_multiplier=1.5)
    assert stage.protects == ("gradient",)
    assert stage.settings == DPSettings(clip=2.0, delta=1e-5, target_epsilon=8.0,
                                        noise_multiplier=1.5, accountant="rdp", noise="local",
                                        colluders=0)
    assert isinstance(stage.settings.clip, float)


def test_the_shipped_dp_specs_carry_their_files_values():
    local = load_protocol("dp").dp.settings
    assert local == DPSettings(1.0, 1e-5, 8.0, None, "rdp", "local", 0)
    distributed = load_protocol("dp-secagg-distributed")
    assert distributed.dp.settings.noise == "distributed"
    assert distributed.dp_for("gradient") is distributed.dp.settings
    assert distributed.dp_for("model") is None


@pytest.mark.parametrize("changes, fragment", [
    ({"clip": None}, "missing required key 'clip'"),
    ({"epsilon": 3.0}, "unknown key 'epsilon'"),
    ({"protects": ["scalar"]}, "cannot protect kind 'scalar'"),
    ({"delta": 1.0}, "delta = 1.0; it must be below 1"),
    ({"delta": 0}, "delta = 0; give a positive number"),
    ({"target_epsilon": -1.0}, "target_epsilon = -1.0; give a positive number"),
    ({"noise_multiplier": True}, "noise_multiplier = True; give a positive number"),
    ({"clip": "1"}, "clip = '1'; give a positive number"),
    ({"noise": "central"}, "noise = 'central'; use 'local'"),
    ({"accountant": "moments"}, "accountant = 'moments'; use 'rdp' or 'prv'"),
    ({"colluders": -1, "noise": "distributed"}, "colluders = -1"),
    ({"colluders": True, "noise": "distributed"}, "colluders = True"),
    ({"colluders": 1}, "colluders applies to distributed noise only"),
    ({"noise": "distributed", "accountant": "prv"}, "use accountant = 'rdp'"),
])
def test_a_bad_dp_table_is_refused_naming_the_key(changes, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        _stage(**changes)


def test_distributed_noise_outside_secure_aggregation_is_refused(tmp_path):
    spec = tmp_path / "alone.toml"
    spec.write_text('name = "alone"\n[[stages]]\nstage = "dp"\nprotects = ["gradient"]\n'
                    'clip = 1.0\ndelta = 1e-5\ntarget_epsilon = 8.0\nnoise = "distributed"\n')
    with pytest.raises(ProtocolError, match="distributed noise on kind 'gradient' holds only "
                                            "inside secure aggregation"):
        load_protocol(str(spec))


def test_dp_sends_nothing_of_its_own_and_marks_the_kinds_it_shaped():
    protocol = load_protocol("dp-secagg")
    assert DPStage.role == "client" and DPStage.phases == ()
    assert protocol.client_stages("gradient") == ("dp",)
    assert protocol.client_stages("model") == ()
    assert "model" in DPStage.can_protect  # DCFM's experts, trained with DP-SGD
