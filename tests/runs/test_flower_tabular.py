"""A run on the clients' own tables with every client a Flower node (secureffm/runs/flower_node.py,
``_table_endpoint``): each node reads its own file and its own copy of the schema, whose digest
its policy pins; driven by the loopback of tests/runs/test_flower_node.py (no Ray), every
message served by a client rebuilt from its node and saved bytes, against the in-process run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from secureffm.config import RunConfig
from secureffm.errors import ConfigError, PolicyError
from secureffm.federation.keyfiles import provision
from secureffm.runs import flower_node, flower_server
from secureffm.runs.ffm import run_ffm
from secureffm.runs.flower_policy import policy_of
from secureffm.runs.scaffold import JOURNALS_DIR

from .test_flower_node import CLIENTS, Nodes, logged, node_configs, pinning
from .test_tabular import SCHEMA, _silo


def _run(folder: Path, out: str, schema: Path) -> RunConfig:
    files = tuple(str(_silo(folder / f"hospital-{i}.csv", 80, 10 * i, i)) for i in (1, 2))
    return RunConfig(method="got", protocol="dp-secagg", noise_multiplier=1.0, data="table",
                     client_data=files, schema=str(schema), clients=len(CLIENTS), rounds=3,
                     shard_size=64, batch_size=16, candidates=16, eval_samples=100, nfe=(4,),
                     hidden=16, potential_hidden=16, trajectories=10, progress=False,
                     device="cpu", insecure_deterministic=True, out=str(folder / out),
                     target_column="smoker")


def _nodes(run: RunConfig, keys: Path, schema: Path) -> tuple[Nodes, dict]:
    out = Path(run.out)
    policy = pinning(run, out.parent / f"{out.name}-policy.toml")
    configs = node_configs(keys, out / JOURNALS_DIR, policy)
    for cid, path in zip(CLIENTS, run.client_data, strict=True):
        configs[cid].update({"client-data": path, "schema": str(schema)})
    return Nodes(flower_node.run_config_of(run, keys), True, configs), configs


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tabular-nodes")
    keys = folder / "keys"
    provision(keys, CLIENTS)
    schema = folder / "schema.toml"
    schema.write_text(SCHEMA)
    return folder, keys, schema


def test_a_tabular_run_on_rebuilt_nodes_is_the_in_process_run(setting):
    """Each node reads only its own file (its node config's ``client-data``), evaluates on its
    own held-out rows, and the run equals the in-process one: the same records, the same
    clients' reports (seeded streams, carried by the snapshots)."""
    folder, keys, schema = setting
    run = _run(folder, "nodes", schema)
    nodes, _ = _nodes(run, keys, schema)
    flower_node._LAST.clear()
    done = flower_server.main(nodes, nodes.run_config)
    in_process = run_ffm(dataclasses.replace(run, out=str(folder / "in-process")))
    on_nodes, here = done["metrics"]["eval"]["clients"], in_process.metrics["eval"]["clients"]
    assert set(on_nodes) == set(CLIENTS)
    for cid in CLIENTS:
        assert on_nodes[cid]["w2"] == pytest.approx(here[cid]["w2"], rel=1e-5)
        assert on_nodes[cid]["holdout_rows"] == 16
    assert logged(folder / "nodes") == logged(folder / "in-process")


def test_a_node_refuses_a_run_whose_schema_differs_from_its_policy(setting):
    """Adversary: the server side submitting another schema (wider bounds, another column
    order) than the one the node pinned: the node refuses the run by name before the first
    round."""
    folder, keys, schema = setting
    run = _run(folder, "schema-swap", schema)
    _, configs = _nodes(run, keys, schema)
    other = folder / "other-schema.toml"
    other.write_text(SCHEMA.replace("high = 90", "high = 120"))
    asked = flower_node.run_config_of(dataclasses.replace(run, schema=str(other)), keys)
    with pytest.raises(PolicyError, match="client-1 refuses the run: .*schema_sha256"):
        flower_node.admit(configs["client-1"], asked)


def test_a_node_whose_own_schema_is_not_the_pinned_one_refuses_to_build(setting):
    folder, keys, schema = setting
    run = _run(folder, "own-schema", schema)
    _, configs = _nodes(run, keys, schema)
    changed = folder / "changed-schema.toml"
    changed.write_text(SCHEMA.replace("low = 18", "low = 0"))
    policy = flower_node.admit(configs["client-1"], flower_node.run_config_of(run, keys))
    with pytest.raises(PolicyError, match="not the .* its policy .* pins"):
        flower_node._endpoint(policy, {**configs["client-1"], "schema": str(changed)},
                              flower_node.run_config_of(run, keys), "client-1")
    without = {k: v for k, v in configs["client-1"].items() if k != "client-data"}
    with pytest.raises(ConfigError, match="lacks client-data"):
        flower_node._endpoint(policy, without, flower_node.run_config_of(run, keys), "client-1")


def test_a_deployments_server_and_policy_name_no_client_file(setting):
    """On a deployment the server holds no client's file and names none (``--engine flower``
    without ``--client-data``); the policy a hospital writes that way is the one the
    simulated run pins, and the simulation itself needs every node's file."""
    folder, _, schema = setting
    run = _run(folder, "deployment", schema)
    server_side = dataclasses.replace(run, engine="flower", client_data=())
    assert policy_of(server_side) == policy_of(run)
    with pytest.raises(ConfigError, match="one file per client"):
        dataclasses.replace(run, client_data=run.client_data[:1])
    with pytest.raises(ConfigError, match="gives each node its own file"):
        flower_server.run_on_flower(server_side)


def test_a_node_whose_file_does_not_fit_the_schema_refuses_in_its_hello(setting):
    """The node checks its own file against its own schema when the server says hello: a file
    that does not fit is refused by name before the first round, not inside one."""
    folder, keys, schema = setting
    run = _run(folder, "bad-file", schema)
    _, configs = _nodes(run, keys, schema)
    bad = folder / "bad.csv"
    bad.write_text("age,dose,smoker,ward\n40,1.0,0,icu\n41,2.0,0,maternity\n")
    asked = flower_node.run_config_of(run, keys)
    assert flower_node.hello(configs["client-1"], asked).schema_sha256
    with pytest.raises(PolicyError, match=r"client-1 refuses the run: its own data .*'maternity'"):
        flower_node.hello({**configs["client-1"], "client-data": str(bad)}, asked)
