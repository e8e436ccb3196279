"""The command line: one option per config field, and errors a user can cause exit 2 with a
message naming what to change, never a traceback."""

from __future__ import annotations

import dataclasses
import json

import pytest

from secureffm.cli import build_parser, main
from secureffm.config import RunConfig
from secureffm.errors import ConfigError
from secureffm.federation.keyfiles import load_party_keys, load_registry


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
    """``flower-keys`` provisions one folder per party; ``flower-app`` writes a Flower App
    whose run config carries the run (its folder made absolute: the ServerApp runs in another
    process) and the server's keys folder, and never a private key."""
    monkeypatch.chdir(tmp_path)
    assert main(["flower-keys", str(tmp_path / "keys"), "--clients", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "client-1", "client-2", "server"]
    server = tmp_path / "keys" / "server"
    assert main(["flower-app", str(tmp_path / "app"), "--keys", str(server),
                 "--clients", "2", "--rounds", "7", "--out", "relative/run"]) == 0
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert '\\"rounds\\": 7' in text and str(server) in text
    assert str(tmp_path / "relative" / "run") in text
    for key in (tmp_path / "keys").rglob("*.key"):
        assert key.read_text() not in text
    assert "flwr run" in capsys.readouterr().out


def test_flower_keys_hands_each_party_a_folder_with_its_own_secret_keys_only(tmp_path):
    """Adversary: a hospital's node operator, who reads everything in the keys folder handed
    to its node. Before, ``flower-keys`` wrote every party's key file into one folder, which
    the single-host guide handed to the ServerApp and to every node: client-2's node could sign
    as client-1 or as the server. Now each party's folder holds its own key file, its own
    SuperNode authentication key and the pinned parties.json, and no other party's secret."""
    keys = tmp_path / "keys"
    assert main(["flower-keys", str(keys), "--clients", "2"]) == 0
    parties = ["server", "client-1", "client-2"]
    registry = load_registry(keys / "server")
    for party in parties:
        folder = keys / party
        identity, _ = load_party_keys(folder, party)
        assert identity.public == registry.sign[party]
        assert load_registry(folder) == registry
        assert (folder / "parties.json").read_bytes() == (keys / "server" / "parties.json"
                                                          ).read_bytes()
        held = "".join(p.read_text() for p in folder.rglob("*") if p.is_file())
        for other in set(parties) - {party}:
            secret = json.loads((keys / other / f"{other}.key").read_text())
            assert secret["sign"] not in held and secret["seal"] not in held, (party, other)
            with pytest.raises(ConfigError):
                load_party_keys(folder, other)
    auth = {p: (keys / p / "supernode-auth.key").read_text() for p in parties[1:]}
    assert len(set(auth.values())) == 2  # each node its own Flower authentication key
    assert not (keys / "server" / "supernode-auth.key").exists()


def test_flower_keys_refuses_a_folder_that_holds_keys(tmp_path, capsys):
    assert main(["flower-keys", str(tmp_path), "--clients", "2"]) == 0
    assert main(["flower-keys", str(tmp_path), "--clients", "2"]) == 2
    assert "already holds key files" in capsys.readouterr().err


def _run_parser():
    return build_parser()._subparsers._group_actions[0].choices["run"]


def test_every_config_field_is_in_exactly_one_option_group():
    from secureffm.cli import GROUPS

    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(RunConfig))
    titles = {group.title for group in _run_parser()._action_groups}
    assert set(GROUPS) <= titles


def test_run_help_lists_the_choices_and_each_default_once():
    """--help names every shipped protocol, data set and method, and no option's help shows
    a default twice or an empty one ("(default none) (default )")."""
    import re

    from secureffm.config import DCFM_DATA, DCFM_METHODS, METHODS
    from secureffm.names import IMAGE_DATA, PAIRS
    from secureffm.specs import shipped

    parser = _run_parser()
    parser.format_help()  # formats every help string (a % in one would raise)
    text = " ".join(action.help for action in parser._actions if action.help)
    for name in (*shipped("protocols"), *PAIRS, *IMAGE_DATA, *DCFM_DATA, *METHODS,
                 *DCFM_METHODS):
        assert name in text, name
    for action in parser._actions:
        shown = re.findall(r"\(default:? ?([^)]*)\)", action.help or "")
        assert len(shown) <= 1 and all(v.strip() not in ("", "None") for v in shown), action.help


def test_version_is_printed(capsys):
    from secureffm import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--roundz", "3"], "did you mean '--rounds'?"),
    (["run", "--protocol", "plaintxt"], "did you mean 'plaintext'?"),
    (["run", "--data", "8gaussians-moon"], "did you mean '8gaussians-moons'?"),
    (["run", "--method", "gto"], "did you mean 'got'?"),
])
def test_a_misspelt_name_gets_a_did_you_mean(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main([*argv, "--rounds", "1", "--out", str(tmp_path / "run")])
    except SystemExit as exit_info:  # argparse's own errors exit
        code = exit_info.code
    assert code == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--help"], ["run", "--help"], ["audit", "--help"],
                                  ["schema", "infer", "--help"], ["sample", "--help"]])
def test_help_loads_neither_torch_nor_numpy(argv):
    """``secureffm --help`` (and a subcommand's that does not train) starts in a fraction of a
    second: importing torch alone takes 3-9 s on a busy 2-core machine (docs/benchmarks.md,
    "Start-up"). Checked on sys.modules in a fresh interpreter, not by timing."""
    import subprocess
    import sys

    code = ("import sys\nfrom secureffm.cli import main\n"
            f"try:\n    main({argv!r}) if {argv!r} else None\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'opacus', 'flwr') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


_TINY = ["--rounds", "2", "--shard-size", "200", "--batch-size", "32", "--eval-samples", "100",
         "--nfe", "1", "--trajectories", "10", "--no-progress", "--device", "cpu"]
_SCHEMA = '[[columns]]\nname = "age"\ntype = "integer"\nlow = 18\nhigh = 90\n'


@pytest.mark.parametrize("argv, fragment", [
    (["--protocol", "plaintxt"], "unknown protocol 'plaintxt'"),
    (["--data", "cifar10", "--method", "vanilla"], "no --data-dir was given"),
    (["--data", "cifar10", "--method", "vanilla", "--data-dir", "."], "is missing"),
    (["--data", "mnist", "--method", "vanilla", "--data-dir", "."], "is in none of"),
    (["--threat-model", "malicous-server"], "unknown threat model"),
    (["--target-epsilon", "4"], "has no dp stage"),
    (["--client-data", "a.csv", "--client-data", "b.csv", "--schema", "nope.toml",
      "--method", "vanilla"], "no schema file at 'nope.toml'"),
    (["--client-data", "a.csv", "--client-data", "gone.csv", "--schema", "schema.toml",
      "--method", "vanilla"], "no data file at 'gone.csv'"),
    (["--client-data", "a.csv", "--client-data", "a.csv", "--schema", "schema.toml",
      "--method", "vanilla", "--target-column", "agee"], "'agee' is not a column"),
])
def test_a_failed_start_writes_no_file(argv, fragment, tmp_path, monkeypatch, capsys):
    """A mistake in the command leaves no run folder behind (a stub folder blocked the
    corrected command as "not empty"): the inputs are checked before anything is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schema.toml").write_text(_SCHEMA)
    (tmp_path / "a.csv").write_text("age\n" + "\n".join(str(20 + i) for i in range(40)) + "\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["run", *argv, *_TINY, "--out", "run"]) == 2
    assert fragment in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_corrected_command_runs_after_a_typo(tmp_path, monkeypatch, capsys):
    """... and ends with its summary: no DP, W2 beside its floor, in metrics.json too."""
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["run", "--protocol", "plaintxt", *_TINY, "--out", "run"]) == 2
    assert main(["run", "--protocol", "plaintext", *_TINY, "--out", "run"]) == 0
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]
    out = capsys.readouterr().out
    assert summary["privacy"] is None and "privacy: no DP" in out
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("round,aborted,loss") and [r.split(",")[0] for r in rows[1:]] == [
        "1", "2"]
    assert f"W2 at NFE 1: {summary['quality']['w2']:.3f} (i.i.d. floor" in out


_NOISE = ("Optimal order is the", "overflow encountered", "invalid value encountered",
          "LinAlgWarning", "run_simulation` function is deprecated", "FutureWarning")


@pytest.mark.slow  # 11 s on a busy 2-core machine: a fresh interpreter imports torch
def test_a_short_dp_run_prints_no_known_third_party_warning(tmp_path):
    """At epsilon 1e9 (allowed as weak) Opacus warns that the best RDP order is the smallest
    alpha and its PRV accountant overflows: the command's stderr carries none of it."""
    import subprocess
    import sys

    argv = ["run", "--protocol", "dp", "--method", "vanilla", "--target-epsilon", "1e9",
            "--allow-weak-privacy", *_TINY, "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "secureffm", *argv], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [noise for noise in _NOISE if noise in done.stderr] == []


def test_the_noise_filter_is_by_message_and_category_not_blanket():
    """Each known warning is dropped; the same category with another message, from the same
    module, still shows; Flower's deprecation line is dropped from its logger, others kept."""
    import logging
    import warnings

    from secureffm.quiet import FLOWER_DEPRECATION, KNOWN_WARNINGS, _category, quiet_known_noise

    def shown(message, category, module):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_known_noise()
            warnings.warn_explicit(message, category, "x.py", 1, module=module)
        return len(seen)

    samples = {"UserWarning": "Optimal order is the largest alpha. Please consider",
               "RuntimeWarning": "overflow encountered in exp",
               "LinAlgWarning": "Matrix is ill-conditioned. The result might be inaccurate",
               "FutureWarning": "Tip: In future versions of Ray, Ray will no longer"}
    modules = {"UserWarning": "opacus.accountants.analysis.rdp",
               "RuntimeWarning": "opacus.accountants.analysis.prv.prvs",
               "LinAlgWarning": "secureffm.metrics.frechet", "FutureWarning": "ray._private.worker"}
    for _message, name, _module, _why in KNOWN_WARNINGS:
        category = _category(name)
        assert shown(samples[name], category, modules[name]) == 0, name
        assert shown("something else entirely", category, modules[name]) == 1, name
        assert shown(samples[name], category, "mycode") == 1, name
    logger, kept = logging.getLogger("flwr"), []
    handler = logging.Handler()
    handler.emit = kept.append
    logger.addHandler(handler)
    try:
        logger.warning("DEPRECATED FEATURE: %s", FLOWER_DEPRECATION + " and will be removed")
        logger.warning("a node went offline")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in kept] == ["a node went offline"]


def test_a_dp_run_ends_with_its_summary_printed_and_in_metrics(tmp_path, monkeypatch, capsys):
    """The last lines say the epsilon each client spent against the target, W2 beside its
    i.i.d. floor, the run folder and the log head; metrics.json keeps the same under
    "summary", read from privacy.json and the log's own pin."""
    import json

    from secureffm.audit.verify import pin_run

    monkeypatch.chdir(tmp_path)
    assert main(["run", "--protocol", "dp", "--method", "vanilla", "--target-epsilon", "3",
                 *_TINY, "--out", "run"]) == 0
    out = capsys.readouterr().out
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    summary = metrics["summary"]
    assert metrics["curves"] == {"loss": [], "dual": []} and "not privatized" in metrics[
        "curves_note"]  # the empty curves say why
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines() == [
        "round,aborted", "1,0", "2,0"]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert summary["log_head"] == pin_run(tmp_path / "run").head
    assert summary["privacy"]["target_epsilon"] == 3
    for cid, spent in summary["privacy"]["clients"].items():
        assert spent["epsilon"] == privacy["clients"][cid]["rdp"]["total"] <= 3
        assert f"{cid} {spent['epsilon']:.3f}" in out
    assert "target 3)" in out
    assert f"i.i.d. floor {summary['quality']['iid_floor']:.3f}" in out
    assert f"log head: {summary['log_head']}" in out and "run folder: run" in out


def test_the_summary_of_a_tabular_and_an_image_run_names_each_floor():
    from secureffm.runs.summary import summary_lines

    table = {"privacy": None, "quality": {"clients": {
        "client-1": {"w2": 0.31, "w2_floor": 0.22}, "client-2": {"w2": 0.4, "w2_floor": 0.25}}}}
    lines = summary_lines(table)
    assert lines[0].startswith("privacy: no DP")
    assert "client-2: W2 on its own held-out rows 0.400 (i.i.d. floor 0.250)" in lines
    images = {"privacy": None, "quality": {"fid": 41.0, "nfe": 100, "fid_floor": 3.2}}
    assert "FID at NFE 100: 41 (floor 3.2" in summary_lines(images)[1]


def test_verify_says_on_its_first_line_which_checks_were_not_done(tmp_path, monkeypatch,
                                                                  capsys):
    """Without payloads.bin the malicious-server checks of secure aggregation cannot run: the
    verdict line says so instead of a bare "OK: log intact"."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--protocol", "secagg", "--method", "vanilla", *_TINY,
                 "--out", "run"]) == 0
    capsys.readouterr()
    assert main(["audit", "--verify", "run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("OK: log intact") and "3 check(s) NOT DONE" in first
    assert "relayed keys equal the advertised ones" in first and "--keep-payloads" in first
