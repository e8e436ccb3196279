"""scikit-learn's digits as an FFM image data set (``data = "digits"``)."""

from __future__ import annotations

import torch

from secureffm.data.digits import load_digit_arrays
from secureffm.data.images import image_shape, load_images


def test_digits_split_into_disjoint_train_and_test_images_in_range():
    train, test = load_images("digits", split="train"), load_images("digits", split="test")
    assert train.x.shape == (1347, 1, 8, 8) and test.x.shape == (450, 1, 8, 8)
    assert image_shape("digits") == (1, 8, 8) and train.x.dtype == torch.float32
    assert float(train.x.min()) == -1.0 and float(train.x.max()) == 1.0
    pixels, _ = load_digit_arrays()
    every = sorted(tuple(row) for row in (2 * pixels - 1).tolist())
    seen = sorted(tuple(x.flatten().tolist()) for x in torch.cat([train.x, test.x]))
    assert seen == every  # each bundled image, scaled, in exactly one split
    counts = torch.bincount(test.labels) / torch.bincount(torch.cat([train.labels, test.labels]))
    assert float((counts - 0.25).abs().max()) < 0.01  # stratified


def test_a_count_caps_the_digits_train_split_to_its_first_images():
    whole, capped = load_images("digits"), load_images("digits", count=100)
    assert torch.equal(capped.x, whole.x[:100])
    assert len(load_images("digits", split="test", count=100)) == 450  # the test split is whole
