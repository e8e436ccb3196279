import pytest

from secureffm.errors import ProtocolError
from secureffm.protocols import known_protocols, load_protocol


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
