"""Loading a run folder never executes code planted in it.

Adversary: someone who can write the run folder (a shared drive, a downloaded run) and plants a
pickle whose ``__reduce__`` runs a shell command in ``checkpoint.pt``. Before issue 13,
``load_velocity`` and ``load_dcfm`` called ``torch.load(..., weights_only=False)`` and ran it.
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
               run_dir / "checkpoint.pt")
    with pytest.raises(SecureFFMError, match="checkpoint.pt"):
        loader(run_dir)
    assert not marker.exists()


def test_a_genuine_checkpoint_still_loads(small_config):
    from secureffm.runs import run

    result = run(small_config(method="icfm", rounds=2))
    model = load_velocity(result.out)
    assert model(torch.zeros(3, 2), torch.zeros(3)).shape == (3, 2)
