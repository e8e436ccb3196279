"""DP-SGD's ghost clipping after an empty Poisson batch (a U-Net client with a small sample
rate draws one about e^-1 of the time at one expected example)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.models.unet import UNet
from secureffm.privacy.dpsgd import DPGradient


def _step(estimator: DPGradient, x1: torch.Tensor) -> np.ndarray:
    g = torch.Generator().manual_seed(1)
    x0, t = torch.randn(x1.shape, generator=g), torch.rand(len(x1), generator=g)
    return estimator(flow_matching_loss(estimator.forward_module, x0, x1, t), len(x1))


def test_an_empty_batch_leaves_the_next_step_as_a_fresh_estimator_computes_it():
    torch.manual_seed(0)
    model = UNet(1, 8, channel_mult=(1, 2), image_size=8)
    x1 = torch.rand(3, 1, 8, 8) * 2 - 1
    def estimator() -> DPGradient:  # clip 1, sigma 0, E[b] = 2
        return DPGradient(copy.deepcopy(model), 1.0, 0.0, 2.0, torch.Generator().manual_seed(0))

    fresh = _step(estimator(), x1)
    used = estimator()
    assert used.mode == "ghost"
    assert not _step(used, x1[:0]).any()  # no example, no noise at sigma 0: zero
    np.testing.assert_allclose(_step(used, x1), fresh, rtol=1e-5, atol=1e-7)
