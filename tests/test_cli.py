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


def test_audit_needs_verify_or_pin(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["audit"])
    assert exit_.value.code == 2 and "--verify" in capsys.readouterr().err
