"""A node that dies mid-round and restarts is the same client again from the next round
(secureffm/runs/flower_node.py serve, secureffm/federation/node_state.py), without Flower: the
server's process (flower_server.main) drives nodes in this process through a loopback
``calls`` whose node for client-3 dies when round 2's masked input is asked (no reply, its
memory gone), then is served again from nothing but its node config and its disk, as a
restarted SuperNode (tests/federation/test_rejoin.py tests the signed hello that moves the
client to its new Flower node; tests/runs/test_flower_deployment.py the real processes).

Adversary (second test): a malicious server that asks the restarted client for the masked
input of the round it dropped from, after the survivors revealed its pairwise secrets for
that round (per-round secagg: its s_sk shares; keys once: its round seeds k_uv^r). Truths
used: the run folder's messages.jsonl and the audit of the log against the run's pin.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from secureffm.audit.verify import verify_run
from secureffm.config import RunConfig
from secureffm.federation.codec import decode_reply, decode_request
from secureffm.federation.keyfiles import provision
from secureffm.federation.pin import RunPin
from secureffm.runs import flower_node, flower_server
from secureffm.runs.flower_policy import policy_of, write_policy

CLIENTS = ["client-1", "client-2", "client-3"]
VICTIM = "client-3"
MASK = {"dp-secagg": "secagg.mask", "dp-secagg-once": "secagg.epoch.mask"}


class Stop(Exception):
    """The loopback stops the server's run (the malicious test takes over)."""


class Restarting:
    """Flower for the server's process, in this process: client id -> node config, the node's
    memory (its state bytes) kept between calls. Client-3's node config holds
    ``fault-hold = "2:<mask action>"``: that request reaches its node, which stops in it
    (flower_node's fault injection, here in a daemon thread left asleep) and is then taken as
    dead: no reply, its memory gone; later requests reach it as a restarted node. ``stop``:
    raise Stop right after it died, keeping the request it never answered."""

    def __init__(self, run_config: dict, nodes: dict[str, dict], stop: bool = False):
        self.run_config, self.nodes, self.stop = run_config, nodes, stop
        self.memory: dict[str, bytes] = {}
        self.unanswered: bytes | None = None

    def hello(self, timeout: float, clients: int = 0) -> dict[str, int]:
        return {cid: node for node, cid in enumerate(CLIENTS)}

    def call(self, requests: dict[str, bytes], timeout: float) -> dict[str, bytes | None]:
        out = {}
        for cid, frame in requests.items():
            if cid == VICTIM and self.unanswered is None and self._dies(frame):
                self.unanswered, out[cid] = frame, None
                continue
            self.memory[cid], out[cid] = flower_node.serve(
                self.nodes[cid], self.run_config, self.memory.get(cid), frame)
        if self.stop and self.unanswered is not None:
            raise Stop
        return out

    def _dies(self, frame: bytes) -> bool:
        """Serve ``frame`` to the victim's node; True when it stopped in it (then it is dead)."""
        node, held = self.nodes[VICTIM], Path(self.nodes[VICTIM]["fault-hold-file"])
        request = decode_request(frame)[0]
        if f"{request.round}:{request.action}" != node["fault-hold"]:
            return False
        threading.Thread(target=flower_node.serve, daemon=True,
                         args=(node, self.run_config, self.memory.pop(VICTIM), frame)).start()
        while not held.exists():
            time.sleep(0.01)
        node.pop("fault-hold")  # the restarted node is started without the fault
        flower_node._LAST.clear()
        return True


def started(tmp_path: Path, protocol: str, stop: bool = False) -> Restarting:
    keys = tmp_path / "keys"
    provision(keys, CLIENTS)
    run = RunConfig(method="got", protocol=protocol, clients=3, partition="iid", rounds=3,
                    shard_size=64, batch_size=32, candidates=16, eval_samples=100, nfe=(1,),
                    hidden=16, potential_hidden=16, potential_every=2, trajectories=10,
                    progress=False, device="cpu", noise_multiplier=1.0, out=str(tmp_path / "run"))
    write_policy(policy_of(run), tmp_path / "policy.toml")
    nodes = {cid: {"client-id": cid, "keys": str(keys), "policy": str(tmp_path / "policy.toml"),
                   "journal": str(tmp_path / "journals" / f"{cid}.jsonl")} for cid in CLIENTS}
    nodes[VICTIM] |= {"fault-hold": f"2:{MASK[protocol]}",
                      "fault-hold-file": str(tmp_path / "held")}
    flower_node._LAST.clear()
    return Restarting(flower_node.run_config_of(run, keys), nodes, stop)


@pytest.mark.slow  # three rounds: 8 to 50 s here
@pytest.mark.parametrize("protocol", ["dp-secagg", "dp-secagg-once"])
def test_a_node_restarted_from_its_disk_is_counted_again_from_the_next_round(tmp_path,
                                                                             protocol):
    loopback = started(tmp_path, protocol)
    done = flower_server.main(loopback, loopback.run_config)
    flower_node._LAST.clear()
    folder = Path(done["out"])
    records = [json.loads(line) for line in (folder / "messages.jsonl").read_text().splitlines()]
    counted = {r["round"]: r["included"] for r in records
               if r.get("event") == "aggregated" and r["of_kind"] == "gradient"}
    assert counted == {1: CLIENTS, 2: ["client-1", "client-2"], 3: CLIENTS}
    assert done["metrics"]["aborted_aggregations"] == 0
    report = verify_run(folder, RunPin(head=done["pin"]["head"]))
    assert report.ok, report.first_bad
    assert list((tmp_path / "journals").glob(f"{VICTIM}.*.state"))


@pytest.mark.parametrize("protocol", ["dp-secagg", "dp-secagg-once"])
def test_a_restarted_client_refuses_to_mask_the_round_it_dropped_from(tmp_path, protocol):
    """Adversary: a malicious server. Client-3's node died when round 2's masked input was
    asked; the server re-sends that very request to the restarted node. Without the rule the
    restored client (its state after round 2's earlier phases) masked its input for a round
    whose pairwise secrets the survivors had been asked to reveal."""
    loopback = started(tmp_path, protocol, stop=True)
    with pytest.raises(Stop):
        flower_server.main(loopback, loopback.run_config)
    flower_node._LAST.clear()
    _, frame = flower_node.serve(loopback.nodes[VICTIM], loopback.run_config, None,
                                 loopback.unanswered)
    reply = decode_reply(frame, VICTIM)
    assert reply.envelope is None
    [event] = reply.events
    assert event["event"] == "rejected"
    assert "restarted during round 2" in event["detail"]
