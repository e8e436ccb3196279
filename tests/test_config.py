import pytest

from secureffm.cli import main
from secureffm.config import RunConfig, load_config
from secureffm.errors import ConfigError


def test_cli_options_override_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('method = "lot"\nrounds = 7\nnfe = [1, 3]\n')
    config = load_config(path, {"rounds": "9"})
    assert (config.method, config.rounds, config.nfe) == ("lot", 9, (1, 3))


def test_unknown_toml_key_is_named(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("roundz = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'roundz' \\(did you mean "
                       "'rounds'\\?\\)"):
        load_config(path)


@pytest.mark.parametrize("key, value, fragment", [
    ("method", "sgd", "method = 'sgd'"),
    ("rounds", 0, "rounds = 0"),
    ("ema_decay", 1.0, "ema_decay"),
    ("batch_size", "many", "batch_size"),
    ("nfe", "1,x", "nfe"),
    ("data", "imagenet", "data = 'imagenet'"),  # mnist is data since issue 21
    ("adaptive_solver", "rk45", "adaptive_solver"),
])
def test_bad_values_name_the_key(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, {key: value})


def test_bad_config_on_the_command_line_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("learning_rate = 0.1\n")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'learning_rate'" in err and "Traceback" not in err


def test_unknown_cli_option_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--roundz", "3"])
    assert exit_info.value.code == 2
    assert "--roundz" in capsys.readouterr().err


def test_resolved_config_roundtrips(tmp_path):
    from secureffm.config import write_config

    config = RunConfig(method="otcfm", nfe=(2, 5), progress=False)
    write_config(config, tmp_path / "config.toml")
    assert load_config(tmp_path / "config.toml") == config
