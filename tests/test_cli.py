"""The command line: one option per config field, and errors a user can cause exit 2 with a
message naming what to change, never a traceback."""

from __future__ import annotations

import dataclasses

import pytest

from secureffm.cli import build_parser, main
from secureffm.config import RunConfig


def test_every_config_field_is_an_option_of_run():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    flags = {flag for action in run._actions for flag in action.option_strings}
    missing = [f.name for f in dataclasses.fields(RunConfig)
               if "--" + f.name.replace("_", "-") not in flags]
    assert missing == []


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--method", "nope"], "method = 'nope'"),
    (["run", "--rounds", "x"], "rounds = 'x'"),
    (["fedwad", "--clients", "1"], "clients = 1"),
    (["audit", "--pin", "/nonexistent/run"], "is missing"),
])
def test_a_bad_option_exits_2_naming_it(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_audit_needs_verify_pin_or_a_threat_model(capsys):
    assert main(["audit"]) == 2
    assert "--threat-model" in capsys.readouterr().err


def test_flower_keys_and_app_write_what_a_deployment_needs(tmp_path, capsys, monkeypatch):
    """``flower-keys`` provisions one key file per party and parties.json; ``flower-app``
    writes a Flower App whose run config carries the run (its folder made absolute: the
    ServerApp runs in another process) and the keys folder, and never a private key."""
    monkeypatch.chdir(tmp_path)
    assert main(["flower-keys", str(tmp_path / "keys"), "--clients", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "client-1.key", "client-2.key", "parties.json", "server.key"]
    assert main(["flower-app", str(tmp_path / "app"), "--keys", str(tmp_path / "keys"),
                 "--clients", "2", "--rounds", "7", "--out", "relative/run"]) == 0
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert '\\"rounds\\": 7' in text and str(tmp_path / "keys") in text
    assert str(tmp_path / "relative" / "run") in text
    for key in (tmp_path / "keys").glob("*.key"):
        assert key.read_text() not in text
    assert "flwr run" in capsys.readouterr().out


def test_flower_keys_refuses_a_folder_that_holds_keys(tmp_path, capsys):
    assert main(["flower-keys", str(tmp_path), "--clients", "2"]) == 0
    assert main(["flower-keys", str(tmp_path), "--clients", "2"]) == 2
    assert "already holds key files" in capsys.readouterr().err
