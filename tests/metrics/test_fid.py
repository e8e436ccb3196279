"""The FID fallback: without pytorch-fid (torchvision does not import here) the Frechet distance
runs on a classifier trained on the images, and says it is not comparable with published FID."""

import pytest
import torch

from secureffm.data.images import make_shapes
from secureffm.metrics.fid import fid, image_features


@pytest.fixture(scope="module")
def features():
    data = make_shapes(600, 8, seed=0)
    return data, image_features(data.x, data.labels, 10, fid_weights="/nonexistent/pt.pth",
                                epochs=2)


def test_fallback_is_labelled_not_comparable(features):
    _, extractor = features
    info = extractor.describe()
    assert info["kind"] == "classifier" and info["comparable_with_published_fid"] is False
    assert "NOT comparable with published FID" in info["note"]
    assert "pytorch-fid could not run" in info["note"]  # says why Inception was not used


def test_fallback_ranks_real_images_above_noise(features):
    data, extractor = features
    held_out = make_shapes(600, 8, seed=1).x
    real = fid(extractor, held_out, data.x)
    blurred = fid(extractor, torch.nn.functional.avg_pool2d(held_out, 3, 1, 1), data.x)
    noise = fid(extractor, torch.rand_like(held_out) * 2 - 1, data.x)
    assert 0 <= real < blurred < noise
