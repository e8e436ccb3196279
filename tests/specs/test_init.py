"""The one spec loader (secureffm/specs/__init__.py), shared by protocol specs and threat
models."""

from __future__ import annotations

import pytest

from secureffm.errors import ConfigError, ProtocolError
from secureffm.specs import check_keys, read_spec_file, shipped


def test_shipped_specs_are_listed_per_folder():
    assert {"plaintext", "secagg", "sealed"} <= set(shipped("protocols"))
    assert "faulty-uploads" in shipped("threat_models")


def test_a_shipped_spec_and_a_users_file_read_alike(tmp_path):
    values, source = read_spec_file("protocols", "plaintext", "protocol", ProtocolError)
    assert values["name"] == "plaintext" and source == "plaintext.toml"
    mine = tmp_path / "mine.toml"
    mine.write_text('name = "mine"\nstages = []\n')
    assert read_spec_file("protocols", str(mine), "protocol", ProtocolError) == (
        {"name": "mine", "stages": []}, str(mine))


@pytest.mark.parametrize(("error", "what"), [(ProtocolError, "protocol"),
                                             (ConfigError, "threat model")])
def test_failures_name_the_spec_and_raise_the_callers_error(tmp_path, error, what):
    with pytest.raises(error, match=f"unknown {what} 'nope'; shipped: "):
        read_spec_file("protocols", "nope", what, error)
    with pytest.raises(error, match="does not exist"):
        read_spec_file("protocols", str(tmp_path / "gone.toml"), what, error)
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(error, match=f"{what} .*broken.toml is not valid TOML"):
        read_spec_file("protocols", str(broken), what, error)


def test_check_keys_names_the_unknown_and_the_missing_key():
    with pytest.raises(ConfigError, match="here: unknown key 'c'; allowed keys are a, b"):
        check_keys({"a": 1, "c": 2}, {"a", "b"}, (), "here", ConfigError)
    with pytest.raises(ProtocolError, match="here: missing required key 'b'"):
        check_keys({"a": 1}, {"a", "b"}, ("b",), "here", ProtocolError)
