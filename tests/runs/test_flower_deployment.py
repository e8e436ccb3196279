"""FFM-GOT under ``dp-secagg`` on Flower's deployment runtime: a SuperLink and three SuperNodes
as OS processes on localhost, each client's keys in its own file; one SuperNode is killed while
its client computes its masked input in round 2, then started again.

Adversary and fault: a client whose machine dies mid-phase and comes back. The round must still
give the exact sum of the survivors (secure aggregation's dropout recovery, played across
processes), the log must say who was dropped and why, the restarted node (a new Flower node)
must rejoin as the same client from its sealed state on its disk and be counted again in
round 3, and ``secureffm audit --verify`` must accept the log against the run's pin. Slow: Flower
starts a Python process per message on each SuperNode, which hands it to the node's warm process
(about 12 s per exchange on this 2-core machine at load about 35, most of it Flower's own
polling; the two-round test took 302-445 s, the three-round rejoin test 27 minutes beside
another deployment test before the warm process).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from secureffm.audit.verify import verify_run  # noqa: E402
from secureffm.config import RunConfig  # noqa: E402
from secureffm.federation.flower import LocalDeployment  # noqa: E402
from secureffm.federation.keyfiles import provision  # noqa: E402
from secureffm.federation.pin import RunPin  # noqa: E402
from secureffm.runs.flower_node import run_config_of  # noqa: E402
from secureffm.runs.flower_policy import policy_of, write_policy  # noqa: E402

CLIENTS = ["client-1", "client-2", "client-3"]
VICTIM = "client-3"


@pytest.mark.slow
def test_a_supernode_killed_in_masked_input_leaves_the_survivors_sum_and_rejoins(tmp_path):
    keys = tmp_path / "keys"
    provision(keys, CLIENTS)
    hold = tmp_path / "held"
    config = RunConfig(method="got", protocol="dp-secagg", clients=3, partition="iid",
                       shard_size=64, batch_size=16, rounds=3, hidden=16, potential_hidden=16,
                       candidates=16, eval_samples=200, nfe=(1,), trajectories=20,
                       progress=False, device="cpu", phase_timeout=150.0,
                       out=str(tmp_path / "run"))
    write_policy(policy_of(config), tmp_path / "policy.toml")  # each hospital's, here one file
    nodes = {cid: {"keys": str(keys), "policy": str(tmp_path / "policy.toml"),
                   "journal": str(tmp_path / "journals" / f"{cid}.jsonl")} for cid in CLIENTS}
    nodes[VICTIM] |= {"fault-hold": "2:secagg.mask", "fault-hold-file": str(hold)}
    started = time.monotonic()
    with LocalDeployment("secureffm.runs.flower_server:main",
                         "secureffm.runs.flower_node:serve", CLIENTS, node_config=nodes,
                         home=str(tmp_path / "flower"), start_timeout=300,
                         admit="secureffm.runs.flower_node:hello") as deployment:
        out = deployment.submit(run_config_of(config, keys))
        while not hold.exists():
            assert time.monotonic() - started < 1500, "round 2's masked input never came"
            time.sleep(0.5)
        deployment.kill(VICTIM)
        del deployment.node_config[VICTIM]["fault-hold"]
        deployment.restart(VICTIM)
        result = deployment.wait(out, timeout=1500)
    print(f"deployment run: {time.monotonic() - started:.0f} s")

    folder = Path(result["out"])
    records = [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]
    aggregated = {(r["round"], r["of_kind"]): r["included"] for r in records
                  if r.get("event") == "aggregated"}
    assert aggregated[1, "gradient"] == CLIENTS
    assert aggregated[2, "gradient"] == ["client-1", "client-2"]  # the sum of the survivors
    assert aggregated[3, "gradient"] == CLIENTS  # the restarted node, counted again
    dropped = [r for r in records if r.get("event") == "dropped" and r["round"] == 2]
    # once in the gradient's aggregation (in its masked input), and in every later one that
    # round (GOT's dual update: it advertised no keys)
    assert {r["party"] for r in dropped} == {VICTIM}
    assert "masked input" in dropped[0]["detail"]
    # the victim's pairwise masks were removed: the round's inputs are unmasked exactly, which
    # the audit re-checks from the clients' signed shares and the survivors' masked inputs
    report = verify_run(folder, RunPin(head=result["pin"]["head"]))
    assert report.ok, report.first_bad
    assert result["metrics"]["aborted_aggregations"] == 0
    assert list((tmp_path / "journals").glob(f"{VICTIM}.*.state"))  # its sealed state
