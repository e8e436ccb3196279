"""The runners' shared scaffold: run folder, checkpoints, pins (secureffm/runs/scaffold.py).

Truths used: the file system as the test leaves it, a planted pickle whose ``__reduce__``
would create a marker file, and the pin computed by secureffm.federation.pin from parties.json.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from secureffm.cli import main as cli_main
from secureffm.config import RunConfig
from secureffm.errors import ConfigError
from secureffm.federation.log import MessageLog
from secureffm.federation.parties import Registry, new_server
from secureffm.federation.pin import pin_of
from secureffm.protocols.statement import INSECURE
from secureffm.runs import run
from secureffm.runs.scaffold import (
    RUN_ARTIFACTS,
    check_pin_path,
    load_checkpoint,
    pin_message,
    prepare_run_folder,
    record_pin,
    save_checkpoint,
)


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_new_run_folder_is_created_and_an_empty_one_accepted(tmp_path):
    out = prepare_run_folder(tmp_path / "a" / "run", overwrite=False)
    assert out.is_dir()
    assert prepare_run_folder(out, overwrite=False) == out


def test_a_non_empty_folder_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "privacy.json").write_text("{}")
    with pytest.raises(ConfigError, match="is not empty .*privacy.json.*pass --overwrite"):
        prepare_run_folder(out, overwrite=False)
    assert (out / "privacy.json").read_text() == "{}"


def test_overwrite_removes_exactly_the_known_artifacts(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in RUN_ARTIFACTS:
        (out / name).write_text("old")
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    prepare_run_folder(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["data", "notes.txt"]


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "run").write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a folder"):
        prepare_run_folder(tmp_path / "run", overwrite=True)


def test_a_planted_pickle_is_refused_naming_the_file_and_never_runs(tmp_path):
    """Adversary: whoever can write the run folder plants a pickle that runs a command."""
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint.safetensors"
    torch.save({"state": _Planted(marker)}, path)
    with pytest.raises(ConfigError, match=f"{path} is not a checkpoint secureffm wrote"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_checkpoint_of_tensors_and_plain_values_loads(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, {"config": {"hidden": 8, "nfe": [1, 2]}, "w": torch.arange(3.0)})
    loaded = load_checkpoint(path)
    assert loaded["config"] == {"hidden": 8, "nfe": [1, 2]}
    assert torch.equal(loaded["w"], torch.arange(3.0))
    with pytest.raises(ConfigError, match="missing: is .* a finished run folder"):
        load_checkpoint(tmp_path / "other.pt")


def test_a_pin_inside_the_run_folder_is_refused_and_one_outside_accepted(tmp_path):
    out = tmp_path / "run"
    for inside in (out / "pin.json", out / "sub" / "pin.json", out / ".." / "run" / "p.json"):
        with pytest.raises(ConfigError, match="lies inside the run folder"):
            check_pin_path(out, str(inside))
    check_pin_path(out, str(tmp_path / "run2" / "pin.json"))  # a sibling sharing the prefix
    check_pin_path(out, str(tmp_path / "pin.json"))
    check_pin_path(out, "")  # no pin asked for


def test_record_pin_writes_the_pin_of_the_closed_log_apart(tmp_path):
    out = tmp_path / "run"
    log = MessageLog(out / "messages.jsonl")
    server = new_server()
    log.register(Registry.of([server]))
    head = log.close(server)
    kept = tmp_path / "kept" / "pin.json"
    pin = record_pin(out, head, str(kept))
    assert pin == pin_of(out, head).as_dict() and pin["head"] == head
    assert json.loads(kept.read_text()) == pin
    assert head in pin_message(out, pin, str(kept)) and str(kept) in pin_message(out, pin,
                                                                                 str(kept))
    assert record_pin(out, None, str(tmp_path / "never.json")) is None
    assert not (tmp_path / "never.json").exists()
    assert pin_message(out, None, "") == "log head: none (the log has no closing record)"


def _sentences(privacy: dict) -> list[str]:
    """Every claim, trust and DP sentence of a privacy.json that claims something (not those
    that begin "none:", which stay true)."""
    claims = [c for m in privacy["mechanisms"].values() for c in m["claims"]]
    return [s for s in [privacy["dp"], *privacy["trust"], *claims] if not s.startswith("none:")]


def test_an_insecure_deterministic_run_says_no_claim_holds_in_its_files_and_on_stdout(
        tmp_path, capsys):
    """Reader: whoever takes a run's files or its printout as a privacy result. Under
    --insecure-deterministic anyone with config.toml replays the DP noise; before this only
    privacy.json's ``secret_randomness`` said so (its claims and ``target_held`` said the
    opposite, and metrics.json and stdout nothing)."""
    config = tmp_path / "run.toml"
    config.write_text(f'method = "vanilla"\nprotocol = "dp-secagg"\nrounds = 1\nshard_size = 200\n'
                      f"batch_size = 32\nnoise_multiplier = 4.0\neval_samples = 100\n"
                      f'nfe = [1]\ntrajectories = 10\nprogress = false\ndevice = "cpu"\n'
                      f'insecure_deterministic = true\nout = "{tmp_path / "run"}"\n')
    assert cli_main(["run", "--config", str(config)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("INSECURE: no privacy claim of this run holds") and (
        INSECURE in printed[-1])
    out = tmp_path / "run"
    assert json.loads((out / "metrics.json").read_text())["insecure_deterministic"] is True
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["insecure_deterministic"] is True
    assert len(_sentences(privacy)) == 5  # dp, two trust sentences, two claims
    assert all(s.startswith(INSECURE) for s in _sentences(privacy))
    assert all(row["target_held"] is False for row in privacy["clients"].values())


def test_an_insecure_deterministic_fedwad_run_says_no_claim_holds(tmp_path, capsys):
    """As above for FedWAD, whose randomized t replays from the seed."""
    assert cli_main(["fedwad", "--samples", "60", "--iterations", "2", "--support", "20",
                     "--protocol", "fedwad-private", "--insecure-deterministic",
                     "--out", str(tmp_path / "fedwad")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("INSECURE: no privacy claim")
    result = json.loads((tmp_path / "fedwad" / "result.json").read_text())
    assert result["insecure_deterministic"] is True
    privacy = json.loads((tmp_path / "fedwad" / "privacy.json").read_text())
    assert privacy["insecure_deterministic"] is True
    assert len(_sentences(privacy)) == 2  # randomized t's claim and its trust
    assert all(s.startswith(INSECURE) for s in _sentences(privacy))


def test_a_dcfm_run_states_the_nominal_size_its_q_uses(tmp_path):
    """modes2d with 4 clients of 100 deals 3 x 133 points: the public nominal size is 99.75,
    which q = batch / nominal uses; privacy.json once stated it rounded to 100."""
    result = run(RunConfig(method="dcfm-b", protocol="dp-sealed", data="modes2d",
                           partition="iid", clients=4, shard_size=100, batch_size=32,
                           hidden=16, local_steps=2, distill_steps=2, teacher_steps=2,
                           eval_samples=40, nfe=(4,), noise_multiplier=4.0, progress=False,
                           device="cpu", out=str(tmp_path / "dcfm")))
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert privacy["insecure_deterministic"] is False
    assert privacy["nominal_shard_size"] == 99.75 and "size 99.75" in privacy["adjacency"]
    for row in privacy["clients"].values():
        (_, q, _), = row["schedule"]["model"]
        assert q == privacy["sample_rate"] == 32 / privacy["nominal_shard_size"]
