"""TensorBoard event files (secureffm/runs/tensorboard.py): written into RUN/tensorboard/ when
the tensorboard package is installed, nothing when it is not.

Truths used: the run's own metrics.csv and metrics.json, read back from the event file by
TensorBoard's own reader (EventAccumulator).
"""

from __future__ import annotations

import csv
import json

import pytest

from secureffm.runs import run
from secureffm.runs.tensorboard import numbers


def test_numbers_flattens_nested_metrics_and_leaves_out_what_is_not_a_number():
    tree = {"eval": {"w2": [0.5, 0.25], "ok": True, "note": "x"}, "rounds": 3, "none": None}
    assert dict(numbers(tree)) == {"eval/w2/0": 0.5, "eval/w2/1": 0.25, "rounds": 3.0}


def test_a_run_writes_its_rounds_and_final_metrics_as_tensorboard_scalars(small_config):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run(small_config(method="vanilla", rounds=4))
    events = EventAccumulator(str(result.out / "tensorboard"))
    events.Reload()
    with (result.out / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    loss = [(e.step, e.value) for e in events.Scalars("round/loss")]
    assert loss == [(int(r["round"]), pytest.approx(float(r["loss"]), rel=1e-6)) for r in rows]
    metrics = json.loads((result.out / "metrics.json").read_text())
    final = {tag: events.Scalars(tag)[0] for tag in events.Tags()["scalars"]
             if tag.startswith("final/")}
    assert final["final/eval/iid_floor"].value == pytest.approx(metrics["eval"]["iid_floor"])
    assert {e.step for e in final.values()} == {4}
