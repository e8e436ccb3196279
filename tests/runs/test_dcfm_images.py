"""DCFM and its baselines on Colored MNIST (issue 21): the conditional U-Net experts, DP-SGD on
them, the checkpoint that rebuilds them, and the DCFM paper's Table 1 scores (compositional
accuracy, Frechet distance) from the evaluator's attribute classifier. MNIST here is tiny idx
files the tests write: digit d is a bright bar in row band d, so a classifier can learn it."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from secureffm.config import RunConfig
from secureffm.data.colored_digits import colorize
from secureffm.data.images import load_colored_mnist, mnist_intensity
from secureffm.errors import ConfigError
from secureffm.models.conditional import ConditionalUNet
from secureffm.runs import load_dcfm, run


def _idx(array: np.ndarray) -> bytes:
    return (bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    """MNIST idx files: 20 training and 6 test images per digit, digit d a bar in rows
    2d+2..2d+3, with pixel noise."""
    folder = tmp_path_factory.mktemp("mnist")
    rng = np.random.default_rng(0)
    for prefix, per_digit in (("train", 20), ("t10k", 6)):
        digits = np.repeat(np.arange(10), per_digit)
        images = rng.integers(0, 40, (len(digits), 28, 28)).astype(float)
        for i, d in enumerate(digits):
            images[i, 2 + 2 * d: 4 + 2 * d, 4:24] = 255
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(images))
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(digits))
    return folder


def _config(tmp_path, mnist_dir, method: str, **changes) -> RunConfig:
    values = dict(method=method, data="colored-mnist", data_dir=str(mnist_dir), clients=2,
                  partition="iid", batch_size=8, unet_width=8, unet_mult=(1, 2),
                  local_steps=2, dcfm_rounds=1, dcfm_steps=1, distill_steps=2, teacher_steps=2,
                  fedflow_rounds=1, fedflow_local_steps=1, eval_samples=100, nfe=(2,),
                  eval_classifier_epochs=1, progress=False, device="cpu",
                  insecure_deterministic=True, out=str(tmp_path / method))
    values.update(changes)
    return RunConfig(**values)


@pytest.mark.parametrize("method, protocol, layout", [
    ("dcfm-a", "sealed", "guided"),
    pytest.param("dcfm-b", "plaintext", "compact", marks=pytest.mark.slow),
    pytest.param("fedflow", "plaintext", "compact", marks=pytest.mark.slow),
    pytest.param("ddm", "plaintext", "compact", marks=pytest.mark.slow)])
def test_each_method_trains_conditional_unets_on_colored_mnist_and_scores_them(
        tmp_path, mnist_dir, method, protocol, layout):
    result = run(_config(tmp_path, mnist_dir, method, protocol=protocol, unet_layout=layout))
    evaluation = result.metrics["eval"]
    for name in ("novel", "held"):
        assert 0.0 <= evaluation[f"compositional_accuracy_{name}"] <= 1.0
        assert np.isfinite(evaluation[f"frechet_{name}"])
    assert evaluation["features"]["comparable_with_published_fid"] is False
    sampler = load_dcfm(result.out)  # the checkpoint rebuilds the U-Nets (weights_only)
    assert all(isinstance(m, ConditionalUNet) for m in sampler.models)
    assert {type(m.unet).__name__ for m in sampler.models} == {  # the layout it trained
        {"guided": "GuidedUNet", "compact": "UNet"}[layout]}
    x = sampler.sample([3, 4], 2, torch.Generator().manual_seed(0), nfe=2)
    assert x.shape == (2, 3, 28, 28) and torch.isfinite(x).all()


@pytest.mark.slow
def test_dp_sgd_trains_the_conditional_unet_and_charges_the_ledger(tmp_path, mnist_dir):
    """Opacus clips the U-Net's per-example gradients (Conv2d, GroupNorm, Linear, Embedding);
    the ledger's epsilon is finite and within the target."""
    result = run(_config(tmp_path, mnist_dir, "ddm", protocol="dp-sealed", target_epsilon=8.0,
                         eval_classifier_epochs=0, insecure_deterministic=False))
    privacy = json.loads((result.out / "privacy.json").read_text())
    spent = [c["rdp"]["by_kind"]["model"] for c in privacy["clients"].values()]
    assert len(spent) == 2 and all(0 < e <= 8.0 + 1e-6 for e in spent)
    assert all(c["target_held"] for c in privacy["clients"].values())


@pytest.mark.slow
def test_the_scores_reward_the_requested_combination_and_punish_another(tmp_path, mnist_dir):
    """Scoring is a real measurement: the evaluator's own test images of each combination
    score high compositional accuracy, the same images recolored one color off score low."""
    from secureffm.runs.dcfm import _image_scores, conditional_data

    config = _config(tmp_path, mnist_dir, "ddm", eval_classifier_epochs=30)
    facts = conditional_data(config).facts
    test = load_colored_mnist(config.data_dir, "test", config.seed)
    gray, digits = mnist_intensity(config.data_dir, "test")
    right, wrong = {}, {}
    for combo in {tuple(y) for y in test.labels.tolist()}:
        rows = (digits == combo[0]).nonzero()[:, 0][:2]
        right[combo] = colorize(gray[rows], torch.full((len(rows),), combo[1]))
        wrong[combo] = colorize(gray[rows], torch.full((len(rows),), (combo[1] + 1) % 10))
    good = _image_scores(config, facts, right, torch.device("cpu"))
    bad = _image_scores(config, facts, wrong, torch.device("cpu"))
    for name in ("novel", "held"):
        assert good[f"compositional_accuracy_{name}"] >= 0.8
        assert bad[f"compositional_accuracy_{name}"] <= 0.2
        assert good[f"frechet_{name}"] < bad[f"frechet_{name}"]


@pytest.mark.parametrize("changes, key", [
    (dict(dcfm_network="unet", data="modes2d", data_dir="", partition="disjoint"),
     "dcfm_network"),
    (dict(sample_every=5), "sample_every"),
    (dict(method="dcfm-a", data="cifar10"), "data"),
])
def test_what_dcfm_on_images_cannot_do_is_refused_by_key(tmp_path, mnist_dir, changes, key):
    with pytest.raises(ConfigError, match=f"^{key} = "):
        _config(tmp_path, mnist_dir, changes.pop("method", "dcfm-a"), **changes)
