import pytest
import torch

from secureffm.config import RunConfig


@pytest.fixture
def small_config(tmp_path):
    """A run that finishes in seconds: few rounds, small shards, small evaluation.

    Seeded secret streams (``insecure_deterministic``) keep these tests' numbers stable and let
    two runs see the same batches; tests/security/ checks the default, OS-entropy streams.
    """

    def make(**changes) -> RunConfig:
        values = dict(rounds=20, shard_size=400, batch_size=64, candidates=64, eval_samples=300,
                      nfe=(1, 4), trajectories=50, progress=False, device="cpu",
                      insecure_deterministic=True, out=str(tmp_path / "run"))
        values.update(changes)
        return RunConfig(**values)

    return make


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
