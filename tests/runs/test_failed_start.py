"""A run refused at its start leaves the run folder as it found it (secureffm/runs/scaffold.py,
``starting_run_folder``): absent when it did not exist, exactly as before under --overwrite.

Truths used: the file system as the test leaves it (every name and every file's bytes), and the
refusal each loader or check raises on its own (partition, budget, protocol, data recipe).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from secureffm.cli import main as cli_main
from secureffm.config import RunConfig
from secureffm.errors import (
    BudgetError,
    DataError,
    ProtocolError,
    RunInterrupted,
    SecureFFMError,
)
from secureffm.runs import run
from secureffm.runs.preflight import preflight
from secureffm.runs.scaffold import RUN_ARTIFACTS

_SMALL = dict(method="vanilla", rounds=2, shard_size=100, batch_size=16, hidden=16,
              eval_samples=50, nfe=(1,), trajectories=10, progress=False, device="cpu")

# One refusal per start-time check a runner meets after it has made its folder: what it is
# refused for, the run's settings, the error and the change its message names.
REFUSALS = {
    "disjoint partition with fewer label groups than clients": (
        dict(data="gaussian-moons", clients=3), DataError, "use fewer clients"),
    "dirichlet shard below the batch size": (
        dict(partition="dirichlet", dirichlet_alpha=0.01, clients=6, batch_size=64),
        DataError, "fewer than the batch size"),
    "budget past the target epsilon": (
        dict(protocol="dp", target_epsilon=1.0, noise_multiplier=0.5, rounds=50),
        BudgetError, "past the target 1 .*raise the noise multiplier or the target epsilon"),
    "protocol stage invalid for the federation": (
        dict(protocol="he", clients=1), ProtocolError, "at least 2 clients"),
    "DCFM data recipe": (
        dict(method="dcfm-a", data="modes2d", clients=3, local_steps=2, dcfm_steps=1),
        DataError, "use clients = 2"),
}


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_start_leaves_no_run_folder(tmp_path, refusal):
    """Adversary: none; the user who corrects the refused command and reruns it. A stub folder
    of config.toml, messages.jsonl and parties.json would refuse the rerun as "not empty" and
    hold a log of a run that never ran."""
    changes, error, advice = REFUSALS[refusal]
    out = tmp_path / "runs" / "new"
    with pytest.raises(error, match=advice):
        run(RunConfig(**{**_SMALL, **changes, "out": str(out)}))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_start_under_overwrite_leaves_the_previous_run_as_it_was(tmp_path, refusal):
    """Adversary: none; the user whose --overwrite run is refused at its start. The previous
    run's files (and the user's own beside them) must survive a start that never ran."""
    changes, error, advice = REFUSALS[refusal]
    out = tmp_path / "run"
    (out / "journals").mkdir(parents=True)
    (out / "journals" / "client-1.jsonl").write_text("old journal")
    for name in RUN_ARTIFACTS:
        (out / name).write_text(f"old {name}")
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    with pytest.raises(error, match=advice):
        run(RunConfig(**{**_SMALL, **changes, "out": str(out), "overwrite": True}))
    assert _tree(out) == before


def test_the_cli_refuses_too_few_labels_for_the_clients_and_the_rerun_is_not_blocked(
        tmp_path, capsys):
    """Adversary: none; the report's command: a disjoint 2D run with more clients than label
    groups is refused by name, and the corrected command then runs in the same --out."""
    out = tmp_path / "run"
    args = ["run", "--method", "vanilla", "--data", "gaussian-moons", "--rounds", "1",
            "--shard-size", "100", "--batch-size", "16", "--hidden", "16", "--eval-samples",
            "50", "--nfe", "1", "--trajectories", "10", "--no-progress", "--device", "cpu",
            "--out", str(out)]
    assert cli_main([*args, "--clients", "3"]) == 2
    assert "label group(s) for 3 clients; use fewer clients" in capsys.readouterr().err
    assert not out.exists()
    assert cli_main([*args, "--clients", "2"]) == 0
    assert (out / "messages.jsonl").is_file()


def test_a_ctrl_c_during_the_start_leaves_no_run_folder(tmp_path, monkeypatch):
    """Adversary: none; the user who stops a long start (the DP calibration before round 1)
    with Ctrl-C: nothing was released, so no folder, log or privacy.json stays behind."""
    from secureffm.methods.ffm import FederatedFlowMatching

    def calibrating(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(FederatedFlowMatching, "refuse_overspending", calibrating)
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match=r"\(SIGINT\) before the first round: nothing was"):
        run(RunConfig(**{**_SMALL, "protocol": "dp", "target_epsilon": 1.0, "out": str(out)}))
    assert not out.exists()

def test_a_failure_after_the_first_round_began_keeps_the_folder(tmp_path, monkeypatch):
    """The cleanup covers the start only: a run stopped part way keeps its closed log and
    privacy.json (docs/privacy.md, "Interruption and resume")."""
    from secureffm.methods.ffm import FederatedFlowMatching

    def broken(self, round_):
        raise SecureFFMError(f"stopped in round {round_}")

    monkeypatch.setattr(FederatedFlowMatching, "train_round", broken)
    out = tmp_path / "run"
    with pytest.raises(SecureFFMError, match="stopped in round 1"):
        run(RunConfig(**{**_SMALL, "out": str(out)}))
    assert {"config.toml", "messages.jsonl", "parties.json", "privacy.json"} <= {
        p.name for p in out.iterdir()}


def test_too_few_label_groups_are_refused_before_the_run_folder_is_made(tmp_path):
    """The reported case is refused by the preflight, which writes nothing: a disjoint split of
    2 label groups (the moons) over 3 clients, also with clients = 9 on 8 gaussians."""
    for data, clients, groups in (("gaussian-moons", 3, 2), ("gaussian-8gaussians", 9, 8)):
        config = RunConfig(**{**_SMALL, "data": data, "clients": clients,
                              "out": str(tmp_path / "run")})
        with pytest.raises(DataError, match=f"{groups} label group"):
            preflight(config)
        preflight(RunConfig(**{**_SMALL, "data": data, "clients": groups}))
    assert not (tmp_path / "run").exists()
