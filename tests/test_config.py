import re
from pathlib import Path

import pytest

import secureffm.specs
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
    ("max_grad_norm", -1.0, "max_grad_norm = -1.0: must be a finite number >= 0"),
    ("max_grad_norm", "inf", "max_grad_norm = inf"),
    ("accountant", "pvr", "accountant = 'pvr': choose one of rdp, prv.*did you mean 'prv'"),
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


def test_a_target_epsilon_above_the_sanity_bound_needs_allow_weak_privacy():
    """A user who types 1e9 for 1 (or asks for a guarantee that excludes nothing) is stopped
    by name; --allow-weak-privacy runs it anyway (docs/privacy.md, "Refused up front")."""
    from secureffm.config import WEAK_EPSILON

    assert load_config(None, {"target_epsilon": WEAK_EPSILON}).target_epsilon == WEAK_EPSILON
    with pytest.raises(ConfigError, match="target_epsilon = 1e\\+09, above 20.*"
                                          "--allow-weak-privacy"):
        load_config(None, {"target_epsilon": "1e9"})
    assert load_config(None, {"target_epsilon": "1e9", "allow_weak_privacy": True})


def test_a_weak_epsilon_in_a_protocol_spec_is_refused_before_the_folder(tmp_path, monkeypatch,
                                                                         capsys):
    """The bound holds for a spec's own target too, checked before any file is written."""
    spec = (Path(secureffm.specs.__file__).parent / "protocols" / "dp.toml").read_text()
    weak = re.sub(r"target_epsilon\s*=\s*[0-9.e+]+", "target_epsilon = 1000.0", spec)
    assert weak != spec
    (tmp_path / "weak.toml").write_text(weak)
    monkeypatch.chdir(tmp_path)
    tiny = ["--rounds", "2", "--shard-size", "200", "--batch-size", "32", "--eval-samples",
            "100", "--nfe", "1", "--no-progress"]  # should the check fail, the run is short
    assert main(["run", "--protocol", str(tmp_path / "weak.toml"), *tiny, "--out", "run"]) == 2
    assert "target_epsilon = 1000" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
