"""A run on the clients' own tables (secureffm/runs/silo.py, secureffm/runs/ffm.py), and
synthetic data out of it (secureffm/runs/synthetic.py): files in, each client's evaluation on
its own held-out rows, ``sample``, ``export`` and ``secureffm.load``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import secureffm
from secureffm.audit import verify_run
from secureffm.cli import main
from secureffm.data.files import read_columns
from secureffm.data.schema import Schema
from secureffm.errors import ConfigError, TableError
from secureffm.federation.channel import Task
from secureffm.federation.log import MessageLog
from secureffm.federation.message import SERVER
from secureffm.runs import run
from secureffm.runs.ffm import build_run
from secureffm.runs.silo import EVALUATE, EVALUATION, evaluate_on_silos

SCHEMA = """
[[columns]]
name = "age"
type = "integer"
low = 18
high = 90

[[columns]]
name = "dose"
type = "continuous"
low = 0.0
high = 10.0

[[columns]]
name = "smoker"
type = "binary"

[[columns]]
name = "ward"
type = "categorical"
categories = ["icu", "surgery", "general"]
"""


def _silo(path, rows: int, shift: float, seed: int):
    """A hospital's CSV: age, dose (correlated with age), smoker, ward; ``shift`` moves ages."""
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(50 + shift, 10, rows).round(), 18, 90).astype(int)
    dose = np.clip(age / 10 + rng.normal(0, 0.5, rows), 0, 10)
    smoker = (rng.random(rows) < 0.3).astype(int)
    ward = rng.choice(["icu", "surgery", "general"], rows, p=[0.2, 0.3, 0.5])
    lines = [f"{a},{d:.3f},{s},{w}\n" for a, d, s, w in zip(age, dose, smoker, ward,
                                                             strict=True)]
    path.write_text("age,dose,smoker,ward\n" + "".join(lines))
    return path


@pytest.fixture
def hospitals(tmp_path):
    """Three hospitals' files (non-IID ages) and the public schema."""
    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA)
    files = [_silo(tmp_path / f"hospital-{i}.csv", 150, 10 * (i - 2), i) for i in range(1, 4)]
    return schema, files


def _table_config(small_config, schema_path, files, **changes):
    values = dict(data="table", client_data=tuple(map(str, files)), schema=str(schema_path),
                  clients=len(files), shard_size=120, batch_size=32, rounds=15, eval_samples=200,
                  nfe=(4,), target_column="smoker")
    values.update(changes)
    return small_config(**values)


def test_three_hospitals_train_and_each_evaluates_on_its_own_held_out_rows(small_config,
                                                                          hospitals):
    """The model's dimension comes from the schema (3 numeric/one-hot widths: 1 + 1 + 2 + 3);
    each client reports on its own side; the server's log holds only protected updates, the
    released model and the clients' numbers, and it verifies."""
    schema, files = hospitals
    result = run(_table_config(small_config, schema, files, method="got"))
    reports = result.metrics["eval"]["clients"]
    assert set(reports) == {"client-1", "client-2", "client-3"}
    for report in reports.values():
        assert report["holdout_rows"] == 30 and report["synthetic_rows"] == 200
        assert report["w2"] > 0 and report["w2_floor"] > 0
        assert set(report["ks"]) == {"age", "dose"} and set(report["tv"]) == {"smoker", "ward"}
        assert report["efficacy"]["target"] == "smoker"
    assert result.metrics["eval"]["schema"]["digest"] == Schema.load(schema).digest()
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if r["kind"] == "evaluation"]
    assert sorted(r["sender"] for r in evaluations) == ["client-1", "client-2", "client-3"]
    assert verify_run(result.out).ok
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert any(e.startswith("evaluation:") for e in privacy["exclusions"])
    assert not (result.out / "trajectories.png").exists()  # the server holds no row to draw


def test_a_client_whose_file_breaks_the_schema_is_refused_by_name(small_config, hospitals,
                                                                  tmp_path):
    schema, files = hospitals
    bad = tmp_path / "bad.csv"
    bad.write_text("age,dose,smoker,ward\n40,1.0,0,icu\n41,2.0,0,maternity\n")
    with pytest.raises(TableError, match=r"bad\.csv.*'maternity'"):
        run(_table_config(small_config, schema, [files[0], bad, files[2]]))


@pytest.mark.parametrize(("changes", "named"), [
    (dict(schema=""), "needs the public schema"),
    (dict(clients=2), "one file per client"),
    (dict(method="icfm"), "use one of vanilla, lot, got"),
    (dict(holdout=1.0), "strictly between 0 and 1"),
])
def test_a_tabular_config_missing_a_part_is_refused_by_name(small_config, hospitals, changes,
                                                            named):
    schema, files = hospitals
    with pytest.raises(ConfigError, match=named):
        _table_config(small_config, schema, files, **changes)


def test_a_target_column_outside_the_schema_is_refused_before_training(small_config, hospitals):
    schema, files = hospitals
    with pytest.raises(ConfigError, match="'outcome' is not a column"):
        run(_table_config(small_config, schema, files, target_column="outcome"))


def test_a_client_evaluates_once_whatever_the_server_asks(small_config, hospitals):
    """Adversary: a server that asks for the clients' evaluation again (of another model, to
    learn more about their held-out rows): each client answers the first request only, and
    refuses the next by name in its signed event."""
    schema, files = hospitals
    config = _table_config(small_config, schema, files, rounds=2)
    out = Path(config.out)
    out.mkdir(parents=True)
    _, shards, trainer = build_run(config, torch.device("cpu"), MessageLog(out / "messages.jsonl"),
                                   None, out)
    assert shards is None  # the server holds no row
    first = evaluate_on_silos(trainer.channel, trainer.velocity.averaged, 3)
    assert all("w2" in report for report in first.values())
    again = trainer.channel.send(4, "evaluate", EVALUATION, "client-1", SERVER,
                                 Task(EVALUATE, {"round": 4}))
    assert again is None
    trainer.channel.close()
    records = [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "rejected" and "evaluates once a run" in r.get("detail", "")
               for r in records)


def test_sample_export_and_load_give_rows_of_the_schema(small_config, hospitals, tmp_path,
                                                        capsys):
    schema, files = hospitals
    result = run(_table_config(small_config, schema, files, method="vanilla",
                               protocol="dp", target_epsilon=8.0, insecure_deterministic=False))
    synth = tmp_path / "synth.csv"
    assert main(["sample", str(result.out), "--n", "500", "--out", str(synth)]) == 0
    rows = read_columns(synth)
    assert list(rows) == ["age", "dose", "smoker", "ward"] and len(rows["age"]) == 500
    ages = rows["age"].astype(float)
    assert np.all((18 <= ages) & (ages <= 90)) and np.all(ages == np.round(ages))
    assert set(rows["ward"].tolist()) <= {"icu", "surgery", "general"}
    notice = json.loads((tmp_path / "synth.csv.privacy.json").read_text())
    assert notice["holds"].startswith("the run's DP guarantee") and notice["rows"] == 500
    assert any(e.startswith("evaluation:") for e in notice["exclusions"])

    exported = tmp_path / "export"
    assert main(["export", str(result.out), "--out", str(exported)]) == 0
    assert {p.name for p in exported.iterdir()} == {"velocity.safetensors", "model.json",
                                                   "privacy.json"}
    from_run, from_export = secureffm.load(result.out), secureffm.load(exported)
    a, b = from_run.sample(50, seed=3), from_export.sample(50, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the same model, no pickle needed
    assert main(["sample", str(result.out), "--n", "5", "--out", str(synth)]) == 2  # no clobber
    assert "exists" in capsys.readouterr().err


def test_samples_of_a_run_without_dp_say_that_nothing_private_holds(small_config, tmp_path):
    result = run(small_config(method="vanilla", rounds=3))
    out = tmp_path / "points.npy"
    assert main(["sample", str(result.out), "--n", "20", "--out", str(out)]) == 0
    points = read_columns(out)
    assert list(points) == ["x0", "x1"]
    notice = json.loads((tmp_path / "points.npy.privacy.json").read_text())
    assert notice["holds"].startswith("none")
