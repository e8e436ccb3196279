"""The DCFM runner (secureffm/runs/dcfm.py): DP resolved once for the kind each method sends,
FedFlow's updates through the protocol's aggregate stage, and the log closed by the server."""

from __future__ import annotations

import json

import pytest

from secureffm.audit import verify_run
from secureffm.config import RunConfig
from secureffm.errors import ProtocolError
from secureffm.runs import run


def _config(tmp_path, method: str, **changes) -> RunConfig:
    values = dict(method=method, data="modes2d", partition="disjoint", shard_size=120,
                  batch_size=32, hidden=16, local_steps=4, dcfm_steps=2, distill_steps=2,
                  teacher_steps=2, fedflow_rounds=2, fedflow_local_steps=2, eval_samples=40,
                  nfe=(4,), progress=False, device="cpu", insecure_deterministic=True,
                  out=str(tmp_path / method))
    values.update(changes)
    return RunConfig(**values)


def test_a_dp_stage_that_leaves_out_the_models_dcfm_sends_is_refused(tmp_path):
    """DCFM-A sends ``model`` messages derived from client data; a dp stage protecting only
    ``gradient`` would leave them without DP while the protocol's name promises it (sealing
    them does not make them DP)."""
    spec = tmp_path / "dp-gradients.toml"
    spec.write_text('name = "dp-gradients"\n[[stages]]\nstage = "dp"\nprotects = ["gradient"]\n'
                    "clip = 1.0\ndelta = 1e-5\nnoise_multiplier = 1.0\n"
                    '[[stages]]\nstage = "sealed"\nprotects = ["model"]\n')
    with pytest.raises(ProtocolError, match="does not protect 'model'"):
        run(_config(tmp_path, "dcfm-a", protocol=str(spec)))


def test_a_protocol_protecting_nothing_dcfm_sends_is_refused(tmp_path):
    """secagg protects updates only: DCFM-A's models would all travel in the clear."""
    with pytest.raises(ProtocolError, match="none of what method 'dcfm-a' sends \\(model\\)"):
        run(_config(tmp_path, "dcfm-a", protocol="secagg"))


def test_fedflow_aggregates_its_updates_through_secure_aggregation(tmp_path):
    result = run(_config(tmp_path, "fedflow", protocol="secagg"))
    assert verify_run(result.out).ok
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    masked = [r for r in records if r["phase"] == "masked_input"]
    assert masked and all(r["kind"] == "update" and r["stages"] == ["secagg"] for r in masked)
    assert not [r for r in records if r["kind"] == "update" and r["phase"] == "upload"]
    aggregated = [r for r in records if r.get("event") == "aggregated"]
    assert len(aggregated) == 2 and all(r["of_kind"] == "update" for r in aggregated)
    assert records[-1]["event"] == "closed" and records[-1]["sender"] == "server"
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert "secure aggregation" in json.dumps(privacy["mechanisms"]["update"])
