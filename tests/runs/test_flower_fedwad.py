"""``secureffm fedwad`` with every client in a process of its own (issue 17), without Flower: the
server's process (:func:`secureffm.runs.flower_server.main`) drives
:func:`~secureffm.runs.flower_node.serve` nodes through the loopback of
tests/runs/test_flower_node.py, each message served by a client rebuilt from its key file, the
public FedWAD recipe by its index, and its saved bytes.

Truths used: the in-process run of the same seeded FedWADRun (``--insecure-deterministic``
makes each client's t and noise a function of the seed on both engines), its run folder's log,
and the audit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from secureffm.audit.verify import verify_run
from secureffm.errors import ConfigError
from secureffm.methods.fedwad import FedWADConfig
from secureffm.runs import flower_node, flower_server
from secureffm.runs.fedwad import FedWADRun, run_fedwad
from secureffm.runs.scaffold import JOURNALS_DIR

from .test_flower_node import Nodes, node_configs, pinning

LOGGED = ("round", "phase", "kind", "sender", "recipient", "bytes", "stages", "event", "party",
          "detail")


def fedwad_run(out: Path, protocol: str, **changes) -> FedWADRun:
    """A tiny seeded FedWAD run between two clients of the gaussians recipe."""
    return FedWADRun(FedWADConfig(iterations=3, support_size=20), samples=60,
                     protocol=protocol, out=str(out), progress=False,
                     insecure_deterministic=True, **changes)


def rows(folder: Path) -> list[tuple]:
    """What each record of the run's log says, without its signature and chain."""
    lines = (folder / "messages.jsonl").read_text().splitlines()
    return [tuple(json.dumps(json.loads(line).get(k)) for k in LOGGED) for line in lines]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    from secureffm.federation.keyfiles import provision

    folder = tmp_path_factory.mktemp("keys")
    provision(folder, ["client-1", "client-2"])
    return folder


@pytest.mark.parametrize("protocol", ["fedwad-private", "plaintext"])
def test_fedwad_on_rebuilt_nodes_equals_the_in_process_run(tmp_path, keys, protocol):
    run = fedwad_run(tmp_path / "nodes", protocol)
    nodes = Nodes(flower_node.run_config_of(run, keys), rebuild=True,
                  nodes=node_configs(keys, tmp_path / "nodes" / JOURNALS_DIR,
                                     pinning(run, tmp_path / "policy.toml")))
    try:
        done = flower_server.main(nodes, nodes.run_config)
    finally:
        flower_node._LAST.clear()
    local = run_fedwad(fedwad_run(tmp_path / "in-process", protocol)).result
    remote = done["result"]
    assert remote["distance"] == pytest.approx(local["distance"], rel=1e-12)
    assert remote["iterates"] == pytest.approx(local["iterates"], rel=1e-12)
    assert remote["evaluated"] == local["evaluated"]
    assert len(remote["evaluated"]) == (1 if protocol == "fedwad-private" else 4)
    assert remote["messages"] == local["messages"]
    assert rows(tmp_path / "nodes") == rows(tmp_path / "in-process")
    assert len(nodes.replies) > 0  # every client message was served by a node
    journals = sorted(p.name for p in (tmp_path / "nodes" / JOURNALS_DIR).glob("*.jsonl"))
    assert journals == ["client-1.jsonl", "client-2.jsonl"]
    report = verify_run(tmp_path / "nodes")  # the log and each client's journal
    assert report.ok, report.summary()


def test_a_flower_run_config_carries_a_fedwad_run_and_names_its_family(tmp_path, keys):
    run = fedwad_run(tmp_path, "fedwad-private", engine="flower", phase_timeout=7.5)
    carried = flower_node.run_config_of(run, keys)
    assert carried[flower_node.FAMILY_KEY] == "fedwad"
    assert flower_node.config_of(carried) == run
    with pytest.raises(ConfigError, match="family 'dcfm'"):
        flower_node.config_of({**carried, flower_node.FAMILY_KEY: "dcfm"})
    broken = json.loads(carried[flower_node.CONFIG_KEY]) | {"sigma": 1}
    with pytest.raises(ConfigError, match="unknown FedWAD run key 'sigma'"):
        flower_node.config_of({**carried, flower_node.CONFIG_KEY: json.dumps(broken)})


def test_the_server_of_a_remote_fedwad_run_refuses_to_pool_data(tmp_path, keys):
    run = fedwad_run(tmp_path / "run", "plaintext", check_exact=True)
    with pytest.raises(ConfigError, match="drop --check-exact"):
        flower_server.main(None, flower_node.run_config_of(run, keys))


def test_fedwad_under_fedwad_private_is_the_same_run_on_flower(tmp_path):
    """Flower's simulation engine (Ray; each client a node with its own key file, recipe data
    and saved state, the server with neither): the distance within float noise and the same
    logged records as in-process."""
    pytest.importorskip("flwr")
    remote = flower_server.run_on_flower(fedwad_run(tmp_path / "flower", "fedwad-private",
                                                    engine="flower"))
    local = run_fedwad(fedwad_run(tmp_path / "in-process", "fedwad-private"))
    assert remote.result["distance"] == pytest.approx(local.result["distance"], rel=1e-9)
    assert remote.result["messages"] == local.result["messages"]
    assert rows(remote.out) == rows(local.out)
    report = verify_run(remote.out)
    assert report.ok, report.summary()


def test_the_fedwad_command_takes_an_engine_and_refuses_an_unknown_one(tmp_path, capsys):
    from secureffm.cli import main

    with pytest.raises(SystemExit):
        main(["fedwad", "--help"])
    assert "--engine" in capsys.readouterr().out
    assert main(["fedwad", "--engine", "warp", "--out", str(tmp_path / "run")]) == 2
    assert "engine = 'warp'; choose one of inprocess, flower" in capsys.readouterr().err


def test_the_fedwad_command_writes_a_flower_app_carrying_its_run(tmp_path, capsys, monkeypatch,
                                                                 keys):
    """A deployment's app: its run config is the FedWAD run (family named, folder made
    absolute for the ServerApp's process) and the keys folder, never a private key."""
    import tomllib

    from secureffm.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["fedwad", "--flower-app", "app", "--keys", str(keys), "--protocol",
                 "fedwad-private", "--iterations", "4", "--out", "relative/run"]) == 0
    assert "flwr run app" in capsys.readouterr().out
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    carried = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    run = flower_node.config_of(carried)
    assert isinstance(run, FedWADRun) and run.fedwad.iterations == 4
    assert run.out == str(tmp_path / "relative" / "run") and run.protocol == "fedwad-private"
    for key in keys.glob("*.key"):
        assert key.read_text() not in text
    assert main(["fedwad", "--flower-app", "app2"]) == 2
    assert "needs --keys" in capsys.readouterr().err
