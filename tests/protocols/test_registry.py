"""Spec loading and stage registration (secureffm/protocols/registry.py).

Truths used: the spec files shipped in secureffm/specs/protocols/, and the module docstring's
rules (keys ``name``, ``description``, ``stages``; each stage table checked by name).
"""

from __future__ import annotations

from importlib import resources

import pytest

from secureffm.errors import ProtocolError
from secureffm.protocols import load_protocol
from secureffm.protocols.registry import (
    STAGES,
    ProtocolSpec,
    check_protects,
    check_table,
    known_protocols,
    read_spec,
    register_stage,
)


def test_plaintext_ships_and_reads_by_name_and_path(tmp_path):
    assert "plaintext" in known_protocols()
    assert read_spec("plaintext") == ProtocolSpec("plaintext", read_spec("plaintext").description,
                                                  (), "plaintext.toml")
    assert load_protocol("plaintext").spec.stages == ()
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\ndescription = "d"\nstages = [{stage = "dp"}]\n')
    assert read_spec(str(path)) == ProtocolSpec("mine", "d", ({"stage": "dp"},), str(path))


@pytest.mark.parametrize("text, fragment", [
    ('name = "x"\nstages = []\ncolour = 1\n', "unknown key 'colour'"),
    ('stages = []\n', "missing required key 'name'"),
    ('name = "x"\n', "missing required key 'stages'"),
    ('name = "x"\nstages = [1]\n', "list of tables"),
    ('name = "x"\nstages = {stage = "dp"}\n', "list of tables"),
    ('name = \n', "not valid TOML"),
])
def test_malformed_specs_are_rejected_with_the_reason(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProtocolError, match=fragment) as info:
        read_spec(str(path))
    assert str(path) in str(info.value)  # the message names the file
    with pytest.raises(ProtocolError, match=fragment):  # and loading stops at the same place
        load_protocol(str(path))


def test_unknown_protocol_name_lists_the_shipped_ones():
    with pytest.raises(ProtocolError, match="unknown protocol .telepathy.; shipped: .*plaintext"):
        read_spec("telepathy")


def test_every_shipped_spec_loads_under_its_own_name():
    folder = resources.files("secureffm.specs") / "protocols"
    files = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))
    assert known_protocols() == files and len(files) >= 9
    for name in files:
        assert read_spec(name).name == name and read_spec(name).source == f"{name}.toml"
        assert load_protocol(name).name == name


def test_a_missing_spec_file_is_named(tmp_path):
    with pytest.raises(ProtocolError, match="protocol file .*nothing.toml' does not exist"):
        read_spec(str(tmp_path / "nothing.toml"))


def test_a_registered_stage_is_found_by_its_spec_name(tmp_path):
    """Registered here for the test only: a client stage with no parameters."""
    class _Marker:
        name, role, phases = "marker", "client", ()
        can_protect = frozenset({"gradient"})
        memory = ()  # keeps nothing in a client's memory

        def __init__(self, protects):
            self.protects = protects

        @classmethod
        def from_table(cls, table, source):
            return cls(tuple(table["protects"]))

        def validate_for(self, clients):
            pass

    assert "marker" not in STAGES
    assert register_stage(_Marker) is _Marker  # usable as a class decorator
    try:
        assert STAGES["marker"] is _Marker
        path = tmp_path / "spec.toml"
        path.write_text('name = "m"\n[[stages]]\nstage = "marker"\nprotects = ["gradient"]\n')
        protocol = load_protocol(str(path))
        assert isinstance(protocol.stages[0], _Marker)
        assert protocol.client_stages("gradient") == ("marker",)
    finally:
        del STAGES["marker"]


def test_table_and_kind_checks_name_what_is_wrong():
    with pytest.raises(ProtocolError, match="here: unknown key 'x'; allowed keys are a, b"):
        check_table({"stage": "s", "x": 1}, {"stage", "a", "b"}, (), "here")
    with pytest.raises(ProtocolError, match="here: missing required key 'a'"):
        check_table({"b": 1}, {"a", "b"}, ("a",), "here")
    check_table({"stage": "s", "a": 1}, {"stage", "a", "b"}, ("a",), "here")  # fine

    class _Stage:
        name, can_protect = "s", frozenset({"gradient"})

    with pytest.raises(ProtocolError, match="stage 's' cannot protect kind 'measure': why; it "
                                            "protects gradient"):
        check_protects(("gradient", "measure"), _Stage, "here", "why")
    check_protects(("gradient",), _Stage, "here", "why")  # fine
