"""Devices and public generators (secureffm/runtime.py)."""

from __future__ import annotations

import pytest
import torch

from secureffm.errors import ConfigError
from secureffm.runtime import party_generator, resolve_device


def test_devices_resolve_or_are_refused_by_name():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="device = 'tpu' is unknown; use 'auto', 'cpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available here"):
            resolve_device("cuda:0")


def test_public_generators_replay_by_seed_and_differ_by_party():
    def draw(seed, party):
        return torch.rand(4, generator=party_generator(seed, party, torch.device("cpu")))

    assert torch.equal(draw(3, 1), draw(3, 1))
    assert not torch.equal(draw(3, 1), draw(3, 2)) and not torch.equal(draw(3, 0), draw(4, 0))
