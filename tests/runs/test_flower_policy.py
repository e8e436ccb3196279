"""A Flower node's own policy (secureffm/runs/flower_policy.py) and its check of the run config
(secureffm/runs/flower_node.py: ``check_run_config``, ``admit``), without Ray.

Truths used: the run's own options (a policy written from them must admit the run config
written from them, and one changed option must be named), the shipped specs' files, and the
files the commands write. tests/security/test_flower_policy.py plays the server that submits
another run than the node pinned.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from secureffm.errors import ConfigError, PolicyError
from secureffm.federation.exchange import Request
from secureffm.federation.keyfiles import provision
from secureffm.methods.fedwad import FedWADConfig
from secureffm.runs import flower_node
from secureffm.runs.fedwad import FedWADRun
from secureffm.runs.flower_policy import Policy, policy_of, read_policy

from .test_flower_node import CLIENTS, broadcast, config, dcfm_config, own, pinning

RUNS = {
    "got dp-secagg": lambda out: config(out, "dp-secagg"),
    "vanilla plaintext": lambda out: replace(config(out), method="vanilla"),
    "dcfm-a sealed": lambda out: dcfm_config(out, "dcfm-a", "sealed"),
    "fedflow plaintext": lambda out: dcfm_config(out, "fedflow", "plaintext"),
    "fedwad-private": lambda out: FedWADRun(FedWADConfig(iterations=3, support_size=20),
                                            samples=60, protocol="fedwad-private",
                                            out=str(out)),
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    provision(folder, CLIENTS)
    return folder


@pytest.mark.parametrize("name", list(RUNS))
def test_a_policy_written_from_a_run_reads_back_and_admits_that_run(tmp_path, keys, name):
    run = RUNS[name](tmp_path / "run")
    path = pinning(run, tmp_path / "policy.toml")
    read = read_policy(path)
    assert dataclasses.replace(read, source="") == policy_of(run)
    flower_node.check_run_config(read, flower_node.run_config_of(run, keys))


def test_the_pinned_fields_are_the_runs_resolved_protections(tmp_path):
    """GOT under dp-secagg at a fixed sigma: epsilon, delta and clip from the shipped spec,
    sigma from the run, the threshold of its secure-aggregation stage, both kinds GOT sends."""
    spec = tomllib.loads((Path(__file__).parents[2] / "protocols" / "dp-secagg.toml")
                         .read_text())
    dp, secagg = spec["stages"]
    policy = policy_of(config(tmp_path, "dp-secagg"))
    assert (policy.protocol, policy.method, policy.rounds) == ("dp-secagg", "got", 3)
    assert policy.kinds == ("dual_update", "gradient")
    assert (policy.target_epsilon, policy.delta, policy.clip, policy.noise_multiplier) == (
        dp["target_epsilon"], dp["delta"], dp["clip"], 1.0)
    assert policy.threshold == (secagg["threshold"],)
    plain = policy_of(config(tmp_path))
    assert (plain.target_epsilon, plain.clip, plain.threshold) == (None, None, ())


def test_check_run_config_names_every_field_that_differs_with_both_values(tmp_path, keys):
    policy = read_policy(pinning(config(tmp_path, "dp-secagg"), tmp_path / "policy.toml"))
    asked = replace(config(tmp_path, "plaintext"), method="vanilla", rounds=9)
    with pytest.raises(PolicyError) as refused:
        flower_node.check_run_config(policy, flower_node.run_config_of(asked, keys))
    message = str(refused.value)
    for field, pinned, given in [("protocol", "'dp-secagg'", "'plaintext'"),
                                 ("method", "'got'", "'vanilla'"), ("rounds", "3", "9"),
                                 ("kinds", "('dual_update', 'gradient')", "('gradient',)"),
                                 ("target_epsilon", "8.0", "None"), ("delta", "1e-05", "None"),
                                 ("clip", "1.0", "None"), ("noise_multiplier", "1.0", "None"),
                                 ("accountant", "'rdp'", "None"),
                                 ("threshold", "(0.6,)", "()")]:
        assert f"{field}: policy {pinned}, run config {given}" in message
    assert str(tmp_path / "policy.toml") in message


def test_the_policy_pins_the_runs_clip_and_accountant_overrides(tmp_path, keys):
    """The adversary is a server that submits the run the node agreed to with a larger
    per-example clip (more sensitivity for the same noise) or another accountant (another
    calibrated sigma): the node's policy, written from the run's --max-grad-norm and
    --accountant as resolved, names either difference."""
    agreed = replace(config(tmp_path, "dp"), max_grad_norm=0.5, accountant="prv")
    policy = read_policy(pinning(agreed, tmp_path / "policy.toml"))
    assert (policy.clip, policy.accountant) == (0.5, "prv")
    flower_node.check_run_config(policy, flower_node.run_config_of(agreed, keys))
    for change, named in [({"max_grad_norm": 2.0}, "clip: policy 0.5, run config 2.0"),
                          ({"accountant": "rdp"}, "accountant: policy 'prv', run config 'rdp'")]:
        with pytest.raises(PolicyError, match=named):
            flower_node.check_run_config(
                policy, flower_node.run_config_of(replace(agreed, **change), keys))


def test_a_run_config_without_the_spec_it_runs_is_refused(tmp_path, keys):
    run = config(tmp_path, "dp-secagg")
    carried = flower_node.run_config_of(run, keys)
    del carried[flower_node.SPEC_KEY]
    with pytest.raises(PolicyError, match="carries no protocol spec"):
        flower_node.check_run_config(policy_of(run), carried)


@pytest.mark.parametrize("text, fragment", [
    ('protocol = "dp-secagg"\n', "missing field 'protocol_sha256'"),
    ('protocol = "x"\nprotocol_sha256 = "0"\nmethod = "got"\nkinds = ["gradient"]\nclip = "1"\n',
     "clip = '1'"),
    ('protocol = "x"\nprotocol_sha256 = "0"\nmethod = "got"\nkinds = []\nepsilon = 1.0\n',
     "unknown field 'epsilon'"),
])
def test_a_malformed_policy_file_is_refused_by_field(tmp_path, text, fragment):
    (tmp_path / "policy.toml").write_text(text)
    with pytest.raises(PolicyError, match=fragment):
        read_policy(tmp_path / "policy.toml")


def test_a_spec_changed_on_the_nodes_disk_is_refused(tmp_path, keys):
    """A node running a spec of its own reads it from its disk (``spec_file``, relative to
    the policy file); an edit after the policy was written no longer has the pinned digest."""
    spec = tmp_path / "mine.toml"
    shipped = Path(__file__).parents[2] / "protocols" / "dp-secagg.toml"
    spec.write_text(shipped.read_text().replace('name = "dp-secagg"', 'name = "mine"'))
    run = config(tmp_path / "run", str(spec))
    node = own(tmp_path, keys, run, **{"client-id": "client-1"})
    assert read_policy(node["policy"]).spec_file == str(spec)
    flower_node.admit(node, flower_node.run_config_of(run, keys))
    spec.write_text(spec.read_text().replace("clip = 1.0", "clip = 4.0"))
    with pytest.raises(PolicyError, match="changed on this node's disk"):
        flower_node.admit(node, flower_node.run_config_of(run, keys))


@pytest.mark.parametrize("left_out", ["keys", "journal", "policy"])
def test_a_node_without_its_own_keys_journal_or_policy_is_refused_by_name(tmp_path, keys,
                                                                         left_out):
    run = config(tmp_path / "run")
    node = own(tmp_path, keys, run, **{"client-id": "client-1"})
    del node[left_out]
    with pytest.raises(ConfigError, match=f"client-1's node config lacks {left_out}"):
        flower_node.serve(node, flower_node.run_config_of(run, keys), None,
                          broadcast(keys, "client-1"))


def test_the_policy_command_pins_what_the_flower_app_submits(tmp_path, keys, monkeypatch):
    """A hospital writes its policy with the options of the run it agrees to; the app written
    with the same options is admitted, one written with another round count is refused,
    naming it; the app's ClientApp answers hello with that check."""
    from secureffm.cli import main

    monkeypatch.chdir(tmp_path)
    options = ["--method", "got", "--protocol", "dp-secagg", "--clients", "2", "--rounds", "5"]
    assert main(["flower-policy", "policy.toml", *options]) == 0
    node = {"client-id": "client-1", "keys": str(keys), "journal": "client-1.jsonl",
            "policy": str(tmp_path / "policy.toml")}
    for folder, rounds in (("app", "5"), ("other", "6")):
        assert main(["flower-app", folder, "--keys", str(keys), *options[:-1], rounds]) == 0
    carried = {name: tomllib.loads((tmp_path / name / "pyproject.toml").read_text())
               ["tool"]["flwr"]["app"]["config"] for name in ("app", "other")}
    flower_node.admit(node, carried["app"])
    with pytest.raises(PolicyError, match="client-1 refuses the run.*rounds: policy 5, run "
                                          "config 6"):
        flower_node.admit(node, carried["other"])
    assert "admit='secureffm.runs.flower_node:hello'" in (
        tmp_path / "app" / "secureffm_client_app.py").read_text()


def test_the_fedwad_command_writes_a_policy_that_admits_its_app(tmp_path, keys, monkeypatch):
    from secureffm.cli import main

    monkeypatch.chdir(tmp_path)
    options = ["--protocol", "fedwad-private", "--iterations", "4"]
    assert main(["fedwad", "--flower-policy", "policy.toml", *options]) == 0
    assert main(["fedwad", "--flower-app", "app", "--keys", str(keys), *options]) == 0
    carried = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    node = {"client-id": "client-2", "keys": str(keys), "journal": "j.jsonl",
            "policy": str(tmp_path / "policy.toml")}
    assert flower_node.admit(node, carried["tool"]["flwr"]["app"]["config"]).rounds == 4


def _hello(app, node_config: dict, run_config: dict):
    """What the ClientApp answers Flower's hello message with, called as Flower calls it."""
    from flwr.app import Context, Message, Metadata, RecordDict

    from secureffm.federation.flower import HELLO

    metadata = Metadata(run_id=1, message_id="", src_node_id=0, dst_node_id=1,
                        reply_to_message_id="", group_id="1", created_at=time.time(),
                        ttl=60.0, message_type=HELLO)
    context = Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(),
                      run_config=run_config)
    return app(Message(RecordDict(), metadata=metadata), context).content["hello"]


def test_a_nodes_hello_says_why_it_refuses_the_run(tmp_path, keys):
    """The ClientApp of a deployment (make_client_app with the node's admit): a run config
    that differs from the node's policy is refused in its hello reply, naming the node and
    the fields; the run it pinned gets its client id only."""
    pytest.importorskip("flwr")
    from secureffm.federation.flower import make_client_app

    honest = config(tmp_path / "run", "dp-secagg")
    app = make_client_app("secureffm.runs.flower_node:serve",
                          admit="secureffm.runs.flower_node:hello")
    node = own(tmp_path, keys, honest, **{"client-id": "client-2"})
    assert dict(_hello(app, node, flower_node.run_config_of(honest, keys))) == {
        "client-id": "client-2"}
    served = replace(honest, protocol="plaintext", noise_multiplier=0.0)
    answer = _hello(app, node, flower_node.run_config_of(served, keys))
    assert answer["client-id"] == "client-2"
    assert answer["refused"].startswith("client-2 refuses the run: ")
    assert "protocol: policy 'dp-secagg', run config 'plaintext'" in answer["refused"]


def test_a_node_answers_a_joint_kind_only_when_its_policy_answers_every_part():
    """A node's policy lists the kinds its client answers; GOT's joint aggregation of the
    gradient and the dual update (kind gradient+dual_update) is admitted under GOT's policy
    (before, a node refused it: the run aborted every dual round on Flower). Adversary: a
    server asking a node whose policy answers only gradient (FFM-vanilla) for that joint kind,
    to smuggle a second release in with the gradient: refused by name."""
    vanilla = Policy("dp-secagg", "0" * 64, "vanilla", 3, ("gradient",))
    joint = Request(1, "gradient+dual_update", "advertise_keys", "advertise_keys",
                    "secagg.advertise")
    assert flower_node._outside(vanilla, joint) == "answers only gradient"
    got = replace(vanilla, method="got", kinds=("dual_update", "gradient"))
    assert flower_node._outside(got, joint) == ""
    assert flower_node._outside(got, replace(joint, kind="gradient+model")) == (
        "answers only dual_update, gradient")
