"""Membership inference on a tabular run (secureffm/audit/attacks/tabular_membership.py), on
real tiny runs: two clients, 110 rows each of 8 continuous columns uniform on their public
bounds, 90% held out (11 training rows, 99 held-out rows per client)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from secureffm.audit.attacks import run_attack
from secureffm.audit.attacks.tabular_membership import (
    RESULT_FILE,
    distance_to_closest,
    tpr_bound,
)
from secureffm.cli import main
from secureffm.config import RunConfig
from secureffm.errors import SecureFFMError
from secureffm.runs import run

COLUMNS = 8
ROWS = 110
SCORES = ("loss", "averaged", "calibrated", "dcr")
WARD = ('[[columns]]\nname = "ward"\ntype = "categorical"\n'
        'categories = ["icu", "surgery", "general"]\n')


def _clients(folder, ward: bool):
    """The public schema and two clients' CSV files; ``ward``: a categorical column too."""
    schema = folder / "schema.toml"
    schema.write_text("".join(f'[[columns]]\nname = "c{i}"\ntype = "continuous"\nlow = -1.0\n'
                              "high = 1.0\n\n" for i in range(COLUMNS))
                      + (WARD if ward else ""))
    files = []
    for k in range(2):
        rng = np.random.default_rng(k)
        x = rng.uniform(-1, 1, (ROWS, COLUMNS))
        wards = rng.choice(["icu", "surgery", "general"], ROWS)
        path = folder / f"client-{k + 1}.csv"
        path.write_text(",".join(f"c{i}" for i in range(COLUMNS)) + (",ward" if ward else "")
                        + "\n" + "".join(",".join(f"{v:.4f}" for v in row)
                                       + (f",{w}" if ward else "") + "\n"
                                       for row, w in zip(x, wards, strict=True)))
        files.append(str(path))
    return schema, files


def _table_run(folder, ward: bool = False, **changes) -> RunConfig:
    schema, files = _clients(folder, ward)
    values = dict(method="vanilla", data="table", client_data=tuple(files), schema=str(schema),
                  clients=2, holdout=0.9, shard_size=11, batch_size=11, eval_samples=100,
                  nfe=(8,), hidden=64, ema_decay=0.0, lr=5e-3, progress=False, device="cpu",
                  out=str(folder / "run"))
    values.update(changes)
    run(RunConfig(**values))
    return folder / "run"


@pytest.fixture(scope="module")
def overfit_run(tmp_path_factory):
    """100 full-batch rounds on 11 rows per client, no DP, payloads kept."""
    torch.set_num_threads(1)
    return _table_run(tmp_path_factory.mktemp("overfit"), rounds=100, keep_payloads=True,
                      insecure_deterministic=True)


def test_membership_finds_the_training_rows_of_an_overfit_tabular_model(overfit_run):
    """Adversary: anyone holding the released model or its synthetic rows and a candidate
    row. After 100 full-batch steps on 11 rows per client, the synthetic rows sit near the
    training rows (DCR) and their loss is lower (averaged): both separate the 22 training rows
    from the 198 held-out ones well above chance (AUC 0.5; its standard error here is about
    0.065)."""
    found = run_attack(overfit_run, "membership")
    assert (found["members"], found["non_members"]) == (22, 198)
    assert (found["client-1_members"], found["client-1_non_members"]) == (11, 99)
    assert found["dcr_auc"] > 0.7 and found["averaged_auc"] > 0.6, found
    assert {f"{s}_tpr_at_1pct_fpr" for s in SCORES} <= set(found)
    assert found["dp_epsilon"] is None and found["dp_tpr_bound_at_1pct_fpr"] == 1.0
    assert "no DP" in found["interpretation"] and "0.50 is chance" in found["interpretation"]
    assert json.loads((overfit_run / RESULT_FILE).read_text()) == found


def test_the_dp_bound_is_read_from_privacy_json_and_printed(tmp_path, capsys):
    """The attack's report sets the measured TPR at 1% FPR beside what the run's DP claim
    allows: e^eps * 0.01 + delta, eps the client's spent epsilon in privacy.json. The table
    has a categorical column: synthetic rows are decoded (one category each) before DCR. After
    3 noisy rounds the model has learned nothing of any row: the scores sit at chance (within
    0.25 of 0.5, about 4 standard errors)."""
    folder = _table_run(tmp_path, ward=True, rounds=3, protocol="dp", target_epsilon=1.0,
                        delta=1e-5)
    assert main(["audit", "--attack", "membership", "--attack-option", "samples=500",
                 str(folder)]) == 0
    data, words = capsys.readouterr().out.split("\nmembership: ")  # JSON, then plain words
    found = json.loads(data)["membership"]
    words = " ".join(words.split())  # unwrapped
    privacy = json.loads((folder / "privacy.json").read_text())
    spent = [privacy["clients"][c]["rdp"]["total"] for c in ("client-1", "client-2")]
    assert found["client-1_dp_epsilon"] == spent[0] and found["dp_epsilon"] == max(spent)
    assert found["dp_tpr_bound_at_1pct_fpr"] == pytest.approx(
        math.exp(max(spent)) * 0.01 + 1e-5)
    assert found["dp_bound_holds"] is True and found["synthetic_rows"] == 500
    assert "caps any attack's TPR at 1% FPR at 2.7%" in words
    assert "calibrated_auc" not in found  # no payloads kept, no round-1 model
    assert abs(found["dcr_auc"] - 0.5) < 0.25 and abs(found["averaged_auc"] - 0.5) < 0.25
    assert json.loads((folder / RESULT_FILE).read_text()) == {**found, "interpretation": words}


def test_membership_refuses_what_it_cannot_score(overfit_run, tmp_path, small_config):
    copy = tmp_path / "copy"
    shutil.copytree(overfit_run, copy)
    client = overfit_run.parent / "client-1.csv"
    moved = tmp_path / "client-1.csv"
    shutil.copy(client, moved)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace(str(client), str(tmp_path / "gone.csv")))
    with pytest.raises(SecureFFMError, match="is not here"):
        run_attack(copy, "membership")
    with moved.open("a") as handle:
        handle.write("0,0,0,0,0,0,0,0\n" * 20)
    config.write_text(config.read_text().replace(str(tmp_path / "gone.csv"), str(moved)))
    with pytest.raises(SecureFFMError, match="the file changed since"):
        run_attack(copy, "membership")
    run(small_config(method="vanilla", rounds=2))
    with pytest.raises(SecureFFMError, match="runs on the clients' own tables"):
        run_attack(tmp_path / "run", "membership")


def test_distance_to_closest_against_brute_force():
    g = torch.Generator().manual_seed(0)
    x, records = torch.randn(7, 3, generator=g), torch.randn(5, 3, generator=g)
    brute = [min(float(np.linalg.norm(a - b)) for b in records.numpy()) for a in x.numpy()]
    assert distance_to_closest(x, records, chunk=3).numpy() == pytest.approx(brute, rel=1e-5)


def test_tpr_bound_closed_forms():
    assert tpr_bound(0.0, 0.0) == pytest.approx(0.01)  # eps = 0: no test beats a coin
    assert tpr_bound(1.0, 1e-5) == pytest.approx(math.e * 0.01 + 1e-5)
    assert tpr_bound(8.0, 1e-5) == 1.0
