"""Running a sweep: finished cells are reused only when their recorded settings are the cell's,
an interrupted cell runs again, a changed setting re-runs; sweep.csv and the frontier written."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from secureffm.cli import main
from secureffm.errors import SecureFFMError
from secureffm.runs import run
from secureffm.sweep import is_finished, load_sweep, run_sweep

# Cells that finish in seconds: no DP (epsilon inf runs plaintext), 2 rounds, small shards.
TINY = """
root = "{root}"

[grid]
methods = ["vanilla"]
protocols = ["dp"]
epsilons = [inf]
seeds = [0, 1]

[run]
rounds = 2
shard_size = 400
batch_size = 64
eval_samples = 100
trajectories = 20
nfe = [2, 8]
device = "cpu"
"""


def _sweep_file(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(text.format(root=tmp_path / "runs"))
    return path


def test_a_cell_is_finished_only_with_metrics_and_the_same_settings(tmp_path, small_config):
    config = small_config(rounds=2, eval_samples=100, trajectories=20, overwrite=True)
    assert not is_finished(config)
    run(config)
    assert is_finished(config)
    # settings that change only how a run goes are not compared
    assert is_finished(dataclasses.replace(config, progress=True, threads=2, overwrite=False))
    assert not is_finished(dataclasses.replace(config, eval_samples=120))
    assert not is_finished(dataclasses.replace(config, keep_payloads=True))
    (Path(config.out) / "metrics.json").unlink()  # cut short before the end
    assert not is_finished(config)


@pytest.mark.slow
def test_a_sweep_resumes_reuses_and_reruns(tmp_path):
    """~40 s on a busy 2-core machine: five tiny runs."""
    lines: list[str] = []
    spec = load_sweep(_sweep_file(tmp_path))
    first = run_sweep(spec, lines.append)
    assert first.ran == ["vanilla-dp-einf-s0", "vanilla-dp-einf-s1"] and first.skipped == []
    with first.csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["epsilon"], r["protocol"], r["protocol_run"], r["seed"]) for r in rows] == \
        [("inf", "dp", "plaintext", "0"), ("inf", "dp", "plaintext", "1")]
    assert all(r["spent_rdp"] == "" and float(r["w2_nfe2"]) > 0 for r in rows)
    assert first.figure.stat().st_size > 0
    assert "[start 1/2] vanilla-dp-einf-s0" in lines[1] and "[done 2/2]" in lines[-1]

    folders = {c.name: spec.root / c.name / "metrics.json" for c in spec.cells()}
    stamps = {name: path.stat().st_mtime_ns for name, path in folders.items()}
    again = run_sweep(spec, lines.append)
    assert again.ran == [] and again.skipped == list(folders)
    assert {n: p.stat().st_mtime_ns for n, p in folders.items()} == stamps
    assert again.rows == first.rows

    folders["vanilla-dp-einf-s1"].unlink()  # an interrupted sweep: that run never finished
    resumed = run_sweep(spec, lines.append)
    assert resumed.ran == ["vanilla-dp-einf-s1"] and resumed.skipped == ["vanilla-dp-einf-s0"]
    assert folders["vanilla-dp-einf-s0"].stat().st_mtime_ns == stamps["vanilla-dp-einf-s0"]

    changed = load_sweep(_sweep_file(tmp_path, TINY.replace("eval_samples = 100",
                                                            "eval_samples = 120")),
                         {"workers": 2})
    rerun = run_sweep(changed, lines.append)
    assert sorted(rerun.ran) == list(folders) and rerun.skipped == []
    assert all(json.loads(path.read_text())["eval"]["eval_samples"] == 120
               for path in folders.values())


def test_an_unknown_attack_is_refused_before_any_cell(tmp_path):
    spec = load_sweep(_sweep_file(tmp_path, 'attacks = ["no-such-attack"]\n' + TINY))
    with pytest.raises(SecureFFMError, match="'no-such-attack' is not an attack of "
                                             "secureffm.audit.attacks; use one of inversion"):
        run_sweep(spec, print)
    assert not spec.root.exists()


@pytest.mark.slow
def test_a_sweep_runs_the_attacks_it_asks_for_and_reuses_them(tmp_path):
    """Utility and empirical leakage side by side: one DP cell planted with canaries, the
    one-run audit's bound in the CSV beside the accounted epsilon; a second call runs neither
    the cell nor its attack again."""
    text = 'attacks = ["one-run"]\n' + TINY.replace("epsilons = [inf]", "epsilons = [8]").replace(
        "seeds = [0, 1]", "seeds = [0]").replace("rounds = 2", "rounds = 3\ncanaries = 20")
    spec = load_sweep(_sweep_file(tmp_path, text))
    first = run_sweep(spec, print)
    (row,) = first.rows
    assert 0 <= float(row["one-run_epsilon_lower_bound"]) <= float(
        row["one-run_epsilon_accounted"]) <= 8.0 + 1e-6
    assert float(row["one-run_canaries"]) == 20
    attacks = spec.root / spec.cells()[0].name / "attacks.json"
    stamp = attacks.stat().st_mtime_ns
    again = run_sweep(spec, print)
    assert again.ran == [] and attacks.stat().st_mtime_ns == stamp and again.rows == first.rows


def test_a_failed_cell_does_not_stop_the_others(tmp_path, capsys):
    """vanilla sends gradients, which `sealed` (dp-sealed at inf) cannot protect: that run is
    refused as it starts; the plaintext cell after it still runs, and the command exits 2."""
    path = _sweep_file(tmp_path, TINY.replace('["dp"]', '["dp-sealed", "dp"]')
                       .replace("seeds = [0, 1]", "seeds = [0]"))
    assert main(["sweep", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "1 of 2 cells failed" in err and "vanilla-dp-sealed-einf-s0" in err
    assert "[FAILED 1/2] vanilla-dp-sealed-einf-s0" in out and "[done 2/2]" in out
    with (tmp_path / "runs" / "sweep.csv").open() as handle:
        assert [r["protocol_run"] for r in csv.DictReader(handle)] == ["plaintext"]


def test_image_cells_report_fid_at_each_nfe(tmp_path):
    path = _sweep_file(tmp_path, TINY.replace("seeds = [0, 1]", "seeds = [0]").replace(
        "rounds = 2", 'rounds = 2\ndata = "shapes"\nimage_size = 8\nunet_width = 8\n'
        "unet_mult = [1, 2]").replace("shard_size = 400", "shard_size = 64").replace(
        "batch_size = 64", "batch_size = 8").replace("eval_samples = 100", "eval_samples = 32"))
    result = run_sweep(load_sweep(path), print)
    assert [k for k in result.rows[0] if "_nfe" in k] == ["fid_nfe2", "fid_nfe8"]
    assert result.figure.stat().st_size > 0
