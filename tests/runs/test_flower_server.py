"""The same seeded run on the in-process engine and on Flower's simulation engine (each client a
Flower node with its own key file, shard and saved state; the server process with neither) gives
the same W2 table and logs the same messages (kinds, phases, parties, sizes, stages, events).

Truths used: the in-process engine's run of the same config (``--insecure-deterministic``
makes every secret stream a function of the seed, so both engines draw the same batches, noise
and rounding), and the log each run wrote. Each Flower run starts Ray (15-25 s here): one case
in the default suite, the others (more GOT protocols, DCFM-A under ``sealed``) ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from secureffm.config import RunConfig  # noqa: E402
from secureffm.runs import run  # noqa: E402

TINY = dict(method="got", clients=3, partition="iid", shard_size=64, batch_size=16, rounds=5,
            potential_every=2, hidden=16, potential_hidden=16, candidates=16,
            eval_samples=200, nfe=(1, 4), trajectories=50, progress=False, device="cpu",
            insecure_deterministic=True)


def _rows(folder: Path) -> list[tuple]:
    """What each record of the run's log says, without its signature and chain."""
    rows = []
    for line in (folder / "messages.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.append((r["round"], r["phase"], r["kind"], r["sender"], r["recipient"], r["bytes"],
                     tuple(r["stages"]), r.get("event"), r.get("party"), r.get("detail")))
    return rows


def _both(tmp_path, protocol: str) -> tuple[dict, dict, Path, Path]:
    metrics, folders = [], []
    for engine in ("inprocess", "flower"):
        out = tmp_path / engine
        result = run(RunConfig(**TINY, protocol=protocol, engine=engine, out=str(out)))
        metrics.append(result.metrics)
        folders.append(out)
    return metrics[0], metrics[1], folders[0], folders[1]


def _check(tmp_path, protocol: str) -> None:
    local, flower, local_dir, flower_dir = _both(tmp_path, protocol)
    for nfe, w2 in local["eval"]["w2"].items():
        assert flower["eval"]["w2"][nfe] == pytest.approx(w2, rel=1e-6, abs=1e-9)
    assert flower["messages"] == local["messages"]
    assert _rows(flower_dir) == _rows(local_dir)


@pytest.mark.slow  # 66 s here; the default suite keeps FedWAD's parity on the simulation
# engine (tests/runs/test_flower_fedwad.py) and dp-secagg on rebuilt nodes without Ray
# (tests/runs/test_flower_node.py)
def test_got_under_dp_secagg_is_the_same_run_on_flower(tmp_path):
    _check(tmp_path, "dp-secagg")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["plaintext", "secagg-plus"])
def test_got_is_the_same_run_on_flower(tmp_path, protocol):
    _check(tmp_path, protocol)


@pytest.mark.slow  # 60 s here (Ray's start about 35 s of it): at the default suite's limit
def test_dcfm_a_under_sealed_is_the_same_run_on_flower(tmp_path):
    """DCFM-A's clients each train their expert in their own Flower node between messages
    (snapshots carry the expert, its Adam state and EMA, its streams and the gathered peers):
    the same log records and evaluation as in-process; only the clients' training losses,
    which never leave them, are absent on Flower."""
    tiny = dict(method="dcfm-a", protocol="sealed", data="modes2d", partition="disjoint",
                clients=2, shard_size=150, batch_size=32, hidden=16, local_steps=6,
                dcfm_rounds=2, dcfm_steps=4, eval_samples=100, nfe=(4,), progress=False,
                device="cpu", insecure_deterministic=True)
    results = {engine: run(RunConfig(**tiny, engine=engine, out=str(tmp_path / engine)))
               for engine in ("inprocess", "flower")}
    local, flower = results["inprocess"].metrics, results["flower"].metrics
    for key, fraction in local["eval"]["in_mode_fraction"].items():
        assert flower["eval"]["in_mode_fraction"][key] == pytest.approx(fraction, abs=1e-6)
    assert flower["communication"] == local["communication"]
    assert flower["messages"] == local["messages"]
    assert flower["training"]["client_losses"].startswith("absent")
    assert _rows(tmp_path / "flower") == _rows(tmp_path / "inprocess")
    assert any("sealed" in row[6] for row in _rows(tmp_path / "flower"))


@pytest.mark.parametrize("changes, fragment", [
    (dict(method="dcfm-a", data="colored-digits"), "knows the novel combinations"),
    (dict(threat_model="drop-after-sharing"), "faults are real"),
])
def test_what_does_not_run_on_flower_is_refused_by_name(tmp_path, changes, fragment):
    """Before anything runs: the server's main refuses what would still need the in-process
    engine (a clear error, not a crash inside a round)."""
    from secureffm.errors import ConfigError
    from secureffm.runs.flower_node import run_config_of
    from secureffm.runs.flower_server import main

    config = RunConfig(**{**TINY, **changes, "out": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match=fragment):
        main(None, run_config_of(config, tmp_path))


class _Answered:
    """The server's view after a hello: which clients answered and FlowerCalls' ``errors``
    (why the others did not, as Flower said)."""

    def __init__(self, found: list[str], errors: dict[str, str]):
        self.found, self.errors = found, errors

    def hello(self, timeout: float, clients: int = 0) -> dict[str, int]:
        return {cid: node for node, cid in enumerate(self.found)}


def test_a_node_silent_at_hello_is_named_with_flowers_reason_not_a_client_id_hint(tmp_path):
    """A SuperNode whose ClientApp did not start within the phase timeout: the run stops naming
    the missing client, the silent Flower node and why. Before, it said "give each SuperNode
    --node-config client-id=...", though every node had its id. Nodes that answered under
    other ids still get that hint."""
    from secureffm.errors import ConfigError
    from secureffm.runs.flower_server import remote_channel

    config = RunConfig(**TINY, out=str(tmp_path / "run"))
    why = ("no reply within 120.0 s: the SuperLink lists it connected, so its ClientApp did "
           "not answer in time")
    with pytest.raises(ConfigError) as silent:
        remote_channel(_Answered(["client-1", "client-2"], {"8811": why}), config, tmp_path,
                       None, None, 64)
    assert "no node answered the hello as ['client-3']" in str(silent.value)
    assert f"Flower node 8811: {why}" in str(silent.value)
    assert "client-id" not in str(silent.value)
    with pytest.raises(ConfigError, match=r"client-id=\.\.\. naming one of"):
        remote_channel(_Answered(["client-1", "client-2", "hospital-x"], {}), config,
                       tmp_path, None, None, 64)


@pytest.mark.slow  # Ray's start: about 30 s here
def test_simulated_nodes_refuse_a_run_config_that_differs_from_the_run_given(tmp_path,
                                                                            monkeypatch):
    """``secureffm run --engine flower``: every simulated node pins the run as the user gave
    it (run_on_flower's policy file) and checks what the ServerApp submits through the same
    ``admit`` as a deployed node. Adversary: the server side, here made to submit ``plaintext``
    for a ``dp-secagg`` run. Every node refuses it in its hello reply and the run stops there,
    naming each node and the fields; no node served a request (no journal)."""
    from secureffm.errors import PolicyError
    from secureffm.runs import flower_server

    given = RunConfig(**TINY, protocol="dp-secagg", engine="flower", out=str(tmp_path / "run"))
    served = RunConfig(**TINY, protocol="plaintext", engine="flower", out=str(tmp_path / "run"))
    submit = flower_server.run_config_of
    monkeypatch.setattr(flower_server, "run_config_of", lambda _, keys: submit(served, keys))
    with pytest.raises(PolicyError, match="3 of 3 nodes refused the run") as refused:
        flower_server.run_on_flower(given)
    for cid in ("client-1", "client-2", "client-3"):
        assert f"{cid} refuses the run" in str(refused.value)
    assert "protocol: policy 'dp-secagg', run config 'plaintext'" in str(refused.value)
    assert not (tmp_path / "run" / "journals").exists()
