"""Loading a run folder never executes code planted in it.

Adversary: someone who can write the run folder (a shared drive, a downloaded run) and plants a
pickle whose ``__reduce__`` runs a shell command in the run's checkpoint. Before issue 13,
``load_velocity`` and ``load_dcfm`` called ``torch.load(..., weights_only=False)`` and ran it;
since issue 38 a checkpoint is safetensors (tensors and a JSON tree, no pickle at all), and a
torch pickle in its place is refused as not being one.
"""

from __future__ import annotations

import os

import pytest
import torch

from secureffm.errors import SecureFFMError
from secureffm.runs import load_velocity
from secureffm.runs.dcfm import load_dcfm


class _Planted:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("loader", [load_velocity, load_dcfm])
def test_a_planted_pickle_in_checkpoint_pt_does_not_run(tmp_path, loader):
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"config": {"data": "8gaussians-moons", "hidden": 8}, "state": _Planted(marker)},
               run_dir / "checkpoint.safetensors")
    with pytest.raises(SecureFFMError, match="checkpoint.safetensors is not a checkpoint"):
        loader(run_dir)
    assert not marker.exists()


def test_a_genuine_checkpoint_still_loads(small_config):
    from secureffm.runs import run

    result = run(small_config(method="icfm", rounds=2))
    model = load_velocity(result.out)
    assert model(torch.zeros(3, 2), torch.zeros(3)).shape == (3, 2)


def test_a_checkpoint_round_trips_nested_state_without_pickle(tmp_path):
    """What a run saves (nested dicts keyed by strings and by parameter index, tuples, lists,
    tensors of several dtypes, None) comes back equal, from a file any safetensors reader
    opens."""
    from safetensors.numpy import load_file

    from secureffm.runs.scaffold import load_checkpoint, save_checkpoint

    content = {"config": {"nfe": [1, 2], "seed": 0, "out": "runs/x", "flag": True},
               "state": {"module": {"w": torch.randn(3, 2)}, "optimizer": {"state": {
                   0: {"step": torch.tensor(4.0), "exp_avg": torch.zeros(3)}},
                   "param_groups": [{"betas": (0.9, 0.999), "params": [0]}]},
                   "ema": None, "counts": torch.arange(5)}, "round": 7}
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, content)
    back = load_checkpoint(path)
    assert back["config"] == content["config"] and back["round"] == 7
    assert torch.equal(back["state"]["module"]["w"], content["state"]["module"]["w"])
    assert back["state"]["optimizer"]["state"][0]["step"] == 4.0
    assert back["state"]["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["state"]["ema"] is None and back["state"]["counts"].dtype == torch.int64
    assert len(load_file(path)) == 4  # the tensors, readable without secureffm
